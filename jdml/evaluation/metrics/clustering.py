"""Clustering metrics from the k-means assignments: NMI and the pair-counting F1."""

from __future__ import annotations

import numpy as np

from jdml.evaluation.metrics.base import Requirements, required


def _assignments(requirements: Requirements) -> np.ndarray:
    """The (N,) cluster assignments, with an error if they were not computed."""
    return required(requirements.cluster_assignments, "cluster assignments")


def nmi(requirements: Requirements) -> float:
    """Normalised mutual information between the labels and the k-means clusters.

    Clustering quality as in Song et al. (CVPR 2016): k-means with as many clusters as there
    are classes in the evaluated set, then NMI(labels, clusters) = I / mean(H(labels),
    H(clusters)) (arithmetic normalisation).

    Args:
      requirements: shared requirements with (N,) ``cluster_assignments``.

    Returns:
      NMI in [0, 1].
    """
    from sklearn.metrics import normalized_mutual_info_score  # 1.7 s to import: at first use

    return float(
        normalized_mutual_info_score(
            requirements.labels, _assignments(requirements), average_method="arithmetic"
        )
    )


def _pairs(counts: np.ndarray) -> float:
    """sum of C(n, 2) = n (n - 1) / 2 over the counts, in float64."""
    counts = counts.astype(np.float64)
    return float(np.sum(counts * (counts - 1.0) / 2.0))


def f1(requirements: Requirements) -> float:
    """Pair-counting F1 of the k-means clustering (the "f1" metric of Roth et al., ICML 2020,
    following Song et al., "Deep metric learning via facility location", CVPR 2017).

    With n_ck the number of samples of class c in cluster k, n_c the class sizes and m_k the
    cluster sizes: TP = sum_{c,k} C(n_ck, 2) (same-class pairs put in the same cluster),
    P = TP / sum_c C(n_c, 2), R = TP / sum_k C(m_k, 2) and F1 = 2 P R / (P + R) (symmetric in
    P and R, so which is called precision does not matter). Computed from the sparse
    contingency counts, O(N log N). F1 = 0 when TP = 0 (this includes the degenerate cases of
    no same-class or no same-cluster pair).

    Args:
      requirements: shared requirements with (N,) ``cluster_assignments``.

    Returns:
      F1 in [0, 1].
    """
    labels = requirements.labels.astype(np.int64)
    clusters = _assignments(requirements).astype(np.int64)
    _, joint = np.unique(labels * (clusters.max() + 1) + clusters, return_counts=True)
    tp = _pairs(joint)
    if tp == 0.0:
        return 0.0
    precision = tp / _pairs(np.bincount(labels))
    recall = tp / _pairs(np.bincount(clusters))
    return float(2.0 * precision * recall / (precision + recall))
