"""Mistakes a user makes, typed as a user would: each ends in one ``error:`` line naming the problem
and the fix, a non-zero exit, and every file already in the run directory byte-identical.

The commands run as subprocesses of ``train.py``, ``eval.py`` and ``python -m jdml`` on a tiny
npz dataset; a finished tiny run (module fixture) is the workdir most cases are tried on.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jdml.config import set_keys
from tests.helpers import REPO, TINY_FLAGS, make_npz, tree_digest

TIMEOUT = 300


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This environment (with the session's compilation cache, tests/conftest.py) and ``env``."""
    return {**os.environ, **(env or {})}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs ``python <args>`` in the repository, as a user would type it."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=child_env(env),
    )


def start(*args: str, stdout: int = subprocess.PIPE) -> subprocess.Popen:
    """Starts ``python <args>`` in the repository (text output, stderr piped), not waiting."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env=child_env(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def train_args(npz: str, workdir: str | Path, *extra: str) -> list[str]:
    return [
        "train.py",
        "--config",
        "configs/revisiting.py:data=npz",
        f"--config.data.path={npz}",
        *TINY_FLAGS,
        *extra,
        "--workdir",
        str(workdir),
    ]


def assert_refused(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """A refusal: non-zero exit, no traceback, exactly one ``error:`` line holding
    ``fragments``; returns that line."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") or ": error: " in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def npz(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


@pytest.fixture(scope="module")
def finished(npz: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run (2 epochs of 3 steps)."""
    workdir = tmp_path_factory.mktemp("runs") / "done"
    proc = run(*train_args(npz, workdir))
    assert proc.returncode == 0, proc.stderr
    return workdir


def unchanged_after(workdir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    before = tree_digest(workdir)
    proc = run(*args, **kwargs)
    assert tree_digest(workdir) == before, "the command changed files of the run directory"
    return proc


# ----------------------------------------------------------------- 1. two processes, one workdir

HOLD_LOCK = """
import sys, time
from jdml.workdir import run_lock
with run_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_second_process_on_a_locked_workdir_is_refused(
    npz: str, finished: Path, tmp_path: Path
) -> None:
    finished = Path(shutil.copytree(finished, tmp_path / "run"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(finished)],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree_digest(finished)
        proc = run(*train_args(npz, finished))
        line = assert_refused(proc, "in use by another training process", f"pid {holder.pid}")
        assert "started" in line and f"kill {holder.pid}" in line
        assert tree_digest(finished) == before
    finally:
        holder.kill()
        holder.wait()
    # The holder died without releasing anything: the lock is stale, and the run goes on.
    proc = run(*train_args(npz, finished, "--config.train.epochs=3"))
    assert proc.returncode == 0, proc.stderr
    assert "ended without releasing it" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_two_train_processes_leave_one_consistent_run(npz: str, tmp_path: Path) -> None:
    workdir = tmp_path / "race"
    slow = ["--config.train.epochs=40", "--config.eval.every_epochs=20"]
    first = start(*train_args(npz, workdir, *slow), stdout=subprocess.DEVNULL)
    try:
        lock = workdir / ".jdml.lock"
        deadline = time.time() + TIMEOUT
        while not (lock.exists() and lock.read_text()):
            assert first.poll() is None, first.stderr.read()
            assert time.time() < deadline
            time.sleep(0.2)
        assert json.loads(lock.read_text())["pid"] == first.pid
        second = run(*train_args(npz, workdir, *slow))
        assert_refused(second, f"pid {first.pid}")
    finally:
        first.kill()
        first.wait()
    finished = run(*train_args(npz, workdir, *slow))  # takes over the killed run's lock
    assert finished.returncode == 0, finished.stderr
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["kind"], r["step"], r.get("split"), r.get("embedding")) for r in records]
    assert len(keys) == len(set(keys)), "metrics.jsonl holds a record twice"
    assert [k[1] for k in keys] == sorted(k[1] for k in keys)


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0.0, pytest.param(2.0, marks=pytest.mark.slow)])
def test_two_trainings_started_together_on_a_new_workdir_train_once(
    npz: str, tmp_path: Path, offset: float
) -> None:
    """Two ``train.py`` on a workdir that does not exist yet, the second ``offset`` seconds
    after the first (no waiting for a lock file): exactly one trains, the other is refused in
    one line, and every record is written once."""
    workdir = tmp_path / "new" / "run"
    _assert_one_trains(_started_together(train_args(npz, workdir), (0.0, offset)), workdir)


def _started_together(
    args: list[str], delays: Sequence[float]
) -> list[subprocess.CompletedProcess]:
    """``python <args>`` started once per delay (each that many seconds after the one before),
    all at work at once; their results when all have ended."""
    procs = []
    for delay in delays:
        time.sleep(delay)
        procs.append(start(*args))
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=TIMEOUT)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _assert_one_trains(done: list[subprocess.CompletedProcess], workdir: Path) -> None:
    """Exactly one of ``done`` trained; each other one is refused in the one line of a workdir
    in use; every record of ``workdir`` is written once, and one TensorBoard file at most."""
    trained = [proc for proc in done if proc.returncode == 0]
    assert len(trained) == 1, [proc.stderr[-2000:] for proc in done]
    for refused in [proc for proc in done if proc.returncode != 0]:
        assert_refused(refused, "in use by another training process")
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["kind"], r["step"], r.get("split"), r.get("embedding")) for r in records]
    assert len(keys) == len(set(keys)), "metrics.jsonl holds a record twice"
    boards = list(workdir.rglob("events.out.tfevents.*"))
    assert len(boards) <= 1, boards


@pytest.mark.slow
def test_fifteen_trainings_started_together_on_a_new_workdir_train_once(
    npz: str, tmp_path: Path
) -> None:
    """Fifteen ``train.py`` started at once on a workdir that does not exist yet (a one-epoch
    run): one trains, the fourteen others are refused in one line, every record written once."""
    workdir = tmp_path / "new" / "run"
    args = train_args(npz, workdir, "--config.train.epochs=1")
    done = _started_together(args, [0.0] * 15)
    _assert_one_trains(done, workdir)
    assert sum(proc.returncode == 2 for proc in done) == 14


# ----------------------------------------------------------------- 3. the fixes we print work


@pytest.mark.slow
def test_the_stored_config_resumes_its_run(npz: str, finished: Path) -> None:
    """The refusal of a changed config suggests ``--config <workdir>/config.json``."""
    proc = unchanged_after(finished, *train_args(npz, finished, "--config.loss.name=triplet"))
    line = assert_refused(proc, "different config", "loss.name: 'margin' -> 'triplet'")
    # The next line of the message is the command it suggests: run it.
    suggested = f"--config {finished}/config.json --workdir {finished}"
    assert line.endswith(suggested)
    proc = run("train.py", "--config", f"{finished}/config.json", "--workdir", str(finished))
    assert proc.returncode == 0, proc.stderr + line
    assert "results:" in proc.stdout


