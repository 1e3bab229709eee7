"""Shared pytest fixtures."""

from __future__ import annotations

import os

# Four CPU devices for the sharded-cohort tests (set before JAX initialises its backend); the
# other tests place everything on the first device, as on a one-device machine.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()

# One persistent compilation cache for the whole session: the test processes (pytest-xdist's
# workers, which inherit this environment from the controller that set it first) and every
# command a test starts (train.py, eval.py, python -m jdml) compile a tiny configuration once and
# read it back afterwards, seconds instead of ~20 s each. Set JAX_COMPILATION_CACHE_DIR yourself
# to keep one across sessions, or to "" to compile everything afresh.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jdml-tests-jax-cache-")
    os.environ["JDML_TESTS_OWN_CACHE"] = os.environ["JAX_COMPILATION_CACHE_DIR"]
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# On a GPU several test processes share the card: each takes memory as it needs it instead of
# JAX's default of 75% of the card at start.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from pathlib import Path

import pytest

from jdml.data.arrays import ImageArrays


def pytest_unconfigure(config: pytest.Config) -> None:
    """Removes the session's compilation cache, in the process that made it (the controller)."""
    import shutil

    own = os.environ.get("JDML_TESTS_OWN_CACHE")
    ours = own and own == os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if ours and not hasattr(config, "workerinput"):
        shutil.rmtree(own, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips the tests marked ``gpu`` (accelerator-only paths) on the CPU backend, and those
    marked ``cpu`` (the CPU backend's own kernels: oneDNN, the native kNN and k-means) on an
    accelerator."""
    import jax

    on_cpu = jax.default_backend() == "cpu"
    skip = pytest.mark.skip(
        reason="accelerator-only path: the default JAX backend is the CPU"
        if on_cpu
        else "the CPU backend's own kernels: the default JAX backend is an accelerator"
    )
    for item in items:
        if item.get_closest_marker("gpu" if on_cpu else "cpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def glyph_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A glyphs cache (32 px) built once per test session; returns its folder."""
    from jdml.data.glyphs import load_glyph_table

    path = tmp_path_factory.mktemp("glyph-cache")
    load_glyph_table(32, path)
    return path


@pytest.fixture(scope="session")
def glyph_data(glyph_cache_dir: Path) -> ImageArrays:
    """The glyphs dataset at 32 px (default class order), read from the session cache."""
    from jdml.data.glyphs import load_glyphs

    return load_glyphs(32, glyph_cache_dir)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """kNN query blocks of exactly the ``block_size`` a test passes, so that the tests' small
    sets still span several blocks (outside tests, blocks grow while they hold few scores:
    ``jdml.evaluation.knn.blocks.BLOCK_SCORES``)."""
    from jdml.evaluation.knn import blocks

    monkeypatch.setattr(blocks, "BLOCK_SCORES", 1)


@pytest.fixture(params=["xla", "host", "native"])
def selection(request: pytest.FixtureRequest) -> str:
    """Runs a kNN test with the top-k taken by XLA, again with the host selection (the CPU path
    for most k, see ``jdml.evaluation.knn.search.select_on_host``), whatever the k, and with the
    native kernel (CPU): the ``selection`` the test passes to the search."""
    from tests.helpers import skip_off_cpu

    if request.param == "native":
        skip_off_cpu("the native kNN selection")
    return request.param
