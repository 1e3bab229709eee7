"""How the benchmarks time their contenders, and the device peak for their TFLOP/s columns.

Every benchmark times its contenders with :func:`alternating_rounds`: in the same process, in
turn, round after round, so that a change in the machine's load affects them alike.

The benchmarks run unchanged on CPU, GPU and TPU. Each prints the floating-point operations of
its jitted work (XLA's own count, :func:`compiled_flops`), the achieved TFLOP/s, and their
fraction of the device's peak: the data-sheet dense peak for a known accelerator
(:data:`PEAK_TFLOPS`), or else a peak measured here with a large jitted matmul
(:func:`measured_matmul_tflops`), which is what a CPU gets.
"""

from __future__ import annotations

import collections
import functools
import gc
import glob
import gzip
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp

from jdml.nn import native

# Dense (no sparsity) peak TFLOP/s per chip from the vendors' data sheets, by the start of
# ``jax.Device.device_kind``: (float32 without tensor cores, bfloat16 on the matrix units).
# TPUs have no float32 matrix unit: their float32 matmuls run in bfloat16 passes (one at JAX's
# default precision), so only the bfloat16 peak is listed. On Ampere and later GPUs a float32
# matmul may use TF32 tensor cores and exceed the float32 figure.
PEAK_TFLOPS: dict[str, tuple[float | None, float]] = {
    "NVIDIA H100": (67.0, 989.0),
    "NVIDIA A100": (19.5, 312.0),
    "NVIDIA L4": (30.3, 121.0),
    "NVIDIA A10": (31.2, 125.0),
    "TPU v6 lite": (None, 918.0),
    "TPU v5p": (None, 459.0),
    "TPU v5 lite": (None, 197.0),
    "TPU v5e": (None, 197.0),
    "TPU v4": (None, 275.0),
}


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


def compiled_flops(fn: Callable[..., Any], *args: Any) -> float | None:
    """XLA's count of the floating-point operations of one call of jitted ``fn`` on ``args``.

    Args:
      fn: a jitted function (``jax.jit`` result).
      args: example arguments (only their shapes and dtypes matter; nothing runs).

    Returns:
      The flops of the compiled program, or None where the backend gives no cost analysis.
      XLA counts nothing for custom calls: the oneDNN convolutions' flops are added from the
      program's text (``jdml.nn.native.conv_flops``).
    """
    compiled = fn.lower(*args).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):  # older JAX: one dict per program
        analysis = analysis[0] if analysis else None
    flops = (analysis or {}).get("flops")
    if flops is None:
        return None
    flops += native.conv_flops(compiled.as_text())  # XLA counts custom calls as -1
    return float(flops) if flops > 0 else None


@functools.cache
def measured_matmul_tflops(dtype: str = "float32", size: int = 2048, repeats: int = 5) -> float:
    """TFLOP/s of a jitted (size x size) @ (size x size) matmul on the default device, best of
    ``repeats`` after a warm-up: the practical peak where no data-sheet figure applies."""
    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda x: x @ x)
    jax.block_until_ready(matmul(a))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(matmul(a))
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12


def device_peak(dtype: str = "float32") -> tuple[float, str]:
    """The peak TFLOP/s of the default device for ``dtype`` matmuls, and where it comes from.

    Args:
      dtype: the compute dtype, "float32" or "bfloat16".

    Returns:
      (TFLOP/s, a short description: the device kind and "data sheet", or "measured matmul").
    """
    kind = jax.devices()[0].device_kind
    for prefix, (float32, bfloat16) in PEAK_TFLOPS.items():
        if kind.startswith(prefix):
            peak = bfloat16 if dtype == "bfloat16" or float32 is None else float32
            return peak, f"{kind}, {dtype} data-sheet peak"
    return measured_matmul_tflops(dtype), f"{kind}, measured {dtype} 2048^3 matmul"


def throughput_line(name: str, flops: float | None, seconds: float, dtype: str) -> str:
    """One printed line: the achieved TFLOP/s of ``flops`` in ``seconds`` and the fraction of
    the device's peak (or why there is none)."""
    if flops is None:
        return f"{name}: no flop count from this backend"
    peak, source = device_peak(dtype)
    achieved = flops / seconds / 1e12
    return (
        f"{name}: {flops / 1e9:.2f} GFLOP in {1e3 * seconds:.1f} ms = {achieved:.3f} TFLOP/s, "
        f"{100 * achieved / peak:.1f}% of {peak:.3f} TFLOP/s ({source})"
    )


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
