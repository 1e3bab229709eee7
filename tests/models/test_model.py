"""Models: head shapes and normalisation, frozen BatchNorm, the small-map convolution guard."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jdml.models import BACKBONES, build_model
from jdml.models.small_resnet import SmallResNet


def _cfg(**kw):
    base = dict(
        backbone="small_resnet",
        small_resnet=dict(
            stem_features=4,
            stem_strides=1,
            stage_features=(4, 8),
            stage_blocks=(1, 1),
            stage_strides=(1, 2),
        ),
        frozen_bn=False,
        embed_dim=6,
        head="discriminative",
        dtype="float32",
        normalize=True,
        pooling="avg",
    )
    return ml_collections.ConfigDict({**base, **kw})


def test_heads_are_unit_norm():
    model = build_model(_cfg(), train=False)
    x = jax.random.normal(jax.random.key(0), (3, 8, 8, 1))
    variables = jax.jit(model.init)(jax.random.key(1), x)
    out = model.apply(variables, x)
    assert out["discriminative"].shape == (3, 6)
    np.testing.assert_allclose(np.linalg.norm(out["discriminative"], axis=1), 1.0, rtol=1e-5)


def test_frozen_bn_keeps_running_stats():
    x = jax.random.normal(jax.random.key(0), (4, 8, 8, 1))
    for frozen, changes in ((False, True), (True, False)):
        model = build_model(_cfg(frozen_bn=frozen), train=True)
        variables = jax.jit(model.init)(jax.random.key(1), x)
        _, upd = model.apply(variables, x, mutable=["batch_stats"])
        same = jax.tree.map(
            lambda a, b: bool(jnp.all(a == b)), variables["batch_stats"], upd["batch_stats"]
        )
        assert (not all(jax.tree.leaves(same))) == changes


def test_small_feature_maps_are_refused():
    with pytest.raises(ValueError, match="slow on XLA CPU"):
        SmallResNet(
            stage_features=(4, 4), stage_blocks=(1, 1), stage_strides=(2, 2), stem_features=4
        ).init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))


def test_unknown_backbone():
    with pytest.raises(KeyError, match="small_resnet"):
        BACKBONES.get("resnet9000")


def test_unnormalised_heads():
    model = build_model(_cfg(normalize=False), train=False)
    x = jax.random.normal(jax.random.key(0), (3, 8, 8, 1))
    out = model.apply(jax.jit(model.init)(jax.random.key(1), x), x)["discriminative"]
    assert not np.allclose(np.linalg.norm(out, axis=1), 1.0)


def test_avg_plus_max_pooling_adds_the_global_max():
    x = jax.random.normal(jax.random.key(0), (3, 8, 8, 1))
    avg = SmallResNet((4, 8), (1, 1), (1, 2), stem_features=4, stem_strides=1, train_bn=False)
    both = avg.clone(pooling="avg+max")
    variables = jax.jit(avg.init)(jax.random.key(1), x)
    pooled, state = jax.jit(lambda v, x: both.apply(v, x, capture_intermediates=True))(variables, x)
    last = state["intermediates"]["stage1_block0"]["__call__"][0]
    np.testing.assert_allclose(pooled, last.mean(axis=(1, 2)) + last.max(axis=(1, 2)), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(avg.apply)(variables, x), last.mean(axis=(1, 2)), rtol=1e-6)


def test_orthogonal_heads_start_with_orthonormal_columns_and_zero_bias():
    """model.head_init=orthogonal: the (8 features, 6 dims) kernel has orthonormal columns (the
    recipes' nn.init.orthogonal_ on the (6, 8) weight has orthonormal rows); the default draws
    another kernel from the same key."""
    x = jax.random.normal(jax.random.key(0), (3, 8, 8, 1))
    heads = {}
    for init in ("orthogonal", "lecun_normal"):
        model = build_model(_cfg(head_init=init), train=False)
        heads[init] = jax.jit(model.init)(jax.random.key(1), x)["params"]["head_discriminative"]
    kernel = np.asarray(heads["orthogonal"]["kernel"])
    assert kernel.shape == (8, 6)
    np.testing.assert_allclose(kernel.T @ kernel, np.eye(6), atol=1e-6)
    assert not np.allclose(kernel, heads["lecun_normal"]["kernel"])
    np.testing.assert_array_equal(heads["orthogonal"]["bias"], 0.0)
