"""How a study's rows were tuned and its claims declared, read from its folder: every candidate
of each row's search and what each row's tuning cost (the seeds trained again after a later
selection), the registration's hashes and dates with the test results the ledger records after
them, and the claims' first reading (the records and look decisions before any seed was trained
again or any look decided again). :mod:`jdml.study.report` quotes these parts."""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from jdml.study import ledger
from jdml.study import records as rec
from jdml.study.runner import candidate_score, current_decision, selections, stops_of


def value_text(v: Any) -> str:
    """A setting's value as the tables print it (a float to 4 significant digits)."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def values_text(values: Mapping[str, Any] | None) -> str:
    """A row's values as ``key=value, ...`` ("-": none selected yet)."""
    if values is None:
        return "-"
    return ", ".join(f"{k}={value_text(v)}" for k, v in values.items()) or "(none)"


def untuned_text(row: Mapping[str, Any]) -> str:
    """Where a row's values came from when it was not searched."""
    if row.get("shared_from"):
        return f"0 (the values selected for {', '.join(row['shared_from'])})"
    return "0 (budget 1: its own values)"


def registered_text(frozen: Mapping[str, Any] | None) -> str:
    """When the registration was frozen, its hash, and whether test results preceded it."""
    if frozen is None:
        return "not frozen yet (no test evaluation)"
    text = f"frozen at {frozen['time']} (sha256 {frozen['sha256'][:12]})"
    if frozen.get("tests_seen"):
        text += (
            f", after {frozen['tests_seen']} test result(s) had been recorded: registered "
            "after the results, not before them"
        )
    return text


def amendments_text(events: list[dict[str, Any]]) -> str:
    """One numbered line per amendment: when, what changed, the test results seen, the hash."""
    if not events:
        return (
            "None: the pre-registration in force is the one frozen at the first test evaluation.\n"
        )
    lines = []
    for i, e in enumerate(events, 1):
        lines.append(
            f"{i}. {e['time']}: {', '.join(e['changed'])} changed after {e['tests_seen']} test "
            f"result(s) had been recorded (registration sha256 {e['sha256'][:12]})."
        )
    return "\n".join(lines) + "\n"


def current_stop_looks(directory: str) -> dict[str, int]:
    """claim text -> the look it stopped at, from the ledger's decisions that still hold
    (:func:`jdml.study.runner.current_decision`: not one a later retraining or a change of
    stopping rule reopened, which the study decides again)."""
    holding: dict[int, dict[str, Any]] = {}
    for look in sorted(ledger.look_decisions(directory)):
        event = current_decision(directory, look)
        if event is None:
            break  # this look and the later ones are decided again
        holding[look] = event
    return stops_of(holding)


def first_reading(
    directory: str, looks: list[int]
) -> tuple[dict[str, dict[int, dict]], dict[str, int]] | None:
    """The seed records and the looks' decisions as they stood just before the study first
    trained seeds again (a ``superseded`` event) or decided a look again (a ``look`` event for a
    look already decided, as a change of stopping rule asks): every superseded record back in
    its place, only the seeds of the looks decided then. None: neither happened, or no look
    had been decided before (the readings now are the first).

    Args:
      directory: the study folder.
      looks: the registration's seeds per look.
    """
    events = ledger.events(directory)
    decided: dict[int, dict[str, Any]] = {}
    for e in events:
        kind = e.get("event")
        if kind == "superseded" or (kind == "look" and decided and e["look"] <= max(decided)):
            break
        if kind == "look":
            decided[int(e["look"])] = e
    else:
        return None
    if not decided:
        return None
    by_row = rec.seed_records(directory)
    for row, records in rec.superseded_records(directory).items():
        by_row.setdefault(row, {}).update(records)
    kept = looks[max(decided) - 1]
    by_row = {row: {s: r for s, r in records.items() if s < kept} for row, records in
              by_row.items()}  # fmt: skip
    return by_row, stops_of(decided)


