"""Heterogeneous DM2 cohorts (``cohort.members``): members with other widths and embedding sizes
train as independent runs without the mutual term, as a stacked cohort when they are identical,
on a data-parallel mesh as on one device, and through the one loop to checkpoints, evaluation
of every member and the ensemble, and ``jdml.load``."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from configs.diva import get_config as diva_config
from jdml.config import set_keys
from jdml.errors import ConfigError
from jdml.fileio import read_jsonl
from jdml.inference import load
from jdml.program import method_optimizer
from jdml.run import Run
from jdml.step import make_train_step
from jdml.trainer import train_and_evaluate
from tests.helpers import TINY_OVERRIDES, make_npz, restore_latest, tiny_config
from tests.methods.test_cohort import assert_trains_as_on_one_device, batches, host, train

# The tiny model, and a member twice as wide with half its embedding size.
MEMBERS = (
    "",
    "model.small_resnet.stem_features=16;model.small_resnet.stage_features=(32,);model.embed_dim=8",
)
pytestmark = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 (fake) devices")


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


def hetero(npz: str, members: tuple[str, ...] = MEMBERS, **overrides) -> Run:
    return Run(
        tiny_config(npz, **{"cohort.size": len(members), "cohort.members": members, **overrides})
    )


def test_members_have_their_own_networks(npz):
    run = hetero(npz)
    params = run.initial_state.params
    assert set(params) == {"member1", "member2"}
    dims = [method.heads["discriminative"] for method in run.program.methods]
    assert dims == [16, 8]
    images = np.zeros((2, 16, 16, 1), np.float32)
    out = run.embed_fn(params, run.initial_state.batch_stats, images)
    assert {k: v.shape for k, v in out.items()} == {"member1": (2, 16), "member2": (2, 8)}
    widths = [p["model"]["backbone"]["stem"]["kernel"].shape[-1] for p in params.values()]
    assert widths == [8, 16]


@pytest.mark.slow
def test_without_mutual_term_members_are_independent_runs(npz):
    """lambda = 0, no temporal or view diversity: member l = the plain step of its own config
    from its own init; member 1 starts exactly as the plain run of the same config and seed."""
    overrides = {
        "exchange.dm2.mutual_weight": 0.0,
        "exchange.dm2.temporal_diversity": False,
        "exchange.dm2.view_diversity": False,
    }
    run = hetero(npz, **overrides)
    init = host(run.initial_state)
    _, state, _ = train(run)
    plain = Run(tiny_config(npz))
    for a, b in zip(
        jax.tree.leaves(run.program.layout.member_state(init, 0).params),
        jax.tree.leaves(plain.initial_state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    for i, method in enumerate(run.program.methods):
        tx = method_optimizer(method, run.steps_per_epoch, run.total_steps)
        step = make_train_step(method, tx)
        member = jax.device_put(run.program.layout.member_state(init, i))
        for batch in batches(run):
            member, _ = step(member, batch)
        got = jax.tree.leaves(run.program.layout.member_state(state, i).params)
        for a, b in zip(got, jax.tree.leaves(host(member.params)), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_identical_members_train_as_the_stacked_cohort(npz):
    """Two members without overrides, every diversity but the model's on and lambda = 20
    from the first step: the same losses, DM2 terms, update draws and params as the cohort of
    two stacked on a member axis.

    Trained with SGD: the two layouts compute member 2's own view in different programs, whose
    gradients differ by rounding, and Adam divides every gradient element by its own magnitude,
    which turns rounding in an element near zero into a step of up to the learning rate (with
    Adam the params differed by up to 1.5e-4 after three steps on one CPU kind; with SGD by 3e-8,
    and so do the updates, compared below)."""
    overrides = {
        "exchange.dm2.model_diversity": False,
        "exchange.dm2.warmup_epochs": 0.0,
        "optim.name": "sgd",
    }
    listed = hetero(npz, ("", ""), **overrides)
    stacked = Run(tiny_config(npz, **{"cohort.size": 2, "cohort.devices": 1, **overrides}))
    _, state_a, history_a = train(listed)
    _, state_b, history_b = train(stacked)
    init = history_b[0][0]
    for (_, a), (_, b) in zip(history_a, history_b, strict=True):
        assert a["mutual/loss"] > 0
        for key in ("loss", "mutual/loss", "member2/loss", "member2/mutual"):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-7)
        for i in range(2):
            assert a[f"member{i + 1}/updated"] == b[f"member{i + 1}/updated"]
    for i in range(2):
        got = jax.tree.leaves(listed.program.layout.member_state(state_a, i).params)
        want = jax.tree.leaves(stacked.program.layout.member_state(state_b, i).params)
        start = jax.tree.leaves(stacked.program.layout.member_state(init, i).params)
        for x, y, x0 in zip(got, want, start, strict=True):
            assert np.abs(y - x0).max() > 5e-5  # every leaf moved (by 7e-5 to 1e-3)
            np.testing.assert_allclose(x - x0, y - x0, rtol=1e-4, atol=2e-7)


@pytest.mark.slow
def test_data_parallel_heterogeneous_cohort_equals_one_device(npz):
    overrides = {"exchange.dm2.warmup_epochs": 0.0}
    one = hetero(npz, **overrides)
    two = hetero(npz, **overrides, **{"parallel.data_devices": 2})
    assert dict(two.program.placement.mesh.shape) == {"member": 1, "data": 2}
    assert_trains_as_on_one_device(one, two)


@pytest.mark.slow
def test_heterogeneous_cohort_trains_evaluates_restores_and_loads(npz, tmp_path):
    """Through the one loop: one compilation of the step, every member and the ensemble
    evaluated, the checkpoint (per-member dicts) restored as the run's state, and ``jdml.load``
    embedding as the program does (the ensemble: the members' concatenation)."""
    overrides = {"cohort.size": 2, "cohort.members": MEMBERS, "exchange.dm2.warmup_epochs": 1.0}
    config = tiny_config(npz, **overrides)
    workdir = str(tmp_path / "run")
    summary = train_and_evaluate(config, workdir)
    assert summary["train_step_compiles"] == 1
    records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    evals = {r.get("embedding", "main") for r in records if r["kind"] == "eval"}
    assert evals == {"main", "member2", "concat:1,1"}
    run = Run(config)
    state = restore_latest(workdir, run)
    assert int(state.step) == run.total_steps
    images = np.random.default_rng(0).random((3, 16, 16, 1)).astype(np.float32)
    got = load(workdir, checkpoint="latest", embedding="ensemble").embed(images)
    want = run.program.embeddings.embed(state.params, state.batch_stats, images)
    assert got.shape == (3, 16 + 8)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    members = np.concatenate(
        [unit(np.asarray(want["member1"])), unit(np.asarray(want["member2"]))], 1
    )
    np.testing.assert_allclose(got, unit(members), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"cohort.size": 3, "cohort.members": ("", "")}, "2 entries for cohort.size=3"),
        ({"cohort.size": 2, "cohort.members": ("", "train.epochs=3")}, "only change its network"),
        ({"cohort.size": 2, "cohort.members": ("", "model.embed_dims=3")}, "model.embed_dims"),
        ({"cohort.size": 2, "cohort.members": ("", "model.backbone=alexnet")}, r"members\[1\]"),
        ({"cohort.size": 2, "cohort.members": ("", ""), "cohort.devices": 2}, "cohort.devices=0"),
    ],
)
def test_heterogeneous_config_errors(npz, overrides, message):
    with pytest.raises(ConfigError, match=message):
        Run(tiny_config(npz, **overrides))


def test_heterogeneous_dance_is_refused(npz):
    config = diva_config()
    set_keys(config, {**TINY_OVERRIDES, "data.path": npz})
    set_keys(config, {"cohort.size": 2, "cohort.members": ("", "model.embed_dim=8")})
    with pytest.raises(ConfigError, match="DaNCE"):
        Run(config)
