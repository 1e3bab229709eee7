"""Records pytorch-metric-learning's values and gradients of the losses jdml shares with it.

For each loss, on one fixed float64 batch (and, for a loss with class proxies or class weights,
fixed float64 ones), the value pytorch-metric-learning computes and its gradients with respect
to the embeddings (and the proxies or class maps) go to ``tests/golden/losses/pml.npz``;
``tests/losses/test_losses_modern.py`` compares jdml's losses with them. The hyperparameters
are set explicitly to jdml's defaults where pytorch-metric-learning's differ (docs/usage.md,
"Losses and their papers", lists the differences).

torch and pytorch-metric-learning are not jdml dependencies; run this in a separate
environment:

  python3 -m venv /work/refenv
  /work/refenv/bin/pip install torch==2.14.1 pytorch-metric-learning==2.9.0
  /work/refenv/bin/python tools/make_pml_fixtures.py
"""

from __future__ import annotations

import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "losses", "pml.npz")
BATCH, DIM, CLASSES = 12, 6, 5


# Three samples of classes 0 and 1, one of class 2 (an anchor without a positive), five of
# class 3, and none of class 4 (a proxy without a sample in the batch).
LABELS = np.array([0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 3])


SUB_CENTERS = 3


def fixture_batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(12, 6) float64 embeddings, :data:`LABELS` and (5, 6) float64 proxies."""
    rng = np.random.default_rng(20261205)
    x = rng.standard_normal((BATCH, DIM))
    proxies = rng.standard_normal((CLASSES, DIM)) * 0.5
    return x, LABELS.copy(), proxies


def class_maps() -> dict[str, np.ndarray]:
    """The float64 class maps of the classification losses, jdml's layout: (C, D), and
    (C * K, D) for the sub-centers (class c's in rows c K to c K + K - 1)."""
    rng = np.random.default_rng(20261206)
    return {
        "cosface": rng.standard_normal((CLASSES, DIM)),
        "subcenter_arcface": rng.standard_normal((CLASSES * SUB_CENTERS, DIM)),
    }


# name: (pytorch-metric-learning class name, its keyword arguments, whether it has proxies)
# (pytorch-metric-learning's ArcFace margins are in degrees: 0.5 rad is 28.65, its default 28.6)
LOSSES = {
    "proxyanchor": ("ProxyAnchorLoss", {"margin": 0.1, "alpha": 32}, "proxies"),
    "supcon": ("SupConLoss", {"temperature": 0.1}, None),
    "ntxent": ("NTXentLoss", {"temperature": 0.1}, None),
    "circle": ("CircleLoss", {"m": 0.4, "gamma": 80}, None),
    "cosface": ("CosFaceLoss", {"margin": 0.35, "scale": 64}, "W"),
    "subcenter_arcface": (
        "SubCenterArcFaceLoss",
        {"margin": float(np.degrees(0.5)), "scale": 64, "sub_centers": SUB_CENTERS},
        "W",
    ),
}


def main() -> None:
    import torch
    from pytorch_metric_learning import losses

    torch.set_default_dtype(torch.float64)
    x, labels, proxies = fixture_batch()
    maps = class_maps()
    arrays = {"x": x, "labels": labels, "proxies": proxies}
    arrays.update({f"{name}:class_map": value for name, value in maps.items()})
    for name, (cls, kwargs, weights) in LOSSES.items():
        if weights is None:
            loss_fn = getattr(losses, cls)(**kwargs)
        else:
            loss_fn = getattr(losses, cls)(num_classes=CLASSES, embedding_size=DIM, **kwargs)
        if weights == "proxies":
            loss_fn.proxies.data = torch.tensor(proxies)
        elif weights == "W":  # (D, C[*K]): the transpose of jdml's class map
            loss_fn.W.data = torch.tensor(maps[name].T.copy())
        emb = torch.tensor(x, requires_grad=True)
        value = loss_fn(emb, torch.tensor(labels))
        value.backward()
        arrays[f"{name}:loss"] = value.detach().numpy()
        arrays[f"{name}:grad_x"] = emb.grad.numpy()
        if weights == "proxies":
            arrays[f"{name}:grad_params"] = loss_fn.proxies.grad.numpy()
        elif weights == "W":
            arrays[f"{name}:grad_params"] = loss_fn.W.grad.numpy().T
    # A batch of one class (no negative pair anywhere): pytorch-metric-learning's SupConLoss
    # computes only when the batch holds a positive and a negative pair, so it gives 0 and no
    # gradient where the paper's formula (jdml's) gives its positive value.
    emb = torch.tensor(x, requires_grad=True)
    value = losses.SupConLoss(**LOSSES["supcon"][1])(emb, torch.zeros(BATCH, dtype=torch.long))
    value.backward()
    arrays["supcon_one_class:loss"] = value.detach().numpy()
    arrays["supcon_one_class:grad_x"] = emb.grad.numpy()
    # Every target angle is below pi - m, where pytorch-metric-learning's ArcFace switches to
    # cos(theta) - m sin(m) and jdml keeps the paper's cos(theta + m).
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    w = maps["subcenter_arcface"] / np.linalg.norm(maps["subcenter_arcface"], axis=1, keepdims=True)
    cos = (z @ w.T).reshape(BATCH, CLASSES, SUB_CENTERS).max(axis=2)[np.arange(BATCH), labels]
    assert np.all(np.arccos(cos) < np.pi - 0.5), "a target angle beyond pi - m: draw again"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    np.savez(OUT, **arrays)
    print(f"wrote {OUT}: {', '.join(LOSSES)}")


if __name__ == "__main__":
    main()
