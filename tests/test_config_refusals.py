"""Config values and command arguments that a run would not use or cannot read: each ends in
one ``error:`` line naming the value and a fix that works, exit status 2, and nothing written.

In the style of ``tests/test_user_errors.py`` (whose helpers and tiny run these reuse): the
commands run as subprocesses, as a user types them.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from tests import test_user_errors as user_errors
from tests.test_user_errors import assert_refused, cub_args, run, train_args, unchanged_after

# The module fixtures of tests/test_user_errors.py: its tiny npz, its finished tiny run and its
# tiny CUB-layout folder (built once for this module too).
npz = user_errors.npz
finished = user_errors.finished
cub_tree = user_errors.cub_tree

# ------------------------------------------------------------------ config files and arguments


@pytest.mark.slow
@pytest.mark.parametrize(
    ("returned", "said"),
    [("{'seed': 1}", "returned a dict"), ("None", "returned None (is its return statement")],
)
@pytest.mark.parametrize("override", [False, True])
def test_a_get_config_that_returns_no_configdict_is_one_line(
    tmp_path: Path, returned: str, said: str, override: bool
) -> None:
    """``get_config()`` returning a dict (was a 23-line ``AttributeError``) or None (was
    blamed on "invalid command-line flags"), with or without a ``--config.*`` flag."""
    path = tmp_path / "my_config.py"
    path.write_text(f"def get_config(arg=''):\n    return {returned}\n")
    flags = ["--config.seed=2"] if override else []
    proc = run("train.py", "--config", str(path), *flags, "--workdir", str(tmp_path / "w"))
    assert proc.returncode == 2
    line = assert_refused(proc, f"config file {path}: get_config() {said}", "ConfigDict")
    assert proc.stderr.strip() == line  # nothing else: no ml_collections warning
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_a_folder_as_a_search_query_is_named(finished: Path, npz: str, tmp_path: Path) -> None:
    """``jdml search INDEX <folder>`` (was "fix or delete the file"): the folder is named, with
    a command that searches its images."""
    index = tmp_path / "index.npz"
    assert run("-m", "jdml", "embed", str(finished), npz, "--out", str(index)).returncode == 0
    queries = tmp_path / "queries"
    queries.mkdir()
    proc = unchanged_after(finished, "-m", "jdml", "search", str(index), str(queries))
    assert proc.returncode == 2
    assert_refused(proc, f"query {queries} is a folder, not an image file", f"{queries}/*.jpg")


@pytest.mark.slow  # reads a trained run (a training process)
def test_report_out_on_a_file_is_named(finished: Path, tmp_path: Path) -> None:
    """``jdml report RUN --out <existing file>`` (was "File exists"): named as ``jdml look``
    names it; the file is kept."""
    out = tmp_path / "report.txt"
    out.write_text("mine")
    proc = unchanged_after(finished, "-m", "jdml", "report", str(finished), "--out", str(out))
    assert proc.returncode == 2
    assert_refused(proc, f"--out) {out}: {out} is a file, not a folder; choose another path")
    assert out.read_text() == "mine"


@pytest.mark.slow
def test_a_partial_benchmark_names_the_flag_that_uses_it(cub_tree: Path, tmp_path: Path) -> None:
    """A partial copy names ``--config.data.verify_counts=False``, which then trains."""
    workdir = tmp_path / "w"
    args = [a for a in cub_args(cub_tree, workdir) if "verify_counts" not in a]
    proc = run(*args)
    line = assert_refused(proc, "is the copy partial? set --config.data.verify_counts=False")
    assert not workdir.exists()
    flag = line.split("set ", 1)[1].split()[0]
    assert run(*args, flag).returncode == 0


# --------------------------------------------------------------------------- resuming a run


@pytest.mark.slow
def test_a_config_of_another_version_names_the_keys_to_remove(
    npz: str, finished: Path, tmp_path: Path
) -> None:
    """A stored ``config.json`` with a key this version does not read is refused on resume;
    the message names the key to remove (its suggested command alone was refused: "is not a
    jdml config key"), and once it is removed, the command as printed resumes the run."""
    copy = Path(shutil.copytree(finished, tmp_path / "run"))
    stored = copy / "config.json"
    saved = json.loads(stored.read_text())
    saved["data"]["legacy_option"] = 1
    stored.write_text(json.dumps(saved, indent=2))
    proc = unchanged_after(copy, *train_args(npz, copy))
    line = assert_refused(proc, "different config", f"remove data.legacy_option from {stored}")
    del saved["data"]["legacy_option"]  # as the message says
    stored.write_text(json.dumps(saved, indent=2))
    command = shlex.split(line.split("then: ", 1)[1])
    assert command[:2] == ["python", "train.py"]
    proc = run(*command[1:])
    assert proc.returncode == 0, proc.stderr + line
    assert "results:" in proc.stdout


# --------------------------------------------------------------------------- parameter names


@pytest.mark.slow
def test_a_no_decay_name_of_no_parameter_names_the_nearest(npz: str, tmp_path: Path) -> None:
    """``optim.no_decay=('1d','stem_bm')`` (a misspelt ``stem_bn``) used to train with the
    name matching nothing; it stops before the workdir exists, naming the nearest parameter
    names and a flag that trains."""
    workdir = tmp_path / "w"
    proc = run(*train_args(npz, workdir, "--config.optim.no_decay=('1d','stem_bm')"))
    assert proc.returncode == 2
    line = assert_refused(proc, "optim.no_decay has 'stem_bm'", "nearest parameter names: stem_bn")
    assert not workdir.exists()
    flag = line.split("Use e.g. ", 1)[1]
    assert flag == "--config.optim.no_decay=('1d','stem_bn')"
    assert run(*train_args(npz, workdir, flag)).returncode == 0


def test_a_misspelt_cls_token_is_named_on_a_vit(npz: str) -> None:
    """The issue's ``optim.no_decay=('1d','cls_tokn')`` on a ViT (whose ``cls_token`` kept its
    weight decay): refused, naming ``cls_token``; the right names and the frozen patch
    embedding pass."""
    from jdml.config import set_keys
    from jdml.errors import ConfigError
    from jdml.run import Run
    from tests.helpers import tiny_config

    vit = {"model.backbone": "vit", "model.vit.patch": 8, "model.vit.dim": 24}
    c = tiny_config(npz, **vit, **{"model.vit.depth": 1, "model.vit.heads": 2})
    set_keys(c, {"optim.no_decay": ("1d", "cls_tokn"), "model.frozen_stages": 0})
    with pytest.raises(ConfigError, match=r"nearest parameter names: cls_token\. Use e\.g\. "):
        Run(c).check_parameter_names()
    set_keys(c, {"optim.no_decay": ("1d", "cls_token", "pos_embed")})
    Run(c).check_parameter_names()


# ------------------------------------------------------------------------ keys a run does not use


@pytest.mark.parametrize(
    ("flag", "fragments"),
    [
        (
            "--config.model.vit.attention=cudnn",
            ["model.vit.attention='cudnn' is set, but this run does not use it", "'small_resnet'"],
        ),
        (
            "--config.exchange.dm2.mutual_weight=5",
            ["exchange.dm2.mutual_weight=5.0 is set", "a single model (cohort.size=1)"],
        ),
        (
            "--config.data.tfds_name=mnist",
            ["data.tfds_name='mnist' is set", "data.name in (tfds)", "'npz'"],
        ),
    ],
)
@pytest.mark.slow
def test_a_key_the_run_does_not_use_is_refused(
    npz: str, tmp_path: Path, flag: str, fragments: list[str]
) -> None:
    """A backbone's key on another backbone (``model.vit.attention=cudnn`` on the CNN), an
    exchange's on a single model, a dataset loader's on another dataset: each used to train
    without a word; refused before the workdir exists (the rule of ``jdml.config.usage``)."""
    workdir = tmp_path / "w"
    proc = run(*train_args(npz, workdir, flag))
    assert proc.returncode == 2
    line = assert_refused(proc, *fragments, "Set it back to its default (--config.")
    assert not workdir.exists()
    if "mutual_weight" in flag:  # the fix it names trains
        fix = line.split("default (", 1)[1].split(")", 1)[0]
        assert fix == "--config.exchange.dm2.mutual_weight=20.0"
        assert run(*train_args(npz, workdir, flag, fix, "--config.train.epochs=1")).returncode == 0


def test_the_presets_set_no_key_their_run_does_not_use() -> None:
    """Every method config with every data preset, DM2 as one model and as a cohort, and the
    recipes: no key set away from its default that the run does not use."""
    import importlib

    from jdml.config.usage import unused_keys

    specs = [(m, f"data={d}") for m in ("revisiting", "diva", "sharing") for d in PRESET_DATA]
    specs += [("dm2", f"size={s},data={d}") for s in (1, 4) for d in PRESET_DATA]
    specs += [("dm2", "size=1,method=diva"), ("dm2", "size=1,diversity=independent")]
    specs += [("recipes", f"data={d}") for d in ("cub200", "sop")]
    for module, arg in specs:
        c = importlib.import_module(f"configs.{module}").get_config(arg)
        assert not list(unused_keys(c)), (module, arg)


PRESET_DATA = ("glyphs", "emoji", "npz", "cub200", "cars196", "sop", "inshop")
