"""ResNet-50, GoogLeNet and BN-Inception against their frameworks' own forward passes.

``tools/make_backbone_golden.py`` gave each reference model (torchvision, timm, Cadene
``pretrainedmodels``) deterministic synthetic weights, BatchNorm running statistics included,
and recorded its eval-mode pooled features on a fixed input. Here the same weights are rebuilt
from the recorded key names and shapes with the same NumPy recipe (imported from the script,
which needs torch only to record), converted, and the Flax features must match within 1e-4
absolute (the features reach 10-20). No torch is needed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.errors import WeightMismatchError
from jdml.models import bninception as bninception_module
from jdml.models import googlenet as googlenet_module
from jdml.models import resnet50 as resnet50_module
from jdml.models.pretrained import bninception as bninception_converter
from jdml.models.pretrained import googlenet as googlenet_converter
from jdml.models.pretrained import resnet50 as resnet_converter
from jdml.models.pretrained.backbones import load_backbone
from jdml.models.pretrained.convert import fill
from jdml.models.pretrained.torch_io import load_weights
from tests.helpers import GOLDEN, REPO

ROOT = REPO
DATA = os.path.join(GOLDEN, "backbones")
ATOL = 1e-4
# The framework whose state dict each backbone's main comparison uses.
FRAMEWORK = {"resnet50": "torchvision", "googlenet": "torchvision", "bninception": "cadene"}


def _recipe() -> ModuleType:
    """The golden script, for its torch-free weight and input recipe."""
    spec = importlib.util.spec_from_file_location(
        "make_backbone_golden", os.path.join(ROOT, "tools", "make_backbone_golden.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recipe = _recipe()


def _record(name: str) -> dict[str, Any]:
    with np.load(os.path.join(DATA, f"{name}.npz")) as f:
        return {k: f[k] for k in f.files}


def _specs(record: Mapping[str, Any], framework: str) -> list:
    return json.loads(str(record[f"{framework}_specs"]))


def _shapes_only(specs: list) -> dict[str, np.ndarray]:
    """A state dict with the right keys and shapes and no memory behind it (for the errors)."""
    return {key: np.broadcast_to(np.zeros((), dtype), shape) for key, shape, dtype in specs}


def write_safetensors(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Writes ``arrays`` in the safetensors layout: u64 header size, JSON header, raw bytes."""
    codes = {
        np.dtype(t): code
        for t, code in [(np.float32, "F32"), (np.float16, "F16"), (np.int64, "I64"),
                        (np.int32, "I32"), (np.int8, "I8"), (np.uint8, "U8"), (np.bool_, "BOOL")]
    }  # fmt: skip
    header, blobs, offset = {}, [], 0
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key], dtype=arrays[key].dtype.newbyteorder("<"))
        header[key] = {
            "dtype": codes[a.dtype.newbyteorder("=")],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        blobs.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


class Backbone:
    """One backbone under test: its module, converter, input and recorded features."""

    def __init__(
        self,
        name: str,
        make: Callable[..., nn.Module],
        rule: Any,
        ignore: Callable[[str], bool],
        flax_input: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        self.name, self.make, self.rule, self.ignore = name, make, rule, ignore
        self.record = _record(name)
        size = int(self.record["size"])
        self.x01 = recipe.synthetic_input(size)
        self.x = flax_input(self.x01)
        model = make()
        self.template = jax.eval_shape(
            lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, size, size, 3)))
        )
        self.apply = jax.jit(model.apply)

    def weights(self, framework: str) -> dict[str, np.ndarray]:
        return recipe.synthetic_weights(_specs(self.record, framework))

    def convert(self, state: Mapping[str, np.ndarray], source: str = "synthetic") -> dict:
        return fill(self.template, state, self.rule, source=source, ignore=self.ignore)


@pytest.fixture(scope="module")
def resnet50() -> Backbone:
    return Backbone(
        "resnet50",
        resnet50_module.ResNet50,
        resnet_converter.rule,
        resnet_converter.ignore,
        lambda x01: recipe.normalise(x01, resnet50_module.MEAN, resnet50_module.STD),
    )


@pytest.mark.parametrize("name", ["resnet50", "googlenet", "bninception"])
def test_recipe_reproduces_the_recorded_weights_and_input(name, request):
    """Guards the comparisons below: a NumPy change in the recipe would show here first."""
    backbone = request.getfixturevalue(name)
    framework = FRAMEWORK[name]
    assert recipe.digest(backbone.weights(framework)) == str(
        backbone.record[f"{framework}_weights_sha256"]
    ), "the NumPy weight recipe no longer gives the recorded weights"
    digest = hashlib.sha256(backbone.x01.tobytes()).hexdigest()
    assert digest == str(backbone.record["input_sha256"])


