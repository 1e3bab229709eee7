"""``jdml train`` (and ``python train.py``): train a deep metric learning model, evaluating it on
unseen classes.

  jdml train --config configs/revisiting.py --workdir runs/glyphs
  jdml train --config configs/revisiting.py:data=glyphs --workdir runs/x \
      --config.loss.name=triplet --config.miner.name=random --config.train.epochs=5

Running the same command again resumes from the newest checkpoint in --workdir.

Several hosts (one process each, same command, a workdir on a shared filesystem):

  jdml train --config configs/dm2.py --workdir /shared/dm2 \
      --coordinator_address=host0:1234 --num_processes=2 --process_id=0   # 1 on the other host
  jdml train --config configs/dm2.py --workdir /shared/dm2 --distributed   # SLURM / TPU pod
"""

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from jdml.allocator import reexec_with_tcmalloc
from jdml.cli import cli_errors, flags_parser

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/<file>.py[:args]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Join a multi-host run, the topology read from the environment."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "host:port of process 0 of a multi-host run."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "Processes of a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "This process's index in a multi-host run.")
_REPLACE_UNREADABLE = flags.DEFINE_bool(
    "replace_unreadable_config",
    False,
    "Replace a damaged <workdir>/config.json with --config (the one the run was trained with).",
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    del argv
    from jdml.distributed import initialize, is_main_process
    from jdml.evaluation.table import format_table
    from jdml.trainer import train_and_evaluate

    with cli_errors():
        if _COORDINATOR.value or _DISTRIBUTED.value:
            initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
        with stopped_as_error(_WORKDIR.value):
            summary = train_and_evaluate(
                _CONFIG.value, _WORKDIR.value, replace_unreadable_config=_REPLACE_UNREADABLE.value
            )
        if not is_main_process():
            return
        tables = {}
        for key in ("untrained", "best", "final"):
            for split, values in summary.get(key, {}).items():
                if isinstance(values, dict):
                    tables[f"{key} ({split})"] = values
        print(format_table(tables))
        print(f"results: {_WORKDIR.value}/results.json")


@contextlib.contextmanager
def stopped_as_error(workdir: str) -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM end the run by unwinding it (its files closed, the
    checkpoints kept) and become one :class:`jdml.errors.RunInterruptedError` naming the newest
    checkpoint and the command that resumes (this one)."""
    from jdml.checkpoint import saved_steps
    from jdml.errors import (
        RunInterruptedError,
        Stopped,
        clear_stop,
        record_stop,
        request_stop,
        stop_requested,
    )

    def stop(signum: int, frame: Any) -> None:
        request_stop(signum)

    unraisable = sys.unraisablehook

    def dropped(event: Any) -> None:
        """A stop raised while Python ran a finaliser or a weakref callback, where it is dropped:
        recorded (the loop stops after its step) instead of printed."""
        if isinstance(event.exc_value, Stopped):
            return  # request_stop recorded it
        if isinstance(event.exc_value, KeyboardInterrupt):
            record_stop(signal.SIGINT)
            return
        unraisable(event)

    main = threading.current_thread() is threading.main_thread()
    # Both signals recorded as they arrive: Python's own Ctrl-C (a KeyboardInterrupt alone) was
    # lost when code running at that moment swallowed it (seen while a weight file was read).
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    sys.unraisablehook = dropped
    clear_stop()
    try:
        yield
        if stop_requested() is not None:  # the handler's exception was dropped after the steps
            raise Stopped(stop_requested())
    except (KeyboardInterrupt, Stopped) as e:
        signum = getattr(e, "signum", signal.SIGINT)
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        steps = saved_steps(workdir) if os.path.isdir(workdir) else []
        kept = (
            f"its newest checkpoint is step {steps[-1]} in {workdir}"
            if steps
            else "no checkpoint was saved yet, so it starts from the beginning"
        )
        argv = ["python", *sys.argv] if sys.argv[0].endswith(".py") else sys.argv
        command = " ".join(shlex.quote(a) for a in argv)
        raise RunInterruptedError(
            f"stopped by {name}; {kept}. Resume with the same command: {command}", signum
        ) from None
    finally:
        clear_stop()
        sys.unraisablehook = unraisable
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(argv: list[str] | None = None) -> None:
    """Parses ``argv`` (default: ``sys.argv``) as the flags above and trains. As a program
    (``argv`` None) it first starts again under tcmalloc where installed (``jdml.allocator``)."""
    if argv is None:
        reexec_with_tcmalloc()
    app.run(main, argv=argv, flags_parser=flags_parser())
