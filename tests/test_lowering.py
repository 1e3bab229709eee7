"""Every method's train step, and the evaluator's kNN and k-means, lower for GPUs and TPUs on
this CPU (``jax.export``; :mod:`jdml.lowering`).

Under :func:`jdml.platform.lowering_for`, jdml takes the accelerator's branch of every platform
choice, so what is traced here is what a GPU or TPU would compile. A CPU-only custom call (the
oneDNN kernels), a host callback or an op without a lowering on the platform fails the export;
the first test shows that it does. ``PROGRAMS`` lists what is lowered, with the platforms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.config import set_keys
from jdml.lowering import export_for, export_train_step
from jdml.platform import lowering_for, platform
from tests import benchmark_trees as trees
from tests.helpers import TINY_OVERRIDES, make_npz, photo_config, tiny_config

ACCELERATORS = ("cuda", "tpu")
# A two-block ViT small enough to build in a second (vit's own shape keys).
TINY_VIT = {
    "model.backbone": "vit",
    "model.vit.patch": 4,
    "model.vit.dim": 16,
    "model.vit.depth": 2,
    "model.vit.heads": 2,
}
RESNET50_BF16 = {"model.backbone": "resnet50", "model.dtype": "bfloat16", "data.image_size": 32}
# cuDNN's fused attention, forward and backward: custom calls of the GPU's library, which
# jax.export accepts only when named (no compatibility guarantee across jaxlib versions).
CUDNN_ATTENTION = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")
COHORT = {"cohort.size": 2, "exchange.dm2.warmup_epochs": 0.0}


def _diva(npz: str, **overrides: object):
    from configs.diva import get_config

    c = get_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz})
    set_keys(c, {"aux.selfsimilarity.queue_batches": 2, "decorrelation.hidden": 8, **overrides})
    return c


def _sharing(npz: str, **overrides: object):
    from configs.sharing import get_config

    c = get_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz, **overrides})
    return c


def _photos(root: Path, cache: Path):
    """A run on CUB-format photo files whose views are made on the device."""
    return photo_config(
        root, **{"data.decode_cache": True, "data.cache_dir": str(cache), "data.views": "device"}
    )


#: Each program: how its config is made from the fixtures, and the platforms it is lowered for.
PROGRAMS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "plain, ResNet-50, bfloat16": (
        lambda d: tiny_config(d.npz, **RESNET50_BF16),
        ACCELERATORS,
    ),
    "DiVA": (lambda d: _diva(d.npz), ACCELERATORS),
    "Sharing Matters": (lambda d: _sharing(d.npz), ACCELERATORS),
    "DM2, stacked on 2 devices": (
        lambda d: tiny_config(d.npz, **COHORT, **{"cohort.devices": 2}),
        ACCELERATORS,
    ),
    "DM2, listed, a ResNet and a ViT": (
        lambda d: tiny_config(
            d.npz,
            **COHORT,
            **{
                "cohort.members": ("", ";".join(f"{k}={v}" for k, v in TINY_VIT.items())),
                "parallel.data_devices": 2,
            },
        ),
        ACCELERATORS,
    ),
    "ViT, attention xla": (lambda d: tiny_config(d.npz, **TINY_VIT), ACCELERATORS),
    "ViT, attention cudnn, bfloat16": (
        lambda d: tiny_config(
            d.npz, **TINY_VIT, **{"model.vit.attention": "cudnn", "model.dtype": "bfloat16"}
        ),
        ("cuda",),
    ),
    "device views": (lambda d: _photos(*d.cub), ACCELERATORS),
}


class Data:
    """The fixtures' files: a tiny npz and a CUB-format photo tree."""

    def __init__(self, folder: Path) -> None:
        self.npz = make_npz(str(folder / "tiny.npz"))
        root = trees.write_cub(folder / "cub", class_ids=tuple(range(97, 105)), per_class=4)
        self.cub = (root, folder / "decoded")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Data:
    return Data(tmp_path_factory.mktemp("lowering"))


