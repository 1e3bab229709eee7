"""Gradient reversal and the adversarial decorrelation of embedding heads (DiVA / Sharing Matters).

Values are checked against a float64 NumPy implementation, gradients against the same loss
written in jnp without any gradient reversal, and a toy training run shows that the
decorrelation makes two heads that start identical measurably less correlated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jdml.geometry import l2_normalize
from jdml.losses import LOSSES
from jdml.losses.decorrelation import (
    Decorrelation,
    DecorrelationMLP,
    measured_correlation,
)
from jdml.nn.gradient_reversal import gradient_reversal

PAIRS = (("a", "b"), ("c", "a"))
WEIGHTS = (2.0, 0.5)
HEAD_DIMS = {"a": 6, "b": 4, "c": 5}
BATCH = 5
HIDDEN = 7


# ----------------------------------------------------------------------------- references


def np_normalize(x: np.ndarray) -> np.ndarray:
    norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    return x / np.maximum(norm, 1e-12)


def np_psi(psi_params, x: np.ndarray) -> np.ndarray:
    """psi = Dense -> ReLU -> Dense in float64 NumPy, from the module's parameters."""
    d0, d1 = psi_params["dense_0"], psi_params["dense_1"]
    hidden = np.maximum(x @ np.asarray(d0["kernel"], np.float64) + np.asarray(d0["bias"]), 0.0)
    return hidden @ np.asarray(d1["kernel"], np.float64) + np.asarray(d1["bias"], np.float64)


def np_decorrelation(params, heads, pairs, weights, *, renormalize: bool):
    """Returns (L, {pair: c}) with L = sum -w * mean_b mean_d (t * n(psi(s)))^2."""
    total, per_pair = 0.0, {}
    for (source, target), weight in zip(pairs, weights, strict=True):
        s = np.asarray(heads[source], np.float64)
        t = np.asarray(heads[target], np.float64)
        if renormalize:
            s, t = np_normalize(s), np_normalize(t)
        mapped = np_normalize(np_psi(params["params"][f"psi_{source}_{target}"], s))
        c = float(np.mean(np.square(t * mapped)))
        per_pair[(source, target)] = c
        total -= weight * c
    return total, per_pair


def jnp_psi(psi_params, x: jax.Array) -> jax.Array:
    d0, d1 = psi_params["dense_0"], psi_params["dense_1"]
    hidden = jax.nn.relu(x @ d0["kernel"] + d0["bias"])
    return hidden @ d1["kernel"] + d1["bias"]


def jnp_no_reversal_loss(params, heads, pairs, weights, *, renormalize: bool, detach: bool):
    """The same loss in jnp with plain gradients everywhere (no reversal)."""
    total = 0.0
    for (source, target), weight in zip(pairs, weights, strict=True):
        s, t = heads[source], heads[target]
        if detach:
            t = jax.lax.stop_gradient(t)
        if renormalize:
            s, t = l2_normalize(s), l2_normalize(t)
        mapped = l2_normalize(jnp_psi(params["params"][f"psi_{source}_{target}"], s))
        total = total - weight * jnp.mean(jnp.square(t * mapped))
    return total


def random_heads(seed: int = 0, scale: float = 1.5) -> dict[str, jax.Array]:
    """Non-normalised heads (so renormalize=True and False give different values)."""
    rng = np.random.default_rng(seed)
    return {
        name: jnp.asarray(scale * rng.normal(size=(BATCH, dim)), jnp.float32)
        for name, dim in HEAD_DIMS.items()
    }


def make_module(**kwargs) -> Decorrelation:
    return Decorrelation(pairs=PAIRS, weights=WEIGHTS, hidden=HIDDEN, **kwargs)


# ----------------------------------------------------------------------------- gradient reversal


