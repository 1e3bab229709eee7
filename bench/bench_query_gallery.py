"""Query-against-gallery evaluation at In-Shop scale: jdml against a NumPy reference.

In-Shop's test split ranks 14,218 queries against 12,612 gallery images of 3,985 items. This
bench draws embeddings of that shape (noisy item centres, L2-normalised, 512-d by default),
computes Recall@1/10/20/30, MAP@R and the full-ranking mAP with
``evaluate_embeddings(..., gallery=...)``, and the same with NumPy in the same process: the
query-by-gallery distance matrix in blocks, a stable argsort of each row (ties by gallery
index), and the definitions applied to the sorted relevance. It prints both times, their
ratio and the largest difference between the values (which should be 0 up to float rounding).

Usage: python bench/bench_query_gallery.py [--queries 14218 --gallery 12612 --items 3985 --dim 512]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from jdml.evaluation.embeddings import evaluate_embeddings

METRICS = ["recall@1", "recall@10", "recall@20", "recall@30", "map@r", "map"]


def shop_like(args: argparse.Namespace) -> tuple[np.ndarray, ...]:
    """Queries and gallery around shared item centres (every item in both, as In-Shop)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(args.items, args.dim)).astype(np.float32)
    query_labels = np.concatenate(
        [np.arange(args.items), rng.integers(0, args.items, args.queries - args.items)]
    )
    gallery_labels = np.concatenate(
        [np.arange(args.items), rng.integers(0, args.items, args.gallery - args.items)]
    )

    def embed(labels: np.ndarray) -> np.ndarray:
        x = centres[labels] + args.noise * rng.normal(size=(len(labels), args.dim))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    return embed(query_labels), query_labels, embed(gallery_labels), gallery_labels


def numpy_reference(q, ql, g, gl, block: int = 1024) -> dict[str, float]:
    """The metrics from each query's fully sorted gallery ranking."""
    r = np.bincount(gl, minlength=max(ql.max(), gl.max()) + 1)[ql]
    g_sq = np.sum(g.astype(np.float64) ** 2, axis=1)
    hits = {k: 0 for k in (1, 10, 20, 30)}
    map_r, full_ap = [], []
    for start in range(0, len(q), block):
        qb = q[start : start + block].astype(np.float64)
        d = np.sqrt(np.maximum(np.sum(qb**2, 1)[:, None] - 2 * qb @ g.T + g_sq[None], 0))
        order = np.argsort(d, axis=1, kind="stable")
        rel = gl[order] == ql[start : start + block, None]
        for k in hits:
            hits[k] += int(np.sum(rel[:, :k].any(1)))
        precision = np.cumsum(rel, axis=1) / np.arange(1, rel.shape[1] + 1)
        rb = r[start : start + block]
        for i in range(len(rel)):
            map_r.append(np.sum(precision[i, : rb[i]] * rel[i, : rb[i]]) / max(rb[i], 1))
            full_ap.append(np.sum(precision[i] * rel[i]) / max(rb[i], 1))
    out = {f"recall@{k}": v / len(q) for k, v in hits.items()}
    return {**out, "map@r": float(np.mean(map_r)), "map": float(np.mean(full_ap))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=14_218)
    parser.add_argument("--gallery", type=int, default=12_612)
    parser.add_argument("--items", type=int, default=3_985)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--noise", type=float, default=2.2, help="noise around item centres")
    args = parser.parse_args()
    q, ql, g, gl = shop_like(args)
    print(f"{len(q):,} queries x {len(g):,} gallery, {args.items:,} items, {args.dim}-d")

    start = time.perf_counter()
    got = evaluate_embeddings(q, ql, METRICS, gallery=g, gallery_labels=gl)
    jdml_s = time.perf_counter() - start
    start = time.perf_counter()
    want = numpy_reference(q, ql, g, gl)
    numpy_s = time.perf_counter() - start

    print(f"{'metric':<10}{'jdml':>10}{'numpy':>10}")
    for name in METRICS:
        print(f"{name:<10}{100 * got[name]:>10.3f}{100 * want[name]:>10.3f}")
    worst = max(abs(got[m] - want[m]) for m in METRICS)
    print(f"largest difference: {worst:.2e}")
    print(f"jdml {jdml_s:.1f} s (compilation included), NumPy {numpy_s:.1f} s: ", end="")
    print(f"jdml takes {jdml_s / numpy_s:.2f}x the NumPy time")


if __name__ == "__main__":
    main()
