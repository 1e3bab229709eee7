"""Writing files so that a kill at any moment leaves the old file or the new one, never half of
one, and reading JSON-lines files that a kill may have cut short.

Every writer of the library goes through :func:`atomic_path`: the content is written to a
temporary file next to the target, then renamed onto it (``os.replace`` is atomic on POSIX and
Windows within one filesystem). A failed write (a full disk, say) removes the temporary file and
leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def cache_root(name: str) -> Path:
    """The library's cache folder ``name``: ``$JDML_CACHE/<name>`` or ``~/.cache/jdml/<name>``
    (built datasets, compiled native kernels)."""
    base = os.environ.get("JDML_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "jdml") / name


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike[str], suffix: str = "", *, durable: bool = False
) -> Iterator[str]:
    """A temporary path to write ``path``'s new content to; renamed onto ``path`` on success.

    Args:
      path: the file to (re)write; missing parent folders are created.
      suffix: the temporary file's suffix, for writers that choose the format by it (``".npz"``
        for ``np.savez``, ``".png"``).
      durable: flush the temporary file to disk (``fsync``) before the rename, for caches that
        must survive a power cut, not only a kill.

    Yields:
      The temporary path (in the same folder, so the rename stays on one filesystem). It is
      removed if the block raises.
    """
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # One name per process and thread (no other writer can hold it), with the umask's permissions.
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp{suffix}")
    try:
        with open(tmp, "wb"):
            pass
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def atomic_write(
    path: str | os.PathLike[str], content: str | bytes, *, durable: bool = False
) -> None:
    """Writes ``content`` (text as UTF-8, or bytes) to ``path`` atomically (:func:`atomic_path`).

    Args:
      path: the file to (re)write.
      content: the whole new content.
      durable: ``fsync`` before the rename.
    """
    payload = content.encode("utf-8") if isinstance(content, str) else content
    with atomic_path(path, durable=durable) as tmp, open(tmp, "wb") as f:
        f.write(payload)  # bytes as given: no newline translation on any platform


def read_jsonl(path: str | os.PathLike[str], *, warn: bool = False) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in file order.

    Blank lines, lines that are not valid JSON (a line cut short by a kill, say) and lines that
    are not objects are skipped; undecodable bytes are replaced. Nothing in the file is executed.

    Args:
      path: the file.
      warn: warn about every skipped line (with its line number).

    Returns:
      The records.

    Raises:
      OSError: if the file cannot be read (``FileNotFoundError`` if it does not exist).
    """
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                if warn:
                    warnings.warn(
                        f"{path}:{lineno}: skipping malformed line ({e.msg})", stacklevel=2
                    )
                continue
            if not isinstance(record, dict):
                if warn:
                    warnings.warn(
                        f"{path}:{lineno}: skipping a line that is not an object", stacklevel=2
                    )
                continue
            records.append(record)
    return records
