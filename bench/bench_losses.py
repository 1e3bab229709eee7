"""Speed of every loss with its default miner (forward + backward) against pytorch-metric-learning.

For each registered loss, times the jitted value-and-gradient (w.r.t. the embeddings and the
loss's own parameters) of miner + loss at batch 112 (SPC-2), D = 128, on CPU, after a warm-up
(compilation). Next to it, where pytorch-metric-learning has an equivalent, the same computation
in PyTorch eager: its loss (and miner) on a leaf tensor, ``backward()``. The two are run in turn,
round after round, and the median per call is reported with the ratio jdml / PML.

PyTorch and pytorch-metric-learning are benchmark-only tools, never jdml dependencies:
  pip install torch==2.13.0 pytorch-metric-learning

Usage: python bench/bench_losses.py [--repeats 5] [--calls 20]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from configs.revisiting import get_config
from jdml.geometry import l2_normalize
from jdml.losses import LOSSES
from jdml.methods import StandardMethod
from jdml.throughput import alternating_rounds

BATCH, DIM, SPC = 112, 128, 2
NUM_CLASSES = 100


def _pml_factories(num_classes: int) -> dict[str, Callable[[], tuple[object, object | None]]]:
    """PML (loss, miner) pairs closest to each jdml loss with its default miner."""
    from pytorch_metric_learning import distances as D
    from pytorch_metric_learning import losses as L
    from pytorch_metric_learning import miners as M

    def dw():
        return M.DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)

    return {
        "margin": lambda: (
            L.MarginLoss(margin=0.2, beta=1.2, learn_beta=True, num_classes=num_classes),
            dw(),
        ),
        "triplet": lambda: (L.TripletMarginLoss(margin=0.2), dw()),
        "contrastive": lambda: (L.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0), dw()),
        "snr": lambda: (L.TripletMarginLoss(margin=0.2, distance=D.SNRDistance()), dw()),
        "lifted": lambda: (L.GeneralizedLiftedStructureLoss(neg_margin=1.0, pos_margin=0.0), None),
        "npair": lambda: (L.NPairsLoss(), None),
        "angular": lambda: (L.AngularLoss(alpha=45), None),
        "multisimilarity": lambda: (
            L.MultiSimilarityLoss(alpha=2, beta=40, base=0.5),
            M.MultiSimilarityMiner(epsilon=0.1),
        ),
        "histogram": lambda: (L.HistogramLoss(n_bins=65), None),
        "proxynca": lambda: (L.ProxyNCALoss(num_classes, DIM), None),
        "softmax": lambda: (L.NormalizedSoftmaxLoss(num_classes, DIM, temperature=0.05), None),
        "arcface": lambda: (L.ArcFaceLoss(num_classes, DIM, margin=28.6, scale=16), None),
        "softtriplet": lambda: (
            L.SoftTripleLoss(num_classes, DIM, centers_per_class=10, la=20, gamma=0.1, margin=0.01),
            None,
        ),
    }


def _jdml_call(loss: str, raw: np.ndarray, labels: np.ndarray) -> Callable[[], object]:
    c = get_config(f"loss={loss}")
    method = StandardMethod(c, num_classes=NUM_CLASSES)
    key = jax.random.key(0)
    x = jnp.asarray(raw)
    y = jnp.asarray(labels)

    def f(p, x):
        emb = l2_normalize(x) if c.model.normalize else x
        return method.head_loss(p, emb, y, key)[0]

    params = method.init_loss(key, l2_normalize(x), y)
    step = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
    return lambda: jax.block_until_ready(step(params, x))


def _pml_call(factory, raw: np.ndarray, labels: np.ndarray, normalize: bool) -> Callable:
    import warnings

    import torch

    warnings.filterwarnings("ignore", category=UserWarning, module="pytorch_metric_learning")

    loss_fn, miner = factory()
    y = torch.from_numpy(labels.astype(np.int64))

    def call():
        x = torch.from_numpy(raw).requires_grad_(True)
        emb = torch.nn.functional.normalize(x, dim=1) if normalize else x
        tuples = miner(emb, y) if miner is not None else None
        out = loss_fn(emb, y, tuples) if tuples is not None else loss_fn(emb, y)
        out.backward()
        return out

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    raw = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    labels = np.repeat(rng.choice(NUM_CLASSES, BATCH // SPC, replace=False), SPC).astype(np.int32)
    try:
        import torch

        torch.manual_seed(0)
        pml = _pml_factories(NUM_CLASSES)
    except ImportError:
        pml = {}
        print("pytorch-metric-learning not installed: jdml timings only")

    rows = []
    for loss in LOSSES.names():
        contenders = {"jdml": _jdml_call(loss, raw, labels)}
        if loss in pml:
            normalize = get_config(f"loss={loss}").model.normalize
            contenders["pml"] = _pml_call(pml[loss], raw, labels, normalize)
        timings = alternating_rounds(contenders, args.repeats, calls=args.calls)
        med = {name: timing.median for name, timing in timings.items()}
        rows.append(
            (loss, LOSSES.get(loss).reference_miner or "-", med.get("jdml"), med.get("pml"))
        )

    print(f"batch {BATCH}, D {DIM}, SPC-{SPC}; median ms per forward+backward (miner included)")
    print(f"{'loss':16s} {'miner':9s} {'jdml ms':>8s} {'PML ms':>8s} {'jdml/PML':>9s}")
    for loss, miner, ours, theirs in rows:
        t = f"{1e3 * theirs:8.2f}" if theirs else f"{'-':>8s}"
        r = f"{ours / theirs:9.2f}" if theirs else f"{'-':>9s}"
        print(f"{loss:16s} {miner:9s} {1e3 * ours:8.2f} {t} {r}")


if __name__ == "__main__":
    main()
