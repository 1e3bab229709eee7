"""Data parallelism for every method: with the global batch split over K (fake CPU) devices, the
loss, the mined tuples' statistics, the EMA key network, the DaNCE queue and the parameters after
a few steps equal the run on one device, within float tolerance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.diva import get_config as diva_config
from jdml.config import set_keys, validate
from jdml.errors import ConfigError
from jdml.run import Run
from tests.helpers import TINY_OVERRIDES, make_npz, tiny_config

STEPS = 3
pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 (fake) devices")


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


def train(run: Run, steps: int = STEPS):
    """``steps`` steps from the prepared initial state: the metrics of each and the final state,
    on the host."""
    make = run.batch_maker()
    step = run.make_train_step()
    state, history = run.prepare(run.initial_state), []
    for s in range(steps):
        state, metrics = step(state, make(s))
        history.append(jax.tree.map(np.asarray, metrics))
    return step, jax.tree.map(np.asarray, state), history


def assert_same_run(one, many):
    """Same losses and metrics at every step, and the same state after the last one (Adam
    normalises each update, so rounding differences of the partitioned program reach the
    params at about 1e-6 of an lr-1e-3 step)."""
    (_, state1, history1), (step_k, state_k, history_k) = one, many
    assert step_k._cache_size() == 1  # one compilation for every step
    for m1, mk in zip(history1, history_k, strict=True):
        assert m1.keys() == mk.keys()
        for key in m1:
            np.testing.assert_allclose(mk[key], m1[key], rtol=1e-4, atol=1e-6, err_msg=key)
    for field in ("params", "batch_stats", "method_state"):
        a, b = getattr(state1, field), getattr(state_k, field)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5, err_msg=field)


@pytest.mark.slow
def test_margin_on_four_data_devices_equals_one_device(npz):
    one = Run(tiny_config(npz))
    four = Run(tiny_config(npz, **{"parallel.data_devices": 4}))
    assert dict(four.program.placement.mesh.shape) == {"member": 1, "data": 4}
    leaf = jax.tree.leaves(four.initial_state.params)[0]
    assert len(leaf.sharding.device_set) == 4  # replicated over the data axis
    many = train(four)
    batch = four.program.placement.place_batch({"images": np.zeros((16, 16, 16, 1), np.float32)})
    assert len(batch["images"].sharding.device_set) == 4
    assert batch["images"].addressable_shards[0].data.shape[0] == 4  # 16 rows over 4 devices
    assert_same_run(train(one), many)


def test_all_devices_with_zero(npz):
    run = Run(tiny_config(npz, **{"parallel.data_devices": 0}))
    assert run.program.placement.mesh.shape["data"] == len(jax.devices())


def tiny_diva(npz_path: str, **overrides):
    c = diva_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz_path})
    set_keys(c, {"aux.selfsimilarity.queue_batches": 2, "decorrelation.hidden": 8, **overrides})
    validate(c)
    return c


@pytest.mark.slow
def test_diva_on_two_data_devices_equals_one_device(npz):
    """Every term, the EMA key network and the DaNCE queue see the global batch."""
    one = train(Run(tiny_diva(npz)))
    two = train(Run(tiny_diva(npz, **{"parallel.data_devices": 2})))
    assert_same_run(one, two)
    queue = two[1].method_state["selfsimilarity"]["queue"]
    assert np.any(np.asarray(jax.tree.leaves(queue)[0]) != 0)


def test_a_batch_the_data_axis_does_not_divide_is_refused(npz):
    """A training run's device check (``check_devices``, before anything is written)."""
    from jdml.config.validation import check_devices

    with pytest.raises(ConfigError, match=r"parallel\.data_devices=3 must divide"):
        check_devices(tiny_config(npz, **{"parallel.data_devices": 3}))


def test_plain_step_keeps_one_device_without_data_parallelism(npz):
    run = Run(tiny_config(npz))
    assert run.program.placement.mesh is None
    leaf = jax.tree.leaves(run.initial_state.params)[0]
    assert isinstance(leaf, jnp.ndarray) and len(leaf.sharding.device_set) == 1


