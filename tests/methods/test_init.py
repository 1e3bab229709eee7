"""Method.init compiles the initialisers (``run_once``) and gives bitwise the params and batch
statistics that running them op by op gives, with every kind of params in the tree: the
network, the main loss's own (margin's beta), DiVA's terms and the decorrelation MLPs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.methods import method as method_module
from jdml.methods.method import Method
from tests.helpers import TINY_OVERRIDES, make_npz

SMALL = {
    "model.small_resnet.stage_features": (8,),
    "model.small_resnet.stage_blocks": (1,),
    "model.small_resnet.stage_strides": (2,),
}


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"), num_classes=4, per_class=4)


def _diva(npz_path: str):
    from configs.diva import get_config
    from jdml.config import set_keys

    c = get_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, **SMALL, "data.path": npz_path})
    set_keys(c, {"aux.selfsimilarity.queue_batches": 2, "decorrelation.hidden": 8})
    return c


def _margin(npz_path: str):
    from tests.helpers import tiny_config

    return tiny_config(npz_path, **SMALL)


@pytest.mark.parametrize("make", [_margin, _diva], ids=["margin", "diva"])
def test_compiled_init_equals_the_op_by_op_init(npz, make, monkeypatch):
    method = Method(make(npz), num_classes=4)
    images = jnp.asarray(np.random.default_rng(0).random((16, 16, 16, 1), np.float32))
    key = jax.random.PRNGKey(3)
    params, stats = method.init(key, images)
    monkeypatch.setattr(method_module, "run_once", lambda fn: fn)  # each op dispatched alone
    eager_params, eager_stats = method.init(key, images)
    assert jax.tree.structure(params) == jax.tree.structure(eager_params)
    assert {"model", "loss"} <= set(params)
    for got, want in zip(
        jax.tree.leaves((params, stats)), jax.tree.leaves((eager_params, eager_stats)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
