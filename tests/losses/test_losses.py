"""Losses against NumPy loops over explicit tuples, plus gradients at degenerate points."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.errors import UnknownNameError
from jdml.losses import LOSSES, Loss, check_compatible, register_loss
from jdml.losses.margin import MarginLoss
from jdml.losses.triplet import TripletLoss
from jdml.miners import MINERS, Tuples

NUM_CLASSES = 4


# ----------------------------------------------------------------------------- references


def np_triplet(x, a, p, n, valid, *, margin=0.2) -> float:
    x = np.asarray(x, np.float64)
    terms = [
        max(np.sum((x[i] - x[j]) ** 2) - np.sum((x[i] - x[k]) ** 2) + margin, 0.0)
        for i, j, k, v in zip(a, p, n, valid, strict=True)
        if v
    ]
    return float(np.mean(terms)) if terms else 0.0


def np_margin(x, labels, a, p, n, valid, beta, *, margin=0.2, nu=0.0):
    """Returns (loss, d loss / d beta) for per-class (1-D) or scalar (0-D) beta."""
    x = np.asarray(x, np.float64)
    beta = np.asarray(beta, np.float64)
    total, count, reg = 0.0, 0, 0.0
    dbeta_terms = []  # (class or None, unnormalised derivative)
    for i, j, k, v in zip(a, p, n, valid, strict=True):
        if not v:
            continue
        c = None if beta.ndim == 0 else labels[i]
        b = beta if c is None else beta[c]
        d_ap = np.sqrt(np.sum((x[i] - x[j]) ** 2) + 1e-8)
        d_an = np.sqrt(np.sum((x[i] - x[k]) ** 2) + 1e-8)
        pos = max(d_ap - b + margin, 0.0)
        neg = max(b - d_an + margin, 0.0)
        total += pos + neg
        count += int(pos > 0) + int(neg > 0)
        reg += b
        dbeta_terms.append((c, -float(pos > 0) + float(neg > 0) + nu))
    denom = max(count, 1)
    grad = np.zeros_like(beta)
    for c, g in dbeta_terms:
        if c is None:
            grad += g / denom
        else:
            grad[c] += g / denom
    return (total + nu * reg) / denom, grad


# ----------------------------------------------------------------------------- fixtures


def _tuples(a, p, n, valid) -> Tuples:
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return Tuples(i32(a), i32(p), i32(n), jnp.asarray(valid, bool))


@pytest.fixture(scope="module")
def batch():
    """A random batch (B = 8, D = 5) with hand-picked tuples, including an invalid one."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5)).astype(np.float32) * 0.6
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    a = [0, 1, 2, 3, 4, 5, 6, 7]
    p = [1, 0, 3, 2, 5, 4, 7, 6]
    n = [2, 4, 0, 7, 6, 1, 3, 2]
    valid = [True, True, True, False, True, True, True, True]
    return x, labels, (a, p, n, valid)


@pytest.fixture(scope="module")
def margin_fn():
    """Jitted (loss, metrics) and gradients w.r.t. (params, embeddings), per module config."""
    cache = {}

    def get(**fields):
        key = tuple(sorted(fields.items()))
        if key not in cache:
            module = MarginLoss(num_classes=NUM_CLASSES, **fields)
            apply = jax.jit(module.apply)
            grad = jax.jit(
                jax.grad(lambda prm, x, y, t: module.apply(prm, x, y, t)[0], argnums=(0, 1))
            )
            cache[key] = (module, apply, grad)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def triplet_fn():
    module = TripletLoss()
    apply = jax.jit(module.apply)
    grad = jax.jit(jax.grad(lambda x, y, t: module.apply({}, x, y, t)[0]))
    return module, apply, grad


def _params(beta: np.ndarray) -> dict:
    return {"params": {"beta": jnp.asarray(beta, jnp.float32)}}


# ----------------------------------------------------------------------------- triplet


def test_triplet_hand_computed(triplet_fn):
    _, apply, _ = triplet_fn
    x = jnp.array([[0.0, 0.0], [0.5, 0.0], [0.0, 0.5], [1.5, 0.0], [3.0, 0.0]])
    labels = jnp.array([0, 0, 1, 0, 1])
    # (0.25 - 0.25 + 0.2) = 0.2 and [2.25 - 9 + 0.2]_+ = 0; the invalid third one is ignored
    t = _tuples([0, 0, 4], [1, 3, 4], [2, 4, 0], [True, True, False])
    loss, metrics = apply({}, x, labels, t)
    np.testing.assert_allclose(loss, 0.1, rtol=1e-6)
    np.testing.assert_allclose(metrics["active_fraction"], 0.5)
    np.testing.assert_allclose(metrics["valid_fraction"], 2 / 3, rtol=1e-6)


