"""The benchmarks' helpers (jdml/throughput.py): the model-FLOP count of a traced function (matrix
products and convolutions, loops, custom derivatives, the native custom calls), the device
peaks and the rate each dtype and precision really runs at, and the timer."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
import pytest
from jax import lax

from jdml import throughput
from jdml.throughput import FlopCount, model_flops, window_taps

NHWC = ("NHWC", "HWIO", "NHWC")


def _conv(x: jax.Array, k: jax.Array, stride: int, groups: int = 1, dilation: int = 1):
    return lax.conv_general_dilated(
        x, k, (stride, stride), "SAME", rhs_dilation=(dilation, dilation),
        dimension_numbers=NHWC, feature_group_count=groups,
    )  # fmt: skip


def _primitives(fn, *args) -> dict[str, list[dict]]:
    """The parameters of every equation of ``fn``'s jaxpr (top level), by primitive name."""
    out: dict[str, list[dict]] = {}
    for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns:
        out.setdefault(eqn.primitive.name, []).append(eqn.params)
    return out


# ResNet-50 (torchvision layout: the stride on the 3x3 convolution) as (blocks, width, stride).
RESNET50_STAGES = ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2))


def resnet50_macs(size: int) -> int:
    """Multiply-adds of ResNet-50's convolutions on one size x size image, layer by layer:
    output pixels x kernel taps x input channels x output channels."""
    side = size // 2
    macs = side * side * 7 * 7 * 3 * 64  # stem: 7x7, stride 2, 3 -> 64
    side //= 2  # 3x3 max pool, stride 2
    channels = 64
    for blocks, width, stride in RESNET50_STAGES:
        for block in range(blocks):
            out = side // (stride if block == 0 else 1)
            macs += side * side * channels * width  # 1x1 reduce
            macs += out * out * 3 * 3 * width * width  # 3x3, strided in the first block
            macs += out * out * width * 4 * width  # 1x1 expand
            if block == 0:
                macs += out * out * channels * 4 * width  # 1x1 strided projection
            channels, side = 4 * width, out
    return macs


def test_resnet50_forward_is_4_1_gmac_per_image() -> None:
    """ResNet-50 of ``data=cub200`` at 224 px, batch 1, traced from shapes only: 4,087,136,256
    multiply-adds in the convolutions (by hand above) plus 2048 x 128 in the embedding head =
    4,087,398,400, i.e. 8.17 GFLOP. torchvision's 4.09 GMAC has a 2048 x 1000 fc layer instead
    (4,089,184,256); both are within 1% of the usual 4.1e9."""
    from configs.revisiting import get_config
    from jdml.models.embedding import build_model

    cfg = get_config("data=cub200").model
    assert (cfg.backbone, cfg.embed_dim) == ("resnet50", 128)
    model = build_model(cfg, train=False)
    image = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
    variables = jax.eval_shape(model.init, jax.random.key(0), image)
    count = model_flops(model.apply, variables, image)
    expected = resnet50_macs(224) + 2048 * cfg.embed_dim
    assert resnet50_macs(224) == 4_087_136_256 and expected == 4_087_398_400
    assert count == FlopCount(2.0 * expected)
    assert abs(expected - 4.1e9) < 0.01 * 4.1e9
    assert abs(resnet50_macs(224) + 2048 * 1000 - 4.09e9) < 0.001 * 4.09e9  # torchvision's


def test_a_dot_general_counts_batch_and_contracting_dimensions() -> None:
    a = jnp.ones((3, 4, 5, 6), jnp.float32)  # batch 3, rows 4, contracting (5, 6)
    b = jnp.ones((3, 6, 5, 7), jnp.float32)  # batch 3, contracting (6, 5), columns 7

    def dot(a, b):
        return lax.dot_general(a, b, (((2, 3), (2, 1)), ((0,), (0,))))

    assert dot(a, b).shape == (3, 4, 7)
    assert model_flops(dot, a, b).flops == 2 * 3 * 4 * 7 * (5 * 6)
    assert model_flops(jax.jit(jnp.matmul), a[0, :, :, 0], b[0, 0]).flops == 2 * 4 * 5 * 7


