"""Optimiser: coupled Adam weight decay, per-group learning rates, epoch-based schedules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jdml.optim import Group, lr_multiplier, make_optimizer
from tests.helpers import REPO, load_script


def _cfg(**kw) -> ml_collections.ConfigDict:
    base = dict(name="adam", schedule="multistep", milestones=(2,), gamma=0.5, warmup_epochs=0)
    return ml_collections.ConfigDict({**base, **kw})


def _numpy_coupled_adam(p, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-8):
    """PyTorch's Adam(weight_decay=wd) algorithm: the decay is added to the gradient."""
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr[t - 1] * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return p


def test_coupled_adam_groups_and_multistep_match_numpy():
    rng = np.random.default_rng(0)
    params = {"model": jnp.asarray(rng.normal(size=5)), "loss": jnp.asarray(rng.normal(size=3))}
    grads = [
        {k: jnp.asarray(rng.normal(size=v.shape)) for k, v in params.items()} for _ in range(6)
    ]
    groups = {"model": Group(1e-2, 4e-4), "loss": Group(5e-2, 0.0)}
    tx = make_optimizer(_cfg(), groups, steps_per_epoch=2, total_steps=6)
    state, p = tx.init(params), params
    update = jax.jit(tx.update)
    for g in grads:
        u, state = update(g, state, p)
        p = optax.apply_updates(p, u)
    mult = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5]  # milestone at epoch 2 = step 4
    for name, grp in groups.items():
        expected = _numpy_coupled_adam(
            np.asarray(params[name]),
            [np.asarray(g[name]) for g in grads],
            [grp.lr * m for m in mult],
            grp.weight_decay,
        )
        np.testing.assert_allclose(np.asarray(p[name]), expected, rtol=1e-5, atol=1e-6)


def test_schedules():
    cos = lr_multiplier(_cfg(schedule="cosine"), 10, 100)
    assert float(cos(0)) == pytest.approx(1.0) and float(cos(100)) == pytest.approx(0.0)
    warm = lr_multiplier(_cfg(schedule="constant", warmup_epochs=1), 10, 100)
    assert float(warm(0)) == pytest.approx(0.1) and float(warm(50)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="schedule"):
        lr_multiplier(_cfg(schedule="linear"), 10, 100)


def _tree(values: dict) -> dict:
    """Nested dicts of jax arrays from {path tuple: value}."""
    out: dict = {}
    for path, v in values.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jnp.asarray(v)
    return out