def test_triplet_matches_numpy_and_eager(triplet_fn, batch):
    module, apply, _ = triplet_fn
    x, labels, tup = batch
    t = _tuples(*tup)
    jitted, _ = apply({}, x, labels, t)
    eager, _ = module.apply({}, x, labels, t)
    np.testing.assert_allclose(jitted, np_triplet(x, *tup), rtol=1e-5)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)


def test_triplet_degenerate_gradients(triplet_fn):
    _, apply, grad = triplet_fn
    x = jnp.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # duplicates: zero distances
    labels = jnp.array([0, 0, 1, 1])
    t = _tuples([0, 1, 2, 3], [0, 0, 3, 2], [2, 2, 0, 1], [True] * 4)  # a = p and d(a, n) = 0
    loss, _ = apply({}, x, labels, t)
    assert np.isfinite(loss) and np.all(np.isfinite(grad(x, labels, t)))
    none = t._replace(valid=jnp.zeros(4, bool))
    loss, metrics = apply({}, x, labels, none)
    assert loss == 0.0 and metrics["active_fraction"] == 0.0
    np.testing.assert_array_equal(grad(x, labels, none), 0.0)


def test_triplet_bf16_inputs_give_f32(triplet_fn, batch):
    _, apply, _ = triplet_fn
    x, labels, tup = batch
    x16 = jnp.asarray(x, jnp.bfloat16)
    loss, _ = apply({}, x16, labels, _tuples(*tup))
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(loss, np_triplet(np.asarray(x16, np.float32), *tup), rtol=1e-5)


# ----------------------------------------------------------------------------- margin


def test_margin_hand_computed(margin_fn):
    _, apply, _ = margin_fn()
    x = jnp.array([[0.0, 0.0], [0.5, 0.0], [0.0, 0.5], [1.5, 0.0], [3.0, 0.0]])
    labels = jnp.array([0, 0, 1, 0, 1])
    # beta = 1.2, margin = 0.2: first triplet pos 0, neg 1.2 - 0.5 + 0.2 = 0.9;
    # second pos 1.5 - 1.2 + 0.2 = 0.5, neg 0  ->  (0.9 + 0.5) / 2 active terms
    t = _tuples([0, 0, 4], [1, 3, 4], [2, 4, 0], [True, True, False])
    loss, metrics = apply(_params(np.full(NUM_CLASSES, 1.2)), x, labels, t)
    np.testing.assert_allclose(loss, 0.7, rtol=1e-6)
    np.testing.assert_allclose(metrics["active_fraction"], 0.5)
    np.testing.assert_allclose(metrics["beta_mean"], 1.2, rtol=1e-6)


def test_margin_init_and_interface(batch):
    x, labels, tup = batch
    module = LOSSES.get("margin")(num_classes=NUM_CLASSES)
    params = module.init(jax.random.key(0), x, labels, _tuples(*tup))
    np.testing.assert_allclose(params["params"]["beta"], np.full(NUM_CLASSES, 1.2))
    assert MarginLoss.param_lr == "beta_lr" and module.beta_lr == 5e-4
    assert MarginLoss.needs_miner and MarginLoss.allowed_miners is None
    const = MarginLoss(num_classes=NUM_CLASSES, beta_constant=True, beta=0.6)
    assert const.init(jax.random.key(0), x, labels, _tuples(*tup))["params"]["beta"].shape == ()
    with pytest.raises(TypeError):
        MarginLoss(NUM_CLASSES)  # hyperparameters are keyword-only


@pytest.mark.parametrize("nu", [0.0, 0.1])
def test_margin_matches_numpy_loss_and_beta_gradient(margin_fn, batch, nu):
    module, apply, grad = margin_fn(nu=nu)
    x, labels, tup = batch
    beta = np.array([1.0, 1.3, 0.9, 1.6])
    params = _params(beta)
    t = _tuples(*tup)
    loss, _ = apply(params, x, labels, t)
    eager, _ = module.apply(params, x, labels, t)
    want, want_dbeta = np_margin(x, labels, *tup, beta, nu=nu)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(eager, loss, rtol=1e-6)
    dparams, dx = grad(params, jnp.asarray(x), labels, t)
    np.testing.assert_allclose(dparams["params"]["beta"], want_dbeta, rtol=1e-5, atol=1e-7)
    assert np.any(want_dbeta != 0)
    # embedding gradient against central differences of the NumPy loss (float64)
    eps, x64 = 1e-4, x.astype(np.float64)
    for i, d in [(0, 0), (2, 3), (6, 1)]:
        hi, lo = x64.copy(), x64.copy()
        hi[i, d] += eps
        lo[i, d] -= eps
        num = (
            np_margin(hi, labels, *tup, beta, nu=nu)[0]
            - np_margin(lo, labels, *tup, beta, nu=nu)[0]
        ) / (2 * eps)
        np.testing.assert_allclose(dx[i, d], num, rtol=1e-3, atol=1e-5)