def _suggestions() -> set[str]:
    """Every ``--config.<key>`` and ``<section>.<key>=`` the program's messages suggest."""
    import ast
    import re

    sections = "data|model|train|eval|optim|loss|miner|sampler|cohort|decorrelation"
    pattern = re.compile(rf"(?:--config\.|\b)((?:{sections})\.[a-z_0-9.]*[a-z_0-9])\s*=")
    found = set()
    roots = [Path(REPO, "jdml"), Path(REPO, "configs")]
    files = [p for root in roots for p in root.rglob("*.py")]
    files += [Path(REPO, "train.py"), Path(REPO, "eval.py")]
    for file in files:
        tree = ast.parse(file.read_text())
        docstrings = {  # they may show a misspelt key on purpose; messages are what is checked
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if text and id(node) not in docstrings:
                found.update(pattern.findall(node.value))
    return found


def test_every_suggested_config_key_exists() -> None:
    from configs.diva import get_config

    keys = _suggestions()
    assert "data.skip_unreadable" in keys and "data.channels" in keys  # the scan finds them
    config = get_config()  # the base schema plus DiVA's auxiliary terms
    unknown = []
    for key in sorted(keys):
        node = config
        for part in key.split("."):
            if not hasattr(node, "keys") or part not in node:
                unknown.append(key)
                break
            node = node[part]
    assert not unknown, f"messages suggest keys the config does not have: {unknown}"


@pytest.mark.slow
def test_unreadable_image_hint_is_a_working_flag(tmp_path: Path) -> None:
    from PIL import Image

    root = tmp_path / "imgs"
    for c in range(4):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(6):
            Image.fromarray(np.full((8, 8), 40 * c + i, np.uint8)).save(root / f"c{c}/{i}.png")
    (root / "c0" / "broken.png").write_bytes(b"not a png")
    args = [
        "train.py",
        "--config",
        "configs/revisiting.py:data=folder",
        f"--config.data.path={root}",
        *[f for f in TINY_FLAGS if "data.path" not in f],
        "--config.train.batch_size=4",
        "--config.train.epochs=1",
    ]
    line = assert_refused(run(*args, "--workdir", str(tmp_path / "w")), "broken.png")
    assert "--config.data.skip_unreadable=True" in line
    assert not (tmp_path / "w").exists()
    proc = run(*args, "--config.data.skip_unreadable=True", "--workdir", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr
    assert "skipping" in proc.stderr and "broken.png" in proc.stderr


# ----------------------------------------------------------------- 4. a failed start, corrected


@pytest.mark.slow
def test_failed_starts_write_nothing_and_the_corrected_command_runs(
    npz: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "fresh"
    missing = str(tmp_path / "nowhere.npz")
    for extra, fragment in (
        ([f"--config.data.path={missing}"], "nowhere.npz does not exist"),
        (["--config.data.image_size=7"], "data.image_size=7 must be at least 8"),
        (["--config.model.embed_dim=0"], "model.embed_dim=0 must be at least 1"),
    ):
        assert_refused(run(*train_args(npz, workdir, *extra)), fragment)
        assert not workdir.exists()
    # A run stopped before its first checkpoint trained nothing: a changed config takes over.
    from jdml.config import to_json
    from tests.helpers import tiny_config

    workdir.mkdir()
    (workdir / "config.json").write_text(to_json(tiny_config(npz, **{"loss.name": "triplet"})))
    proc = run(*train_args(npz, workdir, "--config.train.epochs=1"))
    assert proc.returncode == 0, proc.stderr
    assert '"name": "margin"' in (workdir / "config.json").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "fragment"),
    [
        ("--config.parallel.data_devices=3", "parallel.data_devices=3, but this run has"),
        pytest.param(  # the same check as data_devices (jdml.checks)
            "--config.parallel.eval_devices=5",
            "parallel.eval_devices=5, but this run has",
            marks=pytest.mark.slow,
        ),
        ("--config.profile_steps=100:200", "starts after the run's last step"),
    ],
)
def test_device_counts_and_profile_ranges_fail_first_and_their_fix_works(
    npz: str, tmp_path: Path, flag: str, fragment: str
) -> None:
    """On one device: checked before anything is written (no workdir is left), and the flag
    the message suggests runs (the profile range then writes a trace)."""
    import re

    # The device counts on one device; the profile range on the session's devices, whose
    # programs the compilation cache already holds.
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"} if "devices" in flag else {}
    workdir = tmp_path / "w"
    line = assert_refused(run(*train_args(npz, workdir, flag), env=env), fragment)
    assert not workdir.exists()
    fix = re.search(r"--config\.[a-z_.]+=[0-9:]+", line).group(0)
    proc = run(*train_args(npz, workdir, fix), env=env)
    assert proc.returncode == 0, proc.stderr + line
    if "profile_steps" in fix:
        assert [p for p in (workdir / "profile").rglob("*") if p.is_file()], line


@pytest.mark.slow
def test_a_profile_range_before_the_resume_step_names_one_that_traces(
    npz: str, finished: Path, tmp_path: Path
) -> None:
    """The finished tiny run has 6 steps; extended to 3 epochs it resumes at step 6. A range
    that ends before step 6 (1:6, the range suggested for a new run) is refused with one that
    starts there, and that one writes a trace; on the finished run no step is left to trace."""
    import re

    copy = Path(shutil.copytree(finished, tmp_path / "run"))
    line = assert_refused(
        unchanged_after(copy, *train_args(npz, copy, "--config.profile_steps=1:6")),
        "this run has trained all its 6 steps",
        "--config.train.epochs",
    )
    more = "--config.train.epochs=3"
    line = assert_refused(
        unchanged_after(copy, *train_args(npz, copy, more, "--config.profile_steps=1:6")),
        "ends before step 6, where this run resumes",
    )
    fix = re.search(r"--config\.profile_steps=[0-9:]+", line).group(0)
    assert fix == "--config.profile_steps=6:8", line
    proc = run(*train_args(npz, copy, more, fix))
    assert proc.returncode == 0, proc.stderr
    assert [p for p in (copy / "profile").rglob("*") if p.is_file()], line


@pytest.mark.slow
def test_a_damaged_config_json_names_a_fix_that_works(
    npz: str, finished: Path, tmp_path: Path
) -> None:
    """A truncated config.json: eval.py and train.py refuse it naming the fix, and the fix
    (the training command with --replace_unreadable_config) restores a run eval.py reads."""
    copy = Path(shutil.copytree(finished, tmp_path / "run"))
    text = (copy / "config.json").read_text()
    (copy / "config.json").write_text(text[: len(text) // 2])
    for args in (["eval.py", "--workdir", str(copy)], train_args(npz, copy)):
        proc = unchanged_after(copy, *args)
        assert_refused(proc, "config.json is unreadable", "--replace_unreadable_config")
    # A config that does not fit the checkpoints is refused before config.json is written.
    wrong = train_args(npz, copy, "--replace_unreadable_config", "--config.model.embed_dim=24")
    assert_refused(unchanged_after(copy, *wrong), "this config does not fit the run's checkpoints")
    proc = run(*train_args(npz, copy, "--replace_unreadable_config"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((copy / "config.json").read_text()) == json.loads(text)
    assert run("eval.py", "--workdir", str(copy)).returncode == 0


@pytest.mark.slow
def test_a_concatenation_on_a_one_head_run_names_its_head(finished: Path, tmp_path: Path) -> None:
    import re

    out = str(tmp_path / "model.jaxexp")
    args = ["-m", "jdml", "export", str(finished), "--out", out]
    proc = unchanged_after(finished, *args, "--embedding", "concat:1,2")
    line = assert_refused(proc, "nothing to concatenate")
    head = re.search(r"use --embedding (\S+)", line).group(1)
    assert run(*args, "--embedding", head).returncode == 0


def test_a_file_as_the_cache_folder_is_named(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "hostname"
    not_a_folder.write_text("host")
    proc = run("-m", "jdml", "data", "fetch", "emoji", "--cache-dir", str(not_a_folder))
    assert_refused(proc, f"{not_a_folder} is a file, not a folder", "choose another path")
    assert not_a_folder.read_text() == "host"


@pytest.mark.parametrize(
    ("config", "flag", "fragment"),
    [
        (
            "configs/diva.py",
            "--config.aux.selfsimilarity.queue_batchs=3",
            "did you mean --config.aux.selfsimilarity.queue_batches",
        ),
        (
            "configs/sharing.py",
            "--config.decorrelation.wieghts=(1.0,)",
            "did you mean --config.decorrelation.weights",
        ),
        (
            "configs/dm2.py",
            "--config.exchange.dm2.temporal_diversty=True",
            "did you mean --config.exchange.dm2.temporal_diversity",
        ),
        (  # a key of an earlier version, now in DM2's exchange section
            "configs/dm2.py",
            "--config.cohort.mutual_weight=5.0",
            "--config.cohort.mutual_weight is now --config.exchange.dm2.mutual_weight",
        ),
        ("configs/dm2.py:sze=3", "", "unknown config argument(s) ['sze']; use size="),
        ("configs/dm2.py", "--config.cohort.size=-2", "cohort.size=-2 must be at least 1"),
    ],
)
def test_method_configs_with_bad_keys(
    config: str, flag: str, fragment: str, tmp_path: Path
) -> None:
    """DiVA, Sharing Matters and DM2 configs with a misspelt key, argument or value: one line
    naming the key that exists, and no workdir."""
    workdir = tmp_path / "w"
    args = ["train.py", "--config", config, *([flag] if flag else []), "--workdir", str(workdir)]
    assert_refused(run(*args), fragment)
    assert not workdir.exists()


# ----------------------------------------------------------------- 5. numbers out of range


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("train.epochs=-1", "train.epochs=-1 must be at least 1"),
        ("sampler.samples_per_class=0", "sampler.samples_per_class=0 must be at least 1"),
        ("model.embed_dim=0", "model.embed_dim=0 must be at least 1"),
        ("data.image_size=7", "data.image_size=7 must be at least 8"),
        # (model.small_resnet.stem_strides, not a tuple key of the tiny flags: a tuple flag
        # given twice accumulates its values)
        ("model.small_resnet.stem_strides=4", "--config.data.image_size=24 or more"),
        ("optim.lr=nan", "optim.lr=nan must be finite"),
        ("optim.lr=-0.1", "optim.lr=-0.1 must be above 0"),
        ("loss.margin.beta=inf", "loss.margin.beta=inf must be finite"),
        ("eval.batch_size=0", "eval.batch_size=0 must be at least 1"),
        ("loss.margin.margin=-0.2", "loss.margin.margin=-0.2 must be at least 0"),
        ("miner.distance.lower_cutoff=-1.0", "miner.distance.lower_cutoff=-1.0 must be at least 0"),
    ],
)
@pytest.mark.slow
def test_out_of_range_numbers_leave_a_finished_run_intact(
    npz: str, finished: Path, override: str, fragment: str
) -> None:
    proc = unchanged_after(finished, *train_args(npz, finished, f"--config.{override}"))
    assert_refused(proc, fragment, f"--config.{override.split('=')[0]}")


@pytest.mark.slow
def test_fewer_epochs_than_trained_are_refused(npz: str, finished: Path) -> None:
    proc = unchanged_after(finished, *train_args(npz, finished, "--config.train.epochs=1"))
    assert_refused(proc, "has trained 6 steps (2 epochs)", "--config.train.epochs")


# ----------------------------------------------------------------- 6. read-only and full workdirs


@contextlib.contextmanager
def read_only(folder: Path):
    """Makes ``folder`` and everything in it unwritable, even for root (immutable attribute)."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-R", "+i", str(folder)], check=True)
    else:
        subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
    try:
        with pytest.raises(OSError):
            (folder / "probe").write_text("x")
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-R", "-i", str(folder)], check=True)
        else:
            subprocess.run(["chmod", "-R", "u+w", str(folder)], check=True)


@pytest.mark.slow
def test_read_only_workdir(npz: str, finished: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ro"
    shutil.copytree(finished, copy)
    with read_only(copy):
        for args, fragment in (
            (train_args(npz, copy, "--config.train.epochs=3"), "workdir"),
            (["eval.py", "--workdir", str(copy)], "workdir"),
            (["-m", "jdml", "look", str(copy)], "output folder"),
        ):
            proc = unchanged_after(copy, *args)
            assert_refused(proc, fragment, str(copy), "permission denied", "another")


@contextlib.contextmanager
def full_disk(tmp_path: Path, payload: Path):
    """A copy of ``payload`` on a filesystem with no space left (a small tmpfs when this user
    may mount one; otherwise a file-size limit of 0 set in the child processes)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
        ).returncode
        == 0
    )
    try:
        copy = mount / "run"
        shutil.copytree(payload, copy)
        if mounted:
            with contextlib.suppress(OSError), open(mount / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        yield copy, mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=True)


def _no_file_growth() -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


@pytest.mark.slow
def test_full_disk(npz: str, finished: Path, tmp_path: Path) -> None:
    with full_disk(tmp_path, finished) as (copy, mounted):
        for args in (
            train_args(npz, copy, "--config.train.epochs=3"),
            ["eval.py", "--workdir", str(copy)],
            ["-m", "jdml", "look", str(copy)],
        ):
            before = tree_digest(copy)
            if mounted:
                proc = run(*args)
            else:
                proc = subprocess.run(
                    [sys.executable, *args],
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT,
                    env=child_env(),
                    preexec_fn=_no_file_growth,
                )
            assert tree_digest(copy) == before
            assert_refused(proc, str(copy), "space" if mounted else "cannot write")


FILL_AT_SAVE = """
import os, runpy, sys

import jdml.checkpoint as ckpt

save, calls = ckpt.Checkpoints.save, []


def patched_save(self, state, meta, *, best=False):
    calls.append(best)
    if len(calls) == int(os.environ["FILL_AT"]):  # the disk fills up just before this save
        # Unbuffered: a buffered file keeps the bytes the full disk refused and raises again
        # when it is closed, outside the try (how much is left over depends on the log's
        # length, so a buffered filler failed now and then).
        with open(os.environ["FILLER"], "wb", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(65536))
            except OSError:
                pass
    save(self, state, meta, best=best)


ckpt.Checkpoints.save = patched_save
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_save(npz: str, finished: Path, tmp_path: Path) -> None:
    """The disk fills up during a run, just before its third checkpoint save: one ``error:``
    line naming the checkpoint, the cause and the fix, exit 2, the partial save removed and
    the earlier checkpoints intact; freeing the space and running again resumes the run to the
    metrics of an uninterrupted one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)]).returncode:
        pytest.skip("mounting a small filesystem needs root (the CI machine is)")
    try:
        workdir, filler = mount / "run", mount / "filler"
        script = tmp_path / "fill.py"
        script.write_text(FILL_AT_SAVE)
        env = {"FILL_AT": "3", "FILLER": str(filler)}
        proc = run(str(script), *train_args(npz, workdir)[1:], env=env)
        line = assert_refused(proc, "cannot save checkpoint step", "no space left on device")
        assert proc.returncode == 2 and "Free some space" in line and "resumes" in line
        assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr
        assert not [p for p in workdir.rglob("*") if "orbax-checkpoint-tmp" in p.name]
        filler.unlink()
        resumed = run(*train_args(npz, workdir))
        assert resumed.returncode == 0, resumed.stderr
        assert "Resuming from the checkpoint" in resumed.stdout + resumed.stderr
        assert _metrics(workdir) == _metrics(finished)
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow
def test_eval_prints_its_results_before_writing_them(finished: Path, tmp_path: Path) -> None:
    """If the results cannot be written after the work, they are still shown."""
    copy = tmp_path / "late"
    shutil.copytree(finished, copy)
    script = tmp_path / "eval_then_fail.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import errno, runpy, sys
            import jdml.evaluate_checkpoint as ev
            def refuse(workdir, out):
                raise OSError(errno.ENOSPC, "No space left on device", f"{{workdir}}/eval.json")
            ev.save_evaluation = refuse
            sys.argv = ["eval.py", "--workdir", {str(copy)!r}]
            runpy.run_path({os.path.join(REPO, "eval.py")!r}, run_name="__main__")
            """
        )
    )
    proc = unchanged_after(copy, str(script))
    assert_refused(proc, "no space left", "eval.json")
    assert "recall@1" in proc.stdout
    assert "computed with: platform cpu, conv " in proc.stdout  # jdml.backends.Backends


# ----------------------------------------------------------------- 7. tracebacks for mistakes


@pytest.mark.slow
def test_unknown_checkpoint_name(finished: Path) -> None:
    proc = unchanged_after(finished, "eval.py", "--workdir", str(finished), "--checkpoint", "bestt")
    assert_refused(proc, "unknown checkpoint 'bestt'", "best, latest or a step number")


@pytest.mark.slow
def test_a_deleted_best_checkpoint_is_named_not_replaced(finished: Path, tmp_path: Path) -> None:
    """With ``best/`` gone, ``eval.py`` (and the model commands, whose default is best) say so
    and name the checkpoints that exist, instead of evaluating the latest one as "best"."""
    copy = Path(shutil.copytree(finished, tmp_path / "run"))
    shutil.rmtree(copy / "best")
    latest = sorted(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
    for args in (
        ["eval.py", "--workdir", str(copy)],
        ["-m", "jdml", "export", str(copy), "--out", str(tmp_path / "model.jaxexp")],
    ):
        proc = unchanged_after(copy, *args)
        assert_refused(proc, "no best checkpoint", f"steps {latest}", "--checkpoint latest")
    proc = run("eval.py", "--workdir", str(copy), "--checkpoint", "latest")
    assert proc.returncode == 0, proc.stderr
    assert f"latest (step {latest[-1]})" in proc.stdout + proc.stderr


def _damage(checkpoint: Path) -> None:
    """Overwrites every file of a checkpoint's state with bytes of the same size."""
    for path in (checkpoint / "state").rglob("*"):
        if path.is_file():
            path.write_bytes(b"\x5a" * max(1, path.stat().st_size))