@pytest.mark.slow
def test_two_processes_train_margin_as_one_process(npz, tmp_path):
    """``train.py`` under ``jax.distributed`` in two processes (two CPU devices each, gloo
    collectives), the batch split over all four devices: each process builds only its own half
    of every global batch, process 0 alone writes, the parameters equal those of one process
    with four devices, and so do the metrics of the evaluator sharded over both processes."""
    from jdml.fileio import read_jsonl
    from jdml.trainer import train_and_evaluate
    from tests.helpers import restore_latest, train_in_processes, write_tiny_config_file

    overrides = {"parallel.data_devices": 0, "parallel.eval_devices": 0, "train.epochs": 1}
    workdir = str(tmp_path / "two")
    outputs = train_in_processes(write_tiny_config_file(str(tmp_path), npz, **overrides), workdir)
    assert "results:" in outputs[0] and "results:" not in outputs[1]
    assert "builds its own rows of every 16-row batch (this one rows 0-8)" in outputs[0]
    config = tiny_config(npz, **overrides)
    one = str(tmp_path / "one")
    train_and_evaluate(config, one)
    run = Run(config)
    assert run.program.placement.mesh.shape["data"] == 4
    a, b = restore_latest(workdir, run), restore_latest(one, run)
    assert int(a.step) == int(b.step) > 0
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    evals = [r for r in read_jsonl(f"{workdir}/metrics.jsonl") if r["kind"] == "eval"]
    assert len(evals) == len({(r["step"], r["split"], r.get("embedding")) for r in evals})
    alone = {
        (r["step"], r["split"], r.get("embedding")): r
        for r in read_jsonl(f"{one}/metrics.jsonl")
        if r["kind"] == "eval"
    }
    for record in evals:
        want = alone[(record["step"], record["split"], record.get("embedding"))]
        values = {k: v for k, v in want.items() if isinstance(v, float)}  # the metrics
        assert values and values.keys() <= record.keys()
        for name, value in values.items():
            assert record[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


@pytest.mark.slow
def test_per_device_batch_norm_normalises_each_device_rows_alone(npz):
    """``parallel.batch_norm="per_device"``: each device's rows get their own statistics (the
    model run on each quarter of the batch alone), the running statistics their mean; the
    default synchronises them (the one-device result)."""
    run = Run(tiny_config(npz, **{"parallel.data_devices": 4, "parallel.batch_norm": "per_device"}))
    method = run.method
    assert method.bn_groups == 4
    assert Run(tiny_config(npz, **{"parallel.data_devices": 4})).method.bn_groups == 1
    state = run.initial_state
    images = np.random.default_rng(0).random((16, 16, 16, 1), np.float32)
    out, updates = method._apply_train(state.params["model"], state.batch_stats, images)
    variables = {"params": state.params["model"], "batch_stats": state.batch_stats}
    quarters = [
        method.train_model.apply(variables, method.preprocess(q), mutable=["batch_stats"])
        for q in np.split(images, 4)
    ]
    for head, x in out.items():
        want = np.concatenate([q[0][head] for q in quarters])
        np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)
    mean = jax.tree.map(lambda *xs: np.mean(xs, axis=0), *[q[1] for q in quarters])
    for x, y in zip(jax.tree.leaves(updates), jax.tree.leaves(mean), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    whole, _ = method.train_model.apply(
        variables, method.preprocess(images), mutable=["batch_stats"]
    )
    assert not np.allclose(out[method.head], whole[method.head], atol=1e-4)  # not synchronised
    step, state, history = train(run)  # and the step trains with it on the mesh
    assert step._cache_size() == 1 and all(np.isfinite(h["loss"]) for h in history)


def test_unknown_batch_norm_mode_is_refused(npz):
    with pytest.raises(ConfigError, match=r"parallel\.batch_norm='sync'; choose one of global"):
        validate(tiny_config(npz, **{"parallel.batch_norm": "sync"}))


@pytest.mark.slow
def test_a_checkpoint_restores_on_fewer_devices_and_training_continues(npz, tmp_path):
    """Elastic restore: one epoch on 4 data devices, the next on 2 (the checkpoint resharded by
    orbax), the last on 1: the same global batches, and the parameters of three epochs on one
    device."""
    from jdml.trainer import train_and_evaluate
    from tests.helpers import restore_latest

    workdir, one = str(tmp_path / "elastic"), str(tmp_path / "one")
    for epochs, devices in ((1, 4), (2, 2), (3, 1)):
        config = tiny_config(npz, **{"parallel.data_devices": devices, "train.epochs": epochs})
        train_and_evaluate(config, workdir)
    train_and_evaluate(tiny_config(npz, **{"train.epochs": 3}), one)
    run = Run(tiny_config(npz, **{"train.epochs": 3}))
    a, b = restore_latest(workdir, run), restore_latest(one, run)
    assert int(a.step) == int(b.step) == 3 * run.steps_per_epoch
    for field in ("params", "batch_stats", "opt_state"):
        pairs = zip(
            jax.tree.leaves(getattr(a, field)), jax.tree.leaves(getattr(b, field)), strict=True
        )
        for x, y in pairs:
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=field)


