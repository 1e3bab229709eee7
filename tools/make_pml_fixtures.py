"""Records pytorch-metric-learning's values and gradients of the losses jdml shares with it.

For each loss, on one fixed float64 batch (and, for a loss with class proxies, fixed float64
proxies), the value pytorch-metric-learning computes and its gradients with respect to the
embeddings (and the proxies) go to ``tests/golden/losses/pml.npz``;
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


def fixture_batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(12, 6) float64 embeddings, :data:`LABELS` and (5, 6) float64 proxies."""
    rng = np.random.default_rng(20261205)
    x = rng.standard_normal((BATCH, DIM))
    proxies = rng.standard_normal((CLASSES, DIM)) * 0.5
    return x, LABELS.copy(), proxies


# name: (pytorch-metric-learning class name, its keyword arguments, whether it has proxies)
LOSSES = {
    "proxyanchor": ("ProxyAnchorLoss", {"margin": 0.1, "alpha": 32}, True),
    "supcon": ("SupConLoss", {"temperature": 0.1}, False),
    "ntxent": ("NTXentLoss", {"temperature": 0.1}, False),
}


def main() -> None:
    import torch
    from pytorch_metric_learning import losses

    torch.set_default_dtype(torch.float64)
    x, labels, proxies = fixture_batch()
    arrays = {"x": x, "labels": labels, "proxies": proxies}
    for name, (cls, kwargs, has_proxies) in LOSSES.items():
        if has_proxies:
            loss_fn = getattr(losses, cls)(num_classes=CLASSES, embedding_size=DIM, **kwargs)
            loss_fn.proxies.data = torch.tensor(proxies)
        else:
            loss_fn = getattr(losses, cls)(**kwargs)
        emb = torch.tensor(x, requires_grad=True)
        value = loss_fn(emb, torch.tensor(labels))
        value.backward()
        arrays[f"{name}:loss"] = value.detach().numpy()
        arrays[f"{name}:grad_x"] = emb.grad.numpy()
        if has_proxies:
            arrays[f"{name}:grad_proxies"] = loss_fn.proxies.grad.numpy()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    np.savez(OUT, **arrays)
    print(f"wrote {OUT}: {', '.join(LOSSES)}")


if __name__ == "__main__":
    main()
