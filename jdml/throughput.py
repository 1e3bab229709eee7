"""How the benchmarks time their contenders, count their work, and the device peak for MFU.

Every benchmark times its contenders with :func:`alternating_rounds`: in the same process, in
turn, round after round, so that a change in the machine's load affects them alike.

The benchmarks run unchanged on CPU, GPU and TPU. Each prints the model FLOPs of its jitted work
(:func:`model_flops`), the achieved TFLOP/s, and the model FLOPs utilisation (MFU): their
fraction of the device's peak for the arithmetic the backend really uses (:func:`device_peak`):
the data-sheet dense peak for a known accelerator (:data:`PEAK_TFLOPS`), or else a peak measured
here with a large jitted matmul (:func:`measured_matmul_tflops`), which is what a CPU gets.

**What is counted.** 2 flops per multiply-add of every matrix product (``dot_general``, batch
dimensions included) and convolution (``conv_general_dilated``) in the program's jaxpr, the
standard MFU convention: elementwise work, reductions, normalisation and the optimiser count
nothing. A convolution counts its output elements x kernel taps x input channels per group,
padding taps included (as the usual per-layer figures, e.g. ResNet-50's 4.1 GMAC per image); the
taps that fall on the zeros an input dilation inserts (the input gradient of a strided
convolution, as JAX computes it) multiply nothing and are left out, so the gradient
convolutions of a layer whose input size the stride divides count exactly its forward pass
each, and a train step (forward, input and kernel gradients) about 3x the forward pass. The
oneDNN custom calls of the CPU backend (:mod:`jdml.native`) count as the XLA operations they
replace, so a step's count is the same with ``backends.conv=xla`` or without. The count is taken
from the traced program, before XLA compiles it: it is the same on every backend, which XLA's
own ``cost_analysis`` is not (on GPU it leaves out the convolutions that run as cuDNN calls).
Loops: a ``scan`` counts its body times its length; a ``while`` loop its body once (its trip
count is unknown before it runs; :attr:`FlopCount.loops` says how many there were); a ``cond``
its costliest branch. Recomputation under ``jax.checkpoint`` counts, as it runs.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import glob
import gzip
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from jax.extend import core


class Peak(NamedTuple):
    """The dense (no sparsity) peak TFLOP/s of one chip for each kind of matrix arithmetic.

    Attributes:
      fp32: float32 on the vector units (CUDA cores); None on TPUs, which have none for matmuls.
      tf32: float32 inputs on the tensor cores as TF32; None where there are none.
      bf16: bfloat16 (and float16) on the matrix units (tensor cores, MXUs).
      source: where the figures come from.
    """

    fp32: float | None
    tf32: float | None
    bf16: float
    source: str


# Peaks by the start of ``jax.Device.device_kind`` (the longest matching start wins). NVIDIA's
# data sheets give the tensor-core rates with 2:4 structured sparsity; the dense figure, listed
# here, is half of that. TPUs have no float32 matrix unit: their float32 matmuls run as bfloat16
# passes. :func:`device_peak` picks the column the backend really uses.
# Sources: nvidia.com/en-us/data-center/{h100,h200,a100,l4,products/a10-gpu} and the HGX page
# (nvidia.com/en-us/data-center/hgx) for B200; docs.cloud.google.com/tpu/docs/{v4,v5e,
# v5p-training,v6e}, "peak compute per chip (bf16)".
_H100 = "NVIDIA H100 data sheet"
_H200 = "NVIDIA H200 data sheet"
_TPU = "Cloud TPU {} documentation"
PEAK_TFLOPS: dict[str, Peak] = {
    # device_kind "NVIDIA H100 80GB HBM3" (SXM5): 67 FP32, TF32 989 / BF16 1,979 with sparsity.
    "NVIDIA H100": Peak(67.0, 494.7, 989.4, f"{_H100}, H100 SXM"),
    # 51 FP32, TF32 756 / BF16 1,513 with sparsity.
    "NVIDIA H100 PCIe": Peak(51.0, 378.0, 756.5, f"{_H100}, H100 PCIe"),
    # 60 FP32, TF32 835 / BF16 1,671 with sparsity.
    "NVIDIA H100 NVL": Peak(60.0, 417.5, 835.5, f"{_H100}, H100 NVL"),
    # The H100's chip with more memory: the rates of the H100 SXM and of the H100 NVL.
    "NVIDIA H200": Peak(67.0, 494.7, 989.4, f"{_H200}, H200 SXM"),
    "NVIDIA H200 NVL": Peak(60.0, 417.5, 835.5, f"{_H200}, H200 NVL"),
    # Per GPU of an HGX B200: 75 FP32, TF32 2.2 / BF16 4.5 PFLOPS with sparsity.
    "NVIDIA B200": Peak(75.0, 1100.0, 2250.0, "NVIDIA HGX B200 specifications"),
    # 19.5 FP32, TF32 156 / BF16 312 dense (312 / 624 with sparsity).
    "NVIDIA A100": Peak(19.5, 156.0, 312.0, "NVIDIA A100 data sheet"),
    # 30.3 FP32, TF32 120 / BF16 242 with sparsity.
    "NVIDIA L4": Peak(30.3, 60.0, 121.0, "NVIDIA L4 data sheet"),
    # 31.2 FP32, TF32 62.5 / BF16 125 dense (125 / 250 with sparsity).
    "NVIDIA A10": Peak(31.2, 62.5, 125.0, "NVIDIA A10 data sheet"),
    # device_kind "TPU v6 lite" is v6e (Trillium), "TPU v5 lite" v5e, "TPU v5" v5p.
    "TPU v6 lite": Peak(None, None, 918.0, _TPU.format("v6e")),
    "TPU v6e": Peak(None, None, 918.0, _TPU.format("v6e")),
    "TPU v5 lite": Peak(None, None, 197.0, _TPU.format("v5e")),
    "TPU v5e": Peak(None, None, 197.0, _TPU.format("v5e")),
    "TPU v5": Peak(None, None, 459.0, _TPU.format("v5p")),
    "TPU v5p": Peak(None, None, 459.0, _TPU.format("v5p")),
    "TPU v4": Peak(None, None, 275.0, _TPU.format("v4")),
}

# ``jax.lax.Precision`` names and aliases -> "default", "high" or "highest".
_PRECISIONS = {
    "default": "default",
    "fastest": "default",
    "bfloat16": "default",
    "high": "high",
    "bfloat16_3x": "high",
    "tensorfloat32": "high",
    "highest": "highest",
    "float32": "highest",
}
# bfloat16 passes of a float32 matmul on a TPU at each precision.
_TPU_PASSES = {"default": 1, "high": 3, "highest": 6}
_HALF_DTYPES = ("bfloat16", "float16")


class Timing(NamedTuple):
    """What :func:`alternating_rounds` measured for one contender.

    Attributes:
      first: seconds of the first warm-up call (compilation included).
      rounds: seconds per call, one figure per round.
      result: what the contender's last call returned.
    """

    first: float
    rounds: tuple[float, ...]
    result: Any

    @property
    def median(self) -> float:
        """The median seconds per call over the rounds."""
        return statistics.median(self.rounds)

    @property
    def best(self) -> float:
        """The least disturbed round's seconds per call."""
        return min(self.rounds)