def _numpy_adamw(p, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-8, clip=0.0):
    """PyTorch's AdamW algorithm: p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p), the gradient
    first clipped to global norm ``clip`` (over every array of ``p``) when it is > 0."""
    p = {k: v.copy() for k, v in p.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    s = {k: np.zeros_like(v) for k, v in p.items()}
    for t, g in enumerate(grads, start=1):
        if clip:
            norm = np.sqrt(sum(np.sum(x * x) for x in g.values()))
            g = {k: x * min(1.0, clip / norm) for k, x in g.items()}
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            s[k] = b2 * s[k] + (1 - b2) * g[k] ** 2
            step = (m[k] / (1 - b1**t)) / (np.sqrt(s[k] / (1 - b2**t)) + eps)
            p[k] = p[k] - lr[k] * (step + wd[k] * p[k])
    return p


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_adamw_no_decay_backbone_rate_and_clipping_match_numpy(clip):
    """AdamW's decoupled decay, no decay on a 1-d parameter and on a named one, the backbone at
    a tenth of the rate, and the global norm clip, against a NumPy AdamW."""
    rng = np.random.default_rng(1)
    shapes = {
        ("model", "backbone", "kernel"): (3, 2),
        ("model", "backbone", "bias"): (2,),
        ("model", "backbone", "cls_token"): (1, 2),
        ("model", "embed", "kernel"): (2, 2),
        ("loss", "proxies"): (2, 2),
    }
    flat = {k: rng.normal(size=s) for k, s in shapes.items()}
    grads = [{k: rng.normal(size=s) for k, s in shapes.items()} for _ in range(3)]

    cfg = _cfg(name="adamw", schedule="constant", no_decay=("1d", "cls_token"),
               backbone_lr_multiplier=0.1, clip_norm=clip)  # fmt: skip
    groups = {"model": Group(1e-2, 0.05), "loss": Group(1e-1, 0.0)}
    tx = make_optimizer(cfg, groups, steps_per_epoch=1, total_steps=3)
    params = _tree(flat)
    state = tx.init(params)
    for g in grads:
        u, state = jax.jit(tx.update)(_tree(g), state, params)
        params = optax.apply_updates(params, u)
    lr = {k: (1e-3 if k[1:2] == ("backbone",) else 1e-2) if k[0] == "model" else 1e-1 for k in flat}
    wd = {k: 0.05 if k[0] == "model" and k[-1] not in ("bias", "cls_token") else 0.0 for k in flat}
    expected = _numpy_adamw(flat, grads, lr, wd, clip=clip)
    for path, value in expected.items():
        got = params
        for key in path:
            got = got[key]
        np.testing.assert_allclose(np.asarray(got), value, rtol=1e-5, atol=1e-6, err_msg=path)


def test_adamw_equals_optax_adamw_and_defaults_keep_the_coupled_adam():
    rng = np.random.default_rng(2)
    params = {"model": {"w": jnp.asarray(rng.normal(size=(3, 3)))}}
    grad = {"model": {"w": jnp.asarray(rng.normal(size=(3, 3)))}}
    ours = make_optimizer(_cfg(name="adamw", schedule="constant"), {"model": Group(0.1, 0.2)},
                          steps_per_epoch=1, total_steps=1)  # fmt: skip
    reference = optax.adamw(0.1, weight_decay=0.2)
    u1, _ = ours.update(grad, ours.init(params), params)
    u2, _ = reference.update(grad, reference.init(params), params)
    np.testing.assert_allclose(np.asarray(u1["model"]["w"]), np.asarray(u2["model"]["w"]),
                               rtol=1e-6)  # fmt: skip


def test_layer_decay_scales_each_layers_whole_update():
    """``layer_scale`` (optim.layer_decay): each backbone leaf's AdamW step and its decoupled
    decay at its layer's factor of the rate, the rest at the rate, against a NumPy AdamW with
    those rates; the frozen leaf stays fixed."""
    rng = np.random.default_rng(3)
    shapes = {
        ("model", "backbone", "patch_embed_proj", "kernel"): (3, 2),
        ("model", "backbone", "blocks_0", "kernel"): (2, 2),
        ("model", "backbone", "norm", "scale"): (2,),
        ("model", "head", "kernel"): (2, 2),
    }
    flat = {k: rng.normal(size=s) for k, s in shapes.items()}
    grads = [{k: rng.normal(size=s) for k, s in shapes.items()} for _ in range(3)]

    factors = {"patch_embed_proj": 0.25, "blocks_0": 0.5}

    def scale(path):
        return factors.get(path[2], 1.0) if path[1] == "backbone" else 1.0

    # the backbone's declared layers by depth; at decay 0.5 the last (the norm) keeps the rate
    layers = (("patch_embed_proj",), ("blocks_0",), ("norm",))
    cfg = _cfg(name="adamw", schedule="constant", layer_decay=0.5)
    tx = make_optimizer(cfg, {"model": Group(1e-2, 0.05)}, steps_per_epoch=1, total_steps=3,
                        layers=layers)  # fmt: skip
    params = _tree(flat)
    state = tx.init(params)
    for g in grads:
        u, state = jax.jit(tx.update)(_tree(g), state, params)
        params = optax.apply_updates(params, u)
    lr = {k: 1e-2 * scale(k) for k in flat}
    expected = _numpy_adamw(flat, grads, lr, {k: 0.05 for k in flat})
    for path, value in expected.items():
        got = params
        for key in path:
            got = got[key]
        np.testing.assert_allclose(np.asarray(got), value, rtol=1e-5, atol=1e-6, err_msg=path)


# The cases of tests/golden/optim/layer_decay.json (tools/make_layer_decay_fixture.py): a timm
# ViT without a classifier, and the same with one (``_head``), which stands for jdml's heads.
LAYER_DECAY_CASES = ("vit_small", "depth2", "depth4_reg2")


@pytest.fixture(scope="module")
def layer_decay():
    return load_script("tools/layer_decay_table.py")


@pytest.mark.parametrize("case", LAYER_DECAY_CASES)
def test_timm_grouping_is_timms_layer_decay(layer_decay, case):
    """``optim.layer_decay_grouping=timm``: every parameter of a ViT (ViT-S/16 at 0.65, two
    blocks at 0.5, four blocks with registers at 0.75) at the factor
    ``timm.optim.param_groups_layer_decay`` gives the same timm ViT without a classifier."""
    recorded = layer_decay.load_cases()[case]
    assert layer_decay.jdml_scales(recorded, "timm") == recorded["timm"]


@pytest.mark.parametrize("case", [c for c in LAYER_DECAY_CASES if "reg" not in c])
def test_mae_grouping_is_maes_layer_decay(layer_decay, case):
    """``optim.layer_decay_grouping=mae``: every parameter at the factor of MAE's
    ``param_groups_lrd`` (BEiT's layers), the heads at the rate; with a classifier inside its
    model, timm's factors are the same but the final norm's, which is ``decay`` times less."""
    cases = layer_decay.load_cases()
    for name in (case, f"{case}_head"):
        assert layer_decay.jdml_scales(cases[name], "mae") == cases[name]["mae"], name
    head = cases[f"{case}_head"]
    ours, timm = layer_decay.jdml_scales(head, "mae"), head["timm"]
    norm = {n for n in ours if n.startswith("norm.")}
    assert norm and {n: ours[n] * head["decay"] for n in norm} == {n: timm[n] for n in norm}
    assert {n: s for n, s in ours.items() if n not in norm} == {
        n: s for n, s in timm.items() if n not in norm
    }


def test_the_layer_decay_table_is_what_its_command_prints(layer_decay):
    """docs/usage.md's layer-decay table is what ``python tools/layer_decay_table.py`` prints."""
    tool = load_script("tools/update_claim_tables.py")
    with open(f"{REPO}/docs/usage.md") as f:
        blocks = dict(tool.generated_blocks(f.read()))
    assert blocks["python tools/layer_decay_table.py"] == tool.generated_text(layer_decay.table())


def test_a_declared_group_takes_the_sections_rate_and_decay_where_it_has_none() -> None:
    """A method declares its groups without reading ``optim``: the network takes ``optim.lr``
    and ``optim.weight_decay``; a loss's multiplier scales ``optim.lr``; an own rate stays."""
    cfg = _cfg(lr=2e-3, weight_decay=4e-4)
    assert Group().resolve(cfg) == (2e-3, 4e-4, 1.0)
    assert Group(weight_decay=0.0, lr_scale=100.0).resolve(cfg)[:2] == (2e-3 * 100.0, 0.0)
    assert Group(1e-5, 0.0).resolve(cfg)[:2] == (1e-5, 0.0)


def test_layer_decay_needs_declared_layers() -> None:
    from jdml.optim import layer_lr_scale

    assert layer_lr_scale(_cfg(layer_decay=1.0), None) is None
    with pytest.raises(ValueError, match="declares no layers"):
        layer_lr_scale(_cfg(layer_decay=0.5), None)
    scale = layer_lr_scale(_cfg(layer_decay=0.5, layer_decay_grouping="timm"),
                           (("stem",), ("blocks_0",), ("blocks_1",), ("norm",)))  # fmt: skip
    assert [scale(("model", "backbone", n)) for n in ("stem", "blocks_0", "blocks_1", "norm")] == [
        0.25, 0.5, 1.0, 1.0
    ]  # fmt: skip
    assert scale(("loss", "proxies")) == 1.0
