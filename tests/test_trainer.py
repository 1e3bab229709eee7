"""End-to-end training: compile once, files written, resume after a kill, eval of checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jdml.backends import resolve_backends
from jdml.checkpoint import Checkpoints
from jdml.errors import NonFiniteLossError
from jdml.evaluate_checkpoint import evaluate_checkpoint
from jdml.evaluation import per_query
from jdml.evaluation.splits import embed_split
from jdml.fileio import read_jsonl
from jdml.report import report
from jdml.run import Run
from jdml.trainer import train_and_evaluate
from tests.helpers import REPO, make_npz, tiny_config, tree_digest, write_tiny_config_file

EPOCHS = 6  # 3 steps per epoch on the tiny data: long enough to kill a run midway


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


@pytest.fixture(scope="module")
def full_run(npz, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("full"))
    config = tiny_config(npz, **{"train.epochs": EPOCHS})
    return workdir, train_and_evaluate(config, workdir)


def _latest_state(workdir, config):
    run = Run(config)
    ckpts = Checkpoints(workdir)
    try:
        state, _ = ckpts.restore("latest", run.initial_state)
    finally:
        ckpts.close()
    return state


@pytest.mark.slow
def test_running_a_finished_run_again_leaves_its_results(full_run, npz, tmp_path):
    import shutil

    workdir = str(tmp_path / "again")
    shutil.copytree(full_run[0], workdir)
    results = tmp_path / "again" / "results.json"
    before = results.read_text()
    summary = train_and_evaluate(tiny_config(npz, **{"train.epochs": EPOCHS}), workdir)
    assert summary["train_step_compiles"] == 1  # no step ran here: the training process's
    assert results.read_text() == before


def test_run_writes_results_and_compiles_once(full_run):
    workdir, summary = full_run
    assert summary["train_step_compiles"] == 1
    for name in ("config.json", "metrics.jsonl", "results.json", "train.log"):
        assert os.path.exists(os.path.join(workdir, name)), name
    assert set(summary) >= {"untrained", "final", "best", "selection_split"}
    assert summary["selection_split"] == "test"  # no validation split configured
    records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval" and r["split"] == "test"]
    assert train and all(np.isfinite(r["loss"]) for r in train)
    assert [r["epoch"] for r in evals] == list(range(EPOCHS + 1))
    with open(os.path.join(workdir, "results.json")) as f:
        assert json.load(f)["final"]["step"] == summary["final"]["step"]
    assert summary["backends"] == resolve_backends().record()  # what the run computed with


def test_train_split_rho_and_spectrum_match_the_checkpoint(full_run, npz):
    """At every evaluation the training embeddings' rho and normalised spectrum are recorded;
    at the last one they equal a NumPy SVD of the latest checkpoint's training embeddings."""
    workdir, _ = full_run
    records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    train_evals = [r for r in records if r["kind"] == "eval" and r["split"] == "train"]
    spectra = [r for r in records if r["kind"] == "spectrum"]
    assert [r["epoch"] for r in train_evals] == list(range(EPOCHS + 1))
    assert [r["step"] for r in spectra] == [r["step"] for r in train_evals]
    assert set(train_evals[-1]) == {"kind", "split", "step", "epoch", "rho_spectrum@1"}
    config = tiny_config(npz, **{"train.epochs": EPOCHS})
    run = Run(config)
    state = _latest_state(workdir, config)
    emb = np.asarray(
        embed_split(run.embed_fn, state.params, state.batch_stats, run.splits["train"], 32)[
            run.method.head
        ],
        np.float64,
    )
    s = np.linalg.svd(emb, compute_uv=False)
    s_hat = s / s.sum()
    np.testing.assert_allclose(spectra[-1]["spectrum"], s_hat, rtol=1e-4, atol=1e-7)
    uniform = 1.0 / len(s_hat)
    rho = np.sum(uniform * np.log(uniform / s_hat))
    assert train_evals[-1]["rho_spectrum@1"] == pytest.approx(rho, rel=1e-3)


def test_report_of_a_trained_run(full_run, tmp_path):
    workdir, summary = full_run
    out = report([workdir], str(tmp_path / "report"))
    assert [os.path.basename(f) for f in out["files"]] == [
        "report.md",
        "report.csv",
        "recall_at_1_over_epochs.png",
        "spectrum.png",
    ]
    best = summary["best"]["test"]["recall@1"]
    assert f"{100 * best:.2f}" in out["markdown"]
    assert "rho_spectrum@1 (train)" in out["markdown"]


