"""An exchange with class logits and a state of its own is a plug-in that touches neither the
step nor the layout: Deep Mutual Learning's KL between the members' class predictions, each
peer weighted by its running accuracy (the exchange's per-member state).

Zhang, Xiang, Hospedales, Lu, "Deep Mutual Learning", CVPR 2018: member l adds
``mean_{k != l} KL(p_k || p_l)`` over the batch, ``p`` the softmax of a member's class logits,
the peers' predictions constants. Here the peers' mean is weighted by their running batch
accuracy ``a_k`` (``w_lk = a_k / sum_{j != l} a_j``; all ``a`` start at 1, so the first step is
plain DML), and ``a_l <- m a_l + (1 - m) accuracy_l`` after each step the member applies.

The logits are those of the main loss (``loss=softmax``): ``z . w_c / T`` over the unit rows
``w_c`` of the member's class map, which the exchange reads from the member's params and so
trains as well. This module is the exchange's file and its config at once (nothing of
``jdml.step``, ``jdml.cohort.layout`` or ``jdml.program`` is imported; a test below checks it).
"""

from __future__ import annotations

import ast
import itertools
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jdml.cohort.exchanges import (
    EXCHANGE_STATE,
    EXCHANGES,
    Exchange,
    Exchanged,
    MemberOutputs,
    Peers,
)
from jdml.config import set_keys, validate
from jdml.fileio import read_jsonl
from jdml.geometry import l2_normalize
from jdml.registry import NON_NEGATIVE, PROBABILITY, Range
from jdml.run import Run
from jdml.trainer import train_and_evaluate
from tests.helpers import make_npz, registered, restore_latest, tiny_config

pytestmark = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 (fake) devices")

# -- file 1: the exchange (would be jdml/cohort/exchanges/mutual_kl.py) ------------------------

# In its own file the class would carry ``@EXCHANGES.register("mutual_kl", ranges=RANGES)``;
# here a module fixture registers it for these tests only and removes it after them.
RANGES = {
    "weight": NON_NEGATIVE,
    "momentum": PROBABILITY,
    "temporal_rate": Range(0, 1, open_low=True),
}


def class_logits(embeddings: jax.Array, class_map: jax.Array, temperature: float) -> jax.Array:
    """(B, C): a member's main-loss logits, ``z . w_c / T`` over the unit rows of its map."""
    return embeddings @ l2_normalize(class_map, axis=1).T / temperature


class AccuracyWeightedKL(Exchange):
    """DML's KL between class predictions, peers weighted by their running accuracy."""

    metric = "kl"

    @classmethod
    def section(cls) -> dict[str, float]:
        return {"weight": 1.0, "momentum": 0.9, "temporal_rate": 1.0}

    def update_probabilities(self, size: int) -> np.ndarray:
        """Member l applies its update with probability ``temporal_rate^(l-1)``."""
        rate = float(self.config.exchange.mutual_kl.temporal_rate)
        return np.power(rate, np.arange(size)).astype(np.float32)

    def init_state(self, params: dict) -> dict[str, jax.Array]:
        return {"accuracy": jnp.ones((), jnp.float32)}

    def weight(self, step: jax.Array) -> jax.Array:
        return jnp.asarray(self.config.exchange.mutual_kl.weight, jnp.float32)

    def losses(self, outputs: MemberOutputs, peers: Peers) -> Exchanged:
        temperature = float(self.config.loss.softmax.temperature)
        logits = jnp.concatenate(
            [
                jax.vmap(class_logits, (0, 0, None))(e, p["loss"]["class_map"], temperature)
                for e, p in zip(outputs.embeddings, outputs.params, strict=True)
            ]
        )  # (L_local, B, C)
        log_p = jax.nn.log_softmax(logits, axis=-1)
        everyone = peers.gather(jax.lax.stop_gradient(log_p))  # (L, B, C)
        accuracy = jnp.concatenate([s["accuracy"] for s in outputs.state])  # (L_local,)
        all_accuracy = peers.gather(accuracy)  # (L,)
        # kl[l, k] = mean_b KL(p_k || p_l) for each local l and every k
        p_peer = jnp.exp(everyone)
        kl = jnp.mean(jnp.sum(p_peer[None] * (everyone[None] - log_p[:, None]), axis=-1), axis=-1)
        local = peers.offset + jnp.arange(log_p.shape[0])
        others = jnp.arange(peers.size)[None, :] != local[:, None]  # (L_local, L)
        w = jnp.where(others, all_accuracy[None, :], 0.0)
        values = jnp.sum(w * kl, axis=1) / jnp.sum(w, axis=1)
        hit = jnp.argmax(logits, axis=-1) == outputs.labels[None, :]
        m = float(self.config.exchange.mutual_kl.momentum)
        new = m * accuracy + (1.0 - m) * jnp.mean(hit.astype(jnp.float32), axis=-1)
        bounds = itertools.pairwise(np.cumsum([0] + [e.shape[0] for e in outputs.embeddings]))
        state = tuple({"accuracy": new[a:b]} for a, b in bounds)
        return Exchanged(values, state)