@pytest.mark.slow
def test_a_damaged_checkpoint_is_one_line(npz: str, finished: Path, tmp_path: Path) -> None:
    """A damaged best checkpoint under ``eval.py`` and a damaged latest one when training
    resumes: one ``error:`` line with a short cause, naming the other checkpoints and the fix
    (no storage-layer dump on the console; training writes it to train.log)."""
    copy = Path(shutil.copytree(finished, tmp_path / "run"))
    (best,) = [p for p in (copy / "best").iterdir() if p.name.isdigit()]
    _damage(best)
    proc = unchanged_after(copy, "eval.py", "--workdir", str(copy))
    line = assert_refused(proc, f"cannot restore checkpoint step {best.name}", "damaged")
    assert len(line) < 700 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(images / "a.png")
    for args in (
        ["-m", "jdml", "embed", str(copy), str(images), "--out", str(tmp_path / "e.npz")],
        ["-m", "jdml", "export", str(copy), "--out", str(tmp_path / "m.jaxexp")],
    ):  # the storage layer's dump and its threads' late errors stay off the terminal
        proc = unchanged_after(copy, *args)
        line = assert_refused(proc, f"cannot read checkpoint step {best.name}", "damaged")
        assert len(line) < 700 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    steps = sorted(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
    _damage(copy / "checkpoints" / str(steps[-1]))
    proc = run(*train_args(npz, copy, "--config.train.epochs=3"))
    line = assert_refused(proc, f"cannot restore checkpoint step {steps[-1]}", "out of the way")
    assert len(line) < 700 and len(proc.stderr.strip().splitlines()) <= 3, proc.stderr
    assert "failed:" in (copy / "train.log").read_text()  # the whole cause, in the log


@pytest.mark.slow  # reads a trained run (a training process)
@pytest.mark.parametrize("k", ["0", "-3"])
def test_search_needs_a_positive_k(finished: Path, npz: str, tmp_path: Path, k: str) -> None:
    index = tmp_path / "index.npz"
    assert run("-m", "jdml", "embed", str(finished), npz, "--out", str(index)).returncode == 0
    proc = unchanged_after(finished, "-m", "jdml", "search", str(index), npz, "-k", k)
    assert_refused(proc, "argument -k", "must be at least 1")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding what an output path must never replace: a folder, a named pipe (as a
    device would be) and a symbolic link to a file that is not the program's."""
    folder = tmp_path_factory.mktemp("outputs")
    (folder / "sub").mkdir()
    os.mkfifo(folder / "pipe")
    (folder / "outside.txt").write_text("not ours")
    (folder / "link").symlink_to(folder / "outside.txt")
    return folder


OUTPUTS = {
    "sub": "is a folder, not a file: give the file to write, e.g. ",
    "pipe": "is a named pipe, not a regular file",
    "link": "is a symbolic link",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "target"), [("export", "sub"), ("embed", "pipe"), ("search", "link")]
)
def test_outputs_replace_only_regular_files(
    command: str, target: str, finished: Path, npz: str, outputs: Path, tmp_path: Path
) -> None:
    """``jdml export --out`` on a folder, ``jdml embed --out`` on a pipe (as a device would be)
    and ``jdml search --json`` on a link: one line naming it, before the model loads, and
    nothing changed (every kind under every writer: tests/test_fileio.py)."""
    out = str(outputs / target)
    args = {
        "export": ["export", str(finished), "--out", out],
        "embed": ["embed", str(finished), npz, "--out", out],
        "search": ["search", str(tmp_path / "index.npz"), npz, "--json", out],
    }[command]
    before = tree_digest(outputs)
    proc = unchanged_after(finished, "-m", "jdml", *args)
    assert_refused(proc, f"{out} {OUTPUTS[target]}")
    assert tree_digest(outputs) == before


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def test_unsafe_weight_file_is_refused_in_one_line(npz: str, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pth"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": _Payload(marker)}, protocol=2))
    args = train_args(
        npz,
        tmp_path / "w",
        "--config.model.backbone=efficientnet_lite0",
        f"--config.model.pretrained={evil}",
        "--config.data.channels=3",
        "--config.data.image_size=32",
    )
    line = assert_refused(run(*args), str(evil), f"{os.system.__module__}.system")
    assert "safetensors" in line
    assert not marker.exists() and not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("configs/revisiting.py:loss=foo", "unknown loss 'foo'; choose one of: angular"),
        ("configs/revisiting.py:data=foo", "unknown data preset 'foo'; choose one of: glyphs"),
        ("configs/nowhere.py", "config file configs/nowhere.py does not exist"),
    ],
)
def test_config_argument_errors_are_one_line(spec: str, fragment: str, tmp_path: Path) -> None:
    proc = run("train.py", "--config", spec, "--workdir", str(tmp_path / "w"))
    assert_refused(proc, fragment)


