"""Cost of the batch samplers per batch, against the time of a training step.

The embedding-driven samplers select a whole epoch at its start; their cost per batch is the
epoch's selection time divided by its number of batches (the first epoch, which compiles the
kernels, is reported apart). The minimum over repeated epochs is the figure least disturbed by
other processes on the machine; compare it with a train step timed the same way. The memory is a
synthetic set of L2-normalised embeddings (class centres plus noise). Example:

    python bench/bench_samplers.py --train-step-ms 100
    python bench/bench_samplers.py --num-train 5000 --samplers greedy_coreset fid_batchmatch
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from jdml.samplers import SAMPLERS, Sampler

ALL_SAMPLERS = (
    "class_random",
    "full_random",
    "greedy_coreset",
    "d2_coreset",
    "disthist_batchmatch",
    "fid_batchmatch",
)


def synthetic_memory(
    num_train: int, dim: int, num_classes: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and L2-normalised (num_train, dim) float32 embeddings clustered by class."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=num_train)
    centres = rng.normal(size=(num_classes, dim))
    x = centres[labels] + 0.7 * rng.normal(size=(num_train, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return labels, x.astype(np.float32)


def run_epoch(sampler: Sampler, memory: jax.Array, epoch: int) -> None:
    """All batches of one epoch: ``epoch_batches`` or one ``batch(step)`` per step."""
    if sampler.needs_memory:
        sampler.epoch_batches(epoch, memory)
        return
    for step in range(sampler.steps_per_epoch):
        sampler.batch(epoch * sampler.steps_per_epoch + step)


def time_samplers(
    samplers: dict[str, Sampler], memory: jax.Array, repeats: int
) -> dict[str, tuple[float, list[float]]]:
    """Seconds of the first epoch (with compilation) and of ``repeats`` further epochs.

    The samplers take turns, epoch after epoch, so that a change in the machine's load (other
    processes) affects them alike; the minimum over repeats is the least disturbed figure.
    """
    times: dict[str, tuple[float, list[float]]] = {}
    for name, sampler in samplers.items():
        start = time.perf_counter()
        run_epoch(sampler, memory, 0)
        times[name] = (time.perf_counter() - start, [])
    for epoch in range(1, repeats + 1):
        for name, sampler in samplers.items():
            start = time.perf_counter()
            run_epoch(sampler, memory, epoch)
            times[name][1].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-train", type=int, default=25_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--num-classes", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=112)
    parser.add_argument("--samples-per-class", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed epochs after the first")
    parser.add_argument(
        "--train-step-ms", type=float, default=100.0, help="measured train-step time to compare to"
    )
    parser.add_argument("--samplers", nargs="+", default=list(ALL_SAMPLERS), choices=ALL_SAMPLERS)
    args = parser.parse_args()

    labels, memory = synthetic_memory(args.num_train, args.dim, args.num_classes, seed=0)
    memory = jax.device_put(memory)
    samplers = {
        name: SAMPLERS.get(name)(
            labels, batch_size=args.batch_size, samples_per_class=args.samples_per_class, seed=0
        )
        for name in args.samplers
    }
    times = time_samplers(samplers, memory, args.repeats)
    steps = len(labels) // args.batch_size
    print(
        f"N={args.num_train} D={args.dim} B={args.batch_size} SPC-{args.samples_per_class}: "
        f"{steps} batches per epoch; train step {args.train_step_ms:.1f} ms; "
        f"backend {jax.default_backend()}; {args.repeats} timed epochs each"
    )
    print(
        f"{'sampler':<21}{'1st epoch s':>12}{'epoch s':>9}{'ms/batch min':>14}"
        f"{'median':>8}{'min / step':>12}"
    )
    for name, (first, rest) in times.items():
        best, median = 1000 * min(rest) / steps, 1000 * statistics.median(rest) / steps
        print(
            f"{name:<21}{first:>12.2f}{min(rest):>9.2f}{best:>14.2f}{median:>8.2f}"
            f"{best / args.train_step_ms:>12.1%}"
        )


if __name__ == "__main__":
    main()