_Name = TypeVar("_Name", bound=Hashable)


def alternating_rounds(
    contenders: Mapping[_Name, Callable[[], Any]],
    repeats: int,
    *,
    calls: int = 1,
    warmup: int = 1,
    pause: float = 0.0,
    settle: int = 0,
) -> dict[_Name, Timing]:
    """Times several contenders in turn, in the same process.

    Each contender first runs ``warmup`` times (compilation, caches). Then come ``repeats``
    rounds; in each, every contender in turn waits ``pause`` seconds idle (so that the thread
    pools of the one before, e.g. OpenMP threads that spin after their work, are quiet) and
    runs ``calls`` times in a row. Every call's result is waited for with
    ``jax.block_until_ready``, so asynchronous dispatch does not hide work.

    Python's garbage collector is run before each contender's calls and is off while they are
    timed (as ``timeit`` does): otherwise a collection of the whole heap, set off by whichever
    call happens to allocate past the threshold, charges one contender for the others' garbage
    (several milliseconds with jax, faiss and scikit-learn loaded).

    Args:
      contenders: name (any hashable key) -> the work to time (no arguments).
      repeats: number of timed rounds, at least 1.
      calls: calls per contender and round; a round's figure is their mean.
      warmup: untimed calls before the rounds, at least 1.
      pause: seconds of idle time before each contender's calls in a round.
      settle: untimed calls right before each contender's timed calls in a round, after the
        pause: the timed calls then run warm (cores awake, caches and thread pools ready), as
        in a loop, with the other contenders' threads quiet.

    Returns:
      name -> :class:`Timing`, in the order of ``contenders``.
    """
    if repeats < 1 or calls < 1 or warmup < 1:
        raise ValueError("repeats, calls and warmup must be at least 1")
    first: dict[_Name, float] = {}
    results: dict[_Name, Any] = {}
    for name, fn in contenders.items():
        start = time.perf_counter()
        results[name] = jax.block_until_ready(fn())
        first[name] = time.perf_counter() - start
        for _ in range(warmup - 1):
            results[name] = jax.block_until_ready(fn())
    rounds: dict[_Name, list[float]] = {name: [] for name in contenders}
    collecting = gc.isenabled()
    try:
        for _ in range(repeats):
            for name, fn in contenders.items():
                gc.collect()
                gc.disable()
                if pause > 0:
                    time.sleep(pause)
                for _ in range(settle):
                    jax.block_until_ready(fn())
                start = time.perf_counter()
                for _ in range(calls):
                    results[name] = jax.block_until_ready(fn())
                rounds[name].append((time.perf_counter() - start) / calls)
                if collecting:
                    gc.enable()
    finally:
        if collecting:
            gc.enable()
    return {name: Timing(first[name], tuple(rounds[name]), results[name]) for name in contenders}


