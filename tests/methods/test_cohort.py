"""DM2 cohorts: sharded equals unsharded, members equal independent runs without the mutual term,
temporal diversity leaves skipped members untouched, one compilation, checkpoints and resumption,
evaluation of every member and the ensemble, and a DiVA cohort."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.diva import get_config as diva_config
from jdml.config import set_keys, validate
from jdml.config.validation import check_devices
from jdml.errors import ConfigError
from jdml.fileio import read_jsonl
from jdml.run import Run
from jdml.step import make_train_step
from jdml.trainer import train_and_evaluate
from tests.helpers import TINY_OVERRIDES, make_npz, restore_latest, tiny_config

STEPS = 3
pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 (fake) devices")


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


def cohort_run(npz: str, **overrides) -> Run:
    return Run(tiny_config(npz, **{"cohort.size": 4, **overrides}))


def batches(run: Run, steps: int = STEPS) -> list[dict[str, jax.Array]]:
    make = run.batch_maker()
    return [{k: jnp.asarray(v) for k, v in make(s).items()} for s in range(steps)]


def host(tree):
    return jax.tree.map(np.asarray, tree)


def train(run: Run, steps: int = STEPS):
    step = run.make_train_step()
    state, history = run.prepare(run.initial_state), []
    for batch in batches(run, steps):
        before = host(state)
        state, metrics = step(state, batch)
        history.append((before, host(metrics)))
    return step, host(state), history


def assert_trains_as_on_one_device(one: Run, many: Run) -> None:
    """``many`` (on a mesh) trains with the losses and params of ``one`` (one device), and its
    step compiles once."""
    _, state1, history1 = train(one)
    step, state, history = train(many)
    assert step._cache_size() == 1
    for (_, a), (_, b) in zip(history1, history, strict=True):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def sharded(npz):
    """Four members on four devices, every diversity on, lambda = 20 from the first step."""
    run = cohort_run(npz, **{"cohort.devices": 4, "exchange.dm2.warmup_epochs": 0.0})
    return run, *train(run)


@pytest.mark.slow
def test_sharded_cohort_equals_unsharded(npz, sharded):
    run4, step4, state4, history4 = sharded
    assert run4.program.placement.mesh.devices.size == 4
    leaf = jax.tree.leaves(run4.initial_state.params)[0]
    assert len(leaf.sharding.device_set) == 4
    run1 = cohort_run(npz, **{"cohort.devices": 1, "exchange.dm2.warmup_epochs": 0.0})
    step1, state1, history1 = train(run1)
    assert step1._cache_size() == 1
    for (_, m4), (_, m1) in zip(history4, history1, strict=True):
        for key in ("loss", "mutual/loss", "member1/loss", "member4/mutual"):
            np.testing.assert_allclose(m4[key], m1[key], rtol=1e-5, atol=1e-7)
        assert m4["mutual/loss"] > 0 and m4["mutual/weight"] == 20.0
    np.testing.assert_array_equal(m4["updated_fraction"], m1["updated_fraction"])
    # Adam normalises each update, so float rounding differences of the partitioned program reach
    # the params at about 1e-6 of an lr-1e-3 step.
    for a, b in zip(jax.tree.leaves(state4.params), jax.tree.leaves(state1.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert step4._cache_size() == 1  # one compilation for every step


@pytest.mark.slow
def test_data_parallel_members_equal_one_device(npz):
    """Two members on a (member 2, data 2) mesh, each member's batch split over two devices,
    train as the same cohort on one device does."""
    overrides = {"cohort.size": 2, "exchange.dm2.warmup_epochs": 0.0}
    one = Run(tiny_config(npz, **overrides, **{"cohort.devices": 1}))
    four = Run(tiny_config(npz, **overrides, **{"cohort.devices": 2, "parallel.data_devices": 2}))
    assert dict(four.program.placement.mesh.shape) == {"member": 2, "data": 2}
    assert_trains_as_on_one_device(one, four)


def test_temporal_diversity_leaves_skipped_members_bit_identical(sharded):
    _, _, state, history = sharded
    after = [before for before, _ in history[1:]] + [state]
    skipped = 0
    for (before, metrics), new in zip(history, after, strict=True):
        assert metrics["member1/updated"] == 1.0  # p = 1 for the first member
        for i in range(4):
            same = lambda tree, i=i: jax.tree.leaves(jax.tree.map(lambda x: x[i], tree))  # noqa: E731
            fields = ("params", "opt_state", "batch_stats")
            pairs = [(same(getattr(before, f)), same(getattr(new, f))) for f in fields]
            if metrics[f"member{i + 1}/updated"] == 0.0:
                skipped += 1
                for old_leaves, new_leaves in pairs:
                    for a, b in zip(old_leaves, new_leaves, strict=True):
                        np.testing.assert_array_equal(a, b)
            else:
                changed = any(not np.array_equal(a, b) for a, b in zip(*pairs[0], strict=True))
                assert changed, f"member {i + 1} was updated but its params did not change"
    assert skipped > 0


@pytest.mark.slow
def test_without_mutual_term_members_are_independent_runs(npz):
    """lambda = 0, no temporal or view diversity: member l = the plain step from its own init."""
    overrides = {
        "exchange.dm2.mutual_weight": 0.0,
        "exchange.dm2.temporal_diversity": False,
        "exchange.dm2.view_diversity": False,
    }
    run = cohort_run(npz, **overrides)
    init = host(run.initial_state)  # the step donates (deletes) the initial state
    _, state, _ = train(run)
    plain_step = make_train_step(run.method, run.tx)
    plain = Run(tiny_config(npz))
    # Member 1 starts exactly where the plain run of the same config and seed starts.
    for a, b in zip(
        jax.tree.leaves(run.program.layout.member_state(init, 0).params),
        jax.tree.leaves(plain.initial_state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    for i in range(4):
        member = jax.device_put(run.program.layout.member_state(init, i))
        for batch in batches(run):
            member, _ = plain_step(member, batch)
        got = jax.tree.leaves(run.program.layout.member_state(state, i).params)
        for a, b in zip(got, jax.tree.leaves(host(member.params)), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("diverse", [True, False])
def test_model_diversity_initialises_the_embedding_layer_per_member(npz, diverse):
    run = cohort_run(npz, **{"exchange.dm2.model_diversity": diverse})
    model = host(run.initial_state.params["model"])
    for name, sub in model.items():
        leaves = jax.tree.leaves(sub)
        differs = any(not np.array_equal(x[0], x[1]) for x in leaves)
        assert differs == (diverse and name.startswith("head_")), name


def test_view_diversity_gives_each_member_its_own_augmentation(npz):
    run = cohort_run(npz)
    plain = Run(tiny_config(npz))
    images = batches(run, 1)[0]["images"]
    assert images.shape[0] == 4
    np.testing.assert_array_equal(images[0], batches(plain, 1)[0]["images"])
    assert not np.array_equal(images[0], images[1])


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"cohort.size": 4, "cohort.devices": 3}, "must divide cohort.size"),
        ({"cohort.size": 2, "cohort.devices": 2, "parallel.data_devices": 4}, "at most the 4"),
        ({"cohort.size": 2, "parallel.data_devices": 3}, "divide train.batch_size"),
        ({"cohort.size": 0}, "cohort.size=0"),
        ({"cohort.size": 2, "exchange.dm2.relation": "cosine"}, "exchange.dm2.relation"),
        ({"cohort.size": 2, "phases": (("main",),)}, "one joint"),
    ],
)
def test_cohort_config_errors(npz, overrides, message):
    """As the trainer checks a config: ``validate``, then the device counts, then the run."""
    config = tiny_config(npz, **overrides)
    with pytest.raises(ConfigError, match=message):
        validate(config)
        check_devices(config)
        Run(config, validated=True)


@pytest.mark.slow
def test_cohort_trains_evaluates_and_resumes_exactly(npz, tmp_path):
    """Two members through the one training loop: every member and the ensemble are evaluated,
    the step compiles once, and a run interrupted after epoch 1 resumes to the same state."""
    config = tiny_config(npz, **{"cohort.size": 2, "exchange.dm2.warmup_epochs": 1.0})
    straight = str(tmp_path / "straight")
    summary = train_and_evaluate(config, straight)
    assert summary["train_step_compiles"] == 1
    records = read_jsonl(os.path.join(straight, "metrics.jsonl"))
    evals = {r.get("embedding", "main") for r in records if r["kind"] == "eval"}
    assert evals == {"main", "member2", "concat:1,1"}
    train_rows = [r for r in records if r["kind"] == "train"]
    assert {"member1/loss", "member2/mutual", "mutual/weight"} <= set(train_rows[-1])

    resumed = str(tmp_path / "resumed")
    first = tiny_config(
        npz, **{"cohort.size": 2, "exchange.dm2.warmup_epochs": 1.0, "train.epochs": 1}
    )
    train_and_evaluate(first, resumed)
    train_and_evaluate(config, resumed)
    run = Run(config)
    a, b = restore_latest(straight, run), restore_latest(resumed, run)
    assert int(a.step) == int(b.step) > 0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_diva_cohort_carries_each_members_ema_and_queue(npz):
    c = diva_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz})
    set_keys(c, {"aux.selfsimilarity.queue_batches": 2, "decorrelation.hidden": 8})
    set_keys(c, {"cohort.size": 2})
    validate(c)
    run = Run(c)
    state = run.prepare(run.initial_state)
    queue = state.method_state["selfsimilarity"]["queue"]
    assert queue.keys.shape == (2, 32, 16)
    assert not np.array_equal(queue.keys[0], queue.keys[1])  # each member's own key network
    step = run.make_train_step()
    batch = batches(run, 1)[0]
    assert batch["images_b"].shape[0] == 2
    new, metrics = step(state, batch)
    assert np.isfinite(float(metrics["loss"])) and "selfsimilarity/loss" in metrics
    assert int(new.method_state["selfsimilarity"]["queue"].filled[0]) == 32


# Long (two processes, each compiling the sharded cohort): the multi-process path is kept in the
# default run by test_parallel's two-process margin run, the sharded cohort by
# test_sharded_cohort_equals_unsharded.
@pytest.mark.slow
def test_two_processes_train_the_same_cohort_as_one(npz, tmp_path):
    """``train.py`` in two processes (two CPU devices each, gloo collectives) trains the cohort
    of four exactly as one process with four devices does; process 0 alone writes the files."""
    from tests.helpers import train_in_processes, write_tiny_config_file

    overrides = {"cohort.size": 4, "train.epochs": 1}
    config_file = write_tiny_config_file(str(tmp_path), npz, **overrides)
    workdir = str(tmp_path / "two")
    outputs = train_in_processes(config_file, workdir)
    assert "results:" in outputs[0] and "results:" not in outputs[1]
    config = tiny_config(npz, **overrides)
    one = str(tmp_path / "one")
    train_and_evaluate(config, one)
    run = Run(config)
    a, b = restore_latest(workdir, run), restore_latest(one, run)
    assert int(a.step) == int(b.step) > 0
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    rows = [
        (r["step"], r["split"]) for r in records if r["kind"] == "eval" and "embedding" not in r
    ]
    assert sorted(rows) == [(0, "test"), (0, "train"), (3, "test"), (3, "train")]  # written once


@pytest.mark.parametrize("diversity", ["independent", "md", "md+td", "md+vd", "md+td+vd"])
def test_dm2_config_rows(diversity):
    from configs.dm2 import DIVERSITIES
    from configs.dm2 import get_config as dm2_config

    c = dm2_config(f"diversity={diversity},size=3")
    validate(c)
    mutual, model, temporal, view = DIVERSITIES[diversity]
    k = c.exchange.dm2
    assert c.cohort.size == 3 and (k.mutual_weight > 0) == mutual
    assert (k.model_diversity, k.temporal_diversity, k.view_diversity) == (model, temporal, view)
    assert c.loss.name == "triplet" and c.miner.name == "distance"


def test_dm2_config_errors():
    from configs.dm2 import get_config as dm2_config

    for arg, message in [
        ("diversity=all", "unknown diversity"),
        ("method=proxy", "unknown method"),
        ("data=imagenet", "unknown data preset"),
        ("members=4", "unknown config argument"),
    ]:
        with pytest.raises(ConfigError, match=message):
            dm2_config(arg)


def test_workdirs_of_earlier_versions_resume_when_new_keys_keep_their_defaults():
    import json

    from jdml.config import base_config, flatten_config, incompatible_keys, to_json

    new = json.loads(to_json(base_config()))
    old = {k: v for k, v in new.items() if k != "cohort"}  # written before cohort existed
    defaults = flatten_config(new)
    assert incompatible_keys(old, new, defaults=defaults) == []
    changed = json.loads(to_json(base_config()))
    changed["cohort"]["size"] = 4
    assert incompatible_keys(old, changed, defaults=defaults) == ["cohort.size: '<missing>' -> 4"]


def test_vectorised_members_equal_unrolled(npz, sharded):
    """``cohort.member_loop=vmap`` (one vectorised program for the members of a device) trains
    the same cohort as the default unrolled members."""
    _, _, unrolled, history = sharded
    run = cohort_run(
        npz,
        **{"cohort.devices": 1, "exchange.dm2.warmup_epochs": 0.0, "cohort.member_loop": "vmap"},
    )
    _, state, vmapped = train(run)
    for (_, a), (_, b) in zip(history, vmapped, strict=True):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(unrolled.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