def test_rerun_of_finished_run_changes_nothing(full_run, npz):
    workdir, summary = full_run
    before = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    again = train_and_evaluate(tiny_config(npz, **{"train.epochs": EPOCHS}), workdir)
    assert read_jsonl(os.path.join(workdir, "metrics.jsonl")) == before
    assert again["best"] == summary["best"]


# Long: a kill from outside at a moment chosen by the clock. test_user_errors kills at five
# chosen points (before and after saves, mid-commit, mid-line) and compares every record.
@pytest.mark.slow
def test_killed_run_resumes_to_identical_params(full_run, npz, tmp_path):
    workdir = str(tmp_path / "killed")
    cfg_file = write_tiny_config_file(str(tmp_path), npz, **{"train.epochs": EPOCHS})
    cmd = [
        sys.executable,
        os.path.join(REPO, "train.py"),
        f"--config={cfg_file}",
        f"--workdir={workdir}",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    deadline = time.time() + 240
    killed_at = None
    while time.time() < deadline and proc.poll() is None:
        steps = (
            [int(d) for d in os.listdir(ckpt_dir) if d.isdigit()] if os.path.isdir(ckpt_dir) else []
        )
        if steps and max(steps) >= 4:
            proc.send_signal(signal.SIGKILL)
            killed_at = max(steps)
            break
        time.sleep(0.02)
    proc.wait()
    assert killed_at is not None, "the run finished or stalled before it could be interrupted"
    assert killed_at < EPOCHS * 3
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming from the checkpoint" in done.stderr + done.stdout

    config = tiny_config(npz, **{"train.epochs": EPOCHS})
    resumed = _latest_state(workdir, config)
    full = _latest_state(full_run[0], config)
    assert int(resumed.step) == int(full.step) == EPOCHS * 3
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(full.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def evals(w):
        return [r for r in read_jsonl(os.path.join(w, "metrics.jsonl")) if r["kind"] == "eval"]

    assert evals(workdir) == evals(full_run[0])


def test_eval_of_best_checkpoint_matches_training_record(full_run):
    workdir, summary = full_run
    out = evaluate_checkpoint(workdir, "best", ["test"])
    assert out["step"] == summary["best"]["step"]
    for metric, value in summary["best"]["test"].items():
        assert out["results"]["test"][metric] == pytest.approx(value, abs=1e-6), metric
    assert os.path.exists(os.path.join(workdir, f"eval_best_step{out['step']}.json"))
    assert out["backends"] == resolve_backends().record()
    train = evaluate_checkpoint(workdir, "best", ["train"])
    assert set(train["results"]["train"]) >= {"recall@1", "rho_spectrum@1"}
    assert len(train["spectra"]["train"]) == 16  # embed_dim singular values


def test_eval_cli(full_run):
    workdir, summary = full_run
    res = subprocess.run(
        [sys.executable, "eval.py", f"--workdir={workdir}", "--checkpoint=latest"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "recall@1" in res.stdout and f"step {summary['final']['step']}" in res.stdout


def test_nan_loss_stops_with_clear_error_and_keeps_state_finite(npz, tmp_path):
    # A finite learning rate too large for float32: the first update overflows the weights.
    config = tiny_config(npz, **{"optim.lr": 1e38, "eval.at_start": False})
    with pytest.raises(NonFiniteLossError, match="NaN/inf"):
        train_and_evaluate(config, str(tmp_path))
    assert not os.listdir(tmp_path / "checkpoints")  # nothing saved after a bad step


def test_refused_runs_leave_workdir_intact(full_run, npz, tmp_path):
    workdir, _ = full_run
    before = tree_digest(workdir)
    other = write_tiny_config_file(str(tmp_path), npz, **{"loss.name": "triplet"})
    base = [sys.executable, "train.py", f"--workdir={workdir}"]
    for extra in ([f"--config={other}"], [f"--config={other}", "--config.optim.lrr=1"]):
        res = subprocess.run(base + extra, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert res.returncode == 2, res.stderr[-2000:]
        assert "Traceback" not in res.stderr
    assert "different config" in res.stderr or "unknown config key" in res.stderr
    assert tree_digest(workdir) == before


@pytest.mark.slow
def test_glyph_dataset_trains_through_the_pipeline(glyph_cache_dir, tmp_path):
    overrides = {
        "data.name": "glyphs",
        "data.cache_dir": str(glyph_cache_dir),
        "data.image_size": 32,
        "train.steps_per_epoch": 3,
        "train.epochs": 1,
        "eval.at_start": False,
        "eval.metrics": ("recall@1", "map@r"),
    }
    summary = train_and_evaluate(tiny_config("", **overrides), str(tmp_path))
    assert summary["train_step_compiles"] == 1
    assert 0.0 < summary["final"]["test"]["recall@1"] <= 1.0


def test_the_default_selects_the_checkpoint_on_validation(npz, tmp_path):
    """The quick start's config holds training classes out and selects on them, never on the
    test split (the reference's test selection is data.val_fraction=0)."""
    from configs.revisiting import get_config

    default = get_config().data.val_fraction
    assert default > 0
    config = tiny_config(npz, **{"data.val_fraction": default, "train.epochs": 2})
    summary = train_and_evaluate(config, str(tmp_path))
    assert summary["selection_split"] == "val"
    assert set(summary["best"]) >= {"val", "test"}
    with open(os.path.join(tmp_path, "train.log")) as f:
        assert "selected on the TEST split" not in f.read()


@pytest.mark.slow
def test_results_json_holds_the_selected_checkpoints_test_evaluation(npz, tmp_path):
    """The papers' protocol: validation during training, the test split only on the selected
    checkpoint at the end; results.json's ``selected`` holds that evaluation, and evaluating
    the best checkpoint again later (``jdml eval``) lands there too."""
    overrides = {
        "data.val_fraction": 0.34,
        "train.epochs": 3,
        "eval.every_epochs": 1,
        "eval.splits": (),
        "eval.selected_splits": ("test",),
        "eval.per_query": ("recall@1",),
    }
    summary = train_and_evaluate(tiny_config(npz, **overrides), str(tmp_path))
    with open(tmp_path / "results.json") as f:
        saved = json.load(f)
    selected = saved["selected"]
    assert selected == summary["selected"]
    assert selected["step"] == summary["best"]["step"] and "test" not in summary["best"]
    assert selected["epoch"] == summary["best"]["epoch"]
    with open(tmp_path / f"eval_best_step{selected['step']}.json") as f:
        evaluation = json.load(f)
    assert evaluation["results"]["test"] == selected["results"]["test"]
    # The kept per-query hits: one per test query, of the test classes, averaging to Recall@1.
    classes, values = per_query.unpack(evaluation["per_query"]["test"])
    hits = values[evaluation["per_query"]["test"]["main"]]["recall@1"]
    assert set(np.unique(hits)) <= {0.0, 1.0} and len(hits) == len(classes)
    assert hits.mean() == pytest.approx(selected["results"]["test"]["recall@1"], abs=1e-6)
    assert set(evaluation["per_query"]) == {"test"}  # the selected splits only
    records = read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
    assert "test" not in {r["split"] for r in records if r["kind"] == "eval"}  # no peeking
    out = evaluate_checkpoint(str(tmp_path), "best", ["val"])
    with open(tmp_path / "results.json") as f:
        merged = json.load(f)["selected"]
    assert merged["results"]["test"] == selected["results"]["test"]
    assert merged["results"]["val"] == out["results"]["val"]
    assert merged["results"]["val"]["recall@1"] == pytest.approx(
        summary["best"]["val"]["recall@1"], abs=1e-6
    )


# Both samplers' tables are checked in tests/samplers; the restart mid-epoch is the same code,
# so the second sampler's end-to-end run is marked long.
@pytest.mark.slow
@pytest.mark.parametrize(
    "sampler", [pytest.param("greedy_coreset", marks=pytest.mark.slow), "fid_batchmatch"]
)
def test_memory_sampler_trains_and_resumes_identically(npz, tmp_path, sampler):
    """The embedding memory and the epoch table survive a restart mid-epoch."""
    overrides = {"sampler.name": sampler, "train.epochs": 2, "eval.at_start": False}
    full = str(tmp_path / "full")
    summary = train_and_evaluate(tiny_config(npz, **overrides), full)
    assert summary["train_step_compiles"] == 1
    # A run stopped after epoch 1 (checkpoints at steps 2 and 3), whose step-3 checkpoint is then
    # removed, resumes mid-epoch from step 2 and must end where the uninterrupted run ends.
    import shutil

    part = str(tmp_path / "part")
    first = {**overrides, "train.epochs": 1, "train.checkpoint_every_steps": 1}
    train_and_evaluate(tiny_config(npz, **first), part)
    shutil.rmtree(os.path.join(part, "checkpoints", "3"))
    shutil.rmtree(os.path.join(part, "best"))
    train_and_evaluate(tiny_config(npz, **overrides), part)
    config = tiny_config(npz, **overrides)
    a, b = _latest_state(full, config), _latest_state(part, config)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