def test_lowering_for_names_the_accelerators_backend_and_refuses_unknown_names() -> None:
    with lowering_for("cuda") as backend:
        assert backend == platform() == "gpu"
        with lowering_for("tpu"):
            assert platform() == "tpu"
        assert platform() == "gpu"
    assert platform() == jax.default_backend()
    with pytest.raises(ValueError, match="unknown platform 'gpu0'"), lowering_for("gpu0"):
        pass


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the native kernels are CPU's")
def test_a_cpu_only_custom_call_fails_the_lowering() -> None:
    """The check can fail: oneDNN's matrix product (a CPU custom call) does not lower for a GPU
    or a TPU, while XLA's product does."""
    from jdml.nn.matmul import onednn_matmul

    a = jnp.ones((4, 3), jnp.float32)
    for target in ACCELERATORS:
        with pytest.raises(ValueError, match="jdml_dnnl_matmul"):
            export_for(target, jax.jit(onednn_matmul), a, a.T)
        assert export_for(target, jax.jit(jnp.matmul), a, a.T).platforms == (target,)


@pytest.mark.slow  # 35 s of CPU in all: CI's second part (docs/development.md)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_train_step_lowers_for_the_accelerators(
    name: str, data: Data, monkeypatch: pytest.MonkeyPatch
) -> None:
    make, targets = PROGRAMS[name]
    allow = ()
    if "cudnn" in name:
        # JAX asks the installed cuDNN for its version when it traces the fused attention; a
        # CPU install has none: cuDNN 9.1 stands in (the version only selects among layouts).
        from jax._src.cudnn import fused_attention_stablehlo

        monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91000)
        allow = CUDNN_ATTENTION
    exported = export_train_step(make(data), targets, allow)
    assert list(exported) == list(targets)
    for target, program in exported.items():
        assert program.platforms == (target,)
        assert "jdml_" not in program.mlir_module()  # no native kernel on the path


class Recorder:
    """Records the first call of jitted functions (module attributes) and lets them run; a
    factory's (``factories``) programs are recorded under the factory's name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, functions: dict, factories: dict) -> None:
        self.calls: dict[str, tuple[Callable, tuple, dict]] = {}
        for name, module in functions.items():
            monkeypatch.setattr(module, name, self._recording(name, getattr(module, name)))
        for name, module in factories.items():
            make = getattr(module, name)
            monkeypatch.setattr(
                module, name, lambda *a, _n=name, _m=make, **k: self._recording(_n, _m(*a, **k))
            )

    def _recording(self, name: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            self.calls.setdefault(name, (fn, args, kwargs))
            return fn(*args, **kwargs)

        return call


@pytest.mark.slow
def test_the_evaluators_knn_and_kmeans_lower_for_the_accelerators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The programs the accelerators' kNN search and k-means run, on one device and split over
    two (every jitted function on their path, recorded on a small call made as on a GPU),
    lowered for each accelerator."""
    from jdml.backends import resolve_backends
    from jdml.evaluation import sharded
    from jdml.evaluation.kmeans import cluster, reference
    from jdml.evaluation.knn import ranking, search, xla

    rng = np.random.default_rng(0)
    points = np.asarray(rng.normal(size=(96, 8)), np.float32)
    functions = {
        "_knn_block": xla,
        "augmented_references": xla,
        "_full_ranking_block": ranking,
        "jitted_kmeans": cluster,
        "_reference_updates": reference,
    }
    factories = {"_knn_program": sharded, "_kmeans_program": sharded}
    recorder = Recorder(monkeypatch, functions, factories)
    mesh = sharded.eval_mesh(2)
    with lowering_for("cuda"):
        backends = resolve_backends(None)
        assert (backends.knn, backends.kmeans) == ("xla", "xla")
        on_device = jnp.asarray(points)
        search.knn(on_device, on_device, 5, exclude_self=True, selection=backends.knn)
        list(
            ranking.full_ranking_blocks(
                on_device, jnp.arange(96) % 6, 5, distance="euclidean", selection=backends.knn
            )
        )
        for init in ("k-means++", "reference"):
            cluster.kmeans(on_device, 4, init=init, native=backends.native_kmeans)
        sharded.sharded_knn(points, points, 5, mesh=mesh, exclude_self=True)
        sharded.sharded_kmeans(points, 4, mesh=mesh, native=backends.native_kmeans)
    missing = (set(functions) | set(factories)) - set(recorder.calls)
    assert not missing, f"not called on the accelerators' path: {missing}; update the lists"
    for name, (fn, args, kwargs) in recorder.calls.items():
        for target in ACCELERATORS:
            exported = export_for(target, fn, *args, **kwargs)
            assert exported.platforms == (target,), name
