"""Partial fine-tuning (``model.frozen_stages``): frozen stages get no gradient and no update."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.models.efficientnet import EfficientNetLite0
from jdml.models.freeze import frozen_modules
from jdml.models.resnet50 import ResNet50
from tests.helpers import make_npz, tiny_config


def test_frozen_modules_cover_the_stem_then_whole_stages():
    stages = EfficientNetLite0.STAGE_MODULES
    assert stages[0] == ("conv_stem", "bn0") and len(stages) == 8
    assert frozen_modules(stages, -1) == frozenset()
    assert frozen_modules(stages, 0) == {"conv_stem", "bn0"}
    # Stage 2 of Lite0 has two blocks, stage 3 two more: blocks 0..4 by stage 3.
    assert frozen_modules(stages, 3) == {"conv_stem", "bn0", *(f"blocks_{i}" for i in range(5))}
    assert sum(len(s) for s in stages[1:]) == 16  # every block belongs to one stage
    assert ResNet50.STAGE_MODULES[0] == ("conv1", "bn1")
    assert [len(s) for s in ResNet50.STAGE_MODULES[1:]] == [3, 4, 6, 3]
    for bad in (-2, 8):
        with pytest.raises(ValueError, match=r"model\.frozen_stages"):
            frozen_modules(stages, bad)


@pytest.fixture(scope="module")
def lite0_grads():
    """Gradients of a Lite0 output with respect to its params, for frozen_stages -1 and 3."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 32, 32, 3))
    variables = jax.jit(EfficientNetLite0().init)(jax.random.PRNGKey(1), x)  # eager: ~60 s
    out = {}
    for frozen in (-1, 3):
        model = EfficientNetLite0(frozen_stages=frozen)

        def loss(params, model=model):
            y = model.apply({**variables, "params": params}, x)
            return jnp.sum(jnp.sin(y)), y

        out[frozen] = jax.jit(jax.grad(loss, has_aux=True))(variables["params"])
    return out


@pytest.mark.slow
def test_stopping_the_gradient_changes_no_value_and_no_trained_gradient(lite0_grads):
    full_grads, full_out = lite0_grads[-1]
    grads, out = lite0_grads[3]
    np.testing.assert_array_equal(out, full_out)
    frozen = frozen_modules(EfficientNetLite0.STAGE_MODULES, 3)
    for name, tree in grads.items():
        for g, g_full in zip(jax.tree.leaves(tree), jax.tree.leaves(full_grads[name]), strict=True):
            if name in frozen:
                assert not np.any(g), name
                assert np.any(g_full), name
            else:
                np.testing.assert_allclose(g, g_full, rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Parameters of a tiny Lite0 run before and after two steps, with frozen_stages=2."""
    from jdml.run import Run
    from jdml.step import make_train_step

    npz = make_npz(str(tmp_path_factory.mktemp("freeze") / "d.npz"), size=32)
    config = tiny_config(
        npz,
        **{
            "data.channels": 3,
            "data.image_size": 32,
            "model.backbone": "efficientnet_lite0",
            "model.frozen_bn": True,
            "model.frozen_stages": 2,
            "optim.weight_decay": 0.1,  # a decay that would move every parameter
        },
    )
    run = Run(config)
    make_batch = run.batch_maker()
    before = jax.tree.map(np.asarray, run.initial_state.params)
    step = make_train_step(run.method, run.tx)
    state = jax.tree.map(jnp.copy, run.initial_state)
    for i in range(2):
        state, _ = step(state, {k: jnp.asarray(v) for k, v in make_batch(i).items()})
    return before, jax.tree.map(np.asarray, state.params)


@pytest.mark.slow
def test_the_optimiser_leaves_frozen_stages_untouched(trained):
    before, after = trained
    frozen = frozen_modules(EfficientNetLite0.STAGE_MODULES, 2)
    backbone, backbone_after = before["model"]["backbone"], after["model"]["backbone"]
    for name in backbone:
        same = all(
            np.array_equal(a, b)
            for a, b in zip(
                jax.tree.leaves(backbone[name]), jax.tree.leaves(backbone_after[name]), strict=True
            )
        )
        assert same == (name in frozen), name
    assert not np.array_equal(
        before["model"]["head_discriminative"]["kernel"],
        after["model"]["head_discriminative"]["kernel"],
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"model.frozen_stages": 1},
            "backbone 'small_resnet' has no stages to freeze; backbones with them: "
            "efficientnet_lite0, resnet50",
        ),
        (
            {"model.backbone": "efficientnet_lite0", "data.channels": 3, "model.frozen_stages": 8},
            "choose -1 \\(train everything\\), 0 \\(freeze the stem\\) or up to 7",
        ),
        ({"model.frozen_stages": -2}, r"model\.frozen_stages"),
    ],
)
def test_frozen_stages_config_errors(tmp_path, overrides, message):
    from jdml.config import validate
    from jdml.errors import ConfigError

    config = tiny_config(make_npz(str(tmp_path / "d.npz")), **overrides)
    with pytest.raises(ConfigError, match=message):
        validate(config)