# --------------------------------------------------------------- 8. a miner for a loss without one


def test_miner_for_a_loss_that_mines_its_own_pairs(npz: str, tmp_path: Path) -> None:
    args = train_args(npz, tmp_path / "w", "--config.loss.name=softmax")  # miner stays distance
    assert_refused(run(*args), "loss.name=softmax", "--config.miner.name=''")
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------- 10. a class of one test image


@pytest.mark.slow
def test_single_image_test_class_is_named(tmp_path: Path) -> None:
    path = make_npz(str(tmp_path / "lone.npz"))
    with np.load(path) as f:
        images, labels = f["images"], f["labels"]
    keep = (labels != 11) | (np.arange(len(labels)) == np.flatnonzero(labels == 11)[0])
    np.savez(
        path,
        images=images[keep],
        labels=labels[keep],
        class_names=np.array([f"shape{c}" for c in range(12)]),
    )
    proc = run(*train_args(path, tmp_path / "w", "--config.train.epochs=1"))
    assert proc.returncode == 0, proc.stderr
    assert "test split has 1 class(es) with a single image ('shape11')" in proc.stdout


# ----------------------------------------------------------------- 11. gray data, RGB weights


def test_grayscale_data_with_rgb_pretrained_backbone(npz: str, tmp_path: Path) -> None:
    args = train_args(
        npz,
        tmp_path / "w",
        "--config.model.backbone=efficientnet_lite0",
        "--config.model.pretrained=packaged",
        "--config.data.image_size=32",
    )
    assert_refused(run(*args), "take RGB images", "--config.data.channels=3")
    assert not (tmp_path / "w").exists()
    # The fix it names is accepted, and repeats the gray channel.
    from configs.revisiting import get_config
    from jdml.config import validate
    from jdml.data.loading import load_splits

    config = get_config("data=npz")
    set_keys(
        config,
        {
            "data.path": npz,
            "data.channels": 3,
            "data.image_size": 32,
            "model.backbone": "efficientnet_lite0",
            "model.pretrained": "packaged",
        },
    )
    validate(config)
    train = load_splits(config.data)["train"]
    rgb = train.eval_images(np.arange(4))
    assert rgb.shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(rgb[..., 0], rgb[..., 2])


