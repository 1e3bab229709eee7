"""Semihard/softhard, rho, set-based and DiVA / Sharing Matters miners against their definitions."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jdml.geometry import pairwise_distances
from jdml.miners import MINERS, Tuples, make_miner
from jdml.miners.distance import MAX_DISTANCE
from jdml.miners.diva import random_distance_labels
from jdml.miners.rho import push_mask
from jdml.miners.sets import negative_sets, positive_sets

B, D = 12, 8  # every batch has this shape, so each miner configuration compiles once
NUM_KEYS = 2048  # one key count everywhere: a configuration never compiles twice
TOL = 1e-5  # slack for distance comparisons between the test's and the miner's float32 math
NEW_MINERS = (
    "semihard",
    "softhard",
    "rho_distance",
    "npair",
    "lifted",
    "intra_random",
    "random_distance",
    "shared_neg_distance",
    "shared_full_distance",
)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _make_batches() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    labels = {
        "spc2": np.repeat(np.arange(6), 2) * 7 + 3,  # non-contiguous label values
        "spc4": np.repeat([5, 1, 9], 4),
        "mixed": np.array([0, 0, 0, 1, 1, 2, 3, 4, 4, 4, 4, 5]),  # singletons 2, 3, 5
    }
    batches = {name: (_unit(rng.normal(size=(B, D))), y) for name, y in labels.items()}
    x = batches["mixed"][0].copy()
    x[1] = x[0]  # duplicate within a class (d = 0)
    x[5] = x[3]  # duplicate across classes
    x[9] = x[8]
    x[11] = -x[0]  # antipodal (d = 2)
    batches["mixed"] = (x, labels["mixed"])
    e = np.eye(D, dtype=np.float32)
    batches["dup_antipodal"] = (
        np.stack([e[0], e[0], -e[0], -e[0], e[0], e[1], -e[1], e[1], e[2], -e[2], e[2], -e[0]]),
        np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
    )
    return batches


BATCHES = _make_batches()


CONFIGS: dict[str, tuple[str, dict]] = {name: (name, {}) for name in (*NEW_MINERS, "distance")}
CONFIGS |= {
    "semihard(margin=0.05)": ("semihard", {"margin": 0.05}),
    "rho_distance(push_prob=0.35)": ("rho_distance", {"push_prob": 0.35}),
    "intra_random(distinct)": ("intra_random", {"distinct": True}),
}


@functools.cache
def _all_miners():
    """Every configuration in one jitted program, vmapped over keys. Compilation, not running,
    dominates the cost on CPU, and one program compiles far faster than a dozen small ones."""
    fns = {config: make_miner(name, **hp) for config, (name, hp) in CONFIGS.items()}

    def run(key: jax.Array, x: jax.Array, labels: jax.Array) -> dict[str, Tuples]:
        return {config: fn(key, x, labels) for config, fn in fns.items()}

    return jax.jit(jax.vmap(run, in_axes=(0, None, None)))


@functools.cache
def _shuffled_labels():
    return jax.jit(jax.vmap(random_distance_labels, in_axes=(0, None)))


def _keys(num: int, seed: int = 0) -> jax.Array:
    return jax.random.split(jax.random.key(seed), num)


_DRAWS: dict[tuple[bytes, bytes, int], dict[str, Tuples]] = {}


def _draw(config: str, x: np.ndarray, labels: np.ndarray, *, seed: int = 0) -> Tuples:
    """NUM_KEYS draws (K, B) of one configuration on a batch (all configurations run at once)."""
    x, labels = np.asarray(x, np.float32), np.asarray(labels, np.int32)
    cache_key = (x.tobytes(), labels.tobytes(), seed)
    if cache_key not in _DRAWS:
        out = _all_miners()(_keys(NUM_KEYS, seed), jnp.asarray(x), jnp.asarray(labels))
        _DRAWS[cache_key] = {c: Tuples(*(np.asarray(v) for v in t)) for c, t in out.items()}
    return _DRAWS[cache_key][config]


def _dist(x: np.ndarray) -> np.ndarray:
    return np.asarray(pairwise_distances(jnp.asarray(x)))


def _masks(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    same = labels[:, None] == labels[None, :]
    return same & ~np.eye(len(labels), dtype=bool), ~same


def _check_well_formed(t: Tuples, *, arange_anchors: bool = True) -> None:
    assert all(v.dtype == np.int32 for v in t[:3]) and t.valid.dtype == bool
    for v in t[:3]:
        assert v.min() >= 0 and v.max() < B
    if arange_anchors:
        assert np.all(t.anchors == np.arange(B))


def _check_triplet(t: Tuples, labels: np.ndarray) -> None:
    """Valid rows: p of the anchor's label and another index, n of another label."""
    v = t.valid
    ya, yp, yn = labels[t.anchors], labels[t.positives], labels[t.negatives]
    assert np.all(yp[v] == ya[v]) and np.all(t.positives[v] != t.anchors[v])
    assert np.all(yn[v] != ya[v])


