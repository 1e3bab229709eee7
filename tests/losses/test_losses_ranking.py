"""Ranking losses against float64 NumPy loops, central differences and degenerate batches.

Covers contrastive, quadruplet, snr, lifted, npair, angular, multisimilarity and histogram, each
with its reference-behaviour option where it has one. The NumPy references loop over explicit
tuples / anchors / pairs and share no code with the losses.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.losses import LOSSES
from jdml.losses.histogram import reference_bin_tables
from jdml.miners import Tuples
from tests.helpers import central_differences

EPS_D = 1e-8  # the distance guard sqrt(|x - y|^2 + eps) of the losses


# ----------------------------------------------------------------------------- NumPy references


def _dist(u, v) -> float:
    return math.sqrt(float(np.sum((u - v) ** 2)) + EPS_D)


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def _log1p_sum_exp(z) -> float:
    z = np.asarray(z, np.float64)
    m = max(0.0, float(np.max(z))) if z.size else 0.0
    return m + math.log(math.exp(-m) + float(np.sum(np.exp(z - m))))


def _lse(z) -> float:
    z = np.asarray(z, np.float64)
    m = float(np.max(z))
    return m + math.log(float(np.sum(np.exp(z - m))))


def _mean_norm(x) -> float:
    return float(np.mean(np.linalg.norm(x, axis=1)))


def np_contrastive(x, labels, tup, *, pos_margin=0.0, neg_margin=1.0, hadsell_squared=False):
    del labels
    x = np.asarray(x, np.float64)
    pos, neg = [], []
    for i, j, k, v in zip(*tup, strict=True):
        if v:
            pos.append(max(_dist(x[i], x[j]) - pos_margin, 0.0))
            neg.append(max(neg_margin - _dist(x[i], x[k]), 0.0))
    if hadsell_squared:
        pos = [0.5 * h * h for h in pos]
        neg = [0.5 * h * h for h in neg]
    return _mean(pos) + _mean(neg)


def np_quadruplet_reference(x, tup, *, m1=0.2, m2=0.2):
    """The reference's broadcast: the second mean runs over pairs (t, t') of triplets, n4_t' the
    sample at the first later triplet position (cyclic) with another n; plain norms."""
    x = np.asarray(x, np.float64)
    a, p, n, valid = tup
    t_count = len(a)
    fourth = {}
    for s in range(t_count):
        for step in range(1, t_count + 1):
            j = (s + step) % t_count
            if valid[s] and valid[j] and n[j] != n[s]:
                fourth[s] = j
                break
    norm = lambda u, v: math.sqrt(float(np.sum((u - v) ** 2)))  # noqa: E731
    trip, quad = [], []
    for t in range(t_count):
        if not valid[t]:
            continue
        d_ap = norm(x[a[t]], x[p[t]])
        trip.append(max(d_ap - norm(x[a[t]], x[n[t]]) + m1, 0.0))
        quad += [max(d_ap - norm(x[n[t]], x[j]) + m2, 0.0) for j in fourth.values()]
    return _mean(trip) + _mean(quad)


def np_quadruplet(x, labels, tup, *, m1=0.2, m2=0.2, reference_fourth_negative=False):
    if reference_fourth_negative:
        return np_quadruplet_reference(x, tup, m1=m1, m2=m2)
    x = np.asarray(x, np.float64)
    a, p, n, valid = tup
    b, t_count = len(x), len(a)
    trip, quad = [], []
    for t in range(t_count):
        if not valid[t]:
            continue
        d_ap = _dist(x[a[t]], x[p[t]])
        trip.append(max(d_ap - _dist(x[a[t]], x[n[t]]) + m1, 0.0))
        fourth = None  # first later sample (cyclic from n) of a third class
        for step in range(1, b + 1):
            j = (n[t] + step) % b
            if labels[j] != labels[a[t]] and labels[j] != labels[n[t]]:
                fourth = j
                break
        if fourth is not None:
            quad.append(max(d_ap - _dist(x[n[t]], x[fourth]) + m2, 0.0))
    return _mean(trip) + _mean(quad)


def np_snr(x, labels, tup, *, margin=0.2, reg_lambda=0.005):
    del labels
    x = np.asarray(x, np.float64)
    hinges, regs = [], []
    for i, j, k, v in zip(*tup, strict=True):
        if not v:
            continue
        signal = max(np.var(x[i], ddof=1), 1e-12)
        pos = np.var(x[j] - x[i], ddof=1) / signal
        neg = np.var(x[k] - x[i], ddof=1) / signal
        hinges.append(max(pos - neg + margin, 0.0))
        regs.append(abs(np.sum(x[i])))
    active = sum(h > 0 for h in hinges)
    snr = sum(hinges) / active if active else 0.0
    return snr + reg_lambda * _mean(regs)


def np_lifted(x, labels, tup, *, neg_margin=1.0, l2_weight=0.005):
    x = np.asarray(x, np.float64)
    anchors, _, _, valid = tup
    terms = []
    for a, v in zip(anchors, valid, strict=True):
        pos = [j for j in range(len(x)) if labels[j] == labels[a] and j != a]
        neg = [j for j in range(len(x)) if labels[j] != labels[a]]
        if not (v and pos and neg):
            continue
        lse_p = _lse([_dist(x[a], x[j]) for j in pos])
        lse_n = _lse([neg_margin - _dist(x[a], x[j]) for j in neg])
        terms.append(max(lse_p + lse_n, 0.0))
    return _mean(terms) + l2_weight * _mean_norm(x)


def _npair_anchor_terms(x, labels, tup):
    anchors, positives, _, valid = tup
    for a, p, v in zip(anchors, positives, valid, strict=True):
        neg = [j for j in range(len(x)) if labels[j] != labels[a]]
        if v and neg:
            yield a, p, neg


def np_npair(x, labels, tup, *, l2_weight=0.005):
    x = np.asarray(x, np.float64)
    terms = [
        _log1p_sum_exp([x[a] @ x[n] - x[a] @ x[p] for n in neg])
        for a, p, neg in _npair_anchor_terms(x, labels, tup)
    ]
    return _mean(terms) + l2_weight * _mean_norm(x)


def np_angular(
    x, labels, tup, *, alpha=45.0, angular_weight=2.0, l2_weight=0.005, reference_clamp=False
):
    x = np.asarray(x, np.float64)
    xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    t2 = math.tan(math.radians(alpha)) ** 2
    npair, angular = [], []
    for a, p, neg in _npair_anchor_terms(x, labels, tup):
        z = np.array([x[a] @ x[n] - x[a] @ x[p] for n in neg])
        if reference_clamp:
            z = np.clip(z, -50.0, 50.0)
        f = [4 * t2 * (xn[a] + xn[p]) @ xn[n] - 2 * (1 + t2) * xn[a] @ xn[p] for n in neg]
        npair.append(_log1p_sum_exp(z))
        angular.append(_log1p_sum_exp(f))
    return _mean(npair) + angular_weight * _mean(angular) + l2_weight * _mean_norm(x)


def np_multisimilarity(x, labels, tup=None, *, alpha=2.0, beta=40.0, eps=0.1, lam=0.5):
    del tup
    x = np.asarray(x, np.float64)
    s = x @ x.T
    terms = []
    for i in range(len(x)):
        pos = [j for j in range(len(x)) if labels[j] == labels[i] and j != i]
        neg = [j for j in range(len(x)) if labels[j] != labels[i]]
        if not pos or not neg:
            continue
        hardest_pos, hardest_neg = min(s[i, pos]), max(s[i, neg])
        kept_neg = [j for j in neg if s[i, j] + eps > hardest_pos]
        kept_pos = [j for j in pos if s[i, j] - eps < hardest_neg]
        if not kept_neg or not kept_pos:
            continue
        pos_term = _log1p_sum_exp([-alpha * (s[i, j] - lam) for j in kept_pos]) / alpha
        neg_term = _log1p_sum_exp([beta * (s[i, j] - lam) for j in kept_neg]) / beta
        terms.append(pos_term + neg_term)
    return _mean(terms)


def _histogram_loss(h_pos, h_neg) -> float:
    return float(np.sum(h_neg * np.cumsum(h_pos)))


def np_histogram_parts(x, labels, *, num_bins=65):
    """(loss, h+, h-) with integer-index binning, looping over the pairs i < j."""
    x = np.asarray(x, np.float64)
    delta = 2.0 / (num_bins - 1)
    grid = np.linspace(-1.0, 1.0, num_bins)
    hist = {True: np.zeros(num_bins), False: np.zeros(num_bins)}
    count = {True: 0, False: 0}
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            s = min(max(float(x[i] @ x[j]), -1.0), 1.0)
            k = min(math.floor((s + 1.0) / delta), num_bins - 2)
            same = bool(labels[i] == labels[j])
            hist[same][k] += (grid[k + 1] - s) / delta
            hist[same][k + 1] += (s - grid[k]) / delta
            count[same] += 1
    h_pos = hist[True] / max(count[True], 1)
    h_neg = hist[False] / max(count[False], 1)
    return _histogram_loss(h_pos, h_neg), h_pos, h_neg


def np_histogram(x, labels, tup=None, *, num_bins=65):
    del tup
    return np_histogram_parts(x, labels, num_bins=num_bins)[0]


def np_histogram_reference_parts(x, labels, *, num_bins=65, dtype=np.float32):
    """(loss, h+, h-) binned like the reference: grid values compared by float equality."""
    x = np.asarray(x, dtype)
    rows, cols = np.triu_indices(len(x), 1)
    sim = (x @ x.T)[rows, cols]
    same = np.asarray(labels)[rows] == np.asarray(labels)[cols]
    delta = 2 / (num_bins - 1)
    support = np.linspace(-1, 1, num_bins).reshape(-1, 1)
    assigned = ((sim + 1) / delta).astype(int) * delta - 1  # float32 index like the reference
    upper = assigned[None, :] == support - delta  # bin r holds the similarity's upper share
    lower = assigned[None, :] == support
    sim64 = sim.astype(np.float64)[None, :]
    weights = np.zeros((num_bins, len(sim)))
    weights[upper] = ((sim64 - support + delta) / delta)[upper]
    weights[lower] = ((-sim64 + support + delta) / delta)[lower]
    h_pos = weights[:, same].sum(1) / max(same.sum(), 1)
    h_neg = weights[:, ~same].sum(1) / max((~same).sum(), 1)
    return _histogram_loss(h_pos, h_neg), h_pos, h_neg


def np_histogram_reference(x, labels, tup=None, *, num_bins=65, dtype=np.float32):
    del tup
    return np_histogram_reference_parts(x, labels, num_bins=num_bins, dtype=dtype)[0]


# ----------------------------------------------------------------------------- batches


def _tuples(a, p, n, valid) -> Tuples:
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return Tuples(i32(a), i32(p), i32(n), jnp.asarray(valid, bool))


def set_tuples(labels, *, garbage_negatives: bool = True):
    """Tuples like the npair / lifted miners give: every sample an anchor, one positive each."""
    labels = np.asarray(labels)
    b = len(labels)
    anchors = np.arange(b)
    positives, valid = [], []
    for i in range(b):
        same = [j for j in range(b) if labels[j] == labels[i] and j != i]
        positives.append(same[-1] if same else i)
        valid.append(bool(same) and bool(np.any(labels != labels[i])))
    negatives = (anchors * 5 + 3) % b if garbage_negatives else anchors
    return anchors, np.array(positives), negatives, np.array(valid)


B, D = 8, 3
LABELS = np.array([0, 0, 1, 1, 2, 2, 3, 4])  # two singleton classes
HIST_LABELS = (0, 0, 0, 0, 1, 1, 1, 1)
TRIPLETS = (
    [0, 1, 2, 3, 4, 5, 6, 7],
    [1, 0, 3, 2, 5, 4, 6, 7],
    [2, 4, 0, 7, 6, 1, 3, 2],
    [True, True, True, False, True, True, False, False],
)
PUSH_TRIPLETS = (  # rows of the rho miner: (a, a, p') push same-class samples apart
    [0, 1, 2, 3, 4, 5, 6, 7],
    [0, 1, 3, 2, 5, 4, 6, 7],
    [1, 0, 0, 7, 6, 5, 3, 2],
    [True, True, True, True, True, True, False, False],
)


def random_x(seed: int, *, normalize: bool) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(B, D))
    if normalize:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Case:
    """One loss configuration with its NumPy reference."""

    name: str
    fields: tuple[tuple[str, object], ...]
    reference: object  # fn(x, labels, tuples_tuple) -> float
    kind: str  # "triplet", "set" or "none" (no miner)
    normalize: bool = False
    # labels of the random batches (the histogram needs many positive pairs to have a gradient)
    labels: tuple[int, ...] = tuple(LABELS)

    @property
    def id(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.fields)
        return f"{self.name}[{opts}]" if opts else self.name

    def tuples_for(self, labels, *, push: bool = False):
        if self.kind == "triplet":
            return PUSH_TRIPLETS if push else TRIPLETS
        if self.kind == "set":
            return set_tuples(labels)
        return None


def _ref(fn, **kw):
    return lambda x, labels, tup: fn(x, labels, tup, **kw)


CASES = [
    Case("contrastive", (), np_contrastive, "triplet"),
    Case(
        "contrastive",
        (("hadsell_squared", True),),
        _ref(np_contrastive, hadsell_squared=True),
        "triplet",
    ),
    Case("quadruplet", (), np_quadruplet, "triplet"),
    Case(
        "quadruplet",
        (("reference_fourth_negative", True),),
        _ref(np_quadruplet, reference_fourth_negative=True),
        "triplet",
    ),
    Case("snr", (), np_snr, "triplet"),
    Case(
        "snr",
        (("miner_name", "distance"), ("reference_distance_miner_switch", True)),
        _ref(np_snr, reg_lambda=0.0),
        "triplet",
    ),
    Case(
        "snr",
        (("miner_name", "rho_distance"), ("reference_distance_miner_switch", True)),
        np_snr,
        "triplet",
    ),
    Case("lifted", (), np_lifted, "set"),
    Case("npair", (), np_npair, "set"),
    Case("angular", (), np_angular, "set"),
    Case(
        "angular",
        (("reference_exponent_clamp", True),),
        _ref(np_angular, reference_clamp=True),
        "set",
    ),
    Case("multisimilarity", (), np_multisimilarity, "none", normalize=True),
    Case("histogram", (), np_histogram, "none", normalize=True, labels=HIST_LABELS),
    Case(
        "histogram",
        (("num_bins", 11),),
        _ref(np_histogram, num_bins=11),
        "none",
        normalize=True,
        labels=HIST_LABELS,
    ),
    Case(
        "histogram",
        (("num_bins", 11), ("reference_float_binning", True)),
        _ref(np_histogram_reference, num_bins=11, dtype=np.float64),
        "none",
        normalize=True,
        labels=HIST_LABELS,
    ),
]
CASE_IDS = [c.id for c in CASES]
DEFAULT_CASES = [c for c in CASES if not c.fields]

_FN_CACHE: dict = {}


def loss_fns(name: str, **fields):
    """(module, jitted (loss, metrics), jitted ((loss, metrics), d loss / d x)), cached."""
    key = (name, tuple(sorted(fields.items())))
    if key not in _FN_CACHE:
        module = LOSSES.get(name)(**fields)

        def apply(x, labels, tuples):
            return module.apply({}, x, labels, tuples)

        value_and_grad = jax.jit(jax.value_and_grad(apply, has_aux=True))
        _FN_CACHE[key] = (module, jax.jit(apply), value_and_grad)
    return _FN_CACHE[key]


def run(name, x, labels, tup, **fields):
    """((loss, metrics), grad) of a loss at a batch, jitted."""
    _, _, value_and_grad = loss_fns(name, **fields)
    t = None if tup is None else _tuples(*tup)
    return value_and_grad(jnp.asarray(x), jnp.asarray(labels), t)


def assert_finite(loss, grad) -> None:
    assert np.isfinite(float(loss)), loss
    assert np.all(np.isfinite(np.asarray(grad))), grad


# ----------------------------------------------------------------------------- every loss


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_value_and_gradient_match_numpy(case: Case):
    fields = dict(case.fields)
    labels = np.array(case.labels)
    tup = case.tuples_for(labels)

    def reference(v):
        return case.reference(v, labels, tup)

    for seed in (0, 1):
        x = random_x(seed, normalize=case.normalize)
        (loss, metrics), grad = run(case.name, x, labels, tup, **fields)
        assert loss.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in metrics.values())
        np.testing.assert_allclose(loss, reference(x.astype(np.float64)), rtol=2e-5, atol=1e-6)
        want_grad = central_differences(reference, x)
        scale = max(1.0, float(np.max(np.abs(want_grad))))
        np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-5 * scale)
        assert np.any(np.abs(want_grad) > 1e-3), "the batch should exercise the gradient"


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=[c.id for c in DEFAULT_CASES])
def test_jit_equals_eager_and_bf16_gives_f32(case: Case):
    module, apply, _ = loss_fns(case.name)
    x = random_x(2, normalize=case.normalize)
    tup = case.tuples_for(LABELS)
    t = None if tup is None else _tuples(*tup)
    jitted, jit_metrics = apply(jnp.asarray(x), jnp.asarray(LABELS), t)
    eager, eager_metrics = module.apply({}, jnp.asarray(x), jnp.asarray(LABELS), t)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-7)
    assert jit_metrics.keys() == eager_metrics.keys()

    x16 = jnp.asarray(x, jnp.bfloat16)
    loss16, metrics16 = apply(x16, jnp.asarray(LABELS), t)
    assert loss16.dtype == jnp.float32
    assert all(v.dtype == jnp.float32 for v in metrics16.values())
    want = case.reference(np.asarray(x16, np.float64), LABELS, tup)
    np.testing.assert_allclose(loss16, want, rtol=2e-5, atol=1e-6)


def _degenerate_batches():
    """(description, x, labels, push) batches with zero distances, singletons, equal rows."""
    rng = np.random.default_rng(3)
    v = rng.normal(size=(4, D)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    duplicates = np.stack([v[0], v[0], v[0], v[1], v[1], v[1], v[2], v[3]])  # within/across
    equal = np.tile(np.float32([0.6, 0.8, 0.0]), (B, 1))
    constant = np.ones((B, D), np.float32)  # zero variance over the dimensions (SNR)
    zeros = np.zeros((B, D), np.float32)
    rand = random_x(4, normalize=True)
    return [
        ("duplicates", duplicates, LABELS, False),
        ("duplicates_push", duplicates, LABELS, True),
        ("singletons", rand, np.arange(B), False),
        ("one_class", rand, np.zeros(B, int), False),
        ("all_equal", equal, LABELS, True),
        ("constant", constant, LABELS, False),
        ("zeros", zeros, LABELS, True),
    ]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_degenerate_batches_are_finite(case: Case):
    fields = dict(case.fields)
    for desc, x, labels, push in _degenerate_batches():
        tup = case.tuples_for(labels, push=push)
        (loss, _), grad = run(case.name, x, labels, tup, **fields)
        assert_finite(loss, grad)
        want = case.reference(x.astype(np.float64), labels, tup)
        np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-4, err_msg=desc)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_no_valid_tuple(case: Case):
    """No valid tuple (or no positive pair): the ranking part is 0 with zero gradient."""
    fields = dict(case.fields)
    x = random_x(5, normalize=case.normalize)
    labels = np.arange(B) if case.kind == "none" else LABELS  # no positive pair at all
    tup = case.tuples_for(labels)
    if tup is not None:
        tup = (*tup[:3], np.zeros(B, bool))
    (loss, _), grad = run(case.name, x, labels, tup, **fields)
    assert_finite(loss, grad)
    if case.name in ("lifted", "npair", "angular"):  # only the norm regulariser is left
        np.testing.assert_allclose(loss, 0.005 * _mean_norm(x), rtol=1e-6)
    else:
        assert float(loss) == 0.0
        np.testing.assert_array_equal(grad, 0.0)


def test_registry_and_interface():
    want = {
        "contrastive": (None, True),
        "quadruplet": (None, True),
        "snr": (None, True),
        "lifted": (("lifted",), True),
        "npair": (("npair",), True),
        "angular": (("npair",), True),
        "multisimilarity": (None, False),
        "histogram": (None, False),
    }
    for name, (allowed, needs) in want.items():
        cls = LOSSES.get(name)
        assert cls.loss_name == name
        assert cls.allowed_miners == allowed and cls.needs_miner == needs
        assert cls.param_lr is None
        with pytest.raises(TypeError):
            cls(0.5)  # hyperparameters are keyword-only
    with pytest.raises(ValueError, match="needs mined tuples"):
        LOSSES.get("quadruplet")().apply({}, random_x(0, normalize=True), LABELS, None)
    with pytest.raises(ValueError, match="num_bins"):
        LOSSES.get("histogram")(num_bins=1).apply({}, random_x(0, normalize=True), LABELS)


def test_defaults_follow_the_reference():
    get = LOSSES.get
    assert (get("contrastive")().pos_margin, get("contrastive")().neg_margin) == (0.0, 1.0)
    q = get("quadruplet")()
    assert (q.margin_alpha_1, q.margin_alpha_2) == (0.2, 0.2)
    assert (get("snr")().margin, get("snr")().reg_lambda) == (0.2, 0.005)
    assert (get("lifted")().neg_margin, get("lifted")().l2_weight) == (1.0, 0.005)
    assert get("npair")().l2_weight == 0.005
    a = get("angular")()
    assert (a.alpha, a.angular_weight, a.l2_weight) == (45.0, 2.0, 0.005)
    m = get("multisimilarity")()
    assert (m.pos_weight, m.neg_weight, m.margin, m.thresh) == (2.0, 40.0, 0.1, 0.5)
    assert get("histogram")().num_bins == 65
    for name, option in [
        ("contrastive", "hadsell_squared"),
        ("quadruplet", "reference_fourth_negative"),
        ("snr", "reference_distance_miner_switch"),
        ("angular", "reference_exponent_clamp"),
        ("histogram", "reference_float_binning"),
    ]:
        assert getattr(get(name)(), option) is False


# ----------------------------------------------------------------------------- hand-computed

SQUARE = np.float32([[0.0, 0.0], [0.5, 0.0], [0.0, 0.5], [3.0, 0.0]])


def test_contrastive_hand_computed():
    labels = np.array([0, 0, 1, 1])
    # (0, 1, 2): d_ap = 0.5, d_an = 0.5; (1, 0, 3): d_ap = 0.5, d_an = 2.5; the third is invalid
    tup = ([0, 1, 3], [1, 0, 2], [2, 3, 0], [True, True, False])
    (loss, metrics), _ = run("contrastive", SQUARE, labels, tup)
    np.testing.assert_allclose(loss, (0.5 + 0.5) / 2 + (0.5 + 0.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics["active_fraction"], 3 / 4)
    (loss, _), _ = run("contrastive", SQUARE, labels, tup, hadsell_squared=True)
    np.testing.assert_allclose(loss, (0.125 + 0.125) / 2 + (0.125 + 0.0) / 2, rtol=1e-6)


def test_quadruplet_hand_computed():
    x = np.float32([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.5]])
    labels = np.array([0, 0, 1, 2])
    tup = ([0, 1], [1, 0], [2, 3], [True, True])
    # triplet terms: [1 - 1 + 0.2] = 0.2 and [1 - sqrt(3.25) + 0.2]_+ = 0.
    # third-class n4: sample 3 for (0, 1, 2) and sample 2 for (1, 0, 3): [1 - 0.5 + 0.2] twice.
    (loss, metrics), _ = run("quadruplet", x, labels, tup)
    np.testing.assert_allclose(loss, 0.1 + 0.7, rtol=1e-6)
    np.testing.assert_allclose(metrics["quadruplet_fraction"], 1.0)
    # reference: n4 = the sample at the other triplet position (0 <-> 1), so {n4} = {1, 0}, and
    # the second mean runs over all (n, n4) pairs: d(2, 1) = sqrt(2), d(2, 0) = 1 -> one hinge
    # [1 - 1 + 0.2] = 0.2; d(3, 1) = sqrt(3.25), d(3, 0) = 1.5 -> 0. Mean over 4 pairs: 0.05.
    (loss, _), _ = run("quadruplet", x, labels, tup, reference_fourth_negative=True)
    np.testing.assert_allclose(loss, 0.1 + 0.05, rtol=1e-6)
    # with two classes only, no third-class n4 exists: that term drops out
    (loss, metrics), _ = run("quadruplet", x, np.array([0, 0, 1, 1]), tup)
    np.testing.assert_allclose(loss, 0.1, rtol=1e-6)
    assert float(metrics["quadruplet_fraction"]) == 0.0


def test_snr_hand_computed_and_miner_switch():
    # a = (2, 0): Var = 2; p - a = (0.5, -0.5): Var 0.5; n - a = (0.2, -0.2): Var 0.08
    x = np.float32([[2.0, 0.0], [2.5, -0.5], [2.2, -0.2]])
    labels = np.array([0, 0, 1])
    tup = ([0], [1], [2], [True])
    hinge, reg = 0.25 - 0.04 + 0.2, 0.005 * 2.0
    for fields, want in [
        ({}, hinge + reg),
        ({"miner_name": "distance"}, hinge + reg),  # paper: the regulariser stays on
        ({"miner_name": "distance", "reference_distance_miner_switch": True}, hinge),
        ({"miner_name": "rho_distance", "reference_distance_miner_switch": True}, hinge + reg),
    ]:
        (loss, metrics), _ = run("snr", x, labels, tup, **fields)
        np.testing.assert_allclose(loss, want, rtol=1e-5, err_msg=str(fields))
        np.testing.assert_allclose(metrics["regulariser"], 2.0, rtol=1e-6)


def test_lifted_hand_computed():
    x = np.float32([[0.0, 0.0], [1.0, 0.0], [0.0, 0.5]])
    labels = np.array([0, 0, 1])
    tup = set_tuples(labels)  # anchors 0 and 1 are valid; 2 has no positive
    # a = 0: d_ap = 1, d_an = 0.5 -> 1 + (1 - 0.5); a = 1: 1 + (1 - sqrt(1.25))
    want = (1.5 + (2.0 - math.sqrt(1.25))) / 2 + 0.005 * (0.0 + 1.0 + 0.5) / 3
    (loss, metrics), _ = run("lifted", x, labels, tup)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(metrics["valid_fraction"], 2 / 3, rtol=1e-6)


def test_npair_and_angular_hand_computed():
    x = np.float32([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    labels = np.array([0, 0, 1])
    tup = set_tuples(labels)
    # a = 0, p = 1: 0 - 0.5; a = 1, p = 0: 0.5 - 0.5
    norms = (1.0 + math.sqrt(0.5) + 1.0) / 3
    want = (math.log1p(math.exp(-0.5)) + math.log(2.0)) / 2 + 0.005 * norms
    (loss, _), _ = run("npair", x, labels, tup)
    np.testing.assert_allclose(loss, want, rtol=1e-5)

    # alpha = 45 deg (t^2 = 1): f = 4 (a + p).n - 4 a.p; duplicates a = p = (1, 0), n = (0, 1)
    x = np.float32([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    (loss, metrics), _ = run("angular", x, labels, set_tuples(labels))
    npair, angular = math.log1p(math.exp(-1.0)), math.log1p(math.exp(-4.0))
    np.testing.assert_allclose(metrics["npair"], npair, rtol=1e-5)
    np.testing.assert_allclose(metrics["angular"], angular, rtol=1e-5)
    np.testing.assert_allclose(loss, npair + 2.0 * angular + 0.005, rtol=1e-5)


def test_npair_and_lifted_take_the_sets_from_the_labels():
    x = random_x(6, normalize=False)
    for name in ("npair", "lifted", "angular"):
        base = set_tuples(LABELS, garbage_negatives=False)
        other = set_tuples(LABELS, garbage_negatives=True)
        (loss_a, _), _ = run(name, x, LABELS, base)
        (loss_b, _), _ = run(name, x, LABELS, other)
        np.testing.assert_allclose(loss_a, loss_b, rtol=1e-7)


def test_angular_exponent_clamp():
    # large unnormalised embeddings: N-pair exponents far beyond 50
    x = random_x(7, normalize=True) * 12.0
    tup = set_tuples(LABELS)
    (free, _), grad_free = run("angular", x, LABELS, tup)
    (clamped, _), grad_clamped = run("angular", x, LABELS, tup, reference_exponent_clamp=True)
    assert_finite(free, grad_free)
    assert_finite(clamped, grad_clamped)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(free, np_angular(x64, LABELS, tup), rtol=1e-5)
    np.testing.assert_allclose(
        clamped, np_angular(x64, LABELS, tup, reference_clamp=True), rtol=1e-5
    )
    assert float(free) > float(clamped) + 1.0


def test_multisimilarity_hand_computed():
    x = np.float32([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
    labels = np.array([0, 0, 1, 1])
    # s01 = 0.6, s02 = 0.8, s03 = 0, s12 = 0.96, s13 = 0.8, s23 = 0.6; every anchor keeps its
    # positive (s = 0.6); negatives kept where s + 0.1 > 0.6.
    pos = 0.5 * math.log1p(math.exp(-2 * (0.6 - 0.5)))

    def neg(*sims):
        return math.log1p(sum(math.exp(40 * (s - 0.5)) for s in sims)) / 40

    want = (4 * pos + neg(0.8) + neg(0.96, 0.8) + neg(0.8, 0.96) + neg(0.8)) / 4
    (loss, metrics), _ = run("multisimilarity", x, labels, None)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(metrics["neg_pair_fraction"], 6 / 8)
    # well separated classes: no negative passes the mining, every anchor is skipped -> 0
    far = np.float32([[1.0, 0.0], [0.95, 0.31225], [-1.0, 0.0], [-0.95, -0.31225]])
    (loss, metrics), grad = run("multisimilarity", far, labels, None)
    assert float(loss) == 0.0 and float(metrics["valid_fraction"]) == 0.0
    np.testing.assert_array_equal(grad, 0.0)


HIST_X = np.float32([[1.0, 0.0], [0.5, math.sqrt(0.75)], [-0.5, 0.5 / math.sqrt(3.0)]])


def test_histogram_hand_computed():
    labels = np.array([0, 0, 1])
    # R = 3 (grid -1, 0, 1): positive s01 = 0.5 -> h+ = (0, 0.5, 0.5); negatives s02 = -0.5
    # and s12 = 0 -> h- = (0.25, 0.75, 0); loss = 0.75 * 0.5
    (loss, metrics), grad = run("histogram", HIST_X, labels, None, num_bins=3)
    np.testing.assert_allclose(loss, 0.375, rtol=1e-5)
    np.testing.assert_allclose(metrics["pos_mass"], 1.0, rtol=1e-6)
    assert np.any(np.asarray(grad) != 0)  # the gradient flows through the kernel weights


def test_histogram_reference_binning_tables():
    # Delta = 1/32 is exact: the float-equality binning keeps every contribution
    lower, upper = reference_bin_tables(65)
    assert lower.sum() == 65 and upper.sum() == 65
    # Delta = 0.2: the upper-bin share of grid indices k = 2..7 (s in [-0.6, 0.6)) is lost
    lower, upper = reference_bin_tables(11)
    ks = np.arange(-2, 12)
    assert list(ks[lower]) == list(range(11))
    assert list(ks[upper]) == [-1, 0, 1, 8, 9]


def test_histogram_reference_binning_loses_mass():
    # one positive pair with s = 0.1 (k = 5 for R = 11): the reference keeps only the lower
    # share (0.2 - 0.1) / 0.2 = 0.5 of it
    x = np.float32([[1.0, 0.0], [0.1, math.sqrt(0.99)], [-0.7, math.sqrt(0.51)]])
    labels = np.array([0, 0, 1])
    (_, metrics), _ = run("histogram", x, labels, None, num_bins=11)
    np.testing.assert_allclose(metrics["pos_mass"], 1.0, rtol=1e-6)
    fields = {"num_bins": 11, "reference_float_binning": True}
    (loss, metrics), grad = run("histogram", x, labels, None, **fields)
    np.testing.assert_allclose(metrics["pos_mass"], 0.5, rtol=1e-5)
    want, h_pos, _ = np_histogram_reference_parts(x, labels, num_bins=11)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(h_pos.sum(), 0.5, rtol=1e-5)
    assert_finite(loss, grad)


@pytest.mark.parametrize("num_bins", [11, 65])
def test_histogram_reference_binning_matches_emulation(num_bins: int):
    """Float32 emulation of the reference code, including unnormalised similarities."""
    fields = {"num_bins": num_bins, "reference_float_binning": True}
    for seed, scale in [(8, 1.0), (9, 1.0), (10, 1.3)]:  # 1.3: some |s| > 1 + Delta
        x = random_x(seed, normalize=True) * np.float32(scale)
        (loss, metrics), _ = run("histogram", x, LABELS, None, **fields)
        want, h_pos, h_neg = np_histogram_reference_parts(x, LABELS, num_bins=num_bins)
        np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(metrics["pos_mass"], h_pos.sum(), rtol=1e-5)
        np.testing.assert_allclose(metrics["neg_mass"], h_neg.sum(), rtol=1e-5)
        if num_bins == 65 and scale == 1.0:  # exact grid: same as integer binning
            (default, _), _ = run("histogram", x, LABELS, None, num_bins=65)
            np.testing.assert_allclose(loss, default, rtol=1e-5, atol=1e-7)