# ----------------------------------------------------------- 11b. damaged or quantised weights

VIT_WEIGHTS = Path(REPO, "tests", "golden", "backbones", "vit")
TINY_VIT = [
    "--config.model.backbone=vit",
    "--config.model.vit.patch=8",
    "--config.model.vit.dim=24",
    "--config.model.vit.depth=2",
    "--config.model.vit.heads=2",
    "--config.data.channels=3",
    "--config.data.image_size=32",
]  # the shape of the golden ViT files (tools/make_vit_golden.py)


def _damaged_vit_file(tmp_path: Path, case: str) -> Path:
    """The golden ViT weights with one kind of damage, in the format of ``case``'s suffix."""
    from jdml.models.pretrained.torch_io import load_weights
    from tests.models.test_backbones import write_safetensors

    state = load_weights(VIT_WEIGHTS / "plain.safetensors")
    path = tmp_path / case
    if case == "pos_embed_inf.pth":  # the storage of pos_embed (1, 17, 24), all inf
        with zipfile.ZipFile(VIT_WEIGHTS / "plain.pth") as src, zipfile.ZipFile(path, "w") as out:
            for info in src.infolist():
                data = src.read(info)
                if info.filename == "plain/data/1":
                    data = np.full(len(data) // 4, np.inf, np.float32).tobytes()
                out.writestr(info, data)
        return path
    fc1 = state["blocks.0.mlp.fc1.weight"]
    if case == "nan.safetensors":  # one NaN in a block's weight, the class token NaN
        state["blocks.0.mlp.fc1.weight"] = np.where(
            np.arange(fc1.size).reshape(fc1.shape) == 7, np.nan, fc1
        )
        state["cls_token"] = np.full_like(state["cls_token"], np.nan)
    else:  # int8.safetensors: a quantised tensor
        state["blocks.0.mlp.fc1.weight"] = np.round(fc1 * 100).astype(np.int8)
    write_safetensors(str(path), state)
    return path


NAN_FC1 = "blocks.0.mlp.fc1.weight (for params/blocks_0/mlp_fc1/kernel) holds 1 NaN"
NAN_CLS = "cls_token (for params/cls_token) holds 24 NaN or inf value(s) of 24"
INT8 = "blocks.0.mlp.fc1.weight (for params/blocks_0/mlp_fc1/kernel) holds int8 values"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "fragments"),
    [
        ("nan.safetensors", ["2 tensor(s) are not finite float weights", NAN_FC1, NAN_CLS]),
        ("pos_embed_inf.pth", ["pos_embed (for params/pos_embed) holds 408 NaN or inf value(s)"]),
        ("int8.safetensors", [INT8, "where the model holds floats"]),
    ],
)
def test_damaged_or_quantised_weights_are_refused_before_the_workdir(
    npz: str, tmp_path: Path, case: str, fragments: list[str]
) -> None:
    """ViT weights holding NaN or inf, or integers, are refused when the file is read, naming
    each tensor, before a fresh workdir is made (not 45 lines later in the kNN)."""
    weights = _damaged_vit_file(tmp_path, case)
    args = [
        "train.py", "--config", "configs/revisiting.py:data=npz", f"--config.data.path={npz}",
        "--config.data.val_fraction=0.0", "--config.train.batch_size=16", *TINY_VIT,
        f"--config.model.pretrained={weights}",
        "--workdir", str(tmp_path / "w"),
    ]  # fmt: skip
    assert_refused(run(*args), str(weights), *fragments, "give the original float weights")
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------- 9. a kill at any moment

