"""The backends a run computes with: one frozen value resolved once from the config's
``backends`` section, the environment and the JAX backend, passed down (the model, the
evaluator), so that changing the environment after the run has resolved it changes nothing; and
no primitive of the library reads the environment itself."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdml
from jdml.backends import Backends, resolve_backends
from jdml.config import (
    RESUMABLE_CHANGES,
    apply_overrides,
    base_config,
    flatten_config,
    incompatible_keys,
    saved_config,
    to_json,
    validate,
)
from jdml.embedder import Embedder
from jdml.errors import ConfigError
from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import knn
from jdml.methods.method import Method
from jdml.native import switches
from tests.helpers import make_npz, tiny_config

XLA_ONLY = {"JDML_CONV": "xla", "JDML_KNN": "xla", "JDML_KMEANS": "xla"}


def native_builds() -> bool:
    return switches._unavailable() is None


def test_the_switches_resolve_to_one_value() -> None:
    cpu = resolve_backends(environ=XLA_ONLY, platform="cpu")
    assert cpu == Backends("cpu", conv="xla", knn="auto", kmeans="xla")
    assert cpu.record() == {"platform": "cpu", "conv": "xla", "knn": "auto", "kmeans": "xla"}
    assert resolve_backends(environ={}, platform="gpu") == Backends("gpu", "xla", "xla", "xla")
    native = "onednn" if native_builds() else "xla"
    auto = resolve_backends(environ={}, platform="cpu")
    assert (auto.conv, auto.kmeans) == (native, native)
    assert auto.knn == ("native" if native_builds() else "auto")
    assert auto.portable() == Backends("cpu", "xla", "xla", "xla")


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_a_bad_switch_is_one_error_naming_it(platform: str) -> None:
    with pytest.raises(ConfigError, match=r"JDML_KNN='fast' is not one of auto, xla, onednn"):
        resolve_backends(environ={"JDML_KNN": "fast"}, platform=platform)


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
    whatever ``$JDML_KNN`` and ``$JDML_KMEANS`` say (an unknown value there is not read): only
    an entry given no backends resolves them, once."""
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
    knn(x, x, 5, exclude_self=True)  # none passed: "auto", the variable unread
    kmeans(x, 4, init="random")  # none passed: XLA's assignment
    with pytest.raises(ConfigError, match="JDML_KNN='fast'"):
        evaluate_embeddings(x, np.arange(200) % 4, ["recall@1"])  # the entry resolves, once


# -- the config's ``backends`` section ------------------------------------------------------------


def test_the_config_key_chooses_the_backend_and_auto_defers_to_the_variable() -> None:
    """``--config.backends.conv=xla`` gives XLA's convolutions with ``$JDML_CONV`` unset;
    ``auto`` takes the variable where it is set; a config value wins over the variable."""
    c = apply_overrides(base_config(), ["backends.conv=xla", "backends.knn=host"])
    validate(c)
    chosen = resolve_backends(c.backends, environ={}, platform="cpu")
    assert (chosen.conv, chosen.knn) == ("xla", "host")
    assert Embedder(c).native_conv is False  # what the model is built with
    auto = base_config().backends
    assert resolve_backends(auto, environ={"JDML_CONV": "xla"}, platform="cpu").conv == "xla"
    assert resolve_backends(auto, environ=XLA_ONLY, platform="cpu") == resolve_backends(
        environ=XLA_ONLY, platform="cpu"
    )
    over = resolve_backends(
        {"conv": "xla", "knn": "xla", "kmeans": "xla"},
        environ={"JDML_CONV": "onednn", "JDML_KNN": "onednn", "JDML_KMEANS": "onednn"},
        platform="cpu",
    )
    assert over == Backends("cpu", "xla", "xla", "xla")
    assert resolve_backends({"conv": "onednn"}, environ={}, platform="gpu").conv == "xla"
    if native_builds():
        wins = resolve_backends(
            {"conv": "onednn", "knn": "native", "kmeans": "onednn"},
            environ=XLA_ONLY,
            platform="cpu",
        )
        assert wins == Backends("cpu", "onednn", "native", "onednn")


