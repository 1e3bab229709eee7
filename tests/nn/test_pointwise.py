"""jdml.nn.pointwise: the 1x1 convolution as a matmul equals XLA's convolution and nn.Conv, with
XLA's dot and with oneDNN's sgemm (``native=True``, a run's ``backends.conv=onednn``, the CPU
default where it builds)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jdml.nn import pointwise
from jdml.nn.pointwise import PointwiseConv, onednn_matmul, pointwise_conv
from jdml.throughput import model_flops
from tests.helpers import matmul_tolerance, skip_off_cpu

NHWC = ("NHWC", "HWIO", "NHWC")
MODES = ("xla", "onednn")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("shape", "out"), [((3, 5, 4, 6), 7), ((2, 1, 1, 9), 2), ((1, 3, 3, 1), 4)]
)
def test_values_and_gradients_equal_the_convolution(mode, shape, out):
    if mode == "onednn":
        skip_off_cpu("oneDNN's sgemm")
    ours = functools.partial(pointwise_conv, native=mode == "onednn")
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=shape), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(1, 1, shape[-1], out)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(*shape[:-1], out)), jnp.float32)

    def conv(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=NHWC)

    for fn in (conv, ours):
        assert fn(x, kernel).shape == (*shape[:-1], out)
    tol = matmul_tolerance()
    np.testing.assert_allclose(ours(x, kernel), conv(x, kernel), rtol=tol, atol=tol)
    # An explicit sum over input channels, pixel by pixel.
    explicit = np.einsum("bhwc,co->bhwo", np.asarray(x, np.float64), np.asarray(kernel[0, 0]))
    np.testing.assert_allclose(ours(x, kernel), explicit, rtol=tol, atol=tol)
    grads = [
        jax.grad(lambda x, k, fn=fn: jnp.sum(weights * fn(x, k)), argnums=(0, 1))(x, kernel)
        for fn in (conv, ours)
    ]
    for ref, ours in zip(*grads, strict=True):
        np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol)


def test_module_has_the_parameter_and_init_of_a_bias_free_conv():
    x = jnp.ones((2, 4, 4, 5))
    ours = PointwiseConv(3).init(jax.random.PRNGKey(7), x)
    conv = nn.Conv(3, (1, 1), use_bias=False).init(jax.random.PRNGKey(7), x)
    assert jax.tree.structure(ours) == jax.tree.structure(conv)
    np.testing.assert_array_equal(ours["params"]["kernel"], conv["params"]["kernel"])
    y = PointwiseConv(3).apply(ours, x)
    np.testing.assert_allclose(y, nn.Conv(3, (1, 1), use_bias=False).apply(conv, x), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_the_mode_chooses_the_product(mode):
    """``onednn`` (``native=True``) lowers the product and both gradients to the native call;
    ``xla`` and non-float32 inputs keep XLA's dot."""
    skip_off_cpu("the matrix form")
    native = mode == "onednn"
    x = jnp.ones((2, 3, 3, 4), jnp.float32)
    kernel = jnp.ones((1, 1, 4, 5), jnp.float32)

    def grads(x, k):
        return jax.grad(
            lambda x, k: jnp.sum(pointwise_conv(x, k, native=native) ** 2), argnums=(0, 1)
        )(x, k)

    text = jax.jit(grads).lower(x, kernel).compile().as_text()
    assert text.count('custom_call_target="jdml_dnnl_matmul"') == (3 if mode == "onednn" else 0)
    half = jax.jit(grads).lower(x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16))
    assert "jdml_dnnl_matmul" not in half.compile().as_text()


@pytest.mark.cpu
@pytest.mark.parametrize(("rows", "inner", "cols"), [(1, 3, 2), (7, 5, 1), (301, 33, 17)])
def test_onednn_matmul_against_float64(rows, inner, cols):
    """Fewer rows than pool threads, an odd split and a single column: the product and both
    gradients (the second sums its pieces over the rows) against float64 sums."""
    rng = np.random.default_rng(rows)
    a = rng.normal(size=(rows, inner)).astype(np.float32)
    b = rng.normal(size=(inner, cols)).astype(np.float32)
    g = rng.normal(size=(rows, cols)).astype(np.float32)
    y, vjp = jax.vjp(onednn_matmul, jnp.asarray(a), jnp.asarray(b))
    da, db = vjp(jnp.asarray(g))
    a64, b64, g64 = (v.astype(np.float64) for v in (a, b, g))
    for ours, ref in ((y, a64 @ b64), (da, g64 @ b64.T), (db, a64.T @ g64)):
        np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride", [1, 2])
