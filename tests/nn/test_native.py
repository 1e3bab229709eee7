"""jdml.nn.native: the oneDNN library is compiled once per machine and safely by concurrent
processes, a failed build falls back to XLA with one warning (or is an error with
JDML_CONV=onednn), a wrong JDML_CONV is a ConfigError, and the flop count of the custom calls
is XLA's count of the same convolutions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jdml.errors import ConfigError
from jdml.nn import native
from jdml.nn.conv import conv2d
from jdml.nn.depthwise import depthwise_conv2d
from jdml.nn.padding import same_padding
from jdml.throughput import compiled_flops

# A fresh process: convolves, prints which convolution the program used and the library path.
PROBE = """
import warnings, jax, jax.numpy as jnp
warnings.simplefilter("always")
from jdml.nn import native
from jdml.nn.conv import conv2d
from jdml.nn.depthwise import depthwise_conv2d
from jdml.nn.padding import same_padding
x, k = jnp.ones((2, 8, 8, 16)), jnp.ones((3, 3, 16, 4))
f = jax.jit(jax.value_and_grad(lambda x, k: jnp.sum(conv2d(x, k)), argnums=(0, 1)))
uses = "jdml_dnnl_conv_fwd" in f.lower(x, k).as_text()
value = float(f(x, k)[0])
print("onednn" if uses else "xla", value, native.library_path())
"""


def probe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "JDML_CACHE": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=300
    )


def test_a_wrong_mode_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JDML_CONV", "fast")
    with pytest.raises(ConfigError, match="JDML_CONV='fast' is not one of auto, xla, onednn"):
        native.conv_mode()


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


def test_a_compile_error_names_the_first_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.cc"
    broken.write_text("#include <no_such_header.h>\n")
    monkeypatch.setattr(native, "SOURCES", (broken,))
    with pytest.raises(native.NativeBuildError, match=r"compiling broken\.cc failed: .*no_such"):
        native._compile(tmp_path / "out.so")
    assert list(tmp_path.iterdir()) == [broken]  # nothing half-written


@pytest.mark.parametrize(("size", "cin", "stride"), [(8, 16, 1), (9, 8, 2), (7, 12, 3)])
def test_flops_are_counted_as_xla_counts_its_convolutions(
    monkeypatch: pytest.MonkeyPatch, size: int, cin: int, stride: int
) -> None:
    x = jnp.ones((3, size, size, cin), jnp.float32)
    kernel = jnp.ones((3, 3, cin, 5), jnp.float32)
    counts = {}
    for mode in ("xla", "onednn"):
        monkeypatch.setenv("JDML_CONV", mode)
        counts[mode] = compiled_flops(jax.jit(lambda x, k: conv2d(x, k, stride)), x, kernel)
    assert counts["onednn"] == counts["xla"] > 0


@pytest.mark.parametrize(("size", "k", "stride"), [(8, 3, 1), (9, 5, 2), (4, 5, 1)])
def test_depthwise_flops_count_the_multiply_adds_that_read_the_input(
    size: int, k: int, stride: int
) -> None:
    """The gradient of a sum needs no forward pass: the input gradient and the kernel gradient,
    each 2 flops per (image, output pixel, tap inside the input, channel). XLA's own count of a
    grouped convolution is not the reference here (it is several times that)."""
    x = jnp.ones((3, size, size, 6), jnp.float32)
    kernel = jnp.ones((k, k, 1, 6), jnp.float32)
    out, pad, _ = same_padding(size, k, stride)
    side = sum(0 <= o * stride - pad + t < size for o in range(out) for t in range(k))

    def loss(x, kernel):
        return jnp.sum(depthwise_conv2d(x, kernel, stride, "onednn"))

    flops = compiled_flops(jax.jit(jax.grad(loss, argnums=(0, 1))), x, kernel)
    assert flops == 2 * (2.0 * 3 * side * side * 6)