class FlopCount(NamedTuple):
    """The model FLOPs of one call of a function (see the module docstring for what counts).

    Attributes:
      flops: 2 x the multiply-adds of its matrix products and convolutions.
      loops: ``while`` loops in it, each body counted once (their trip count is unknown).
      uncounted: targets of custom calls whose work is unknown here (counted as 0).
    """

    flops: float
    loops: int = 0
    uncounted: tuple[str, ...] = ()

    @property
    def note(self) -> str:
        """What the count leaves out, in words ("" when nothing)."""
        notes = []
        if self.loops:
            notes.append(f"{self.loops} while-loop bodies counted once")
        if self.uncounted:
            notes.append(f"custom calls not counted: {', '.join(self.uncounted)}")
        return "; ".join(notes)


@dataclasses.dataclass
class _Tally:
    """What a walk over a jaxpr met besides flops."""

    loops: int = 0
    uncounted: set[str] = dataclasses.field(default_factory=set)


def model_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FlopCount:
    """The model FLOPs of one call of ``fn`` on ``args``, from its jaxpr (nothing runs).

    Args:
      fn: a function of arrays, jitted or not.
      args: example arguments: arrays or ``jax.ShapeDtypeStruct`` (only shapes and dtypes
        matter).
      kwargs: example keyword arguments.

    Returns:
      The count of its matrix products and convolutions, the same on every backend (see the
      module docstring). Work whose results are unused is left out, as XLA removes it.
    """
    closed = jax.make_jaxpr(fn)(*args, **kwargs)
    return jaxpr_flops(_live(closed.jaxpr))


def jaxpr_flops(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> FlopCount:
    """The model FLOPs of a jaxpr and every jaxpr inside it (see the module docstring)."""
    tally = _Tally()
    flops = _walk(jaxpr.jaxpr if isinstance(jaxpr, core.ClosedJaxpr) else jaxpr, tally)
    return FlopCount(flops, tally.loops, tuple(sorted(tally.uncounted)))


def _live(jaxpr: core.Jaxpr) -> core.Jaxpr:
    """``jaxpr`` without the equations whose results nothing uses (JAX's own dead-code
    elimination, from a private module: where it is missing, nothing is removed)."""
    try:
        from jax._src.interpreters import partial_eval

        return partial_eval.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))[0]
    except (ImportError, AttributeError, TypeError):
        return jaxpr


def _walk(jaxpr: core.Jaxpr, tally: _Tally) -> float:
    """The flops of the equations of ``jaxpr``, sub-jaxprs included."""
    return sum((_eqn_flops(eqn, tally) for eqn in jaxpr.eqns), 0.0)


