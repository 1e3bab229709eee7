"""The margin loss's divisors and the quadruplet loss's reference term against explicit NumPy.

The margin references loop over explicit triplets; the quadruplet reference builds the (B, 1, D)
and (B, D) arrays of the Revisiting code and lets NumPy broadcast them. Neither shares code with
the losses. Gradients are checked against float64 central differences of the references.
"""

from __future__ import annotations

import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.config import base_config, metric_term
from jdml.losses import LOSSES
from jdml.losses.margin import MarginLoss
from jdml.methods.terms.metric import loss_kwargs
from jdml.miners import Tuples
from tests.helpers import central_differences

NUM_CLASSES = 5
EPS_D = 1e-8  # the margin loss's distance guard sqrt(|x - y|^2 + eps)


def _tuples(a, p, n, valid) -> Tuples:
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return Tuples(i32(a), i32(p), i32(n), jnp.asarray(valid, bool))


# ----------------------------------------------------------------------------- margin


def np_margin(x, labels, tup, beta, *, margin=0.2, nu=0.0, reference_pair_count=False) -> float:
    """The margin loss by a loop over the valid triplets, with either divisor.

    Terms: #{pos > 0} + #{neg > 0} (Wu et al.); reference: #{pos > 0 or neg > 0}, the bool-tensor
    sum of the Revisiting code. A zero count leaves the numerator undivided.
    """
    x, beta = np.asarray(x, np.float64), np.asarray(beta, np.float64)
    total, reg, terms, triplets = 0.0, 0.0, 0, 0
    for i, j, k, v in zip(*tup, strict=True):
        if not v:
            continue
        b = float(beta) if beta.ndim == 0 else beta[labels[i]]
        d_ap = math.sqrt(float(np.sum((x[i] - x[j]) ** 2)) + EPS_D)
        d_an = math.sqrt(float(np.sum((x[i] - x[k]) ** 2)) + EPS_D)
        pos, neg = max(d_ap - b + margin, 0.0), max(b - d_an + margin, 0.0)
        total += pos + neg
        reg += b
        terms += int(pos > 0) + int(neg > 0)  # ints: numpy bools would add as a logical OR
        triplets += int(pos > 0 or neg > 0)
    count = triplets if reference_pair_count else terms
    numerator = total + nu * reg
    return numerator / count if count else numerator


_MARGIN_CACHE: dict = {}


def margin_fns(**fields):
    """Jitted (loss, metrics) and d loss / d (params, x) of a MarginLoss, cached per fields."""
    key = tuple(sorted(fields.items()))
    if key not in _MARGIN_CACHE:
        module = MarginLoss(num_classes=NUM_CLASSES, **fields)
        apply = jax.jit(module.apply)
        grad = jax.jit(jax.grad(lambda prm, x, y, t: module.apply(prm, x, y, t)[0], (0, 1)))
        _MARGIN_CACHE[key] = (apply, grad)
    return _MARGIN_CACHE[key]


def margin_params(beta) -> dict:
    return {"params": {"beta": jnp.asarray(beta, jnp.float32)}}


def random_margin_batch(seed: int):
    """B = 12 unit vectors, labels in pairs, one triplet per anchor, two invalid rows whose
    garbage indices (a positive of another class, the anchor as negative) would be active."""
    rng = np.random.default_rng(seed)
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 0, 1])
    x = rng.normal(size=(12, 6))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    a = np.arange(12)
    p = np.array([1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 0, 2])
    n = (a + 3 + rng.integers(0, 6, size=12)) % 12
    n = np.where(labels[n] == labels[a], (n + 2) % 12, n)
    valid = labels[n] != labels[a]
    valid[[3, 8]] = False
    p[3], n[8] = 9, 8  # garbage in invalid rows
    beta = 1.0 + 0.3 * rng.normal(size=NUM_CLASSES)
    return x.astype(np.float32), labels, (a, p, n, valid), beta.astype(np.float32)


