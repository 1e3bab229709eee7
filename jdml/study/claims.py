"""Reading a study's claims, and the stopping rule that knows the family.

A claim says that one row beats another in the study's test metric. Over the seeds both rows
have at a look, the per-seed differences give a mean and a Student-t interval at the look's
level (:func:`jdml.statistics.pocock_level`): its own verdict. Across the family, Holm's
step-down procedure (Holm, 1979) on the claims' p-values at the look's error gives each claim
its verdict under correction (:func:`holm_verdicts`).

**The stopping rule** (:func:`decide`): every row trains the first look's seeds; at the end of
a look, a claim stops only when its Holm verdict is settled there (a claim outside the family:
its own verdict), so that a claim that clears its own interval but not Holm's bound gets the
next look's seeds. At the last look every claim stops. A claim is read at the look it stopped
at (the ledger's decision), whatever seeds its rows get later for other claims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jdml.statistics import Paired, holm, paired, pocock_level

INTERIM_LEVEL = 0.95

Values = Mapping[int, float]  # seed -> the metric of one row's embedding


@dataclasses.dataclass(frozen=True)
class Reading:
    """A claim's paired difference ``row - base`` and where it was read: ``look`` (1-based;
    0: before look 1, over the seeds both rows have, at 95 %, deciding nothing)."""

    difference: Paired
    look: int

    @property
    def interim(self) -> bool:
        return self.look == 0

    def where(self, looks: int) -> str:
        level = f"{100 * self.difference.level:.2f} %"
        if self.interim:
            return f"{100 * INTERIM_LEVEL:.0f} %, before look 1"
        return f"{level}, look {self.look} of {looks}"


def look_level(looks: Sequence[int], alpha: float) -> float:
    """The interval level every look reads (Pocock's for ``len(looks)`` looks)."""
    return pocock_level(len(looks), alpha)


def embedding_name(config: Mapping[str, Any], concat: bool) -> str | None:
    """The embedding a claim reads of a row whose flattened config is ``config``: None for
    the main head; with ``concat``, its members' ensemble (a cohort) or its first weighted
    concatenation (``eval.combinations``), or None if it has one head."""
    if not concat:
        return None
    size = int(config.get("cohort.size", 1) or 1)
    if size > 1:
        return "concat:" + ",".join(["1"] * size)
    combinations = config.get("eval.combinations") or ()
    if combinations:
        return "concat:" + ",".join(f"{float(w):g}" for w in combinations[0])
    return None


def values(
    records: Mapping[int, Mapping[str, Any]], metric: str, embedding: str | None
) -> dict[int, float]:
    """seed -> the test ``metric`` of ``embedding`` (None: the main head) in a row's records."""
    out = {}
    for seed, record in records.items():
        found = record.get("results", {}).get("test", {})
        if embedding is not None:
            found = record.get("embeddings", {}).get("test", {}).get(embedding, {})
        if metric in found:
            out[seed] = float(found[metric])
    return out


def at_look(a: Values, b: Values, looks: Sequence[int], look: int, level: float) -> Paired | None:
    """The paired difference over the seeds of ``look`` (1-based: seeds 0 to
    ``looks[look - 1] - 1``), or None unless both rows have every one of them."""
    seeds = range(looks[look - 1])
    if any(s not in a or s not in b for s in seeds):
        return None
    return paired([a[s] for s in seeds], [b[s] for s in seeds], level)


def complete_looks(a: Values, b: Values, looks: Sequence[int]) -> int:
    """How many looks both rows have every seed of."""
    n = 0
    for k in range(1, len(looks) + 1):
        if all(s in a and s in b for s in range(looks[k - 1])):
            n = k
    return n


def read(
    a: Values, b: Values, looks: Sequence[int], level: float, stopped_at: int | None
) -> Reading | None:
    """A claim's reading: at the look it stopped at, else at the furthest look its rows
    complete, else (short of look 1) over the seeds both rows have at 95 %, or None."""
    look = stopped_at or complete_looks(a, b, looks)
    if look:
        d = at_look(a, b, looks, look, level)
        return None if d is None else Reading(d, look)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    return Reading(paired([a[s] for s in seeds], [b[s] for s in seeds], INTERIM_LEVEL), 0)


def paper_of(paper: str) -> str:
    """The paper a claim's ``paper`` label names: its part before the first comma or
    parenthesis (``"DiVA, Tab. 2"`` and ``"DiVA (control)"``: ``"DiVA"``)."""
    return paper.split(",")[0].split(" (")[0].strip()


def holm_verdicts(
    readings: Mapping[str, Reading],
    family: set[str],
    level: float,
    groups: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The verdict of each claim of ``family`` that has a reading at a look, under Holm's
    correction at the error ``1 - level``: across the whole family, or within each group of
    it (``groups``: claim -> its group, e.g. its paper). A rejected claim keeps the sign of its
    mean ("reproduces" / "does not reproduce"); any other is "not resolved"."""
    members = [k for k in readings if k in family and not readings[k].interim]
    out = {}
    for group in dict.fromkeys((groups or {}).get(k, "") for k in members):
        part = [k for k in members if (groups or {}).get(k, "") == group]
        flags = holm([readings[k].difference.p_value() for k in part], 1 - level)
        for key, flag in zip(part, flags, strict=True):
            mean = readings[key].difference.mean
            verdict = "reproduces" if mean > 0 else "does not reproduce"
            out[key] = verdict if flag else "not resolved"
    return out


def settled(key: str, reading: Reading, family: set[str], corrected: Mapping[str, str]) -> bool:
    """Whether a claim's verdict that counts is settled: its Holm verdict in the family, its
    own verdict outside it."""
    verdict = corrected.get(key) if key in family else reading.difference.verdict()
    return verdict is not None and verdict != "not resolved"


def decide(
    readings: Mapping[str, Reading],
    family: set[str],
    stopped: Mapping[str, int],
    look: int,
    looks: Sequence[int],
    level: float,
    groups: Mapping[str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """The stopping rule at the end of ``look`` (1-based).

    Args:
      readings: every claim's reading, the claims still going at ``look`` (those not in
        ``stopped``) read at ``look``, the others at the look they stopped at.
      family: the claims Holm's correction runs over.
      stopped: claim -> the look it stopped at, for those that stopped before.
      look: the look that has just ended.
      looks: the seeds of every look.
      level: the looks' interval level.
      groups: Holm's correction within each group (claim -> group) rather than across the
        whole family.

    Returns:
      The claims that stop at ``look`` and those that go on to the next, in the order of
      ``readings``; at the last look every claim still going stops.
    """
    corrected = holm_verdicts(readings, family, level, groups)
    stop, go_on = [], []
    for key, reading in readings.items():
        if key in stopped:
            continue
        if look >= len(looks) or settled(key, reading, family, corrected):
            stop.append(key)
        else:
            go_on.append(key)
    return stop, go_on


def family_groups(reg: Mapping[str, Any], by: str | None = None) -> dict[str, str] | None:
    """claim text -> its paper, when Holm's correction runs within each paper (``by``, default
    the registration's family of record); None across the whole family."""
    if (by or reg.get("family_by", "table")) != "paper":
        return None
    return {c["text"]: paper_of(c["paper"]) for c in reg["claims"]}


def claim_values(
    claim: Mapping[str, Any],
    configs: Mapping[str, Mapping[str, Any]],
    by_row: Mapping[str, Mapping[int, Mapping[str, Any]]],
    metric: str,
    fixed: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[dict[int, float], dict[int, float]] | None:
    """A claim's two sides, seed -> ``metric`` of the embedding it reads: its row's and its
    base row's, or for a claim against a fixed baseline that baseline's one value at each seed
    of the row (None while the baseline is not recorded)."""
    row = claim["row"]
    a = values(by_row.get(row, {}), metric, embedding_name(configs[row], claim["concat"]))
    if claim.get("fixed"):
        value = (fixed or {}).get(claim["fixed"], {}).get(metric)
        return None if value is None else (a, {s: float(value) for s in a})
    base = claim["base"]
    b = values(by_row.get(base, {}), metric, embedding_name(configs[base], claim["concat"]))
    return a, b


def claim_readings(
    reg: dict[str, Any],
    configs: dict[str, dict[str, Any]],
    by_row: dict[str, dict[int, dict[str, Any]]],
    stopped: dict[str, int],
    at: int | None = None,
    fixed: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Reading]:
    """Every claim's reading from the records (``reg``: a registration; ``configs``: the
    rows' flattened configs; ``fixed``: the fixed baselines, :mod:`jdml.study.baselines`). A
    claim that stopped is read at its look; one still going at the furthest look its rows
    complete, or at look ``at`` if given (:func:`claim_values` gives its two sides)."""
    level = look_level(reg["looks"], reg["alpha"])
    out = {}
    for claim in reg["claims"]:
        sides = claim_values(claim, configs, by_row, reg["metric"], fixed)
        if sides is None:
            continue
        reading = read(*sides, reg["looks"], level, stopped.get(claim["text"]) or at)
        if reading is not None:
            out[claim["text"]] = reading
    return out
