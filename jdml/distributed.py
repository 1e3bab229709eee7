"""Multi-process (multi-host) runs: one process per host, all running the same script.

Every process runs the same training loop on its own devices; jitted computations span the
devices of all processes. Process 0 alone writes the workdir's files (config, logs, metrics,
results); checkpoints are written cooperatively by orbax (each process its own shards).

  # on each of N hosts (GPU cluster without a scheduler JAX recognises):
  python train.py --config configs/dm2.py --workdir /shared/runs/dm2 \
      --coordinator_address=host0:1234 --num_processes=N --process_id=<i>
  # SLURM, Open MPI or a Cloud TPU pod slice (JAX reads the topology from the environment):
  python train.py --config configs/dm2.py --workdir /shared/runs/dm2 --distributed
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1) -> None:
    """Joins the processes of a multi-host run (call before any other JAX call).

    Args:
      coordinator_address: ``host:port`` of process 0; empty: detected from the environment
        (SLURM, Open MPI, Cloud TPU).
      num_processes: the number of processes (with ``coordinator_address``).
      process_id: this process's index in ``[0, num_processes)``.
    """
    if coordinator_address:
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )
    else:
        jax.distributed.initialize()
    logging.getLogger("absl").addFilter(_one_line_peer_failures)


def _one_line_peer_failures(record: logging.LogRecord) -> bool:
    """A logging filter: a peer failure that a checkpoint library's background thread logs keeps
    its one-line message but loses its stack dump (the main thread reports the failure with its
    own ``error:`` line, see :func:`peer_failure`)."""
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and is_peer_failure(error):
        record.exc_info, record.exc_text = None, None
    return True


def is_main_process() -> bool:
    """True in process 0 (the only one writing logs, metrics and results)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches this point (a no-op in a single-process run)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def global_array(local: np.ndarray, sharding: jax.sharding.Sharding, shape: tuple) -> jax.Array:
    """A global array from this process's part: the rows of its devices along the sharded axes
    (all of ``local`` when the sharding replicates it)."""
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    return jax.make_array_from_process_local_data(sharding, local, shape)


def local_rows(sharding: jax.sharding.Sharding, rows: int) -> tuple[int, int]:
    """``(start, stop)``: the rows of a ``rows``-row global array, split on its first axis by
    ``sharding``, that live on this process's devices (all of them in a single-process run).

    Raises:
      ValueError: if they are not one contiguous range (a mesh whose data axis interleaves the
        processes' devices).
    """
    slices = {
        s[0].indices(rows)[:2] for s in sharding.addressable_devices_indices_map((rows,)).values()
    }
    start, stop = min(a for a, _ in slices), max(b for _, b in slices)
    if sum(b - a for a, b in slices) != stop - start:
        raise ValueError(f"this process's rows {sorted(slices)} are not one contiguous range")
    return start, stop


# What a collective or the coordination service says when another process of the run has died.
_PEER_FAILURE = (
    "Gloo",
    "NCCL",
    "Connection reset",
    "coordination service",
    "another task",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
)


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a multi-process run's collective or coordination failure, which is
    what another process's death looks like from this one."""
    return (
        isinstance(error, jax.errors.JaxRuntimeError)
        and jax.process_count() > 1
        and any(word in str(error) for word in _PEER_FAILURE)
    )


def peer_failure(error: BaseException, saved_steps: list[int]) -> str | None:
    """The ``error:`` line for a multi-process run whose step failed because another process
    stopped (a collective or the coordination service reports it), or None for any other error;
    ``saved_steps`` are the steps of the run's latest checkpoints (the line says what is intact).
    """
    if not is_peer_failure(error):
        return None
    text = str(error)
    steps = sorted(saved_steps)
    saved = (
        f"the checkpoints saved (latest step {steps[-1]}) are intact"
        if steps
        else ("no checkpoint was saved yet")
    )
    first = (text.strip().splitlines() or [""])[0][:200]
    return (
        f"error: another process of this {jax.process_count()}-process run stopped, so process "
        f"{jax.process_index()} cannot go on ({first}); {saved}: start every process again with "
        "the same command to resume"
    )


def exit_after_peer_failure(line: str, code: int) -> None:
    """Prints ``line`` and ends this process at once: JAX's exit handlers would wait on the
    dead process's collectives and then abort with a stack dump."""
    import sys

    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)