def test_gradient_reversal_is_identity_under_jit():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)), jnp.float32)
    out = jax.jit(lambda v: gradient_reversal(v, 0.5))(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
    assert out.dtype == jnp.float32
    half = jax.jit(gradient_reversal)(x.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16


def _toy_graph(x, y, w, *, scale: float | None):
    z = x * y
    if scale is not None:
        z = gradient_reversal(z, scale)
    return jnp.sum(w * jnp.square(z))


@pytest.mark.parametrize("scale", [1.0, 0.5, 2.0])
def test_gradient_reversal_flips_and_scales_gradient(scale):
    rng = np.random.default_rng(1)
    x, y, w = (jnp.asarray(rng.normal(size=(4,)), jnp.float32) for _ in range(3))
    with_grl = jax.jit(jax.grad(lambda *a: _toy_graph(*a, scale=scale), argnums=(0, 1, 2)))
    plain = jax.grad(lambda *a: _toy_graph(*a, scale=None), argnums=(0, 1, 2))
    gx, gy, gw = with_grl(x, y, w)
    px, py, pw = plain(x, y, w)
    np.testing.assert_allclose(gx, -scale * px, rtol=1e-6)
    np.testing.assert_allclose(gy, -scale * py, rtol=1e-6)
    # w does not pass through the reversal: its gradient is unchanged.
    np.testing.assert_allclose(gw, pw, rtol=1e-6)
    # The forward value is unchanged.
    np.testing.assert_allclose(
        _toy_graph(x, y, w, scale=scale), _toy_graph(x, y, w, scale=None), rtol=1e-6
    )


def test_gradient_reversal_scale_zero_blocks_gradient():
    x = jnp.arange(1.0, 5.0)
    g = jax.jit(jax.grad(lambda v: jnp.sum(jnp.square(gradient_reversal(v, 0.0)))))(x)
    np.testing.assert_array_equal(np.asarray(g), np.zeros(4))


def test_gradient_reversal_on_pytree():
    tree = {"u": jnp.arange(3.0), "v": (jnp.ones((2, 2)), jnp.full((1,), 2.0))}

    def f(t, reverse):
        t = gradient_reversal(t, 1.5) if reverse else t
        return jnp.sum(t["u"] ** 2) + jnp.sum(3.0 * t["v"][0]) + jnp.sum(t["v"][1] ** 3)

    got = jax.grad(lambda t: f(t, True))(tree)
    want = jax.grad(lambda t: f(t, False))(tree)
    for g, p in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(g, -1.5 * p, rtol=1e-6)


def test_gradient_reversal_needs_static_scale():
    with pytest.raises(jax.errors.ConcretizationTypeError):
        jax.jit(gradient_reversal)(jnp.ones(2), jnp.asarray(1.0))


# ----------------------------------------------------------------------------- module structure


def test_not_registered_as_a_metric_learning_loss():
    assert "decorrelation" not in LOSSES.names()
    assert all(LOSSES.get(name) is not Decorrelation for name in LOSSES.names())


def test_psi_per_pair_shapes_and_defaults():
    module = make_module()
    params = module.init(jax.random.key(0), random_heads())["params"]
    assert sorted(params) == ["psi_a_b", "psi_c_a"]
    psi = params["psi_a_b"]
    assert psi["dense_0"]["kernel"].shape == (HEAD_DIMS["a"], HIDDEN)
    assert psi["dense_1"]["kernel"].shape == (HIDDEN, HEAD_DIMS["b"])
    assert params["psi_c_a"]["dense_0"]["kernel"].shape == (HEAD_DIMS["c"], HIDDEN)
    assert params["psi_c_a"]["dense_1"]["bias"].shape == (HEAD_DIMS["a"],)
    # The reference shape 128 -> 512 -> 128.
    mlp = DecorrelationMLP()
    mlp_params = mlp.init(jax.random.key(0), jnp.zeros((2, 128)))["params"]
    assert mlp_params["dense_0"]["kernel"].shape == (128, 512)
    assert mlp_params["dense_1"]["kernel"].shape == (512, 128)
    # PyTorch nn.Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    assert float(jnp.max(jnp.abs(mlp_params["dense_0"]["kernel"]))) <= 1 / np.sqrt(128)
    assert float(jnp.max(jnp.abs(mlp_params["dense_1"]["bias"]))) <= 1 / np.sqrt(512)
    assert float(jnp.std(mlp_params["dense_0"]["kernel"])) > 0.5 / np.sqrt(3 * 128)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"pairs": (("a", "b"),), "weights": (1.0, 2.0)}, "one weight per pair"),
        ({"pairs": (), "weights": ()}, "at least one"),
        ({"pairs": (("a", "a"),), "weights": (1.0,)}, "to itself"),
        ({"pairs": (("a", "b"), ("a", "b")), "weights": (1.0, 1.0)}, "duplicates"),
        ({"pairs": (("a", "b"),), "weights": (1.0,), "grl_scale": -1.0}, "grl_scale"),
    ],
)
def test_invalid_configuration(kwargs, error):
    with pytest.raises(ValueError, match=error):
        Decorrelation(**kwargs)


