"""Accelerator-only paths (marked ``gpu``, skipped on the CPU backend): the glyph default compiles
and trains there, bfloat16 reaches the matrix units, convolutions run as the vendor library's,
the train state is donated, and the evaluator's device path finds the exact neighbours.

Run them on a GPU or TPU host with ``python -m pytest -q -m gpu -n 0 tests/test_accelerator.py``
(docs/devices.md, "Tests on a GPU or TPU").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.run import Run
from jdml.step import make_train_step
from tests.helpers import matmul_tolerance

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def glyph_run(glyph_cache_dir) -> Run:
    """The default glyph run (configs/revisiting.py), read from the session's glyph cache."""
    from configs.revisiting import get_config

    config = get_config()
    config.unlock()
    config.data.cache_dir = str(glyph_cache_dir)
    return Run(config)


def _batch(run: Run, step: int = 0) -> dict[str, jax.Array]:
    return {k: jnp.asarray(v) for k, v in run.batch_maker()(step).items()}


def test_the_glyph_default_compiles_and_trains(glyph_run):
    """The default network's step and evaluation pass compile (XLA's Triton GEMM fusion aborted
    the process on the strided 1x1 projection as a matrix product) and give finite values."""
    step = make_train_step(glyph_run.method, glyph_run.tx)
    state = jax.tree.map(jnp.copy, glyph_run.initial_state)
    losses = []
    for i in range(3):
        state, metrics = step(state, _batch(glyph_run, i))
        losses.append(float(metrics["loss"]))
    assert all(np.isfinite(losses))
    images = glyph_run.splits["test"].eval_images(np.arange(64))
    out = glyph_run.embed_fn(state.params, state.batch_stats, images)
    for emb in jax.tree.leaves(out):
        assert emb.shape[0] == 64 and bool(jnp.all(jnp.isfinite(emb)))


def test_bfloat16_runs_on_the_matrix_units(glyph_run):
    """``model.dtype=bfloat16`` compiles the convolutions with bf16 operands, and the first
    step's loss is within bf16 rounding of the float32 step's."""
    config = glyph_run.config.copy_and_resolve_references()
    config.unlock()
    config.model.dtype = "bfloat16"
    run16 = Run(config)
    step16 = make_train_step(run16.method, run16.tx)
    state16 = jax.tree.map(jnp.copy, run16.initial_state)
    batch = _batch(glyph_run)
    text = step16.lower(state16, batch).compile().as_text()
    assert "bf16[" in text and ("convolution" in text or "cudnn" in text)
    step32 = make_train_step(glyph_run.method, glyph_run.tx)
    state32 = jax.tree.map(jnp.copy, glyph_run.initial_state)
    loss16 = float(step16(state16, batch)[1]["loss"])
    loss32 = float(step32(state32, batch)[1]["loss"])
    assert np.isfinite(loss16) and abs(loss16 - loss32) <= 3e-2 * abs(loss32) + 1e-3


def test_convolutions_run_as_the_library_kernels():
    """A 3x3 convolution and the strided 1x1 projection compile to the device library's
    convolution (cuDNN on NVIDIA GPUs), never to the CPU backend's oneDNN custom calls."""
    from jdml.nn.conv import conv2d

    x = jnp.ones((8, 16, 16, 32), jnp.float32)
    for k, stride in ((3, 1), (1, 2)):
        kernel = jnp.ones((k, k, 32, 64), jnp.float32)
        text = jax.jit(lambda x, w, s=stride: conv2d(x, w, s)).lower(x, kernel).compile().as_text()
        assert "jdml_dnnl" not in text
        if jax.devices()[0].platform == "gpu":
            assert "cudnn" in text.lower()
        else:
            assert "convolution" in text


def test_the_train_state_is_donated(glyph_run):
    """The step reuses the state's buffers: the state passed in is deleted after the call."""
    step = make_train_step(glyph_run.method, glyph_run.tx)
    state = jax.tree.map(jnp.copy, glyph_run.initial_state)
    new_state, _ = step(state, _batch(glyph_run))
    leaves = jax.tree.leaves(state.params)
    assert leaves and all(leaf.is_deleted() for leaf in leaves)
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(new_state.params))


def test_the_device_knn_finds_the_exact_neighbours():
    """kNN on the device (XLA's top-k on blocks) returns a float64 brute force's neighbours,
    wherever their distances are not within the backend's rounding of each other."""
    from jdml.evaluation.knn import knn

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 64)).astype(np.float32)
    xd = jnp.asarray(x)
    dist, idx = knn(xd, xd, 10, exclude_self=True)
    ref = ((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(ref, np.inf)
    want = np.argsort(ref, axis=1, kind="stable")[:, :10]
    got = np.asarray(idx)
    gap = np.diff(np.sort(ref, axis=1)[:, :11], axis=1).min(axis=1)
    clear = gap > 1e-2  # queries whose 11 nearest are well separated
    assert clear.sum() > 1000
    np.testing.assert_array_equal(got[clear], want[clear])
    tol = matmul_tolerance()
    np.testing.assert_allclose(
        np.asarray(dist)[clear], np.sqrt(np.take_along_axis(ref, want, 1))[clear], rtol=tol
    )


def test_the_device_kmeans_converges_like_a_float64_lloyd():
    """k-means on the device: every point is assigned to its nearest final centroid, and the
    inertia is the one those centroids give in float64."""
    from jdml.evaluation.kmeans import kmeans

    rng = np.random.default_rng(1)
    centres = rng.standard_normal((50, 16)) * 4
    x = (centres[rng.integers(0, 50, 5000)] + rng.standard_normal((5000, 16))).astype(np.float32)
    result = kmeans(jnp.asarray(x), 50, init="k-means++")
    c = np.asarray(result.centroids, np.float64)
    d = ((x[:, None, :] - c[None]) ** 2).sum(-1)
    assert np.mean(np.asarray(result.assignments) == d.argmin(1)) > 0.999
    inertia = d.min(1).sum()
    np.testing.assert_allclose(float(result.inertia), inertia, rtol=matmul_tolerance(1e-4))


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's attention needs a GPU")
@pytest.mark.parametrize("tokens", [16, 17, 197])
def test_cudnn_attention_equals_xla_attention_values_and_gradients(tokens):
    """``model.vit.attention=cudnn`` (an odd sequence padded with one masked token, as cuDNN's
    training kernel asks) computes XLA's attention, forward and backward, to bfloat16 rounding."""
    from jdml.models.vit import attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 3, tokens, 64)), jnp.bfloat16) for _ in range(3))

    def loss(impl, q, k, v):
        return jnp.sum(attention(q, k, v, impl).astype(jnp.float32) ** 2)

    got = jax.value_and_grad(loss, argnums=(1, 2, 3))("cudnn", q, k, v)
    want = jax.value_and_grad(loss, argnums=(1, 2, 3))("xla", q, k, v)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=3e-2, atol=3e-2
        )