# -- file 2: its config (would be configs/mutual_kl.py) -------------------------------------------


def kl_config(npz: str, size: int = 3, **overrides) -> ml_collections.ConfigDict:
    """A cohort of ``size`` tiny normalised-softmax members exchanging the weighted KL."""
    c = tiny_config(npz)
    set_keys(
        c,
        {
            "loss.name": "softmax",
            "miner.name": "",
            "cohort.size": size,
            "cohort.exchange": "mutual_kl",
            **overrides,
        },
    )
    validate(c)
    return c


# -- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def kl_exchange():
    with registered(EXCHANGES, "mutual_kl", AccuracyWeightedKL, ranges=RANGES):
        yield


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


def numpy_kl(logits: list[np.ndarray], accuracy: np.ndarray, labels: np.ndarray):
    """Each member's term and new running accuracy, in float64 (momentum 0.9)."""
    log_p = [z - z.max(-1, keepdims=True) for z in logits]
    log_p = [lp - np.log(np.exp(lp).sum(-1, keepdims=True)) for lp in log_p]
    values, new = [], []
    for i, lp_i in enumerate(log_p):
        peers = [k for k in range(len(logits)) if k != i]
        kl = [np.mean(np.sum(np.exp(log_p[k]) * (log_p[k] - lp_i), -1)) for k in peers]
        w = accuracy[peers] / accuracy[peers].sum()
        values.append(float(np.dot(w, kl)))
        hit = np.mean(np.argmax(logits[i], -1) == labels)
        new.append(0.9 * accuracy[i] + 0.1 * hit)
    return np.array(values), np.array(new)


def member_logits(run: Run, state, batch) -> tuple[list[np.ndarray], list[float]]:
    """Each member's float64 class logits and method loss, from its own state alone."""
    logits, losses = [], []
    temperature = run.config.loss.softmax.temperature
    for i in range(run.program.size):
        member = run.program.layout.member_state(state, i)
        key = jax.random.fold_in(member.rng, member.step)
        loss, aux = run.method.loss_fn(
            member.params, member.batch_stats, batch, key, member.method_state
        )
        z = np.asarray(aux.embeddings, np.float64)
        w = np.asarray(member.params["loss"]["class_map"], np.float64)
        w = w / np.linalg.norm(w, axis=1, keepdims=True)
        logits.append(z @ w.T / temperature)
        losses.append(float(loss))
    return logits, losses


def accuracies(run: Run, state) -> np.ndarray:
    layout = run.program.layout
    states = [layout.member_state(state, i).method_state for i in range(layout.size)]
    return np.array([float(s[EXCHANGE_STATE]["accuracy"]) for s in states])


