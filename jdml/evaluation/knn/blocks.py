"""How the exact kNN search cuts its work into blocks, whatever selects the k nearest.

For N references the full Q x N score matrix does not fit in memory for large N, so the search
is blocked twice:

* over queries: the queries are cut into blocks of a fixed ``block_size`` rows (the last block
  is zero-padded) and one jitted block function is called per block, so it compiles once for a
  given (block size, reference set shape, k);
* over references: inside a block the references are cut into chunks of at most
  ``chunk_size`` rows; each chunk's top-k is merged into a running top-k, so the memory of a
  block is O(block_size * chunk_size), independent of N.

The sizes below are read when a search starts (tests and benchmarks set them on this module).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

import jax
import numpy as np

from jdml.platform import platform

DISTANCES = ("euclidean", "cosine")
DEFAULT_BLOCK_SIZE = 512
# References scored at once within a query block (``chunk_size=None``: the backend's value). On
# CPU 16,384 (with 512-query blocks: 32 MB of float32 scores per block). On an accelerator
# 131,072: up to that many references are one product and one top-k per block, with no running
# merge over chunks (on an H200 at SOP's size, 60,502 x 128, with 2^28-score blocks: 0.057 s
# warm for recall@1-8 and MAP@R against 0.060 s in chunks of 16,384; bench/bench_gpu.py
# --sections sweep).
DEFAULT_CHUNK_SIZE = 16384
ACCELERATOR_CHUNK_SIZE = 2**17
# Query blocks grow beyond ``block_size`` while a block's scores against one chunk of references
# stay within this many (``block_scores``; None: the backend's value below). On CPU 2^22 (16 MB):
# at N = 1,000 every query is in one block, and the fixed cost of a call is paid once. On an
# accelerator 2^28 (1 GiB): a block's dispatch, top-k and host-side metrics cost about as much
# for 4,436 queries as for 512; on an H200 at SOP's size (60,502 x 128, one chunk) recall@1-8
# and MAP@R took 0.057 s warm against 0.214 s with 2^22 (bench/bench_gpu.py --sections sweep).
BLOCK_SCORES: int | None = None
CPU_BLOCK_SCORES = 2**22
ACCELERATOR_BLOCK_SCORES = 2**28
# Width of the groups of the two-stage top-k (see ``top_k``); chunks are multiples of it.
GROUP_SIZE = 16
INDEX_SENTINEL = np.iinfo(np.int32).max


_Block = TypeVar("_Block")


def dispatched_ahead(
    dispatch: Callable[[int], _Block], num_blocks: int
) -> Iterator[tuple[int, _Block]]:
    """Yields ``(b, dispatch(b))`` for every block ``b`` in order, dispatching block ``b + 1``
    before handing out block ``b``, so that the device computes the next block while the
    caller works on this one (JAX dispatch is asynchronous). At most two blocks are held here:
    the one handed out is dropped before the one after next is dispatched, provided the caller
    also drops its reference at the end of its loop body."""
    pending = dispatch(0)
    for b in range(num_blocks):
        current, pending = pending, None
        if b + 1 < num_blocks:
            pending = dispatch(b + 1)
        yield b, current
        del current


def resolve_chunk_size(chunk_size: int | None) -> int:
    """``chunk_size``, or for None the default backend's (``DEFAULT_CHUNK_SIZE`` on CPU,
    ``ACCELERATOR_CHUNK_SIZE`` elsewhere)."""
    if chunk_size is not None:
        return chunk_size
    return DEFAULT_CHUNK_SIZE if platform() == "cpu" else ACCELERATOR_CHUNK_SIZE


def block_scores() -> int:
    """The most scores of a query block against one chunk: ``BLOCK_SCORES`` if set, else the
    default backend's (``CPU_BLOCK_SCORES`` or ``ACCELERATOR_BLOCK_SCORES``)."""
    if BLOCK_SCORES is not None:
        return BLOCK_SCORES
    return CPU_BLOCK_SCORES if platform() == "cpu" else ACCELERATOR_BLOCK_SCORES


def query_block(num_queries: int, width: int, block_size: int) -> int:
    """Queries per block: ``block_size``, or more while a block has at most
    :func:`block_scores` scores against ``width`` references, and never more than the
    queries."""
    return max(1, min(num_queries, max(block_size, block_scores() // width)))


def chunk_layout(num_references: int, chunk_size: int) -> tuple[int, int]:
    """Splits N references into equal chunks of at most ``chunk_size`` rows.

    Args:
      num_references: number of reference rows N.
      chunk_size: largest allowed chunk.

    Returns:
      (number of chunks M, rows per chunk C) with M * C >= N. C is rounded up to a multiple of
      ``GROUP_SIZE`` (when that stays within ``chunk_size``), so padding is small.
    """
    num_chunks = max(1, math.ceil(num_references / chunk_size))
    rows = math.ceil(num_references / num_chunks)
    rounded = GROUP_SIZE * math.ceil(rows / GROUP_SIZE)
    return num_chunks, rounded if rounded <= chunk_size else rows


class NeighbourBlock(NamedTuple):
    """The k nearest references of consecutive queries (see
    :func:`~jdml.evaluation.knn.knn_blocks`).

    Attributes:
      first: index of the block's first query.
      distances: (B, k) float32 distances, ascending per row (a numpy array where the host
        selected them, else a JAX array).
      indices: (B, k) int32 reference indices; equal distances ordered by lower index.
    """

    first: int
    distances: jax.Array | np.ndarray
    indices: jax.Array | np.ndarray


def check_search(
    queries_shape: tuple[int, ...],
    references_shape: tuple[int, ...],
    k: int,
    exclude_self: bool,
    distance: str,
    block_size: int,
    chunk_size: int,
) -> None:
    """Raises ``ValueError`` unless the arguments of :func:`~jdml.evaluation.knn.knn` (given
    the shapes of the queries and references) describe a search."""
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {DISTANCES}")
    if (
        len(queries_shape) != 2
        or len(references_shape) != 2
        or queries_shape[1] != references_shape[1]
    ):
        raise ValueError(
            f"expected (Q, D) queries and (N, D) references, got {queries_shape} and "
            f"{references_shape}"
        )
    num_references = references_shape[0]
    if exclude_self and queries_shape[0] != num_references:
        raise ValueError("exclude_self needs the queries to be the references (same length)")
    available = num_references - int(exclude_self)
    if not 1 <= k <= available:
        raise ValueError(f"k={k} must be in [1, {available}] for {num_references} references")
    if block_size < 1 or chunk_size < 1:
        raise ValueError("block_size and chunk_size must be positive")
