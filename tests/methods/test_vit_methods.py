"""Every paper's method on a vision transformer: DiVA, Sharing Matters, a stacked DM2 cohort and
a heterogeneous one of a ViT and a CNN each train a tiny ViT (``model.backbone=vit``), its
weights moving and its losses finite."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from configs.sharing import get_config as sharing_config
from jdml.config import set_keys, validate
from jdml.optim import layer_lr_scale
from jdml.run import Run
from tests.helpers import TINY_OVERRIDES, make_npz, tiny_config
from tests.methods.test_cohort import train
from tests.methods.test_diva import tiny_diva

# A one-block ViT on the tiny 16 px images: 2 x 2 patches of 8 pixels, 16-d tokens.
VIT = {
    "model.backbone": "vit",
    "model.vit.patch": 8,
    "model.vit.dim": 16,
    "model.vit.depth": 1,
    "model.vit.heads": 2,
}


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


def _vit_blocks(params) -> list[np.ndarray]:
    """The ViT block weights of every member (or the one model) in the params."""
    found = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        keys = [str(getattr(k, "key", k)) for k in path]
        if "blocks_0" in keys and keys[-1] == "kernel":
            found.append(np.asarray(leaf))
    return found


def _trains(run: Run) -> None:
    _, state, history = train(run, steps=2)
    assert all(np.isfinite(np.asarray(m["loss"])).all() for _, m in history)
    before = _vit_blocks(history[0][0].params)
    after = _vit_blocks(state.params)
    assert before and len(before) == len(after)
    assert all(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.slow
def test_diva_trains_a_vit(npz):
    _trains(Run(tiny_diva(npz, **VIT)))


@pytest.mark.slow
def test_sharing_matters_trains_a_vit(npz):
    c = sharing_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz, "decorrelation.hidden": 8, **VIT})
    validate(c)
    _trains(Run(c))


@pytest.mark.slow
def test_dm2_cohort_of_vits(npz):
    _trains(Run(tiny_config(npz, **{"cohort.size": 2, **VIT})))


@pytest.mark.slow
@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 (fake) devices")
def test_dm2_cohort_of_a_vit_and_a_cnn(npz):
    members = ("", "model.backbone=small_resnet")
    run = Run(tiny_config(npz, **{"cohort.size": 2, "cohort.members": members, **VIT}))
    backbones = [m.config.model.backbone for m in run.program.methods]
    assert backbones == ["vit", "small_resnet"]
    _trains(run)


@pytest.mark.slow
def test_frozen_stages_keep_the_patch_embedding_and_first_blocks(npz):
    """``model.frozen_stages=1`` on a two-block ViT: the patch embedding and block 0 keep their
    weights; the class token, the positions, block 1 and the final norm train (Hyp-ViT's
    ``freeze``)."""
    run = Run(tiny_config(npz, **{**VIT, "model.vit.depth": 2, "model.frozen_stages": 1}))
    _, state, history = train(run, steps=2)
    before = history[0][0].params["model"]["backbone"]
    after = state.params["model"]["backbone"]

    def moved(name: str) -> bool:
        pairs = zip(jax.tree.leaves(before[name]), jax.tree.leaves(after[name]), strict=True)
        return not all(np.array_equal(a, b) for a, b in pairs)

    assert {name: moved(name) for name in before} == {
        "patch_embed_proj": False,
        "blocks_0": False,
        "blocks_1": True,
        "cls_token": True,
        "pos_embed": True,
        "norm": True,
    }


@pytest.mark.slow
def test_layer_decay_gives_each_depth_its_rate(npz):
    """``optim.layer_decay=0.5`` on a two-block ViT: the stem (patch embedding, tokens,
    positions) at 0.125 of the rate, block 0 at 0.25, block 1 at 0.5, the final norm and the
    head at 1; the first step's changes of a layer against the same step without the decay
    (the same gradients) are in that ratio."""
    vit = {**VIT, "model.vit.depth": 2, "optim.name": "adamw", "optim.weight_decay": 0.0}
    decayed = Run(tiny_config(npz, **vit, **{"optim.layer_decay": 0.5}))
    scale = layer_lr_scale(decayed.config.optim, decayed.method.backbone_layers())
    expected = {"patch_embed_proj": 0.125, "cls_token": 0.125, "pos_embed": 0.125,
                "blocks_0": 0.25, "blocks_1": 0.5, "norm": 1.0}  # fmt: skip
    assert {name: scale(("model", "backbone", name)) for name in expected} == expected
    assert scale(("model", "head_discriminative", "kernel")) == 1.0
    _, after, history = train(decayed, steps=1)
    _, plain_after, _ = train(Run(tiny_config(npz, **vit)), steps=1)
    before = history[0][0].params["model"]["backbone"]
    for name, factor in expected.items():
        moved = jax.tree.leaves(
            jax.tree.map(np.subtract, after.params["model"]["backbone"][name], before[name])
        )
        plain = jax.tree.leaves(
            jax.tree.map(np.subtract, plain_after.params["model"]["backbone"][name], before[name])
        )
        for a, b in zip(moved, plain, strict=True):
            np.testing.assert_allclose(a, factor * b, rtol=2e-3, atol=1e-9, err_msg=name)


def test_timm_grouping_reaches_the_method(npz):
    """``optim.layer_decay_grouping=timm`` on the two-block ViT at 0.5: the final norm joins
    block 1's group at the rate, so the stem learns at 0.25 and block 0 at 0.5."""
    vit = {**VIT, "model.vit.depth": 2, "optim.name": "adamw"}
    timm = {"optim.layer_decay": 0.5, "optim.layer_decay_grouping": "timm"}
    run = Run(tiny_config(npz, **vit, **timm))
    scale = layer_lr_scale(run.config.optim, run.method.backbone_layers())
    expected = {"patch_embed_proj": 0.25, "cls_token": 0.25, "pos_embed": 0.25,
                "blocks_0": 0.5, "blocks_1": 1.0, "norm": 1.0}  # fmt: skip
    assert {name: scale(("model", "backbone", name)) for name in expected} == expected
    assert scale(("model", "head_discriminative", "kernel")) == 1.0