def test_flops_are_the_same_in_every_form(stride):
    """Forward pass and both gradients: 3 products of the kept pixels' (B*H'*W', C_in) matrix
    with the (C_in, C_out) kernel, whether oneDNN's sgemm, XLA's dot or XLA's convolution."""
    x = jnp.ones((3, 4, 5, 6), jnp.float32)
    kernel = jnp.ones((1, 1, 6, 7), jnp.float32)
    counts = {}
    for form, mode in (("matmul", "xla"), ("matmul", "onednn"), ("conv", "xla")):
        native = mode == "onednn" and jax.default_backend() == "cpu"

        def loss(x, k, form=form, native=native):
            return jnp.sum(pointwise_conv(x, k, stride, native, form) ** 2)

        counts[form, mode] = model_flops(jax.grad(loss, argnums=(0, 1)), x, kernel).flops
    rows = 3 * -(-4 // stride) * -(-5 // stride)
    assert set(counts.values()) == {3 * 2.0 * rows * 6 * 7}


@pytest.mark.parametrize("form", ["matmul", "conv"])
@pytest.mark.parametrize(
    ("shape", "stride"), [((3, 8, 8, 4), 2), ((2, 7, 5, 3), 3), ((2, 4, 4, 2), 1)]
)
def test_both_forms_equal_the_strided_convolution(form, shape, stride):
    """Either form, strided or not, is the SAME 1x1 convolution: an explicit float64 sum over the
    input channels of every ``stride``-th pixel, and XLA's convolution's gradients."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=shape), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(1, 1, shape[-1], 5)), jnp.float32)
    explicit = np.einsum(
        "bhwc,co->bhwo", np.asarray(x, np.float64)[:, ::stride, ::stride], np.asarray(kernel[0, 0])
    )
    ours = pointwise_conv(x, kernel, stride, form=form)
    assert ours.shape == (shape[0], -(-shape[1] // stride), -(-shape[2] // stride), 5)
    tol = matmul_tolerance()
    np.testing.assert_allclose(ours, explicit, rtol=tol, atol=tol)

    def conv(x, k):
        return lax.conv_general_dilated(x, k, (stride, stride), "SAME", dimension_numbers=NHWC)

    weights = jnp.asarray(rng.normal(size=ours.shape), jnp.float32)
    grads = [
        jax.grad(lambda x, k, fn=fn: jnp.sum(weights * fn(x, k)), argnums=(0, 1))(x, kernel)
        for fn in (conv, lambda x, k: pointwise_conv(x, k, stride, form=form))
    ]
    for ref, got in zip(*grads, strict=True):
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(("backend", "form"), [("cpu", "matmul"), ("gpu", "conv"), ("tpu", "conv")])
def test_auto_form_is_the_matmul_on_cpu_only(monkeypatch, backend, form):
    """ "auto" keeps the matrix product on CPU and XLA's convolution on accelerators, where the
    strided product's fusion aborted XLA's GPU compiler; an unknown form is a ValueError."""
    monkeypatch.setattr(pointwise.jax, "default_backend", lambda: backend)
    assert pointwise.pointwise_form() == form
    with pytest.raises(ValueError, match="unknown pointwise form 'matrix'"):
        pointwise.pointwise_form("matrix")


@pytest.mark.parametrize("form", ["matmul", "conv"])
def test_the_compiled_step_holds_the_chosen_form(form):
    """The strided 1x1 layer compiles to a dot on the pixels kept ("matmul") or to XLA's
    convolution ("conv")."""
    x = jnp.ones((2, 8, 8, 4), jnp.float32)
    kernel = jnp.ones((1, 1, 4, 6), jnp.float32)
    hlo = jax.jit(lambda x, k: pointwise_conv(x, k, 2, form=form)).lower(x, kernel).as_text()
    assert ("convolution" in hlo) == (form == "conv")
    assert ("dot_general" in hlo) == (form == "matmul")