def test_margin_constant_beta(margin_fn, batch):
    _, apply, grad = margin_fn(beta_constant=True, nu=0.05)
    x, labels, tup = batch
    params = _params(np.float32(1.1))
    loss, metrics = apply(params, x, labels, _tuples(*tup))
    want, want_dbeta = np_margin(x, labels, *tup, np.float64(1.1), nu=0.05)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(metrics["beta_mean"], 1.1, rtol=1e-6)
    dparams, _ = grad(params, jnp.asarray(x), labels, _tuples(*tup))
    np.testing.assert_allclose(dparams["params"]["beta"], want_dbeta, rtol=1e-5)


def test_margin_degenerate_gradients(margin_fn):
    _, apply, grad = margin_fn(nu=0.1)
    x = jnp.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    labels = jnp.array([0, 0, 1, 1])
    t = _tuples([0, 1, 2, 3], [0, 0, 3, 2], [2, 2, 0, 1], [True] * 4)  # a = p and d(a, n) = 0
    params = _params(np.full(NUM_CLASSES, 1.2))
    loss, _ = apply(params, x, labels, t)
    dparams, dx = grad(params, x, labels, t)
    assert np.isfinite(loss)
    assert np.all(np.isfinite(dx)) and np.all(np.isfinite(dparams["params"]["beta"]))
    none = t._replace(valid=jnp.zeros(4, bool))
    loss, metrics = apply(params, x, labels, none)
    assert loss == 0.0 and metrics["active_fraction"] == 0.0
    dparams, dx = grad(params, x, labels, none)
    np.testing.assert_array_equal(dx, 0.0)
    np.testing.assert_array_equal(dparams["params"]["beta"], 0.0)


def test_margin_bf16_inputs_give_f32(margin_fn, batch):
    _, apply, _ = margin_fn()
    x, labels, tup = batch
    x16 = jnp.asarray(x, jnp.bfloat16)
    beta = np.full(NUM_CLASSES, 1.2)
    loss, metrics = apply(_params(beta), x16, labels, _tuples(*tup))
    assert loss.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in metrics.values())
    want, _ = np_margin(np.asarray(x16, np.float32), labels, *tup, beta)
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_losses_need_tuples(batch):
    x, labels, _ = batch
    with pytest.raises(ValueError, match="needs mined tuples"):
        TripletLoss().apply({}, x, labels, None)


# ----------------------------------------------------------------------------- compatibility


def test_check_compatible_and_registry_errors(monkeypatch):
    check_compatible("margin", "distance")
    check_compatible("triplet", "random")
    with pytest.raises(ValueError, match=r"compatible miners: .*distance, .*random") as err:
        check_compatible("margin", None)
    assert ", ".join(MINERS.names()) in str(err.value)  # any miner: all are listed
    with pytest.raises(UnknownNameError, match=r"known loss names: .*margin, .*triplet"):
        check_compatible("marginn", "distance")
    with pytest.raises(UnknownNameError, match="known miner names"):
        check_compatible("margin", "semi_hard")

    class OnlyRandom(Loss):
        loss_name: ClassVar[str] = "only_random"
        allowed_miners: ClassVar[tuple[str, ...] | None] = ("random",)

    class NoMiner(Loss):
        loss_name: ClassVar[str] = "no_miner"
        needs_miner: ClassVar[bool] = False

    monkeypatch.setitem(LOSSES._items, "only_random", OnlyRandom)
    monkeypatch.setitem(LOSSES._items, "no_miner", NoMiner)
    check_compatible("only_random", "random")
    with pytest.raises(ValueError, match=r"miner 'distance'; compatible miners: random$"):
        check_compatible("only_random", "distance")
    check_compatible("no_miner", None)
    with pytest.raises(ValueError, match="takes no miner"):
        check_compatible("no_miner", "distance")


def test_register_loss_checks_param_lr():
    class Bad(Loss):
        loss_name: ClassVar[str] = "bad"
        param_lr: ClassVar[str | None] = "proxy_lr"
        _: dataclasses.KW_ONLY
        lr: float = 1.0

    with pytest.raises(ValueError, match="param_lr"):
        register_loss(Bad)
    assert "bad" not in LOSSES


def test_register_loss_needs_an_integer_range_for_an_int_field():
    """An ``int`` hyperparameter is declared with an integer ``Range`` (so ``jdml.losses.get``
    and the config refuse 2.5, True and out-of-range counts): a loss without one is refused at
    registration."""

    class Uncounted(Loss):
        loss_name: ClassVar[str] = "uncounted"
        _: dataclasses.KW_ONLY
        num_classes: int  # filled in by the method: checked by get as a count
        num_parts: int = 2

    with pytest.raises(ValueError, match=r"integer Range for \['num_parts'\]"):
        register_loss(Uncounted)
    assert "uncounted" not in LOSSES
