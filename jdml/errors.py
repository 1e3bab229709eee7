"""Every error the library raises for a user to act on, in one module without dependencies.

Each message names what is wrong and a fix that works; the command-line entry points print it
as one ``error:`` line and exit non-zero (``jdml/cli.py``). The classes keep the built-in bases
that callers may already catch (``ValueError``, ``KeyError``, ``FileNotFoundError``, ...).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which key and how to fix it."""


class UnknownNameError(KeyError, ValueError):
    """Raised for a name that no component registered; the message lists the known names. A
    ``KeyError`` (a failed look-up) and a ``ValueError`` (a bad value of a setting)."""

    def __str__(self) -> str:  # KeyError quotes its message; show it as plain text.
        return str(self.args[0])


class UnknownMetricError(UnknownNameError):
    """An unknown metric name (a ``KeyError`` and a ``ValueError``, as every unknown name)."""


class DataError(ValueError):
    """The data given cannot be loaded; the message says what is wrong and how to fix it."""


class EmojiFetchError(DataError):
    """A source tarball cannot be fetched or does not match its pin."""


class UnsupportedImageError(ValueError):
    """An image whose pixel values have no 8-bit meaning; the message says which and why."""


class MissingFontsError(ImportError):
    """A pinned font package is not installed (or at another version)."""


class GlyphCacheError(RuntimeError):
    """A cache file cannot be used (corrupt, stale or inconsistent)."""


class WorkdirError(RuntimeError):
    """The run directory cannot be used (not writable, full, or in use); the message says how."""


class WorkdirInUseError(WorkdirError):
    """Another live training process holds the run directory's lock (its pid is named)."""


class OutputPathError(ValueError):
    """An output path that is not a new path or a regular file (a folder, a device, a link)."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing or cannot be restored; the message names it and the fix."""


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN/inf loss or gradient; the message says when and what to try."""


class NonFiniteEmbeddingError(FloatingPointError):
    """Embeddings to evaluate, index or search hold NaN/inf; the message says how many, of
    which split or head, and what to check. ``found``: e.g. ``3 of 60 'main' embeddings of
    split 'test' are not finite (NaN or inf)``, the message without its advice."""

    def __init__(self, found: str, fix: str) -> None:
        super().__init__(f"{found}: {fix}")
        self.found = found


class ReportError(ValueError):
    """The runs cannot be reported (none found, unreadable, or without evaluations)."""


class IndexFileError(ValueError):
    """An index file that cannot be used: missing, damaged, or of another format."""


class IndexMismatchError(ValueError):
    """Queries embedded by a model other than the one that built the index."""


class WeightFileError(ValueError):
    """A weight file cannot be read; the message names the file and what is wrong."""


class WeightFileNotFoundError(WeightFileError, FileNotFoundError):
    """The weight file does not exist."""


class UnsafeWeightFileError(WeightFileError):
    """A weight file asks for a Python global or construct outside the reader's allow-list."""


class WeightMismatchError(ValueError):
    """A weight file does not fit the model; the message names the keys and shapes."""


class RunInterruptedError(Exception):
    """A run stopped by Ctrl-C (SIGINT) or SIGTERM; the message names the checkpoint kept and
    the command that resumes. ``signum``: the signal (the exit status is 128 + it)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class Stopped(BaseException):
    """Raised in the main thread by the SIGTERM handler of a command (as ``KeyboardInterrupt``
    is by SIGINT), so that the run unwinds and closes its files."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# The signal a command's handler received, until the command ends: an exception raised by a
# signal handler while Python runs a weakref callback or a finaliser is printed and dropped
# ("Exception ignored in ..."), so the training loop also asks after every step
# (:func:`raise_if_stopped`).
_STOP_REQUESTED: list[int] = []


def request_stop(signum: int) -> None:
    """A signal handler's work: records ``signum`` and raises :class:`Stopped`."""
    record_stop(signum)
    raise Stopped(signum)


def record_stop(signum: int) -> None:
    """Records ``signum`` for :func:`raise_if_stopped` (e.g. a Ctrl-C whose
    ``KeyboardInterrupt`` a finaliser dropped)."""
    _STOP_REQUESTED.append(signum)


def stop_requested() -> int | None:
    """The signal recorded by :func:`request_stop`, or None."""
    return _STOP_REQUESTED[-1] if _STOP_REQUESTED else None


def clear_stop() -> None:
    """Forgets a recorded signal (when a command starts or ends)."""
    _STOP_REQUESTED.clear()


def raise_if_stopped() -> None:
    """Raises :class:`Stopped` again if a signal was recorded: where the handler's own
    exception was dropped, the run still stops at the next step."""
    signum = stop_requested()
    if signum is not None:
        raise Stopped(signum)


class StudyError(RuntimeError):
    """A study (``jdml study``) that cannot go on as asked: its folder in use, a row changed
    under its records, failed runs to retry; the message names the fix."""
