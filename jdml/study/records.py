"""Where a study keeps its runs and records, and how a record is written: once.

``DIR`` holds::

    study.json                       the study as data (the report reads it, never the file)
    ledger.jsonl                     the pre-registration, the looks' decisions, amendments
    optuna.journal                   the search's storage (unless --storage names a database)
    runs/tune/<row>/trial<n>[-fold<j>]/   tuning runs (validation only)
    runs/<row>/seed<s>/              the seed runs (validation selects, test evaluates once)
    records/tune/<row>/trial<n>[-fold<j>].json
    records/<row>/seed<s>.json       what the tables read (kept in git, as experiments/results)
    tasks/, logs/                    one task file and one log per run

A record is the small JSON the tables are computed from, in the format of the emoji
protocol's records (``experiments/results``): the commit, the data's checksum, the settings,
the validation curve, the test evaluation of the selected checkpoint and its per-query hits. It
is created once (:func:`write_once`): a second writer finds it there and leaves it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from jdml.fileio import temporary_name

RECORDS = "records"
RUNS = "runs"
TUNE = "tune"
SUPERSEDED = "superseded"


def tune_name(trial: int, fold: int | None) -> str:
    return f"trial{trial}" if fold is None else f"trial{trial}-fold{fold}"


def tune_record_path(directory: str, row: str, trial: int, fold: int | None) -> str:
    return os.path.join(directory, RECORDS, TUNE, row, tune_name(trial, fold) + ".json")


def seed_record_path(directory: str, row: str, seed: int) -> str:
    return os.path.join(directory, RECORDS, row, f"seed{seed}.json")


def tune_run_dir(directory: str, row: str, trial: int, fold: int | None) -> str:
    return os.path.join(directory, RUNS, TUNE, row, tune_name(trial, fold))


def seed_run_dir(directory: str, row: str, seed: int) -> str:
    return os.path.join(directory, RUNS, row, f"seed{seed}")


def read(path: str) -> dict[str, Any] | None:
    """A record, or None if there is none; a damaged one is an error naming it."""
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(
            f"record {path} is unreadable ({e}); move it away and run the study again to "
            "retrain that run"
        ) from None
    if not isinstance(record, dict):
        raise ValueError(f"record {path} is not a JSON object; move it away and run again")
    return record


def write_once(path: str, record: dict[str, Any]) -> bool:
    """Creates ``path`` with ``record`` unless it exists (True if this call created it).

    The content goes to a temporary file that is then hard-linked onto ``path``: the link
    fails if ``path`` exists, so two writers never both write it, and a kill leaves either no
    record or a whole one.
    """
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, temporary_name(folder, name))
    with open(tmp, "w") as f:
        f.write(json.dumps(record, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def seed_records(directory: str) -> dict[str, dict[int, dict[str, Any]]]:
    """Every seed record of ``directory``: row -> seed -> record."""
    return _seed_records_under(directory)


def superseded_records(directory: str) -> dict[str, dict[int, dict[str, Any]]]:
    """The seed records a later selection superseded (kept in ``DIR/superseded/``, as the
    runner's ``_supersede`` moved them): row -> seed -> record."""
    return _seed_records_under(os.path.join(directory, SUPERSEDED))


def _seed_records_under(directory: str) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(directory, RECORDS, "*", "seed*.json"))):
        row = os.path.basename(os.path.dirname(path))
        match = re.fullmatch(r"seed(\d+)\.json", os.path.basename(path))
        record = read(path) if match else None
        if record is not None:
            out.setdefault(row, {})[int(match.group(1))] = record
    return out


def commit() -> str:
    """The commit of the jdml checkout that runs, ``+dirty`` with local changes, or
    ``unknown`` outside a git checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def trained_values(record: Mapping[str, Any], space: Iterable[str]) -> dict[str, Any]:
    """The values of a row's searched keys (``space``) that a seed record was trained with
    (JSON: lists); a setting recorded under a key's old name (``jdml.keys.RENAMED_KEYS``, e.g.
    ``cohort.mutual_weight`` before DM2's settings moved to ``exchange.dm2``) is read under its
    new one."""
    from jdml.keys import RENAMED_KEYS

    settings = {RENAMED_KEYS.get(k, k): v for k, v in (record.get("settings") or {}).items()}
    return json.loads(json.dumps({k: settings[k] for k in space if k in settings}))


def stale_seeds(
    trained: Mapping[int, dict[str, Any]],
    space: Iterable[str],
    now: dict[str, Any],
    earlier: list[dict],
) -> list[int]:
    """The seeds of a row (its searched keys: ``space``) to train again with its selection
    ``now``: those trained with the values of an earlier selection (``earlier``), and those
    whose record does not name every searched key (values unknown, so not known to be the
    selection's).

    Args:
      trained: seed -> the values its record was trained with (:func:`trained_values`).
      space: the row's searched keys.
      now: its selected values (JSON form).
      earlier: the values of its earlier selections, oldest first.
    """
    keys = set(space)
    return sorted(s for s, v in trained.items() if v != now and (v in earlier or set(v) != keys))