KILLER = """
import os, runpy, signal, sys

point, nth = os.environ["KILL_AT"].split(":")
nth = int(nth)
calls = []


def die():  # SIGKILL, or the signal KILL_SIGNAL names (SIGINT, SIGTERM: the run stops in one line)
    os.kill(os.getpid(), getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL")))


def count(tag):
    calls.append(tag)
    return calls.count(tag) == nth


import jdml.checkpoint as ckpt
import jdml.metric_writer as mw

save, write = ckpt.Checkpoints.save, mw.MetricWriter.write


def patched_save(self, state, meta, *, best=False):
    if point == "before_save" and count("save"):
        die()  # e.g. after the untrained evaluation, before the first checkpoint
    if point == "after_best" and not best and calls[-1:] == ["best"]:
        die()  # the best checkpoint is on disk, the latest of the same step is not
    if best:
        calls.append("best")
    save(self, state, meta, best=best)
    if point == "after_save" and count("saved"):
        die()


def patched_write(self, record):
    if point == "mid_line" and record.get("kind") == "train" and count("train"):
        with open(self.path, "a") as f:
            f.write('{"kind": "train", "step": ')  # half a line
            f.flush()
        die()
    write(self, record)


ckpt.Checkpoints.save, mw.MetricWriter.write = patched_save, patched_write

if point == "commit":  # inside orbax: the files are written, the rename that commits them is not
    from orbax.checkpoint._src.path import async_path

    rename = async_path.rename

    async def patched_rename(src, dst):
        if "tmp" in str(src) and count("commit"):
            die()
        return await rename(src, dst)

    async_path.rename = patched_rename

if point == "weights":  # inside the weight file's reader, its nth tensor read, the file open
    import jdml.models.pretrained.torch_io as torch_io

    from_bytes = torch_io.from_bytes

    def patched_from_bytes(*args, **kwargs):
        if count("tensor"):
            die()
        return from_bytes(*args, **kwargs)

    torch_io.from_bytes = patched_from_bytes

sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def _metrics(workdir: Path) -> str:
    """``metrics.jsonl``, the whole file, with each ``img_s`` (images per second: a rate of the
    wall clock, which no two runs share) masked: everything else is compared byte for byte."""
    import re

    text = (workdir / "metrics.jsonl").read_text()
    return re.sub(r'"img_s": [-+.0-9eE]+|"img_s": "(nan|inf)"', '"img_s": _', text)


@pytest.mark.slow
def test_a_cohort_killed_mid_save_resumes_to_the_uninterrupted_metrics(
    npz: str, tmp_path: Path
) -> None:
    """A DM2 cohort of two members killed inside orbax while its second checkpoint commits
    (the files written, the rename not): run again, it ends with the metrics of an
    uninterrupted cohort run."""
    cohort = ["--config.cohort.size=2", "--config.exchange.dm2.warmup_epochs=0"]
    whole = tmp_path / "whole"
    assert run(*train_args(npz, whole, *cohort)).returncode == 0
    workdir = tmp_path / "killed"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    killed = run(str(script), *train_args(npz, workdir, *cohort)[1:], env={"KILL_AT": "commit:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # the kill happened
    assert [p for p in workdir.rglob("*") if "orbax-checkpoint-tmp" in p.name]  # mid-save
    resumed = run(*train_args(npz, workdir, *cohort))
    assert resumed.returncode == 0, resumed.stderr
    assert _metrics(workdir) == _metrics(whole)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at",
    [
        "before_save:1",
        "mid_line:2",
        pytest.param("commit:2", marks=pytest.mark.smoke),  # a checkpoint half committed
        "after_best:1",
        "after_save:3",
    ],
)
def test_killed_run_resumes_to_the_uninterrupted_metrics(
    npz: str, finished: Path, tmp_path: Path, kill_at: str
) -> None:
    workdir = tmp_path / "killed"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    killed = run(str(script), *train_args(npz, workdir)[1:], env={"KILL_AT": kill_at})
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # the kill happened
    resumed = run(*train_args(npz, workdir))
    assert resumed.returncode == 0, resumed.stderr
    assert _metrics(workdir) == _metrics(finished)
    results = json.loads((workdir / "results.json").read_text())
    expected = json.loads((finished / "results.json").read_text())
    for summary in (results, expected):
        # The resumed process compiles once if it trains; after the last save it trains no
        # step, and no results.json of the killed process gives it a count to keep.
        summary.pop("train_step_compiles")
    assert results == expected


# A log point every epoch (3 steps), a checkpoint every step: a stop after a checkpoint falls
# between two log points, with steps trained that the next ``"kind": "train"`` record averages.
BETWEEN_LOGS = ["--config.train.log_every_steps=3", "--config.train.checkpoint_every_steps=1"]


@pytest.fixture(scope="module")
def finished_between_logs(npz: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("runs") / "between-logs"
    proc = run(*train_args(npz, workdir, *BETWEEN_LOGS))
    assert proc.returncode == 0, proc.stderr
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_stop_between_log_points_resumes_to_the_uninterrupted_metrics(
    npz: str, finished_between_logs: Path, tmp_path: Path, signame: str
) -> None:
    """A run stopped just after its checkpoint of step 5, the step-4 and step-5 metrics not yet
    logged (the step-6 record averages steps 4-6): resumed with the printed command (SIGINT,
    SIGTERM) or the same command (SIGKILL), its ``metrics.jsonl`` is the uninterrupted run's,
    whole file, but for the wall-clock ``img_s`` (the checkpoint carries the unlogged steps'
    metrics; the step-6 record used to average steps 6 alone)."""
    import shlex

    workdir = tmp_path / "stopped"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    args = train_args(npz, workdir, *BETWEEN_LOGS)
    # The sixth save (1, 2, 3, best 3, 4, 5): latest 5, steps 4-5 not yet logged.
    env = {"KILL_AT": "after_save:6", "KILL_SIGNAL": signame}
    stopped = run(str(script), *args[1:], env=env)
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [4, 5]
    signum = getattr(signal, signame)
    command = args
    if signum == signal.SIGKILL:
        assert stopped.returncode == -signum, stopped.stderr
    else:
        assert stopped.returncode == 128 + signum, stopped.stderr
        line = assert_refused(stopped, "stopped by", "its newest checkpoint is step 5")
        command = shlex.split(line.split("Resume with the same command: ", 1)[1])[1:]
    resumed = run(*command)
    assert resumed.returncode == 0, resumed.stderr
    assert _metrics(workdir) == _metrics(finished_between_logs)


def _stopped_and_resumed(
    args: list[str], env: dict[str, str], signame: str, *fragments: str
) -> subprocess.CompletedProcess:
    """``args`` (a ``train.py`` command) run under ``KILLER`` with ``env``, stopped by
    ``signame`` (SIGINT or SIGTERM) in one line holding ``fragments``, exit 128 + the signal;
    then the command that line prints, run as printed: its result."""
    import shlex
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "killer.py"
        script.write_text(KILLER)
        stopped = run(str(script), *args[1:], env={**env, "KILL_SIGNAL": signame})
    assert stopped.returncode == 128 + getattr(signal, signame), stopped.stderr
    line = assert_refused(stopped, "stopped by", *fragments)
    command = shlex.split(line.split("Resume with the same command: ", 1)[1])
    assert command[:2] == ["python", "train.py"] and command[2:] == args[1:]
    return run(*command[1:])


# The tiny ViT with timm's weights of its shape (tools/make_vit_golden.py).
VIT = [*TINY_VIT, f"--config.model.pretrained={VIT_WEIGHTS / 'plain.safetensors'}"]


def vit_args(npz: str, workdir: Path) -> list[str]:
    """``train.py`` on the tiny npz with the tiny pretrained ViT (the small ResNet's keys out)."""
    small_resnet = "--config.model.small_resnet."
    return [a for a in train_args(npz, workdir, *VIT) if not a.startswith(small_resnet)]


@pytest.fixture(scope="module")
def finished_vit(npz: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("runs") / "vit"
    proc = run(*vit_args(npz, workdir))
    assert proc.returncode == 0, proc.stderr
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_stop_while_vit_weights_load_resumes_to_the_uninterrupted_run(
    npz: str, finished_vit: Path, tmp_path: Path, signame: str
) -> None:
    """SIGINT or SIGTERM while the ViT's weight file is read (the signal sent from inside the
    reader, at its fifth tensor): one line, exit 130 or 143; the printed command trains the run
    to the uninterrupted one's records and results."""
    workdir = tmp_path / "vit"
    env = {"KILL_AT": "weights:5"}
    resumed = _stopped_and_resumed(
        vit_args(npz, workdir), env, signame, "no checkpoint was saved yet"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert _metrics(workdir) == _metrics(finished_vit)
    results = json.loads((workdir / "results.json").read_text())
    assert results == json.loads((finished_vit / "results.json").read_text())


def device_view_args(cub: Path, workdir: Path, cache: Path) -> list[str]:
    """Two epochs of two steps with the training views made on the device (the decode cache
    gives the photos' sizes); a log point per epoch, a checkpoint per step."""
    return cub_args(
        cub,
        workdir,
        "--config.data.views=device",
        "--config.data.decode_cache=True",
        f"--config.data.cache_dir={cache}",
        "--config.train.epochs=2",
        "--config.train.log_every_steps=2",
        "--config.train.checkpoint_every_steps=1",
    )


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_stop_during_device_view_training_resumes_to_the_uninterrupted_run(
    cub_tree: Path, tmp_path: Path, signame: str
) -> None:
    """SIGINT or SIGTERM during device-view training, just after the checkpoint of step 3
    (the saves: 1, 2, best 2, 3; step 3 not yet logged): one line, exit 130 or 143; the printed
    command resumes to the uninterrupted run's records and results."""
    cache = tmp_path / "cache"
    whole = tmp_path / "whole"
    assert run(*device_view_args(cub_tree, whole, cache)).returncode == 0
    workdir = tmp_path / "stopped"
    args = device_view_args(cub_tree, workdir, cache)
    env = {"KILL_AT": "after_save:4"}
    resumed = _stopped_and_resumed(args, env, signame, "its newest checkpoint is step 3")
    assert resumed.returncode == 0, resumed.stderr
    assert _metrics(workdir) == _metrics(whole)
    results = json.loads((workdir / "results.json").read_text())
    expected = json.loads((whole / "results.json").read_text())
    assert results == expected


# ------------------------------------------------------------------ sizes that do not fit memory


@pytest.mark.slow  # reads a trained run (a training process)
def test_sizes_that_do_not_fit_the_memory_are_one_line(npz: str, finished: Path) -> None:
    """An embedding of 10^10 dimensions (640 GB of weights) fails to allocate: one line naming
    the keys that set the sizes, no traceback (JAX's exit hooks do not repeat it), no workdir,
    and a finished run given the same size is left as it was."""
    huge = "--config.model.embed_dim=10000000000"
    new = finished.parent / "too-big" / "nested"
    proc = run(*train_args(npz, new, huge))
    assert_refused(proc, "out of memory", "model.embed_dim", "train.batch_size")
    assert proc.returncode == 2 and not new.parent.exists()


# ------------------------------------------------------------- config files and names, up front


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        ("def get_config():\n    raise KeyError('boom')\n", ("(line 2): KeyError: 'boom'",)),
        ("def get_config(:\n", ("does not parse: line 1",)),
        ("X = 1\n", ("defines no get_config()", "configs/revisiting.py")),
    ],
)  # fmt: skip
def test_a_config_file_that_fails_is_one_line(tmp_path: Path, body: str, fragments) -> None:
    path = tmp_path / "my_config.py"
    path.write_text(body)
    workdir = tmp_path / "w"
    proc = run("train.py", "--config", str(path), "--workdir", str(workdir))
    line = assert_refused(proc, *fragments)
    assert proc.returncode == 2 and str(path) in line and not workdir.exists()


def test_a_workdir_name_that_is_not_utf8_is_refused_first(npz: str, tmp_path: Path) -> None:
    workdir = os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xffname")
    proc = run(*train_args(npz, workdir))
    assert_refused(proc, "bad\\xffname holds bytes that are not UTF-8")
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_samples_per_class_beyond_the_batch_names_sizes_that_work(npz: str, tmp_path: Path) -> None:
    """The message names values of samples_per_class that fit the batch, and one of them
    trains (it used to suggest a batch of 1,000,000, refused next)."""
    import re

    workdir = tmp_path / "w"
    line = assert_refused(
        run(*train_args(npz, workdir, "--config.sampler.samples_per_class=1000000")),
        "fewer than two classes in a batch of train.batch_size=16",
    )
    assert not workdir.exists()
    value = re.search(r"choose one of ([0-9, ]+)", line).group(1).split(", ")[-1]
    proc = run(*train_args(npz, workdir, f"--config.sampler.samples_per_class={value}"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_a_nan_stop_names_a_command_that_runs(npz: str, tmp_path: Path) -> None:
    """A learning rate that overflows the weights stops the run with one line; the command it
    names (the stored config, a tenth of the learning rate, a new workdir) is accepted and
    trains with that rate (the old message's advice, another seed or rate in the same workdir,
    was refused as a different config)."""
    import shlex

    workdir = tmp_path / "nan"
    line = assert_refused(
        run(*train_args(npz, workdir, "--config.optim.lr=1e+38")), "NaN/inf", "python train.py"
    )
    command = shlex.split(line.split("in a new workdir (this one keeps its config): ", 1)[1])
    assert command[:2] == ["python", "train.py"] and "--config.optim.lr=1e+37" in command
    proc = run(*command[1:])
    assert "different config" not in proc.stderr and "unknown config key" not in proc.stderr
    fresh = Path(command[command.index("--workdir") + 1])
    assert json.loads((fresh / "config.json").read_text())["optim"]["lr"] == 1e37


def test_embeddings_that_are_not_finite_are_counted_not_an_index_error() -> None:
    """A NaN or inf row reaches neither the kNN (it used to fail on ``reference_ids[INT32_MAX]``)
    nor a search: one error counting the rows, of the embeddings, the gallery or the index."""
    from jdml.errors import NonFiniteEmbeddingError
    from jdml.evaluation.embeddings import evaluate_embeddings
    from jdml.inference import Index

    rng = np.random.default_rng(0)
    embeddings, labels = rng.normal(size=(40, 8)).astype(np.float32), np.repeat(np.arange(10), 4)
    broken = embeddings.copy()
    broken[3, 2], broken[7, 0] = np.nan, np.inf
    with pytest.raises(NonFiniteEmbeddingError, match=r"^2 of 40 embeddings are not finite"):
        evaluate_embeddings(broken, labels, ["recall@1", "map@r"])
    with pytest.raises(NonFiniteEmbeddingError, match=r"^2 of 40 gallery embeddings"):
        evaluate_embeddings(
            embeddings[:5], labels[:5], ["recall@1"], gallery=broken, gallery_labels=labels
        )
    index = Index(broken, labels, tuple(map(str, range(40))), fingerprint={})
    with pytest.raises(NonFiniteEmbeddingError, match=r"^2 of 40 embeddings of this index"):
        index.search(embeddings[:2])


NAN_AT_EVALUATION = """
import os, runpy, sys

import numpy as np

import jdml.evaluation.splits as splits

embed, calls = splits.embed_split, []


def patched(*args, **kwargs):  # the NAN_AT-th split embedded gets a NaN row
    out = embed(*args, **kwargs)
    calls.append(1)
    if len(calls) == int(os.environ["NAN_AT"]):
        for emb in out.values():
            emb[1] = np.nan
    return out


splits.embed_split = patched
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_an_evaluation_that_meets_nan_stops_the_run_as_a_nan_loss_does(
    npz: str, tmp_path: Path
) -> None:
    """The embeddings of the step-3 evaluation hold a NaN row (the splits embedded at step 0
    are the first two): the run stops in the one line of a NaN loss, naming the split and the
    count, with the command that trains again; no checkpoint of step 3, no record of it."""
    workdir = tmp_path / "nan-eval"
    script = tmp_path / "nan_at.py"
    script.write_text(NAN_AT_EVALUATION)
    proc = run(str(script), *train_args(npz, workdir)[1:], env={"NAN_AT": "3"})
    line = assert_refused(
        proc, "at the evaluation of step 3, 1 of ", "split 'test' are not finite (NaN or inf)"
    )
    assert "python train.py" in line and "--config.optim.lr=" in line
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [2]
    records = [json.loads(r) for r in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in records if r["kind"] == "eval" and r["step"] == 3]


@pytest.mark.slow
def test_a_checkpoint_with_nan_parameters_is_one_line_in_eval_and_embed(
    npz: str, finished: Path, tmp_path: Path
) -> None:
    """A checkpoint whose parameters are NaN: ``eval.py`` and ``jdml embed`` end in one line
    counting the embeddings that are not finite, and write no result or index."""
    import jax

    from jdml.checkpoint import Checkpoints
    from jdml.evaluate_checkpoint import load_config
    from jdml.run import Run

    copy = Path(shutil.copytree(finished, tmp_path / "run"))
    ckpts = Checkpoints(str(copy))
    try:
        state, meta = ckpts.restore("latest", Run(load_config(str(copy))).initial_state)
        shutil.rmtree(copy / "checkpoints" / str(int(state.step)))
        ckpts.reload()
        nan = jax.tree_util.tree_map(lambda x: x * np.nan, state.params)
        ckpts.save(state.replace(params=nan), meta)
    finally:
        ckpts.close()
    evaluated = unchanged_after(copy, "eval.py", "--workdir", str(copy), "--checkpoint", "latest")
    assert_refused(evaluated, "embeddings of split 'test' are not finite (NaN or inf)")
    index = tmp_path / "index.npz"
    args = ["-m", "jdml", "embed", str(copy), npz, "--checkpoint", "latest", "--out", str(index)]
    embedded = unchanged_after(copy, *args)
    assert_refused(embedded, "embeddings of", "are not finite (NaN or inf)")
    assert not index.exists()


@pytest.mark.slow
def test_an_eval_result_path_taken_by_a_folder_is_named_before_evaluating(
    finished: Path, tmp_path: Path
) -> None:
    """eval.py's result file name taken by a folder: refused before the evaluation, with a fix
    that works (move it away), not a path eval.py has no flag to set."""
    copy = Path(shutil.copytree(finished, tmp_path / "run"))
    step = max(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
    taken = copy / f"eval_latest_step{step}.json"
    taken.mkdir()
    proc = unchanged_after(copy, "eval.py", "--workdir", str(copy), "--checkpoint", "latest")
    assert_refused(proc, f"eval.py writes its result to {taken}", "move it out of the way")
    assert "recall@1" not in proc.stdout  # nothing was evaluated
    taken.rmdir()
    proc = run("eval.py", "--workdir", str(copy), "--checkpoint", "latest")
    assert proc.returncode == 0 and taken.is_file(), proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_end_in_one_line_that_resumes(
    npz: str, tmp_path: Path, signum: int
) -> None:
    """Stopped after its first checkpoint, a run prints one line naming the newest checkpoint
    and the command that resumes (no traceback; exit 128 + the signal), and that command,
    run as printed, finishes the run."""
    import shlex

    workdir = tmp_path / "run"
    args = train_args(npz, workdir, "--config.train.epochs=20")
    proc = start(*args)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not any(p.name.isdigit() for p in (workdir / "checkpoints").glob("*")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, stderr
    stopped = subprocess.CompletedProcess(args, proc.returncode, "", stderr)
    line = assert_refused(stopped, "stopped by", "its newest checkpoint is step", str(workdir))
    assert ("Ctrl-C" if signum == signal.SIGINT else "SIGTERM") in line
    command = shlex.split(line.split("Resume with the same command: ", 1)[1])
    assert command[:2] == ["python", "train.py"] and command[2:] == args[1:]
    done = run(*command[1:])
    assert done.returncode == 0, done.stderr
    assert "Resuming from the checkpoint at step" in (workdir / "train.log").read_text()


@pytest.mark.parametrize(
    "raised, name",
    [(lambda: __import__("jdml.errors").errors.request_stop(signal.SIGTERM), "SIGTERM"),
     (lambda: (_ for _ in ()).throw(KeyboardInterrupt()), "Ctrl-C")],
    ids=["sigterm", "ctrl-c"],
)  # fmt: skip
def test_a_stop_a_finaliser_drops_still_stops(tmp_path: Path, capsys, raised, name) -> None:
    """A signal's exception raised while Python runs a weakref callback is dropped by Python
    ("Exception ignored in ..."); the command records it instead of printing it, the training
    loop stops after its step (``raise_if_stopped``), and the command ends with the one line."""
    import gc
    import weakref

    from jdml.commands.train import stopped_as_error
    from jdml.errors import RunInterruptedError, Stopped, raise_if_stopped

    class Thing:
        pass

    stopped = pytest.raises(RunInterruptedError, match=f"stopped by {name}")
    with stopped, stopped_as_error(str(tmp_path)):
        thing = Thing()
        keep = weakref.ref(thing, lambda _: raised())
        del thing
        gc.collect()
        assert keep() is None  # the callback ran, and its exception was dropped
        with pytest.raises(Stopped):
            raise_if_stopped()  # where the training loop asks after each step
    assert "Exception ignored" not in capsys.readouterr().err
    raise_if_stopped()  # the command's end forgot the stop


@pytest.mark.slow  # reads a trained run (a training process)
def test_latest_is_looked_up_when_read(finished: Path, tmp_path: Path) -> None:
    """A checkpoint reader made before a training process removed its newest step (it keeps
    only the newest two) reads the newest complete step, not the removed one."""
    from jdml.checkpoint import Checkpoints
    from jdml.evaluate_checkpoint import load_config
    from jdml.run import Run

    copy = Path(shutil.copytree(finished, tmp_path / "run"))
    ckpts = Checkpoints(str(copy), create=False)
    try:
        steps = ckpts.steps("latest")
        target = Run(load_config(str(copy))).initial_state
        shutil.rmtree(copy / "checkpoints" / str(steps[-1]))  # removed after the lookup
        state, _ = ckpts.restore("latest", target)
        assert int(state.step) == steps[-2]
    finally:
        ckpts.close()


# ------------------------------------------------------------------- photos, before the workdir


def cub_args(root: Path, workdir: Path, *extra: str) -> list[str]:
    """``train.py`` on a tiny CUB-layout folder of JPEGs (32 photos of 8 classes)."""
    return train_args(
        "unused.npz",
        workdir,
        "--config.data.name=cub200",
        f"--config.data.path={root}",
        "--config.data.verify_counts=False",
        "--config.data.channels=3",
        "--config.data.resize=20",
        "--config.data.augment=base",
        "--config.train.batch_size=8",
        "--config.train.epochs=1",
        *extra,
    )


@pytest.fixture(scope="module")
def cub_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests import benchmark_trees as trees

    return trees.write_cub(tmp_path_factory.mktemp("cub"), class_ids=range(97, 105), per_class=4)


@pytest.mark.slow
@pytest.mark.parametrize("cache", [False, True])
def test_a_truncated_photo_is_named_before_the_workdir_exists(
    cub_tree: Path, tmp_path: Path, cache: bool
) -> None:
    """A JPEG cut short (a broken copy) is named before anything is written, whether photos
    are decoded per draw or into the decode cache; restored, the run trains."""
    root = Path(shutil.copytree(cub_tree, tmp_path / "cub"))
    photo = sorted(root.rglob("*.jpg"))[5]
    whole = photo.read_bytes()
    photo.write_bytes(whole[: len(whole) // 2])
    workdir = tmp_path / "runs" / "w"
    extra = [f"--config.data.decode_cache={cache}", f"--config.data.cache_dir={tmp_path / 'c'}"]
    proc = run(*cub_args(root, workdir, *extra))
    assert_refused(proc, f"cannot decode image {photo}", "re-extract it")
    assert not (tmp_path / "runs").exists()
    photo.write_bytes(whole)
    assert run(*cub_args(root, workdir, *extra)).returncode == 0


def test_a_read_only_decode_cache_folder_is_named_before_the_workdir_exists(
    cub_tree: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    workdir = tmp_path / "w"
    with read_only(cache):
        proc = run(*cub_args(cub_tree, workdir, "--config.data.decode_cache=True",
                             f"--config.data.cache_dir={cache}"))  # fmt: skip
    assert_refused(proc, str(cache))
    assert not workdir.exists()