def test_missing_head_is_a_clear_error():
    heads = random_heads()
    del heads["c"]
    with pytest.raises(KeyError, match="'c'"):
        make_module().init(jax.random.key(0), heads)


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("detach_target", [False, True])
def test_value_matches_numpy(renormalize, detach_target):
    module = make_module(renormalize=renormalize, detach_target=detach_target)
    heads = random_heads()
    params = module.init(jax.random.key(3), heads)
    loss, metrics = jax.jit(module.apply)(params, heads)
    want, per_pair = np_decorrelation(params, heads, PAIRS, WEIGHTS, renormalize=renormalize)
    assert loss.dtype == jnp.float32 and loss.shape == ()
    np.testing.assert_allclose(float(loss), want, rtol=2e-5)
    assert set(metrics) == {"decorrelation/a-b", "decorrelation/c-a", "decorrelation/total"}
    np.testing.assert_allclose(float(metrics["decorrelation/total"]), want, rtol=2e-5)
    for (source, target), c in per_pair.items():
        np.testing.assert_allclose(float(metrics[f"decorrelation/{source}-{target}"]), c, rtol=2e-5)
    assert want < 0.0


def test_renormalize_matters_for_non_unit_heads_but_not_for_unit_heads():
    heads = random_heads(scale=3.0)
    on, off = make_module(renormalize=True), make_module(renormalize=False)
    params = on.init(jax.random.key(0), heads)
    raw_on = float(on.apply(params, heads)[0])
    assert abs(float(off.apply(params, heads)[0]) - raw_on) > 1e-3 * abs(raw_on)
    unit = {k: l2_normalize(v) for k, v in heads.items()}
    np.testing.assert_allclose(
        float(on.apply(params, unit)[0]), float(off.apply(params, unit)[0]), rtol=1e-5
    )


def test_low_precision_heads_are_computed_in_float32():
    module = make_module()
    heads = random_heads()
    params = module.init(jax.random.key(0), heads)
    loss, _ = module.apply(params, {k: v.astype(jnp.bfloat16) for k, v in heads.items()})
    assert loss.dtype == jnp.float32


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("detach_target", [False, True])
@pytest.mark.parametrize("grl_scale", [1.0, 0.5])
def test_gradients_psi_plain_heads_reversed(renormalize, detach_target, grl_scale):
    module = make_module(renormalize=renormalize, detach_target=detach_target, grl_scale=grl_scale)
    heads = random_heads(seed=4)
    params = module.init(jax.random.key(5), heads)

    def module_loss(p, h):
        return module.apply(p, h)[0]

    def plain_loss(p, h):
        return jnp_no_reversal_loss(
            p, h, PAIRS, WEIGHTS, renormalize=renormalize, detach=detach_target
        )

    g_params, g_heads = jax.jit(jax.grad(module_loss, argnums=(0, 1)))(params, heads)
    p_params, p_heads = jax.grad(plain_loss, argnums=(0, 1))(params, heads)

    # psi minimises L (maximises the correlation): its gradient is the plain one, same sign.
    # The jitted and the eager gradients differ by float32 rounding (fused vs separate sums):
    # up to 1.3e-7 on entries of about 0.05 on an AMD EPYC, hence the absolute 1e-6.
    flat_g = jax.tree_util.tree_leaves_with_path(g_params)
    flat_p = jax.tree_util.tree_leaves(p_params)
    for (path, g), p in zip(flat_g, flat_p, strict=True):
        assert float(jnp.max(jnp.abs(p))) > 0.0, path
        np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-6, err_msg=str(path))
    # The heads receive the reversed (and scaled) gradient: they minimise the correlation.
    for name in HEAD_DIMS:
        np.testing.assert_allclose(
            g_heads[name], -grl_scale * p_heads[name], rtol=1e-5, atol=1e-6, err_msg=name
        )
    # "b" is only ever a target: detaching the targets cuts its gradient completely; "a" is the
    # target of (c, a) but the source of (a, b), so it still learns.
    b_norm = float(jnp.max(jnp.abs(g_heads["b"])))
    assert (b_norm == 0.0) if detach_target else (b_norm > 0.0)
    assert float(jnp.max(jnp.abs(g_heads["a"]))) > 0.0


@pytest.mark.parametrize("renormalize", [True, False])
def test_zero_heads_give_finite_values_and_gradients(renormalize):
    module = make_module(renormalize=renormalize)
    heads = random_heads()
    params = module.init(jax.random.key(0), heads)
    heads = {**heads, "a": jnp.zeros_like(heads["a"]), "b": heads["b"].at[0].set(0.0)}

    def module_loss(p, h):
        return module.apply(p, h)[0]

    loss = module_loss(params, heads)
    g_params, g_heads = jax.grad(module_loss, argnums=(0, 1))(params, heads)
    assert np.isfinite(float(loss))
    for leaf in jax.tree_util.tree_leaves((g_params, g_heads)):
        assert np.all(np.isfinite(np.asarray(leaf)))


