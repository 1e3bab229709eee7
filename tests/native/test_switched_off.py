"""With the native kernels switched off (``JDML_CONV=JDML_KNN=JDML_KMEANS=xla``, which an entry
given no backends resolves once, or not asked for: the primitives' default) nothing crosses the
native boundary (``jdml.native``): the evaluation and the convolutions of the models run on
XLA's ops alone, on host and device arrays, and give the native path's results (up to float32
rounding)."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import make_blobs

from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import knn
from jdml.native import conv as native_conv
from jdml.native import kmeans as native_kmeans
from jdml.native import knn as native_knn
from jdml.native import switches
from jdml.nn.conv import conv2d
from jdml.nn.depthwise import depthwise_conv2d

METRICS = ["recall@1", "recall@4", "map@r", "map@c", "map", "nmi", "f1"]
SWITCHES = (switches.ENV, switches.KNN_ENV, switches.KMEANS_ENV)


@pytest.fixture
def boundary_closed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every switch at ``xla``, and every function of the boundary's wrappers replaced by one
    that records its name; returns the names called."""
    for env in SWITCHES:
        monkeypatch.setenv(env, "xla")
    called: list[str] = []
    for module in (native_conv, native_knn, native_kmeans):
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == module.__name__:

                def record(*args, _name=f"{module.__name__}.{name}", **kwargs):
                    called.append(_name)
                    raise AssertionError(f"{_name} called with the native kernels off")

                monkeypatch.setattr(module, name, record)
    return called


def blobs() -> tuple[np.ndarray, np.ndarray]:
    x, y = make_blobs(n_samples=600, n_features=24, centers=12, random_state=3)
    return x.astype(np.float32), y


@pytest.mark.parametrize("init", ["k-means++", "random", "reference"])
def test_evaluation_never_calls_the_native_boundary(
    boundary_closed: list[str], monkeypatch: pytest.MonkeyPatch, init: str
) -> None:
    """The evaluator's metrics with the native kernels off: no boundary call, on host and on
    device embeddings, and the values of the default (native where it builds) path."""
    x, y = blobs()
    off = evaluate_embeddings(x, y, METRICS, kmeans_init=init)
    off_device = evaluate_embeddings(jnp.asarray(x), y, METRICS, kmeans_init=init)
    assert boundary_closed == []
    monkeypatch.undo()  # the switches and the boundary as the process has them
    on = evaluate_embeddings(x, y, METRICS, kmeans_init=init)
    for name in METRICS:
        assert off[name] == pytest.approx(on[name], abs=1e-6), name
        assert off_device[name] == pytest.approx(on[name], abs=1e-6), name


def test_knn_and_kmeans_never_call_the_native_boundary(boundary_closed: list[str]) -> None:
    """The public kNN and k-means with the native kernels off, host (NumPy) arrays in:
    NumPy arrays out, as with the native path, from XLA's ops."""
    x, _ = blobs()
    distances, indices = knn(x, x, 5, exclude_self=True)
    result = kmeans(x, 12, init="random", seed=0)
    assert boundary_closed == []
    assert isinstance(distances, np.ndarray) and isinstance(result.assignments, np.ndarray)
    want = np.argsort(((x[:, None] - x[None]) ** 2).sum(-1) + np.diag(np.full(len(x), np.inf)), 1)
    np.testing.assert_array_equal(indices[:, 0], want[:, 0])


def test_convolutions_never_call_the_native_boundary(boundary_closed: list[str]) -> None:
    """A dense, a 1x1 and a depthwise convolution, forward and both gradients, not asked for
    oneDNN's (``native=False``, the default): XLA's ops only."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 8, 8, 8)), jnp.float32)
    dense = jnp.asarray(rng.normal(size=(3, 3, 8, 4)), jnp.float32)
    pointwise = jnp.asarray(rng.normal(size=(1, 1, 8, 4)), jnp.float32)
    depthwise = jnp.asarray(rng.normal(size=(3, 3, 1, 8)), jnp.float32)

    def loss(x, dense, pointwise, depthwise):
        y = conv2d(x, dense) + conv2d(x, pointwise, 1)
        return jnp.sum(y**2) + jnp.sum(depthwise_conv2d(x, depthwise, 2) ** 2)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    value, grads = step(x, dense, pointwise, depthwise)
    assert boundary_closed == []
    assert "custom_call" not in step.lower(x, dense, pointwise, depthwise).as_text()
    assert np.isfinite(float(value)) and all(np.all(np.isfinite(g)) for g in grads)
