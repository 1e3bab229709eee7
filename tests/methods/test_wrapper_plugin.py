"""A member-wrapping method is a plug-in of two files: its exchange (registered in
``jdml.cohort.exchanges.EXCHANGES`` with its config section) and its config. This module is both for
a small one, plain ensembling with a consistency term, and trains it through the one loop."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jdml.cohort.exchanges import EXCHANGES, Exchange, Exchanged, MemberOutputs, Peers
from jdml.cohort.exchanges.base import local_members
from jdml.config import base_config, set_keys, validate
from jdml.errors import ConfigError
from jdml.fileio import read_jsonl
from jdml.geometry import l2_normalize
from jdml.registry import NON_NEGATIVE
from jdml.run import Run
from jdml.trainer import train_and_evaluate
from tests.helpers import make_npz, registered, tiny_config

pytestmark = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 (fake) devices")


# -- file 1: the exchange (would be jdml/cohort/exchanges/consistency.py) ----------------------


# In its own file the class would carry ``@EXCHANGES.register("consistency", ranges=RANGES)``;
# here the module fixture below registers it for these tests only and removes it after them.
RANGES = {"weight": NON_NEGATIVE}


class Consistency(Exchange):
    """Each member's L2-normalised embeddings pulled towards the members' mean (a constant):
    ``value_l = mean_i ||z^l_i - mean_k z^k_i||^2``, with weight ``exchange.consistency.weight``."""

    metric = "consistency"

    @classmethod
    def section(cls) -> dict[str, float]:
        return {"weight": 0.5}

    def weight(self, step: jax.Array) -> jax.Array:
        return jnp.asarray(self.config.exchange.consistency.weight, jnp.float32)

    def losses(self, outputs: MemberOutputs, peers: Peers) -> Exchanged:
        z = local_members(outputs.embeddings, l2_normalize)  # (L_local, B, D)
        mean = jnp.mean(peers.gather(jax.lax.stop_gradient(z)), axis=0)
        return Exchanged(jnp.mean(jnp.sum(jnp.square(z - mean), axis=-1), axis=-1))


# -- file 2: its config (would be configs/consistency.py) -----------------------------------------


def consistency_config(npz: str, size: int = 2, **overrides) -> ml_collections.ConfigDict:
    """Plain ensembling of ``size`` members of the tiny config with the consistency term."""
    c = tiny_config(npz)
    set_keys(
        c,
        {
            "cohort.size": size,
            "cohort.exchange": "consistency",
            **overrides,
        },
    )
    validate(c)
    return c


# -- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def consistency_exchange():
    with registered(EXCHANGES, "consistency", Consistency, ranges=RANGES):
        yield


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


def numpy_consistency(embeddings: list[np.ndarray]) -> np.ndarray:
    """The term of each member, in float64 from its (B, D) embeddings."""
    z = [e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12) for e in embeddings]
    mean = np.mean(z, axis=0)
    return np.array([np.mean(np.sum((zl - mean) ** 2, axis=-1)) for zl in z])


def test_consistency_term_equals_numpy_on_one_batch(npz):
    config = consistency_config(npz, **{"exchange.consistency.weight": 2.0})
    run = Run(config)
    assert run.program.exchange.metric == "consistency"
    state = jax.tree.map(np.asarray, run.initial_state)
    batch = {k: jnp.asarray(v) for k, v in run.batch_maker()(0).items()}
    _, metrics = run.make_train_step()(run.initial_state, batch)
    embeddings, losses = [], []
    for i in range(2):
        member = run.program.layout.member_state(state, i)
        key = jax.random.fold_in(member.rng, member.step)
        loss, (_, _, emb, _) = run.method.loss_fn(
            member.params, member.batch_stats, batch, key, member.method_state
        )
        embeddings.append(np.asarray(emb, np.float64))
        losses.append(float(loss))
    want = numpy_consistency(embeddings)
    assert want.min() > 1e-4  # the members differ (own embedding heads)
    for i in range(2):
        np.testing.assert_allclose(metrics[f"member{i + 1}/consistency"], want[i], rtol=1e-4)
        np.testing.assert_allclose(metrics[f"member{i + 1}/loss"], losses[i], rtol=1e-5)
    np.testing.assert_allclose(metrics["consistency/loss"], want.mean(), rtol=1e-4)
    assert float(metrics["consistency/weight"]) == 2.0
    np.testing.assert_allclose(metrics["loss"], np.mean(np.add(losses, 2.0 * want)), rtol=1e-5)
    assert "mutual/loss" not in metrics  # DM2's exchange is not there


@pytest.mark.slow
def test_consistency_pulls_members_together(npz):
    """With a large weight the members' embeddings agree more after a few steps than
    without the term (the gradient reaches each member)."""

    def spread(weight: float) -> float:
        run = Run(consistency_config(npz, **{"exchange.consistency.weight": weight}))
        step, state = run.make_train_step(), run.initial_state
        make = run.batch_maker()
        for s in range(4):
            state, metrics = step(state, {k: jnp.asarray(v) for k, v in make(s).items()})
        return float(metrics["consistency/loss"])

    assert spread(50.0) < 0.9 * spread(0.0)


@pytest.mark.slow
def test_wrapper_trains_through_the_loop_and_logs_its_term(npz, tmp_path):
    config = consistency_config(npz, **{"train.epochs": 1})
    workdir = str(tmp_path / "run")
    summary = train_and_evaluate(config, workdir)
    assert summary["train_step_compiles"] == 1
    records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    rows = [r for r in records if r["kind"] == "train"]
    assert rows
    for key in ("consistency/loss", "member1/consistency", "member2/consistency"):
        assert key in rows[-1] and np.isfinite(rows[-1][key]), key
    assert rows[-1]["consistency/weight"] == 0.5
    evals = {r.get("embedding", "main") for r in records if r["kind"] == "eval"}
    assert evals == {"main", "member2", "concat:1,1"}  # every member and the ensemble


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"cohort.exchange": "nonesuch"},
            r"cohort.exchange='nonesuch'; choose one of .*consistency",
        ),
        ({"exchange.consistency.weight": -1.0}, r"exchange.consistency.weight=-1.0"),
    ],
)
def test_an_unknown_exchange_or_a_bad_setting_is_refused_by_validate(npz, overrides, message):
    with pytest.raises(ConfigError, match=message):
        consistency_config(npz, **overrides)


def test_a_registered_exchange_has_a_config_section_until_it_is_removed():
    class Probe(Consistency):
        @classmethod
        def section(cls) -> dict[str, float]:
            return {"strength": 1.0}

    with registered(EXCHANGES, "probe", Probe):
        assert base_config().exchange.probe.strength == 1.0
    assert "probe" not in base_config().exchange
    assert "probe" not in EXCHANGES
