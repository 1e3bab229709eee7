"""DaNCE loss, EMA update and key queue against independent float64 NumPy implementations."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.losses.dance import dance_loss, distance_weights
from jdml.methods.ema_queue import KeyQueue, ema_update, insertion_order, ordered, push, valid_mask
from tests.helpers import central_differences

B, D, N = 4, 6, 10  # every loss call uses these shapes, so each configuration compiles once
TAU = 0.5
LOWER = 0.5
MAX_D = 2.0 - 1e-4


# ----------------------------------------------------------------------------- NumPy references


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _np_weights(
    q: np.ndarray, bank: np.ndarray, *, upper: float | None, normalize: str
) -> np.ndarray:
    """The reference recipe literally, in float64: max shift, exp, cutoff, clamp, normalise."""
    q, bank = q.astype(np.float64), bank.astype(np.float64)
    nb, dim = q.shape
    log_w = np.empty((nb, len(bank)))
    beyond = np.zeros((nb, len(bank)), bool)
    for i in range(nb):
        for j in range(len(bank)):
            dist = np.sqrt(max(2.0 - 2.0 * float(q[i] @ bank[j]), 0.0))
            d = min(max(dist, LOWER), MAX_D)
            log_w[i, j] = (2 - dim) * np.log(d) - (dim - 3) / 2 * np.log(1 - d * d / 4)
            beyond[i, j] = upper is not None and dist > upper
    if normalize == "batch":
        w = np.exp(log_w - log_w.max())
    else:
        w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    w[beyond] = 0.0
    w = np.maximum(w, 1e-45)
    return w / w.sum(axis=0 if normalize == "batch" else 1, keepdims=True)


def _np_loss(q: np.ndarray, k: np.ndarray, bank: np.ndarray, tau: float, w: np.ndarray | None):
    """Mean over anchors of -log softmax(positive) with logits [q·k, w * q·Q] / tau."""
    q, k, bank = q.astype(np.float64), k.astype(np.float64), bank.astype(np.float64)
    total = 0.0
    for i in range(len(q)):
        neg = np.array([q[i] @ bank[j] for j in range(len(bank))])
        if w is not None:
            neg = neg * w[i]
        logits = np.concatenate([[q[i] @ k[i]], neg]) / tau
        top = logits.max()
        total += -(logits[0] - top - np.log(np.sum(np.exp(logits - top))))
    return total / len(q)


def _np_dance(q, k, bank, tau, *, upper=1.4, normalize="anchor"):
    return _np_loss(q, k, bank, tau, _np_weights(q, bank, upper=upper, normalize=normalize))


def _np_infonce(q, k, bank, tau):
    """Plain MoCo InfoNCE written out term by term."""
    out = []
    for i in range(len(q)):
        pos = np.exp(float(q[i] @ k[i]) / tau)
        negs = sum(np.exp(float(q[i] @ bank[j]) / tau) for j in range(len(bank)))
        out.append(-np.log(pos / (pos + negs)))
    return float(np.mean(out))


# ----------------------------------------------------------------------------- fixtures


def _jit_loss(**config):
    def fn(q, k, bank, tau, valid=None):
        return dance_loss(q, k, bank, temperature=tau, queue_valid=valid, **config)

    return jax.jit(fn)


@pytest.fixture(scope="module")
def losses():
    """Jitted loss variants, built once per module (each compiles on its first call)."""
    return {
        ("anchor", 1.4): _jit_loss(normalize="anchor"),
        ("batch", 1.4): _jit_loss(normalize="batch"),
        ("anchor", None): _jit_loss(normalize="anchor", upper_cutoff=None),
        ("batch", None): _jit_loss(normalize="batch", upper_cutoff=None),
        "plain": _jit_loss(weighting=False),
    }


@pytest.fixture(scope="module")
def grads():
    """Jitted gradients w.r.t. (queries, keys) for both normalisations."""
    out = {}
    for norm in ("anchor", "batch"):

        def fn(q, k, bank, tau, norm=norm):
            return dance_loss(q, k, bank, temperature=tau, normalize=norm)[0]

        out[norm] = jax.jit(jax.grad(fn, argnums=(0, 1)))
    return out


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    q = _unit(rng.normal(size=(B, D))).astype(np.float32)
    # keys near their queries, so the positives are informative
    k = _unit(q + 0.5 * rng.normal(size=(B, D))).astype(np.float32)
    bank = _unit(rng.normal(size=(N, D))).astype(np.float32)
    dist = np.sqrt(np.maximum(2 - 2 * q.astype(np.float64) @ bank.T.astype(np.float64), 0))
    assert (dist > 1.4).any() and (dist <= 1.4).any() and (dist < LOWER + 0.5).any()
    return q, k, bank


@pytest.fixture(scope="module")
def far_data():
    """Query 0 has every queue entry beyond 1.4; the other queries have some within it."""
    rng = np.random.default_rng(1)
    q = _unit(rng.normal(size=(B, D)))
    q[0] = np.eye(D)[0]
    q[1:] = _unit(-np.eye(D)[0] + 0.8 * q[1:])  # leaning towards the queue
    bank = rng.normal(size=(N, D))
    bank[:, 0] = -np.abs(bank[:, 0]) - 0.5
    bank = _unit(bank)
    k = _unit(q + 0.3 * rng.normal(size=(B, D)))
    dist = np.sqrt(np.maximum(2 - 2 * q @ bank.T, 0))
    assert (dist[0] > 1.4).all()
    assert (dist[1:] <= 1.4).any(axis=1).all() and (dist[1:] <= 1.4).any(axis=0).all()
    return q.astype(np.float32), k.astype(np.float32), bank.astype(np.float32)


# ----------------------------------------------------------------------------- DaNCE loss


@pytest.mark.parametrize("normalize", ["anchor", "batch"])
@pytest.mark.parametrize("upper", [1.4, None])
@pytest.mark.parametrize("tau", [TAU, 0.1])
def test_value_matches_reference(losses, data, normalize, upper, tau):
    q, k, bank = data
    loss, _ = losses[(normalize, upper)](q, k, bank, tau)
    expected = _np_dance(q, k, bank, tau, upper=upper, normalize=normalize)
    np.testing.assert_allclose(float(loss), expected, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("normalize", ["anchor", "batch"])
def test_weights_are_normalised(data, normalize):
    q, _, bank = data
    w = np.asarray(distance_weights(jnp.asarray(q), jnp.asarray(bank), normalize=normalize))
    np.testing.assert_allclose(w, _np_weights(q, bank, upper=1.4, normalize=normalize), atol=1e-6)
    np.testing.assert_allclose(w.sum(axis=1 if normalize == "anchor" else 0), 1.0, rtol=1e-5)


def test_normalisations_differ(losses, data):
    q, k, bank = data
    anchor = float(losses[("anchor", 1.4)](q, k, bank, TAU)[0])
    batch = float(losses[("batch", 1.4)](q, k, bank, TAU)[0])
    assert abs(anchor - batch) > 1e-4


def test_unweighted_is_plain_infonce(losses, data):
    q, k, bank = data
    loss, _ = losses["plain"](q, k, bank, TAU)
    np.testing.assert_allclose(float(loss), _np_infonce(q, k, bank, TAU), rtol=1e-5)


def test_metrics(losses, data):
    q, k, bank = data
    _, metrics = losses[("anchor", 1.4)](q, k, bank, TAU)
    q64, k64, b64 = (x.astype(np.float64) for x in data)
    w = _np_weights(q, bank, upper=1.4, normalize="anchor")
    pos = np.sum(q64 * k64, axis=1)
    acc = np.mean(pos >= np.max((q64 @ b64.T) * w, axis=1))
    np.testing.assert_allclose(float(metrics["dance_pos_logit"]), pos.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["dance_neg_logit"]), (q64 @ b64.T).mean(), atol=1e-6)
    assert float(metrics["dance_accuracy"]) == pytest.approx(acc)
    _, plain = losses["plain"](q, k, bank, TAU)
    acc_plain = np.mean(pos >= np.max(q64 @ b64.T, axis=1))
    assert float(plain["dance_accuracy"]) == pytest.approx(acc_plain)


@pytest.mark.parametrize("normalize", ["anchor", "batch"])
def test_gradient_treats_weights_as_constants(grads, data, normalize):
    q, k, bank = data
    gq, gk = grads[normalize](q, k, bank, TAU)
    w0 = _np_weights(q, bank, upper=1.4, normalize=normalize)
    fd_q = central_differences(lambda x: _np_loss(x, k, bank, TAU, w0), q)
    fd_k = central_differences(lambda x: _np_loss(q, x, bank, TAU, w0), k)
    np.testing.assert_allclose(np.asarray(gq), fd_q, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(gk), fd_k, rtol=1e-4, atol=2e-5)
    # differentiating through the weights would give a visibly different gradient
    fd_full = central_differences(lambda x: _np_dance(x, k, bank, TAU, normalize=normalize), q)
    assert np.abs(fd_full - fd_q).max() > 1e-3


@pytest.mark.parametrize("normalize", ["anchor", "batch"])
def test_weights_have_no_gradient(data, normalize):
    q, _, bank = data

    def total(x, y):
        return jnp.sum(distance_weights(x, y, normalize=normalize) * jnp.arange(N))

    gq, gb = jax.grad(total, argnums=(0, 1))(jnp.asarray(q), jnp.asarray(bank))
    assert not np.any(np.asarray(gq)) and not np.any(np.asarray(gb))


@pytest.mark.parametrize("normalize", ["anchor", "batch"])
def test_row_beyond_cutoff_is_finite(losses, grads, far_data, normalize):
    q, k, bank = far_data
    w = np.asarray(distance_weights(jnp.asarray(q), jnp.asarray(bank), normalize=normalize))
    assert np.isfinite(w).all()
    if normalize == "anchor":
        np.testing.assert_allclose(w[0], 1.0 / N, rtol=1e-6)  # the reference's clamp: uniform
    else:
        assert not w[0].any()
    loss, metrics = losses[(normalize, 1.4)](q, k, bank, TAU)
    expected = _np_dance(q, k, bank, TAU, normalize=normalize)
    np.testing.assert_allclose(float(loss), expected, rtol=2e-5)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    gq, gk = grads[normalize](q, k, bank, TAU)
    assert np.isfinite(np.asarray(gq)).all() and np.isfinite(np.asarray(gk)).all()


@pytest.mark.parametrize("normalize", ["anchor", "batch"])
def test_everything_beyond_cutoff_is_uniform(losses, normalize):
    q = np.tile(np.eye(D, dtype=np.float32)[0], (B, 1))
    bank = np.tile(-np.eye(D, dtype=np.float32)[0], (N, 1))
    k = q.copy()
    w = np.asarray(distance_weights(jnp.asarray(q), jnp.asarray(bank), normalize=normalize))
    np.testing.assert_allclose(w, 1.0 / (N if normalize == "anchor" else B), rtol=1e-6)
    loss, _ = losses[(normalize, 1.4)](q, k, bank, TAU)
    expected = _np_dance(q, k, bank, TAU, normalize=normalize)
    np.testing.assert_allclose(float(loss), expected, rtol=2e-5)


@pytest.mark.parametrize("config", [("anchor", 1.4), ("batch", 1.4), "plain"])
def test_queue_valid_excludes_unfilled_rows(losses, data, config):
    q, k, bank = data
    valid = np.arange(N) < 7
    garbage = bank.copy()
    garbage[~valid] = 3.0 * np.random.default_rng(5).normal(size=(N - 7, D))
    loss, metrics = losses[config](q, k, garbage, TAU, jnp.asarray(valid))
    if config == "plain":
        expected = _np_infonce(q, k, bank[valid], TAU)
    else:
        expected = _np_dance(q, k, bank[valid], TAU, normalize=config[0])
    np.testing.assert_allclose(float(loss), expected, rtol=2e-5)
    neg = q.astype(np.float64) @ bank[valid].T.astype(np.float64)
    np.testing.assert_allclose(float(metrics["dance_neg_logit"]), neg.mean(), atol=1e-6)


def test_invalid_config_raises(data):
    q, k, bank = data
    with pytest.raises(ValueError, match="normalize"):
        dance_loss(q, k, bank, temperature=TAU, normalize="rows")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="upper_cutoff"):
        dance_loss(q, k, bank, temperature=TAU, upper_cutoff=0.4)


# ----------------------------------------------------------------------------- EMA


def test_ema_update_every_leaf():
    rng = np.random.default_rng(2)
    target = {
        "backbone": {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": np.float32(0.5)},
        "heads": [{"k": rng.normal(size=(4,)).astype(np.float32)}],
        "half": jnp.asarray(rng.normal(size=(2,)), jnp.bfloat16),
    }
    online = jax.tree.map(lambda x: x + 1.0 + jnp.asarray(x) * 0.3, target)
    new = jax.jit(ema_update)(target, online, 0.9)
    assert jax.tree.structure(new) == jax.tree.structure(target)
    for t, o, n in zip(
        jax.tree.leaves(target), jax.tree.leaves(online), jax.tree.leaves(new), strict=True
    ):
        assert n.dtype == jnp.asarray(t).dtype
        expected = 0.9 * np.asarray(t, np.float64) + 0.1 * np.asarray(o, np.float64)
        tol = 1e-2 if n.dtype == jnp.bfloat16 else 1e-6
        np.testing.assert_allclose(np.asarray(n, np.float64), expected, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- key queue


@pytest.fixture(scope="module")
def jitted_queue():
    return jax.jit(push), jax.jit(ordered), jax.jit(valid_mask), jax.jit(insertion_order)


def test_key_queue_fifo_wraparound(jitted_queue):
    push_j, ordered_j, valid_j, order_j = jitted_queue
    size, batch = 10, 4
    queue = KeyQueue.create(size, D)
    assert not np.asarray(valid_j(queue)).any()
    model = collections.deque(maxlen=size)  # (key, label), oldest first
    for step in range(4):
        keys = np.full((batch, D), 0.0, np.float32) + (10 * step + np.arange(batch))[:, None]
        labels = 100 + 10 * step + np.arange(batch)
        queue = push_j(queue, jnp.asarray(keys), jnp.asarray(labels))
        model.extend(zip(keys, labels, strict=True))
        filled = min((step + 1) * batch, size)
        assert int(queue.pointer) == (step + 1) * batch % size
        assert int(queue.filled) == filled
        np.testing.assert_array_equal(np.asarray(valid_j(queue)), np.arange(size) < filled)
        got = np.asarray(ordered_j(queue))[:filled]
        np.testing.assert_array_equal(got, np.stack([key for key, _ in model]))
        labels_in_order = np.asarray(queue.labels)[np.asarray(order_j(queue))][:filled]
        np.testing.assert_array_equal(labels_in_order, [label for _, label in model])
    # 16 writes into 10 slots: the third batch wrapped to slots 0-1, the fourth fills slots 2-5
    assert int(queue.pointer) == 6
    slot_values = np.asarray(queue.keys)[:, 0]
    np.testing.assert_array_equal(slot_values, [22, 23, 30, 31, 32, 33, 12, 13, 20, 21])


def test_key_queue_three_pushes(jitted_queue):
    push_j, ordered_j, valid_j, _ = jitted_queue
    queue = KeyQueue.create(10, D)
    batches = [
        (s + np.arange(4)[:, None] / 10 + np.zeros((4, D))).astype(np.float32) for s in (1, 2, 3)
    ]
    for i, keys in enumerate(batches):
        queue = push_j(queue, jnp.asarray(keys), jnp.arange(4) + 4 * i)
    assert int(queue.pointer) == 2 and int(queue.filled) == 10
    expected = np.concatenate([batches[0][2:], batches[1], batches[2]])
    np.testing.assert_array_equal(np.asarray(ordered_j(queue)), expected)
    np.testing.assert_array_equal(np.asarray(queue.labels), [10, 11, 2, 3, 4, 5, 6, 7, 8, 9])
    assert np.asarray(valid_j(queue)).all()


def test_key_queue_feeds_the_loss(jitted_queue, losses, data):
    push_j, ordered_j, valid_j, _ = jitted_queue
    q, k, bank = data
    queue = push_j(KeyQueue.create(N, D), jnp.asarray(bank[:4]), jnp.zeros(4, jnp.int32))
    loss, _ = losses[("anchor", 1.4)](q, k, queue.keys, TAU, valid_j(queue))
    expected = _np_dance(q, k, np.asarray(ordered_j(queue))[:4], TAU)
    np.testing.assert_allclose(float(loss), expected, rtol=2e-5)


def test_key_queue_rejects_oversized_batch():
    with pytest.raises(ValueError, match="cannot push"):
        push(KeyQueue.create(3, 2), jnp.zeros((4, 2)), jnp.zeros(4, jnp.int32))
