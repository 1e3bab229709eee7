"""Writing files so that a kill at any moment leaves the old file or the new one, never half of
one, and reading JSON-lines files that a kill may have cut short.

Every writer of the library goes through :func:`atomic_path`: the content is written to a
temporary file next to the target, then renamed onto it (``os.replace`` is atomic on POSIX and
Windows within one filesystem). A failed write (a full disk, say) removes the temporary file and
leaves the target as it was. The target is only ever a new path or a regular file: a folder, a
device, a pipe or a symbolic link there is refused (:func:`check_output_path`), so that a rename
never puts a file in place of something the library did not write.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jdml.errors import OutputPathError


def cache_root(name: str) -> Path:
    """The library's cache folder ``name``: ``$JDML_CACHE/<name>`` or ``~/.cache/jdml/<name>``
    (built datasets, compiled native kernels)."""
    base = os.environ.get("JDML_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "jdml") / name


_KINDS = {
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFIFO: "named pipe",
    stat.S_IFSOCK: "socket",
}


def check_output_path(path: str | os.PathLike[str], example: str = "out.json") -> None:
    """Refuses to write ``path`` unless it is a new path or a regular file.

    Args:
      path: the file about to be written.
      example: a file name to suggest inside ``path`` when it is a folder.

    Raises:
      OutputPathError: ``path`` is a folder, a device, a pipe, a socket or a symbolic link (the
        link itself would be replaced, or written through to where it points); the message
        says what it is and what to pass instead.
    """
    path = os.fspath(path)
    try:
        info = os.lstat(path)
    except OSError:  # new (or unreachable: the write itself says why)
        return
    if stat.S_ISREG(info.st_mode):
        return
    if stat.S_ISDIR(info.st_mode):
        raise OutputPathError(
            f"{path} is a folder, not a file: give the file to write, e.g. "
            f"{os.path.join(path, example)}"
        )
    if stat.S_ISLNK(info.st_mode):
        raise OutputPathError(
            f"{path} is a symbolic link (to {os.readlink(path)}); jdml writes new files and "
            "replaces only regular files: remove the link, or give another path"
        )
    kind = _KINDS.get(stat.S_IFMT(info.st_mode), "special file")
    raise OutputPathError(
        f"{path} is a {kind}, not a regular file; jdml writes new files and replaces only "
        "regular files: give a file path"
    )


def temporary_name(folder: str, name: str, suffix: str = "") -> str:
    """The temporary file's name for writing ``name`` in ``folder``: one per process and
    thread (no other writer can hold it), ``.<name>.<pid>.<thread>.tmp<suffix>``, or, where
    that would pass the file system's limit on a name (255 bytes on most), the same with a
    digest of ``name`` in its place."""
    tail = f".{os.getpid()}.{threading.get_ident()}.tmp{suffix}"
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):  # a folder not made yet, or no such setting: the usual
        limit = 255
    full = f".{name}{tail}"
    if len(os.fsencode(full)) <= limit:
        return full
    return f".jdml-{hashlib.sha256(os.fsencode(name)).hexdigest()[:16]}{tail}"


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

    Raises:
      OutputPathError: ``path`` is neither new nor a regular file (:func:`check_output_path`),
        checked before anything is written and again just before the rename.
    """
    path = os.fspath(path)
    check_output_path(path)
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, temporary_name(folder, name, suffix))
    try:
        with open(tmp, "wb"):
            pass
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        check_output_path(path)  # nothing else has appeared there meanwhile
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


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