def _standard_validity(labels: np.ndarray) -> np.ndarray:
    pos, neg = _masks(labels)
    return np.broadcast_to(pos.any(1) & neg.any(1), (NUM_KEYS, B))


# ----------------------------------------------------------------------------- definitions


def check_semihard(t: Tuples, x: np.ndarray, labels: np.ndarray, margin: float = 0.2) -> None:
    _check_triplet(t, labels)
    np.testing.assert_array_equal(t.valid, _standard_validity(labels))
    _, neg = _masks(labels)
    d = _dist(x)
    d_ap = d[t.anchors, t.positives][..., None]  # (K, B, 1)
    row = d[t.anchors]  # (K, B, B)
    surely = (neg[t.anchors] & (row > d_ap + TOL) & (row < d_ap + margin - TOL)).any(-1)
    d_an = d[t.anchors, t.negatives]
    in_band = (d_an > d_ap[..., 0] - TOL) & (d_an < d_ap[..., 0] + margin + TOL)
    assert np.all(in_band[t.valid & surely])


def check_softhard(t: Tuples, x: np.ndarray, labels: np.ndarray) -> None:
    _check_triplet(t, labels)
    np.testing.assert_array_equal(t.valid, _standard_validity(labels))
    pos, neg = _masks(labels)
    d = _dist(x)
    far_pos = np.where(pos, d, -np.inf).max(1)
    near_neg = np.where(neg, d, np.inf).min(1)
    hard_neg_exists = (neg & (d < far_pos[:, None] - TOL)).any(1)
    hard_pos_exists = (pos & (d > near_neg[:, None] + TOL)).any(1)
    a, v = t.anchors, t.valid
    assert np.all((d[a, t.negatives] < far_pos[a] + TOL)[v & hard_neg_exists[a]])
    assert np.all((d[a, t.positives] > near_neg[a] - TOL)[v & hard_pos_exists[a]])


def check_rho_distance(t: Tuples, x: np.ndarray, labels: np.ndarray) -> None:
    pos, neg = _masks(labels)
    push = t.positives == t.anchors
    has_mate = pos.any(1)[t.anchors]
    np.testing.assert_array_equal(t.valid, has_mate & (push | neg.any(1)[t.anchors]))
    v, ya, yn = t.valid, labels[t.anchors], labels[t.negatives]
    assert np.all(yn[v & push] == ya[v & push])
    assert np.all(t.negatives[v & push] != t.anchors[v & push])
    standard = Tuples(t.anchors, t.positives, t.negatives, v & ~push)
    _check_triplet(standard, labels)
    np.testing.assert_array_equal(push_mask(t, labels), v & push)


def check_sets(t: Tuples, x: np.ndarray, labels: np.ndarray) -> None:
    _check_triplet(t, labels)
    np.testing.assert_array_equal(t.valid, _standard_validity(labels))


def check_intra_random(t: Tuples, x: np.ndarray, labels: np.ndarray) -> None:
    assert t.valid.all()
    ya = labels[t.anchors]
    assert np.all(labels[t.positives] == ya) and np.all(labels[t.negatives] == ya)
    # the class is uniform over the classes present, whatever their sizes
    classes = np.unique(labels)
    freq = (ya.ravel()[:, None] == classes).mean(0)
    sigma = np.sqrt((1 / len(classes)) * (1 - 1 / len(classes)) / ya.size)
    assert np.all(np.abs(freq - 1 / len(classes)) < 4 * sigma), freq


