"""The example of docs/own_loop.md ("Losses and miners in your own loop") runs as printed, and the
functional API refuses what it does not know."""

from __future__ import annotations

import math
import os
import re

import pytest

from jdml.errors import UnknownNameError
from tests.helpers import REPO

PAGE = "docs/own_loop.md"  # the documentation page of the own-loop API


def _example() -> str:
    """The page's first Python block, as a user copies it."""
    with open(os.path.join(REPO, PAGE)) as f:
        text = f.read()
    section = text.split("# Losses and miners in your own loop", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.smoke
def test_the_documented_example_trains_a_user_model(capsys):
    namespace: dict = {}
    exec(compile(_example(), PAGE, "exec"), namespace)  # the page of this repository
    losses = namespace["losses"]
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0]
    assert "margin loss" in capsys.readouterr().out


def test_unknown_names_hyperparameters_and_values_are_refused():
    import jdml.losses
    import jdml.miners

    with pytest.raises(UnknownNameError, match="margin"):
        jdml.losses.get("margn")
    with pytest.raises(TypeError, match=r"takes no \['margn'\].*'margin'"):
        jdml.losses.get("margin", num_classes=4, margn=0.1)
    with pytest.raises(ValueError, match=r"margin=-1\.0"):
        jdml.losses.get("margin", num_classes=4, margin=-1.0)
    with pytest.raises(TypeError, match="miner 'distance'"):
        jdml.miners.get("distance", cutoff=0.5)
    assert jdml.losses.get("triplet", margin=0.3).margin == 0.3


# The mistakes a caller makes with the arrays, each refused in one error naming the argument and
# the shape or values expected: (embeddings, labels) made from a good (32, 16) batch of 8 classes.
MISTAKES = {
    "float labels": (lambda e, y: (e, y.astype("float32")), TypeError, "labels must be integer"),
    "1-D embeddings": (
        lambda e, y: (e[:, 0], y),
        ValueError,
        r"embeddings must have shape \(B, D\)",
    ),
    "3-D embeddings": (lambda e, y: (e[None], y), ValueError, r"got shape \(1, 32, 16\)"),
    "labels (B, 1)": (lambda e, y: (e, y[:, None]), ValueError, r"labels must have shape \(32,\)"),
    "30 labels": (lambda e, y: (e, y[:30]), ValueError, r"shape \(32,\).*got shape \(30,\)"),
    "integer embeddings": (lambda e, y: (e.astype("int32"), y), TypeError, "floating point"),
}
CLASS_MISTAKES = {
    "labels 8..15": (8, r"\[0, 8\).*from 8 to 15"),
    "labels -1..6": (-1, r"\[0, 8\).*from -1 to 6"),
}


@pytest.fixture(scope="module")
def batch():
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jdml.losses
    import jdml.miners

    loss = jdml.losses.get("margin", num_classes=8, margin=0.2, beta=1.2)
    miner = jdml.miners.get("distance", lower_cutoff=0.5, upper_cutoff=1.4)
    rng = np.random.default_rng(0)
    labels = jnp.asarray(np.repeat(np.arange(8), 4))
    e = jnp.asarray(rng.normal(size=(32, 16)), jnp.float32)
    e = e / jnp.linalg.norm(e, axis=-1, keepdims=True)
    key = jax.random.key(0)
    tuples = miner(key, e, labels)
    return loss, miner, loss.init(key, e, labels, tuples), e, labels, tuples, key


@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_the_loss_and_the_miner_refuse_wrong_arrays(batch, mistake: str, jitted: bool) -> None:
    """Each mistake is one error at trace time, eagerly and under ``jax.jit`` alike, from the
    loss and from the miner (the miner takes no tuples)."""
    import jax

    loss, miner, params, e, labels, tuples, key = batch
    make, error, message = MISTAKES[mistake]
    bad_e, bad_labels = make(e, labels)

    def apply(p, x, y, t):
        return loss.apply(p, x, y, t)

    def mine(k, x, y):
        return miner(k, x, y)

    if jitted:
        apply, mine = jax.jit(apply), jax.jit(mine)
    with pytest.raises(error, match=f"loss 'margin': .*{message}"):
        apply(params, bad_e, bad_labels, tuples)
    with pytest.raises(error, match=f"miner 'distance': .*{message}"):
        mine(key, bad_e, bad_labels)


