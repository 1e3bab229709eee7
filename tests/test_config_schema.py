"""One schema for every config source: every key the library reads has a check, and the command
line, a Python config file and a JSON config are refused alike, before any data is read.

The enumeration tests walk every key of the schema (the base config's and each auxiliary term
kind's, as DiVA's preset holds them) and set a wrong value: another type, a non-finite or
hugely negative number, an unknown name. Each must be refused with a ``ConfigError`` naming
the key, so a key added without a check fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import ml_collections
import pytest

from configs.diva import get_config as diva_config
from jdml.config import base_config, saved_config, to_json, validate
from jdml.config.schema import SECTION, schema_leaves
from jdml.errors import ConfigError
from tests.helpers import REPO

#: String keys that hold free text: paths (checked when read, with one line naming them), a TFDS
#: dataset's own names, and the names a user gives the heads (checked against each other:
#: eval.heads and decorrelation.pairs must name existing heads).
FREE_TEXT = frozenset(
    {
        "model.head",
        "aux.intra.head",
        "aux.selfsimilarity.head",
        "aux.shared.head",
        "data.cache_dir",
        "data.path",
        "data.tfds_image_key",
        "data.tfds_label_key",
        "data.tfds_name",
        "data.tfds_splits",
    }
)


def config() -> ml_collections.ConfigDict:
    """DiVA's preset: the base schema and a metric and a DaNCE term."""
    return diva_config("data=npz")


def set_key(c: ml_collections.ConfigDict, key: str, value) -> ml_collections.ConfigDict:
    *path, last = key.split(".")
    section = c
    for part in path:
        section = section[part]
    with section.ignore_type():
        section[last] = value
    return c


def refusal(key: str, value) -> str | None:
    """None if ``validate`` refuses ``key=value`` naming the key, else what happened."""
    try:
        validate(set_key(config(), key, value))
    except ConfigError as e:
        return None if key in str(e) else f"refused without naming it: {e}"
    except Exception as e:  # anything but a ConfigError is a failure here
        return f"{type(e).__name__}: {e}"
    return "accepted"


def plain(value):
    return value.get() if isinstance(value, ml_collections.FieldReference) else value


def other_type(value):
    """A value of another type than the default ``value`` (None where any type is allowed)."""
    if isinstance(value, ml_collections.FieldReference) and value.get_type() is object:
        return None
    value = plain(value)
    for kind, wrong in ((bool, "yes"), (int, "3"), (float, "3"), (str, 3), (tuple, 5)):
        if isinstance(value, kind):
            return wrong
    return None


LEAVES = schema_leaves(config())


def test_the_schema_holds_every_preset_key_and_each_term_kind():
    assert len(LEAVES) > 300
    assert {k.split(".")[2] for k in LEAVES if k.startswith("aux.")} >= {"kind", "loss", "momentum"}
    for key, value in LEAVES.items():
        assert (
            value is SECTION
            or other_type(value) is not None
            or plain(value) is None
            or (isinstance(value, ml_collections.FieldReference))
        ), key


def test_every_key_refuses_a_value_of_another_type():
    failures = {}
    for key, value in LEAVES.items():
        wrong = other_type(value)
        if wrong is not None:
            problem = refusal(key, wrong)
            if problem:
                failures[key] = problem
    assert not failures, failures


def test_every_number_refuses_a_non_finite_or_out_of_range_value():
    failures = {}
    numbers = {k: plain(v) for k, v in LEAVES.items()}
    numbers = {
        k: v for k, v in numbers.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    assert len(numbers) > 150
    for key, value in numbers.items():
        wrong = -(10**9) if isinstance(value, int) else float("nan")
        problem = refusal(key, wrong)
        if problem:
            failures[key] = problem
    assert not failures, failures


def test_every_name_refuses_an_unknown_choice():
    failures = {}
    for key, value in LEAVES.items():
        value = plain(value)
        names = isinstance(value, str) or (
            isinstance(value, tuple) and value and isinstance(value[0], str)
        )
        if not names or key in FREE_TEXT:
            continue
        wrong = "no-such-choice" if isinstance(value, str) else ("no-such-choice",)
        problem = refusal(key, wrong)
        if problem:
            failures[key] = problem
    assert not failures, failures
    for key in FREE_TEXT:
        assert refusal(key, 3) is None  # free text is still text


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["train"].update(epoch=1), r"train\.epoch is not.*mean train\.epochs\?"),
        (lambda d: d.update(trian={"epochs": 1}), r"trian\.epochs .*did you mean train\.epochs\?"),
        (lambda d: d["train"].update(epochs=[1]), r"train\.epochs must be an integer"),
        (lambda d: d["optim"].update(lr="0.1"), r"optim\.lr must be a number"),
        (lambda d: d.update(train="x"), r"train must be a section of keys"),
        (lambda d: d["model"].update(dtype="bf16"), r"model\.dtype='bf16'; choose one of: float32"),
        (lambda d: d["eval"].update(distance="cosin"), r"eval\.distance='cosin'; choose one of"),
    ],
)  # fmt: skip
def test_a_json_config_is_checked_as_the_command_line_is(tmp_path, edit, message):
    """``train.py --config <run>/config.json`` refuses what ``--config.<key>`` refuses, before
    the workdir exists."""
    saved = json.loads(to_json(base_config()))
    edit(saved)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=message):
        validate(saved_config(path.read_text(), keep_unknown=True))
    workdir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "train.py", "--config", str(path), "--workdir", str(workdir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and not workdir.exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr


def test_a_stored_config_with_keys_of_another_version_still_evaluates():
    """For evaluation and inference a run's config.json loses the keys this version does not
    read; training from it refuses them."""
    saved = json.loads(to_json(base_config()))
    saved["train"]["retired_key"] = 1
    text = json.dumps(saved)
    validate(saved_config(text))
    with pytest.raises(ConfigError, match=r"train\.retired_key is not a jdml config key"):
        validate(saved_config(text, keep_unknown=True))