def check_random_distance(t: Tuples, x: np.ndarray, labels: np.ndarray) -> None:
    used = np.asarray(_shuffled_labels()(_keys(NUM_KEYS), jnp.asarray(labels)))
    assert np.all(np.sort(used, axis=1) == np.sort(labels))  # a permutation of the labels
    rows = np.arange(NUM_KEYS)[:, None]
    same = used[:, :, None] == used[:, None, :]
    has_pos = same.sum(-1) > 1
    has_neg = (~same).any(-1)
    np.testing.assert_array_equal(t.valid, has_pos & has_neg)
    v = t.valid
    ua, up, un = used[rows, t.anchors], used[rows, t.positives], used[rows, t.negatives]
    assert np.all(up[v] == ua[v]) and np.all(t.positives[v] != t.anchors[v])
    assert np.all(un[v] != ua[v])
    if len(np.unique(labels)) > 2:  # positives are mostly pairs of different true classes
        assert np.mean(labels[t.positives][v] != labels[t.anchors][v]) > 0.5


def check_shared(t: Tuples, x: np.ndarray, labels: np.ndarray) -> None:
    np.testing.assert_array_equal(t.valid, len(np.unique(labels)) >= 3)
    v = t.valid
    ya, yp, yn = labels[t.anchors][v], labels[t.positives][v], labels[t.negatives][v]
    assert np.all(ya != yp) and np.all(ya != yn) and np.all(yp != yn)


CHECKS = {
    "semihard": check_semihard,
    "softhard": check_softhard,
    "rho_distance": check_rho_distance,
    "npair": check_sets,
    "lifted": check_sets,
    "intra_random": check_intra_random,
    "random_distance": check_random_distance,
    "shared_neg_distance": check_shared,
    "shared_full_distance": check_shared,
    "distance": check_sets,  # the existing miner still fits the same definition checks
}


@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("name", [*NEW_MINERS, "distance"])
def test_miner_definition(name, batch):
    x, labels = BATCHES[batch]
    t = _draw(name, x, labels)
    _check_well_formed(t, arange_anchors=name != "intra_random")
    CHECKS[name](t, x, labels)
    drawn = np.concatenate([t.anchors, t.positives, t.negatives], axis=1)
    assert len(np.unique(drawn, axis=0)) > 1  # different keys give different tuples


def test_a_key_determines_its_draw():
    x, labels = map(jnp.asarray, BATCHES["mixed"])
    first = _all_miners()(_keys(NUM_KEYS, 21), x, labels)  # computed afresh, not cached
    second = _all_miners()(_keys(NUM_KEYS, 21), x, labels)
    other = _all_miners()(_keys(NUM_KEYS, 22), x, labels)
    for config in CONFIGS:
        for u, v in zip(first[config], second[config], strict=True):
            np.testing.assert_array_equal(u, v)
        assert any(
            not np.array_equal(u, w) for u, w in zip(first[config], other[config], strict=True)
        ), config


@pytest.mark.parametrize("name", NEW_MINERS)
def test_jit_equals_eager(name):
    x, labels = BATCHES["mixed"]
    eager = MINERS.get(name)(_keys(NUM_KEYS)[0], jnp.asarray(x), jnp.asarray(labels))
    batched = _draw(name, x, labels)
    for u, w in zip(eager, batched, strict=True):
        np.testing.assert_array_equal(np.asarray(u), w[0])


# ----------------------------------------------------------------------------- semihard/softhard


def _circle_batch() -> tuple[np.ndarray, np.ndarray]:
    """Points on a circle, so that chord distances 2 sin(|angle difference| / 2) are known."""
    angles = np.array([0.0, 0.6, 0.3, 0.7, 0.75, 1.0, 2.0, 2.2, np.pi, np.pi + 0.05, -1.5, -1.7])
    x = np.zeros((B, D), np.float32)
    x[:, 0], x[:, 1] = np.cos(angles), np.sin(angles)
    return x, np.repeat(np.arange(6), 2)


def _frequencies(indices: np.ndarray, row: int) -> np.ndarray:
    return np.bincount(indices[:, row], minlength=B) / len(indices)


