"""DiVA through the one training loop: multi-head step, EMA key params and queue in the state,
checkpoint round trip and exact resumption, multi-head evaluation records."""

from __future__ import annotations

import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from PIL import Image

from configs.diva import AUX_HEADS
from configs.diva import get_config as diva_config
from jdml.checkpoint import Checkpoints
from jdml.config import set_keys, validate
from jdml.errors import ConfigError
from jdml.fileio import read_jsonl
from jdml.methods.ema_queue import ordered
from jdml.run import Run
from jdml.step import make_train_step
from jdml.trainer import train_and_evaluate
from tests.helpers import TINY_OVERRIDES, make_npz

EPOCHS = 2


def tiny_diva(npz_path: str, **overrides):
    c = diva_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz_path, "train.epochs": EPOCHS})
    set_keys(c, {"aux.selfsimilarity.queue_batches": 2, "decorrelation.hidden": 8})
    set_keys(c, {"eval.combinations": ((0.5, 1.0, 1.0, 1.0),), **overrides})
    validate(c)
    return c


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


@pytest.fixture(scope="module")
def run(npz):
    return Run(tiny_diva(npz))


@pytest.fixture(scope="module")
def full_run(npz, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("diva"))
    return workdir, train_and_evaluate(tiny_diva(npz), workdir)


def _restore(workdir, run, which="latest"):
    ckpts = Checkpoints(workdir)
    try:
        return ckpts.restore(which, run.initial_state)[0]
    finally:
        ckpts.close()


def test_params_groups_and_state(run):
    params = run.initial_state.params
    assert set(params) == {"model", "loss", "aux_shared", "aux_intra", "decorrelation"}
    heads = {k for k in params["model"] if k.startswith("head_")}
    assert heads == {f"head_{h}" for h in ("discriminative", *AUX_HEADS)}
    groups = run.method.param_groups()
    assert groups["decorrelation"].resolve(run.config.optim)[:2] == (1e-5, 0.0)
    assert groups["aux_shared"].weight_decay == 0.0
    queue = run.initial_state.method_state["selfsimilarity"]["queue"]
    assert queue.keys.shape == (2 * 16, 16) and int(queue.filled) == 0
    assert run.method.views == 2


def test_step_updates_ema_and_queue_after_the_optimiser(run):
    """One step: EMA = mu * old + (1 - mu) * new params on every leaf; the queue's newest rows
    are the keys of the pre-step EMA network on the second view."""
    state = run.prepare(run.initial_state)
    queue0 = state.method_state["selfsimilarity"]["queue"]
    assert int(queue0.filled) == queue0.keys.shape[0]  # filled before training
    ema0 = jax.tree.map(np.asarray, state.method_state["selfsimilarity"]["ema"])
    batch_stats0 = jax.tree.map(np.asarray, state.batch_stats)
    rng = np.random.default_rng(0)
    batch = {
        "images": rng.random((16, 16, 16, 1), np.float32),
        "images_b": rng.random((16, 16, 16, 1), np.float32),
        "labels": np.repeat(np.arange(4), 4).astype(np.int32),  # of the 6 training classes
        "indices": np.arange(16, dtype=np.int32),
    }
    step = make_train_step(run.method, run.tx)
    new, metrics = step(jax.tree.map(jnp.array, state), batch)
    assert int(new.nonfinite) == 0  # the step was applied
    assert {"selfsimilarity/loss", "shared/loss", "intra/loss", "decorrelation/total"} <= set(
        metrics
    )
    mu = run.config.aux.selfsimilarity.momentum
    ema = new.method_state["selfsimilarity"]["ema"]
    for old, online, got in zip(
        jax.tree.leaves(ema0),
        jax.tree.leaves(new.params["model"]),
        jax.tree.leaves(ema),
        strict=True,
    ):
        np.testing.assert_allclose(got, mu * old + (1 - mu) * np.asarray(online), rtol=1e-6)
    key_network = jax.jit(partial(run.method.train_model.apply, mutable=["batch_stats"]))
    out, _ = key_network(
        {"params": ema0, "batch_stats": batch_stats0},
        run.method.preprocess(jnp.asarray(batch["images_b"])),
    )
    queue = new.method_state["selfsimilarity"]["queue"]
    np.testing.assert_allclose(ordered(queue)[-16:], out["selfsimilarity"], atol=1e-5)
    assert int(queue.pointer) == 16 % queue.keys.shape[0]


