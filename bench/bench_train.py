"""Training throughput of the default glyph baseline at batch 112, with reference runs.

Times, in the same process and on the same batch:

* ``jdml step``: the full jitted train step (forward, distance-weighted mining, margin loss,
  backward, Adam with coupled weight decay, the non-finite guard), state donated;
* ``backbone only``: the same network's forward/backward/Adam with a plain sum-of-squares loss,
  so the ratio shows what mining and the loss add;
* ``input pipeline``: the grain pipeline alone (SPC-2 sampling, gather, affine augmentation);
* ``torch eager`` (only if PyTorch is importable): the same backbone written in PyTorch, eager,
  forward/backward/Adam with the sum-of-squares loss, as an outside reference point.

Every figure is the median of ``--repeats`` rounds of ``--steps`` steps after a warm-up, and the
contenders run in turn so that machine load affects them alike.

Then the achieved TFLOP/s of the two jitted steps (their model FLOPs: matrix products and
convolutions) and their MFU, the fraction of the device's peak (``jdml/throughput.py``: a
data-sheet figure on known GPUs and TPUs, a measured matmul elsewhere); the script runs unchanged
on CPU, GPU and TPU.

``--layers`` then times every convolution of the network on its own, forward and backward, as
the step runs it (oneDNN on CPU where it builds), with XLA's convolution and in PyTorch, and
prints its GFLOP/s and the fraction of the matmul peak measured here.

``--set KEY=VALUE`` (repeatable) changes the config first, to time another network on both
sides, e.g. ``--set "model.small_resnet.stage_strides=(2, 2, 1)"`` or ``--set
model.dtype=bfloat16`` (the PyTorch network follows the model keys; it stays float32).

``--profile`` prints the jdml step's time per kind of XLA op (a ``jax.profiler`` trace).

Usage: python bench/bench_train.py [--steps 20] [--repeats 3] [--layers] [--profile]
           [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs.revisiting import get_config
from jdml.backends import resolve_backends
from jdml.config import apply_overrides
from jdml.data.pipeline import train_batches
from jdml.errors import ConfigError
from jdml.nn.conv import conv2d
from jdml.run import Run
from jdml.step import make_train_step
from jdml.throughput import (
    alternating_rounds,
    measured_matmul_tflops,
    model_flops,
    op_times,
    throughput_line,
)


def _torch_step(config, batch_np: np.ndarray) -> Callable[[], None] | None:
    try:
        import torch
        from torch import nn
    except ImportError:
        return None
    torch.manual_seed(0)
    m = config.model.small_resnet

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.proj = None
            if stride != 1 or cin != cout:
                self.proj = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + (self.proj(x) if self.proj is not None else x))

    layers = [
        nn.Conv2d(1, m.stem_features, 3, m.stem_strides, 1, bias=False),
        nn.BatchNorm2d(m.stem_features),
        nn.ReLU(),
    ]
    cin = m.stem_features
    for feat, blocks, stride in zip(m.stage_features, m.stage_blocks, m.stage_strides, strict=True):
        for j in range(blocks):
            layers.append(Block(cin, feat, stride if j == 0 else 1))
            cin = feat
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 128))
    net = net.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=4e-4)
    x = torch.from_numpy(batch_np).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = net(x).square().sum()
        loss.backward()
        opt.step()

    return step


class ConvLayer(NamedTuple):
    """One convolution of the glyph network: input map size, channels, kernel, stride, how
    many times it occurs, and whether its input needs a gradient (not for the stem)."""

    name: str
    size: int
    cin: int
    cout: int
    kernel: int
    stride: int
    count: int
    input_grad: bool

    def flops(self, batch: int) -> float:
        """Forward and backward flops at ``batch`` (2 per multiply-add; the backward pass is
        the kernel gradient plus, except for the stem, the input gradient)."""
        out = self.size // self.stride
        macs = batch * out * out * self.kernel * self.kernel * self.cin * self.cout
        return 2.0 * macs * (3 if self.input_grad else 2)


def conv_layers(config) -> list[ConvLayer]:
    """The distinct convolutions of the small ResNet of ``config.model`` (with repeats)."""
    m = config.model.small_resnet
    size = config.data.image_size
    layers = [ConvLayer("stem", size, 1, m.stem_features, 3, m.stem_strides, 1, False)]
    size //= m.stem_strides
    cin = m.stem_features
    for i, (feat, blocks, stride) in enumerate(
        zip(m.stage_features, m.stage_blocks, m.stage_strides, strict=True)
    ):
        name = f"stage{i + 1}"
        layers.append(ConvLayer(f"{name} conv1", size, cin, feat, 3, stride, 1, True))
        if stride != 1 or cin != feat:
            layers.append(ConvLayer(f"{name} projection", size, cin, feat, 1, stride, 1, True))
        size //= stride
        layers.append(ConvLayer(f"{name} conv2", size, feat, feat, 3, 1, 1, True))
        if blocks > 1:
            layers.append(
                ConvLayer(f"{name} later convs", size, feat, feat, 3, 1, 2 * blocks - 2, True)
            )
        cin = feat
    return layers


def _jdml_conv(layer: ConvLayer, batch: int, xla: bool = False) -> Callable[[], None]:
    """Forward and backward of one convolution as the jdml model runs it (NHWC,
    :func:`jdml.nn.conv.conv2d`: oneDNN's on CPU where it builds), jitted; ``xla``: with XLA's
    convolutions instead (``backends.conv=xla``)."""
    native = not xla and resolve_backends().native_conv
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, layer.size, layer.size, layer.cin)), jnp.float32)
    w = jnp.asarray(
        rng.standard_normal((layer.kernel, layer.kernel, layer.cin, layer.cout)), jnp.float32
    )

    def forward_backward(x, w):
        out, pull = jax.vjp(lambda x, w: conv2d(x, w, layer.stride, native), x, w)
        dx, dw = pull(jnp.ones_like(out))
        return (dw, dx) if layer.input_grad else (dw,)

    compiled = jax.jit(forward_backward).lower(x, w).compile()
    return lambda: jax.block_until_ready(compiled(x, w))


def _torch_conv(layer: ConvLayer, batch: int) -> Callable[[], None] | None:
    """The same convolution's forward and backward in PyTorch eager (channels-last)."""
    try:
        import torch
    except ImportError:
        return None
    conv = torch.nn.Conv2d(
        layer.cin, layer.cout, layer.kernel, layer.stride, layer.kernel // 2, bias=False
    ).to(memory_format=torch.channels_last)
    x = torch.randn(batch, layer.cin, layer.size, layer.size).contiguous(
        memory_format=torch.channels_last
    )
    x.requires_grad_(layer.input_grad)

    def step() -> None:
        conv.zero_grad(set_to_none=True)
        conv(x).sum().backward()

    return step


def layer_table(config, repeats: int, steps: int) -> None:
    """Per-convolution forward+backward time and GFLOP/s of jdml (what the step runs), of XLA's
    convolution and of PyTorch, against the matmul peak."""
    batch = config.train.batch_size
    peak = measured_matmul_tflops("float32") * 1e3
    print(f"\nper convolution, forward + backward at batch {batch}, median of {repeats} "
          f"rounds of {steps} calls; matmul peak here (2048^3 float32, jitted XLA): "
          f"{peak:.0f} GFLOP/s; jdml = what the step runs (oneDNN on CPU where it builds, "
          "jdml.nn.conv), XLA = the same with backends.conv=xla")  # fmt: skip
    header = f"{'layer':<20}{'map':>6}{'cin':>5}{'cout':>5}{'k':>3}{'s':>3}{'x':>3}{'GFLOP':>8}"
    print(f"{header}{'jdml ms':>9}{'GFLOP/s':>9}{'% peak':>8}{'XLA ms':>8}{'torch ms':>10}"
          f"{'GFLOP/s':>9}")  # fmt: skip
    totals = {"jdml": 0.0, "xla": 0.0, "torch": 0.0}
    for layer in conv_layers(config):
        fns = {"jdml": _jdml_conv(layer, batch), "xla": _jdml_conv(layer, batch, xla=True)}
        torch_fn = _torch_conv(layer, batch)
        if torch_fn is not None:
            fns["torch"] = torch_fn
        times = alternating_rounds(fns, repeats, calls=steps)
        gflop = layer.flops(batch) / 1e9
        t = {name: timing.median for name, timing in times.items()}
        for name in t:
            totals[name] += layer.count * t[name]
        row = (
            f"{layer.name:<20}{layer.size:>6}{layer.cin:>5}{layer.cout:>5}{layer.kernel:>3}"
            f"{layer.stride:>3}{layer.count:>3}{gflop:>8.3f}{1e3 * t['jdml']:>9.2f}"
            f"{gflop / t['jdml']:>9.0f}{100 * gflop / t['jdml'] / peak:>8.1f}"
            f"{1e3 * t['xla']:>8.2f}"
        )
        if "torch" in t:
            row += f"{1e3 * t['torch']:>10.2f}{gflop / t['torch']:>9.0f}"
        print(row, flush=True)
    print(f"{'all convolutions':<53}{1e3 * totals['jdml']:>9.2f}{'':>17}"
          f"{1e3 * totals['xla']:>8.2f}{1e3 * totals['torch']:>10.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--layers", action="store_true", help="also time every convolution on its own"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print the jdml step's time per XLA op kind"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override, e.g. model.dtype=bfloat16 (repeatable)",
    )
    args = parser.parse_args()

    try:
        config = apply_overrides(get_config(), args.set)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    run = Run(config)
    bs = config.train.batch_size
    make_batch = run.batch_maker()
    batch = {k: jnp.asarray(v) for k, v in make_batch(0).items()}

    step = make_train_step(run.method, run.tx)
    state = [jax.tree.map(jnp.copy, run.initial_state)]

    def jdml_step() -> None:
        state[0], metrics = step(state[0], batch)
        jax.block_until_ready(metrics)

    tx = optax.adam(1e-3)
    model = run.method.train_model
    params0 = run.initial_state.params["model"]
    plain = [(params0, run.initial_state.batch_stats, tx.init(params0))]

    @jax.jit
    def plain_update(params, stats, opt_state, images):
        def loss_fn(p):
            out, upd = model.apply(
                {"params": p, "batch_stats": stats},
                run.method.preprocess(images),
                mutable=["batch_stats"],
            )
            return jnp.sum(jnp.square(out[run.method.head])), upd["batch_stats"]

        (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state

    def backbone_step() -> None:
        p, s, o = plain[0]
        plain[0] = jax.block_until_ready(plain_update(p, s, o, batch["images"]))

    pipe_iter = [None]

    def pipeline_step() -> None:
        if pipe_iter[0] is None:
            pipe_iter[0] = train_batches(
                make_batch, start_step=0, total_steps=10**9, num_threads=2, prefetch=4
            )
        next(pipe_iter[0])

    contenders: dict[str, Callable[[], None]] = {
        "jdml step": jdml_step,
        "backbone only": backbone_step,
        "input pipeline": pipeline_step,
    }
    torch_step = _torch_step(config, np.asarray(batch["images"]))
    if torch_step is not None:
        contenders["torch eager"] = torch_step

    times = alternating_rounds(contenders, args.repeats, calls=args.steps, warmup=2)
    ref = times["jdml step"].median
    print(f"batch {bs}, {args.steps} steps x {args.repeats} rounds, median per step")
    print(f"{'':16s} {'ms/step':>9s} {'images/s':>9s} {'time / jdml step':>17s}")
    for name, timing in times.items():
        t = timing.median
        print(f"{name:16s} {1e3 * t:9.1f} {bs / t:9.0f} {t / ref:17.2f}")
    if torch_step is None:
        print("torch eager: PyTorch not installed (pip install torch==2.13.0 to compare)")
    dtype = str(config.model.dtype)
    print(f"\nachieved throughput on {jax.devices()[0].device_kind} ({dtype} compute):")
    flops = model_flops(step, state[0], batch)
    print(throughput_line("jdml step", flops, ref, dtype))
    params, stats, opt_state = plain[0]
    flops = model_flops(plain_update, params, stats, opt_state, batch["images"])
    print(throughput_line("backbone only", flops, times["backbone only"].median, dtype))
    if args.profile:
        kinds = op_times(jdml_step, args.steps)
        total = sum(kinds.values())
        print(f"\njdml step, time per XLA op kind (ms per step, {args.steps} steps profiled):")
        for kind, ms in kinds.most_common(15):
            print(f"  {kind:<40s} {ms:7.2f}  {100 * ms / total:5.1f} %")
        print(f"  {'all ops':<40s} {total:7.2f}")
    if args.layers:
        layer_table(config, args.repeats, args.steps)


if __name__ == "__main__":
    main()
