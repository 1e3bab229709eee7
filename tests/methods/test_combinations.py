"""Every loss with every miner it accepts: the config builds and a jitted step runs.

Each (loss, miner) pair goes through ``configs/revisiting.py:loss=..,miner=..``, config
validation and the method's miner + loss on a tiny embedding batch (value and gradient of the
loss and of its learnable parameters, jitted). Each loss with its default miner also runs one full
jitted train step of a tiny network.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.revisiting import get_config
from jdml.config import validate
from jdml.errors import ConfigError
from jdml.geometry import l2_normalize
from jdml.losses import LOSSES, compatible_miners
from jdml.methods import StandardMethod
from jdml.run import Run
from jdml.step import make_train_step
from tests.helpers import make_npz, tiny_config

NUM_CLASSES = 4


def _config(loss: str, miner: str):
    return get_config(f"loss={loss},miner={miner}" if miner else f"loss={loss}")


# The miner of each loss in the reference's sample runs ("" = the loss mines itself), and the
# losses run on unnormalised embeddings, as written in the reference's scripts.
REFERENCE_MINER = {
    "angular": "npair",
    "arcface": "",
    "circle": "",
    "contrastive": "distance",
    "cosface": "",
    "histogram": "",
    "lifted": "lifted",
    "margin": "distance",
    "multisimilarity": "",
    "npair": "npair",
    "ntxent": "",
    "proxyanchor": "",
    "proxynca": "",
    "quadruplet": "distance",
    "snr": "distance",
    "softmax": "",
    "softtriplet": "",
    "subcenter_arcface": "",
    "supcon": "",
    "triplet": "distance",
}
UNNORMALISED = {"angular", "lifted", "npair"}


def _combinations() -> list:
    """Every loss with every compatible miner. The quick tests keep each loss with its reference
    miner and each miner's first pairing; the other pairs are marked slow (run by CI)."""
    out, seen = [], set()
    for loss in LOSSES.names():
        for miner in compatible_miners(loss) or [""]:
            quick = miner == REFERENCE_MINER[loss] or miner not in seen
            seen.add(miner)
            out.append(pytest.param(loss, miner, marks=() if quick else pytest.mark.slow))
    return out


COMBINATIONS = _combinations()


def test_presets_cover_every_registered_loss():
    assert sorted(REFERENCE_MINER) == LOSSES.names()
    for loss, miner in REFERENCE_MINER.items():
        assert LOSSES.get(loss).reference_miner == miner
        c = get_config(f"loss={loss}")
        validate(c)
        assert c.miner.name == miner
        assert c.model.normalize == (loss not in UNNORMALISED)


@pytest.mark.parametrize("loss,miner", COMBINATIONS)
def test_loss_miner_step(loss, miner):
    c = _config(loss, miner)
    validate(c)
    method = StandardMethod(c, num_classes=NUM_CLASSES)
    rng = np.random.default_rng(0)
    labels = jnp.asarray(np.repeat(np.arange(NUM_CLASSES), 4), jnp.int32)
    raw = jnp.asarray(rng.normal(size=(labels.shape[0], 8)), jnp.float32)
    raw = raw.at[1].set(raw[0])  # a duplicate: zero distances must stay finite
    key = jax.random.key(0)
    emb0 = l2_normalize(raw) if c.model.normalize else raw
    params = method.init_loss(key, emb0, labels)

    @jax.jit
    def step(params, raw):
        def f(p, x):
            emb = l2_normalize(x) if c.model.normalize else x
            return method.head_loss(p, emb, labels, key)

        return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(params, raw)

    (value, metrics), grads = step(params, raw)
    assert np.isfinite(float(value)), (loss, miner)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads)), (loss, miner)
    assert all(np.isfinite(float(v)) for v in metrics.values())


def test_incompatible_miner_lists_the_compatible_ones():
    c = get_config("loss=npair,miner=distance")
    with pytest.raises(ConfigError, match=r"compatible miners: npair"):
        validate(c)


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"), num_classes=8)


@pytest.mark.parametrize(
    "loss",
    [
        pytest.param(n, marks=() if n == "margin" else pytest.mark.slow)
        for n in sorted(REFERENCE_MINER)
    ],
)
def test_full_train_step_per_loss(loss, npz):
    """Every loss through a whole run's step (quick: margin, the default; the others slow)."""
    overrides = {
        "loss.name": loss,
        "miner.name": REFERENCE_MINER[loss],
        "model.normalize": get_config(f"loss={loss}").model.normalize,
    }
    run = Run(tiny_config(npz, **overrides))
    step = make_train_step(run.method, run.tx)
    batch = {k: jnp.asarray(v) for k, v in _batch(run).items()}
    state, metrics = step(run.initial_state, batch)
    assert int(state.step) == 1 and int(state.nonfinite) == 0, loss
    assert np.isfinite(float(metrics["loss"]))


def _batch(run):
    idx = run.sampler.batch(0)
    data = run.splits["train"]
    return {
        "images": data.images[idx].astype(np.float32) / 255.0,
        "labels": data.labels[idx].astype(np.int32),
        "indices": idx.astype(np.int32),
    }
