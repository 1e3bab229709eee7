"""EfficientNet-Lite0 on CPU: XLA's convolutions against jdml's depthwise and pointwise forms.

Four timing sections, each timing the implementations in alternating rounds (so that the load of a
shared machine affects them alike) and printing medians:

* ``layers``: forward+backward (value and gradients w.r.t. input and kernel) of each distinct
  depthwise layer of Lite0 at ``--size`` px, batch ``--batch``, for the implementations of
  ``jdml.nn.depthwise``;
* ``pointwise``: the same for Lite0's 1x1 convolutions: XLA's convolution, the same product as
  XLA's dot, and ``jdml.nn.pointwise`` (oneDNN's sgemm on CPU);
* ``step``: the whole Lite0 train step, frozen BatchNorm, a 128-d linear embedding head, a
  softmax pair loss over the batch's cosine similarities (two images per class), Adam;
* ``embed``: forward-only pooled features at batch ``--embed-batch`` for each of ``--sizes``;
* ``profile`` (not in the default selection): the ``step`` of the last of ``--impls`` traced
  with ``jax.profiler``, its time summed per kind of XLA op (fusion names without numbers).

The whole network (``step``, ``embed``) uses ``jdml.nn.pointwise`` for its 1x1 convolutions.
Each of its timings is followed by its model FLOPs, TFLOP/s and MFU (``jdml.throughput``): the
network's multiply-adds, counted once with XLA's grouped convolution (the shifted sums are
elementwise operations, which the count leaves out), so every implementation is measured against
the same work.

Usage: python bench/bench_depthwise.py [--sections layers,pointwise,step,embed] [--repeats 3]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jdml.allocator import reexec_with_tcmalloc
from jdml.models.efficientnet import (
    HEAD_CHANNELS,
    LITE0_STAGES,
    STEM_CHANNELS,
    EfficientNetLite0,
)
from jdml.nn.depthwise import depthwise_conv2d
from jdml.nn.padding import same_padding
from jdml.nn.pointwise import pointwise_conv
from jdml.throughput import alternating_rounds, model_flops, op_times, throughput_line

NHWC = ("NHWC", "HWIO", "NHWC")

# The implementations compared by default, the reference first (--impls).
IMPLS = ("xla", "shifted", "onednn")
# Trace events of the host and the runtime rather than of XLA ops.


def lite0_depthwise_layers(size: int) -> list[tuple[int, int, int, int, int]]:
    """Lite0's depthwise layers at a square input of ``size`` px, in order:
    (height, width, channels, kernel, stride) of each layer's input."""
    side = same_padding(size, 3, 2)[0]  # after the stride-2 stem
    channels = STEM_CHANNELS
    layers = []
    for repeats, kernel, stride, expansion, _, out in LITE0_STAGES:
        for r in range(repeats):
            s = stride if r == 0 else 1
            layers.append((side, side, channels * expansion, kernel, s))
            side = same_padding(side, kernel, s)[0]
            channels = out
    return layers


def _rounds(contenders: dict[str, Callable[[], None]], repeats: int, steps: int):
    """Median seconds per call of each contender (:func:`jdml.throughput.alternating_rounds`)."""
    timings = alternating_rounds(contenders, repeats, calls=steps)
    return {name: timing.median for name, timing in timings.items()}


def _gradient_table(
    title: str,
    columns: str,
    layers: list[tuple],
    describe: Callable[[tuple], str],
    inputs: Callable[[tuple], tuple[jnp.ndarray, jnp.ndarray]],
    impls: dict[str, Callable[[tuple], Callable]],
    repeats: int,
) -> None:
    """Times forward+backward (gradients w.r.t. input and kernel) of each distinct layer for
    every implementation, in alternating rounds; prints ms per layer, totals and the speed-up
    of the last implementation over the first."""
    print(f"\n{title}: forward+backward ms")
    print(columns + "".join(f" {impl:>9s}" for impl in impls) + f" {'speed-up':>9s}")
    names = list(impls)
    totals = dict.fromkeys(names, 0.0)
    for layer in sorted(set(layers), key=layers.index):
        x, kernel = inputs(layer)
        contenders = {}
        for name, make in impls.items():
            fn = make(layer)

            def loss(x, kernel, fn=fn):
                return jnp.sum(jnp.square(fn(x, kernel)))

            grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
            contenders[name] = lambda grad=grad, x=x, kernel=kernel: jax.block_until_ready(
                grad(x, kernel)
            )
        t = _rounds(contenders, repeats, 2)
        count = layers.count(layer)
        for name in names:
            totals[name] += count * t[name]
        print(f"{describe(layer)} {count:5d}", end="")
        print("".join(f" {1e3 * t[n]:9.1f}" for n in names), end="")
        print(f" {t[names[0]] / t[names[-1]]:8.1f}x")
    print(f"{'all layers':<{len(columns) - 6}s} {len(layers):5d}", end="")
    print("".join(f" {1e3 * totals[n]:9.1f}" for n in names), end="")
    print(f" {totals[names[0]] / totals[names[-1]]:8.1f}x")


