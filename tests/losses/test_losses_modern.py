"""ProxyAnchor, SupCon and NT-Xent against float64 NumPy over explicit tuples (value and
finite-difference gradients) and against pytorch-metric-learning's recorded values and gradients
(``tools/make_pml_fixtures.py``)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.losses import LOSSES
from tests.helpers import REPO

PML = os.path.join(REPO, "tests", "golden", "losses", "pml.npz")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def np_proxyanchor(x, labels, proxies, alpha=32.0, margin=0.1) -> float:
    """The paper's eq. 4, proxy by proxy and sample by sample."""
    x, proxies = _unit(x), _unit(proxies)
    pos_terms, neg_terms = [], []
    for c, p in enumerate(proxies):
        pos = [np.exp(-alpha * (xi @ p - margin)) for xi, y in zip(x, labels) if y == c]
        neg = [np.exp(alpha * (xi @ p + margin)) for xi, y in zip(x, labels) if y != c]
        if pos:
            pos_terms.append(np.log1p(sum(pos)))
        neg_terms.append(np.log1p(sum(neg)))
    return sum(pos_terms) / len(pos_terms) + sum(neg_terms) / len(proxies)


def np_supcon(x, labels, temperature=0.1) -> float:
    z = _unit(x)
    per_anchor = []
    for i in range(len(z)):
        others = [a for a in range(len(z)) if a != i]
        positives = [p for p in others if labels[p] == labels[i]]
        if not positives:
            continue
        log_den = np.log(sum(np.exp(z[i] @ z[a] / temperature) for a in others))
        per_anchor.append(-np.mean([z[i] @ z[p] / temperature - log_den for p in positives]))
    return float(np.mean(per_anchor))


def np_ntxent(x, labels, temperature=0.1) -> float:
    z = _unit(x)
    per_pair = []
    for a in range(len(z)):
        negatives = [n for n in range(len(z)) if labels[n] != labels[a]]
        for p in range(len(z)):
            if p == a or labels[p] != labels[a]:
                continue
            num = np.exp(z[a] @ z[p] / temperature)
            den = num + sum(np.exp(z[a] @ z[n] / temperature) for n in negatives)
            per_pair.append(-np.log(num / den))
    return float(np.mean(per_pair))


def _numeric_grad(f, v: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(v)
    for idx in np.ndindex(v.shape):
        up, down = v.copy(), v.copy()
        up[idx] += eps
        down[idx] -= eps
        g[idx] = (f(up) - f(down)) / (2 * eps)
    return g


def _jdml(name: str, x, labels, proxies=None, **kwargs):
    """jdml's loss value and gradients (embeddings, and proxies where the loss has them)."""
    loss = LOSSES.get(name)(**kwargs)
    x = jnp.asarray(x, jnp.float32)
    labels = jnp.asarray(labels)
    params = loss.init(jax.random.key(0), x, labels)
    if proxies is not None:
        params = {"params": {"proxies": jnp.asarray(proxies, jnp.float32)}}

    def value(params, x):
        return loss.apply(params, x, labels)[0]

    out, (g_params, g_x) = jax.value_and_grad(value, argnums=(0, 1))(params, x)
    g_proxies = g_params["params"]["proxies"] if proxies is not None else None
    return float(out), np.asarray(g_x), g_proxies


@pytest.fixture(scope="module")
def fixture():
    with np.load(PML) as f:
        return {k: f[k] for k in f.files}


# Hand-made batches: a proxy whose class is absent (4), an anchor without a positive (class 2).
LABELS = np.array([0, 0, 1, 1, 1, 2, 3, 3])
X = np.random.default_rng(7).standard_normal((8, 4))
PROXIES = np.random.default_rng(8).standard_normal((5, 4))


def test_proxyanchor_matches_numpy():
    value, g_x, g_p = _jdml("proxyanchor", X, LABELS, PROXIES, num_classes=5)
    assert value == pytest.approx(np_proxyanchor(X, LABELS, PROXIES), rel=1e-5)
    np.testing.assert_allclose(
        g_x, _numeric_grad(lambda v: np_proxyanchor(v, LABELS, PROXIES), X), rtol=2e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        g_p, _numeric_grad(lambda v: np_proxyanchor(X, LABELS, v), PROXIES), rtol=2e-4, atol=1e-5
    )


@pytest.mark.parametrize("name, reference", [("supcon", np_supcon), ("ntxent", np_ntxent)])
def test_contrastive_losses_match_numpy(name, reference):
    value, g_x, _ = _jdml(name, X, LABELS)
    assert value == pytest.approx(reference(X, LABELS), rel=1e-5)
    np.testing.assert_allclose(
        g_x, _numeric_grad(lambda v: reference(v, LABELS), X), rtol=2e-4, atol=1e-5
    )


def test_ntxent_is_supcon_with_one_positive_per_anchor():
    pairs = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    assert _jdml("ntxent", X, pairs)[0] == pytest.approx(_jdml("supcon", X, pairs)[0], rel=1e-6)
    # With more positives the two differ: NT-Xent leaves the other positives out of the sum.
    assert _jdml("ntxent", X, LABELS)[0] != pytest.approx(_jdml("supcon", X, LABELS)[0], rel=1e-3)


def test_edge_cases_are_finite():
    """One class in the batch (no negative), every sample alone in its class (no positive), and
    a scaled-up batch: finite values and gradients."""
    for labels in (np.zeros(8, int), np.arange(8)):
        for name, kwargs in (("supcon", {}), ("ntxent", {}), ("proxyanchor", {"num_classes": 8})):
            value, g_x, _ = _jdml(name, X * 1e3, labels, **kwargs)
            assert np.isfinite(value) and np.all(np.isfinite(g_x)), (name, labels)
    assert _jdml("supcon", X, np.arange(8))[0] == 0.0  # no anchor has a positive
    assert _jdml("ntxent", X, np.arange(8))[0] == 0.0
    assert _jdml("ntxent", X, np.zeros(8, int))[0] == pytest.approx(0.0, abs=1e-6)  # no negative


@pytest.mark.parametrize("name", ["proxyanchor", "supcon", "ntxent"])
def test_losses_match_pytorch_metric_learning(fixture, name):
    kwargs = {"num_classes": 5} if name == "proxyanchor" else {}
    proxies = fixture["proxies"] if name == "proxyanchor" else None
    value, g_x, g_p = _jdml(name, fixture["x"], fixture["labels"], proxies, **kwargs)
    assert value == pytest.approx(float(fixture[f"{name}:loss"]), rel=1e-5)
    scale = np.abs(fixture[f"{name}:grad_x"]).max()
    np.testing.assert_allclose(g_x, fixture[f"{name}:grad_x"], rtol=1e-5, atol=1e-5 * scale)
    if g_p is not None:
        ref = fixture[f"{name}:grad_proxies"]
        np.testing.assert_allclose(g_p, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_proxyanchor_proxies_start_he_normal_over_the_classes():
    loss = LOSSES.get("proxyanchor")(num_classes=400)
    params = loss.init(jax.random.key(0), jnp.ones((2, 300)), jnp.array([0, 1]))
    proxies = np.asarray(params["params"]["proxies"])
    assert proxies.shape == (400, 300)
    assert proxies.std() == pytest.approx(np.sqrt(2 / 400), rel=0.02)