def test_resnet50_file_to_features_matches_torchvision(resnet50, tmp_path):
    """safetensors file -> load_weights -> registered converter -> Flax forward."""
    path = str(tmp_path / "resnet50.safetensors")
    write_safetensors(path, resnet50.weights("torchvision"))
    nested = {k: {"backbone": v, "head": {}} for k, v in resnet50.template.items()}
    variables = load_backbone("resnet50", path)(nested)
    variables = {k: v["backbone"] for k, v in variables.items()}
    features = np.asarray(resnet50.apply(variables, resnet50.x))
    expected = resnet50.record["torchvision_features"]
    assert features.shape == expected.shape == (2, resnet50_module.FEATURES)
    np.testing.assert_allclose(features, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("framework", ["timm", "cadene"])
def test_resnet50_timm_and_cadene_checkpoints(resnet50, framework):
    specs = _specs(resnet50.record, framework)
    if framework == "cadene":
        assert "last_linear.weight" in {key for key, _, _ in specs}
    features = np.asarray(resnet50.apply(resnet50.convert(resnet50.weights(framework)), resnet50.x))
    np.testing.assert_allclose(
        features, resnet50.record[f"{framework}_features"], atol=ATOL, rtol=0
    )


def test_torch_zip_file_of_the_stem(resnet50):
    """A real ``torch.save`` file (zip format) reads back as the recipe's tensors."""
    stem = load_weights(os.path.join(DATA, "resnet50_stem.pt"))
    specs = [s for s in _specs(resnet50.record, "torchvision") if s[0].split(".")[0] in
             ("conv1", "bn1")]  # fmt: skip
    assert sorted(stem) == [key for key, _, _ in specs]
    for key, value in recipe.synthetic_weights(specs).items():
        np.testing.assert_array_equal(stem[key], value)


def test_resnet50_rejects_other_architectures(resnet50):
    """A ResNet-101 checkpoint (23 blocks in layer3) has tensors ResNet-50 does not use."""
    specs = _specs(resnet50.record, "torchvision")
    extra = [
        (key.replace("layer3.5.", f"layer3.{i}."), shape, dtype)
        for i in range(6, 23)
        for key, shape, dtype in specs
        if key.startswith("layer3.5.")
    ]
    with pytest.raises(WeightMismatchError, match=r"not used by the model: layer3\.10\."):
        resnet50.convert(_shapes_only(specs + extra), source="resnet101.pth")


@pytest.fixture(scope="module")
def googlenet() -> Backbone:
    """torchvision's GoogLeNet as a torchvision user runs it with the ImageNet weights:
    ImageNet-normalised input, ``transform_input=True``."""
    return Backbone(
        "googlenet",
        lambda: googlenet_module.GoogLeNet(transform_input=True),
        googlenet_converter.rule,
        googlenet_converter.ignore,
        lambda x01: recipe.normalise(
            x01, googlenet_module.IMAGENET_MEAN, googlenet_module.IMAGENET_STD
        ),
    )


def test_googlenet_file_to_features_matches_torchvision(googlenet, tmp_path):
    path = str(tmp_path / "googlenet.safetensors")
    weights = googlenet.weights("torchvision")
    assert any(k.startswith("aux1.") for k in weights)  # as in torchvision's ImageNet file
    write_safetensors(path, weights)
    variables = googlenet.convert(load_weights(path), source=path)
    features = np.asarray(googlenet.apply(variables, googlenet.x))
    expected = googlenet.record["torchvision_features"]
    assert features.shape == expected.shape == (2, googlenet_module.FEATURES)
    np.testing.assert_allclose(features, expected, atol=ATOL, rtol=0)


def test_googlenet_native_input_frozen_bn_and_avg_max_pooling(googlenet):
    """The default module (no transform_input) on ``(x - 0.5) / 0.5`` input gives what torchvision
    gives on ImageNet-normalised input. Frozen BN: a training-mode apply (mutable batch_stats)
    leaves the statistics as they were; trainable BN updates them. avg+max pooling is the
    recorded average plus the recorded spatial max of the last map."""
    x = recipe.normalise(googlenet.x01, googlenet_module.MEAN, googlenet_module.STD)
    np.testing.assert_allclose(
        np.asarray(googlenet_module.transform_imagenet_input(jnp.asarray(googlenet.x))), x,
        atol=1e-5, rtol=0,
    )  # fmt: skip
    variables = googlenet.convert(googlenet.weights("torchvision"))
    record = googlenet.record
    frozen = googlenet_module.GoogLeNet(train_bn=False, pooling="avg+max")
    features, updates = jax.jit(lambda v, x: frozen.apply(v, x, mutable=["batch_stats"]))(
        variables, x
    )
    jax.tree.map(np.testing.assert_array_equal, updates["batch_stats"], variables["batch_stats"])
    expected = record["torchvision_features"] + record["torchvision_max"]
    np.testing.assert_allclose(np.asarray(features), expected, atol=ATOL, rtol=0)
    training = googlenet_module.GoogLeNet(train_bn=True)
    _, updates = jax.jit(lambda v, x: training.apply(v, x, mutable=["batch_stats"]))(variables, x)
    changed = jax.tree.map(
        lambda a, b: not np.allclose(a, b), updates["batch_stats"], variables["batch_stats"]
    )
    assert all(jax.tree.leaves(changed))


def test_googlenet_bfloat16_compute(googlenet):
    """bfloat16 compute with float32 params gives float32 features near the float32 ones."""
    variables = googlenet.convert(googlenet.weights("torchvision"))
    model = googlenet_module.GoogLeNet(transform_input=True, dtype=jnp.bfloat16)
    features = jax.jit(model.apply)(variables, googlenet.x)
    assert features.dtype == jnp.float32
    expected = googlenet.record["torchvision_features"]
    error = np.abs(np.asarray(features) - expected).max() / np.abs(expected).max()
    assert error < 0.05, error


@pytest.fixture(scope="module")
def bninception() -> Backbone:
    """Cadene's BN-Inception; the recorded run had Cadene's BGR 0-255 input."""
    return Backbone(
        "bninception",
        bninception_module.BNInception,
        bninception_converter.rule,
        bninception_converter.ignore,
        lambda x01: recipe.normalise(x01, bninception_module.MEAN, bninception_module.STD),
    )


def test_bninception_file_to_features_matches_cadene(bninception, tmp_path):
    """The documented RGB constants plus the channel flip inside the module reproduce Cadene's
    input; features = Cadene's own forward pass up to its classifier (7x7 pool at 224 px)."""
    path = str(tmp_path / "bninception.safetensors")
    write_safetensors(path, bninception.weights("cadene"))
    variables = bninception.convert(load_weights(path), source=path)
    features = np.asarray(bninception.apply(variables, bninception.x))
    expected = bninception.record["cadene_features"]
    assert features.shape == expected.shape == (2, bninception_module.FEATURES)
    np.testing.assert_allclose(features, expected, atol=ATOL, rtol=0)


def test_bninception_needs_even_maps_before_the_reduction_blocks(bninception):
    model = bninception_module.BNInception()
    with pytest.raises(ValueError, match="inception_3c needs a map of even size"):
        jax.eval_shape(model.apply, bninception.template, jnp.zeros((1, 200, 200, 3)))


@pytest.mark.parametrize(
    ("target", "source"),
    [("resnet50", "googlenet"), ("googlenet", "bninception"), ("bninception", "resnet50")],
)
def test_converters_reject_other_architectures(target, source, request):
    """A checkpoint of another architecture: its tensors are reported missing and unused."""
    model, other = request.getfixturevalue(target), request.getfixturevalue(source)
    state = _shapes_only(_specs(other.record, FRAMEWORK[source]))
    with pytest.raises(WeightMismatchError) as err:
        model.convert(state, source=f"{source}.pth")
    assert f"{source}.pth does not fit the model" in str(err.value)
    assert "missing" in str(err.value) and "not used by the model" in str(err.value)


def test_builders_follow_the_model_config():
    import ml_collections

    from jdml.models.embedding import BACKBONES

    cfg = ml_collections.ConfigDict({"frozen_bn": True, "pooling": "avg+max", "dtype": "bfloat16"})
    for name, cls in [
        ("resnet50", resnet50_module.ResNet50),
        ("googlenet", googlenet_module.GoogLeNet),
        ("bninception", bninception_module.BNInception),
    ]:
        model = BACKBONES.get(name)(cfg, train=True)
        assert isinstance(model, cls)
        assert (model.train_bn, model.pooling, model.dtype) == (False, "avg+max", jnp.bfloat16)
    assert not BACKBONES.get("googlenet")(cfg, train=True).transform_input