@pytest.mark.parametrize(
    ("size", "cin", "cout", "k", "stride", "groups", "dilation"),
    [(9, 4, 6, 3, 2, 1, 1), (8, 6, 4, 3, 1, 2, 1), (7, 8, 8, 5, 2, 8, 1), (10, 4, 6, 3, 1, 1, 2)],
)
def test_a_convolution_counts_output_x_taps_x_input_channels_per_group(
    size: int, cin: int, cout: int, k: int, stride: int, groups: int, dilation: int
) -> None:
    """Strided, grouped, depthwise (groups = channels) and dilated: every output element
    multiplies k x k kernel taps (padding included) by C_in / groups channels."""
    x = jnp.ones((2, size, size, cin), jnp.float32)
    kernel = jnp.ones((k, k, cin // groups, cout), jnp.float32)
    fn = functools.partial(_conv, stride=stride, groups=groups, dilation=dilation)
    out = -(-size // stride)
    assert fn(x, kernel).shape == (2, out, out, cout)
    assert model_flops(fn, x, kernel).flops == 2 * (2 * out * out * cout) * k * k * cin // groups


def test_window_taps_skips_the_zeros_of_an_input_dilation() -> None:
    """One axis of the input gradient of a stride-2, 3-tap SAME convolution: the output
    gradient (4 positions from 7 or 8 inputs) dilated by 2, padded k - 1 - pad_low = 1. Of
    the 3 taps of each input position, those on an inserted zero do not count: 1 tap at even
    positions, 2 at odd ones."""
    assert window_taps(8, 3, 1, 2, 1, 1) == 4 * 1 + 4 * 2 == 4 * 3  # = the forward pass
    assert window_taps(7, 3, 1, 2, 1, 1) == 4 * 1 + 3 * 2  # 7 inputs: 2 fewer
    assert window_taps(7, 3) == 21 and window_taps(5, 3, 2, 1, 2, 1) == 15  # no input dilation
    # period 3 (stride 2 against dilation 3): brute force
    brute = sum((i * 2 + t - 1) % 3 == 0 for i in range(11) for t in range(4))
    assert window_taps(11, 4, 2, 3, 1, 1) == brute


@pytest.mark.parametrize(("groups", "stride"), [(1, 2), (4, 2), (8, 1), (8, 2)])
def test_the_gradients_of_a_convolution_each_count_its_forward_pass(groups, stride) -> None:
    """The kernel gradient (a convolution over the batch: ``batch_group_count`` for a grouped
    or depthwise layer, ``feature_group_count`` the groups' channels otherwise) and the input
    gradient (input dilated by the stride) each count the forward pass, the input size being a
    multiple of the stride."""
    x = jnp.ones((3, 8, 8, 8), jnp.float32)
    kernel = jnp.ones((3, 3, 8 // groups, 8), jnp.float32)
    fn = functools.partial(_conv, stride=stride, groups=groups)
    forward = model_flops(fn, x, kernel).flops

    def loss(x, kernel):
        return jnp.sum(fn(x, kernel))

    kernel_grad = jax.grad(loss, argnums=1)
    params = _primitives(kernel_grad, x, kernel)["conv_general_dilated"][-1]  # after the forward
    assert params["rhs_dilation"] == (stride, stride)
    if groups > 1:
        assert params["batch_group_count"] == groups
    assert model_flops(kernel_grad, x, kernel).flops == forward
    params = _primitives(jax.grad(loss), x, kernel)["conv_general_dilated"][-1]
    assert params["lhs_dilation"] == (stride, stride)
    assert model_flops(jax.grad(loss), x, kernel).flops == forward
    assert model_flops(jax.grad(loss, argnums=(0, 1)), x, kernel).flops == 2 * forward


def test_a_scan_counts_its_body_times_its_length_a_cond_its_costliest_branch() -> None:
    c, xs = jnp.ones((4, 4)), jnp.ones((5, 4, 4))

    def scanned(c, xs):
        return lax.scan(lambda c, x: (c @ x, None), c, xs)[0]

    assert model_flops(scanned, c, xs).flops == 5 * 2 * 4**3

    def branches(p, c):
        return lax.cond(p, lambda c: c @ c @ c, lambda c: c @ c, c)

    assert model_flops(branches, True, c).flops == 2 * 2 * 4**3

    def loop(n, c):
        return lax.fori_loop(0, n, lambda i, c: c @ c, c)  # trip count known when it runs

    count = model_flops(loop, 3, c)
    assert count == FlopCount(2 * 4**3, loops=1)
    assert "1 while-loop bodies counted once" in count.note


def test_a_custom_vjp_counts_its_backward_rule_not_autodiff() -> None:
    """Under ``jax.grad`` the backward rule runs: here one product for both gradients, where
    autodiff of the same forward pass takes two; the forward pass counts once."""

    @jax.custom_vjp
    def product(a, b):
        return a @ b

    def fwd(a, b):
        return a @ b, (a, b)

    def bwd(residuals, g):
        _, b = residuals
        return g @ b.T, jnp.zeros_like(b)  # no gradient for b

    product.defvjp(fwd, bwd)
    a, b = jnp.ones((4, 5)), jnp.ones((5, 6))
    matmul = 2 * 4 * 5 * 6
    custom = jax.grad(lambda a, b: jnp.sum(product(a, b) ** 2), argnums=(0, 1))
    autodiff = jax.grad(lambda a, b: jnp.sum((a @ b) ** 2), argnums=(0, 1))
    assert model_flops(lambda a, b: product(a, b), a, b).flops == matmul
    assert model_flops(custom, a, b).flops == 2 * matmul
    assert model_flops(autodiff, a, b).flops == 3 * matmul


def test_unused_work_is_not_counted_and_jit_and_remat_are_entered() -> None:
    a = jnp.ones((4, 4))

    def fn(a):
        _unused = a @ a @ a
        return jax.jit(jax.checkpoint(lambda a: jnp.sin(a @ a)))(a)

    assert model_flops(fn, a).flops == 2 * 4**3


def test_a_shard_map_counts_its_body_on_every_shard() -> None:
    """The body sees one shard of the manual axis; an automatic axis is not divided."""
    from jax.sharding import PartitionSpec as P

    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices (tests/conftest.py sets 4 CPU devices)")
    mesh = jax.make_mesh((2, 2), ("a", "b"))
    x, w = jnp.ones((8, 6)), jnp.ones((6, 3))
    body = jax.shard_map(
        lambda x, w: x @ w, mesh=mesh, in_specs=(P("a"), P()), out_specs=P("a"), axis_names={"a"}
    )
    assert model_flops(body, x, w).flops == 2 * 8 * 6 * 3


def test_an_unknown_custom_call_is_named() -> None:
    call = jax.ffi.ffi_call("no_such_target", jax.ShapeDtypeStruct((3,), jnp.float32))
    count = model_flops(lambda x: call(x) + (x @ jnp.ones((3, 3))), jnp.ones(3))
    assert count == FlopCount(2 * 3 * 3, uncounted=("no_such_target",))
    assert "custom calls not counted: no_such_target" in count.note


def _glyph_train_step(native_conv: bool = False):
    """The default glyph network (``configs/revisiting.py``) at batch 8, with oneDNN's
    convolutions or XLA's: its forward pass and one train step (forward, backward, Adam), with
    example arguments (shapes only)."""
    from configs.revisiting import get_config
    from jdml.models.embedding import build_model

    cfg = get_config()
    model = build_model(cfg.model, train=True, native_conv=native_conv)
    size = cfg.data.image_size
    images = jax.ShapeDtypeStruct((8, size, size, cfg.data.channels), jnp.float32)
    variables = jax.eval_shape(model.init, jax.random.key(0), images)
    tx = optax.adam(1e-3)
    opt_state = jax.eval_shape(tx.init, variables["params"])

    def forward(variables, images):
        return model.apply(variables, images, mutable=["batch_stats"])

    def step(variables, opt_state, images):
        def loss(params):
            out, updated = forward({**variables, "params": params}, images)
            return sum(jnp.sum(e**2) for e in out.values()), updated

        grads, updated = jax.grad(loss, has_aux=True)(variables["params"])
        updates, opt_state = tx.update(grads, opt_state, variables["params"])
        params = optax.apply_updates(variables["params"], updates)
        return {**updated, "params": params}, opt_state

    return forward, jax.jit(step), (variables, images), (variables, opt_state, images)


def test_a_train_step_counts_the_same_with_onednn_or_xla_and_3x_its_forward() -> None:
    """The glyph network's step with oneDNN's custom calls (CPU) and with XLA's convolutions:
    the same count. Forward and backward come to just under 3x the forward pass: the stem's
    input gradient (of the images) is not computed."""
    counts, jaxprs = {}, {}
    for mode in ("xla", "onednn"):
        native = mode == "onednn" and jax.default_backend() == "cpu"
        forward, step, forward_args, step_args = _glyph_train_step(native)
        counts[mode] = model_flops(step, *step_args)
        jaxprs[mode] = str(jax.make_jaxpr(step)(*step_args))
    if jax.default_backend() == "cpu":
        assert "jdml_dnnl_conv_bwd_weights" in jaxprs["onednn"]
        assert "jdml_dnnl" not in jaxprs["xla"]
    assert counts["onednn"] == counts["xla"]
    assert counts["xla"].flops > 0 and not counts["xla"].note
    ratio = counts["xla"].flops / model_flops(forward, *forward_args).flops
    assert 2.9 < ratio < 3.0


@pytest.mark.parametrize(
    ("kind", "dtype", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "float32", "default", 494.7),  # TF32 tensor cores
        ("NVIDIA H100 80GB HBM3", "float32", "high", 494.7),
        ("NVIDIA H100 80GB HBM3", "float32", "highest", 67.0),  # CUDA cores
        ("NVIDIA H100 80GB HBM3", "bfloat16", "default", 989.4),
        ("NVIDIA H100 PCIe", "float32", "default", 378.0),
        ("NVIDIA H100 PCIe", "bfloat16", "default", 756.5),
        ("NVIDIA H100 NVL", "float32", "default", 417.5),
        ("NVIDIA H100 NVL", "float16", "default", 835.5),
        ("NVIDIA H200", "float32", "default", 494.7),
        ("NVIDIA H200", "bfloat16", "highest", 989.4),
        ("NVIDIA H200 NVL", "bfloat16", "default", 835.5),
        ("NVIDIA B200", "float32", "default", 1100.0),
        ("NVIDIA B200", "bfloat16", "default", 2250.0),
        ("NVIDIA A100-SXM4-80GB", "float32", "default", 156.0),
        ("NVIDIA A100-SXM4-80GB", "float32", "highest", 19.5),
        ("NVIDIA A10", "float32", "default", 62.5),
        ("TPU v5 lite", "float32", "default", 197.0),  # one bfloat16 pass
        ("TPU v5 lite", "float32", "high", 197.0 / 3),
        ("TPU v5 lite", "float32", "highest", 197.0 / 6),
        ("TPU v5", "bfloat16", "default", 459.0),  # v5p
        ("TPU v6 lite", "float32", "default", 918.0),
        ("TPU v4", "float32", "default", 275.0),
    ],
)
def test_device_peak_is_the_rate_the_backend_uses(
    monkeypatch: pytest.MonkeyPatch, kind: str, dtype: str, precision: str, peak: float
) -> None:
    class Device:
        device_kind = kind

    monkeypatch.setattr(jax, "devices", lambda: [Device()])
    tflops, source = throughput.device_peak(dtype, precision)
    assert tflops == pytest.approx(peak)
    assert source.startswith(kind) and "measured" not in source


def test_the_default_precision_follows_jax_config(monkeypatch: pytest.MonkeyPatch) -> None:
    class Device:
        device_kind = "NVIDIA H100 80GB HBM3"

    monkeypatch.setattr(jax, "devices", lambda: [Device()])
    with jax.default_matmul_precision("highest"):
        assert throughput.device_peak("float32")[0] == 67.0
    with jax.default_matmul_precision("tensorfloat32"):
        assert throughput.device_peak("float32")[0] == 494.7
    assert throughput.device_peak("float32", lax.Precision.HIGHEST)[0] == 67.0
    with pytest.raises(ValueError, match="unknown precision 'exact'"):
        throughput.device_peak("float32", "exact")
    with pytest.raises(ValueError, match="no peak for dtype 'int8'"):
        throughput.device_peak("int8")


def test_device_peak_is_measured_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    class Device:
        device_kind = "NVIDIA GeForce RTX 9090"  # not listed

    monkeypatch.setattr(jax, "devices", lambda: [Device()])
    monkeypatch.setattr(throughput, "measured_matmul_tflops", lambda dtype, precision: 0.25)
    peak, source = throughput.device_peak("float32")
    assert peak == 0.25 and "measured" in source
    line = throughput.throughput_line("step", 1e9, 0.01, "float32")
    assert "1.00 GFLOP (matrix products and convolutions)" in line
    assert "0.100 TFLOP/s, MFU 40.0% of 0.250" in line
    line = throughput.throughput_line("step", FlopCount(1e9, loops=2), 0.01, "float32", devices=2)
    assert "MFU 20.0% of 2 x 0.250" in line and line.endswith("2 while-loop bodies counted once")


def test_alternating_rounds_interleaves_and_waits_for_results() -> None:
    order: list[str] = []

    def contender(name: str):
        def call():
            order.append(name)
            return jnp.ones(3) * len(order)

        return call

    timings = throughput.alternating_rounds(
        {"a": contender("a"), "b": contender("b")}, repeats=3, calls=2, warmup=2
    )
    assert order == ["a", "a", "b", "b"] + ["a", "a", "b", "b"] * 3
    assert list(timings) == ["a", "b"]
    for timing in timings.values():
        assert len(timing.rounds) == 3 and all(t >= 0 for t in timing.rounds)
        assert timing.best <= timing.median and timing.first >= 0
    assert float(timings["b"].result[0]) == len(order)  # the last call's result
    with pytest.raises(ValueError, match="at least 1"):
        throughput.alternating_rounds({"a": contender("a")}, repeats=0)


def test_alternating_rounds_settles_untimed_and_collects_garbage_untimed() -> None:
    """``settle`` untimed calls come right before each contender's timed calls in every round;
    the garbage collector is off while a contender is timed and on again afterwards."""
    import gc

    log: list[tuple[str, bool]] = []

    def contender(name: str):
        def call():
            log.append((name, gc.isenabled()))
            return jnp.ones(2)

        return call

    assert gc.isenabled()
    timings = throughput.alternating_rounds(
        {"a": contender("a"), "b": contender("b")}, repeats=2, calls=1, settle=2
    )
    names = [name for name, _ in log]
    assert names == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    assert all(not enabled for _, enabled in log[2:])  # the rounds: collector off
    assert gc.isenabled()
    assert all(len(timing.rounds) == 2 for timing in timings.values())
