"""The depthwise convolutions (shifted sum, oneDNN with the native kernel gradient) against
XLA's grouped convolution: values and gradients (input and kernel) under jit, for EfficientNet's
strides and kernels on odd and even sizes, maps smaller than the kernel and uneven batches."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jdml.nn.depthwise import DepthwiseConv, depthwise_conv2d
from jdml.nn.padding import same_padding


def _reference(x, kernel, stride):
    return lax.conv_general_dilated(
        x,
        kernel,
        (stride, stride),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=x.shape[-1],
        precision=lax.Precision.HIGHEST,
    )


def _inputs(shape, k, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=shape), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(k, k, 1, shape[-1])), jnp.float32)
    return x, kernel


@pytest.mark.parametrize("impl", ["shifted", "shifted_autodiff", "onednn"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("hw", [(7, 7), (8, 8), (6, 9), (1, 1), (2, 3)])
def test_matches_grouped_convolution(impl, stride, k, hw):
    x, kernel = _inputs((3, *hw, 5), k)
    out_shape = (3, -(-hw[0] // stride), -(-hw[1] // stride), 5)
    cotangent = jnp.asarray(np.random.default_rng(1).normal(size=out_shape), jnp.float32)

    def loss(conv):
        return lambda x, kernel: jnp.sum(conv(x, kernel) * cotangent)

    def ours(x, kernel):
        return depthwise_conv2d(x, kernel, stride, impl)

    def reference(x, kernel):
        return _reference(x, kernel, stride)

    y = jax.jit(ours)(x, kernel)
    assert y.shape == out_shape
    np.testing.assert_allclose(y, jax.jit(reference)(x, kernel), atol=1e-5, rtol=1e-5)
    grads = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(x, kernel)
    expected = jax.jit(jax.grad(loss(reference), argnums=(0, 1)))(x, kernel)
    for got, want in zip(grads, expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)


def test_xla_implementation_is_the_grouped_convolution():
    x, kernel = _inputs((2, 9, 8, 4), 5)
    np.testing.assert_allclose(
        depthwise_conv2d(x, kernel, 2, "xla"), _reference(x, kernel, 2), atol=1e-5
    )


def test_same_padding_is_tensorflow_style():
    assert same_padding(32, 3, 2) == (16, 0, 1)  # the odd pixel goes after
    assert same_padding(33, 3, 2) == (17, 1, 1)
    assert same_padding(4, 5, 1) == (4, 2, 2)
    assert same_padding(1, 5, 2) == (1, 2, 2)


def _targets(fn, *args) -> set[str]:
    """The native custom calls in ``fn``'s program, traced afresh (jit caches a function's
    traces, and the implementation is chosen when tracing)."""
    text = jax.jit(lambda *a: fn(*a)).lower(*args).as_text()
    return {t for t in ("jdml_dnnl_conv_fwd", "jdml_depthwise_bwd_weights") if t in text}


def test_auto_picks_onednn_on_cpu_the_shifted_sum_without_it_and_xla_elsewhere(monkeypatch):
    x, kernel = _inputs((1, 4, 4, 2), 3)

    def step(x, kernel, native=True):
        return jax.grad(lambda k: jnp.sum(depthwise_conv2d(x, k, 1, "auto", native)))(kernel)

    def forward(x, kernel):
        return depthwise_conv2d(x, kernel, 1, "auto", native=True)

    assert _targets(forward, x, kernel) == {"jdml_dnnl_conv_fwd"}
    assert _targets(step, x, kernel) == {"jdml_depthwise_bwd_weights"}
    # No native kernels (native=False, the default): the shifted sum.
    assert _targets(lambda x, k: step(x, k, native=False), x, kernel) == set()
    calls = []
    real = lax.conv_general_dilated
    monkeypatch.setattr(
        lax, "conv_general_dilated", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    depthwise_conv2d(x, kernel, 1, "auto")
    assert calls == []
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    depthwise_conv2d(x, kernel, 1, "auto")
    assert calls == [1]
    depthwise_conv2d(x, kernel, 1, "shifted")
    assert calls == [1]


@pytest.mark.parametrize("batch", [7, 1])
def test_onednn_kernel_gradient_is_the_sum_over_every_image(batch):
    """An odd batch splits unevenly over the pool's threads; one image is one piece. Checked
    against a float64 sum over the padded input's windows (SAME: 1 before and 2 after on 6
    rows, 2 and 2 on 5 columns)."""
    x, kernel = _inputs((batch, 6, 5, 24), 5, seed=4)
    g = np.random.default_rng(5).normal(size=(batch, 3, 3, 24)).astype(np.float32)
    assert same_padding(6, 5, 2) == (3, 1, 2) and same_padding(5, 5, 2) == (3, 2, 2)
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (1, 2), (2, 2), (0, 0)))
    want = np.zeros((5, 5, 1, 24))
    for i in range(5):
        for j in range(5):
            window = xp[:, i : i + 5 : 2, j : j + 5 : 2]
            want[i, j, 0] = np.einsum("byxc,byxc->c", window, g)

    @jax.jit
    def kernel_grad(x, kernel, g):
        return jax.vjp(lambda k: depthwise_conv2d(x, k, 2, "onednn"), kernel)[1](g)[0]

    np.testing.assert_allclose(kernel_grad(x, kernel, g), want, atol=1e-4, rtol=1e-5)


def test_module_is_a_drop_in_for_a_grouped_flax_conv():
    x, _ = _inputs((2, 7, 7, 6), 3)
    ours = DepthwiseConv(5, 2)
    conv = nn.Conv(6, (5, 5), (2, 2), padding="SAME", feature_group_count=6, use_bias=False)
    key = jax.random.PRNGKey(3)
    params = ours.init(key, x)
    reference_params = conv.init(key, x)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, reference_params)
    np.testing.assert_array_equal(params["params"]["kernel"], reference_params["params"]["kernel"])
    np.testing.assert_allclose(ours.apply(params, x), conv.apply(params, x), atol=1e-5)


def test_rejects_a_kernel_that_is_not_depthwise():
    x, kernel = _inputs((1, 4, 4, 3), 3)
    with pytest.raises(ValueError, match="not a depthwise kernel"):
        depthwise_conv2d(x, jnp.ones((3, 3, 3, 3)), 1)
    with pytest.raises(ValueError, match="unknown depthwise implementation"):
        depthwise_conv2d(x, kernel, 1, "fft")
