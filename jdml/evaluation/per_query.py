"""Per-query values of an evaluation, kept compressed in its JSON record.

A test Recall@1 is the mean of one hit (1) or miss (0) per query. Keeping those hits, with
each query's class, lets a reader count the test classes as a source of variance (a bootstrap
over classes as well as seeds, :func:`jdml.statistics.two_way_bootstrap`) without the
checkpoint. ``eval.per_query`` names the metrics whose per-query values the selected
checkpoint's evaluation keeps (``eval_best_step<step>.json``'s ``per_query``).

Each array is stored as float32 (classes as int32), zlib-compressed and base64-encoded: the
Recall@1 hits of the 25,417 glyph test queries take 3.6 KB of text, their classes 0.8 KB.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Mapping

import numpy as np

PREFIX = "per_query:"  # the key prefix of per-query vectors among an evaluation's vectors
CLASSES = "classes"  # the key of the queries' classes in a stored block
MAIN = "main"  # the key of the main head's name (the one that selects the checkpoint)


def vector_key(embedding: str, metric: str) -> str:
    """The vectors key of ``metric``'s per-query values of ``embedding`` (a head or a
    concatenation)."""
    return f"{PREFIX}{embedding}:{metric}"


def classes_key() -> str:
    """The vectors key of the queries' classes."""
    return f"{PREFIX}{CLASSES}"


def encode(values: np.ndarray) -> str:
    """A 1-D array as text: float32 (int32 for integers), zlib-compressed, base64."""
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"per-query values must be 1-D, got shape {values.shape}")
    kind = "i4" if np.issubdtype(values.dtype, np.integer) else "f4"
    raw = np.ascontiguousarray(values.astype("<" + kind)).tobytes()
    return kind + ":" + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def decode(text: str) -> np.ndarray:
    """The array :func:`encode` wrote (read as data: nothing in it is executed)."""
    if not isinstance(text, str) or text[:3] not in ("f4:", "i4:"):
        raise ValueError("not an encoded per-query array (expected 'f4:' or 'i4:' then base64)")
    try:
        raw = zlib.decompress(base64.b64decode(text[3:], validate=True))
    except (ValueError, zlib.error) as e:
        raise ValueError(f"corrupt per-query array: {e}") from None
    dtype = np.dtype("<" + text[:2])
    if len(raw) % dtype.itemsize:
        raise ValueError("corrupt per-query array: its length is not a whole number of values")
    return np.frombuffer(raw, dtype).copy()


def pack(vectors: Mapping[str, np.ndarray], main: str) -> dict[str, object]:
    """The per-query block of one split's record from its vectors: ``{"classes": text,
    "main": main, embedding: {metric: text}}`` (``main``: the main head's name), or {} when
    the vectors hold none."""
    block: dict[str, object] = {}
    for key, values in vectors.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX) :]
        if name == CLASSES:
            block[CLASSES] = encode(values)
            continue
        embedding, metric = name.rsplit(":", 1)
        block.setdefault(embedding, {})[metric] = encode(values)  # type: ignore[index]
    if block:
        block[MAIN] = main
    return block


def unpack(block: Mapping[str, object]) -> tuple[np.ndarray, dict[str, dict[str, np.ndarray]]]:
    """The queries' classes and ``{embedding: {metric: (Q,) values}}`` of a stored block.

    Raises:
      ValueError: the block lacks the classes, or an array is corrupt or of another length.
    """
    if CLASSES not in block:
        raise ValueError("the per-query block has no 'classes'")
    classes = decode(block[CLASSES])  # type: ignore[arg-type]
    out: dict[str, dict[str, np.ndarray]] = {}
    for embedding, metrics in block.items():
        if embedding in (CLASSES, MAIN):
            continue
        if not isinstance(metrics, Mapping):
            raise ValueError(f"the per-query block's {embedding!r} is not a mapping of metrics")
        for metric, text in metrics.items():
            values = decode(text)
            if len(values) != len(classes):
                raise ValueError(
                    f"per-query {metric} of {embedding!r} has {len(values)} values for "
                    f"{len(classes)} queries"
                )
            out.setdefault(embedding, {})[metric] = values
    return classes, out


def paired_differences(
    a: Mapping[int, Mapping[str, object]],
    b: Mapping[int, Mapping[str, object]],
    embeddings: tuple[str | None, str | None],
    metric: str = "recall@1",
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The per-query differences of two rows over their common seeds, for
    :func:`jdml.statistics.two_way_bootstrap`.

    Args:
      a, b: {seed: stored per-query block of the test split} of each row.
      embeddings: the evaluated embedding of each row (a head, or a concatenation's name;
        None: the row's main head).
      metric: the per-query metric.

    Returns:
      ((S, Q) row a's value minus row b's per query, (Q,) the queries' classes, the S seeds).

    Raises:
      ValueError: no common seed; a block lacks the embedding or metric; or the blocks'
        queries differ (another test split, or another order).
    """
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("the two rows have no seed with per-query values in common")
    rows, classes = [], None
    for seed in seeds:
        values = []
        for block, embedding in ((a[seed], embeddings[0]), (b[seed], embeddings[1])):
            ids, found = unpack(block)
            embedding = embedding or str(block.get(MAIN))
            if classes is None:
                classes = ids
            elif not np.array_equal(ids, classes):
                raise ValueError(
                    f"seed {seed}: the per-query values are of other test queries than seed "
                    f"{seeds[0]}'s; compare runs evaluated on the same test split"
                )
            if metric not in found.get(embedding, {}):
                raise ValueError(
                    f"seed {seed}: no per-query {metric} of {embedding!r} (kept: "
                    f"{ {e: sorted(m) for e, m in found.items()} })"
                )
            values.append(found[embedding][metric])
        rows.append(values[0].astype(np.float64) - values[1])
    return np.stack(rows), classes, seeds  # type: ignore[return-value]