def test_semihard_band_and_fallback():
    x, labels = _circle_batch()
    t = _draw("semihard", x, labels)
    # anchor 0: d_ap = 0.59; negatives 3 (d = 0.69) and 4 (0.73) lie in (0.59, 0.79)
    expected = np.zeros(B)
    expected[[3, 4]] = 0.5
    np.testing.assert_allclose(_frequencies(t.negatives, 0), expected, atol=0.07)
    # anchor 8: d_ap = 0.05 and no negative within 0.25: uniform over all 10 negatives
    expected = np.full(B, 0.1)
    expected[[8, 9]] = 0
    np.testing.assert_allclose(_frequencies(t.negatives, 8), expected, atol=0.05)


def test_softhard_hard_sets_and_fallback():
    x, labels = _circle_batch()
    t = _draw("softhard", x, labels)
    # anchor 0: the farthest positive is at 0.59, only negative 2 (d = 0.30) is closer
    assert np.all(t.negatives[:, 0] == 2)
    # anchor 8: no negative is closer than its positive: uniform fallback
    expected = np.full(B, 0.1)
    expected[[8, 9]] = 0
    np.testing.assert_allclose(_frequencies(t.negatives, 8), expected, atol=0.05)
    assert np.all(t.positives[:, 8] == 9)


def test_semihard_margin_is_a_hyperparameter():
    x, labels = _circle_batch()
    t = _draw("semihard(margin=0.05)", x, labels)  # band (0.59, 0.64): empty for anchor 0
    assert len(np.unique(t.negatives[:, 0])) > 2
    check_semihard(t, x, labels, margin=0.05)


# ----------------------------------------------------------------------------- distance weights


