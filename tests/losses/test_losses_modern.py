"""ProxyAnchor, SupCon, NT-Xent, Circle, CosFace and Sub-center ArcFace against float64 NumPy
over explicit tuples (value and finite-difference gradients) and against pytorch-metric-learning's
recorded values and gradients (``tools/make_pml_fixtures.py``)."""

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
        pos = [
            np.exp(-alpha * (xi @ p - margin)) for xi, y in zip(x, labels, strict=True) if y == c
        ]
        neg = [np.exp(alpha * (xi @ p + margin)) for xi, y in zip(x, labels, strict=True) if y != c]
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


def np_circle(x, labels, margin=0.4, gamma=80.0) -> float:
    """The paper's eq. 6 per anchor; its weights a_p, a_n are constants (taken at ``weights_at``
    when given, as the gradient sees them)."""
    return _np_circle(x, labels, margin, gamma, None)


def _np_circle(x, labels, margin, gamma, weights_at) -> float:
    z = _unit(x)
    w = _unit(weights_at) if weights_at is not None else z
    per_anchor = []
    for i in range(len(z)):
        pos = [p for p in range(len(z)) if p != i and labels[p] == labels[i]]
        neg = [n for n in range(len(z)) if labels[n] != labels[i]]
        if not pos or not neg:
            continue
        sum_p = sum(
            np.exp(-gamma * max(1 + margin - w[i] @ w[p], 0) * (z[i] @ z[p] - 1 + margin))
            for p in pos
        )
        sum_n = sum(
            np.exp(gamma * max(w[i] @ w[n] + margin, 0) * (z[i] @ z[n] - margin)) for n in neg
        )
        per_anchor.append(np.log1p(sum_p * sum_n))
    return float(np.mean(per_anchor))


def np_cosface(x, labels, class_map, margin=0.35, scale=64.0) -> float:
    z, w = _unit(x), _unit(class_map)
    out = []
    for zi, y in zip(z, labels, strict=True):
        logits = scale * (w @ zi)
        logits[y] -= scale * margin
        out.append(-(logits[y] - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()))
    return float(np.mean(out))


