"""Checks of the arrays a caller passes to a loss or a miner (the own-loop API,
docs/own_loop.md, "Losses and miners in your own loop").

Shapes and dtypes are known when a function is traced, so they are checked then, under ``jit``
as well as eagerly, at no cost to the compiled step: a wrong rank, dtype or batch size is one
Python error naming the argument, the shape expected and the shape given, instead of an error
from deep inside the loss. Values are data: labels and mined tuples are checked in Python where
they are concrete (eager calls, such as ``loss.init``). Inside a jitted function an out-of-range
label of a loss with a parameter per class, or a valid tuple indexing a row outside the batch
(tuples mined on another batch), is never clamped silently: the loss's embeddings become NaN
(:func:`poison_unless_inside`), so its value and the gradients into the network are NaN, which
the trainer's non-finite guard (or any ``isfinite`` check in the caller's loop) reports; under
``jax.experimental.checkify.checkify`` it is also a reported error (``checkify.debug_check``,
which costs nothing otherwise).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


def _describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None or dtype is None:
        return f"a {type(x).__name__}"
    return f"shape {tuple(shape)} {dtype}"


def check_batch(owner: str, embeddings: Any, labels: Any) -> None:
    """Refuses anything but ``embeddings`` of shape (B, D) floating point and ``labels`` of shape
    (B,) integer.

    Args:
      owner: how to name the caller in the message, e.g. ``"loss 'margin'"``.
      embeddings: the batch's embeddings.
      labels: the batch's class labels.

    Raises:
      TypeError: for arrays that are not arrays, or of the wrong dtype.
      ValueError: for arrays of the wrong rank or batch size.
    """
    shape = getattr(embeddings, "shape", None)
    if shape is None or not hasattr(embeddings, "dtype"):
        raise TypeError(f"{owner}: embeddings must be a (B, D) array, got {_describe(embeddings)}")
    if len(shape) != 2:
        raise ValueError(
            f"{owner}: embeddings must have shape (B, D) (a batch of B vectors), got "
            f"{_describe(embeddings)}; reshape them to (B, D)"
        )
    if not jnp.issubdtype(embeddings.dtype, jnp.floating):
        raise TypeError(
            f"{owner}: embeddings must be floating point, got {_describe(embeddings)}; "
            "pass embeddings.astype(jnp.float32)"
        )
    batch = shape[0]
    if batch == 0:
        raise ValueError(f"{owner}: the batch is empty (embeddings {_describe(embeddings)})")
    if not hasattr(labels, "shape") or not hasattr(labels, "dtype"):
        raise TypeError(
            f"{owner}: labels must be a ({batch},) integer array, got {_describe(labels)}"
        )
    if tuple(labels.shape) != (batch,):
        raise ValueError(
            f"{owner}: labels must have shape ({batch},), one per embedding (embeddings "
            f"{_describe(embeddings)}), got {_describe(labels)}"
            + ("; pass labels.reshape(-1)" if labels.size == batch else "")
        )
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(
            f"{owner}: labels must be integer class ids, got {_describe(labels)}; pass "
            "labels.astype(jnp.int32)"
        )


def check_tuples(owner: str, tuples: Any, batch: int | None = None) -> None:
    """Refuses mined tuples whose fields are not 1-D arrays of one length (integer indices, a
    boolean ``valid``), and, where they are concrete, valid tuples indexing rows outside a
    batch of ``batch`` rows (tuples mined on another batch). ``tuples`` is a
    ``jdml.miners.Tuples``, or None for a loss that mines itself (that loss refuses None on its
    own where it needs tuples)."""
    if tuples is None:
        return
    fields = getattr(tuples, "_fields", None)
    if fields != ("anchors", "positives", "negatives", "valid"):
        raise TypeError(
            f"{owner}: tuples must be the jdml.miners.Tuples a miner returns (or None), got "
            f"{type(tuples).__name__}"
        )
    lengths = {getattr(getattr(tuples, f), "shape", None) for f in fields}
    if len(lengths) != 1 or len(next(iter(lengths)) or ()) != 1:
        shapes = ", ".join(f"{f} {_describe(getattr(tuples, f))}" for f in fields)
        raise ValueError(f"{owner}: the tuples' fields must be 1-D of one length, got {shapes}")
    for field in fields[:3]:
        if not jnp.issubdtype(getattr(tuples, field).dtype, jnp.integer):
            raise TypeError(f"{owner}: tuples.{field} must hold integer batch indices")
    if batch is None:
        return
    if _traced(tuples):
        index = _valid_indices(tuples)
        checkify.debug_check(
            _rows_inside(tuples, batch),
            f"{owner}: the tuples index rows {{low}} to {{high}}, but the batch has {batch} rows: "
            "mine the tuples on this batch (miner(key, embeddings, labels))",
            low=jnp.min(index),
            high=jnp.max(index),
        )
        return
    valid = np.asarray(tuples.valid, bool)
    index = np.stack([np.asarray(getattr(tuples, f)) for f in fields[:3]])[:, valid]
    if index.size and (index.min() < 0 or index.max() >= batch):
        raise ValueError(
            f"{owner}: the tuples index rows {index.min()} to {index.max()}, but the batch has "
            f"{batch} rows: mine the tuples on this batch (miner(key, embeddings, labels))"
        )


def check_class_labels(owner: str, labels: jax.Array, num_classes: int) -> None:
    """Refuses labels outside ``[0, num_classes)`` for a loss with a parameter per class: at once
    where the labels are concrete, under ``checkify.checkify`` where they are traced (see the
    module docstring). Without the check such a label would index a clamped parameter row."""
    if isinstance(labels, jax.core.Tracer):
        checkify.debug_check(
            jnp.all((labels >= 0) & (labels < num_classes)),
            f"{owner}: labels must be class ids in [0, {num_classes}) (num_classes="
            f"{num_classes}); got labels from {{low}} to {{high}}",
            low=jnp.min(labels),
            high=jnp.max(labels),
        )
        return
    values = np.asarray(labels)
    if values.size and (values.min() < 0 or values.max() >= num_classes):
        raise ValueError(
            f"{owner}: labels must be class ids in [0, {num_classes}) (num_classes="
            f"{num_classes}), got labels from {values.min()} to {values.max()}; map the "
            f"classes to 0..{num_classes - 1}, or raise num_classes"
        )


def _traced(tuples: Any) -> bool:
    return any(isinstance(field, jax.core.Tracer) for field in tuples)


def _rows_inside(tuples: Any, batch: int) -> jax.Array:
    """True where every valid tuple indexes rows of ``[0, batch)`` (invalid ones are not read)."""
    index = jnp.stack([tuples.anchors, tuples.positives, tuples.negatives])
    return jnp.all(~tuples.valid | jnp.all((index >= 0) & (index < batch), axis=0))


def _valid_indices(tuples: Any) -> jax.Array:
    """The valid tuples' indices, the invalid ones replaced by the first valid tuple's anchor
    (for the checkify message's lowest and highest row)."""
    index = jnp.stack([tuples.anchors, tuples.positives, tuples.negatives])
    fill = tuples.anchors[jnp.argmax(tuples.valid)]
    return jnp.where(tuples.valid, index, fill)


def poison_unless_inside(
    embeddings: jax.Array, labels: jax.Array, tuples: Any, num_classes: int | None
) -> jax.Array:
    """``embeddings`` unchanged if every traced label lies in ``[0, num_classes)`` (for a loss
    with a parameter per class, ``num_classes`` given) and every traced valid tuple indexes rows
    of this batch, else NaN (see the module docstring: a per-class parameter or a batch row is
    never read at a clamped index). Concrete labels and tuples were checked already."""
    inside = []
    if num_classes is not None and isinstance(labels, jax.core.Tracer):
        inside.append(jnp.all((labels >= 0) & (labels < num_classes)))
    if tuples is not None and _traced(tuples):
        inside.append(_rows_inside(tuples, embeddings.shape[0]))
    if not inside:
        return embeddings
    ok = inside[0] if len(inside) == 1 else jnp.logical_and(*inside)
    # Added, not selected: the NaN flows back into the gradients too (a select would zero them).
    return embeddings + jnp.where(ok, 0.0, jnp.nan).astype(embeddings.dtype)
