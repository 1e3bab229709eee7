"""jdml.native: the oneDNN library is compiled once per machine and safely by concurrent
processes, a failed build falls back to XLA with one warning (or is an error with
JDML_CONV=onednn or backends.conv=onednn), a wrong JDML_CONV is a ConfigError, and the
model-FLOP count of the custom calls is that of the XLA convolutions they replace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jdml.errors import ConfigError
from jdml.native import build, switches
from jdml.nn.conv import conv2d
from jdml.nn.depthwise import depthwise_conv2d
from jdml.nn.padding import same_padding
from jdml.throughput import model_flops

pytestmark = pytest.mark.cpu  # the CPU backend's native kernels

# A fresh process: convolves, prints which convolution the program used and the library path.
PROBE = """
import sys, warnings, jax, jax.numpy as jnp
warnings.simplefilter("always")
from jdml.backends import resolve_backends
from jdml.native import build
from jdml.nn.conv import conv2d
x, k = jnp.ones((2, 8, 8, 16)), jnp.ones((3, 3, 16, 4))
section = {"knn": "host", "kmeans": "xla", "conv": (sys.argv[1:] or ["auto"])[0]}
native = resolve_backends(section).native_conv  # only the convolutions' switch may warn
f = jax.jit(jax.value_and_grad(lambda x, k: jnp.sum(conv2d(x, k, 1, native)), argnums=(0, 1)))
uses = "jdml_dnnl_conv_fwd" in f.lower(x, k).as_text()
value = float(f(x, k)[0])
print("onednn" if uses else "xla", value, build.library_path())
"""


def probe(tmp_path: Path, *conv: str, **env: str) -> subprocess.CompletedProcess:
    """:data:`PROBE` in a fresh process with ``env``, given ``backends.conv`` (if ``conv``)."""
    full = {**os.environ, "JDML_CACHE": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-c", PROBE, *conv], env=full, capture_output=True, text=True, timeout=300
    )


def test_a_wrong_mode_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JDML_CONV", "fast")
    with pytest.raises(ConfigError, match="JDML_CONV='fast' is not one of auto, xla, onednn"):
        switches.conv_mode()


@pytest.mark.slow
def test_two_processes_build_the_library_once_each_safely(tmp_path: Path) -> None:
    """Two processes start on an empty cache at once: both compile (to their own temporary
    files, renamed into place), both use oneDNN, and a third finds the library built."""
    full = {**os.environ, "JDML_CACHE": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", PROBE], env=full, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    # 2 x 4 outputs per position, each 16 x its taps inside the image: 22 x 22 over the map
    assert [o[:2] for o in outs] == [["onednn", "61952.0"]] * 2
    path = Path(outs[0][2])
    assert path.parent == tmp_path / "native" and path.is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary left
    built = path.stat().st_mtime_ns
    again = probe(tmp_path)
    assert again.returncode == 0 and again.stdout.split()[0] == "onednn"
    assert path.stat().st_mtime_ns == built  # loaded, not compiled again


def test_a_failed_build_falls_back_to_xla_with_a_warning(tmp_path: Path) -> None:
    out = probe(tmp_path, CXX="/nonexistent/c++", JDML_CONV="auto")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["xla", "61952.0"]
    warnings = [line for line in out.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1
    assert "no C++ compiler '/nonexistent/c++' on PATH" in warnings[0]
    assert "apt-get install g++ libdnnl-dev" in warnings[0]
    assert not (tmp_path / "native").exists() or not any((tmp_path / "native").iterdir())


def test_a_failed_build_is_an_error_when_onednn_is_required(tmp_path: Path) -> None:
    out = probe(tmp_path, CXX="/nonexistent/c++", JDML_CONV="onednn")
    assert out.returncode != 0
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("jdml.errors.ConfigError")]
    assert "JDML_CONV=onednn but no C++ compiler" in line
    assert "apt-get install g++ libdnnl-dev" in line and "or set JDML_CONV=auto" in line


def test_a_failed_build_is_an_error_naming_the_config_key_that_required_onednn(
    tmp_path: Path,
) -> None:
    out = probe(tmp_path, "onednn", CXX="/nonexistent/c++", JDML_CONV="xla")  # the key wins
    assert out.returncode != 0
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("jdml.errors.ConfigError")]
    assert "backends.conv=onednn but no C++ compiler" in line
    assert "or set backends.conv=auto" in line


def test_a_compile_error_names_the_first_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.cc"
    broken.write_text("#include <no_such_header.h>\n")
    monkeypatch.setattr(build, "SOURCES", (broken,))
    with pytest.raises(build.NativeBuildError, match=r"compiling broken\.cc failed: .*no_such"):
        build._compile(tmp_path / "out.so")
    assert list(tmp_path.iterdir()) == [broken]  # nothing half-written


@pytest.mark.parametrize(("size", "cin", "stride"), [(8, 16, 1), (9, 8, 2), (7, 12, 3)])
def test_flops_are_counted_as_the_xla_convolutions_they_replace(
    size: int, cin: int, stride: int
) -> None:
    """Forward pass, input and kernel gradients: the same count with oneDNN's custom calls and
    with XLA's convolutions, also where the stride does not divide the input size."""
    x = jnp.ones((3, size, size, cin), jnp.float32)
    kernel = jnp.ones((3, 3, cin, 5), jnp.float32)
    counts = {}
    for mode in ("xla", "onednn"):
        native = mode == "onednn" and jax.default_backend() == "cpu"

        def loss(x, k, native=native):  # a new function for each mode
            return jnp.sum(conv2d(x, k, stride, native) ** 2)

        counts[mode] = model_flops(jax.value_and_grad(loss, argnums=(0, 1)), x, kernel).flops
        uses_onednn = "jdml_dnnl_conv_fwd" in str(jax.make_jaxpr(loss)(x, kernel))
        assert uses_onednn == (mode == "onednn" and jax.default_backend() == "cpu")
    out = -(-size // stride)
    forward = 2.0 * 3 * out * out * 5 * 9 * cin
    assert counts["onednn"] == counts["xla"] > 2 * forward


@pytest.mark.parametrize(("size", "k", "stride"), [(8, 3, 1), (9, 5, 2), (4, 5, 1)])
def test_depthwise_flops_are_counted_as_the_xla_convolution(size: int, k: int, stride: int) -> None:
    """The gradient of a sum needs no forward pass: the kernel gradient counts as the forward
    pass (2 flops per image, output pixel, tap and channel), the input gradient as JAX's
    convolution of the output gradient dilated by the stride: its taps on the inserted zeros do
    not count. The same with oneDNN's calls and with XLA's grouped convolution."""
    x = jnp.ones((3, size, size, 6), jnp.float32)
    kernel = jnp.ones((k, k, 1, 6), jnp.float32)
    out, pad, _ = same_padding(size, k, stride)
    side = sum((i + t - (k - 1 - pad)) % stride == 0 for i in range(size) for t in range(k))
    expected = 2.0 * 3 * 6 * (out * out * k * k + side * side)
    for impl in ("onednn", "xla"):

        def loss(x, kernel, impl=impl):
            return jnp.sum(depthwise_conv2d(x, kernel, stride, impl))

        assert model_flops(jax.grad(loss, argnums=(0, 1)), x, kernel).flops == expected
