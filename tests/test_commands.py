"""``jdml train`` and ``jdml eval`` from the installed package, run from a folder that holds no
``configs/`` (the method configs are found by name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY_FLAGS, make_npz


def _jdml(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env_path = {"PYTHONPATH": str(REPO)}  # as installed: importable from any folder
    return subprocess.run(
        [sys.executable, "-m", "jdml", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env_path},
    )


@pytest.mark.smoke
@pytest.mark.slow  # a training process (the quick part keeps test_trainer.py::test_eval_cli)
def test_jdml_train_then_eval_from_any_folder(tmp_path: Path) -> None:
    npz = make_npz(str(tmp_path / "tiny.npz"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workdir = tmp_path / "run"
    config = ["--config", "revisiting:data=npz", f"--config.data.path={npz}", *TINY_FLAGS]
    trained = _jdml("train", *config, "--workdir", str(workdir), cwd=elsewhere)
    assert trained.returncode == 0, trained.stderr
    assert f"results: {workdir}/results.json" in trained.stdout
    summary = json.loads((workdir / "results.json").read_text())
    assert "recall@1" in summary["best"]["test"]

    evaluated = _jdml("eval", "--workdir", str(workdir), cwd=elsewhere)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "recall@1" in evaluated.stdout and "results: " in evaluated.stdout
    step = summary["best"]["step"]
    written = json.loads(next(workdir.glob(f"eval_best_step{step}.json")).read_text())
    assert written["results"]["test"]["recall@1"] == summary["best"]["test"]["recall@1"]

    wrong = _jdml("train", "--config", "revisitin", "--workdir", str(workdir), cwd=elsewhere)
    assert wrong.returncode != 0
    assert wrong.stderr.strip().splitlines()[-1].startswith("error: config file revisitin ")
    elsewhere_config = str(elsewhere / "mine" / "revisiting.py")  # not the packaged one
    mine = _jdml("train", "--config", elsewhere_config, "--workdir", str(workdir), cwd=elsewhere)
    assert mine.returncode != 0
    assert f"error: config file {elsewhere_config} does not exist" in mine.stderr
