"""Benchmark of the retrieval evaluator against scikit-learn (and faiss-cpu when installed).

Times, in the same run and on the same data:

* the exact all-vs-all top-10 kNN (query itself excluded) on 10,000 x 128 random float32
  embeddings: ``jdml.evaluation.knn.knn`` vs scikit-learn ``NearestNeighbors(algorithm="brute")``
  vs faiss ``IndexFlatL2``; the neighbour sets are checked against each other and against a
  float64 brute force on a subset of queries;
* the full ``evaluate_embeddings`` (recall@1,2,4,8, map@r, map@c, nmi) on 10,000 x 128
  embeddings in 100 classes, with its two expensive steps (kNN with k = the class size, needed by
  map@r / map@c, and k-means) timed on their own.

Every timing is the median of ``--repeats`` runs (at least ``SMALL_REPEATS`` for the grid's
cases of milliseconds), each after ``PAUSE_S`` idle, after one warm-up run (which includes the
compilation of the jitted functions; its time is reported separately). The methods compared are
run in turn, round after round, so that changes in machine load affect them alike.

``--grid`` instead times exact kNN against faiss ``IndexFlatL2`` over N x D x k, leave-one-out
(``self``) and query against gallery (``gallery``, Q = N), each case in a fresh process, and
prints the times, their ratio, jdml's peak resident memory (a separate process that runs only
jdml) and whether the neighbours are equal up to ties; then, for each of ``--metric-cases``
(N x D x class size, clustered embeddings), Recall@1 and MAP@R from ``evaluate_embeddings``
against faiss search plus NumPy, with the same columns and whether the values agree.

Usage: python bench/bench_eval.py [--n 10000] [--dim 128] [--k 10] [--repeats 3]
       python bench/bench_eval.py --grid [--grid-n 1000,20000] [--grid-d 128,1024]
           [--grid-k 1,16,100,1000] [--grid-modes self,gallery] [--repeats 3]
           [--metric-cases 20000x128x10,20000x128x1065,35000x1024x7000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from sklearn.neighbors import NearestNeighbors

from jdml.backends import resolve_backends
from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import knn
from jdml.evaluation.table import format_table
from jdml.throughput import alternating_rounds, throughput_line

# Idle time before every timed call, so that the thread pools of the previous call (faiss's
# OpenMP threads spin for a while after their work) do not slow the next one down.
PAUSE_S = 0.05
# Rounds of the grid's cases of milliseconds (N^2 D <= 1e9), whose times vary more.
SMALL_REPEATS = 15
EVAL_METRICS = ("recall@1", "recall@2", "recall@4", "recall@8", "map@r", "map@c", "nmi")


def ours_knn(x: np.ndarray, k: int) -> np.ndarray:
    """(N, k) neighbour indices from the evaluator's kNN (self excluded)."""
    _, indices = knn(x, x, k, exclude_self=True, selection=resolve_backends().knn)
    return np.asarray(indices)


def sklearn_knn(x: np.ndarray, k: int) -> np.ndarray:
    """(N, k) indices from scikit-learn brute force; ``kneighbors()`` without X excludes self."""
    nn = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(x)
    return nn.kneighbors(return_distance=False)


def faiss_knn(faiss: Any, x: np.ndarray, k: int) -> np.ndarray:
    """(N, k) indices from faiss IndexFlatL2, self excluded by index (see :func:`faiss_search`)."""
    return faiss_search(faiss, x, None, k)[1]


