"""Proxy/classifier losses (proxynca, softmax, arcface, softtriplet) against NumPy float64 loops."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.losses import LOSSES, check_compatible
from jdml.losses.arcface import ArcFaceLoss
from jdml.losses.proxynca import ProxyNCALoss
from jdml.losses.softmax import NormSoftmaxLoss
from jdml.losses.softtriplet import SoftTripleLoss
from tests.helpers import central_differences

NUM_CLASSES = 4
DIM = 4


# ----------------------------------------------------------------------------- references


def np_normalize(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.sqrt(np.sum(v * v))), 1e-12)


def np_cross_entropy(logits: list[float], y: int) -> float:
    top = max(logits)
    return top + math.log(sum(math.exp(v - top) for v in logits)) - logits[y]


def np_proxynca(x, labels, proxies, *, scale=3.0) -> float:
    total = 0.0
    for i, y in enumerate(labels):
        xi = scale * np_normalize(x[i])
        d = [float(np.sum((xi - scale * np_normalize(p)) ** 2)) for p in proxies]
        neg = [-d[c] for c in range(len(proxies)) if c != y]
        top = max(neg)
        total += d[y] + top + math.log(sum(math.exp(v - top) for v in neg))
    return total / len(labels)


def np_softmax(x, labels, class_map, *, temperature=0.05) -> float:
    total = 0.0
    for i, y in enumerate(labels):
        logits = [float(x[i] @ np_normalize(w)) / temperature for w in class_map]
        total += np_cross_entropy(logits, y)
    return total / len(labels)


def np_arcface(x, labels, class_map, *, margin=0.5, scale=16.0, reference_clamp=False) -> float:
    low, high = (1e-10 if reference_clamp else -1 + 1e-7), 1 - 1e-7
    total = 0.0
    for i, y in enumerate(labels):
        cos = [min(max(float(x[i] @ np_normalize(w)), low), high) for w in class_map]
        logits = [scale * c for c in cos]
        logits[y] = scale * math.cos(math.acos(cos[y]) + margin)
        total += np_cross_entropy(logits, y)
    return total / len(labels)


def np_softtriplet(
    x, labels, centroids, *, k, lam, gamma=0.1, delta=0.01, tau=0.2, reference_quirks=False
) -> tuple[float, float]:
    """Returns (loss, regulariser)."""
    dim, ck = centroids.shape
    c_num = ck // k
    w = np.zeros_like(centroids)
    if reference_quirks:  # each embedding dimension normalised across all centres
        for d in range(dim):
            w[d] = np_normalize(centroids[d])
    else:
        for j in range(ck):
            w[:, j] = np_normalize(centroids[:, j])
    total = 0.0
    for i, y in enumerate(labels):
        s = [[float(x[i] @ w[:, c * k + q]) for q in range(k)] for c in range(c_num)]
        weights = [[0.0] * k for _ in range(c_num)]
        if reference_quirks:  # softmax over classes of gamma * S
            for q in range(k):
                z = sum(math.exp(gamma * s[c][q]) for c in range(c_num))
                for c in range(c_num):
                    weights[c][q] = math.exp(gamma * s[c][q]) / z
        else:  # softmax over each class's centres of S / gamma
            for c in range(c_num):
                z = sum(math.exp(s[c][q] / gamma) for q in range(k))
                for q in range(k):
                    weights[c][q] = math.exp(s[c][q] / gamma) / z
        class_s = [sum(weights[c][q] * s[c][q] for q in range(k)) for c in range(c_num)]
        logits = [lam * (class_s[c] - (delta if c == y else 0.0)) for c in range(c_num)]
        total += np_cross_entropy(logits, y)
    reg = 0.0
    for c in range(c_num):
        for a in range(k):
            for b in range(a + 1, k):
                sim = float(w[:, c * k + a] @ w[:, c * k + b])
                reg += math.sqrt(max(2 + 1e-5 - 2 * sim, 1e-12))
    reg = reg / (c_num * k * (k - 1)) if k > 1 else 0.0
    return total / len(labels) + tau * reg, reg


@dataclasses.dataclass(frozen=True)
class Case:
    cls: type
    fields: tuple[tuple[str, object], ...]
    param: str
    reference: object  # (x, labels, param, **fields) -> loss

    def np_loss(self, x, labels, value) -> float:
        x, value = np.asarray(x, np.float64), np.asarray(value, np.float64)
        out = self.reference(x, list(np.asarray(labels)), value, **self.np_fields())
        return out[0] if isinstance(out, tuple) else out

    def np_fields(self) -> dict:
        fields = dict(self.fields)
        if self.cls is SoftTripleLoss:
            fields = {
                "k": fields.get("n_centroids", 10),
                "lam": fields.get("lam", 20.0),
                "reference_quirks": fields.get("reference_quirks", False),
            }
        return fields


CASES = {
    "proxynca": Case(ProxyNCALoss, (), "proxies", np_proxynca),
    "softmax": Case(NormSoftmaxLoss, (), "class_map", np_softmax),
    "arcface": Case(ArcFaceLoss, (), "class_map", np_arcface),
    "arcface_ref": Case(ArcFaceLoss, (("reference_clamp", True),), "class_map", np_arcface),
    "softtriplet": Case(SoftTripleLoss, (), "centroids", np_softtriplet),
    "softtriplet_ref": Case(
        SoftTripleLoss,
        (("reference_quirks", True), ("n_centroids", 2), ("lam", 8.0)),
        "centroids",
        np_softtriplet,
    ),
}


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fns():
    """Per case: (module, jitted apply, jitted grad w.r.t. (params, embeddings), jitted init)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            module = CASES[name].cls(num_classes=NUM_CLASSES, **dict(CASES[name].fields))
            grad = jax.grad(lambda prm, x, y: module.apply(prm, x, y)[0], argnums=(0, 1))
            cache[name] = (module, jax.jit(module.apply), jax.jit(grad), jax.jit(module.init))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def batch():
    """B = 6 unit-norm embeddings in D = 4; class 1 has a single sample, class 3 none."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, DIM))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), np.array([0, 0, 1, 2, 2, 2], np.int32)


def _params(name: str, value) -> dict:
    return {"params": {CASES[name].param: jnp.asarray(value, jnp.float32)}}


def _random_params(name: str, fns, x, labels, seed: int = 0) -> dict:
    init = fns(name)[3]
    return init(jax.random.key(seed), jnp.asarray(x), jnp.asarray(labels))


def _assert_grad_close(got, want) -> None:
    got = np.asarray(got, np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * max(np.abs(want).max(), 1.0))


# ----------------------------------------------------------------------------- per-loss checks


@pytest.mark.parametrize("name", list(CASES))
def test_matches_numpy_and_eager(fns, batch, name):
    module, apply, _, _ = fns(name)
    x, labels = batch
    params = _random_params(name, fns, x, labels)
    loss, metrics = apply(params, x, labels)
    eager, _ = module.apply(params, x, labels)
    want = CASES[name].np_loss(x, labels, params["params"][CASES[name].param])
    assert loss.dtype == jnp.float32 and loss.shape == ()
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(eager, loss, rtol=1e-6)
    assert 0.0 <= metrics["accuracy"] <= 1.0


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_finite_differences(fns, batch, name):
    _, _, grad, _ = fns(name)
    case = CASES[name]
    x, labels = batch
    value = np.asarray(_random_params(name, fns, x, labels, seed=1)["params"][case.param])
    dparams, dx = grad(_params(name, value), jnp.asarray(x), labels)
    want_dx = central_differences(lambda v: case.np_loss(v, labels, value), x)
    want_dp = central_differences(lambda v: case.np_loss(x, labels, v), value)
    assert np.any(want_dx != 0) and np.any(want_dp != 0)
    _assert_grad_close(dx, want_dx)
    _assert_grad_close(dparams["params"][case.param], want_dp)


@pytest.mark.parametrize("name", list(CASES))
def test_bf16_inputs_give_f32(fns, batch, name):
    _, apply, _, _ = fns(name)
    x, labels = batch
    params = _random_params(name, fns, x, labels)
    x16 = jnp.asarray(x, jnp.bfloat16)
    loss, metrics = apply(params, x16, labels)
    assert loss.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in metrics.values())
    want = CASES[name].np_loss(
        np.asarray(x16, np.float32), labels, params["params"][CASES[name].param]
    )
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def _axis_params(name: str) -> np.ndarray:
    """Params whose (normalised) rows / centres are the unit axes: cosines of exactly +-1."""
    if CASES[name].cls is SoftTripleLoss:
        k = dict(CASES[name].fields).get("n_centroids", 10)
        cols = [np.eye(DIM)[c % DIM] for c in range(NUM_CLASSES) for _ in range(k)]
        return np.stack(cols, axis=1)  # all K centres of class c equal e_c
    return np.eye(NUM_CLASSES, DIM)


def _degenerate_batches() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    u, v, w = (np_normalize(r) for r in rng.normal(size=(3, DIM)))
    e0, e1 = np.eye(DIM)[0], np.eye(DIM)[1]
    batches = {
        "duplicates": ([u, u, v, v], [0, 0, 1, 1]),
        "all_equal": ([u, u, u, u], [0, 1, 2, 3]),
        "single_sample_classes": ([u, v, w, -u], [0, 1, 2, 3]),
        "cos_plus_minus_one": ([e0, -e0, e1, -e1], [0, 0, 1, 2]),
        "zero_embedding": ([np.zeros(DIM), u, v, w], [0, 1, 2, 3]),
    }
    return {
        k: (np.asarray(x, np.float32), np.asarray(y, np.int32)) for k, (x, y) in batches.items()
    }


@pytest.mark.parametrize("name", list(CASES))
def test_degenerate_inputs_are_finite(fns, batch, name):
    _, apply, grad, _ = fns(name)
    param_sets = {
        "random": np.asarray(_random_params(name, fns, *batch)["params"][CASES[name].param]),
        "axes": _axis_params(name),
    }
    for pname, value in param_sets.items():
        params = _params(name, value)
        for bname, (x, labels) in _degenerate_batches().items():
            loss, metrics = apply(params, x, labels)
            dparams, dx = grad(params, jnp.asarray(x), labels)
            where = f"{name}/{pname}/{bname}"
            assert np.isfinite(loss), where
            assert all(np.isfinite(m) for m in metrics.values()), where
            assert np.all(np.isfinite(dx)), where
            assert np.all(np.isfinite(dparams["params"][CASES[name].param])), where
            want = CASES[name].np_loss(x, labels, value)
            np.testing.assert_allclose(loss, want, rtol=2e-4, atol=1e-5, err_msg=where)


# ----------------------------------------------------------------------------- hand-computed


def test_proxynca_hand_computed(fns):
    _, apply, _, _ = fns("proxynca")
    # proxies normalise to e0, e1, -e0, -e1; with scale 3, d = 18 (1 - cos)
    proxies = np.array([[2.0, 0.0], [0.0, 0.5], [-1.0, 0.0], [0.0, -4.0]])
    x = np.array([[2.0, 0.0], [0.0, 3.0]], np.float32)
    # sample 0: d = (0, 18, 36, 18) -> 0 + log(2 e^-18 + e^-36)
    # sample 1: d = (18, 0, 18, 36) -> 0 + log(2 e^-18 + e^-36)
    loss, metrics = apply(_params("proxynca", proxies), x, np.array([0, 1]))
    np.testing.assert_allclose(loss, -18 + math.log(2 + math.exp(-18)), rtol=1e-6)
    assert metrics["accuracy"] == 1.0


def test_softmax_hand_computed(fns):
    _, apply, _, _ = fns("softmax")
    class_map = np.array([[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0], [0.0, -1.0]])
    x = np.array([[1.0, 0.0], [0.6, 0.8]], np.float32)
    # logits (20, 0, -20, 0) and (12, 16, -12, -16), both labelled 0
    ce0 = math.log(1 + 2 * math.exp(-20) + math.exp(-40))
    ce1 = 4 + math.log(1 + math.exp(-4) + math.exp(-24) + math.exp(-32))
    loss, metrics = apply(_params("softmax", class_map), x, np.array([0, 0]))
    np.testing.assert_allclose(loss, (ce0 + ce1) / 2, rtol=1e-6)
    assert metrics["accuracy"] == 0.5


@pytest.mark.parametrize("name", ["arcface", "arcface_ref"])
def test_arcface_hand_computed(fns, name):
    _, apply, _, _ = fns(name)
    class_map = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0], [0.0, -1.0]])
    x = np.array([[0.6, 0.8], [0.8, -0.6]], np.float32)
    t = math.cos(math.acos(0.8) + 0.5)  # the target cosine is 0.8 in both samples
    neg = 1e-10 if name == "arcface_ref" else None  # the reference clamp zeroes cos < 0

    def lse(cos):
        return math.log(sum(math.exp(16 * c) for c in cos))

    # sample 0 (label 1): cos (0.6, 0.8, -0.6, -0.8); sample 1 (label 0): (0.8, -0.6, -0.8, 0.6)
    ce0 = lse([0.6, t, neg or -0.6, neg or -0.8]) - 16 * t
    ce1 = lse([t, neg or -0.6, neg or -0.8, 0.6]) - 16 * t
    loss, metrics = apply(_params(name, class_map), x, np.array([1, 0]))
    np.testing.assert_allclose(loss, (ce0 + ce1) / 2, rtol=1e-6)
    assert metrics["accuracy"] == 1.0


def test_softtriplet_hand_computed():
    module = SoftTripleLoss(num_classes=2, n_centroids=2)
    # class 0 centres e0, e1 (unnormalised); class 1 centres -e0, -e1
    centroids = np.array([[2.0, 0.0, -1.0, 0.0], [0.0, 3.0, 0.0, -1.0]])
    x = np.array([[1.0, 0.0], [0.0, -1.0]], np.float32)

    def relaxed(a, b):  # sum_k softmax_k(S / 0.1) S over one class's two similarities
        ea, eb = math.exp(10 * a), math.exp(10 * b)
        return (a * ea + b * eb) / (ea + eb)

    # both samples: similarities (1, 0) to their own class's centres, (-1, 0) to the other's
    own, other = 20 * (relaxed(1.0, 0.0) - 0.01), 20 * relaxed(-1.0, 0.0)
    ce = math.log(math.exp(own) + math.exp(other)) - own
    reg = 2 * math.sqrt(2.00001) / (2 * 2 * 1)  # one orthogonal pair per class
    params = {"params": {"centroids": jnp.asarray(centroids, jnp.float32)}}
    loss, metrics = jax.jit(module.apply)(params, x, np.array([0, 1]))
    np.testing.assert_allclose(loss, ce + 0.2 * reg, rtol=1e-6)
    np.testing.assert_allclose(metrics["regulariser"], reg, rtol=1e-6)
    assert metrics["accuracy"] == 1.0


# ----------------------------------------------------------------------------- options


def test_reference_options_change_the_value(fns, batch):
    x, labels = batch
    # arcface: the batch has negative non-target cosines, which the reference clamp zeroes
    p = _random_params("arcface", fns, x, labels)
    intended, reference = fns("arcface")[1](p, x, labels)[0], fns("arcface_ref")[1](p, x, labels)[0]
    assert abs(float(intended - reference)) > 1e-3
    # softtriplet: the quirks alone (same K = 2, lambda = 8, gamma) change the loss
    plain = SoftTripleLoss(num_classes=NUM_CLASSES, n_centroids=2, lam=8.0)
    p = _random_params("softtriplet_ref", fns, x, labels)
    loss = jax.jit(plain.apply)(p, x, labels)[0]
    assert abs(float(loss - fns("softtriplet_ref")[1](p, x, labels)[0])) > 1e-3
    want, _ = np_softtriplet(x, labels, np.asarray(p["params"]["centroids"]), k=2, lam=8.0)
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_softtriplet_reference_regulariser_floor():
    # with the reference's axis, columns are not unit: equal centres give w.w' = 2 > 1
    module = SoftTripleLoss(num_classes=2, n_centroids=2, reference_quirks=True)
    x = np.tile(np_normalize(np.ones(8)), (2, 1)).astype(np.float32)
    labels = np.array([0, 1])
    params = {"params": {"centroids": jnp.ones((8, 4), jnp.float32)}}

    @jax.jit
    def value_and_grads(prm, v):
        (loss, metrics), grads = jax.value_and_grad(
            lambda a, b: module.apply(a, b, labels), argnums=(0, 1), has_aux=True
        )(prm, v)
        return loss, metrics, grads

    loss, metrics, (dparams, dx) = value_and_grads(params, jnp.asarray(x))
    np.testing.assert_allclose(metrics["regulariser"], 2 * math.sqrt(1e-12) / 4, rtol=1e-3)
    assert np.isfinite(loss) and np.all(np.isfinite(dx))
    assert np.all(np.isfinite(dparams["params"]["centroids"]))


def test_softtriplet_single_centre_has_no_regulariser(batch):
    x, labels = batch
    module = SoftTripleLoss(num_classes=NUM_CLASSES, n_centroids=1)
    params = _init(module, x, labels)
    loss, metrics = jax.jit(module.apply)(params, x, labels)
    assert metrics["regulariser"] == 0.0 and np.isfinite(loss)
    want, _ = np_softtriplet(x, labels, np.asarray(params["params"]["centroids"]), k=1, lam=20.0)
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_proxynca_needs_two_classes(batch):
    x, _ = batch
    with pytest.raises(ValueError, match="at least 2 classes"):
        jax.eval_shape(ProxyNCALoss(num_classes=1).init, jax.random.key(0), x, np.zeros(6, int))


# ----------------------------------------------------------------------------- init / interface


def _init(module, x, labels, seed: int = 0) -> dict:
    return jax.jit(module.init)(jax.random.key(seed), jnp.asarray(x), jnp.asarray(labels))


def test_param_init_shapes_and_ranges():
    x, y = np.zeros((2, 32), np.float32), np.zeros((2,), np.int32)
    proxies = _init(ProxyNCALoss(num_classes=40), x, y)["params"]["proxies"]
    assert proxies.shape == (40, 32) and proxies.dtype == jnp.float32
    assert 0.11 < float(jnp.std(proxies)) < 0.14 and abs(float(jnp.mean(proxies))) < 0.01
    for cls in (NormSoftmaxLoss, ArcFaceLoss):
        w = _init(cls(num_classes=40), x, y)["params"]["class_map"]
        assert w.shape == (40, 32) and w.dtype == jnp.float32
        bound = 1 / math.sqrt(32)
        assert 0.9 * bound < float(jnp.max(jnp.abs(w))) <= bound
    c = _init(SoftTripleLoss(num_classes=40, n_centroids=3), x, y)["params"]["centroids"]
    assert c.shape == (32, 120) and c.dtype == jnp.float32
    bound = 1 / math.sqrt(120)
    assert 0.9 * bound < float(jnp.max(jnp.abs(c))) <= bound
    # a pure function of the key
    np.testing.assert_array_equal(
        proxies, _init(ProxyNCALoss(num_classes=40), x, y)["params"]["proxies"]
    )
    assert not np.array_equal(
        proxies, _init(ProxyNCALoss(num_classes=40), x, y, 1)["params"]["proxies"]
    )


EXPECTED_LR = {
    "proxynca": ("proxy_lr_multiplier", 50.0),
    "softmax": ("class_lr_multiplier", 1.0),
    "arcface": ("class_lr_multiplier", 50.0),
    "softtriplet": ("centroid_lr_multiplier", 1.0),
}


@pytest.mark.parametrize("name", list(EXPECTED_LR))
def test_interface_and_learning_rates(name):
    cls = LOSSES.get(name)
    field, default = EXPECTED_LR[name]
    assert cls.loss_name == name and not cls.needs_miner
    assert cls.param_lr == field and cls.param_lr_is_multiplier
    assert getattr(cls(num_classes=NUM_CLASSES), field) == default
    check_compatible(name, None)
    with pytest.raises(ValueError, match="takes no miner"):
        check_compatible(name, "distance")
    with pytest.raises(TypeError):
        cls(NUM_CLASSES)  # hyperparameters are keyword-only
    # the optimiser gives the loss subtree lr * multiplier and no weight decay
    from jdml.config import base_config
    from jdml.methods.terms import MetricTerm

    config = base_config()
    config.loss.name = name
    config.optim.lr = 1e-5
    term = MetricTerm(
        head="h", weight=1.0, loss=config.loss, miner=config.miner, num_classes=NUM_CLASSES
    )
    assert term.param_group().resolve(config.optim)[:2] == (pytest.approx(1e-5 * default), 0.0)