def np_subcenter_arcface(x, labels, class_map, k=3, margin=0.5, scale=64.0) -> float:
    z, w = _unit(x), _unit(class_map)
    out = []
    for zi, y in zip(z, labels, strict=True):
        cos = np.array([max(w[c * k + j] @ zi for j in range(k)) for c in range(len(w) // k)])
        logits = scale * cos
        logits[y] = scale * np.cos(np.arccos(cos[y]) + margin)
        top = logits.max()
        out.append(-(logits[y] - top - np.log(np.sum(np.exp(logits - top)))))
    return float(np.mean(out))


def _numeric_grad(f, v: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(v)
    for idx in np.ndindex(v.shape):
        up, down = v.copy(), v.copy()
        up[idx] += eps
        down[idx] -= eps
        g[idx] = (f(up) - f(down)) / (2 * eps)
    return g


def _jdml(name: str, x, labels, weights=None, **kwargs):
    """jdml's loss value and gradients (embeddings, and its one parameter array, proxies or a
    class map, when ``weights`` sets it)."""
    loss = LOSSES.get(name)(**kwargs)
    x = jnp.asarray(x, jnp.float32)
    labels = jnp.asarray(labels)
    params = loss.init(jax.random.key(0), x, labels)
    if weights is not None:
        [key] = params["params"]
        params = {"params": {key: jnp.asarray(weights, jnp.float32)}}

    def value(params, x):
        return loss.apply(params, x, labels)[0]

    out, (g_params, g_x) = jax.value_and_grad(value, argnums=(0, 1))(params, x)
    g_weights = next(iter(g_params["params"].values())) if weights is not None else None
    return float(out), np.asarray(g_x), g_weights


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
        for name, kwargs in (("supcon", {}), ("ntxent", {}), ("circle", {}),
                             ("proxyanchor", {"num_classes": 8}), ("cosface", {"num_classes": 8}),
                             ("subcenter_arcface", {"num_classes": 8})):  # fmt: skip
            value, g_x, _ = _jdml(name, X * 1e3, labels, **kwargs)
            assert np.isfinite(value) and np.all(np.isfinite(g_x)), (name, labels)
    assert _jdml("supcon", X, np.arange(8))[0] == 0.0  # no anchor has a positive
    assert _jdml("ntxent", X, np.arange(8))[0] == 0.0
    assert _jdml("circle", X, np.arange(8))[0] == 0.0
    assert _jdml("ntxent", X, np.zeros(8, int))[0] == pytest.approx(0.0, abs=1e-6)  # no negative


CLASS_MAPS = {"cosface": {"num_classes": 5}, "subcenter_arcface": {"num_classes": 5}}


@pytest.mark.parametrize(
    "name", ["proxyanchor", "supcon", "ntxent", "circle", "cosface", "subcenter_arcface"]
)
def test_losses_match_pytorch_metric_learning(fixture, name):
    weights = {
        "proxyanchor": fixture["proxies"],
        "cosface": fixture.get("cosface:class_map"),
        "subcenter_arcface": fixture.get("subcenter_arcface:class_map"),
    }.get(name)
    kwargs = {"proxyanchor": {"num_classes": 5}, **CLASS_MAPS}.get(name, {})
    value, g_x, g_w = _jdml(name, fixture["x"], fixture["labels"], weights, **kwargs)
    assert value == pytest.approx(float(fixture[f"{name}:loss"]), rel=1e-5)
    scale = np.abs(fixture[f"{name}:grad_x"]).max()
    np.testing.assert_allclose(g_x, fixture[f"{name}:grad_x"], rtol=1e-5, atol=1e-5 * scale)
    if g_w is not None:
        ref = fixture[f"{name}:grad_params"]
        np.testing.assert_allclose(g_w, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_supcon_on_one_class_keeps_the_papers_value_where_pml_gives_zero(fixture):
    """A batch of one class has no negative pair: pytorch-metric-learning's SupConLoss then
    gives 0 and no gradient (it computes only when the batch holds a positive and a negative
    pair), while jdml keeps the paper's formula, equal to float64 NumPy, with its gradient (the
    one difference docs/usage.md's losses table states)."""
    one_class = np.zeros(len(fixture["x"]), int)
    assert float(fixture["supcon_one_class:loss"]) == 0.0
    assert not np.any(fixture["supcon_one_class:grad_x"])
    value, g_x, _ = _jdml("supcon", fixture["x"], one_class)
    assert value == pytest.approx(np_supcon(fixture["x"], one_class), rel=1e-5)
    assert value > np.log(len(one_class) - 1)  # the denominator's sum holds B - 1 terms
    np.testing.assert_allclose(
        g_x, _numeric_grad(lambda v: np_supcon(v, one_class), fixture["x"]), rtol=2e-4, atol=1e-5
    )


def test_circle_matches_numpy_with_constant_weights():
    # Small gamma keeps every exponent moderate, so the finite differences are exact enough.
    kwargs = {"gamma": 4.0}
    value, g_x, _ = _jdml("circle", X, LABELS, **kwargs)
    assert value == pytest.approx(np_circle(X, LABELS, gamma=4.0), rel=1e-5)
    # The weights a_p, a_n are held at the point of evaluation while the similarities vary.
    numeric = _numeric_grad(lambda v: _np_circle(v, LABELS, 0.4, 4.0, X), X)
    np.testing.assert_allclose(g_x, numeric, rtol=2e-4, atol=1e-5)


@pytest.mark.parametrize("name, reference, rows", [
    ("cosface", np_cosface, 5), ("subcenter_arcface", np_subcenter_arcface, 15)])  # fmt: skip
def test_class_map_losses_match_numpy(name, reference, rows):
    # A small scale keeps the softmax away from saturation for the finite differences.
    w = np.random.default_rng(9).standard_normal((rows, 4))
    value, g_x, g_w = _jdml(name, X, LABELS, w, num_classes=5, scale=4.0)
    assert value == pytest.approx(reference(X, LABELS, w, scale=4.0), rel=1e-5)
    np.testing.assert_allclose(
        g_x, _numeric_grad(lambda v: reference(v, LABELS, w, scale=4.0), X), rtol=2e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        g_w, _numeric_grad(lambda v: reference(X, LABELS, v, scale=4.0), w), rtol=2e-4, atol=1e-5
    )


def test_proxyanchor_proxies_start_he_normal_over_the_classes():
    loss = LOSSES.get("proxyanchor")(num_classes=400)
    params = loss.init(jax.random.key(0), jnp.ones((2, 300)), jnp.array([0, 1]))
    proxies = np.asarray(params["params"]["proxies"])
    assert proxies.shape == (400, 300)
    assert proxies.std() == pytest.approx(np.sqrt(2 / 400), rel=0.02)


def np_hypvit_sphere(x, classes: int, views: int, temperature=0.1) -> float:
    """The Hyp-ViT code's sphere-mode loss, step by step: the (classes * views) batch as a
    (classes, views) grid, and for each ordered pair of views (i, j) a cross entropy whose row c
    holds [z_ci . z_c'j for every c', z_ci . z_c'i for c' != c] / tau with target c'= c; the
    per-pair means summed."""
    z = _unit(x).reshape(classes, views, -1)
    total = 0.0
    for i in range(views):
        for j in range(views):
            if i == j:
                continue
            x0, x1 = z[:, i], z[:, j]
            same_view = x0 @ x0.T / temperature - np.eye(classes) * 1e9
            logits = np.concatenate([x0 @ x1.T / temperature, same_view], axis=1)
            logits -= logits.max(axis=1, keepdims=True)
            log_prob = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
            total += -np.mean(log_prob[np.arange(classes), np.arange(classes)])
    return total


@pytest.mark.parametrize("classes, views", [(4, 2), (3, 3), (2, 4)])
def test_ntxent_slot_pairs_is_the_hyp_vit_loss(classes, views):
    x = np.random.default_rng(classes * 10 + views).standard_normal((classes * views, 5))
    labels = np.repeat(np.arange(classes), views)
    value, g_x, _ = _jdml("ntxent", x, labels, slot_pairs=True)
    assert value == pytest.approx(np_hypvit_sphere(x, classes, views), rel=1e-5)
    np.testing.assert_allclose(
        g_x,
        _numeric_grad(lambda v: np_hypvit_sphere(v, classes, views), x),
        rtol=2e-4,
        atol=1e-5,
    )
    # Two views: the negatives of every pair are the whole rest of the batch, and the sum over
    # the two slot pairs is twice the mean over the positive pairs.
    if views == 2:
        assert value == pytest.approx(2 * _jdml("ntxent", x, labels)[0], rel=1e-5)


def test_ntxent_slots_follow_the_order_within_each_class():
    """Slots count the earlier samples of the same class, so interleaving the classes, and
    keeping each class's order, leaves the loss unchanged."""
    classes, views = 3, 3
    x = np.random.default_rng(1).standard_normal((classes * views, 5))
    labels = np.repeat(np.arange(classes), views)
    order = np.argsort(np.tile(np.arange(views), classes), kind="stable")  # view-major
    grouped = _jdml("ntxent", x, labels, slot_pairs=True)[0]
    assert _jdml("ntxent", x[order], labels[order], slot_pairs=True)[0] == pytest.approx(
        grouped, rel=1e-6
    )


def test_ntxent_slot_pairs_edge_cases_are_finite():
    """No negative, no positive, classes of unequal sizes, and logits far apart (tau 0.001: the
    per-slot sums are each shifted by their own maximum)."""
    cases = (np.zeros(8, int), np.arange(8), np.array([0, 0, 0, 1, 1, 2, 3, 3]))
    for labels in cases:
        for tau in (0.1, 1e-3):
            value, g_x, _ = _jdml("ntxent", X, labels, slot_pairs=True, temperature=tau)
            assert np.isfinite(value) and np.all(np.isfinite(g_x)), (labels, tau)
    assert _jdml("ntxent", X, np.arange(8), slot_pairs=True)[0] == 0.0
    # Unequal classes: each slot pair averages over its own pairs (slot pair (0, 2): class 0's
    # one pair alone), checked against the per-pair formula.
    labels = cases[2]
    z = _unit(X)
    slots = np.array([0, 1, 2, 0, 1, 0, 0, 1])
    terms: dict[tuple[int, int], list[float]] = {}
    for a in range(8):
        for p in range(8):
            if a == p or labels[a] != labels[p]:
                continue
            pair = (slots[a], slots[p])
            negs = [n for n in range(8) if labels[n] != labels[a] and slots[n] in pair]
            e = np.exp(z[a] @ z.T / 0.1)
            terms.setdefault(pair, []).append(-np.log(e[p] / (e[p] + e[negs].sum())))
    expected = sum(np.mean(v) for v in terms.values())
    assert _jdml("ntxent", X, labels, slot_pairs=True)[0] == pytest.approx(expected, rel=1e-5)
