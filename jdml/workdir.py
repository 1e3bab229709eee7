"""The run directory: atomic writes, a writability check before any work, and one writer at a time.

A training run takes an exclusive lock on ``<workdir>/.jdml.lock`` for its whole life, so a second
``train.py`` on the same workdir stops at once instead of resuming from the first one's
checkpoints and interleaving its metrics. The lock is an ``flock`` held by the process, so the
kernel releases it when the process ends in any way (a crash, ``kill -9``, a closed terminal):
a lock left behind by a dead run is never mistaken for a live one. The file records the holder
(pid, host, start time) so the refusal can name it. Filesystems without ``flock`` fall back to
that record: a holder on this host whose pid no longer runs is stale and is taken over.

``claim_workdir`` creates a new workdir and takes its lock in one step, so that two runs started
together on a path that does not exist yet cannot both pass the lock: ``mkdir`` succeeds for one
of them, and the lock file is then taken in the directory however it came to exist. A run that
fails before it writes anything (a bad config or dataset) removes the directory it created.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator

from jdml.errors import WorkdirError, WorkdirInUseError

log = logging.getLogger("jdml")

LOCK_NAME = ".jdml.lock"


def describe_os_error(err: OSError, what: str) -> str:
    """One line naming what could not be written, why, and what to do about it."""
    target = err.filename or what
    if err.errno == errno.ENOSPC or err.errno == errno.EDQUOT:
        return f"no space left to write {target}: free some space, or use another location"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason = "read-only filesystem" if err.errno == errno.EROFS else "permission denied"
        return (
            f"cannot write {target} ({reason}): make it writable, or use another location "
            f"(for a run: another --workdir)"
        )
    return f"cannot write {target}: {err.strerror or err}"


def check_name(path: str, what: str = "workdir") -> None:
    """Raises ``WorkdirError`` for a path that is not valid UTF-8 (bytes Python could only
    carry as surrogate escapes): the records, the logs and the JSON files name their folder."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = repr(os.fsencode(path))[2:-1]  # the bytes as given, e.g. bad\xffname
        raise WorkdirError(
            f"{what} {shown} holds bytes that are not UTF-8; choose a name in UTF-8"
        ) from None


def check_writable(path: str, what: str = "workdir") -> None:
    """Raises ``WorkdirError`` unless files can be created in ``path`` (or, if it does not
    exist yet, in its nearest existing parent, where it would be created). Writes nothing
    that stays behind.

    Args:
      path: a directory, existing or to be created.
      what: how to name it in the message (e.g. ``workdir``, ``output folder``).
    """
    check_name(path, what)
    target = os.path.abspath(path)
    while not os.path.exists(target):
        parent = os.path.dirname(target)
        if parent == target:
            break
        target = parent
    if not os.path.isdir(target):
        raise WorkdirError(f"{what} {path}: {target} is a file, not a folder; choose another path")
    probe = os.path.join(target, f".jdml-write-test-{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise WorkdirError(f"{what} {path}: {describe_os_error(err, target)}") from None
    finally:
        with contextlib.suppress(OSError):
            os.remove(probe)


def _holder() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _describe(holder: dict[str, object]) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"


def _read_holder(fd: int) -> dict[str, object]:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        data = json.loads(os.read(fd, 4096).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _in_use(workdir: str, holder: dict[str, object]) -> WorkdirInUseError:
    pid = holder.get("pid")
    here = holder.get("host") == socket.gethostname()
    stop = f"stop it (kill {pid})" if here else f"stop it on {holder.get('host')}"
    return WorkdirInUseError(
        f"workdir {workdir} is in use by another training process ({_describe(holder)}); "
        f"wait for it to finish or {stop}, then run this command again, or use another --workdir"
    )


@contextlib.contextmanager
def run_lock(workdir: str) -> Iterator[None]:
    """Holds the workdir's lock for the duration of the ``with`` block.

    Raises:
      WorkdirInUseError: if another live process holds it (the message names its pid, host and
        start time).
      WorkdirError: if the lock file cannot be created.
    """
    path = os.path.join(workdir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise WorkdirError(describe_os_error(err, path)) from None
    try:
        previous = _read_holder(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(workdir, previous) from None
        except OSError as err:  # no flock on this filesystem: trust a live pid on this host
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            same_host = previous.get("host") == socket.gethostname()
            if previous.get("pid") != os.getpid() and same_host and _pid_alive(previous["pid"]):
                raise _in_use(workdir, previous) from None
        if previous.get("pid"):
            log.warning(
                "Workdir %s was locked by a run that ended without releasing it (%s); taking "
                "it over",
                workdir,
                _describe(previous),
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # released cleanly: nothing stale is left to report
    finally:
        os.close(fd)  # closing the descriptor releases the flock


class Claim:
    """A held workdir lock (``claim_workdir``): ``keep()`` once the run has written to it."""

    def __init__(self, created: bool, parents: tuple[str, ...] = ()) -> None:
        self.created = created  # this process made the directory
        self.parents = parents  # and these missing parents, the deepest first
        self.kept = False

    def keep(self) -> None:
        """The run has started writing: the directory stays whatever happens next."""
        self.kept = True


def _missing_parents(workdir: str) -> tuple[str, ...]:
    """The parents of ``workdir`` that do not exist yet, the deepest first."""
    out = []
    parent = os.path.dirname(os.path.abspath(workdir))
    while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
        out.append(parent)
        parent = os.path.dirname(parent)
    return tuple(out)


def _make_directory(workdir: str) -> tuple[bool, tuple[str, ...]]:
    """Creates ``workdir`` (and its missing parents); whether this call created it (``mkdir`` of
    the last component succeeds for exactly one of several processes racing to create it), and
    the parents it created, the deepest first."""
    parent = os.path.dirname(workdir)
    missing = _missing_parents(workdir)
    try:
        if parent:
            os.makedirs(parent, exist_ok=True)
        os.mkdir(workdir)
    except FileExistsError:
        if not os.path.isdir(workdir):
            raise WorkdirError(
                f"workdir {workdir} is a file, not a folder; choose another --workdir"
            ) from None
        return False, ()
    except OSError as err:
        _remove_empty(missing)
        raise WorkdirError(describe_os_error(err, workdir)) from None
    return True, missing


def _remove_empty(folders: tuple[str, ...]) -> None:
    """Removes each of ``folders`` (the deepest first) while it is empty."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:  # not empty (another run uses it) or gone: the rest stay
            return


@contextlib.contextmanager
def claim_workdir(workdir: str) -> Iterator[Claim]:
    """Creates ``workdir`` if it does not exist and holds its lock (``run_lock``) for the
    ``with`` block, before anything else is written there.

    If the block ends before ``Claim.keep()`` (a config or dataset check failed after the lock
    was taken) and this process created the directory, the lock file, the then empty directory
    and the parents this call created (while empty) are removed again, so a failed start leaves
    no trace. A directory that existed before is never removed.

    Raises:
      WorkdirError: as ``run_lock``, or if the directory cannot be created.
    """
    claim = Claim(*_make_directory(workdir))
    try:
        with run_lock(workdir):
            try:
                yield claim
            finally:
                if claim.created and not claim.kept:  # while still holding the lock
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(workdir, LOCK_NAME))
    finally:
        if claim.created and not claim.kept:
            _remove_empty((workdir, *claim.parents))  # not empty: another run has taken it