def test_a_required_native_kernel_that_cannot_build_names_the_config_key(monkeypatch) -> None:
    monkeypatch.setattr(switches, "_unavailable", lambda: "no C++ compiler 'c++' on PATH")
    with pytest.raises(ConfigError, match=r"backends\.kmeans=onednn but no C\+\+ compiler"):
        resolve_backends({"conv": "xla", "knn": "host", "kmeans": "onednn"}, platform="cpu")
    with pytest.raises(ConfigError, match=r"or set backends\.knn=auto"):
        resolve_backends({"conv": "xla", "knn": "native", "kmeans": "xla"}, platform="cpu")


@pytest.mark.parametrize(
    ("key", "choices"),
    [("conv", "auto, xla, onednn"), ("knn", "auto, native, host, xla"), ("kmeans", "auto, xla")],
)
def test_a_bad_value_is_one_config_error_naming_the_key_and_the_choices(key, choices) -> None:
    c = apply_overrides(base_config(), [f"backends.{key}=cudnn"])
    with pytest.raises(ConfigError, match=rf"backends\.{key}='cudnn'; choose one of {choices}"):
        validate(c)
    with pytest.raises(ConfigError, match=rf"backends\.{key}='cudnn'"):
        resolve_backends(c.backends, environ={}, platform="cpu")


def test_a_config_json_without_backends_loads_resumes_and_keeps_its_study_digest() -> None:
    """A run's config.json written before the section existed loads with every key ``auto``,
    resumes under a config that sets them, and the study digest skips them (existing study
    records keep their digest)."""
    from jdml.study.runner import config_digest

    old = json.loads(to_json(base_config()))
    del old["backends"]
    loaded = saved_config(json.dumps(old))
    assert loaded.backends.to_dict() == {"conv": "auto", "knn": "auto", "kmeans": "auto"}
    validate(loaded)
    new = json.loads(to_json(base_config()))
    defaults = flatten_config(new)
    assert incompatible_keys(old, new, defaults=defaults) == []
    new["backends"].update(conv="xla", knn="host", kmeans="onednn")
    assert incompatible_keys(old, new, defaults=defaults) == []  # another backend resumes
    assert {f"backends.{k}" for k in ("conv", "knn", "kmeans")} <= set(RESUMABLE_CHANGES)
    c = base_config()
    digest = config_digest(c)
    c.backends.conv = "xla"
    assert config_digest(c) == digest
    without = base_config()
    with without.unlocked():
        del without["backends"]
    assert config_digest(without) == digest


# -- no primitive reads the environment -----------------------------------------------------------

#: The modules that may read the switches: the resolver and the switches themselves.
READERS = {"jdml/backends.py", "jdml/native/switches.py"}
#: The variables of the switches, and the functions that read them.
VARIABLES = {"JDML_CONV", "JDML_KNN", "JDML_KMEANS"}
SWITCH_READERS = {"onednn_enabled", "conv_mode", "knn_selection", "ENV", "KNN_ENV", "KMEANS_ENV"}
SWITCH_MODULES = {"jdml.native.switches", "jdml.backends"}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module's, classes' and functions' bodies."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            out.add(id(first.value))
    return out


def _switch_reads(path: Path) -> list[str]:
    """Where ``path`` names a switch's variable in code, or uses what reads one."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docs:
            if isinstance(node.value, str) and any(v in node.value for v in VARIABLES):
                found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module in SWITCH_MODULES:
            names = {a.name for a in node.names} & SWITCH_READERS
            found += [f"{node.lineno}: imports {n}" for n in sorted(names)]
        elif isinstance(node, ast.Attribute) and node.attr in SWITCH_READERS:
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("switches", "backends"):
                found.append(f"{node.lineno}: {owner.id}.{node.attr}")
    return found


def test_only_the_resolver_reads_the_switches() -> None:
    """No module of ``jdml`` but :mod:`jdml.backends` and :mod:`jdml.native.switches` names
    ``$JDML_CONV``, ``$JDML_KNN`` or ``$JDML_KMEANS`` in code (docstrings and comments may), or
    calls what reads them: the primitives take ``native`` / ``selection`` from the caller."""
    root = Path(jdml.__file__).parent
    offenders = {}
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent).as_posix()
        if name not in READERS and (reads := _switch_reads(path)):
            offenders[name] = reads
    assert not offenders, offenders
    assert _switch_reads(root / "backends.py")  # the check sees the reader it allows