def bench_layers(impls: tuple[str, ...], size: int, batch: int, repeats: int) -> None:
    """Lite0's depthwise layers for the implementations of ``jdml.nn.depthwise``."""
    rng = np.random.default_rng(0)

    def inputs(layer):
        h, w, c, k, _ = layer
        x = jnp.asarray(rng.normal(size=(batch, h, w, c)), jnp.float32)
        return x, jnp.asarray(rng.normal(size=(k, k, 1, c)), jnp.float32)

    def implementation(impl):
        return lambda layer: lambda x, kernel: depthwise_conv2d(x, kernel, layer[4], impl)

    _gradient_table(
        f"Depthwise layers of Lite0 at {size} px, batch {batch}",
        f"{'input HxWxC':>14s} {'k':>2s} {'s':>2s} {'count':>5s}",
        lite0_depthwise_layers(size),
        lambda layer: f"{'x'.join(map(str, layer[:3])):>14s} {layer[3]:2d} {layer[4]:2d}",
        inputs,
        {impl: implementation(impl) for impl in impls},
        repeats,
    )


def lite0_pointwise_layers(size: int) -> list[tuple[int, int, int, int]]:
    """Lite0's 1x1 convolutions at ``size`` px, in order: (height, width, in, out channels)."""
    side = same_padding(size, 3, 2)[0]
    channels, layers = STEM_CHANNELS, []
    for repeats, kernel, stride, expansion, _, out in LITE0_STAGES:
        for r in range(repeats):
            hidden = channels * expansion
            if expansion != 1:
                layers.append((side, side, channels, hidden))
            side = same_padding(side, kernel, stride if r == 0 else 1)[0]
            layers.append((side, side, hidden, out))
            channels = out
    layers.append((side, side, channels, HEAD_CHANNELS))
    return layers


def bench_pointwise(size: int, batch: int, repeats: int) -> None:
    """Lite0's 1x1 convolutions, forward+backward: XLA's convolution, the matmul form in XLA's dot,
    and ``jdml.nn.pointwise`` (oneDNN's sgemm on CPU where the native library builds)."""
    rng = np.random.default_rng(0)

    def inputs(layer):
        h, w, c, out = layer
        x = jnp.asarray(rng.normal(size=(batch, h, w, c)), jnp.float32)
        return x, jnp.asarray(rng.normal(size=(1, 1, c, out)) / np.sqrt(c), jnp.float32)

    def xla(x, kernel):
        return lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=NHWC)

    def dot(x, kernel):  # the matmul form in XLA's own dot
        k = kernel.reshape(kernel.shape[2:])
        return (x.reshape(-1, x.shape[-1]) @ k).reshape(*x.shape[:-1], k.shape[-1])

    _gradient_table(
        f"Pointwise (1x1) layers of Lite0 at {size} px, batch {batch}",
        f"{'input HxWxC':>14s} {'out':>5s} {'count':>5s}",
        lite0_pointwise_layers(size),
        lambda layer: f"{'x'.join(map(str, layer[:3])):>14s} {layer[3]:5d}",
        inputs,
        {"xla conv": lambda _: xla, "xla dot": lambda _: dot, "jdml": lambda _: pointwise_conv},
        repeats,
    )


class _Embedder(nn.Module):
    impl: str

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        features = EfficientNetLite0(depthwise_impl=self.impl, name="backbone")(x)
        return nn.Dense(128, name="head")(features)


