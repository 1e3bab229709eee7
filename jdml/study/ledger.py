"""A study's ledger: the pre-registration, each look's decisions and every amendment.

``DIR/ledger.jsonl`` is append-only, one JSON event per line:

* ``registered``: what :func:`jdml.study.spec.registration` declares (claims, family, the
  papers' effects, looks, stopping rule) and its sha256, written just before the first run
  that evaluates the test classes starts;
* ``look``: at the end of a look, which claims stop there and which go on;
* ``amendment``: the registration changed after it was frozen: the new one, its sha256,
  which parts changed and how many test results (seed records) existed when it was seen.

The report lists the amendments; the looks' decisions make a rerun take the same path.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jdml.fileio import read_jsonl
from jdml.study.spec import digest

LEDGER = "ledger.jsonl"


def path(directory: str) -> str:
    return os.path.join(directory, LEDGER)


def events(directory: str) -> list[dict[str, Any]]:
    """The ledger's events, oldest first (a line cut by a kill is dropped)."""
    if not os.path.exists(path(directory)):
        return []
    return read_jsonl(path(directory))


def append(directory: str, event: dict[str, Any]) -> dict[str, Any]:
    """Appends one event (with its time) and flushes it to disk."""
    event = {**event, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.makedirs(directory, exist_ok=True)
    with open(path(directory), "a") as f:
        f.write(json.dumps(event, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return event


def frozen(directory: str) -> dict[str, Any] | None:
    """The registration in force: the last ``registered`` or ``amendment`` event, or None."""
    found = None
    for event in events(directory):
        if event.get("event") in ("registered", "amendment"):
            found = event
    return found


def freeze(directory: str, registration: dict[str, Any], tests_seen: int = 0) -> dict[str, Any]:
    """Registers ``registration`` unless one is frozen already (``tests_seen``: the test
    results recorded by then, said when there are any); returns the one in force."""
    current = frozen(directory)
    if current is not None:
        return current
    event = {"event": "registered", "sha256": digest(registration), "registration": registration}
    return append(directory, {**event, "tests_seen": tests_seen} if tests_seen else event)


def amend_if_changed(
    directory: str, registration: dict[str, Any], tests_seen: int
) -> dict[str, Any] | None:
    """Appends an amendment if ``registration`` differs from the one in force (none before a
    registration is frozen); returns it, or None."""
    current = frozen(directory)
    if current is None or current["sha256"] == digest(registration):
        return None
    before = current["registration"]
    changed = sorted(k for k in {*before, *registration} if before.get(k) != registration.get(k))
    return append(
        directory,
        {
            "event": "amendment",
            "sha256": digest(registration),
            "registration": registration,
            "changed": changed,
            "tests_seen": tests_seen,
        },
    )


def amendments(directory: str) -> list[dict[str, Any]]:
    return [e for e in events(directory) if e.get("event") == "amendment"]


def look_decisions(directory: str) -> dict[int, dict[str, Any]]:
    """The ``look`` events by look number (1-based)."""
    return {int(e["look"]): e for e in events(directory) if e.get("event") == "look"}