def tune_table(directory: str, study: dict) -> str:
    """Every candidate each row's search tried: its values, its validation score (the best
    epoch's metric, the mean over the folds) and that epoch; the selected one in bold."""
    metric = study["registration"]["metric"]
    folds = study["selection"]["folds"]
    chosen = selections(directory)
    lines = [
        f"| row | candidate | values | best val {metric} | at epoch |",
        "|---|---|---|---|---|",
    ]
    for row in study["rows"]:
        trials = sorted({int(m.group(1)) for p in glob.glob(os.path.join(
            directory, rec.RECORDS, rec.TUNE, row["name"], "trial*.json"))
            if (m := re.match(r"trial(\d+)", os.path.basename(p)))})  # fmt: skip
        for trial in trials:
            first_fold = None if folds == 1 else 0
            record = rec.read(rec.tune_record_path(directory, row["name"], trial, first_fold))
            score = candidate_score(directory, row["name"], trial, folds)
            if record is None or score is None:
                continue  # a candidate still running
            values = ", ".join(f"{k}={value_text(v)}" for k, v in record.get("settings", {}).items()
                               if k in row["space"])  # fmt: skip
            mark = "**" if chosen.get(row["name"], {}).get("trial") == trial else ""
            epoch = str(record["best"]["epoch"]) if folds == 1 else "-"
            said = f"{100 * score:.2f}" if math.isfinite(score) else "diverged"
            lines.append(f"| {row['label']} | {mark}{trial}{mark} | {values or '-'} | {said} "
                         f"| {epoch} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def selection_table(directory: str, study: dict) -> str:
    """Each row's tuning and what it cost: the candidates its search tried (or whose values it
    took), its selection with the validation score, the values its seeds were first trained
    with where a later selection superseded them, the seeds superseded (they train again), and
    its runs (tuning runs, seed records now, superseded records kept); then the totals."""
    chosen = selections(directory)
    events = ledger.events(directory)
    old = rec.superseded_records(directory)
    now = rec.seed_records(directory)
    folds = study["selection"]["folds"]
    lines = [
        "| row | candidates | selection (val score) | first trained with "
        "| seeds superseded (train again) | tuning runs | seed runs now | runs in all |",
        "|---|---|---|---|---|---|---|---|",
    ]
    totals = [0, 0, 0]
    for row in study["rows"]:
        name = row["name"]
        picked = chosen.get(name, {})
        tunes = len(glob.glob(os.path.join(directory, rec.RECORDS, rec.TUNE, name, "trial*.json")))
        if picked.get("trial") is not None:
            tried = f"{picked.get('tried')} searched ({picked.get('failed', 0)} diverged)"
        elif tunes or not picked:  # a search under way: its values until it ends
            tried = f"search under way ({tunes // max(folds, 1)} of {study['budget']} recorded)"
        else:
            tried = untuned_text(picked)
        score = picked.get("score")
        selection = values_text(picked.get("values")) + (
            f" ({100 * score:.2f})" if score is not None else "")  # fmt: skip
        moved = [e for e in events if e.get("event") == "superseded" and e["row"] == name]
        first = "; ".join(values_text(e["values"]) for e in moved) or "the selection"
        again = sorted(s for e in moved for s in e["seeds"])
        seeds, kept = len(now.get(name, {})), len(old.get(name, {}))
        totals = [totals[0] + tunes, totals[1] + seeds, totals[2] + kept]
        lines.append(
            f"| {row['label']} | {tried} | {selection} | {first} | "
            f"{', '.join(map(str, again)) or '-'} | {tunes} | {seeds} | {tunes + seeds + kept} |"
        )
    lines.append(
        f"\nIn all {sum(totals)} runs: {totals[0]} tuning runs (validation only), {totals[1]} "
        f"seed runs recorded now, and {totals[2]} superseded seed runs kept in "
        f"{rec.SUPERSEDED}/ (trained with an earlier selection; those seeds train again with "
        "the selection).\n"
    )
    return "\n".join(lines) + "\n"


def registration_text(directory: str, study: dict) -> str:
    """When the pre-registration (claims, family, the papers' effects, looks, alpha) was frozen
    and each time it was amended, with its sha256 and how many test results existed then;
    what is in force; and how many test results were recorded after the last change, so that
    a reader sees which results the declarations came before."""
    events = ledger.events(directory)
    frozen = next((e for e in events if e.get("event") == "registered"), None)
    if frozen is None:
        return "Not frozen yet: no test result has been recorded.\n"
    changes = ledger.amendments(directory)
    lines = [f"The pre-registration was {registered_text(frozen)}."]
    if changes:
        lines += ["", "Amended:", "", amendments_text(changes).rstrip("\n")]
    reg = study["registration"]
    family = [c for c in reg["claims"] if c["family"]]
    effects = [c for c in reg["claims"] if c.get("effects") or c.get("effect") is not None]
    last = (changes or [frozen])[-1]
    read_as = "per paper" if reg.get("family_by") == "paper" else "as one table"
    at = max(i for i, e in enumerate(events) if e.get("event") in ("registered", "amendment"))
    after = [e for e in events[at + 1 :] if e.get("event") == "tested"]
    late = sum(1 for e in after if e.get("logged_late"))
    lines += [
        "",
        f"In force: sha256 {last['sha256'][:12]} ({last['time']}): {len(reg['claims'])} claims, "
        f"a family of {len(family)} read {read_as}, {len(effects)} with the papers' effects "
        f"declared. Test results the ledger records after it: {len(after)}"
        + (f", the first at {after[0]['time']}" if after else "")
        + (f" ({late} logged when the study was next started)." if late else "."),
    ]
    return "\n".join(lines) + "\n"