def test_two_steps_equal_numpy_with_the_state_carried(npz):
    """Step 1 is plain DML (every accuracy 1); step 2 weights the peers by the state step 1
    left, which equals the NumPy update."""
    run = Run(kl_config(npz, **{"exchange.mutual_kl.weight": 2.0}))
    step, state = run.make_train_step(), run.initial_state
    make = run.batch_maker()
    accuracy = np.ones(3)
    assert np.array_equal(accuracies(run, state), accuracy)
    for s in range(2):
        host = jax.tree.map(np.asarray, state)
        batch = {k: jnp.asarray(v) for k, v in make(s).items()}
        logits, losses = member_logits(run, host, batch)
        labels = np.asarray(batch["labels"])
        want, accuracy = numpy_kl(logits, accuracy, labels)
        state, metrics = step(state, batch)
        assert want.min() > 1e-4  # the members differ (their own heads)
        for i in range(3):
            np.testing.assert_allclose(metrics[f"member{i + 1}/kl"], want[i], rtol=2e-4)
            np.testing.assert_allclose(metrics[f"member{i + 1}/loss"], losses[i], rtol=1e-5)
        np.testing.assert_allclose(metrics["loss"], np.mean(np.add(losses, 2.0 * want)), rtol=1e-5)
        np.testing.assert_allclose(accuracies(run, state), accuracy, rtol=1e-6)
    assert len(set(np.round(accuracy, 6))) > 1  # the weights of step 2 were not all equal


@pytest.mark.slow
def test_the_term_trains_the_class_maps_towards_agreement(npz):
    def spread(weight: float) -> float:
        run = Run(kl_config(npz, **{"exchange.mutual_kl.weight": weight}))
        step, state = run.make_train_step(), run.initial_state
        make = run.batch_maker()
        for s in range(4):
            state, metrics = step(state, {k: jnp.asarray(v) for k, v in make(s).items()})
        return float(metrics["kl/loss"])

    assert spread(20.0) < 0.9 * spread(0.0)  # measured 4.27 against 5.01


def test_a_member_that_skips_its_update_keeps_its_state_and_params(npz):
    """The exchange's declared temporal diversity: at rate 1e-6 members 2 and 3 never apply
    their update, and their exchange state stays as it began."""
    run = Run(kl_config(npz, **{"exchange.mutual_kl.temporal_rate": 1e-6}))
    start = jax.tree.map(np.asarray, run.initial_state)
    state = run.make_train_step()(
        run.initial_state, {k: jnp.asarray(v) for k, v in run.batch_maker()(0).items()}
    )[0]
    got = accuracies(run, state)
    assert got[0] != 1.0 and got[1] == got[2] == 1.0
    after = jax.tree.map(np.asarray, state)
    for i, changed in ((0, True), (1, False), (2, False)):
        old = jax.tree.leaves(run.program.layout.member_state(start, i).params)
        new = jax.tree.leaves(run.program.layout.member_state(after, i).params)
        assert any(not np.array_equal(a, b) for a, b in zip(old, new, strict=True)) == changed, i


def test_a_heterogeneous_cohort_carries_the_state_per_member(npz):
    """Members of their own networks (``cohort.members``, listed storage): the same term."""
    run = Run(kl_config(npz, size=2, **{"cohort.members": ("", "model.embed_dim=8")}))
    assert run.program.heterogeneous
    state = run.make_train_step()(
        run.initial_state, {k: jnp.asarray(v) for k, v in run.batch_maker()(0).items()}
    )[0]
    got = accuracies(run, jax.tree.map(np.asarray, state))
    assert np.all((got >= 0.9) & (got <= 1.0)) and not np.array_equal(got, [1.0, 1.0])


@pytest.mark.slow
def test_it_trains_through_the_loop_and_its_state_is_checkpointed(npz, tmp_path):
    workdir = str(tmp_path / "run")
    summary = train_and_evaluate(kl_config(npz, **{"train.epochs": 1}), workdir)
    assert summary["train_step_compiles"] == 1
    rows = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["kind"] == "train"]
    assert rows and all(np.isfinite(rows[-1][k]) for k in ("kl/loss", "member3/kl"))
    run = Run(kl_config(npz, **{"train.epochs": 1}))
    restored = restore_latest(workdir, run)
    assert int(restored.step) > 0
    assert not np.array_equal(accuracies(run, restored), np.ones(3))


def test_the_plugin_imports_nothing_of_the_step_the_layout_or_the_program():
    with open(__file__) as f:
        tree = ast.parse(f.read())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert not imported & {"jdml.step", "jdml.cohort.layout", "jdml.program"}