@pytest.mark.parametrize("reference_pair_count", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_margin_divisor_value_and_gradients_match_numpy(seed, reference_pair_count):
    x, labels, tup, beta = random_margin_batch(seed)
    apply, grad = margin_fns(reference_pair_count=reference_pair_count)
    t = _tuples(*tup)
    loss, _ = apply(margin_params(beta), jnp.asarray(x), jnp.asarray(labels), t)
    kw = {"reference_pair_count": reference_pair_count}
    want = np_margin(x, labels, tup, beta, **kw)
    np.testing.assert_allclose(loss, want, rtol=2e-6)
    dparams, dx = grad(margin_params(beta), jnp.asarray(x), jnp.asarray(labels), t)
    want_dx = central_differences(lambda v: np_margin(v, labels, tup, beta, **kw), x)
    want_dbeta = central_differences(lambda b: np_margin(x, labels, tup, b, **kw), beta)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(dparams["params"]["beta"], want_dbeta, rtol=1e-4, atol=2e-6)


def test_margin_divisors_differ_on_a_mixed_batch():
    x, labels, tup, beta = random_margin_batch(0)
    t = _tuples(*tup)
    terms = margin_fns(reference_pair_count=False)[0](margin_params(beta), x, labels, t)[0]
    pairs = margin_fns(reference_pair_count=True)[0](margin_params(beta), x, labels, t)[0]
    ratio = float(pairs / terms)
    assert 1.0 < ratio < 2.0, ratio


def test_margin_hand_counted():
    # margin 0.2, beta 1 (class 0) and 1.4 (class 1):
    # (0, 1, 2): d_ap 0.5, d_an 2 -> no active term;
    # (1, 0, 3): d_ap 0.5, d_an 0.3 -> neg 1 - 0.3 + 0.2 = 0.9 only;
    # (2, 3, 1): d_ap sqrt(2.34), d_an 1.5 -> pos sqrt(2.34) - 1.2 and neg 1.6 - 1.5, both.
    x = np.float32([[0.0, 0.0], [0.5, 0.0], [2.0, 0.0], [0.5, 0.3]])
    labels = np.array([0, 0, 1, 1])
    tup = ([0, 1, 2], [1, 0, 3], [2, 3, 1], [True, True, True])
    beta = np.float32([1.0, 1.4, 1.0, 1.0, 1.0])
    hinge = 0.9 + (math.sqrt(2.34) - 1.2) + (1.6 - 1.5)
    t = _tuples(*tup)
    for reference, count in [(False, 3), (True, 2)]:
        apply, _ = margin_fns(reference_pair_count=reference)
        loss, metrics = apply(margin_params(beta), x, labels, t)
        np.testing.assert_allclose(loss, hinge / count, rtol=1e-5)
        np.testing.assert_allclose(metrics["active_fraction"], 3 / 6)  # terms, either way


def test_margin_both_terms_active_gives_exactly_twice():
    # distances about sqrt(2) between random 256-d unit vectors; beta 1.41 activates both terms
    rng = np.random.default_rng(5)
    x = rng.normal(size=(10, 256))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    labels = np.repeat(np.arange(5), 2)
    tup = (np.arange(10), np.arange(10) ^ 1, (np.arange(10) + 2) % 10, np.ones(10, bool))
    beta = np.full(NUM_CLASSES, 1.41, np.float32)
    t = _tuples(*tup)
    _, metrics = margin_fns()[0](margin_params(beta), x, labels, t)
    assert float(metrics["active_fraction"]) == 1.0
    terms = margin_fns(reference_pair_count=False)[0](margin_params(beta), x, labels, t)[0]
    pairs = margin_fns(reference_pair_count=True)[0](margin_params(beta), x, labels, t)[0]
    np.testing.assert_allclose(pairs, 2 * terms, rtol=1e-7)
    np.testing.assert_allclose(pairs, np_margin(x, labels, tup, beta, reference_pair_count=True))


@pytest.mark.parametrize("reference_pair_count", [False, True])
def test_margin_no_active_triplet_gives_zero(reference_pair_count):
    # classes on orthogonal axes: d_ap ~ 0 < beta - margin, d_an = sqrt(2) > beta + margin
    labels = np.repeat(np.arange(5), 2)
    x = np.eye(5, 6, dtype=np.float32)[labels]
    tup = (np.arange(10), np.arange(10) ^ 1, (np.arange(10) + 2) % 10, np.ones(10, bool))
    beta = np.ones(NUM_CLASSES, np.float32)
    t = _tuples(*tup)
    apply, grad = margin_fns(reference_pair_count=reference_pair_count)
    loss, metrics = apply(margin_params(beta), x, labels, t)
    assert float(loss) == 0.0 and float(metrics["active_fraction"]) == 0.0
    dparams, dx = grad(margin_params(beta), x, labels, t)
    assert not np.any(np.asarray(dx)) and not np.any(np.asarray(dparams["params"]["beta"]))
    # the nu term stays, undivided (count 0 -> 1), with either divisor
    apply_nu, _ = margin_fns(reference_pair_count=reference_pair_count, nu=0.1)
    loss_nu, _ = apply_nu(margin_params(beta), x, labels, t)
    np.testing.assert_allclose(loss_nu, 0.1 * 10, rtol=1e-6)


@pytest.mark.parametrize("reference_pair_count", [False, True])
def test_margin_invalid_triplets_are_masked(reference_pair_count):
    x, labels, tup, beta = random_margin_batch(1)
    valid = np.asarray(tup[3])
    assert not valid.all()
    kept = tuple(np.asarray(v)[valid] for v in tup)
    apply, _ = margin_fns(reference_pair_count=reference_pair_count)
    loss = apply(margin_params(beta), x, labels, _tuples(*tup))[0]
    loss_kept = apply(margin_params(beta), x, labels, _tuples(*kept))[0]
    np.testing.assert_allclose(loss, loss_kept, rtol=1e-6)
    # counting the garbage rows would change the value
    everything = (*tup[:3], np.ones_like(valid))
    polluted = np_margin(x, labels, everything, beta, reference_pair_count=reference_pair_count)
    assert abs(polluted - float(loss)) > 1e-3


@pytest.mark.parametrize("reference_pair_count", [False, True])
def test_margin_constant_beta_and_nu(reference_pair_count):
    x, labels, tup, _ = random_margin_batch(2)
    t = _tuples(*tup)
    kw = {"reference_pair_count": reference_pair_count}
    apply, grad = margin_fns(beta_constant=True, **kw)
    beta = np.float32(1.1)
    loss, _ = apply(margin_params(beta), x, labels, t)
    np.testing.assert_allclose(loss, np_margin(x, labels, tup, beta, **kw), rtol=2e-6)
    dparams, _ = grad(margin_params(beta), x, labels, t)
    want = central_differences(lambda b: np_margin(x, labels, tup, b, **kw), beta)
    np.testing.assert_allclose(dparams["params"]["beta"], want, rtol=1e-4, atol=2e-6)
    # nu: nu * sum_t beta_t joins the numerator before the division by the chosen count
    apply_nu, _ = margin_fns(nu=0.05, **kw)
    beta_c = np.linspace(0.9, 1.3, NUM_CLASSES).astype(np.float32)
    loss_nu, _ = apply_nu(margin_params(beta_c), x, labels, t)
    want_nu = np_margin(x, labels, tup, beta_c, nu=0.05, **kw)
    np.testing.assert_allclose(loss_nu, want_nu, rtol=2e-6)


def test_margin_option_reaches_every_margin_term_of_the_configs():
    c = base_config()
    assert c.loss.margin.reference_pair_count is False
    term = metric_term("margin", "random_distance", head="shared", weight=0.1)
    assert term.loss.margin.reference_pair_count is False
    with c.unlocked():
        c.loss.margin.reference_pair_count = True
    assert loss_kwargs(c.loss, "distance", NUM_CLASSES)["reference_pair_count"] is True
    module = LOSSES.get("margin")(**loss_kwargs(c.loss, "distance", NUM_CLASSES))
    assert module.reference_pair_count is True


@pytest.mark.parametrize("method", ["revisiting", "diva", "sharing", "dm2"])
def test_benchmark_presets_use_the_reference_divisor(method):
    get_config = importlib.import_module(f"configs.{method}").get_config
    for data, want in [("glyphs", False), ("cub200", True), ("cars196", True), ("sop", True)]:
        arg = f"data={data}" + (",loss=margin" if method in ("revisiting", "dm2") else "")
        c = get_config(arg)
        sections = [c.loss] + [c.aux[k].loss for k in c.aux if "loss" in c.aux[k]]
        assert len(sections) == {"revisiting": 1, "diva": 3, "sharing": 2, "dm2": 1}[method]
        for section in sections:
            assert section.margin.reference_pair_count is want, (method, data)


# ----------------------------------------------------------------------------- quadruplet


def np_first_other_negative(negatives, valid) -> tuple[list[int], list[bool]]:
    """Per triplet t, the first later position j (cyclic) of a valid triplet whose negative
    differs from t's: jdml's deterministic stand-in for the reference's random choice."""
    count = len(negatives)
    fourth, found = [], []
    for t in range(count):
        for step in range(1, count + 1):
            j = (t + step) % count
            if valid[j] and negatives[j] != negatives[t]:
                fourth.append(j)
                found.append(True)
                break
        else:
            fourth.append(t)
            found.append(False)
    return fourth, found


def np_reference_quadruplet(x, triplets, fourth_negatives, *, alpha1=0.2, alpha2=0.2) -> float:
    """The Revisiting reference's loss, its indexing kept: (B, 1) arrays for a, p, n and a flat
    list for n4, so that ``negative - fourth_negative`` broadcasts to (B, B, D)."""
    batch = np.asarray(x, np.float64)
    anchors = np.array([t[0] for t in triplets]).reshape(-1, 1)
    positives = np.array([t[1] for t in triplets]).reshape(-1, 1)
    negatives = np.array([t[2] for t in triplets]).reshape(-1, 1)
    # the reference's candidate sets: every chosen j must be one of them
    candidates = negatives != negatives.T
    for t, j in enumerate(fourth_negatives):
        assert j in np.arange(len(batch))[candidates[t]]
    anchor, positive = batch[anchors, :], batch[positives, :]
    negative, fourth = batch[negatives, :], batch[list(fourth_negatives), :]
    assert anchor.shape == (len(batch), 1, batch.shape[1]) and fourth.shape == batch.shape
    d_ap = np.linalg.norm(anchor - positive, axis=-1)
    triplet_loss = np.maximum(d_ap - np.linalg.norm(anchor - negative, axis=-1) + alpha1, 0)
    quadruplet_loss = np.maximum(d_ap - np.linalg.norm(negative - fourth, axis=-1) + alpha2, 0)
    assert triplet_loss.shape == (len(batch), 1)
    assert quadruplet_loss.shape == (len(batch), len(batch))
    return float(np.mean(triplet_loss) + np.mean(quadruplet_loss))


def np_masked_reference_quadruplet(x, tup, *, alpha1=0.2, alpha2=0.2) -> float:
    """The same loss by explicit loops over pairs (t, t'), t valid and t' valid with an n4."""
    x = np.asarray(x, np.float64)
    a, p, n, valid = tup
    fourth, found = np_first_other_negative(n, valid)
    dist = lambda u, v: float(np.linalg.norm(x[u] - x[v]))  # noqa: E731
    trip, quad = [], []
    for t in range(len(a)):
        if not valid[t]:
            continue
        d_ap = dist(a[t], p[t])
        trip.append(max(d_ap - dist(a[t], n[t]) + alpha1, 0.0))
        for s in range(len(a)):
            if valid[s] and found[s]:
                quad.append(max(d_ap - dist(n[t], fourth[s]) + alpha2, 0.0))
    return (float(np.mean(trip)) if trip else 0.0) + (float(np.mean(quad)) if quad else 0.0)


_QUAD_CACHE: dict = {}


def quadruplet_fns(**fields):
    """Jitted (loss, metrics) and d loss / d x of a QuadrupletLoss, cached per fields."""
    key = tuple(sorted(fields.items()))
    if key not in _QUAD_CACHE:
        module = LOSSES.get("quadruplet")(**fields)
        apply = jax.jit(lambda x, y, t: module.apply({}, x, y, t))
        grad = jax.jit(jax.grad(lambda x, y, t: module.apply({}, x, y, t)[0]))
        _QUAD_CACHE[key] = (apply, grad)
    return _QUAD_CACHE[key]


def jnp_reference_quadruplet(x, triplets, fourth_negatives, alpha1=0.2, alpha2=0.2):
    """The broadcast formula in jnp, for an independent jax.grad of the reference."""
    t = jnp.asarray(triplets)
    anchor, positive, negative = (x[t[:, i : i + 1], :] for i in range(3))  # (B, 1, D)
    fourth = x[jnp.asarray(fourth_negatives), :]  # (B, D)

    def norm(v):  # |v| with gradient 0 at v = 0 (as torch.norm), by a floor under the square
        return jnp.sqrt(jnp.maximum(jnp.sum(v * v, axis=-1), 1e-30))

    d_ap = norm(anchor - positive)
    triplet_loss = jax.nn.relu(d_ap - norm(anchor - negative) + alpha1)
    quadruplet_loss = jax.nn.relu(d_ap - norm(negative - fourth) + alpha2)
    return jnp.mean(triplet_loss) + jnp.mean(quadruplet_loss)


def random_quadruplet_batch(seed: int, *, shuffled_anchors: bool = False, normalize: bool = True):
    """B = 10 samples of 5 classes and one valid triplet per anchor (anchors in batch order, or
    shuffled like the random miner's)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(5), 2)
    x = rng.normal(size=(10, 4))
    if normalize:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    a = rng.permutation(10) if shuffled_anchors else np.arange(10)
    p = a ^ 1
    n = np.array([rng.choice(np.flatnonzero(labels != labels[i])) for i in a])
    return x.astype(np.float32), labels, (a, p, n, np.ones(10, bool))


@pytest.mark.parametrize(
    ("seed", "shuffled", "normalize"),
    [(0, False, True), (1, False, False), (2, True, True), (3, True, False)],
)
def test_quadruplet_reference_matches_the_broadcast(seed, shuffled, normalize):
    x, labels, tup = random_quadruplet_batch(seed, shuffled_anchors=shuffled, normalize=normalize)
    fourth, found = np_first_other_negative(tup[2], tup[3])
    assert all(found)
    triplets = list(zip(*tup[:3], strict=True))
    # n4 is the batch sample j itself, not triplet j's anchor (they differ for shuffled anchors)
    if shuffled:
        assert any(tup[0][j] != j for j in fourth)
    # some pairs compare a sample with itself (n_t = n4_t'): distance exactly 0, no epsilon
    assert any(n_t == j for n_t in tup[2] for j in fourth)

    def reference(v):
        return np_reference_quadruplet(v, triplets, fourth)

    apply, grad = quadruplet_fns(reference_fourth_negative=True)
    loss, metrics = apply(jnp.asarray(x), jnp.asarray(labels), _tuples(*tup))
    np.testing.assert_allclose(loss, reference(x), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(loss, np_masked_reference_quadruplet(x, tup), rtol=2e-6)
    assert float(metrics["quadruplet_fraction"]) == 1.0
    dx = np.asarray(grad(jnp.asarray(x), jnp.asarray(labels), _tuples(*tup)))
    want = central_differences(reference, x)
    np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-6)
    assert np.max(np.abs(want)) > 1e-2, "the batch should exercise the gradient"
    jax_ref = jax.grad(jnp_reference_quadruplet)(jnp.asarray(x), triplets, fourth)
    np.testing.assert_allclose(dx, jax_ref, rtol=1e-5, atol=1e-7)


def test_quadruplet_reference_masks_invalid_triplets():
    x, labels, tup = random_quadruplet_batch(4)
    a, p, n, _ = tup
    valid = np.ones(10, bool)
    valid[[2, 7]] = False
    n = n.copy()
    n[[2, 7]] = a[[2, 7]]  # garbage in the invalid rows
    masked = (a, p, n, valid)
    apply, grad = quadruplet_fns(reference_fourth_negative=True)
    loss, _ = apply(jnp.asarray(x), jnp.asarray(labels), _tuples(*masked))
    np.testing.assert_allclose(loss, np_masked_reference_quadruplet(x, masked), rtol=2e-6)
    dx = np.asarray(grad(jnp.asarray(x), jnp.asarray(labels), _tuples(*masked)))
    want = central_differences(lambda v: np_masked_reference_quadruplet(v, masked), x)
    np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-6)
    # no valid triplet: 0 with zero gradient
    empty = (a, p, n, np.zeros(10, bool))
    loss, _ = apply(jnp.asarray(x), jnp.asarray(labels), _tuples(*empty))
    assert float(loss) == 0.0
    assert not np.any(np.asarray(grad(jnp.asarray(x), jnp.asarray(labels), _tuples(*empty))))


def test_quadruplet_reference_term_is_not_per_triplet():
    x, labels, tup = random_quadruplet_batch(0)
    fourth, _ = np_first_other_negative(tup[2], tup[3])
    xs = np.asarray(x, np.float64)
    a, p, n, _ = tup
    d_ap = np.linalg.norm(xs[a] - xs[p], axis=1)
    per_triplet = np.mean(np.maximum(d_ap - np.linalg.norm(xs[a] - xs[n], axis=1) + 0.2, 0))
    per_triplet += np.mean(np.maximum(d_ap - np.linalg.norm(xs[n] - xs[fourth], axis=1) + 0.2, 0))
    loss, _ = quadruplet_fns(reference_fourth_negative=True)[0](x, labels, _tuples(*tup))
    assert abs(float(loss) - per_triplet) > 1e-3


def test_quadruplet_reference_needs_no_more_triplets_than_samples():
    x, labels, tup = random_quadruplet_batch(0)
    twice = tuple(np.concatenate([v, v]) for v in tup)
    with pytest.raises(ValueError, match="batch indices"):
        quadruplet_fns(reference_fourth_negative=True)[0](x, labels, _tuples(*twice))
    # the default needs no such thing
    quadruplet_fns()[0](x, labels, _tuples(*twice))