def _eqn_flops(eqn: core.JaxprEqn, tally: _Tally) -> float:
    """The flops of one equation: a matrix product, a convolution, a native custom call, or
    the jaxprs it calls (loops and branches as the module docstring says)."""
    name, params = eqn.primitive.name, eqn.params
    if name == "dot_general":
        return 2.0 * _dot_macs(eqn)
    if name == "conv_general_dilated":
        return 2.0 * _conv_macs(eqn)
    if name == "ffi_call":
        return 2.0 * _ffi_macs(eqn, tally)
    if name == "scan":
        return params["length"] * _walk(params["jaxpr"].jaxpr, tally)
    if name == "while":
        tally.loops += 1
        return _walk(params["cond_jaxpr"].jaxpr, tally) + _walk(params["body_jaxpr"].jaxpr, tally)
    if name == "cond":
        return max(_walk(branch.jaxpr, tally) for branch in params["branches"])
    return _copies(eqn) * sum((_walk(sub, tally) for sub in _sub_jaxprs(params.values())), 0.0)


def _sub_jaxprs(values: Iterator[Any] | Sequence[Any]) -> Iterator[core.Jaxpr]:
    """The jaxprs among an equation's parameters (jit, custom_jvp/vjp, remat, shard_map, ...);
    the rules of a custom derivative are functions, not jaxprs, and are not visited: under
    ``jax.grad`` what they compute is already traced into ordinary equations."""
    for value in values:
        if isinstance(value, core.ClosedJaxpr):
            yield value.jaxpr
        elif isinstance(value, core.Jaxpr):
            yield value
        elif isinstance(value, tuple | list):
            yield from _sub_jaxprs(value)


def _copies(eqn: core.JaxprEqn) -> int:
    """How many times the body of a per-device map runs: the devices of ``shard_map``'s
    manual mesh axes (its body sees one shard) or ``pmap``'s axis; 1 for other equations."""
    params = eqn.params
    if eqn.primitive.name == "xla_pmap":
        return int(params["axis_size"])
    if eqn.primitive.name != "shard_map":
        return 1
    sizes = dict(params["mesh"].shape)
    if "newly_manual_axes" in params:
        manual = params["newly_manual_axes"]
    elif "manual_axes" in params:
        manual = params["manual_axes"]
    else:
        manual = set(sizes) - set(params.get("auto", ()))
    return math.prod(sizes[axis] for axis in manual)


def _shape(var: Any) -> tuple[int, ...]:
    """The shape of a jaxpr variable or literal."""
    return tuple(var.aval.shape)


def _dot_macs(eqn: core.JaxprEqn) -> int:
    """Multiply-adds of a ``dot_general``: every output element (batch dimensions included)
    sums over the contracting dimensions."""
    (contracting, _), _ = eqn.params["dimension_numbers"]
    lhs = _shape(eqn.invars[0])
    return math.prod(_shape(eqn.outvars[0])) * math.prod(lhs[d] for d in contracting)


def window_taps(
    out: int, window: int, stride: int = 1, lhs_dilation: int = 1, rhs_dilation: int = 1,
    pad_low: int = 0,
) -> int:  # fmt: skip
    """(output position, kernel tap) pairs along one spatial axis of a convolution that multiply
    an input element: all ``out * window``, less those that land on the ``lhs_dilation - 1``
    zeros inserted between input elements (padding taps count).

    Args:
      out: output size along the axis.
      window: kernel size along the axis.
      stride: window stride.
      lhs_dilation: input dilation (the stride of the convolution whose input gradient this is).
      rhs_dilation: kernel dilation (its holes are skipped, not multiplied).
      pad_low: padding before the (dilated) input.
    """
    if lhs_dilation == 1:
        return out * window
    # Tap t of output i reads dilated position i * stride + t * rhs_dilation - pad_low, an input
    # element where that is a multiple of lhs_dilation; the pattern repeats every `period`.
    period = lhs_dilation // math.gcd(stride, lhs_dilation)
    full, rest = divmod(out, period)
    total = 0
    for t in range(window):
        offset = t * rhs_dilation - pad_low
        hits = [(i * stride + offset) % lhs_dilation == 0 for i in range(period)]
        total += full * sum(hits) + sum(hits[:rest])
    return total


