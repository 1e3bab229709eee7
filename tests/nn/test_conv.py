"""jdml.nn.conv: values and gradients equal XLA's convolution and an explicit float64 sum, with
XLA's convolution (kernel gradient in batch pieces included) and with oneDNN's; Conv has
nn.Conv's parameters and init."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jdml.backends import resolve_backends
from jdml.nn import conv as conv_module
from jdml.nn.conv import Conv, conv2d, kernel_grad_pieces
from tests.helpers import matmul_tolerance, skip_off_cpu


def xla_conv(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    dims = ("NHWC", "HWIO", "NHWC")
    return lax.conv_general_dilated(x, kernel, (stride, stride), "SAME", dimension_numbers=dims)


def explicit_conv(x: np.ndarray, kernel: np.ndarray, stride: int) -> np.ndarray:
    """SAME convolution as a float64 sum over kernel taps (TensorFlow's SAME padding)."""
    k = kernel.shape[0]
    b, h, w, _ = x.shape
    out_h, out_w = -(-h // stride), -(-w // stride)
    pad_h = max((out_h - 1) * stride + k - h, 0)
    pad_w = max((out_w - 1) * stride + k - w, 0)
    xp = np.pad(
        x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0))
    )
    out = np.zeros((b, out_h, out_w, kernel.shape[-1]))
    for i in range(k):
        for j in range(k):
            window = xp[:, i : i + stride * out_h : stride, j : j + stride * out_w : stride]
            out += window @ kernel[i, j]
    return out