@pytest.mark.slow
def test_a_two_process_run_killed_on_one_host_stops_the_other_in_one_line(npz, tmp_path):
    """Process 1 of a ``jax.distributed`` run is killed after the first checkpoint: process 0
    ends within seconds, with one ``error:`` line (exit 2) where the failed collective reaches
    Python first, or through JAX's own abort where its coordination service notices first; the
    checkpoints stay, and both processes started again resume and finish the run."""
    import signal
    import subprocess
    import time

    from tests.helpers import start_training_processes, train_in_processes, write_tiny_config_file

    # 60 steps, the first checkpoint at 15: the kill lands while process 0 trains or saves (both
    # end the same), with 45 steps of two-process collectives still ahead.
    overrides = {
        "parallel.data_devices": 0,
        "train.epochs": 20,
        "eval.every_epochs": 20,
        "train.checkpoint_every_steps": 15,
    }
    config = write_tiny_config_file(str(tmp_path), npz, **overrides)
    workdir = tmp_path / "run"
    procs = start_training_processes(
        config, str(workdir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 600
        while not any(p.name.isdigit() for p in (workdir / "checkpoints").glob("*")):
            assert procs[0].poll() is None and time.time() < deadline
            time.sleep(0.2)
        time.sleep(0.5)  # the save is committed: training goes on
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.time()
        _, err = procs[0].communicate(timeout=300)
        assert time.time() - killed_at < 120
        if procs[0].returncode == 2:  # the failed collective reached Python first
            lines = [line for line in err.splitlines() if "error:" in line]
            assert len(lines) == 1 and "another process of this 2-process run stopped" in lines[0]
            assert "start every process again" in lines[0] and "Traceback" not in err, err
        else:  # JAX's coordination service noticed first (seen on loaded cores): its abort
            assert procs[0].returncode == -signal.SIGABRT, err[-3000:]
            assert "another task died" in err, err[-3000:]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    outputs = train_in_processes(config, str(workdir))
    assert "Resuming from the checkpoint" in outputs[0] and "results:" in outputs[0]


def test_a_peer_failure_logged_by_a_checkpoint_thread_keeps_one_line(monkeypatch, capsys):
    """Where the peer dies while orbax saves, orbax's thread logs the failed collective; the
    filter :func:`jdml.distributed.initialize` installs keeps that log's line and drops its stack
    dump (the trainer prints the ``error:`` line); other logged exceptions keep theirs."""
    import logging

    from absl import logging as absl_logging

    from jdml import distributed

    monkeypatch.setattr(distributed.jax, "process_count", lambda: 2)
    logger = logging.getLogger("absl")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    logger.addFilter(distributed._one_line_peer_failures)
    try:
        for error in (
            jax.errors.JaxRuntimeError("UNKNOWN: Gloo AllGather failed: Connection reset by peer"),
            ValueError("a bug"),
        ):
            try:
                raise error
            except Exception:
                absl_logging.exception("the save raised: %s", error)
    finally:
        logger.removeFilter(distributed._one_line_peer_failures)
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    peer, bug = err.split("the save raised: a bug")
    assert "the save raised: UNKNOWN: Gloo AllGather failed" in peer and "Traceback" not in peer
    assert "Traceback" in bug and "ValueError: a bug" in bug
