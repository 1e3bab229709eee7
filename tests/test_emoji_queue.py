"""experiments/emoji_queue.sh: which calls each lane makes, in which order (a stand-in Python
records the calls instead of training)."""

from __future__ import annotations

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
    "lane, expected", [(None, OTHER + DM2), ("all", OTHER + DM2), ("other", OTHER), ("dm2", DM2)]
)
def test_each_lane_trains_its_tables_then_their_look_2(tmp_path, lane, expected):
    rc, calls, err = _calls(tmp_path, lane)
    assert rc == 0, err
    assert calls == expected


def test_the_dm2_lane_keeps_its_cohort_settings(tmp_path):
    _calls(tmp_path, "dm2")
    for call in (tmp_path / "calls").read_text().splitlines():
        if "emoji_protocol" in call:
            assert "--frozen-stages 3 --cohort 3" in call


def test_an_unknown_lane_is_one_error_line(tmp_path):
    rc, calls, err = _calls(tmp_path, "dm3")
    assert rc == 2 and calls == []
    assert err.strip() == "error: LANE=dm3: use all, other or dm2"
