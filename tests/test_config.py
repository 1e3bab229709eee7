"""Configs: every key declared, bad choices rejected with messages that name the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs.revisiting import get_config
from jdml.config import base_config, from_json, to_json, validate
from jdml.errors import ConfigError
from jdml.trainer import prepare_workdir
from tests.helpers import REPO, make_npz, tiny_config


def test_default_config_is_valid_and_round_trips():
    c = get_config()
    validate(c)
    assert (c.loss.name, c.miner.name, c.sampler.name) == ("margin", "distance", "class_random")
    assert c.sampler.samples_per_class == 2 and c.train.batch_size == 112
    assert c.loss.margin.beta == 1.2 and c.loss.margin.beta_lr == 5e-4
    assert from_json(to_json(c)).to_dict() == c.to_dict()


@pytest.mark.parametrize(
    "key,value,pattern",
    [
        ("loss.name", "marginn", "choose one of: .*margin"),
        ("miner.name", "hardest", "choose one of: .*distance"),
        ("sampler.name", "spc", "choose one of: .*class_random"),
        ("data.name", "imagenet", "choose one of: .*glyphs"),
        ("model.backbone", "vgg", "choose one of: .*small_resnet"),
        ("eval.selection_metric", "recall@3", "not among eval.metrics"),
        (
            "eval.per_query",
            ("nmi",),
            r"not a retrieval metric of eval.metrics; choose from "
            r"\['recall@1'",
        ),
        ("eval.per_query", ("recall@3",), "not a retrieval metric"),
        ("optim.no_decay", ("1d", "no-such"), "optim.no_decay has 'no-such'; give '1d'"),
        ("optim.layer_decay_grouping", "beit", "grouping='beit'; choose one of: mae, timm"),
    ],
)
def test_unknown_names_are_rejected(key, value, pattern):
    c = get_config()
    section, name = key.split(".")
    c[section][name] = value
    with pytest.raises((ConfigError, KeyError), match=pattern):
        validate(c)


def _choice_registries():
    from jdml.cohort.members import MEMBER_LOOPS
    from jdml.data.splits import SPLITS
    from jdml.losses.mutual import RELATIONS
    from jdml.models import INPUT_NORMALIZATIONS, POOLINGS
    from jdml.nn.batch_norm import BATCH_NORM_MODES

    return [
        ("model.pooling", POOLINGS),
        ("data.normalization", INPUT_NORMALIZATIONS),
        ("cohort.member_loop", MEMBER_LOOPS),
        ("exchange.dm2.relation", RELATIONS),
        ("parallel.batch_norm", BATCH_NORM_MODES),
        ("eval.splits", SPLITS),
    ]


@pytest.mark.parametrize("index", range(6))
def test_choices_are_read_from_the_registries(index, monkeypatch):
    """A value a component registers is accepted and named in the message of a refusal."""
    key, registry = _choice_registries()[index]
    *path, name = key.split(".")
    tuple_valued = key == "eval.splits"
    c = get_config()
    section = c
    for part in path:
        section = section[part]
    default = section[name][0] if tuple_valued else section[name]
    section[name] = ("nonesuch",) if tuple_valued else "nonesuch"
    with pytest.raises(ConfigError) as refused:
        validate(c)
    assert all(known in str(refused.value) for known in registry.names()), refused.value
    # A value registered later (here for the test only: the default's entry) is accepted.
    monkeypatch.setitem(registry._items, "nonesuch", registry.get(default))
    monkeypatch.setitem(registry._ranges, "nonesuch", {})
    validate(c)


def test_batch_size_not_divisible():
    c = get_config()
    c.train.batch_size = 111
    with pytest.raises(ConfigError, match=r"not divisible by sampler\.samples_per_class=2"):
        validate(c)


def test_misspelt_key_is_an_error():
    c = base_config()
    c.lock()
    with pytest.raises(AttributeError):
        c.optim.lrr = 1.0


def test_workdir_with_other_config_is_refused_and_left_intact(tmp_path):
    npz = make_npz(str(tmp_path / "d.npz"))
    workdir = str(tmp_path / "w")
    prepare_workdir(tiny_config(npz), workdir)
    os.makedirs(os.path.join(workdir, "checkpoints", "2"))  # a trained step is on disk
    with open(os.path.join(workdir, "config.json")) as f:
        before = f.read()
    with pytest.raises(ConfigError, match=r"loss.name: 'margin' -> 'triplet'"):
        prepare_workdir(tiny_config(npz, **{"loss.name": "triplet"}), workdir)
    with open(os.path.join(workdir, "config.json")) as f:
        assert f.read() == before
    prepare_workdir(tiny_config(npz, **{"train.epochs": 9}), workdir)  # extending is allowed


def test_workdir_without_checkpoint_takes_the_new_config(tmp_path):
    """A start that failed or stopped before its first checkpoint trained nothing: the
    corrected command replaces its config instead of being refused."""
    npz = make_npz(str(tmp_path / "d.npz"))
    workdir = str(tmp_path / "w")
    prepare_workdir(tiny_config(npz), workdir)
    os.makedirs(os.path.join(workdir, "checkpoints", "4.orbax-checkpoint-tmp-1"))  # cut short
    prepare_workdir(tiny_config(npz, **{"loss.name": "triplet"}), workdir)
    with open(os.path.join(workdir, "config.json")) as f:
        assert '"name": "triplet"' in f.read()


def _train_cli(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_cli_misspelt_override_names_the_key(tmp_path):
    res = _train_cli(
        "--config=configs/revisiting.py", f"--workdir={tmp_path}", "--config.optim.lrr=0.1"
    )
    assert res.returncode == 2
    assert "unknown config key --config.optim.lrr" in res.stderr
    assert "did you mean --config.optim.lr" in res.stderr
    assert "Traceback" not in res.stderr


def test_cli_missing_data_path(tmp_path):
    res = _train_cli(
        "--config=configs/revisiting.py:data=npz",
        f"--workdir={tmp_path / 'w'}",
        f"--config.data.path={tmp_path / 'nope.npz'}",
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "nope.npz" in res.stderr and "Traceback" not in res.stderr


def test_cli_one_sample_class(tmp_path):
    path = str(tmp_path / "one.npz")
    images = np.zeros((9, 16, 16, 1), np.uint8)
    np.savez(path, images=images, labels=np.array([0, 0, 0, 0, 1, 2, 2, 3, 3]))
    res = _train_cli(
        "--config=configs/revisiting.py:data=npz",
        f"--workdir={tmp_path / 'w'}",
        f"--config.data.path={path}",
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "1 sample" in res.stderr and "Traceback" not in res.stderr


def test_cli_unknown_loss(tmp_path):
    res = _train_cli(
        "--config=configs/revisiting.py", f"--workdir={tmp_path}", "--config.loss.name=magin"
    )
    assert res.returncode == 2 and "margin" in res.stderr and "Traceback" not in res.stderr


def test_cli_unreadable_image_names_the_file(tmp_path):
    from PIL import Image

    root = tmp_path / "imgs"
    for c in range(4):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(3):
            Image.new("L", (20, 20), color=40 * i).save(root / f"class{c}" / f"{i}.png")
    (root / "class1" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    res = _train_cli(
        "--config=configs/revisiting.py:data=folder",
        f"--workdir={tmp_path / 'w'}",
        f"--config.data.path={root}",
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "broken.jpg" in res.stderr and "Traceback" not in res.stderr


def test_command_line_overrides_of_tuples_and_optional_values():
    from absl import flags
    from ml_collections import config_flags

    argv = [
        "prog",
        "--config=" + os.path.join(REPO, "configs", "revisiting.py"),
        "--config.miner.distance.upper_cutoff=None",
        "--config.eval.metrics=('recall@1', 'nmi')",
        "--config.loss.margin.beta=0.6",
    ]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=fv, sys_argv=argv)
    fv(argv)
    c = fv.config
    assert c.miner.distance.upper_cutoff is None
    assert tuple(c.eval.metrics) == ("recall@1", "nmi")
    assert c.loss.margin.beta == 0.6
    validate(c)


def test_unselected_components_do_not_block_resuming():
    from jdml.config import incompatible_keys

    old = get_config().to_dict()
    new = get_config().to_dict()
    del old["miner"]["random"]  # e.g. written by a version without that miner
    new["loss"]["triplet"]["margin"] = 0.5  # not the selected loss
    assert incompatible_keys(old, new) == []
    new["loss"]["margin"]["beta"] = 0.6
    assert incompatible_keys(old, new) == ["loss.margin.beta: 1.2 -> 0.6"]


def test_declared_ranges_name_real_hyperparameters_and_accept_the_defaults():
    from jdml.config import component_defaults
    from jdml.losses import LOSSES
    from jdml.miners import MINERS
    from jdml.samplers import SAMPLERS

    declared = 0
    for registry in (LOSSES, MINERS, SAMPLERS):
        for name in registry.names():
            defaults = component_defaults(registry.get(name))
            for key, allowed in registry.ranges(name).items():
                assert key in defaults, (name, key)
                declared += 1
                if defaults[key] is not None:
                    assert allowed.problem(defaults[key]) is None, (name, key, defaults[key])
    assert declared > 40


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"loss.name": "softtriplet", "miner.name": "", "loss.softtriplet.n_centroids": 0},
            r"loss\.softtriplet\.n_centroids=0 must be at least 1",
        ),
        (
            {"loss.name": "histogram", "miner.name": "", "loss.histogram.num_bins": 1},
            r"loss\.histogram\.num_bins=1 must be at least 2",
        ),
        (
            {"miner.name": "rho_distance", "miner.rho_distance.push_prob": 1.5},
            r"push_prob=1\.5 must be at most 1",
        ),
        (
            {"sampler.name": "greedy_coreset", "sampler.greedy_coreset.bigbs": 0},
            r"sampler\.greedy_coreset\.bigbs=0 must be at least 1",
        ),
        ({"train.batch_size": 1}, r"train\.batch_size=1 must be at least 2"),
        ({"model.small_resnet.stage_features": (8, 0)}, r"each entry must be at least 1"),
        ({"data.std": 0.0}, r"data\.std=0\.0 must be above 0"),
        ({"exchange.dm2.temporal_rate": 0.0}, r"dm2\.temporal_rate=0\.0 must be above 0"),
        ({"exchange.dm2.temporal_rate": 1.5}, r"dm2\.temporal_rate=1\.5 must be at most 1"),
    ],
)
def test_component_and_base_ranges_are_checked(overrides, message):
    c = base_config()
    for key, value in overrides.items():
        node = c
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = value
    with pytest.raises(ConfigError, match=message):
        validate(c)


def test_apply_overrides_sets_literals_and_names_bad_items() -> None:
    from configs.revisiting import get_config
    from jdml.config import apply_overrides
    from jdml.errors import ConfigError

    c = apply_overrides(
        get_config(),
        [
            "model.small_resnet.stage_strides=(2, 2, 1)",
            "model.dtype=bfloat16",
            "optim.lr=0.5",
            "seed=3",
        ],
    )
    assert c.model.small_resnet.stage_strides == (2, 2, 1) and c.model.dtype == "bfloat16"
    assert c.optim.lr == 0.5 and c.seed == 3
    for bad in ["model.nope=1", "model.dtype", "nosection.key=1", "optim.lr=abc", "seed.x=1"]:
        with pytest.raises(ConfigError, match="cannot set"):
            apply_overrides(get_config(), [bad])


def test_a_config_json_with_a_renamed_key_resumes_under_the_new_name():
    """``cohort.data_devices`` (written before data parallelism covered every method) is read as
    ``parallel.data_devices``: evaluation sees the value, resuming sees no change."""
    from jdml.config import base_config, flatten_config, incompatible_keys, saved_config, to_json

    old = json.loads(to_json(base_config()))
    del old["parallel"]
    old["cohort"]["data_devices"] = 2
    loaded = saved_config(json.dumps(old))
    assert loaded.parallel.data_devices == 2 and "data_devices" not in loaded.cohort
    new = json.loads(to_json(base_config()))
    defaults = flatten_config(new)
    assert incompatible_keys(old, new, defaults=defaults) == []  # placement may change
    old["cohort"]["size"] = 3
    assert incompatible_keys(old, new, defaults=defaults) == ["cohort.size: 3 -> 1"]


def test_a_dm2_config_json_of_the_cohort_section_loads_and_resumes_under_exchange_dm2():
    """DM2's settings were in ``cohort``: a config.json of then is read with them under
    ``exchange.dm2``, and resuming it with the same values sees no change, with others a change
    named by the new key."""
    from jdml.config import base_config, flatten_config, incompatible_keys, saved_config, to_json

    old = json.loads(to_json(base_config()))
    del old["exchange"]
    old["cohort"].update(
        {
            "size": 3,
            "mutual_weight": 5.0,
            "warmup_epochs": 1.0,
            "relation": "rkd",
            "model_diversity": False,
            "temporal_diversity": False,
            "temporal_rate": 0.8,
            "view_diversity": False,
        }
    )
    loaded = saved_config(json.dumps(old))
    dm2 = loaded.exchange.dm2
    assert (dm2.mutual_weight, dm2.warmup_epochs, dm2.relation) == (5.0, 1.0, "rkd")
    assert (dm2.model_diversity, dm2.temporal_diversity, dm2.view_diversity) == (False,) * 3
    assert dm2.temporal_rate == 0.8 and "mutual_weight" not in loaded.cohort
    validate(loaded)
    new = json.loads(to_json(loaded))
    defaults = flatten_config(json.loads(to_json(base_config())))
    assert incompatible_keys(old, new, defaults=defaults) == []
    new["exchange"]["dm2"]["mutual_weight"] = 20.0
    assert incompatible_keys(old, new, defaults=defaults) == [
        "exchange.dm2.mutual_weight: 5.0 -> 20.0"
    ]


def test_eval_devices_is_a_non_negative_int_that_does_not_block_resuming():
    """``parallel.eval_devices`` (where evaluation runs) defaults to 1, rejects negative values,
    and changing it, or reading a config.json written before it existed, allows resuming."""
    from jdml.config import flatten_config, incompatible_keys, saved_config

    c = base_config()
    assert c.parallel.eval_devices == 1
    c.parallel.eval_devices = -1
    with pytest.raises(ConfigError, match=r"parallel\.eval_devices=-1 must be at least 0"):
        validate(c)
    c.parallel.eval_devices = 0
    validate(c)
    old = json.loads(to_json(base_config()))
    new = json.loads(to_json(base_config()))
    new["parallel"]["eval_devices"] = 4
    assert incompatible_keys(old, new) == []
    del old["parallel"]["eval_devices"]  # written by a version without the key
    assert saved_config(json.dumps(old)).parallel.eval_devices == 1
    assert incompatible_keys(old, new, defaults=flatten_config(new)) == []


def test_the_batch_norm_mode_blocks_resuming_and_the_data_devices_do_not():
    from jdml.config import incompatible_keys

    old = json.loads(to_json(base_config()))
    new = json.loads(to_json(base_config()))
    new["parallel"]["data_devices"] = 4
    assert incompatible_keys(old, new) == []
    new["parallel"]["batch_norm"] = "per_device"
    assert incompatible_keys(old, new) == ["parallel.batch_norm: 'global' -> 'per_device'"]


def _diva_on_missing_data(tmp_path, **overrides):
    """A DiVA config whose dataset file does not exist: reading the data would fail."""
    from configs.diva import get_config as diva_config
    from jdml.config import set_keys

    c = diva_config("data=npz")
    return set_keys(c, {"data.path": str(tmp_path / "missing.npz"), **overrides})


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        # A heterogeneous DM2 cohort with a stateful term (DaNCE's key queue).
        (
            {"cohort.size": 2, "cohort.members": ("", "model.embed_dim=64")},
            r"cohort.members \(a heterogeneous cohort\) with a term that keeps a state",
        ),
        # Two terms on one head with different dimensions (nothing else names the head the
        # term leaves).
        (
            {
                "aux.shared.head": "discriminative",
                "aux.shared.dim": 64,
                "decorrelation.pairs": (),
                "decorrelation.weights": (),
                "eval.heads": (),
                "eval.combinations": (),
            },
            r"aux.shared.dim=64 differs from another term's dimension for head 'discriminative'",
        ),
        # A phase naming a term the method does not have.
        (
            {"phases": (("main",), ("shard",))},
            r"phases entry \('shard',\) names unknown term\(s\) \['shard'\]; choose from",
        ),
    ],
    ids=["stateful_term_in_heterogeneous_cohort", "aux_head_dimensions", "unknown_phase"],
)
def test_method_mistakes_fail_before_the_data_is_read(tmp_path, overrides, pattern):
    """Caught by ``validate``: training refuses the config before it reads the (missing) data
    and before it creates the run directory."""
    from jdml.trainer import train_and_evaluate

    c = _diva_on_missing_data(tmp_path, **overrides)
    with pytest.raises(ConfigError, match=pattern):
        validate(c)
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match=pattern):
        train_and_evaluate(c, str(workdir))
    assert not workdir.exists()
    # The same config without the mistake gets as far as the data, which is missing.
    from jdml.errors import DataError

    with pytest.raises(DataError, match=r"missing\.npz does not exist"):
        train_and_evaluate(_diva_on_missing_data(tmp_path), str(tmp_path / "fixed"))


def test_temporal_rate_sets_each_members_update_probability():
    from jdml.cohort.exchanges.dm2 import update_probabilities

    assert update_probabilities(4, True).tolist() == [1.0, 0.5, 0.25, 0.125]  # the paper's
    assert update_probabilities(3, True, 0.8).tolist() == pytest.approx([1.0, 0.8, 0.64])
    assert update_probabilities(3, False, 0.8).tolist() == [1.0, 1.0, 1.0]


def test_an_aux_term_may_not_take_the_exchange_states_name():
    """A cohort's exchange keeps its per-member state under ``method_state["exchange"]``, so
    no term of the method may be named ``exchange``."""
    from jdml.config import metric_term

    c = base_config()
    c.aux.exchange = metric_term("triplet", "distance", head="extra", weight=1.0, dim=8)
    with pytest.raises(ConfigError, match=r"aux\.exchange: the term name 'exchange' is reserved"):
        validate(c)