def test_training_compiles_once_and_records_every_head(full_run):
    workdir, summary = full_run
    assert summary["train_step_compiles"] == 1
    records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    extra = {r["embedding"] for r in records if r["kind"] == "eval" and "embedding" in r}
    assert extra == {*AUX_HEADS, "concat:0.5,1,1,1"}
    train = [r for r in records if r["kind"] == "train"]
    assert all(np.isfinite(r["selfsimilarity/loss"]) for r in train)
    assert summary["best"]["test"]["recall@1"] > 0


@pytest.mark.slow
def test_checkpoint_round_trip_resumes_exactly(full_run, npz, run, tmp_path):
    """Training 1 epoch, then resuming to 2, ends in the state of the uninterrupted run (EMA
    params and queue included)."""
    workdir = str(tmp_path / "resumed")
    train_and_evaluate(tiny_diva(npz, **{"train.epochs": 1}), workdir)
    train_and_evaluate(tiny_diva(npz), workdir)
    a = _restore(full_run[0], run)
    b = _restore(workdir, run)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    queue = b.method_state["selfsimilarity"]["queue"]
    assert int(queue.filled) == queue.keys.shape[0]


def test_config_errors_name_the_key(npz):
    with pytest.raises(ConfigError, match="one weight per"):
        tiny_diva(npz, **{"decorrelation.weights": (1.0,)})
    with pytest.raises(ConfigError, match="two different heads"):
        tiny_diva(
            npz, **{"decorrelation.pairs": (("shared", "nohead"),), "decorrelation.weights": (1.0,)}
        )
    with pytest.raises(ConfigError, match=r"aux\.shared"):
        tiny_diva(npz, **{"aux.shared.miner.name": ""})


def test_sharing_matters_config_trains_one_step(npz):
    from configs.sharing import get_config as sharing_config

    c = sharing_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz, "decorrelation.hidden": 8})
    validate(c)
    run = Run(c)
    assert set(run.initial_state.params) == {"model", "loss", "aux_shared", "decorrelation"}
    assert not run.initial_state.method_state and run.method.views == 1
    rng = np.random.default_rng(0)
    batch = {
        "images": rng.random((16, 16, 16, 1), np.float32),
        "labels": np.repeat(np.arange(4), 4).astype(np.int32),
        "indices": np.arange(16, dtype=np.int32),
    }
    new, metrics = make_train_step(run.method, run.tx)(run.initial_state, batch)
    assert np.isfinite(float(metrics["loss"])) and int(new.nonfinite) == 0
    assert "decorrelation/shared-class" in metrics and "shared/loss" in metrics