# ----------------------------------------------------------------------------- measured_correlation


def test_measured_correlation_extremes():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(400, 6))
    rotation, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    assert measured_correlation(a, a) == pytest.approx(1.0)
    assert measured_correlation(a, 3.0 * a @ rotation + 1.0) == pytest.approx(1.0)
    b = rng.normal(size=(400, 5))
    assert measured_correlation(a, b) < 0.05
    assert measured_correlation(a, b) == pytest.approx(measured_correlation(b, a))
    assert measured_correlation(a, np.ones((400, 3))) == 0.0
    partial = np.concatenate([a[:, :2], rng.normal(size=(400, 4))], axis=1)
    assert 0.1 < measured_correlation(a, partial) < 0.9
    with pytest.raises(ValueError, match="same N"):
        measured_correlation(a, b[:10])


# ----------------------------------------------------------------------------- toy training

TOY_INPUT, TOY_DIM, TOY_N, TOY_HIDDEN, TOY_STEPS = 16, 8, 128, 32, 300
TOY_WEIGHT, TOY_LR = 10.0, 1e-2


def _train_toy(*, weight: float, grl_scale: float = 1.0) -> dict[str, float]:
    """Two linear heads on shared inputs, initialised identical, trained jointly with psi.

    The head loss pulls the first two raw coordinates of both heads towards the same linear
    target (the other six are free); the embeddings are the L2-normalised raw outputs.
    ``weight`` = 0 trains the head loss alone.
    """
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(TOY_N, TOY_INPUT)), jnp.float32)
    target = x @ jnp.asarray(rng.normal(size=(TOY_INPUT, 2)) / np.sqrt(TOY_INPUT), jnp.float32)
    w0 = jnp.asarray(rng.normal(size=(TOY_INPUT, TOY_DIM)) / np.sqrt(TOY_INPUT), jnp.float32)
    decorrelation = Decorrelation(
        pairs=(("a", "b"),), weights=(weight,), hidden=TOY_HIDDEN, grl_scale=grl_scale
    )

    def embed(p):
        return {name: l2_normalize(x @ p[name]) for name in ("a", "b")}

    def head_loss(p):
        return sum(jnp.mean(jnp.sum(jnp.square((x @ p[n])[:, :2] - target), -1)) for n in "ab")

    def total_loss(p):
        return head_loss(p) + decorrelation.apply(p["psi"], embed(p))[0]

    params = {
        "a": w0,
        "b": w0,
        "psi": decorrelation.init(jax.random.key(0), embed({"a": w0, "b": w0})),
    }
    optimizer = optax.adam(TOY_LR)

    @jax.jit
    def step(p, state):
        grads = jax.grad(total_loss)(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state

    state = optimizer.init(params)
    start = embed(params)
    for _ in range(TOY_STEPS):
        params, state = step(params, state)
    heads = embed(params)
    return {
        "start": measured_correlation(start["a"], start["b"]),
        "end": measured_correlation(heads["a"], heads["b"]),
        "head_loss": float(head_loss(params)),
    }


@pytest.fixture(scope="module")
def toy_runs() -> dict[str, dict[str, float]]:
    return {
        "head_only": _train_toy(weight=0.0),
        "decorrelated": _train_toy(weight=TOY_WEIGHT),
        "no_reversal_gradient": _train_toy(weight=TOY_WEIGHT, grl_scale=0.0),
    }


def test_toy_decorrelation_lowers_measured_correlation(toy_runs):
    head_only, decorrelated = toy_runs["head_only"], toy_runs["decorrelated"]
    assert head_only["start"] == pytest.approx(1.0)
    assert head_only["end"] > 0.99, toy_runs
    assert decorrelated["end"] < 0.6, toy_runs
    assert decorrelated["end"] < head_only["end"] - 0.3, toy_runs
    # Both runs still solve the head task.
    assert head_only["head_loss"] < 1e-3, toy_runs
    assert decorrelated["head_loss"] < 0.05, toy_runs


def test_toy_effect_goes_through_the_reversal(toy_runs):
    # grl_scale = 0: psi still trains but the heads get no decorrelation gradient.
    assert toy_runs["no_reversal_gradient"]["end"] > 0.99, toy_runs