@pytest.mark.parametrize("mistake", sorted(CLASS_MISTAKES))
def test_labels_outside_the_classes_are_refused(batch, mistake: str) -> None:
    """A loss with a parameter per class refuses labels outside [0, num_classes): at once where
    the labels are concrete (``init``, eager calls), and under ``checkify`` inside ``jit``."""
    import jax
    from jax.experimental import checkify

    loss, _, params, e, labels, tuples, key = batch
    shift, message = CLASS_MISTAKES[mistake]
    bad = labels + shift
    with pytest.raises(ValueError, match=f"loss 'margin': labels must be class ids in {message}"):
        loss.init(key, e, bad, tuples)
    with pytest.raises(ValueError, match=message):
        loss.apply(params, e, bad, tuples)
    checked = checkify.checkify(jax.jit(lambda p, x, y, t: loss.apply(p, x, y, t)))
    error, _ = checked(params, e, bad, tuples)
    with pytest.raises(checkify.JaxRuntimeError, match=message):
        error.throw()
    error, _ = checked(params, e, labels, tuples)
    assert error.get() is None


def test_malformed_tuples_are_refused(batch) -> None:
    loss, _, params, e, labels, tuples, _ = batch
    with pytest.raises(TypeError, match=r"jdml\.miners\.Tuples"):
        loss.apply(params, e, labels, (tuples.anchors, tuples.positives))
    short = tuples._replace(valid=tuples.valid[:-1])
    with pytest.raises(ValueError, match="1-D of one length"):
        loss.apply(params, e, labels, short)


def test_a_script_with_float_labels_ends_in_the_error(tmp_path) -> None:
    """The documented block with float labels, run as a user's script: it exits non-zero and its
    last line is the error naming the argument."""
    import subprocess
    import sys

    script = _example().replace(
        "labels = jnp.asarray(np.repeat(np.arange(8), 4))",
        "labels = jnp.asarray(np.repeat(np.arange(8), 4), jnp.float32)",
    )
    assert "jnp.float32)" in script.split("labels = ", 1)[1].splitlines()[0]
    path = tmp_path / "user.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("TypeError: miner 'distance': labels must be integer class ids"), last


def test_tuples_mined_on_another_batch_are_refused(batch) -> None:
    """Tuples index rows of the batch they were mined on: used with a smaller batch they are
    refused where they are concrete, naming the rows and the batch."""
    loss, miner, params, e, labels, tuples, key = batch
    with pytest.raises(ValueError, match=r"index rows 0 to 31, but the batch has 16 rows"):
        loss.apply(params, e[:16], labels[:16], tuples)
    loss.apply(params, e[:16], labels[:16], miner(key, e[:16], labels[:16]))


def test_an_empty_batch_is_refused(batch) -> None:
    import jax

    loss, miner, params, e, labels, tuples, key = batch
    with pytest.raises(ValueError, match="loss 'margin': the batch is empty"):
        jax.jit(lambda p, x, y, t: loss.apply(p, x, y, t))(params, e[:0], labels[:0], tuples)
    with pytest.raises(ValueError, match="miner 'distance': the batch is empty"):
        miner(key, e[:0], labels[:0])


@pytest.mark.parametrize("transform", ["jit", "vmap"])
def test_labels_outside_the_classes_make_a_traced_loss_nan(batch, transform: str) -> None:
    """Under plain ``jit`` (and ``vmap``) an out-of-range label is never read at a clamped
    parameter row: the loss and its gradients are NaN, which a non-finite guard reports."""
    import jax
    import jax.numpy as jnp

    loss, _, params, e, labels, tuples, _ = batch

    def value(p, x, y):
        return loss.apply(p, x, y, tuples)[0]

    grad = jax.value_and_grad(value, argnums=(0, 1))  # the loss's and the network's
    if transform == "jit":
        fn = jax.jit(grad)
    else:
        fn = jax.vmap(grad, in_axes=(None, 0, 0))
        e, labels = e[None], labels[None]
    good, grads = fn(params, e, labels)
    assert bool(jnp.all(jnp.isfinite(good)))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    bad, grads = fn(params, e, labels.at[..., 0].set(8))
    assert bool(jnp.all(jnp.isnan(bad)))
    assert bool(jnp.all(jnp.isnan(grads[1])))  # every embedding's gradient


