"""The command-line programs run under tcmalloc on Linux, where it is installed.

XLA's CPU runtime allocates every temporary buffer of a jitted program in one block per call
(468 MB for EfficientNet-Lite0's train step at 64 px, batch 112) and frees it afterwards. glibc's
malloc serves a block that large with a fresh ``mmap`` from the pool thread that runs the
program and unmaps it on free, so every step page-faults the whole block back in: 125,000
faults and about 200 ms of kernel time per 350 ms step on 2 cores. Under tcmalloc the freed
block is kept and reused: no faults, and the step took 263 ms instead of 352 (the train step of
``bench/bench_finetune_speed.py``, timed with ``getrusage`` around 10 steps; PyTorch in the same
process gains too). glibc's own settings
do not help: ``mmap_max=0`` is ignored for blocks larger than a thread arena, one arena
(``arena_max=1``) costs as much in lock contention as it saves, and transparent huge pages
(``glibc.malloc.hugetlb=1``) stall on compaction once memory is fragmented.

A process cannot change its allocator once it runs, so :func:`reexec_with_tcmalloc` starts the
program again (the same interpreter and command line, ``os.execve``: the same process id) with
tcmalloc in ``LD_PRELOAD``. ``train.py``, ``eval.py``, the ``jdml`` command and the scripts of
``bench/`` and ``experiments/`` that train Lite0 call it first thing; code that imports jdml is
left alone (set ``LD_PRELOAD`` yourself to get the same effect there).

``$JDML_ALLOCATOR`` chooses: ``auto`` (the default: tcmalloc if installed, else glibc's malloc
with a one-line warning), ``tcmalloc`` (required: an error if it is missing), ``system``
(glibc's malloc, no warning). Debian and Ubuntu: ``apt-get install libtcmalloc-minimal4``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

ENV = "JDML_ALLOCATOR"
MODES = ("auto", "tcmalloc", "system")
# Set in the started-again process, so that it never starts again (even if preloading failed).
ACTIVE_ENV = "JDML_ALLOCATOR_ACTIVE"
LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
SEARCH_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
INSTALL_HINT = "apt-get install libtcmalloc-minimal4"
# tcmalloc reports every allocation above 1 GB on stderr by default (embedding a large split
# makes several); the started-again process raises the threshold to 1 TB unless it is set.
REPORT_ENV = "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"


def find_tcmalloc(dirs: Sequence[str] = SEARCH_DIRS) -> str | None:
    """The path of an installed tcmalloc shared library, or None."""
    for folder in dirs:
        for name in LIBRARIES:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                return path
    return None


def tcmalloc_loaded() -> bool:
    """Whether this process runs with tcmalloc mapped (Linux: from ``/proc/self/maps``)."""
    try:
        with open("/proc/self/maps") as f:
            return "libtcmalloc" in f.read()
    except OSError:
        return False


def allocator_mode(environ: dict[str, str] | os._Environ = os.environ) -> str:
    """``$JDML_ALLOCATOR``, checked: exits with an ``error:`` line if it is not a known mode."""
    mode = environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        sys.exit(f"error: {ENV}={mode!r} is not one of {', '.join(MODES)}: set {ENV}=auto")
    return mode


def preload_environment(library: str, environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The environment of the started-again process: ``library`` first in ``LD_PRELOAD``."""
    env = dict(environ)
    before = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = f"{library}:{before}" if before else library
    env[ACTIVE_ENV] = "1"
    env.setdefault(REPORT_ENV, str(1 << 40))
    return env


def reexec_with_tcmalloc() -> None:
    """Starts this program again under tcmalloc (see the module docstring); returns when there is
    nothing to do: not Linux, ``$JDML_ALLOCATOR=system``, already started again or already under
    tcmalloc, or tcmalloc not installed (``auto``: after a one-line warning)."""
    if sys.platform != "linux":
        return
    mode = allocator_mode()
    if mode == "system" or os.environ.get(ACTIVE_ENV) or tcmalloc_loaded():
        return
    library = find_tcmalloc()
    if library is None:
        if mode == "tcmalloc":
            sys.exit(f"error: {ENV}=tcmalloc but tcmalloc is not installed: {INSTALL_HINT}")
        print(
            "warning: tcmalloc is not installed, so XLA's CPU steps run with glibc's malloc, "
            f"up to 1.3x slower; {INSTALL_HINT}, or set {ENV}=system to silence this",
            file=sys.stderr,
        )
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, list(sys.orig_argv), preload_environment(library, os.environ))
    except OSError as err:  # the program goes on as it is
        print(f"warning: could not start again under tcmalloc ({err})", file=sys.stderr)
