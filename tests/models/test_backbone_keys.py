"""A backbone declares its own ``model.*`` keys, their ranges and its checks in its module: the
base config gets the keys and ``validate`` applies the ranges and the check of the selected one."""

from __future__ import annotations

import flax.linen as nn
import ml_collections
import pytest

from jdml.config import base_config, set_keys, validate
from jdml.errors import ConfigError
from jdml.models import BACKBONES, backbone_keys
from jdml.models.small_resnet import KEYS, SmallResNet
from jdml.registry import COUNT


def _toy_check(config: ml_collections.ConfigDict) -> None:
    if config.model.toy_width % 2:
        raise ConfigError(f"model.toy_width={config.model.toy_width} must be even")


def _toy(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    return SmallResNet((cfg.toy_width,), (1,), (2,), stem_features=4, train_bn=train)


@pytest.fixture
def toy_backbone(monkeypatch: pytest.MonkeyPatch) -> str:
    """A backbone with one key of its own, registered for the test only."""
    monkeypatch.setitem(BACKBONES._items, "toy", _toy)
    monkeypatch.setitem(BACKBONES._ranges, "toy", {"toy_width": COUNT})
    monkeypatch.setitem(BACKBONES._meta, "toy", {"keys": {"toy_width": 8}, "check": _toy_check})
    return "toy"


def test_small_resnet_keys_come_from_its_registration():
    assert BACKBONES.meta("small_resnet")["keys"] is KEYS
    model = base_config().model
    assert {key: model[key] for key in KEYS} == KEYS
    assert set(BACKBONES.ranges("small_resnet")) == set(KEYS)


def test_a_new_backbone_brings_its_keys_ranges_and_check(toy_backbone):
    c = set_keys(base_config(), {"model.backbone": toy_backbone})
    assert c.model.toy_width == 8
    validate(c)
    with pytest.raises(ConfigError, match=r"model\.toy_width=0 must be at least 1"):
        validate(set_keys(c, {"model.toy_width": 0}))
    with pytest.raises(ConfigError, match=r"model\.toy_width=3 must be even"):
        validate(set_keys(c, {"model.toy_width": 3}))


def test_only_the_selected_backbone_checks_its_keys(toy_backbone):
    """small_resnet's stage keys of any length do not stop a run of another backbone."""
    c = set_keys(base_config(), {"model.stage_blocks": (1, 1)})
    with pytest.raises(ConfigError, match="need one entry per stage"):
        validate(c)
    validate(set_keys(c, {"model.backbone": toy_backbone}))


def test_two_backbones_cannot_give_one_key_two_defaults(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(BACKBONES._items, "wide", _toy)
    monkeypatch.setitem(BACKBONES._ranges, "wide", {})
    monkeypatch.setitem(BACKBONES._meta, "wide", {"keys": {"stem_features": 64}})
    with pytest.raises(ValueError, match=r"declare model\.stem_features with different defaults"):
        backbone_keys()