def _tuple_losses() -> list[str]:
    import jdml.losses

    return [n for n in jdml.losses.LOSSES.names() if jdml.losses.LOSSES.get(n).needs_miner]


@pytest.mark.parametrize("name", _tuple_losses())
def test_tuples_of_another_batch_make_a_traced_loss_nan(batch, name: str) -> None:
    """Under ``jax.jit`` tuples mined on 32 rows and used on 16 (indices past the batch) are never
    read at a clamped row: every loss that takes tuples gives a NaN value and NaN gradients into
    the network, and ``checkify`` names the rows; tuples of this batch stay finite."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import checkify

    import jdml.losses
    import jdml.miners

    _, _, _, e, labels, _, key = batch
    cls = jdml.losses.LOSSES.get(name)
    per_class = {"num_classes": 8} if "num_classes" in cls.__dataclass_fields__ else {}
    loss = jdml.losses.get(name, **per_class)
    miner = jdml.miners.get(cls.reference_miner)
    other = miner(key, e, labels)  # mined on all 32 rows
    own = miner(key, e[:16], labels[:16])
    params = loss.init(key, e[:16], labels[:16], own)
    step = jax.jit(jax.value_and_grad(lambda x, t: loss.apply(params, x, labels[:16], t)[0]))
    value, grad = step(e[:16], own)
    assert bool(jnp.isfinite(value)) and bool(jnp.all(jnp.isfinite(grad)))
    value, grad = step(e[:16], other)
    assert bool(jnp.isnan(value)) and bool(jnp.all(jnp.isnan(grad)))
    error, _ = checkify.checkify(jax.jit(lambda x, t: loss.apply(params, x, labels[:16], t)))(
        e[:16], other
    )
    with pytest.raises(checkify.JaxRuntimeError, match=r"but the batch has 16 rows"):
        error.throw()


def _integer_hyperparameters() -> list[tuple[str, str]]:
    import dataclasses

    import jdml.losses

    return [
        (name, f.name)
        for name in jdml.losses.LOSSES.names()
        for f in dataclasses.fields(jdml.losses.LOSSES.get(name))
        if f.type in (int, "int")
    ]


@pytest.mark.parametrize(("name", "key"), _integer_hyperparameters())
@pytest.mark.parametrize("value", [2.5, True, 0])
def test_integer_hyperparameters_are_refused_at_get(name: str, key: str, value: object) -> None:
    """``num_classes`` of every class-map loss and every other integer hyperparameter
    (``sub_centers``, ``n_centroids``, ``num_bins``) must be an integer count: 2.5, True and 0
    are refused at ``get`` instead of crashing inside JAX at ``init``; a NumPy integer is taken
    as Python's."""
    import numpy as np

    import jdml.losses

    cls = jdml.losses.LOSSES.get(name)
    hparams = {"num_classes": 4} if "num_classes" in cls.__dataclass_fields__ else {}
    hparams[key] = value
    message = {2.5: "must be an integer", True: "must be a number", 0: "must be at least"}[value]
    assert getattr(jdml.losses.get(name, **{**hparams, key: 4}), key) == 4  # a count is accepted
    assert type(getattr(jdml.losses.get(name, **{**hparams, key: np.int64(4)}), key)) is int
    with pytest.raises(ValueError, match=rf"loss '{name}': {key}={value!r} {message}"):
        jdml.losses.get(name, **hparams)


def test_a_switch_must_be_true_or_false() -> None:
    import jdml.losses

    with pytest.raises(ValueError, match=r"loss 'ntxent': slot_pairs=1 must be True or False"):
        jdml.losses.get("ntxent", slot_pairs=1)
    assert jdml.losses.get("ntxent", slot_pairs=True).slot_pairs is True