def test_sharing_matters_alternating_updates_each_group_in_its_phase(npz):
    """Algorithm 1: two updates per step; the class term's betas change only in phase 0 (phase 1
    keeps their params and optimiser state), the shared term's only in phase 1."""
    from configs.sharing import get_config as sharing_config

    c = sharing_config("data=npz,alternating=1")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz, "decorrelation.hidden": 8})
    run = Run(c)
    assert run.method.streams == 2
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 4).astype(np.int32)
    batch = {
        "images": rng.random((16, 16, 16, 1), np.float32),
        "labels": labels,
        "indices": np.arange(16, dtype=np.int32),
        "images_1": rng.random((16, 16, 16, 1), np.float32),
        "labels_1": rng.permutation(np.repeat(np.arange(6), 3)[:16]).astype(np.int32),
    }
    state0 = jax.tree.map(np.asarray, run.initial_state)
    new, metrics = make_train_step(run.method, run.tx)(run.initial_state, batch)
    assert {"phase0/loss", "phase1/shared/loss", "phase0/decorrelation/total"} <= set(metrics)
    assert int(new.nonfinite) == 0

    def changed(group: str) -> bool:
        old, now = jax.tree.leaves(state0.params[group]), jax.tree.leaves(new.params[group])
        pairs = zip(old, now, strict=True)
        return not all(np.array_equal(a, b) for a, b in pairs)

    assert changed("model") and changed("loss") and changed("aux_shared")
    assert run.method.phase_groups(run.method.phases[1]) == {"model", "aux_shared", "decorrelation"}
    # The main loss's betas end where phase 0's update alone puts them (phase 1 keeps them).
    key = jax.random.fold_in(state0.rng, state0.step)
    grad_fn = jax.value_and_grad(run.method.loss_fn, has_aux=True)
    phase0 = run.method.phases[0]

    @jax.jit  # one program, as the step's (op by op it takes seconds)
    def phase0_update(params, batch_stats, opt_state, batch, key):
        _, grads = grad_fn(params, batch_stats, batch, key, {}, phase0)
        updates, _ = run.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates)["loss"]

    expected = phase0_update(state0.params, state0.batch_stats, state0.opt_state, batch, key)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(new.params["loss"]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_report_of_a_concatenation(full_run, tmp_path):
    from jdml.errors import ReportError
    from jdml.report import report

    workdir, summary = full_run
    out = report([workdir], str(tmp_path), embedding="concat:0.5,1,1,1", metrics=["recall@1"])
    records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    best = summary["best"]["step"]  # selected on the main head
    concat = [
        r
        for r in records
        if r.get("embedding") == "concat:0.5,1,1,1" and r["split"] == "test" and r["step"] == best
    ]
    assert f"{100 * concat[0]['recall@1']:.2f}" in out["markdown"]
    with pytest.raises(ReportError, match="no evaluation of the embedding"):
        report([workdir], str(tmp_path), embedding="concat:9")


def test_checkpoint_evaluation_covers_every_head(full_run):
    from jdml.evaluate_checkpoint import evaluate_checkpoint

    workdir, summary = full_run
    out = evaluate_checkpoint(workdir, "best", ["test"])
    assert set(out["embeddings"]["test"]) == {*AUX_HEADS, "concat:0.5,1,1,1"}
    best = summary["best"]["test"]["recall@1"]
    assert out["results"]["test"]["recall@1"] == pytest.approx(best, abs=1e-6)


def test_loaded_concatenation_and_one_map_per_head(full_run, tmp_path):
    """``jdml.load`` with a DiVA concatenation embeds as the evaluation did, and ``look`` draws
    one embedding-map panel per head."""
    import jdml
    from jdml.data.loading import load_splits
    from jdml.evaluation.embeddings import evaluate_embeddings
    from jdml.look import LookOptions, look
    from jdml.visualize import embedding_maps_size

    workdir, _ = full_run
    model = jdml.load(workdir, embedding="concat:0.5,1,1,1")
    test = load_splits(model.config.data)["test"]
    got = evaluate_embeddings(model.embed(test.images), test.labels, ["recall@1"])
    records = [
        r
        for r in read_jsonl(f"{workdir}/metrics.jsonl")
        if r.get("embedding") == "concat:0.5,1,1,1" and r["step"] == model.step
    ]
    assert got["recall@1"] == pytest.approx(records[-1]["recall@1"], abs=1e-6)
    out = look(
        workdir, out=str(tmp_path), options=LookOptions(method="pca", queries=2, neighbours=3)
    )
    with Image.open(out["embedding_map"]) as image:
        assert image.size == embedding_maps_size(4, legend=True)