def exact_neighbours(x: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """float64 brute-force top-k (self excluded) of the queries ``rows``, ties by lower index."""
    x64 = x.astype(np.float64)
    d = ((x64[rows, None, :] - x64[None, :, :]) ** 2).sum(-1)
    d[np.arange(len(rows)), rows] = np.inf
    return np.argsort(d, axis=1, kind="stable")[:, :k]


def same_sets(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of rows whose neighbour sets agree (order ignored)."""
    return float(np.mean(np.all(np.sort(a, axis=1) == np.sort(b, axis=1), axis=1)))


def clustered_embeddings(n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, ...]:
    """Noisy class centres: (n, dim) float32 embeddings and (n,) labels, n / classes per class."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % classes
    centres = rng.standard_normal((classes, dim))
    x = centres[labels] + 1.2 * rng.standard_normal((n, dim))
    return x.astype(np.float32), labels


# ---------------------------------------------------------------------------------------------
# The kNN grid against faiss (--grid): every case in a fresh process, for its peak memory.


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def faiss_search(faiss: Any, queries: np.ndarray, gallery: np.ndarray | None, k: int):
    """faiss exact search: (distances, indices) of the k nearest, self excluded by index when
    ``gallery`` is None (k + 1 searched, the own index or else the last one dropped)."""
    references = queries if gallery is None else gallery
    index = faiss.IndexFlatL2(references.shape[1])
    index.add(references)
    if gallery is not None:
        return index.search(queries, k)
    d, found = index.search(queries, k + 1)
    own = found == np.arange(len(queries))[:, None]
    cut = np.where(own.any(axis=1), own.argmax(axis=1), k)
    keep = np.arange(k)[None, :]
    source = keep + (keep >= cut[:, None])
    return np.take_along_axis(d, source, 1), np.take_along_axis(found, source, 1)


def equal_up_to_ties(x: np.ndarray, refs: np.ndarray, a: np.ndarray, b: np.ndarray) -> int:
    """How many queries of two (Q, k) neighbour lists hold different sets, every difference a
    tie (float64 distances: the neighbours only one list holds are at the same sorted distances
    as those only the other holds, to 1e-5 relative); -1 if a difference is not a tie.
    Both lists round the distances in float32, so where many distances lie within that rounding
    of the k-th (100,000 points in 2048 dimensions) many queries can differ this way."""
    sorted_a, sorted_b = np.sort(a, 1), np.sort(b, 1)
    differ = np.flatnonzero(np.any(sorted_a != sorted_b, axis=1))
    for r in differ:
        only_a = np.setdiff1d(sorted_a[r], sorted_b[r], assume_unique=True)
        only_b = np.setdiff1d(sorted_b[r], sorted_a[r], assume_unique=True)
        q = x[r].astype(np.float64)
        da = np.sort(np.linalg.norm(refs[only_a].astype(np.float64) - q, axis=1))
        db = np.sort(np.linalg.norm(refs[only_b].astype(np.float64) - q, axis=1))
        if len(da) != len(db) or not np.allclose(da, db, rtol=1e-5, atol=1e-6):
            return -1
    return len(differ)


def grid_case(n: int, dim: int, k: int, mode: str, repeats: int, peak_only: bool) -> dict:
    """One case of the grid: jdml's kNN against faiss, alternating rounds."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    gallery = None if mode == "self" else rng.standard_normal((n, dim)).astype(np.float32)
    refs = x if gallery is None else gallery

    backends = resolve_backends()  # what the evaluator computes with here

    def ours() -> np.ndarray:
        _, indices = knn(x, refs, k, exclude_self=gallery is None, selection=backends.knn)
        return np.asarray(indices)

    if peak_only:
        before = _peak_rss_mb()
        ours()
        return {"peak_mb": _peak_rss_mb() - before}
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    fns = {"jdml": ours, "faiss": lambda: faiss_search(faiss, x, gallery, k)[1]}
    rounds = repeats if n * n * dim > 10**9 else max(repeats, SMALL_REPEATS)
    timings = alternating_rounds(fns, rounds, pause=PAUSE_S)
    same = equal_up_to_ties(x, refs, timings["jdml"].result, timings["faiss"].result)
    return {"jdml_s": timings["jdml"].median, "faiss_s": timings["faiss"].median, "equal": same}


def numpy_retrieval(neighbour_labels: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Recall@1 and MAP@R from (N, k) neighbour labels, plain NumPy (what a faiss user writes).

    MAP@R (Musgrave et al., 2020): AP over the R = class size - 1 nearest, averaged over the
    queries with R >= 1.
    """
    r = np.bincount(labels)[labels] - 1
    ranks = np.arange(1, neighbour_labels.shape[1] + 1)[None, :]
    ap = np.empty(len(labels))
    for start in range(0, len(labels), 256):  # row blocks that stay in cache
        rows = slice(start, start + 256)
        relevant = neighbour_labels[rows] == labels[rows, None]
        relevant &= ranks <= r[rows, None]
        hits = np.cumsum(relevant, axis=1)
        ap[rows] = np.sum(np.where(relevant, hits / ranks, 0.0), axis=1) / np.maximum(r[rows], 1)
    has = r >= 1
    recall = float(np.mean(neighbour_labels[:, 0] == labels))
    return {"recall@1": recall, "map@r": float(np.mean(ap[has]))}


def metrics_case(n: int, dim: int, class_size: int, repeats: int) -> dict:
    """Recall@1 and MAP@R of N clustered embeddings: jdml's evaluator against faiss + NumPy."""
    x, labels = clustered_embeddings(n, dim, n // class_size, seed=0)
    k = int(np.bincount(labels).max()) - 1

    def ours() -> dict[str, float]:
        return evaluate_embeddings(x, labels, ["recall@1", "map@r"])

    def reference() -> dict[str, float]:
        import faiss

        faiss.omp_set_num_threads(os.cpu_count() or 1)
        _, found = faiss_search(faiss, x, None, k)
        return numpy_retrieval(labels[found], labels)

    timings = alternating_rounds({"jdml": ours, "faiss": reference}, repeats, pause=PAUSE_S)
    a, b = timings["jdml"].result, timings["faiss"].result
    same = all(abs(a[m] - b[m]) <= 1e-6 for m in a)
    jdml_s, faiss_s = timings["jdml"].median, timings["faiss"].median
    return {"jdml_s": jdml_s, "faiss_s": faiss_s, "equal": 0 if same else -1, "k": k}


def run_metrics(args: argparse.Namespace) -> None:
    """The evaluator's retrieval metrics against faiss + NumPy on ``--metric-cases``."""
    print(f"\nrecall@1 and MAP@R of clustered embeddings (k = largest class - 1 neighbours): "
          f"jdml evaluate_embeddings against faiss IndexFlatL2 + NumPy, median of "
          f"{args.repeats}, each case in a fresh process")  # fmt: skip
    print(f"{'N':>8}{'D':>6}{'class':>7}{'k':>7}{MEASURED_HEADER}")
    for case in args.metric_cases.split(","):
        n, dim, size = (int(v) for v in case.split("x"))
        timing, columns = _measured([str(n), str(dim), str(size), "metrics", str(args.repeats)])
        print(f"{n:>8}{dim:>6}{size:>7}{timing['k']:>7}{columns}", flush=True)


def run_grid(args: argparse.Namespace) -> None:
    grid = (args.grid_n, args.grid_d, args.grid_k)
    ns, dims, ks = ([int(v) for v in a.split(",")] for a in grid)
    print(f"jax {jax.__version__} on {jax.devices()[0]}; {os.cpu_count()} CPUs; exact kNN, "
          f"median of {args.repeats} alternating rounds, each case in a fresh process; peak "
          "MB: the search's growth of jdml's peak resident memory over the data's")  # fmt: skip
    print(f"{'mode':<8}{'N':>8}{'D':>6}{'k':>7}{MEASURED_HEADER}")
    for mode in args.grid_modes.split(","):
        for n in ns:
            for dim in dims:
                for k in ks:
                    if k > n - 1:
                        continue
                    _, columns = _measured([str(n), str(dim), str(k), mode, str(args.repeats)])
                    print(f"{mode:<8}{n:>8}{dim:>6}{k:>7}{columns}", flush=True)


MEASURED_HEADER = f"{'jdml s':>9}{'faiss s':>9}{'faiss/jdml':>11}{'jdml peak MB':>14}  equal"


def _measured(case: list[str]) -> tuple[dict, str]:
    """Runs one case (timing, then jdml's peak memory, each in a fresh process); returns the
    timing and its columns under ``MEASURED_HEADER``."""
    timing, peak = _child(case), _child([*case, "peak"])
    ratio = timing["faiss_s"] / timing["jdml_s"]
    columns = (
        f"{timing['jdml_s']:>9.3f}{timing['faiss_s']:>9.3f}{ratio:>11.2f}"
        f"{peak['peak_mb']:>14.0f}  {_equality(timing['equal'])}"
    )
    return timing, columns


def _equality(differ: int) -> str:
    """The equal column: "yes", "yes (n ties)" when n queries differ by ties only, "NO"."""
    if differ < 0:
        return "NO"
    return "yes" if differ == 0 else f"yes ({differ} ties)"


def _child(case: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--case", *case], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grid", action="store_true", help="the kNN grid against faiss")
    parser.add_argument("--grid-n", default="1000,20000", help="('' for no kNN grid)")
    parser.add_argument("--grid-d", default="128,1024")
    parser.add_argument("--grid-k", default="1,16,100,1000")
    parser.add_argument("--grid-modes", default="self,gallery")
    parser.add_argument(
        "--metric-cases",
        default="20000x128x10,20000x128x1065,35000x1024x7000",
        help="N x D x class size cases of the metrics table ('' for none)",
    )
    parser.add_argument("--case", nargs="+", help=argparse.SUPPRESS)  # one grid case (child)
    args = parser.parse_args()
    if args.case:
        n, dim, k, mode, repeats, *peak = args.case
        if mode != "metrics":
            print(json.dumps(grid_case(int(n), int(dim), int(k), mode, int(repeats), bool(peak))))
        elif peak:
            x, labels = clustered_embeddings(int(n), int(dim), int(n) // int(k), seed=0)
            before = _peak_rss_mb()
            evaluate_embeddings(x, labels, ["recall@1", "map@r"])
            print(json.dumps({"peak_mb": _peak_rss_mb() - before}))
        else:
            print(json.dumps(metrics_case(int(n), int(dim), int(k), int(repeats))))
        return
    if args.grid:
        if args.grid_n:
            run_grid(args)
        if args.metric_cases:
            run_metrics(args)
        return

    print(f"jax {jax.__version__} on {jax.devices()[0]}; N={args.n} D={args.dim} k={args.k}")
    # Other processes on the machine slow the multi-threaded methods (faiss most): show it.
    print(f"{os.cpu_count()} CPUs, load average at start: {os.getloadavg()[0]:.2f}")
    x = np.random.default_rng(0).standard_normal((args.n, args.dim)).astype(np.float32)

    fns: dict[str, Callable[[], Any]] = {
        "jdml knn (jit, blocked)": lambda: ours_knn(x, args.k),
        "sklearn brute": lambda: sklearn_knn(x, args.k),
    }
    try:
        import faiss
    except ImportError:
        print("faiss not installed")
    else:
        fns[f"faiss IndexFlatL2 ({faiss.__version__})"] = lambda: faiss_knn(faiss, x, args.k)
    timings = alternating_rounds(fns, args.repeats, pause=PAUSE_S)
    ours_t = timings["jdml knn (jit, blocked)"].median

    print(f"\nall-vs-all top-{args.k} kNN, self excluded (median of {args.repeats}):")
    print(f"{'method':<32}{'warm-up s':>11}{'median s':>10}{'ours / it':>11}")
    for name, timing in timings.items():
        warm, median = timing.first, timing.median
        print(f"{name:<32}{warm:>11.3f}{median:>10.3f}{ours_t / median:>11.2f}")
    # The work is the score matmuls, 2 N^2 (D + 1) flops; the selection adds no flops.
    flops = 2.0 * args.n * args.n * (args.dim + 1)
    print(throughput_line("jdml knn score matmuls", flops, ours_t, "float32"))

    outs = {name.split()[0]: timing.result for name, timing in timings.items()}
    ours, sk, fa = outs["jdml"], outs["sklearn"], outs.get("faiss")
    subset = np.random.default_rng(1).choice(args.n, 500, replace=False)
    truth = exact_neighbours(x, subset, args.k)
    print("\nneighbour sets agreeing (fraction of queries):")
    print(f"  jdml vs sklearn: {same_sets(ours, sk):.5f}")
    if fa is not None:
        print(f"  jdml vs faiss:   {same_sets(ours, fa):.5f}")
        print(f"  faiss vs float64 exact (500 queries): {same_sets(fa[subset], truth):.5f}")
    print(f"  jdml vs float64 exact (500 queries):  {same_sets(ours[subset], truth):.5f}")
    print(f"  sklearn vs float64 exact (500 queries): {same_sets(sk[subset], truth):.5f}")
    agree = same_sets(ours[subset], truth) == 1.0 and same_sets(ours, sk) >= 0.999
    print("  neighbour check:", "OK" if agree else "MISMATCH")

    emb, labels = clustered_embeddings(args.n, args.dim, args.classes, seed=2)
    max_class = int(np.bincount(labels).max())
    backends = resolve_backends()  # the kNN selection and k-means assignment of the evaluator
    parts = alternating_rounds(
        {
            "evaluate_embeddings (all metrics)": lambda: evaluate_embeddings(
                emb, labels, EVAL_METRICS
            ),
            f"  of which kNN, k={max_class}": lambda: knn(
                emb, emb, max_class, exclude_self=True, selection=backends.knn
            ),
            f"  of which k-means, {args.classes} clusters": lambda: kmeans(
                emb, args.classes, native=backends.native_kmeans
            ),
        },
        args.repeats,
        pause=PAUSE_S,
    )
    print(
        f"\n{', '.join(EVAL_METRICS)} on {args.n} x {args.dim} embeddings in {args.classes} "
        f"classes (median of {args.repeats}):"
    )
    print(f"{'step':<40}{'first call s':>14}{'median s':>10}")
    for name, timing in parts.items():
        print(f"{name:<40}{timing.first:>14.3f}{timing.median:>10.3f}")
    print(format_table({"clustered": parts["evaluate_embeddings (all metrics)"].result}))


if __name__ == "__main__":
    main()
