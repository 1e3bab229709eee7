"""bfloat16 compute (model.dtype=bfloat16, for GPU/TPU): parameters, losses and embeddings stay
float32, and a few steps train."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.run import Run
from tests.helpers import make_npz, tiny_config


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


def test_bfloat16_compute_keeps_float32_params_losses_and_embeddings(npz):
    run = Run(tiny_config(npz, **{"model.dtype": "bfloat16"}))
    state = run.prepare(run.initial_state)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    step = run.make_train_step()
    images = np.random.default_rng(0).uniform(size=(16, 16, 16, 1)).astype(np.float32)
    labels = np.repeat(np.arange(4), 4).astype(np.int32)  # of the 6 training classes
    batch = {"images": images, "labels": labels, "indices": np.arange(16, dtype=np.int32)}
    losses = []
    for _ in range(3):
        state, metrics = step(state, batch)
        assert metrics["loss"].dtype == jnp.float32
        losses.append(float(metrics["loss"]))
    assert all(np.isfinite(losses)) and int(state.nonfinite) == 0
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    out = run.embed_fn(state.params, state.batch_stats, images)
    assert all(v.dtype == jnp.float32 for v in out.values())
    assert losses[-1] < losses[0]