def _np_log_weights(x: np.ndarray, lower: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Float64 distances and log q(d)^-1 of every pair."""
    x64 = x.astype(np.float64)
    d = np.linalg.norm(x64[:, None] - x64[None], axis=-1)
    dc = np.clip(d, lower, MAX_DISTANCE)
    dim = x.shape[1]
    return d, (2 - dim) * np.log(dc) - (dim - 3) / 2 * np.log(1 - dc**2 / 4)


def _np_weighted(log_w: np.ndarray, d: np.ndarray, allowed: np.ndarray, upper: float | None):
    """One sampling distribution: q^-1 weights within the cutoff, else uniform over allowed."""
    within = allowed if upper is None else allowed & (d < upper)
    if within.any():
        w = np.where(within, np.exp(log_w - log_w[within].max()), 0.0)
    else:
        w = allowed.astype(np.float64)
    return w / max(w.sum(), 1e-300)


def _np_negative_probs(x: np.ndarray, labels: np.ndarray, upper: float | None = 1.4):
    d, log_w = _np_log_weights(x)
    return np.stack([_np_weighted(log_w[i], d[i], labels != labels[i], upper) for i in range(B)])


def _np_shared_positive_probs(x: np.ndarray, labels: np.ndarray, *, weighted: bool):
    """P(positive = j | anchor): the mixture over negatives of the third-class distribution."""
    d, log_w = _np_log_weights(x)
    neg = _np_negative_probs(x, labels)
    probs = np.zeros((B, B))
    for i in range(B):
        for n in np.flatnonzero(neg[i]):
            third = (labels != labels[i]) & (labels != labels[n])
            given = _np_weighted(log_w[i], d[i], third, 1.4) if weighted else third / third.sum()
            probs[i] += neg[i, n] * given
    return probs


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square over all rows at once; cells expecting < 5 draws are pooled per row."""
    observed, expected, rows = [], [], 0
    for c, p in zip(counts, probs, strict=True):
        total = c.sum()
        if total == 0:
            continue
        assert c[p == 0].sum() == 0, "a zero-probability column was drawn"
        e = p * total
        big, small = e >= 5, (e < 5) & (p > 0)
        observed += [*c[big], c[small].sum()] if small.any() else list(c[big])
        expected += [*e[big], e[small].sum()] if small.any() else list(e[big])
        rows += 1
    return stats.chisquare(observed, expected, ddof=rows - 1).pvalue


def _counts(indices: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(K, B) drawn columns, (K, B) bool rows to count -> (B, B) counts per anchor."""
    counts = np.zeros((B, B), np.int64)
    for i in range(B):
        counts[i] = np.bincount(indices[mask[:, i], i], minlength=B)
    return counts


@pytest.fixture(scope="module")
def chi_batch() -> tuple[np.ndarray, np.ndarray]:
    x = _unit(np.random.default_rng(5).normal(size=(B, D)))
    labels = np.repeat(np.arange(4), 3)
    d = np.linalg.norm(x[:, None].astype(np.float64) - x[None], axis=-1)
    assert np.abs(d - 1.4).min() > 1e-3  # no pair on the cutoff, where float32 could disagree
    probs = _np_negative_probs(x, labels)
    assert ((probs == 0) & (labels[:, None] != labels)).any()  # the cutoff is exercised
    return x, labels


WEIGHTED_BATCHES = ["chi", "dup_antipodal"]  # the latter: zero and maximal distances


@pytest.fixture(params=WEIGHTED_BATCHES)
def weighted_batch(request, chi_batch) -> tuple[np.ndarray, np.ndarray]:
    return chi_batch if request.param == "chi" else BATCHES[request.param]


def test_shared_neg_distance_negative_frequencies(weighted_batch):
    x, labels = weighted_batch
    t = _draw("shared_neg_distance", x, labels, seed=11)
    assert t.valid.all()
    counts = _counts(t.negatives, t.valid)
    expected = _np_negative_probs(x, labels)
    assert _chi2_pvalue(counts, expected) > 1e-3
    uniform = labels[:, None] != labels
    if (expected > 0).sum(1).max() > 1:  # the test has the power to tell the weights apart
        assert _chi2_pvalue(counts, uniform / uniform.sum(1, keepdims=True)) < 1e-3


@pytest.mark.parametrize("name", ["shared_neg_distance", "shared_full_distance"])
def test_shared_positive_frequencies(weighted_batch, name):
    x, labels = weighted_batch
    t = _draw(name, x, labels, seed=12)
    expected = _np_shared_positive_probs(x, labels, weighted=name == "shared_full_distance")
    assert _chi2_pvalue(_counts(t.positives, t.valid), expected) > 1e-3


def test_rho_distance_standard_rows_follow_the_weights(weighted_batch):
    x, labels = weighted_batch
    t = _draw("rho_distance", x, labels, seed=13)
    standard = t.valid & (t.positives != t.anchors)
    counts = _counts(t.negatives, standard)
    assert _chi2_pvalue(counts, _np_negative_probs(x, labels)) > 1e-3


@pytest.mark.parametrize("push_prob", [0.2, 0.35])
def test_rho_distance_push_frequency(chi_batch, push_prob):
    x, labels = chi_batch  # every sample has a same-class mate, so every row is valid
    config = "rho_distance" if push_prob == 0.2 else f"rho_distance(push_prob={push_prob})"
    t = _draw(config, x, labels, seed=14)
    assert t.valid.all()
    push = push_mask(t, labels)
    np.testing.assert_array_equal(push, t.positives == t.anchors)
    n = push.size
    assert abs(push.mean() - push_prob) < 4 * np.sqrt(push_prob * (1 - push_prob) / n)
    # push "negatives" are uniform over the two other members of the anchor's class
    np.testing.assert_allclose(_frequencies(t.negatives[push[:, 0]], 0)[[1, 2]], 0.5, atol=0.05)


def test_rho_distance_push_prob_extremes(chi_batch):
    x, labels = map(jnp.asarray, chi_batch)
    rho = MINERS.get("rho_distance")
    assert not push_mask(rho(jax.random.key(0), x, labels, push_prob=0.0), labels).any()
    assert push_mask(rho(jax.random.key(0), x, labels, push_prob=1.0), labels).all()
    with pytest.raises(ValueError, match="push_prob"):
        rho(jax.random.key(0), x, labels, push_prob=1.5)


# ----------------------------------------------------------------------------- sets, intra


def test_npair_and_lifted_sets():
    x, labels = BATCHES["mixed"]
    t = MINERS.get("lifted")(jax.random.key(0), jnp.asarray(x), jnp.asarray(labels))
    pos, neg = _masks(labels)
    valid = np.asarray(t.valid)
    np.testing.assert_array_equal(positive_sets(t, jnp.asarray(labels)), pos & valid[:, None])
    np.testing.assert_array_equal(negative_sets(t, jnp.asarray(labels)), neg & valid[:, None])


def test_intra_random_with_replacement():
    x, labels = BATCHES["spc2"]
    t = _draw("intra_random", x, labels)
    # a and p are independent draws from a 2-sample class: equal half of the time
    same = (t.anchors == t.positives).mean()
    assert abs(same - 0.5) < 4 * np.sqrt(0.25 / t.anchors.size)
    assert (t.anchors == t.negatives).any()


def test_intra_random_distinct():
    x, labels = BATCHES["mixed"]  # only classes 0 (3 samples) and 4 (4 samples) qualify
    t = _draw("intra_random(distinct)", x, labels)
    _check_well_formed(t, arange_anchors=False)
    assert t.valid.all()
    a, p, n = t.anchors, t.positives, t.negatives
    assert np.all((a != p) & (a != n) & (p != n))
    ya = labels[a]
    assert np.all((labels[p] == ya) & (labels[n] == ya))
    assert set(np.unique(ya)) == {0, 4}
    assert abs((ya == 0).mean() - 0.5) < 4 * np.sqrt(0.25 / ya.size)
    spc2 = _draw("intra_random(distinct)", *BATCHES["spc2"])
    assert not spc2.valid.any()
    np.testing.assert_array_equal(spc2.anchors, np.broadcast_to(np.arange(B), spc2.anchors.shape))


# ----------------------------------------------------------------------------- degenerate batches

ONE_CLASS = np.zeros(B, np.int64)
SINGLETONS = np.arange(B) * 3
TWO_CLASSES = np.repeat([4, 2], B // 2)
SAME_LABEL_POSITIVE = ("semihard", "softhard", "npair", "lifted", "random_distance", "distance")
NO_VALID_CASES = [
    *[(name, "one_class") for name in SAME_LABEL_POSITIVE],
    *[(name, "singletons") for name in SAME_LABEL_POSITIVE],
    ("rho_distance", "singletons"),
    ("shared_neg_distance", "one_class"),
    ("shared_neg_distance", "two_classes"),
    ("shared_full_distance", "one_class"),
    ("shared_full_distance", "two_classes"),
    ("intra_random(distinct)", "singletons"),
]
DEGENERATE_LABELS = {"one_class": ONE_CLASS, "singletons": SINGLETONS, "two_classes": TWO_CLASSES}


@pytest.mark.parametrize(("config", "labels"), NO_VALID_CASES)
def test_batches_without_valid_tuples(config, labels):
    x = BATCHES["mixed"][0]
    t = _draw(config, x, DEGENERATE_LABELS[labels])
    _check_well_formed(t, arange_anchors=not config.startswith("intra_random"))
    assert not t.valid.any()


def test_documented_degenerate_validity():
    x = BATCHES["mixed"][0]
    # rho: in a one-class batch exactly the push rows are valid
    t = _draw("rho_distance", x, ONE_CLASS)
    np.testing.assert_array_equal(t.valid, t.positives == t.anchors)
    assert t.valid.any() and not t.valid.all()
    # shared_*: singletons still give triplets of three different classes
    for name in ("shared_neg_distance", "shared_full_distance"):
        t = _draw(name, x, SINGLETONS)
        assert t.valid.all()
        assert np.all((t.anchors != t.positives) & (t.positives != t.negatives))
    # intra_random (reference): always valid; singleton classes give (i, i, i)
    t = _draw("intra_random", x, SINGLETONS)
    assert t.valid.all() and np.all((t.anchors == t.positives) & (t.anchors == t.negatives))
    assert _draw("intra_random", x, ONE_CLASS).valid.all()


# ----------------------------------------------------------------------------- registry


def test_registry_and_hyperparameters():
    assert set(NEW_MINERS) | {"distance", "random"} <= set(MINERS.names())
    with pytest.raises(TypeError, match="margn"):
        make_miner("semihard", margn=0.1)
    with pytest.raises(TypeError, match="upper_cutoff"):
        make_miner("npair", upper_cutoff=1.4)
    make_miner("rho_distance", push_prob=0.35, upper_cutoff=None)
