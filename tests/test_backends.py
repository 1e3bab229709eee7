"""The backends a run computes with: one frozen value resolved once from the environment and
the JAX backend, passed down (the model, the evaluator), so that changing the environment after
the run has resolved it changes nothing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.backends import Backends, resolve_backends
from jdml.errors import ConfigError
from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import knn
from jdml.methods.method import Method
from jdml.native import switches
from tests.helpers import make_npz, tiny_config

XLA_ONLY = {"JDML_CONV": "xla", "JDML_KNN": "xla", "JDML_KMEANS": "xla"}


def native_builds() -> bool:
    return switches._unavailable() is None


def test_the_switches_resolve_to_one_value() -> None:
    cpu = resolve_backends(XLA_ONLY, "cpu")
    assert cpu == Backends("cpu", conv="xla", knn="auto", kmeans="xla")
    assert cpu.record() == {"platform": "cpu", "conv": "xla", "knn": "auto", "kmeans": "xla"}
    assert resolve_backends({}, "gpu") == Backends("gpu", "xla", "xla", "xla")
    native = "onednn" if native_builds() else "xla"
    auto = resolve_backends({}, "cpu")
    assert (auto.conv, auto.kmeans) == (native, native)
    assert auto.knn == ("native" if native_builds() else "auto")
    assert auto.portable() == Backends("cpu", "xla", "xla", "xla")


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_a_bad_switch_is_one_error_naming_it(platform: str) -> None:
    with pytest.raises(ConfigError, match=r"JDML_KNN='fast' is not one of auto, xla, onednn"):
        resolve_backends({"JDML_KNN": "fast"}, platform)


def test_a_backends_value_refuses_unknown_choices() -> None:
    with pytest.raises(ValueError, match="each is 'onednn' or 'xla'"):
        Backends("cpu", conv="cudnn", knn="auto", kmeans="xla")
    with pytest.raises(ValueError, match="choose one of"):
        Backends("cpu", conv="xla", knn="faiss", kmeans="xla")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return tiny_config(make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz")))


def _custom_calls(method: Method) -> int:
    images = jnp.zeros((2, 16, 16, 1), jnp.float32)
    params, stats = method.init(jax.random.PRNGKey(0), images)
    hlo = jax.jit(method.embed).lower(params, stats, images).as_text()
    return hlo.count("jdml_dnnl")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the native kernels are CPU's")
def test_the_model_computes_with_the_backends_it_was_given_whatever_the_environment(
    config, monkeypatch
) -> None:
    """A method given XLA's convolutions traces none of oneDNN's even with ``$JDML_CONV=onednn``
    set afterwards, and one given oneDNN's traces them with ``$JDML_CONV=xla`` set."""
    if not native_builds():
        pytest.skip("the native library does not build here")
    xla = Method(config, num_classes=6, backends=Backends("cpu", "xla", "auto", "xla"))
    onednn = Method(config, num_classes=6, backends=Backends("cpu", "onednn", "auto", "xla"))
    monkeypatch.setenv("JDML_CONV", "onednn")
    assert _custom_calls(xla) == 0
    monkeypatch.setenv("JDML_CONV", "xla")
    assert _custom_calls(onednn) > 0


def test_the_evaluator_takes_the_selection_and_the_assignment_it_is_given(monkeypatch) -> None:
    """Every kNN selection and both k-means assignments give the same neighbours and clusters,
    whatever ``$JDML_KNN`` and ``$JDML_KMEANS`` say (an unknown value there is not read)."""
    monkeypatch.setenv("JDML_KNN", "fast")
    monkeypatch.setenv("JDML_KMEANS", "fast")
    x = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)
    selections = ["auto", "host", "xla"] + (["native"] if native_builds() else [])
    found = [knn(x, x, 5, exclude_self=True, selection=s)[1] for s in selections]
    for other in found[1:]:
        np.testing.assert_array_equal(other, found[0])
    natives = [False] + ([True] if native_builds() else [])
    clusters = [kmeans(x, 4, init="random", native=n).assignments for n in natives]
    for other in clusters[1:]:
        np.testing.assert_array_equal(np.asarray(other), np.asarray(clusters[0]))
    with pytest.raises(ConfigError, match="JDML_KNN='fast'"):
        knn(x, x, 5, exclude_self=True)  # none passed: the environment's, checked
