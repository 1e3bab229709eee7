"""A backbone declares its own ``model.*`` keys, their ranges and its checks in its module: the
base config gets the keys and ``validate`` applies the ranges and the check of the selected one."""

from __future__ import annotations

import json

import flax.linen as nn
import ml_collections
import pytest

from jdml.config import base_config, saved_config, set_keys, to_json, validate
from jdml.errors import ConfigError
from jdml.keys import RENAMED_KEYS, get_dotted
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
    assert {key: get_dotted(model, key) for key in KEYS} == KEYS
    assert set(model.small_resnet) == {key.split(".")[1] for key in KEYS}
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
    c = set_keys(base_config(), {"model.small_resnet.stage_blocks": (1, 1)})
    with pytest.raises(ConfigError, match="need one entry per stage"):
        validate(c)
    validate(set_keys(c, {"model.backbone": toy_backbone}))


def test_two_backbones_cannot_give_one_key_two_defaults(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(BACKBONES._items, "wide", _toy)
    monkeypatch.setitem(BACKBONES._ranges, "wide", {})
    monkeypatch.setitem(BACKBONES._meta, "wide", {"keys": {"small_resnet.stem_features": 64}})
    with pytest.raises(
        ValueError, match=r"declare model\.small_resnet\.stem_features with different defaults"
    ):
        backbone_keys()


# -- one key style: each backbone family's keys in its own section ---------------------------

#: The backbones' keys before they had sections, and where they are now.
FLAT = {
    "model.vit_pooling": "model.vit.pooling",
    "model.vit_attention": "model.vit.attention",
    "model.vit_patch": "model.vit.patch",
    "model.vit_dim": "model.vit.dim",
    "model.vit_depth": "model.vit.depth",
    "model.vit_heads": "model.vit.heads",
    "model.vit_layer_scale": "model.vit.layer_scale",
    "model.vit_registers": "model.vit.registers",
    "model.stem_features": "model.small_resnet.stem_features",
    "model.stem_strides": "model.small_resnet.stem_strides",
    "model.stage_features": "model.small_resnet.stage_features",
    "model.stage_blocks": "model.small_resnet.stage_blocks",
    "model.stage_strides": "model.small_resnet.stage_strides",
}


def test_every_backbone_key_is_in_its_family_section():
    """No backbone declares a flat ``model.*`` key: the ViTs' are ``model.vit.*``,
    small_resnet's ``model.small_resnet.*``, as a loss's are ``loss.<name>.*``."""
    model = base_config().model
    for name in BACKBONES.names():
        for key in BACKBONES.meta(name).get("keys", {}):
            family, _ = key.split(".")
            assert isinstance(model[family], ml_collections.ConfigDict), (name, key)
    assert sorted(model.vit) == sorted(v.split(".")[-1] for v in FLAT.values() if ".vit." in v)


@pytest.mark.parametrize("old", sorted(FLAT))
def test_an_old_flat_key_is_refused_with_its_new_name(old: str):
    assert RENAMED_KEYS[old] == FLAT[old]
    with pytest.raises(ConfigError, match=rf"{old}.*is now {FLAT[old]}"):
        set_keys(base_config(), {old: 1})


def test_a_saved_config_with_flat_keys_reads_them_into_the_sections():
    """A run's config.json written before the sections existed loads (resume, evaluate) with
    its values under the new names."""
    old = json.loads(to_json(base_config()))
    model = old["model"]
    vit = model.pop("vit")
    small = model.pop("small_resnet")
    model.update({f"vit_{k}": v for k, v in vit.items()})
    model.update(small)
    model["vit_depth"], model["stage_blocks"] = 2, [2, 1, 1]
    loaded = saved_config(json.dumps(old))
    assert loaded.model.vit.depth == 2 and tuple(loaded.model.small_resnet.stage_blocks) == (
        2,
        1,
        1,
    )
    assert "vit_depth" not in loaded.model and "stage_blocks" not in loaded.model
    validate(loaded)


def test_a_saved_cohort_names_its_members_keys_anew():
    """A heterogeneous cohort's ``cohort.members`` entries, saved with the flat keys, read with
    the new names (its members' configs build), and other items are kept as written."""
    old = json.loads(to_json(base_config()))
    old["cohort"].update(size=2, members=["", "model.stem_features=16; model.embed_dim=8"])
    loaded = saved_config(json.dumps(old))
    assert loaded.cohort.members == ("", "model.small_resnet.stem_features=16;model.embed_dim=8")


def test_the_emoji_study_records_keep_their_config_digest():
    """The tuning records committed for the emoji study (``experiments/results/emoji-v2-45``)
    were trained when the keys were flat; their configs, rebuilt by the code now, still have
    the digest they were recorded with (``jdml.keys.DIGEST_NAMES``), so the study goes on
    with them rather than refusing its own records."""
    import importlib.util
    from pathlib import Path

    from jdml.study.runner import config_digest, tune_config

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "emoji_study", root / "experiments/emoji_study.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    study = module.get_study()
    checked = 0
    for path in sorted(
        (root / "experiments/results/emoji-v2-45/records/tune").glob("*/trial0.json")
    ):
        record = json.loads(path.read_text())
        if not record.get("config_sha256"):
            continue  # converted from the earlier scripts' records, which kept no digest
        config = tune_config(study, study.row(record["row"]), record["settings"], record["fold"])
        assert config_digest(config) == record["config_sha256"], path
        checked += 1
    assert checked >= 10
