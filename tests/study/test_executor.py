"""``jdml.study.executor.Local``: several runs side by side, each on its share of the cores.

The jobs here are small Python commands that record when they ran, on which cores and with
which memory fraction, so that the scheduling is checked without training anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from jdml.study import executor as parallel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    "cores, slots, shares",
    [
        ([0, 1, 2, 3], 2, [(0, 1), (2, 3)]),
        ([0, 1, 2, 3, 4], 2, [(0, 1, 2), (3, 4)]),
        ([3, 1, 2, 0], 4, [(0,), (1,), (2,), (3,)]),
        ([0, 1], 3, [(0,), (1,), (0,)]),  # more slots than cores: shared round-robin
        ([5], 1, [(5,)]),
        (list(range(16)), 8, [(2 * i, 2 * i + 1) for i in range(8)]),
    ],
)
def test_core_shares_are_contiguous_and_even(cores, shares, slots):
    assert parallel.core_shares(cores, slots) == shares


@pytest.mark.parametrize("cores, slots", [([], 1), ([0, 1], 0)])
def test_core_shares_reject_no_cores_or_slots(cores, slots):
    with pytest.raises(ValueError, match="at least one core and one slot"):
        parallel.core_shares(cores, slots)


_PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    start = time.time()
    time.sleep(float(sys.argv[2]))
    print("probe line")
    print("last line of", sys.argv[1])
    with open(sys.argv[1], "w") as f:
        json.dump({"start": start, "end": time.time(),
                   "cores": sorted(os.sched_getaffinity(0)),
                   "fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")}, f)
    sys.exit(int(sys.argv[3]))
    """
)


def _job(tmp_path, name: str, seconds: float, code: int = 0):
    out = str(tmp_path / f"{name}.json")
    argv = (sys.executable, "-c", _PROBE, out, str(seconds), str(code))
    return parallel.Task(name, "", str(tmp_path / "logs" / f"{name}.log"), argv), out


def test_jobs_run_at_most_slots_at_a_time_on_their_own_cores(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    jobs = [_job(tmp_path, f"j{i}", 0.6, code=3 if i == 1 else 0) for i in range(4)]
    lines = []
    failed = parallel.run_all([j for j, _ in jobs], 2, poll_s=0.05, echo=lines.append)
    assert failed == ["j1"]
    runs = []
    for job, out in jobs:
        with open(out) as f:
            runs.append(json.load(f))
        with open(job.log) as f:
            assert "probe line" in f.read()  # the job's output went to its own log
    assert all(r["fraction"] == "0.450" for r in runs)  # 0.9 / 2 of the accelerator's memory
    cores = sorted(os.sched_getaffinity(0))
    shares = parallel.core_shares(cores, 2)
    assert all(tuple(r["cores"]) in shares for r in runs)
    for i, a in enumerate(runs):  # never more than 2 at once, and never two on one share
        overlapping = [b for j, b in enumerate(runs) if j != i and b["start"] < a["end"]]
        overlapping = [b for b in overlapping if a["start"] < b["end"]]
        assert len(overlapping) <= 1
        if len(cores) >= 2:
            assert all(b["cores"] != a["cores"] for b in overlapping)
    assert any(line.startswith("error: j1 exited with 3") and "j1.log" in line for line in lines)
    assert any(line.startswith("   j3:") and "last line of" in line for line in lines)
    assert sum(line.startswith("== ") for line in lines) == 4


def test_a_set_memory_fraction_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.2")
    job, out = _job(tmp_path, "only", 0.0)
    assert parallel.run_all([job], 3, poll_s=0.05, echo=lambda _: None) == []
    with open(out) as f:
        assert json.load(f)["fraction"] == "0.2"


def test_terminating_the_runner_terminates_its_jobs(tmp_path):
    """A runner killed by SIGTERM (a time limit) leaves no job running."""
    pids = tmp_path / "pids"
    pids.mkdir()
    sleeper = (
        f"import os, time; open(os.path.join({str(pids)!r}, str(os.getpid())), 'w'); "
        "time.sleep(120)"
    )
    runner = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from jdml.study.executor import Task, run_all
        argv = (sys.executable, "-c", {sleeper!r})
        jobs = [Task(f"s{{i}}", "", {str(tmp_path)!r} + f"/s{{i}}.log", argv) for i in range(3)]
        run_all(jobs, 2, poll_s=0.05)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", runner])
    deadline = time.time() + 60
    while len(os.listdir(pids)) < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert len(os.listdir(pids)) == 2  # two slots: the third job waits
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    for pid in map(int, os.listdir(pids)):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone (reaped by the runner, so not even a zombie)
    assert len(os.listdir(pids)) == 2  # the waiting job never started
