"""Benchmark of the full metric suite against faiss-cpu + scikit-learn, with peak memory.

For each configuration (N embeddings of dimension D in SOP-like classes of 2..12 samples,
~5.35 on average: 60,502 embeddings give ~11,300 classes, like Stanford Online Products) the
same metrics are computed twice, each in a fresh subprocess so that the peak resident memory
(``ru_maxrss``) is that of one method on one configuration:

* ``jdml``: one ``evaluate_embeddings`` call with every metric (recall@1/2/4/8, precision@1,
  r_precision, map@r, map@c, map@1000, map, nmi, f1, rho_spectrum(_trunc)@1/2/-1,
  dists@intra/inter/intra_over_inter). The time includes the jit compilations. Its four
  requirements (search, k-means, SVD, class sums) are timed on their own by wrapping the
  evaluator's functions.
* ``faiss+sklearn``: what the reference code does: faiss ``IndexFlatL2`` kNN (k = 1001) for the
  retrieval metrics; faiss search with k = N (query blocks) for ``map``; faiss's k-means (20
  iterations, every one run, no subsampling, as the reference; ``bench_kmeans.py``) +
  scikit-learn NMI and the pair-counting F1 from ``contingency_matrix``;
  ``TruncatedSVD(D - 1, n_iter=7, random_state=42)`` for rho (compared with jdml's
  ``rho_spectrum_trunc``); NumPy per-class cosine distances for ``dists``.

The embeddings are L2-normalised noisy class centres (:func:`sop_like`) and the distance is
Euclidean. The values
of the two methods are printed side by side (k-means differs in initialisation, so nmi / f1
agree only roughly; the retrieval metrics should agree to rounding).

Usage: python bench/bench_eval_suite.py [--configs 10000x128 10000x512 60502x512]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

METRIC_NAMES = (
    "recall@1",
    "recall@2",
    "recall@4",
    "recall@8",
    "precision@1",
    "r_precision",
    "map@r",
    "map@c",
    "map@1000",
    "map",
    "nmi",
    "f1",
    "rho_spectrum@1",
    "rho_spectrum@2",
    "rho_spectrum@-1",
    "rho_spectrum_trunc@1",
    "rho_spectrum_trunc@2",
    "rho_spectrum_trunc@-1",
    "dists@intra",
    "dists@inter",
    "dists@intra_over_inter",
)
DEFAULT_CONFIGS = ("10000x128", "10000x512", "60502x128", "60502x512")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sop_like(n: int, dim: int, seed: int = 0, noise: float = 1.0) -> tuple[np.ndarray, ...]:
    """(n, dim) unit-norm float32 embeddings and (n,) labels in classes of 2..12 samples.

    Class sizes are 2 + Binomial(10, 0.335) (mean ~5.35, as SOP's test split). Each sample is
    its class centre plus ``noise`` times as much Gaussian noise, both with a per-dimension
    standard deviation decaying as 1 / sqrt(1 + j) (a decaying spectrum, as trained
    embeddings have), then L2-normalised. With noise 1 recall@1 is ~0.86 (60k x 512).
    """
    rng = np.random.default_rng(seed)
    sizes = 2 + rng.binomial(10, 0.335, n // 2)
    sizes = sizes[np.cumsum(sizes) <= n - 2]
    sizes = np.append(sizes, n - sizes.sum())
    labels = np.repeat(np.arange(len(sizes)), sizes)
    profile = 1.0 / np.sqrt(1.0 + np.arange(dim))
    centres = rng.standard_normal((len(sizes), dim)) * profile
    x = centres[labels] + noise * profile * rng.standard_normal((n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), labels


# ---------------------------------------------------------------------------------------------
# jdml.


def run_jdml(x: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """All metrics with one evaluate_embeddings call; returns values and timings."""
    import jax

    from jdml.evaluation import embeddings as evaluator

    steps: dict[str, float] = {}

    def timed(name: str, fn: Callable) -> Callable:
        def wrapped(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            out = jax.block_until_ready(fn(*args, **kwargs))
            steps[name] = steps.get(name, 0.0) + time.perf_counter() - start
            return out

        return wrapped

    # The exact search with the retrieval metrics' per-query reductions, block by block.
    for name in ("_retrieval_requirements", "kmeans", "singular_values", "class_distances"):
        setattr(evaluator, name, timed(name, getattr(evaluator, name)))
    start = time.perf_counter()
    values = evaluator.evaluate_embeddings(x, labels, METRIC_NAMES)
    return {"values": values, "total": time.perf_counter() - start, "steps": steps}


# ---------------------------------------------------------------------------------------------
# faiss-cpu + scikit-learn, the reference's way.


def faiss_neighbours(faiss: Any, x: np.ndarray, k: int) -> np.ndarray:
    """(N, k) IndexFlatL2 neighbours, the query's own index removed (or the last result)."""
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    _, found = index.search(x, k + 1)
    own = found == np.arange(len(x))[:, None]
    cut = np.where(own.any(axis=1), own.argmax(axis=1), k)
    keep = np.arange(k)[None, :]
    return np.take_along_axis(found, keep + (keep >= cut[:, None]), axis=1)


def ap_sums(relevant: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """sum_{i <= depth} P@i * rel_i per row of a (B, K) relevance matrix."""
    ranks = np.arange(1, relevant.shape[1] + 1)
    relevant = relevant & (ranks[None, :] <= depth[:, None])
    return np.sum(np.cumsum(relevant, axis=1) / ranks * relevant, axis=1)


def faiss_full_map(faiss: Any, x: np.ndarray, labels: np.ndarray, sizes: np.ndarray) -> float:
    """mAP over all neighbours: faiss search with k = N, 512 queries at a time."""
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    n, total = len(x), 0.0
    for start in range(0, n, 512):
        rows = np.arange(start, min(start + 512, n))
        _, found = index.search(x[rows], n)
        keep = found != rows[:, None]
        others = found[keep].reshape(len(rows), n - 1)
        relevant = labels[others] == labels[rows, None]
        total += float(np.sum(ap_sums(relevant, np.full(len(rows), n)) / sizes[rows]))
    return total / n


def pair_f1(contingency: Any) -> float:
    """Pair-counting F1 from a sparse (classes x clusters) contingency matrix."""

    def pairs(v: np.ndarray) -> float:
        v = np.asarray(v, np.float64).ravel()
        return float(np.sum(v * (v - 1) / 2))

    tp = pairs(contingency.data)
    p = tp / pairs(contingency.sum(axis=1))
    r = tp / pairs(contingency.sum(axis=0))
    return 2 * p * r / (p + r) if tp > 0 else 0.0


def kl_rho(s: np.ndarray, mode: int) -> float:
    """The reference's spectral decay from singular values s."""
    s = s[abs(mode) - 1 :]
    s_hat = s / s.sum()
    u = np.full(len(s), 1.0 / len(s))
    return float(np.sum(u * np.log(u / s_hat)) if mode > 0 else np.sum(s_hat * np.log(s_hat / u)))


def numpy_dists(x: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Intra (per-class cosine distance matrices) and inter (blocked class-mean matrix)."""
    order = np.argsort(labels, kind="stable")
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    intra, means = [], []
    for members in np.split(order, bounds):
        u = unit[members]
        n = len(members)
        intra.append(np.sum(1.0 - u @ u.T) / (n * n - n) if n > 1 else np.nan)
        mean = x[members].mean(axis=0)
        means.append(mean / np.linalg.norm(mean))
    intra = np.array(intra)
    intra[np.isnan(intra)] = np.nanmax(intra)
    means = np.array(means)
    c, inter = len(means), 0.0
    for start in range(0, c, 2048):
        inter += float(np.sum(1.0 - means[start : start + 2048] @ means.T))
    return float(intra.mean()), inter / (c * c - c)


def run_reference(x: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """The same metrics with faiss-cpu + scikit-learn; returns values and timings."""
    import faiss
    from sklearn.decomposition import TruncatedSVD
    from sklearn.metrics import normalized_mutual_info_score
    from sklearn.metrics.cluster import contingency_matrix

    steps: dict[str, float] = {}
    values: dict[str, float] = {}
    n, dim = x.shape
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    sizes = counts[inverse]
    total_start = start = time.perf_counter()

    k = min(1000, n - 1)
    nn = labels[faiss_neighbours(faiss, x, k)]
    relevant = nn == labels[:, None]
    others = sizes - 1
    kept = others > 0
    for r in (1, 2, 4, 8):
        values[f"recall@{r}"] = float(np.mean(relevant[:, :r].any(axis=1)))
    values["precision@1"] = float(np.mean(relevant[kept, 0]))
    in_r = np.cumsum(relevant, axis=1)[np.arange(n), np.maximum(others, 1) - 1]
    values["r_precision"] = float(np.mean((in_r / np.maximum(others, 1))[kept]))
    values["map@r"] = float(np.mean((ap_sums(relevant, others) / np.maximum(others, 1))[kept]))
    values["map@c"] = float(np.mean(ap_sums(relevant, sizes) / sizes))
    values["map@1000"] = float(np.mean(ap_sums(relevant, np.full(n, k)) / sizes))
    del nn, relevant
    steps["faiss kNN k=1000 + metrics"] = time.perf_counter() - start

    start = time.perf_counter()
    values["map"] = faiss_full_map(faiss, x, labels, sizes)
    steps["faiss search k=N (map)"] = time.perf_counter() - start

    from bench_kmeans import faiss_kmeans  # the same faiss k-means as bench_kmeans.py

    start = time.perf_counter()
    clusters = faiss_kmeans(x, len(counts), 20)
    steps["faiss Kmeans"] = time.perf_counter() - start
    start = time.perf_counter()
    values["nmi"] = float(normalized_mutual_info_score(labels, clusters))
    values["f1"] = pair_f1(contingency_matrix(labels, clusters, sparse=True))
    steps["sklearn NMI + F1"] = time.perf_counter() - start

    start = time.perf_counter()
    s = TruncatedSVD(n_components=dim - 1, n_iter=7, random_state=42).fit(x).singular_values_
    for mode in (1, 2, -1):
        values[f"rho_spectrum_trunc@{mode}"] = kl_rho(s, mode)
    steps["sklearn TruncatedSVD"] = time.perf_counter() - start

    start = time.perf_counter()
    intra, inter = numpy_dists(x, labels)
    values.update(
        {"dists@intra": intra, "dists@inter": inter, "dists@intra_over_inter": intra / inter}
    )
    steps["numpy dists"] = time.perf_counter() - start
    return {"values": values, "total": time.perf_counter() - total_start, "steps": steps}


# ---------------------------------------------------------------------------------------------
# Driver.


def worker(method: str, n: int, dim: int) -> None:
    """Runs one method on one configuration and prints one JSON line."""
    x, labels = sop_like(n, dim)
    before = peak_rss_mb()
    out = (run_jdml if method == "jdml" else run_reference)(x, labels)
    out.update(
        {"rss_before_mb": before, "peak_rss_mb": peak_rss_mb(), "classes": int(labels.max() + 1)}
    )
    print(json.dumps(out))


def run_worker(method: str, n: int, dim: int) -> dict[str, Any]:
    """Runs ``worker`` in a fresh Python process and parses its JSON line."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    cmd = [sys.executable, __file__, "--worker", method, "--n", str(n), "--dim", str(dim)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{method} {n}x{dim} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(n: int, dim: int, ours: dict[str, Any], ref: dict[str, Any]) -> None:
    """Prints timings, memory and values of one configuration."""
    print(f"\n=== N={n} D={dim}, {ours['classes']} classes ===", flush=True)
    print(f"{'method':<16}{'total s':>10}{'peak RSS MB':>13}{'RSS before MB':>15}")
    for name, out in (("jdml", ours), ("faiss+sklearn", ref)):
        print(
            f"{name:<16}{out['total']:>10.1f}{out['peak_rss_mb']:>13.0f}"
            f"{out['rss_before_mb']:>15.0f}"
        )
    print(f"time ratio jdml / faiss+sklearn: {ours['total'] / ref['total']:.2f}")
    for name, out in (("jdml", ours), ("faiss+sklearn", ref)):
        parts = ", ".join(f"{step} {t:.1f}s" for step, t in out["steps"].items())
        print(f"  {name} steps: {parts}")
    print(f"{'metric':<26}{'jdml':>12}{'faiss+sklearn':>15}{'|diff|':>11}")
    for metric in METRIC_NAMES:
        mine, theirs = ours["values"][metric], ref["values"].get(metric)
        other = "-" if theirs is None else f"{theirs:>15.5f}"
        diff = "" if theirs is None else f"{abs(mine - theirs):>11.2e}"
        print(f"{metric:<26}{mine:>12.5f}{other:>15}{diff}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS))
    parser.add_argument("--worker", choices=("jdml", "reference"))
    parser.add_argument("--n", type=int)
    parser.add_argument("--dim", type=int)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.n, args.dim)
        return
    import faiss
    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0]}, faiss {faiss.__version__}")
    print(f"{os.cpu_count()} CPUs, load average at start: {os.getloadavg()[0]:.2f}")
    print(
        "Each method runs in its own process; 'RSS before' is that process's peak after "
        "generating the data (float64 temporaries) and before importing and running the method."
    )
    for config in args.configs:
        n, dim = (int(v) for v in config.split("x"))
        ours = run_worker("jdml", n, dim)
        ref = run_worker("reference", n, dim)
        report(n, dim, ours, ref)
        print(f"load average now: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
