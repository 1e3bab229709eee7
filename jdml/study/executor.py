"""Where a study's runs execute: slots on this host (``local``), or tasks of a Ray cluster.

Every run is one process, ``python -m jdml.study.worker TASK.json``, whose output goes to its
own log; the executors only start those processes and report when they end. jdml writes no
scheduler of its own beyond the host's slots: across machines it is Ray's.

* :class:`Local`: at most ``slots`` runs at once, the run in slot ``i`` pinned to the i-th
  share of this process's cores (``os.sched_setaffinity``, which jdml's pipeline sizing and
  XLA's thread pools read) and given ``1 / slots`` of the accelerator's memory
  (``XLA_PYTHON_CLIENT_MEM_FRACTION``, unless the environment sets it). One small run leaves
  most of a GPU idle; on 2 CPU cores two one-core runs gave 1.16x the throughput of one
  two-core run (the emoji protocol's runs).
* :class:`RayTasks`: each run a Ray task with its resources (``num_cpus``, ``num_gpus``: a
  fraction lets small runs share a GPU, each then given that fraction of its memory), on an
  existing cluster (``address``). A task whose node dies is retried by Ray on another node
  (``max_retries``), and the run resumes from its checkpoint: the study's folder must be on a
  filesystem every node sees, and every node needs the same jdml installed.

A run's process dies with the process that started it (``PR_SET_PDEATHSIG`` on Linux), so a
driver or a Ray worker killed with ``kill -9`` leaves no run training on its own.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class Task:
    """One run: its name for the progress lines, its task file and its log (or, with
    ``command``, any command: its argv)."""

    name: str
    task_file: str
    log: str
    command: tuple[str, ...] = ()

    def argv(self) -> tuple[str, ...]:
        return self.command or (sys.executable, "-m", "jdml.study.worker", self.task_file)


@dataclasses.dataclass(frozen=True)
class Done:
    """A run that ended: its exit code and the last line of its log."""

    task: Task
    code: int
    last_line: str
    seconds: float


class Executor(Protocol):
    slots: int

    def submit(self, task: Task) -> None: ...

    def running(self) -> int: ...

    def wait(self) -> list[Done]: ...

    def close(self) -> None: ...


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


def host_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


# Runs in the child between fork and the run's exec (as its own small program, so that no
# Python of the parent, which may hold JAX's threads, runs after the fork): dies with the
# parent (PR_SET_PDEATHSIG = 1, kept across exec), pins itself to the cores of its first
# argument ('' for no pinning), then becomes the run's command.
_START = (
    "import ctypes, os, signal, sys\n"
    "parent = int(sys.argv[2])\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != parent:\n"
    "    sys.exit(128 + signal.SIGKILL)\n"
    "if sys.argv[1] and hasattr(os, 'sched_setaffinity'):\n"
    "    os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')])\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def start(
    argv: Sequence[str], log: str, env: Mapping[str, str], cores: Sequence[int] = ()
) -> subprocess.Popen:
    """Starts ``argv`` with its output appended to ``log`` (a resumed run's log goes on),
    pinned to ``cores`` (none: not pinned), dying with this process."""
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    wrapper = (sys.executable, "-c", _START, ",".join(map(str, cores)), str(os.getpid()))
    with open(log, "a") as out:
        return subprocess.Popen(
            (*wrapper, *argv), stdout=out, stderr=subprocess.STDOUT, env=dict(env)
        )


def last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [x.rstrip() for x in f.readlines()[-20:] if x.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


class Local:
    """At most ``slots`` runs at once on this host, each on its share of the cores."""

    def __init__(self, slots: int, env: Mapping[str, str] | None = None, poll_s: float = 0.2):
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self.shares = core_shares(host_cores(), slots)
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / slots:.3f}")
        self.poll_s = poll_s
        self._running: dict[int, tuple[Task, subprocess.Popen, float]] = {}

    def submit(self, task: Task) -> None:
        slot = next(s for s in range(self.slots) if s not in self._running)
        process = start(task.argv(), task.log, self.env, self.shares[slot])
        self._running[slot] = (task, process, time.perf_counter())

    def running(self) -> int:
        return len(self._running)

    def wait(self) -> list[Done]:
        """Blocks until at least one running run ends; returns those that ended."""
        while True:
            done = []
            for slot, (task, process, begun) in list(self._running.items()):
                code = process.poll()
                if code is not None:
                    del self._running[slot]
                    took = time.perf_counter() - begun
                    done.append(Done(task, code, last_line(task.log), took))
            if done or not self._running:
                return done
            time.sleep(self.poll_s)

    def close(self) -> None:
        """Terminates the runs still going (an interrupted driver takes its runs along)."""
        for _, process, _ in self._running.values():
            process.terminate()
        for _, process, _ in self._running.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._running.clear()


def _ray_run(argv: Sequence[str], log: str, fraction: float) -> int:
    """The body of a Ray task: the run as a process of this Ray worker (it dies with it),
    given ``fraction`` of the accelerator Ray assigned (``CUDA_VISIBLE_DEVICES``)."""
    import ray

    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    with open(log, "a") as f:  # which node ran (or retried) it, for the log's reader
        node = ray.get_runtime_context().get_node_id()
        f.write(f"ray: node {node}, worker pid {os.getpid()}\n")
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if 0 < fraction < 1:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 * fraction:.3f}"
    process = start(argv, log, env)
    return process.wait()


class RayTasks:
    """Each run a Ray task with ``cpus`` CPUs and ``gpus`` GPUs (a fraction shares one), at
    most ``slots`` submitted at once (the cluster queues what its resources cannot run yet).

    Raises:
      StudyError: Ray is not installed (``pip install 'jdml[study]'``).
    """

    def __init__(
        self,
        address: str,
        slots: int,
        cpus: float = 1.0,
        gpus: float = 0.0,
        max_retries: int = 3,
        init: Mapping[str, Any] | None = None,
    ):
        try:
            import ray
        except ImportError:
            from jdml.errors import StudyError

            raise StudyError(
                "the ray executor needs Ray: pip install 'jdml[study]' (or pip install ray)"
            ) from None
        self.ray = ray
        self.slots = slots
        if not ray.is_initialized():
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                **dict(init or {}),
            )
        remote = ray.remote(_ray_run)
        self._remote = remote.options(
            num_cpus=cpus, num_gpus=gpus, max_retries=max_retries, retry_exceptions=False
        )
        self.fraction = gpus
        self._running: dict[Any, tuple[Task, float]] = {}

    def submit(self, task: Task) -> None:
        ref = self._remote.remote(task.argv(), task.log, self.fraction)
        self._running[ref] = (task, time.perf_counter())

    def running(self) -> int:
        return len(self._running)

    def wait(self) -> list[Done]:
        if not self._running:
            return []
        ready, _ = self.ray.wait(list(self._running), num_returns=1)
        done = []
        for ref in ready:
            task, begun = self._running.pop(ref)
            try:
                code = int(self.ray.get(ref))
            except self.ray.exceptions.RayError as e:  # retries exhausted: the node kept dying
                code, line = 1, f"error: Ray gave up on {task.name}: {type(e).__name__}"
                done.append(Done(task, code, line, time.perf_counter() - begun))
                continue
            done.append(Done(task, code, last_line(task.log), time.perf_counter() - begun))
        return done

    def close(self) -> None:
        for ref in list(self._running):
            self.ray.cancel(ref, force=True)
        self._running.clear()


def drive(
    executor: Executor,
    next_task: Callable[[], Task | None],
    on_done: Callable[[Done], None] = lambda done: None,
    echo: Callable[[str], None] = print,
) -> list[str]:
    """Keeps ``executor``'s slots full with ``next_task()`` until it has none and every run has
    ended; ``on_done`` sees each run that ends. Echoes a line when a run starts and one when it
    ends (an ``error:`` line naming its log if it failed).

    Returns:
      The names of the runs that failed, in the order they ended.
    """
    failed: list[str] = []
    exhausted = False
    while True:
        while not exhausted and executor.running() < executor.slots:
            task = next_task()
            if task is None:
                exhausted = True
                break
            echo(f"== {task.name} (log {task.log})")
            executor.submit(task)
        if executor.running() == 0:
            if exhausted:
                return failed
            continue
        for done in executor.wait():
            if done.code:
                failed.append(done.task.name)
                echo(
                    f"error: {done.task.name} exited with {done.code} after {done.seconds:.0f} "
                    f"s; see {done.task.log}"
                )
            else:
                echo(f"   {done.task.name}: {done.seconds:.0f} s; {done.last_line}")
            on_done(done)


def run_all(
    tasks: Sequence[Task], slots: int, echo: Callable[[str], None] = print, **local: Any
) -> list[str]:
    """Runs ``tasks`` in their order on :class:`Local` ``slots`` (``local``: its other
    arguments); terminates the running ones if this process is interrupted or terminated.

    Returns:
      The names of the tasks that exited non-zero, in the order they ended.
    """
    executor = Local(slots, **local)
    pending = iter(tasks)
    previous = stop_on_sigterm()
    try:
        return drive(executor, lambda: next(pending, None), echo=echo)
    finally:
        executor.close()
        signal.signal(signal.SIGTERM, previous)


def stop_on_sigterm() -> Any:
    """Makes SIGTERM raise ``SystemExit`` (so that the executor's ``close`` runs); returns
    the previous handler."""

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)
