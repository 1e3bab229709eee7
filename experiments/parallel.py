"""Several training runs side by side on one host, each with its own share of the cores and of
the accelerator's memory.

One small run (the emoji protocol's: EfficientNet-Lite0 at 64 px, batch 112) leaves most of a
GPU idle and spends much of its time compiling and evaluating on the host, so a lent GPU is
used far better by several runs at once than by one after another. On the 2-core CPU two runs
of one core each also beat one run of two cores (the emoji protocol's runs: 1.16x in the
steady state, 1.29x with start-up, measured in ``experiments/emoji_protocol.py --jobs``'s
docstring).

Each job is a command whose output goes to its own log. At most ``slots`` run at a time; the
job in slot i is pinned to the i-th share of this process's cores (``os.sched_setaffinity``,
which jdml's pipeline sizing and XLA's thread pools both read), and every job may take
``1 / slots`` of the accelerator's memory (``XLA_PYTHON_CLIENT_MEM_FRACTION``, unless the
environment already sets it). When this process is interrupted or terminated its running jobs
are terminated with it; a job that fails is reported and the others go on.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Job:
    """One command to run: its name for the progress lines, its argv and its log's path."""

    name: str
    argv: tuple[str, ...]
    log: str


def core_shares(cores: Sequence[int], slots: int) -> list[tuple[int, ...]]:
    """``cores`` split into ``slots`` contiguous shares as even as possible (the first shares
    get the extra cores); with fewer cores than slots, slot i gets core ``i mod len(cores)``.

    Raises:
      ValueError: for no cores or fewer than one slot.
    """
    cores = sorted(cores)
    if not cores or slots < 1:
        raise ValueError(f"need at least one core and one slot, got {cores} and {slots}")
    if len(cores) < slots:
        return [(cores[i % len(cores)],) for i in range(slots)]
    size, extra = divmod(len(cores), slots)
    shares, start = [], 0
    for i in range(slots):
        end = start + size + (1 if i < extra else 0)
        shares.append(tuple(cores[start:end]))
        start = end
    return shares


def _cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


# Pins itself to the cores given as its first argument, then becomes the job's command: no
# Python runs between fork and exec in the runner (which may hold JAX's threads).
_PINNED = (
    "import os, sys\n"
    "if hasattr(os, 'sched_setaffinity'):\n"
    "    os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')])\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _start(job: Job, cores: tuple[int, ...], env: Mapping[str, str]) -> subprocess.Popen:
    os.makedirs(os.path.dirname(os.path.abspath(job.log)), exist_ok=True)
    argv = (sys.executable, "-c", _PINNED, ",".join(map(str, cores)), *job.argv)
    with open(job.log, "a") as log:  # a resumed job's log goes on; the child keeps its own fd
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(env))


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [x.rstrip() for x in f.readlines()[-20:] if x.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_jobs(
    jobs: Sequence[Job],
    slots: int,
    *,
    env: Mapping[str, str] | None = None,
    poll_s: float = 0.2,
    echo: Callable[[str], None] = print,
) -> list[str]:
    """Runs ``jobs`` in their order, at most ``slots`` at a time, each pinned to its slot's
    share of the cores (:func:`core_shares`).

    Args:
      jobs: the commands, started in this order as slots free up.
      slots: how many run at once (at least 1).
      env: the environment of every job (default this process's), to which
        ``XLA_PYTHON_CLIENT_MEM_FRACTION`` = 0.9 / slots is added unless it is already set.
      poll_s: how often the running jobs are checked.
      echo: where the progress lines go (a line when a job starts and one when it ends, with
        the last line of its log).

    Returns:
      The names of the jobs that exited non-zero (each named in an ``error:`` line with its
      log), in the order they ended.
    """
    shares = core_shares(_cores(), slots)
    env = dict(os.environ if env is None else env)
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / slots:.3f}")
    pending = list(jobs)
    running: dict[int, tuple[Job, subprocess.Popen, float]] = {}  # slot -> job
    failed: list[str] = []

    def stop(signum, frame):  # terminated: take the running jobs along
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while pending or running:
            for slot in range(slots):
                if slot not in running and pending:
                    job = pending.pop(0)
                    cores = shares[slot]
                    running[slot] = (job, _start(job, cores, env), time.perf_counter())
                    span = f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else f"{cores[0]}"
                    echo(f"== {job.name} (cores {span}; log {job.log})")
            time.sleep(poll_s)
            for slot, (job, process, start) in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                del running[slot]
                took = time.perf_counter() - start
                if code:
                    failed.append(job.name)
                    echo(f"error: {job.name} exited with {code} after {took:.0f} s; see {job.log}")
                else:
                    echo(f"   {job.name}: {took:.0f} s; {_last_line(job.log).strip()}")
    finally:
        for _, process, _ in running.values():
            process.terminate()
        for _, process, _ in running.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        signal.signal(signal.SIGTERM, previous)
    return failed
