"""EfficientNet-Lite0 with its real ImageNet weights: the Flax forward pass against PyTorch
reference logits recorded by ``tools/make_efficientnet_golden.py``, correct classes for real
photos, and the converter's errors for weight files that do not fit."""

from __future__ import annotations

import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import skimage  # the real photos (a test dependency, pyproject's [test] extra)
from PIL import Image

from jdml.config import set_keys
from jdml.data.transforms import eval_view
from jdml.errors import WeightMismatchError
from jdml.models.efficientnet import MEAN, STD, EfficientNetLite0
from jdml.models.pretrained.convert import fill
from jdml.models.pretrained.efficientnet import packaged_weights, rule
from jdml.models.pretrained.torch_io import load_weights
from tests.helpers import GOLDEN

GOLDEN_FILE = os.path.join(GOLDEN, "efficientnet_lite0_golden.npz")
# ImageNet-1k classes each photo must rank first (a set where the photo fits several).
EXPECTED_TOP1 = {
    "chelsea.png": {281, 282, 285},  # tabby, tiger cat, Egyptian cat
    "coffee.png": {967, 968},  # espresso, cup
    "rocket.jpg": {657, 744, 812},  # missile, projectile, space shuttle
    "motorcycle_left.png": {665, 670},  # moped, motor scooter
}


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN_FILE) as g:
        return {k: g[k] for k in g.files}


@pytest.fixture(scope="module")
def photos(golden):
    folder = os.path.join(os.path.dirname(skimage.__file__), "data")
    images = []
    for name in golden["photos"]:
        with Image.open(os.path.join(folder, str(name))) as photo:
            images.append(eval_view(np.asarray(photo.convert("RGB"))))
    return np.stack(images)


@pytest.fixture(scope="module")
def state_dict():
    return load_weights(packaged_weights())


@pytest.fixture(scope="module")
def classifier():
    model = EfficientNetLite0(num_classes=1000)
    template = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)))
    )
    return model, template


@pytest.fixture(scope="module")
def logits(classifier, state_dict, photos):
    model, template = classifier
    variables = fill(template, state_dict, rule, source="lite0")
    x = (photos.astype(np.float32) / 255.0 - MEAN) / STD
    return np.asarray(jax.jit(model.apply)(variables, x))


def test_inputs_are_the_recorded_ones(golden, photos):
    hashes = [hashlib.sha256(image.tobytes()).hexdigest() for image in photos]
    assert hashes == list(golden["sha256"]), "the photos or their preprocessing changed"


def test_logits_match_the_pytorch_reference(golden, logits):
    assert logits.shape == golden["logits"].shape
    np.testing.assert_allclose(logits, golden["logits"], atol=1e-4, rtol=0)


def test_real_photos_are_classified_correctly(golden, logits):
    names = [str(n) for n in golden["photos"]]
    for name, expected in EXPECTED_TOP1.items():
        row = logits[names.index(name)]
        assert int(np.argmax(row)) in expected, (name, np.argsort(-row)[:5])


def test_converter_reports_missing_misshapen_and_unused_weights(classifier, state_dict):
    _, template = classifier
    broken = dict(state_dict)
    del broken["_blocks.3._bn1.running_var"]
    broken["_conv_head.weight"] = np.zeros((1280, 321, 1, 1), np.float32)
    broken["extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(WeightMismatchError) as err:
        fill(template, broken, rule, source="broken.pth")
    message = str(err.value)
    assert "broken.pth" in message
    assert "_blocks.3._bn1.running_var (for batch_stats/blocks_3/bn1/var)" in message
    assert "1 of the wrong shape: _conv_head.weight (1280, 321, 1, 1)" in message
    assert "1 not used by the model: extra.weight" in message


def test_backbone_without_classifier_leaves_fc_unused(state_dict):
    backbone = EfficientNetLite0()
    template = jax.eval_shape(
        lambda: backbone.init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)))
    )
    with pytest.raises(WeightMismatchError, match=r"_fc\.weight"):
        fill(template, state_dict, rule, source="lite0")
    variables = fill(
        template, state_dict, rule, source="lite0", ignore=lambda k: k.startswith("_fc.")
    )
    assert variables["params"]["conv_head"]["kernel"].shape == (1, 1, 320, 1280)


def _lite0_config(**overrides):
    from configs.revisiting import get_config

    c = get_config("data=npz")
    set_keys(
        c,
        {
            "data.path": "unused.npz",
            "data.channels": 3,
            "model.backbone": "efficientnet_lite0",
            "model.pretrained": "packaged",
            "model.frozen_bn": True,
            **overrides,
        },
    )
    return c


def test_method_starts_from_the_pretrained_backbone_with_random_heads(state_dict):
    from jdml.config import validate
    from jdml.methods.method import Method

    config = _lite0_config()
    validate(config)
    method = Method(config, num_classes=4)
    images = np.zeros((2, 64, 64, 3), np.float32)
    init = jax.jit(method.init)  # one compilation for both keys (eager init is slow)
    params, stats = init(jax.random.PRNGKey(0), images)
    backbone = params["model"]["backbone"]
    np.testing.assert_array_equal(
        backbone["blocks_5"]["depthwise_conv"]["kernel"],
        np.transpose(state_dict["_blocks.5._depthwise_conv.weight"], (2, 3, 1, 0)),
    )
    np.testing.assert_array_equal(stats["backbone"]["bn1"]["var"], state_dict["_bn1.running_var"])
    head = params["model"]["head_discriminative"]["kernel"]
    assert head.shape == (1280, config.model.embed_dim) and np.std(head) > 0
    other, _ = init(jax.random.PRNGKey(1), images)
    assert not np.array_equal(other["model"]["head_discriminative"]["kernel"], head)
    np.testing.assert_array_equal(other["model"]["backbone"]["conv_stem"]["kernel"],
                                  backbone["conv_stem"]["kernel"])  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model.pretrained": "/no/such/weights.pth"}, "no weight file at /no/such/weights.pth"),
        ({"model.backbone": "small_resnet"}, "backbone 'small_resnet' has no weight converter"),
        ({"model.pooling": "max"}, "model.pooling='max'; choose avg or avg\\+max"),
    ],
)
def test_pretrained_config_errors(overrides, message):
    from jdml.config import validate
    from jdml.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        validate(_lite0_config(**overrides))


@pytest.mark.parametrize("backbone", ["efficientnet_lite0", "resnet50", "bninception"])
def test_backbone_normalisation_is_per_channel(backbone):
    from jdml.methods.method import Method
    from jdml.models import input_normalization

    config = _lite0_config(
        **{"model.backbone": backbone, "model.pretrained": "", "data.normalization": "backbone"}
    )
    method = Method(config, num_classes=4)
    images = np.random.default_rng(0).uniform(size=(2, 4, 4, 3)).astype(np.float32)
    mean, std = (np.asarray(v, np.float32) for v in input_normalization(backbone))
    np.testing.assert_allclose(method.preprocess(images), (images - mean) / std, rtol=1e-6)


def test_backbone_normalisation_needs_backbone_constants():
    from jdml.config import validate
    from jdml.errors import ConfigError

    config = _lite0_config(
        **{
            "model.backbone": "small_resnet",
            "model.pretrained": "",
            "data.normalization": "backbone",
        }
    )
    with pytest.raises(ConfigError, match="has no input constants of its own"):
        validate(config)
