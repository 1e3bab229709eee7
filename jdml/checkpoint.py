"""Orbax checkpoints of the train state: the latest (for resuming) and the best (for evaluation).

Layout inside a workdir:
  checkpoints/<step>/   the most recent states (resume from the newest)
  best/<step>/          the state with the best model-selection metric so far

Checkpoints hold arrays (tensorstore/OCDBT) and JSON metadata only; restoring never unpickles or
executes anything from the files. Orbax writes each checkpoint into a temporary directory and
renames it when complete, so a run killed mid-save leaves the earlier checkpoints intact.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import time
from typing import Any

import jax
import orbax.checkpoint as ocp

from jdml.cli import first_line
from jdml.errors import CheckpointError
from jdml.state import TrainState

log = logging.getLogger("jdml")


def storage_cause(error: BaseException, what: str) -> str:
    """The first line of a storage-layer error, for a one-line message: its whole text (a
    TensorStore spec dump can run to dozens of lines) goes to the log file (``train.log``)
    only, as ``<what> failed``."""
    log.info("%s failed:\n%s", what, error, extra={"file_only": True})
    cause = first_line(error)
    cause = cause if len(cause) <= 160 else cause[:157] + "..."
    return f"{type(error).__name__}: {cause}"


def _array_specs(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """``path -> (shape, dtype)`` of every array of ``tree`` (a state or a checkpoint's
    metadata tree), the path's parts joined by ``/`` whatever container holds them."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(leaf, "shape"):
            continue
        parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        out["/".join(parts)] = (tuple(leaf.shape), str(leaf.dtype))
    return out


def saved_steps(workdir: str, which: str = "latest") -> list[int]:
    """The steps of the finished latest (``checkpoints/``) or best (``best/``) checkpoints.

    Reads directory names only, without opening a checkpoint manager; a save cut short by a
    kill leaves a temporary directory, which does not count.
    """
    folder = os.path.join(workdir, "checkpoints" if which == "latest" else "best")
    if not os.path.isdir(folder):
        return []
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def has_checkpoints(workdir: str) -> bool:
    """True if ``workdir`` holds a finished latest or best checkpoint."""
    return bool(saved_steps(workdir, "latest") or saved_steps(workdir, "best"))


# What a failed write says, in the storage layer's words (tensorstore reports the OS error as
# text inside its own exception), and what to do about it.
_CAUSES = (
    (errno.ENOSPC, "No space left on device", "no space left on device", "free some space"),
    (errno.EDQUOT, "Disk quota exceeded", "disk quota exceeded", "free some space"),
    (errno.EROFS, "Read-only file system", "read-only filesystem", "make it writable"),
    (errno.EACCES, "Permission denied", "permission denied", "make it writable"),
    (errno.EIO, "Input/output error", "input/output error", "check the disk"),
)


def _save_failure(error: BaseException, directory: str, step: int, kept: list[int]) -> str:
    """One line: which checkpoint could not be saved, why, and how to go on."""
    chain, seen = [], error
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(str(e) for e in chain)
    codes = {getattr(e, "errno", None) for e in chain}
    known = [(r, f) for code, words, r, f in _CAUSES if code in codes or words in text]
    if known:
        reason, fix = known[0]
    else:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        reason, fix = f"{type(error).__name__}: {first}", "fix the cause"
    earlier = (
        f"the checkpoints saved before (steps {kept}) are intact"
        if kept
        else "none was saved before"
    )
    return (
        f"cannot save checkpoint step {step} in {directory} ({reason}); {earlier}. "
        f"{fix[0].upper()}{fix[1:]}, then "
        "run the same command again: it resumes from the newest checkpoint"
    )