def _conv_macs(eqn: core.JaxprEqn) -> int:
    """Multiply-adds of a ``conv_general_dilated``: output batch x output features x the taps
    of every spatial axis (:func:`window_taps`) x the kernel's input features (per group; with a
    ``batch_group_count``, as in the kernel gradient of a grouped convolution, each output
    reads one group of the batch, which the shapes already say)."""
    p = eqn.params
    _, rhs_spec, out_spec = p["dimension_numbers"]
    rhs, out = _shape(eqn.invars[1]), _shape(eqn.outvars[0])
    spatial = len(out_spec) - 2
    lhs_dilation = p.get("lhs_dilation") or (1,) * spatial
    rhs_dilation = p.get("rhs_dilation") or (1,) * spatial
    taps = math.prod(
        window_taps(
            out[out_spec[2 + d]], rhs[rhs_spec[2 + d]], p["window_strides"][d],
            lhs_dilation[d], rhs_dilation[d], p["padding"][d][0],
        )
        for d in range(spatial)
    )  # fmt: skip
    return out[out_spec[0]] * out[out_spec[1]] * taps * rhs[rhs_spec[1]]


# The native custom calls counted, their operands: matmul (a, b) -> op(a) @ op(b), batched over a
# leading axis or not; convolution
# forward (x, kernel) -> y, input gradient (dy, kernel) -> dx, kernel gradients (x, dy) -> dk;
# NHWC maps, HWIO kernels.
_NATIVE_TARGETS = (
    "jdml_dnnl_matmul",
    "jdml_dnnl_batched_matmul",
    "jdml_dnnl_conv_fwd",
    "jdml_dnnl_conv_bwd_data",
    "jdml_dnnl_conv_bwd_weights",
    "jdml_depthwise_bwd_weights",
)


def _ffi_macs(eqn: core.JaxprEqn, tally: _Tally) -> int:
    """Multiply-adds of a native custom call (:mod:`jdml.native`), counted as the XLA
    operation it replaces (a convolution's gradients as JAX's transposed convolutions); other
    targets count 0 and are named in the tally."""
    target = eqn.params["target_name"]
    if target not in _NATIVE_TARGETS:
        tally.uncounted.add(target)
        return 0
    attrs = dict(eqn.params.get("attributes") or ())
    a, b = (_shape(v) for v in eqn.invars[:2])
    result = _shape(eqn.outvars[0])
    if target in ("jdml_dnnl_matmul", "jdml_dnnl_batched_matmul"):
        summed = a[-2] if attrs["trans_a"] else a[-1]
        return math.prod(result) * summed
    if target == "jdml_dnnl_conv_fwd":
        stride, top, left = (int(attrs[k]) for k in ("stride", "pad_top", "pad_left"))
        taps = window_taps(result[1], b[0], stride, pad_low=top)
        taps *= window_taps(result[2], b[1], stride, pad_low=left)
        return result[0] * result[3] * taps * b[2]
    if target == "jdml_dnnl_conv_bwd_data":
        stride, top, left = (int(attrs[k]) for k in ("stride", "pad_top", "pad_left"))
        # JAX's input gradient: the kernel over dy dilated by the stride, padded k - 1 - pad.
        taps = window_taps(result[1], b[0], 1, stride, pad_low=b[0] - 1 - top)
        taps *= window_taps(result[2], b[1], 1, stride, pad_low=b[1] - 1 - left)
        return result[0] * result[3] * taps * (b[3] // int(attrs["groups"]))
    # The kernel gradients: each kernel entry sums over dy's pixels.
    return math.prod(result) * math.prod(b[:3])


@functools.cache
def measured_matmul_tflops(
    dtype: str = "float32", size: int = 2048, repeats: int = 5, precision: str = "default"
) -> float:
    """TFLOP/s of a jitted (size x size) @ (size x size) matmul on the default device at
    ``precision``, best of ``repeats`` after a warm-up: the practical peak where no data-sheet
    figure applies."""
    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda x: jnp.matmul(x, x, precision=precision))
    jax.block_until_ready(matmul(a))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(matmul(a))
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12


def peak_entry(kind: str) -> Peak | None:
    """The :data:`PEAK_TFLOPS` entry of a ``device_kind`` (the longest matching start), or
    None for a device not listed."""
    starts = [start for start in PEAK_TFLOPS if kind.startswith(start)]
    return PEAK_TFLOPS[max(starts, key=len)] if starts else None


def _precision(precision: str | jax.lax.Precision) -> str:
    """ "default", "high" or "highest" for a ``jax.lax.Precision`` or one of its names; the
    default is ``jax_default_matmul_precision`` where that is set."""
    name = getattr(precision, "name", str(precision)).lower()
    if name == "default" and jax.config.jax_default_matmul_precision is not None:
        name = str(jax.config.jax_default_matmul_precision).lower()
    if name not in _PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {sorted(_PRECISIONS)}")
    return _PRECISIONS[name]


