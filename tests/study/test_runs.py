"""``jdml study run`` end to end on scikit-learn's digits (``tests/study/digits_study.py``: 2
rows x 2 candidates x 2 seeds, 1 epoch): the local executor's study and its report against a
computation by hand; the driver killed with ``kill -9`` and run again; the same study on a
real Ray cluster on loopback whose second node is killed with ``kill -9`` during a run."""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from scipy import stats

from tests.helpers import REPO, make_digits_npz

pytestmark = pytest.mark.slow
STUDY = os.path.join(REPO, "tests", "study", "digits_study.py")
# Every run on one thread, wherever it runs (pinned to a core by the local executor, or a Ray
# worker's process seeing both cores): XLA's CPU reductions then add in one order, and two
# executors' records are equal to the bit.
ONE_THREAD = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": REPO, **extra}
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    return env


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> str:
    return make_digits_npz(str(tmp_path_factory.mktemp("digits") / "digits.npz"))


def _run(digits: str, directory: str, *args: str, **popen) -> subprocess.Popen:
    argv = [sys.executable, "-m", "jdml", "study", "run", f"{STUDY}:{digits}", "--dir", directory]
    return subprocess.Popen([*argv, *args], env=_env(), cwd=REPO, text=True, **popen)


@pytest.fixture(scope="module")
def undisturbed(digits, tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("local") / "study")
    process = _run(digits, directory, "--slots=2", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out
    return directory


def _records(directory: str) -> dict[str, dict]:
    """Every record of a study folder, without what differs between two runs of it (where and
    when it ran)."""
    out = {}
    for path in sorted(
        glob.glob(os.path.join(directory, "records", "**", "*.json"), recursive=True)
    ):
        with open(path) as f:
            record = json.load(f)
        for key in ("device", "commit"):
            record.pop(key, None)
        out[os.path.relpath(path, directory)] = record
    return out


def test_the_study_and_its_report_equal_a_computation_by_hand(undisturbed):
    from jdml.study.report import report

    records = _records(undisturbed)
    seeds = [f"records/{row}/seed{s}.json" for row in ("margin", "triplet") for s in (0, 1)]
    assert sorted(r for r in records if "/tune/" not in r) == seeds
    # The selection by hand: each row's 2 candidates (numbered by Optuna: a repeat of a value
    # already tried is dropped, its number skipped), the one with the best validation Recall@1
    # (ties: the earlier), and its values are what the row's seeds trained with.
    for row in ("margin", "triplet"):
        names = sorted(
            (r for r in records if r.startswith(f"records/tune/{row}/")),
            key=lambda r: int(r.rsplit("trial", 1)[1].removesuffix(".json")),
        )
        assert len(names) == 2  # the budget
        tune = [records[n] for n in names]
        assert tune[0]["settings"] != tune[1]["settings"]
        scores = [t["best"]["recall@1"] for t in tune]
        assert scores == [max(p["recall@1"] for p in t["val_curve"] if p["epoch"]) for t in tune]
        best = tune[int(np.argmax(scores))]  # argmax: the first of equal scores
        for seed in (0, 1):
            seed_record = records[f"records/{row}/seed{seed}.json"]
            assert seed_record["settings"] == best["settings"]
            assert "test" in seed_record["per_query"]  # the per-query hits are kept
            assert seed_record["data_sha256"] and seed_record["row"] == row
    # The claim by hand: triplet - margin over seeds 0 and 1, 95 % (one look).
    r1 = {row: [records[f"records/{row}/seed{s}.json"]["results"]["test"]["recall@1"]
                for s in (0, 1)] for row in ("margin", "triplet")}  # fmt: skip
    d = np.subtract(r1["triplet"], r1["margin"])
    half = stats.t.ppf(0.975, 1) * d.std(ddof=1) / math.sqrt(2)
    out = report(undisturbed)
    claim = out["data"]["claims"][0]
    assert claim["seeds"] == 2 and claim["look"] == 1
    assert claim["mean"] == pytest.approx(d.mean(), abs=1e-12)
    assert (claim["low"], claim["high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    verdict = "not resolved" if d.mean() - half <= 0 <= d.mean() + half else "resolved"
    assert (claim["verdict"] == "not resolved") == (verdict == "not resolved")
    assert claim["bootstrap"] is not None  # from the kept hits
    page = out["markdown"]
    assert f"{100 * d.mean():+.2f} [{100 * (d.mean() - half):+.2f}" in page
    assert "jdml study run" in page and "--slots=2" in page
    rows = {r["name"]: r for r in out["data"]["rows"]}
    assert rows["margin"]["tried"] == 2 and rows["triplet"]["tried"] == 2  # the same budget
    # The claim against the fixed baseline: each seed of margin against the pixels' one value,
    # evaluated once into baselines.json.
    with open(os.path.join(undisturbed, "baselines.json")) as f:
        pixels = json.load(f)["fixed"]["pixels"]["recall@1"]
    d = np.array(r1["margin"]) - pixels
    fixed = out["data"]["claims"][1]
    assert fixed["mean"] == pytest.approx(d.mean(), abs=1e-12) and fixed["holm"] is None
    assert fixed["compared"].endswith("- raw pixels")
    with open(os.path.join(undisturbed, "ledger.jsonl")) as f:
        events = [json.loads(line)["event"] for line in f]
    assert events == ["selected", "selected", "registered", *["tested"] * 4, "look"]


def _alive(directory: str) -> list[int]:
    """The pids of processes whose command line names a task of ``directory``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if os.path.join(directory, "tasks").encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_driver_killed_and_run_again_trains_no_run_twice(digits, undisturbed, tmp_path):
    directory = str(tmp_path / "study")
    process = _run(digits, directory, "--slots=2", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in process.stdout:  # killed as the seed runs start, the tuning recorded
        lines.append(line)
        if line.startswith("== margin seed 1"):
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=60)
    deadline = time.time() + 30
    while _alive(directory) and time.time() < deadline:
        time.sleep(0.2)
    assert _alive(directory) == []  # the runs died with their driver
    before = set(_records(directory))
    assert {r for r in before if "/tune/" in r} == {
        r for r in _records(undisturbed) if "/tune/" in r
    }
    process = _run(digits, directory, "--slots=2", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out
    started = [line.split(" (log")[0].removeprefix("== ") for line in out.splitlines()
               if line.startswith("== ")]  # fmt: skip
    for record in before:  # nothing recorded before the kill trained again
        name = record.removeprefix("records/").removesuffix(".json")
        assert not any(s.replace(" ", "/").endswith(name.replace("tune/", "")) for s in started)
    assert not any(s.startswith("tune ") for s in started)
    assert _records(directory) == _records(undisturbed)  # as if nothing had happened
    with open(os.path.join(directory, "ledger.jsonl")) as f:
        events = [json.loads(line) for line in f]
    decisions = [e["event"] for e in events if e["event"] != "tested"]
    assert decisions == ["selected", "selected", "registered", "look"]  # each decision once
    tested = [(e["row"], e["seed"]) for e in events if e["event"] == "tested"]
    assert sorted(tested) == sorted(set(tested)) and len(tested) == 4  # each result once
    import optuna

    from jdml.study import search

    for row in ("margin", "triplet"):  # no candidate asked twice
        s = optuna.load_study(study_name=row, storage=search.storage(directory))
        assert [t.state.name for t in s.trials if t.state.name != "PRUNED"] == ["COMPLETE"] * 2


@contextlib.contextmanager
def _loopback(**head: Any) -> Iterator[tuple[Any, Any]]:
    """A Ray cluster of one head node (``head``: its resources) on 127.0.0.1, without usage
    statistics, so that nothing leaves the machine (Ray reads the first variable at import:
    without it a node's address is the host's); yields ``(ray, cluster)`` and shuts both down."""
    loopback = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    saved = {k: os.environ.get(k) for k in (*loopback, *ONE_THREAD, "PYTHONPATH")}
    os.environ.update({**loopback, **ONE_THREAD, "PYTHONPATH": REPO})
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**head, "include_dashboard": False})
    try:
        yield ray, cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


PROBE = """import json, os, time
begin = time.time()
time.sleep(4)
env = os.environ.get
print(json.dumps({"gpu": env("CUDA_VISIBLE_DEVICES"), "begin": begin,
                  "fraction": env("XLA_PYTHON_CLIENT_MEM_FRACTION"), "end": time.time()}))
"""


def test_ray_runs_share_one_gpu_by_their_fractions(tmp_path):
    """``--gpus-per-run 0.25`` on a node that declares one GPU (Ray schedules by the declared
    count, so no GPU is needed to test it): four runs at once on GPU 0, each given a quarter of
    its memory; the fifth starts when one of them ends."""
    from jdml.study.executor import RayTasks, Task, drive

    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    with _loopback(num_cpus=4, num_gpus=1) as (_, cluster):
        executor = RayTasks(cluster.address, slots=5, cpus=0.5, gpus=0.25)
        tasks = iter(Task(f"probe {k}", "", str(tmp_path / f"probe{k}.log"),
                          (sys.executable, str(probe))) for k in range(5))  # fmt: skip
        assert drive(executor, lambda: next(tasks, None), echo=lambda line: None) == []
        executor.close()
    runs = []
    for k in range(5):
        with open(tmp_path / f"probe{k}.log") as f:
            runs.append(json.loads(f.read().strip().splitlines()[-1]))
    assert {r["gpu"] for r in runs} == {"0"} and {r["fraction"] for r in runs} == {"0.225"}
    runs.sort(key=lambda r: r["begin"])
    first_end = min(r["end"] for r in runs[:4])
    assert max(r["begin"] for r in runs[:4]) < first_end  # four at once
    assert runs[4]["begin"] >= first_end - 0.5  # the fifth waited for a quarter to free


def test_the_study_on_a_ray_cluster_survives_a_node_killed_mid_run(digits, undisturbed, tmp_path):
    from jdml.study import executor as ex
    from jdml.study import runner, spec

    with _loopback(num_cpus=1) as (ray, cluster):
        second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        assert cluster.address.startswith("127.0.0.1:")
        directory = str(tmp_path / "study")
        executor = ex.RayTasks(cluster.address, slots=2, cpus=1)
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        study = spec.load(f"{STUDY}:{digits}")
        lines: list[str] = []
        failure: list[BaseException] = []

        def drive():
            try:
                runner.run(study, directory, executor, echo=lines.append)
            except BaseException as e:
                failure.append(e)

        driver = threading.Thread(target=drive)
        driver.start()
        victim = _run_on_node(directory, second.node_id, deadline=time.time() + 300)
        cluster.remove_node(second, allow_graceful=False)  # kill -9 of the node's processes
        driver.join(timeout=900)
        assert not driver.is_alive() and not failure, (failure, lines)
        with open(victim) as f:
            log = f.read()
        assert log.count("ray: node") == 2  # retried elsewhere ...
        assert "Resuming from the checkpoint" in log  # ... from the killed run's checkpoint
        _assert_equal_but_deep_ranks(_records(directory), _records(undisturbed))
        executor.close()


def _assert_equal_but_deep_ranks(found: dict, expected: dict) -> None:
    """The records are equal, but for MAP@R to 1e-4: its ranks reach a class's size (here
    about 180 neighbours), where distances tie within float32's rounding, and XLA orders those
    by the cores a run sees (one pinned core in a local slot, the host's two in a Ray
    worker; a local run of one slot on both cores equals the Ray run to the bit)."""
    assert found.keys() == expected.keys()
    for name, record in found.items():
        want = expected[name]
        for values, wanted in _map_at_r(record, want):
            assert values == pytest.approx(wanted, rel=1e-4), name
        assert _without_map_at_r(record) == _without_map_at_r(want), name


def _map_at_r(a: dict, b: dict):
    pairs = [
        (p.get("map@r"), q.get("map@r"))
        for p, q in zip(a["val_curve"], b["val_curve"], strict=True)
    ]
    if "results" in a:
        pairs.append((a["results"]["test"]["map@r"], b["results"]["test"]["map@r"]))
    return pairs


def _without_map_at_r(record: dict) -> dict:
    out = json.loads(json.dumps(record))
    for point in out["val_curve"]:
        point.pop("map@r", None)
    if "results" in out:
        out["results"]["test"].pop("map@r")
    return out


def _run_on_node(directory: str, node: str, deadline: float) -> str:
    """The log of a run on ``node`` once it has saved a checkpoint (so that its retry resumes
    from one)."""
    while time.time() < deadline:
        for log in glob.glob(os.path.join(directory, "logs", "*.log")):
            with open(log) as f:
                if f"ray: node {node}" not in f.read():
                    continue
            task = os.path.join(directory, "tasks", os.path.basename(log)[:-4] + ".json")
            with open(task) as f:
                workdir = json.load(f)["workdir"]
            if glob.glob(os.path.join(workdir, "checkpoints", "[0-9]*", "commit_success.txt")):
                return log
        time.sleep(0.1)
    raise AssertionError(f"no run of {directory} reached a checkpoint on node {node}")
