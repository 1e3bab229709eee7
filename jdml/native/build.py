"""The native library: compiled on first use, loaded once per process, its FFI targets
registered for the CPU platform.

XLA's CPU convolutions are the slow part of a small convolutional network's train step on CPU
(``bench/bench_train.py --layers``): on the glyph network's layers, oneDNN's convolutions, called
from inside the jitted step as XLA FFI custom calls (``dnnl_conv.cc``), compute the forward pass,
the input gradient and the kernel gradient 1.2-1.8x faster (the glyph train step 1.5-1.7x);
with ``groups`` equal to the channels they are EfficientNet's depthwise convolutions, whose
kernel gradient comes from ``depthwise.cc`` instead (``jdml.nn.depthwise``).
The assignment pass of k-means (``kmeans.cc``: nearest centroids through oneDNN's sgemm, and for
few clusters whole Lloyd iterations) replaces XLA's matmul, reductions and scatter-add in the
evaluator's k-means (``bench/bench_kmeans.py``), and
the nearest-neighbour selection (``knn.cc``: top-k over sgemm tiles filtered in cache) replaces
XLA's top-k and numpy's selection in the retrieval metrics (``bench/bench_eval.py``). Other
backends never use them.

:func:`jdml.throughput.model_flops` counts the convolution and matrix-product calls from their
operands and attributes, as the XLA operations they replace (so a step's count is the same with
or without them); the k-means and kNN calls count nothing there.

The library is compiled the first time a CPU step needs it, with the C++ compiler (``$CXX``,
default ``g++``) against the XLA FFI headers that jaxlib ships (``jax.ffi.include_dir()``) and
oneDNN (Debian: ``apt-get install g++ libdnnl-dev``), into
``$JDML_CACHE/native/jdml_native-<hash>.so``; the hash covers the sources, jaxlib's version and
the command, so a new jaxlib or source compiles again. Compiling writes a temporary file and renames
it, so concurrent processes never load half a library. Whether a switch uses it is
:mod:`jdml.native.switches`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from jdml.fileio import atomic_path, cache_root

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("dnnl_conv.cc", "depthwise.cc", "matmul.cc", "kmeans.cc", "knn.cc")
)
HEADERS = tuple(Path(__file__).with_name(name) for name in ("gemm.h", "pool.h"))
TARGETS = (
    "jdml_dnnl_conv_fwd",
    "jdml_dnnl_conv_bwd_data",
    "jdml_dnnl_conv_bwd_weights",
    "jdml_depthwise_bwd_weights",
    "jdml_dnnl_batched_matmul",
    "jdml_dnnl_matmul",
    "jdml_kmeans_assign",
    "jdml_kmeans_assign_bounded",
    "jdml_kmeans_centre",
    "jdml_kmeans_lloyd",
    "jdml_kmeans_mean",
    "jdml_kmeans_reference_lloyd",
    "jdml_kmeans_sums",
    "jdml_knn_bias",
    "jdml_knn_search",
    "jdml_knn_top",
    "jdml_order_rows",
)


class NativeBuildError(RuntimeError):
    """The native library could not be compiled or loaded; the message says why."""


def _command(output: str) -> list[str]:
    """The compiler command that builds the library of ``SOURCES`` into ``output``."""
    return [
        os.environ.get("CXX", "g++"),
        "-O3",
        "-ffp-contract=off",  # no fused multiply-adds: the k-means distances round as XLA's
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-fopenmp",
        f"-I{jax.ffi.include_dir()}",
        *map(str, SOURCES),
        "-o",
        output,
        "-ldnnl",
    ]


def library_path() -> Path:
    """Where the compiled library of these sources, jaxlib and command lives."""
    digest = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    digest.update(jax.lib.__version__.encode() if hasattr(jax.lib, "__version__") else b"")
    digest.update(jax.__version__.encode())
    digest.update(" ".join(_command("OUT")).encode())
    return cache_root("native") / f"jdml_native-{digest.hexdigest()[:16]}.so"


def _compile(path: Path) -> None:
    """Compiles the library into ``path`` (through a temporary file renamed into place).
    Raises ``NativeBuildError`` naming the first compiler error."""
    compiler = _command("")[0]
    if shutil.which(compiler) is None:
        raise NativeBuildError(f"no C++ compiler {compiler!r} on PATH")
    with atomic_path(path, ".so") as tmp:
        done = subprocess.run(_command(tmp), capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if "error" in line]
            first = (lines or done.stderr.splitlines() or ["no output"])[0].strip()
            names = ", ".join(source.name for source in SOURCES)
            raise NativeBuildError(f"compiling {names} failed: {first[:300]}")


@functools.cache
def library() -> ctypes.CDLL:
    """The compiled library with its FFI targets registered for the CPU platform (once per
    process); compiles it first if needed. Raises ``NativeBuildError``."""
    path = library_path()
    if not path.is_file():
        _compile(path)
    try:
        lib = ctypes.cdll.LoadLibrary(str(path))
    except OSError as err:
        raise NativeBuildError(f"loading {path} failed: {err}") from None
    for name in TARGETS:
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    return lib


def ffi_call(target: str, results: Any, *, vmap_method: str | None = None) -> Callable[..., Any]:
    """``jax.ffi.ffi_call`` of the library's FFI ``target`` with ``results`` (a
    ``jax.ShapeDtypeStruct`` or a tuple of them), the library loaded first so that the target
    is registered (compiled once per machine). Raises ``NativeBuildError``."""
    library()
    return jax.ffi.ffi_call(target, results, vmap_method=vmap_method)
