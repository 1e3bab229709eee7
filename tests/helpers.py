"""Small builders shared by the tests: a tiny labelled image set and a tiny fast config."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import textwrap
from collections.abc import Iterator
from types import ModuleType

import jax
import numpy as np

from jdml.config import set_keys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Golden files and fixtures the tests compare against (made by the scripts in tools/).
GOLDEN = os.path.join(REPO, "tests", "golden")


def make_npz(path: str, *, num_classes: int = 12, per_class: int = 10, size: int = 16) -> str:
    """Writes an npz of class-structured images: each class is a noisy bar at its own angle."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size] - (size - 1) / 2
    images, labels = [], []
    for c in range(num_classes):
        angle = np.pi * c / num_classes
        line = np.abs(np.cos(angle) * yy - np.sin(angle) * xx) < 1.5
        for _ in range(per_class):
            img = 200.0 * line + rng.normal(0, 30, (size, size))
            images.append(np.clip(img, 0, 255).astype(np.uint8))
            labels.append(c)
    np.savez(path, images=np.stack(images)[..., None], labels=np.array(labels))
    return path


# Tolerance of float32 matrix products and convolutions at JAX's default precision, by backend:
# on NVIDIA GPUs (Ampere on) XLA runs them on the TF32 tensor cores, whose operands keep 10
# mantissa bits (relative rounding 2^-11, about 5e-4, per operand); on TPUs one bfloat16 pass
# (8 bits, 2^-9 per operand). Sums of a few dozen such products of unit-scale values then differ
# from float64 by up to about 1e-2 and 3e-2.
ACCELERATOR_TOLERANCE = {"gpu": 1e-2, "cuda": 1e-2, "rocm": 1e-2, "tpu": 3e-2}


def matmul_tolerance(cpu: float = 1e-5) -> float:
    """The rtol/atol for comparing a float32 result of matrix products or convolutions, computed
    at JAX's default precision on the default backend, with a float64 or other-algorithm
    reference: ``cpu`` on the CPU backend (true float32), the reduced precision's bound
    (``ACCELERATOR_TOLERANCE``) on accelerators. A test of exact equality pins
    ``jax.default_matmul_precision("highest")`` instead."""
    return max(cpu, ACCELERATOR_TOLERANCE.get(jax.default_backend(), cpu))


def skip_off_cpu(what: str) -> None:
    """Skips the running test unless the default backend is the CPU (``what``: the CPU-only
    kernel it exercises; whole tests of them are marked ``cpu`` instead)."""
    import pytest

    if jax.default_backend() != "cpu":
        pytest.skip(f"{what} runs on the CPU backend only")