def peak_rate(peak: Peak, dtype: str, precision: str = "default") -> tuple[float, str]:
    """The TFLOP/s of ``peak`` that ``dtype`` matmuls at ``precision`` run at, and its name.

    bfloat16 and float16 use the matrix units' rate. float32: on NVIDIA GPUs, XLA runs it on the
    tensor cores as TF32 at the default (and high) precision, on the CUDA cores at the highest;
    on TPUs it is 1, 3 or 6 bfloat16 passes at the default, high or highest precision.

    Raises:
      ValueError: for another dtype or an unknown precision.
    """
    level = _precision(precision)
    if dtype in _HALF_DTYPES:
        return peak.bf16, f"dense {dtype} matrix-unit peak"
    if dtype != "float32":
        raise ValueError(f"no peak for dtype {dtype!r}; use float32, bfloat16 or float16")
    if peak.fp32 is None:
        passes = _TPU_PASSES[level]
        return peak.bf16 / passes, f"bfloat16 peak / {passes}: float32 at {level} precision"
    if level != "highest" and peak.tf32 is not None:
        return peak.tf32, f"dense TF32 tensor-core peak: float32 at {level} precision"
    return peak.fp32, f"float32 peak without tensor cores: float32 at {level} precision"


def device_peak(dtype: str = "float32", precision: str = "default") -> tuple[float, str]:
    """The peak TFLOP/s of the default device for ``dtype`` matmuls at ``precision``, and
    where it comes from.

    Args:
      dtype: the compute dtype: "float32", "bfloat16" or "float16".
      precision: the matmuls' ``jax.lax.Precision`` (name): "default" (what the benchmarks
        use), "high" or "highest".

    Returns:
      (TFLOP/s, a short description: the device kind, the rate :func:`peak_rate` chose and its
      data sheet, or "measured matmul" for a device not in :data:`PEAK_TFLOPS`).
    """
    kind = jax.devices()[0].device_kind
    peak = peak_entry(kind)
    if peak is None:
        tflops = measured_matmul_tflops(dtype, precision=_precision(precision))
        return tflops, f"{kind}, measured {dtype} 2048^3 matmul"
    tflops, rate = peak_rate(peak, dtype, precision)
    return tflops, f"{kind}, {rate}; {peak.source}"


def throughput_line(
    name: str, flops: FlopCount | float, seconds: float, dtype: str,
    precision: str = "default", devices: int = 1,
) -> str:  # fmt: skip
    """One printed line: the model FLOPs (matrix products and convolutions), the achieved
    TFLOP/s in ``seconds`` and the MFU, their fraction of the peak of ``devices`` devices
    (:func:`device_peak`)."""
    count = flops if isinstance(flops, FlopCount) else FlopCount(float(flops))
    peak, source = device_peak(dtype, precision)
    achieved = count.flops / seconds / 1e12
    mfu = achieved / (peak * devices)
    on = f"{devices} x " if devices > 1 else ""
    line = (
        f"{name}: {count.flops / 1e9:.2f} GFLOP (matrix products and convolutions) in "
        f"{1e3 * seconds:.1f} ms = {achieved:.3f} TFLOP/s, MFU {100 * mfu:.1f}% "
        f"of {on}{peak:.3f} TFLOP/s ({source})"
    )
    return f"{line}; {count.note}" if count.note else line


# Profiler events that are the runtime's own bookkeeping, not an XLA op.
HOST_EVENTS = ("$", "Thunk", "Pjit", "Slinky", "CommonPjRt", "ParseArguments")


def op_times(fn: Callable[[], Any], steps: int) -> collections.Counter[str]:
    """Milliseconds per call of ``fn`` spent in each kind of XLA op, from a ``jax.profiler``
    trace of ``steps`` calls (after two warm-up calls). A kind is an op's name without its
    number (every ``fusion.N`` is ``fusion``); ops that overlap on several threads each count,
    so the total can exceed the wall time."""
    fn(), fn()
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(steps):
                jax.block_until_ready(fn())
        (path,) = glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    kinds: collections.Counter[str] = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or "dur" not in e or name.startswith(HOST_EVENTS):
            continue
        kinds[name.split(".")[0]] += e["dur"] / 1e3 / steps
    return kinds