@pytest.fixture(params=["xla", "onednn"])
def conv_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with XLA's convolutions and again with oneDNN's (every channel count; on
    the CPU backend only)."""
    if request.param == "onednn":
        skip_off_cpu("oneDNN's convolution")
    monkeypatch.setattr(conv_module, "ONEDNN_MIN_CHANNELS", 1)
    return request.param


@pytest.mark.parametrize(
    ("shape", "kernel_size", "stride", "pieces_min"),
    [
        ((8, 9, 9, 3), 3, 1, 64),  # 81 output positions: kernel gradient in 8 pieces
        ((6, 16, 16, 2), 3, 2, 64),  # 64 output positions, stride 2: 6 pieces
        ((4, 7, 5, 3), 3, 2, 64),  # 12 positions: XLA's kernel gradient
        ((4, 6, 6, 3), 3, 1, 1),  # forced pieces on a small map
        ((3, 8, 8, 4), 1, 2, 64),  # 1x1, strided: a matmul on every other pixel
        ((3, 7, 7, 4), 1, 1, 64),
        ((5, 9, 7, 3), 3, 3, 64),  # odd batch (uneven pieces), not square, stride 3
        ((1, 6, 6, 2), 5, 2, 64),  # one image, 5x5 kernel
    ],
)
def test_values_and_gradients(
    monkeypatch: pytest.MonkeyPatch,
    conv_impl: str,
    shape,
    kernel_size: int,
    stride: int,
    pieces_min: int,
) -> None:
    monkeypatch.setattr(conv_module, "PIECES_MIN_POSITIONS", pieces_min)
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape)
    kernel = rng.normal(size=(kernel_size, kernel_size, shape[-1], 5))
    xj, kj = jnp.asarray(x, jnp.float32), jnp.asarray(kernel, jnp.float32)
    expected = explicit_conv(x, kernel, stride)
    tol = matmul_tolerance(1e-4)  # float32 on CPU; TF32 on a GPU, one bf16 pass on a TPU
    conv = functools.partial(conv2d, native=conv_impl == "onednn")
    np.testing.assert_allclose(conv(xj, kj, stride), expected, rtol=tol, atol=tol)
    weights = jnp.asarray(rng.normal(size=expected.shape), jnp.float32)

    def loss(fn):
        return lambda x, k: jnp.sum(weights * fn(x, k, stride))

    ours = jax.jit(jax.grad(loss(conv), argnums=(0, 1)))(xj, kj)
    ref = jax.grad(loss(xla_conv), argnums=(0, 1))(xj, kj)
    for got, want in zip(ours, ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_pieces_divide_the_batch_on_large_maps_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv_module.jax, "default_backend", lambda: "gpu")
    assert kernel_grad_pieces(112, 256) == 1  # other backends keep XLA's kernel gradient
    monkeypatch.setattr(conv_module.jax, "default_backend", lambda: "cpu")
    assert kernel_grad_pieces(112, 256) == 8
    assert kernel_grad_pieces(112, 64) == 8
    assert kernel_grad_pieces(112, 16) == 1
    assert kernel_grad_pieces(6, 64) == 6
    assert kernel_grad_pieces(7, 64) == 7
    assert kernel_grad_pieces(11, 100) == 1  # a prime batch above the limit: one piece


def test_conv_has_nn_conv_parameters_and_init() -> None:
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 8, 8, 3)), jnp.float32)
    for kernel_size, stride in ((3, 1), (3, 2), (1, 2)):
        ours = Conv(6, kernel_size, stride, name="c")
        ref = nn.Conv(6, (kernel_size,) * 2, (stride,) * 2, padding="SAME", use_bias=False)
        p_ours = ours.init(jax.random.key(0), x)
        p_ref = ref.init(jax.random.key(0), x)
        assert jax.tree.map(jnp.shape, p_ours) == jax.tree.map(jnp.shape, p_ref)
        np.testing.assert_array_equal(p_ours["params"]["kernel"], p_ref["params"]["kernel"])
        np.testing.assert_allclose(ours.apply(p_ours, x), ref.apply(p_ref, x), rtol=1e-5, atol=1e-5)


def lowered_targets(fn, *args) -> str:
    """The program of ``fn``, traced afresh (jit caches traces per function)."""
    return jax.jit(lambda *a: fn(*a)).lower(*args).as_text()


@pytest.mark.smoke
@pytest.mark.cpu
def test_the_implementation_follows_the_native_argument() -> None:
    x = jnp.ones((2, 8, 8, 16), jnp.float32)
    kernel = jnp.ones((3, 3, 16, 4), jnp.float32)

    def grad(native: bool):
        return jax.value_and_grad(lambda x, k: jnp.sum(conv2d(x, k, 1, native)), argnums=(0, 1))

    text = lowered_targets(grad(True), x, kernel)
    for target in ("fwd", "bwd_data", "bwd_weights"):
        assert f"jdml_dnnl_conv_{target}" in text
    assert "jdml_dnnl_conv" not in lowered_targets(grad(False), x, kernel)
    native = resolve_backends({"conv": "auto"}, environ={}).native_conv  # oneDNN builds here
    assert "jdml_dnnl_conv_fwd" in lowered_targets(grad(native), x, kernel)
    # Not asked: XLA's convolution, whatever the environment says.
    assert "jdml_dnnl_conv" not in lowered_targets(
        jax.value_and_grad(lambda x, k: jnp.sum(conv2d(x, k, 1)), argnums=(0, 1)), x, kernel
    )
    # Few input channels (the glyph stem) and bfloat16 stay on XLA's convolution.
    assert "jdml_dnnl_conv" not in lowered_targets(grad(True), x[..., :1], kernel[:, :, :1])
    bf16 = lambda x, k: conv2d(x.astype(jnp.bfloat16), k.astype(jnp.bfloat16), 1, True)  # noqa: E731
    assert "jdml_dnnl_conv" not in lowered_targets(bf16, x, kernel)


@pytest.mark.smoke
def test_onednn_under_vmap_and_jit_equals_xla() -> None:
    """A cohort maps its members' networks with vmap: the custom calls run member by member."""
    native = jax.default_backend() == "cpu"  # oneDNN's kernels are the CPU backend's
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(3, 4, 8, 8, 8)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(3, 3, 3, 8, 6)), jnp.float32)

    def loss(fn):
        return lambda x, k: jnp.sum(jnp.sin(jax.vmap(lambda a, b: fn(a, b, 2))(x, k)))

    conv = functools.partial(conv2d, native=native)
    ours = jax.jit(jax.value_and_grad(loss(conv), argnums=(0, 1)))(x, kernel)
    ref = jax.value_and_grad(loss(xla_conv), argnums=(0, 1))(x, kernel)
    for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