def _pair_loss(embeddings: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    """Softmax over each row's cosine similarities (temperature 0.1), the other image of the
    same class as the target."""
    z = embeddings / jnp.linalg.norm(embeddings, axis=-1, keepdims=True)
    sim = z @ z.T / 0.1
    sim = jnp.where(jnp.eye(len(z), dtype=bool), -1e9, sim)
    positive = (labels[:, None] == labels[None, :]) & ~jnp.eye(len(z), dtype=bool)
    logp = jax.nn.log_softmax(sim, axis=-1)
    return -jnp.mean(jnp.sum(jnp.where(positive, logp, 0.0), axis=-1))


def _train_update(impl: str, size: int, batch: int) -> tuple[Callable, tuple]:
    """The jitted Lite0 update (frozen BN, 128-d head, pair loss, Adam) on a fixed random batch
    of ``size`` px, the depthwise layers in ``impl``, and its first (params, opt_state)."""
    labels = jnp.repeat(jnp.arange(batch // 2), 2)
    tx = optax.adam(1e-4)
    images = jnp.asarray(np.random.default_rng(0).normal(size=(batch, size, size, 3)), jnp.float32)
    model = _Embedder(impl)
    variables = model.init(jax.random.PRNGKey(0), images[:1])
    params, stats = variables["params"], variables["batch_stats"]

    @jax.jit
    def update(params, opt_state):
        def loss_fn(p):
            out = model.apply({"params": p, "batch_stats": stats}, images)
            return _pair_loss(out, labels)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return update, (params, tx.init(params))


def _train_step(impl: str, size: int, batch: int) -> Callable[[], None]:
    """The update of :func:`_train_update` as a call that advances its state."""
    update, start = _train_update(impl, size, batch)
    state = [start]

    def step() -> None:
        p, o, loss = update(*state[0])
        state[0] = (p, o)
        jax.block_until_ready(loss)

    return step


def bench_step(
    impls: tuple[str, ...], sizes: list[int], batch: int, repeats: int, steps: int
) -> None:
    print(f"\nLite0 train step (frozen BN, Adam, pair loss), batch {batch}: ms/step, images/s")
    for size in sizes:
        contenders = {impl: _train_step(impl, size, batch) for impl in impls}
        t = _rounds(contenders, repeats, steps)
        print(f"{size:4d} px", end="")
        print("".join(f"  {i}: {1e3 * t[i]:7.0f} ms {batch / t[i]:6.0f} im/s" for i in impls))
        update, start = _train_update("xla", size, batch)
        flops = model_flops(update, *start)
        for impl in impls:
            print(throughput_line(f"  {impl}", flops, t[impl], "float32"))


def profile_step(impl: str, size: int, batch: int, steps: int, top: int = 12) -> None:
    """The train step's time per kind of XLA op, from a ``jax.profiler`` trace of ``steps``
    steps (ms per step; a kind is a fusion's name without its number, e.g. every
    ``clamp_pad_fusion.N``; ops that overlap on several threads are each counted)."""
    kinds = op_times(_train_step(impl, size, batch), steps)
    total = sum(kinds.values())
    print(f"\nLite0 train step at {size} px, batch {batch}, {impl}: XLA ops, ms per step")
    for kind, ms in kinds.most_common(top):
        print(f"  {kind:<28s} {ms:7.1f}  {100 * ms / total:5.1f} %")
    print(f"  {'all ops':<28s} {total:7.1f}")


def bench_embed(
    impls: tuple[str, ...], sizes: list[int], batch: int, repeats: int, steps: int
) -> None:
    print(f"\nLite0 forward only (pooled features), batch {batch}: ms/batch, images/s")
    for size in sizes:
        images = jnp.asarray(
            np.random.default_rng(0).normal(size=(batch, size, size, 3)), jnp.float32
        )
        contenders = {}
        for impl in impls:
            model = EfficientNetLite0(depthwise_impl=impl)
            variables = model.init(jax.random.PRNGKey(0), images[:1])
            apply = jax.jit(model.apply)
            contenders[impl] = lambda apply=apply, v=variables, x=images: jax.block_until_ready(
                apply(v, x)
            )
        t = _rounds(contenders, repeats, steps)
        print(f"{size:4d} px", end="")
        print("".join(f"  {i}: {1e3 * t[i]:7.0f} ms {batch / t[i]:6.0f} im/s" for i in impls))
        model = EfficientNetLite0(depthwise_impl="xla")
        variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), images[:1])
        flops = model_flops(model.apply, variables, images)
        for impl in impls:
            print(throughput_line(f"  {impl}", flops, t[impl], "float32"))


def main() -> None:
    reexec_with_tcmalloc()  # XLA's per-step buffers without page faults (jdml.allocator)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", default="layers,pointwise,step,embed")
    parser.add_argument("--size", type=int, default=64, help="image size of the layer table")
    parser.add_argument("--sizes", default="64,96,128", help="image sizes of step and embed")
    parser.add_argument("--batch", type=int, default=112)
    parser.add_argument("--embed-batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--impls", default=",".join(IMPLS), help="the reference first")
    args = parser.parse_args()
    impls = tuple(args.impls.split(","))
    sections = args.sections.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"backend {jax.default_backend()}, {jax.device_count()} device(s); medians of "
          f"{args.repeats} alternating rounds (xla = grouped lax convolution, shifted = "
          "shifted sums, onednn = oneDNN with the native kernel gradient, the CPU default; "
          "see jdml.nn.depthwise)")  # fmt: skip
    if "layers" in sections:
        bench_layers(impls, args.size, args.batch, args.repeats)
    if "pointwise" in sections:
        bench_pointwise(args.size, args.batch, args.repeats)
    if "step" in sections:
        bench_step(impls, sizes, args.batch, args.repeats, args.steps)
    if "embed" in sections:
        bench_embed(impls, sizes, args.embed_batch, args.repeats, args.steps)
    if "profile" in sections:
        for size in sizes:
            profile_step(impls[-1], size, args.batch, max(args.steps, 3))


if __name__ == "__main__":
    main()
