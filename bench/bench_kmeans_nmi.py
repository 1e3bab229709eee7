"""NMI and F1 of the same embeddings under each ``eval.kmeans`` choice.

Synthetic embeddings: 100 classes of 30 points, each a unit class centre in 128-d plus Gaussian
noise, L2-normalised. Prints NMI and F1 (%) for ``k-means++``, ``reference`` (faiss's algorithm)
and ``random``.

Usage: python bench/bench_kmeans_nmi.py [--noise 0.08] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

from jdml.evaluation.embeddings import evaluate_embeddings


def embeddings(noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(3000, 128) L2-normalised points of 100 classes, and their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(100, 128))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = np.repeat(np.arange(100), 30)
    x = centres[labels] + noise * rng.normal(size=(len(labels), 128))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--noise", type=float, default=0.08)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    x, labels = embeddings(args.noise, args.seed)
    print("| eval.kmeans | NMI | F1 |\n|---|---|---|")
    for init in ("k-means++", "reference", "random"):
        out = evaluate_embeddings(x, labels, ["nmi", "f1"], kmeans_init=init)
        print(f"| {init} | {100 * out['nmi']:.1f} | {100 * out['f1']:.1f} |")


if __name__ == "__main__":
    main()