def _cpuinfo() -> str:
    """The text of /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            return cpuinfo.read()
    except OSError:
        return ""


def cpu_kind() -> str:
    """This CPU's vendor and widest vector extension, as ``GenuineIntel avx512`` or
    ``AuthenticAMD avx2``. XLA's and oneDNN's CPU kernels round alike only within one kind:
    a record made on an Intel Xeon with AVX-512 differs from an AMD EPYC with AVX-512 in the
    last bit of some gradients (measured: the angular loss's, 3e-8 apart), so bit-for-bit
    records are compared exactly only on a CPU of the kind that made them."""
    info = _cpuinfo()
    vendor = next(
        (
            line.split(":", 1)[1].strip()
            for line in info.splitlines()
            if line.startswith("vendor_id")
        ),
        "unknown",
    )
    return f"{vendor} {'avx512' if ' avx512f' in info else 'avx2'}"


def recorded_cpu_kind(record: np.lib.npyio.NpzFile) -> str:
    """The CPU kind a bit-for-bit record was made on: its ``cpu_kind``, or for a record of
    before that key, the Intel Xeon (or a CPU without AVX-512) its ``cpu_avx512`` flag names."""
    if "cpu_kind" in record.files:
        return str(record["cpu_kind"])
    return "GenuineIntel avx512" if bool(record["cpu_avx512"]) else "unknown avx2"


def sgemm_tiles_round_alike() -> bool:
    """Whether oneDNN's sgemm rounds a dot product the same in every tile shape the native
    kernels use (jdml/native/gemm.h), so that searches cut into tiles differently agree bit for
    bit: measured on CPUs with AVX-512 (Intel Xeon). On CPUs with AVX2 only (measured on an AMD
    EPYC) sgemm's kernels for tiles of other shapes sum in other orders, and the same product
    differs by about one float32 ulp; results then agree up to that rounding."""
    return " avx512f" in _cpuinfo()


# One residual stage: the train step of two stages took ~1.7x the CPU time to compile (the
# programs' size, not the training, is what the tests pay for). Networks of several stages are
# tested in tests/models. Its 16 channels keep the 16-d embeddings of full rank (8 left the
# smallest singular values at rounding noise, and rho_spectrum with them).
TINY_OVERRIDES = {
    "data.name": "npz",
    "data.image_size": 16,
    "data.num_threads": 1,
    # Every training class trains: the tests that hold classes out say so, and the default's
    # hold-out (data.val_fraction=0.15) is run by test_trainer's
    # test_the_default_selects_the_checkpoint_on_validation.
    "data.val_fraction": 0.0,
    "model.small_resnet.stem_features": 8,
    "model.small_resnet.stem_strides": 1,
    "model.small_resnet.stage_features": (16,),
    "model.small_resnet.stage_blocks": (1,),
    "model.small_resnet.stage_strides": (2,),
    "model.embed_dim": 16,
    "train.batch_size": 16,
    "train.epochs": 2,
    "train.log_every_steps": 2,
    "train.checkpoint_every_steps": 2,
    "train.progress_bar": False,
    "eval.every_epochs": 1,
    "eval.batch_size": 32,
}


def config_flag(key: str, value: object) -> str:
    """``--config.<key>=<value>`` as a user types it (tuples as ``(a,b)``)."""
    if isinstance(value, tuple):
        value = "(" + ",".join(str(v) for v in value) + ")"
    return f"--config.{key}={value}"


# TINY_OVERRIDES as command-line flags (the data comes from the command's config argument).
TINY_FLAGS = [config_flag(k, v) for k, v in TINY_OVERRIDES.items() if k != "data.name"]


def tiny_config(npz_path: str, **overrides):
    """The default config shrunk to a model and data that train in seconds."""
    from configs.revisiting import get_config

    c = get_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, "data.path": npz_path, **overrides})
    return c


def photo_overrides(root, **overrides) -> dict:
    """The settings of a tiny run on a benchmark's photo files at ``root``
    (``tests.benchmark_trees``; CUB's layout unless ``data.name`` says otherwise): 3 channels,
    resized to 20, 16 px crops, batch 8, one epoch; then ``overrides``."""
    return {
        "data.name": "cub200",
        "data.path": str(root),
        "data.verify_counts": False,
        "data.channels": 3,
        "data.image_size": 16,
        "data.resize": 20,
        "data.augment": "base",
        "train.batch_size": 8,
        "train.epochs": 1,
        **overrides,
    }


def photo_config(root, **overrides):
    """``tiny_config`` with :func:`photo_overrides`."""
    return tiny_config("unused.npz", **photo_overrides(root, **overrides))


def write_tiny_config_file(directory: str, npz_path: str, **overrides) -> str:
    """Writes a config file usable as ``train.py --config <file>`` (for subprocess tests)."""
    path = os.path.join(directory, "tiny_config.py")
    body = f"""
        import sys
        sys.path.insert(0, {REPO!r})
        from tests.helpers import tiny_config

        def get_config():
            return tiny_config({npz_path!r}, **{overrides!r})
        """
    with open(path, "w") as f:
        f.write(textwrap.dedent(body))
    return path


def restore_latest(workdir: str, run):
    """The latest checkpoint of ``workdir`` restored as ``run``'s state, on the host."""
    import jax

    from jdml.checkpoint import Checkpoints

    ckpts = Checkpoints(workdir)
    try:
        return jax.tree.map(np.asarray, ckpts.restore("latest", run.initial_state)[0])
    finally:
        ckpts.close()


def free_port() -> int:
    """A TCP port nothing listens on now (for a test's coordinator)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_training_processes(
    config_file: str, workdir: str, processes: int = 2, **popen: object
) -> list:
    """Starts ``train.py`` as ``processes`` processes of one ``jax.distributed`` run on this
    machine (two CPU devices each, gloo collectives); ``popen``: the streams (``stdout``,
    ``stderr``, ``text``) of ``subprocess.Popen``. Returns the processes."""
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    port = free_port()
    return [
        subprocess.Popen(
            [
                sys.executable,
                os.path.join(REPO, "train.py"),
                f"--config={config_file}",
                f"--workdir={workdir}",
                f"--coordinator_address=127.0.0.1:{port}",
                f"--num_processes={processes}",
                f"--process_id={i}",
            ],
            env=env,
            **popen,
        )
        for i in range(processes)
    ]


def train_in_processes(config_file: str, workdir: str, processes: int = 2) -> list[str]:
    """Runs ``train.py`` as ``processes`` processes of one ``jax.distributed`` run on this
    machine (``start_training_processes``) and returns each one's output; fails the test if any
    exits non-zero."""
    import subprocess

    procs = start_training_processes(
        config_file, workdir, processes, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    return outputs


def central_differences(fn, x, *, eps: float = 1e-6) -> np.ndarray:
    """The gradient of a scalar NumPy function by central differences (float64)."""
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[idx] += eps
        lo[idx] -= eps
        grad[idx] = (fn(hi) - fn(lo)) / (2 * eps)
    return grad


def tree_digest(root: str) -> dict[str, str]:
    """sha256 of every regular file under ``root``, keyed by relative path; a symbolic link
    as its target, anything else (a pipe, a device, an empty folder) as its kind."""
    import hashlib
    import stat

    out = {}
    for folder, folders, files in os.walk(root):
        for name in files + [d for d in folders if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                digest = f"link to {os.readlink(path)}"
            elif stat.S_ISREG(mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            else:
                digest = f"special file {stat.S_IFMT(mode):o}"
            out[os.path.relpath(path, root)] = digest
        for name in folders:
            out.setdefault(os.path.relpath(os.path.join(folder, name), root) + "/", "folder")
    return out


def load_experiment(name: str) -> ModuleType:
    """``experiments/<name>.py`` as a module, registered under ``name`` (its dataclasses and its
    own imports of sibling scripts look their module up there)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "experiments", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_script(relative: str, name: str | None = None):
    """The repository script ``relative`` (e.g. ``tools/make_loss_golden.py``) as a module."""
    import importlib.util

    path = os.path.join(REPO, relative)
    spec = importlib.util.spec_from_file_location(name or os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def registered(registry, name: str, obj: object, **facts: object) -> Iterator[object]:
    """``obj`` registered in ``registry`` as ``name`` (with ``facts``, e.g. ``ranges=``) while
    the block runs, and removed after it, also on failure: a plug-in defined by a test."""
    registry.register(name, **facts)(obj)
    try:
        yield obj
    finally:
        registry.unregister(name)


def make_digits_npz(path: str, size: int = 16) -> str:
    """Writes scikit-learn's handwritten digits (1,797 images of 10 classes, 8 x 8 at 17 grey
    levels) as an npz of ``size`` x ``size`` uint8 images: a real dataset small enough for a
    study of several runs in a test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    scale = size // 8
    images = np.kron(digits.images, np.ones((scale, scale))) * (255.0 / 16.0)
    np.savez(
        path,
        images=np.clip(images, 0, 255).astype(np.uint8)[..., None],
        labels=digits.target.astype(np.int64),
    )
    return path