def _remove_partial(directory: str, step: int) -> None:
    """Removes the temporary folder of this process's failed save of ``step`` (never a finished
    checkpoint), so that the space it took is free again."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if name.startswith(f"{step}.orbax-checkpoint-tmp"):
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _manager(directory: str, max_to_keep: int, create: bool) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        create=create,
        # Synchronous saves: the state buffers are donated to the next step, so a save must
        # have copied them before training continues.
        enable_async_checkpointing=False,
    )
    return ocp.CheckpointManager(
        os.path.abspath(directory), item_names=("state", "meta"), options=options
    )


class Checkpoints:
    """The latest and best checkpoints of one workdir (``create=False``: only read them, creating
    no folder, for evaluation and inference)."""

    def __init__(self, workdir: str, keep_latest: int = 2, *, create: bool = True) -> None:
        self.workdir = workdir
        self.latest = _manager(os.path.join(workdir, "checkpoints"), keep_latest, create)
        self.best = _manager(os.path.join(workdir, "best"), 1, create)
        self._closed = False

    def save(self, state: TrainState, meta: dict[str, Any], *, best: bool = False) -> None:
        """Saves ``state`` as the latest (or best) checkpoint of its step.

        Raises:
          CheckpointError: the save failed (no space, no permission, an I/O error); the message
            names the checkpoint, the cause and the fix. The partial files of this save are
            removed and the checkpoints saved before are intact.
        """
        manager = self.best if best else self.latest
        step = int(state.step)
        if step in manager.all_steps():
            return
        try:
            manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                ),
            )
            manager.wait_until_finished()
        except Exception as e:  # orbax and tensorstore raise many types for a failed write
            from jdml.distributed import is_peer_failure

            if is_peer_failure(e):  # another process died: the trainer stops this one at once
                raise
            _remove_partial(str(manager.directory), step)
            kept = saved_steps(self.workdir, "best" if best else "latest")
            raise CheckpointError(_save_failure(e, str(manager.directory), step, kept)) from e

    def steps(self, which: str) -> list[int]:
        return list(self._manager(which).all_steps())

    def _manager(self, which: str) -> ocp.CheckpointManager:
        if which == "best":
            return self.best
        if which == "latest":
            return self.latest
        raise CheckpointError(
            f"unknown checkpoint {which!r}: use best, latest or a step number (steps here: "
            f"latest {self.steps('latest')}, best {self.steps('best')})"
        )

    def resolve(self, which: str | int) -> tuple[ocp.CheckpointManager, int]:
        """Maps 'best', 'latest' or a step number onto a manager and step."""
        if isinstance(which, int) or str(which).isdigit():
            step = int(which)
            for manager in (self.latest, self.best):
                if step in manager.all_steps():
                    return manager, step
            raise CheckpointError(
                f"no checkpoint at step {step} in {self.workdir}; available steps: "
                f"latest {self.steps('latest')}, best {self.steps('best')}"
            )
        manager = self._manager(str(which))
        step = manager.latest_step()
        if step is None:
            latest = self.steps("latest")
            if which == "best" and latest:  # never another checkpoint in its place
                raise CheckpointError(
                    f"no best checkpoint in {self.workdir} (best/ is missing or holds no "
                    f"finished checkpoint); the checkpoints here are latest, steps {latest}: "
                    f"pass --checkpoint latest (step {latest[-1]}) or a step number, or train "
                    "on to save a best one"
                )
            raise CheckpointError(
                f"no {which} checkpoint in {self.workdir}: train first with "
                f"`python train.py --config ... --workdir {self.workdir}`"
            )
        return manager, step

    def mismatch(self, which: str | int, target: TrainState) -> str | None:
        """What differs between the state stored in checkpoint ``which`` and the structure
        (array paths, shapes, dtypes) of ``target``, from the checkpoint's metadata alone (no
        array is read); None if it fits, or if the metadata cannot be read (``restore`` then
        names the problem)."""
        manager, step = self.resolve(which)
        path = os.path.join(str(manager.directory), str(step), "state")
        try:
            absl_logging = logging.getLogger("absl")
            level = absl_logging.level
            absl_logging.setLevel(logging.ERROR)  # orbax warns of a metadata file it never wrote
            try:
                with ocp.StandardCheckpointer() as checkpointer:
                    stored = checkpointer.metadata(path).item_metadata.tree
            finally:
                absl_logging.setLevel(level)
        except Exception:  # unreadable metadata: restore names the problem
            return None
        have, want = _array_specs(stored), _array_specs(target)
        for key in sorted(set(have) | set(want)):
            if have.get(key) != want.get(key):
                shown = lambda spec: "absent" if spec is None else f"{spec[1]}{list(spec[0])}"  # noqa: E731
                return f"{key}: {shown(have.get(key))} in step {step}, {shown(want.get(key))} here"
        return None

    def reload(self) -> None:
        """Reads the steps on disk again (a training process may have saved and removed some
        since these managers were made)."""
        for manager in (self.latest, self.best):
            manager.reload()

    def restore(self, which: str | int, target: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """Restores a checkpoint into the structure (shapes, dtypes, shardings) of ``target``.

        ``best`` and ``latest`` are looked up on disk at the call, and looked up again if the
        step found was removed before it could be read (a run training meanwhile keeps only
        its newest steps): the newest complete step is read.
        """
        for attempt in range(3):
            self.reload()
            manager, step = self.resolve(which)
            try:
                out = manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
                    ),
                )
                return out["state"], dict(out["meta"])
            except Exception as e:  # orbax raises many types for unreadable or mismatched files
                if attempt < 2 and self._removed_since(which, manager, step):
                    continue
                error = e
                break
        raise self._restore_error(error, manager, step)

    def _removed_since(self, which: str | int, manager: ocp.CheckpointManager, step: int) -> bool:
        """Whether ``step`` of a ``best``/``latest`` lookup is gone (or going) from disk."""
        if isinstance(which, int) or str(which).isdigit():
            return False
        folder = os.path.join(str(manager.directory), str(step))
        if os.path.isdir(folder):
            time.sleep(0.5)  # a removal in progress leaves the folder a moment longer
        return not os.path.isdir(folder)

    def _restore_error(
        self, e: BaseException, manager: ocp.CheckpointManager, step: int
    ) -> CheckpointError:
        """The one-line error of a checkpoint that cannot be restored."""
        cause = storage_cause(e, f"Restoring checkpoint step {step} from {manager.directory}")
        others = [s for s in self.steps("latest") + self.steps("best") if s != step]
        earlier = (
            f"move {manager.directory}/{step} out of the way to use the other checkpoints "
            f"(steps {sorted(set(others))})"
            if others
            else "train again in a new --workdir"
        )
        return CheckpointError(
            f"cannot restore checkpoint step {step} from {manager.directory}: the files are "
            f"damaged or were written by another model config ({cause}). "
            f"Check that config.json is the run's own; otherwise {earlier}"
        )

    def close(self) -> None:
        """Stops the managers' background work (once; a later call does nothing)."""
        if self._closed:
            return
        self._closed = True
        self.latest.close()
        self.best.close()
