"""Records every registered loss's value, metrics and gradients on one fixed batch, bit for bit.

The record (``tests/golden/losses/bitwise.npz``) guards refactors of the losses' shared code:
``tests/losses/test_loss_golden.py`` recomputes each loss on the same batch, with the same
tuples and parameters, and requires every value to be identical to the last bit on a CPU with
the same AVX-512 support as the one the record was made on (other CPUs' kernels may round
differently in the last place: there it compares to 1e-6). Run it before a change that must keep
the losses' numbers, commit the record, then make the change.

    python tools/make_loss_golden.py [--out tests/golden/losses/bitwise.npz]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jdml.losses import LOSSES
from jdml.miners import MINERS
from tests.helpers import cpu_kind

BATCH, DIM, CLASSES = 24, 16, 6
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "losses", "bitwise.npz")


def golden_batch() -> tuple[np.ndarray, np.ndarray]:
    """The fixed batch: (24, 16) float32 embeddings, four samples of each of 6 classes."""
    rng = np.random.default_rng(20261205)
    x = rng.standard_normal((BATCH, DIM)).astype(np.float32)
    labels = np.repeat(np.arange(CLASSES), BATCH // CLASSES).astype(np.int32)
    return x, labels


def build(name: str):
    """The loss ``name`` with its defaults, and its miner (the reference's, else ``distance``;
    None for a loss that mines itself)."""
    cls = LOSSES.get(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    miner = (cls.reference_miner or "distance") if cls.needs_miner else None
    kwargs = {}
    if "num_classes" in fields:
        kwargs["num_classes"] = CLASSES
    if "miner_name" in fields:
        kwargs["miner_name"] = miner or ""
    return cls(**kwargs), miner


def compute(name: str) -> dict[str, np.ndarray]:
    """The loss's value, metrics, and gradients with respect to the embeddings and its
    parameters, on :func:`golden_batch`."""
    x, labels = golden_batch()
    loss, miner = build(name)
    l2 = x / np.linalg.norm(x, axis=1, keepdims=True)
    x = l2 if type(loss).reference_normalize else x
    tuples = None
    if miner is not None:
        tuples = MINERS.get(miner)(jax.random.key(3), jnp.asarray(x), jnp.asarray(labels))
    params = loss.init(jax.random.key(1), x, labels, tuples)

    def value(params, x):
        out, metrics = loss.apply(params, x, labels, tuples)
        return out, metrics

    (out, metrics), grads = jax.value_and_grad(value, argnums=(0, 1), has_aux=True)(
        params, jnp.asarray(x)
    )
    record = {"loss": np.asarray(out), "grad_x": np.asarray(grads[1])}
    record.update({f"metric/{k}": np.asarray(v) for k, v in metrics.items()})
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads[0]):
        record["grad_param/" + jax.tree_util.keystr(path)] = np.asarray(leaf)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    arrays = {"cpu_kind": np.asarray(cpu_kind())}
    for name in LOSSES.names():
        for key, value in compute(name).items():
            arrays[f"{name}:{key}"] = value
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}: {len(LOSSES.names())} losses, {len(arrays)} arrays")


if __name__ == "__main__":
    main()
