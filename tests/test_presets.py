"""Every method's config builds with every benchmark preset, carries the papers' settings, and
refuses to start without the ImageNet weights it fine-tunes."""

from __future__ import annotations

import importlib

import pytest

from jdml.config import validate
from jdml.errors import ConfigError

METHODS = ("revisiting", "diva", "sharing", "dm2")
BENCHMARKS = ("cub200", "cars196", "sop", "inshop")
INSHOP_METRICS = ("recall@1", "recall@10", "recall@20", "recall@30", "map@r", "nmi")
# (method, data) -> expected values of the papers' runs.
EXPECTED = {
    ("revisiting", "cub200"): {"train.epochs": 150, "train.batch_size": 112, "optim.lr": 1e-5},
    ("revisiting", "sop"): {"train.epochs": 100, "sampler.samples_per_class": 2},
    ("diva", "cub200"): {"train.epochs": 350, "optim.milestones": (55,)},
    ("diva", "sop"): {"train.epochs": 150, "aux.selfsimilarity.queue_batches": 70},
    ("sharing", "cub200"): {"decorrelation.weights": (2400.0,), "sampler.samples_per_class": 4},
    ("dm2", "cub200"): {
        "train.batch_size": 120,
        "sampler.samples_per_class": 5,
        "optim.lr": 3e-5,
        "model.embed_dim": 512,
        "cohort.size": 4,
    },
    ("dm2", "sop"): {"sampler.samples_per_class": 2, "model.frozen_bn": False},
    # In-Shop has no reference runs: SOP's settings, and its papers' recall cut-offs.
    ("revisiting", "inshop"): {"train.epochs": 100, "eval.metrics": INSHOP_METRICS},
    ("diva", "inshop"): {"decorrelation.weights": (150.0,) * 3, "train.epochs": 150},
    ("sharing", "inshop"): {"decorrelation.weights": (500.0,)},
    ("dm2", "inshop"): {"sampler.samples_per_class": 2, "model.frozen_bn": False},
}


def build(method: str, data: str):
    return importlib.import_module(f"configs.{method}").get_config(f"data={data}")


def lookup(config, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("data", BENCHMARKS)
@pytest.mark.parametrize("method", METHODS)
def test_preset_builds_and_needs_the_imagenet_weights(method, data, tmp_path):
    config = build(method, data)
    assert config.data.name == data
    assert config.model.backbone == "resnet50" and config.data.image_size == 224
    assert config.data.normalization == "backbone" and config.data.augment == "base"
    for key, value in EXPECTED.get((method, data), {}).items():
        assert lookup(config, key) == value, key
    with pytest.raises(ConfigError, match=r"--config\.model\.pretrained=<path>"):
        validate(config)
    weights = tmp_path / "resnet50.pth"
    weights.write_bytes(b"")  # validate checks that the file exists; reading it comes later
    with config.unlocked():
        config.model.pretrained = str(weights)
    validate(config)
