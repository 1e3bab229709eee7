"""``jdml study report DIR``: a study's page, generated from its records and ledger only.

The page (``DIR/report/report.md``) holds, in this order:

1. **the claims**: each claim's paired difference in the test metric over the seeds of the
   look it stopped at (or its rows' furthest complete look; "before look 1" readings are
   interim and decide nothing), its interval at the look's level, its own verdict, its verdict
   under Holm's correction across the family, the reading against the paper's effect, and the
   class bootstrap (an interval over seeds and test classes from the kept per-query hits,
   :func:`jdml.statistics.two_way_bootstrap`);
2. **the rows**: the selected hyperparameters, the tuning budget spent (candidates tried,
   failed, the selected one's validation score) and the test metrics, mean ± sample std;
3. **the amendments**: every change of the pre-registration after it was frozen, with how
   many test results existed then;
4. the commands that ran the study and made the page.

``claims.png`` is the forest plot of the claims, ``validation_curves.png`` the seed runs'
validation curves (mean and band over seeds per row), ``report.json`` the same data as the
page. Nothing in ``DIR`` is executed: ``study.json`` describes the study as data.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from jdml.errors import ReportError
from jdml.evaluation.per_query import paired_differences
from jdml.fileio import atomic_write
from jdml.statistics import Paired, mean_std, two_way_bootstrap
from jdml.study import baselines, ledger, tables
from jdml.study import claims as cl
from jdml.study import records as rec
from jdml.study.provenance import (
    amendments_text,
    current_stop_looks,
    first_reading,
    registered_text,
    registration_text,
    selection_table,
    tune_table,
    untuned_text,
    value_text,
)
from jdml.study.runner import selections

VERDICT_COLOURS = {
    "reproduces": "#1a9641",
    "does not reproduce": "#d7191c",
    "not resolved": "#888888",
}


def against_paper(d: Paired, effect: float | None) -> str:
    """The reading against the paper's effect (metric points): an interval wholly below it is
    **smaller than reported**; any other is **not below it** (some reported effect is still
    within reach, not that the paper's is confirmed). It can hold together with "not
    resolved": an interval around 0 that ends below the effect rules the effect out."""
    if effect is None or d.n < 2:
        return "-"
    return "smaller than reported" if 100 * d.high < effect else "not below it"


def load(directory: str) -> dict[str, Any]:
    """A study folder's description (``study.json``), checked to be one."""
    path = os.path.join(directory, "study.json")
    try:
        with open(path) as f:
            study = json.load(f)
    except FileNotFoundError:
        raise ReportError(
            f"{directory} is not a study folder (no study.json); give the --dir of a `jdml "
            "study run`"
        ) from None
    except (OSError, ValueError) as e:
        raise ReportError(f"{path} is unreadable ({e}); run `jdml study run` again") from None
    if not isinstance(study, dict) or "registration" not in study:
        raise ReportError(f"{path} is not a study description; run `jdml study run` again")
    return study


def class_bootstrap(
    claim: Mapping[str, Any],
    reading: cl.Reading,
    by_row: Mapping[str, Mapping[int, Mapping[str, Any]]],
    configs: Mapping[str, Mapping[str, Any]],
    metric: str,
) -> tuple[Paired, Paired] | None:
    """The claim's bootstrap intervals over seeds alone and over seeds and test classes
    (:func:`jdml.statistics.two_way_bootstrap`), at its reading's level and over its seeds, or
    None when a record of those seeds lacks the per-query hits or the claim is against a fixed
    baseline."""
    if claim.get("fixed"):
        return None
    n = reading.difference.n
    blocks = []
    for row in (claim["row"], claim["base"]):
        found = {s: r["per_query"]["test"] for s, r in by_row.get(row, {}).items()
                 if "test" in r.get("per_query", {})}  # fmt: skip
        blocks.append(found)
    seeds = sorted(set(blocks[0]) & set(blocks[1]))[:n] if reading.interim else list(range(n))
    if len(seeds) < n or any(s not in b for b in blocks for s in seeds):
        return None
    names = tuple(
        cl.embedding_name(configs[r], claim["concat"]) for r in (claim["row"], claim["base"])
    )
    try:
        hits, classes, _ = paired_differences(
            {s: blocks[0][s] for s in seeds}, {s: blocks[1][s] for s in seeds}, names, metric
        )
    except ValueError:
        return None
    level = reading.difference.level
    return (
        two_way_bootstrap(hits, classes, level, over_classes=False),
        two_way_bootstrap(hits, classes, level),
    )


def _seeds_of(reading: cl.Reading, a: Mapping[int, float], b: Mapping[int, float]) -> list[int]:
    """The seeds a reading is over (a look's first seeds; before look 1, those both rows have)."""
    if reading.interim:
        return sorted(set(a) & set(b))[: reading.difference.n]
    return list(range(reading.difference.n))


def _compared(
    claim: Mapping[str, Any],
    labels: Mapping[str, str],
    configs: Mapping[str, Mapping[str, Any]],
    fixed: Mapping[str, Mapping[str, Any]],
) -> str:
    """The rows a claim compares and the embedding it reads of them."""
    if claim.get("fixed"):
        name = fixed.get(claim["fixed"], {}).get("label") or baselines.FIXED[claim["fixed"]]
        return f"{labels[claim['row']]} - {name.split(' (')[0]}"
    if claim["concat"]:
        what = "concatenation"
    elif int(configs[claim["row"]].get("cohort.size", 1) or 1) > 1:
        what = "member 1"
    else:
        what = "one head"
    return f"{labels[claim['row']]} - {labels[claim['base']]} ({what})"


def claim_entries(
    study: dict,
    by_row: dict,
    directory: str,
    fixed: Mapping[str, Mapping[str, Any]],
    stopped: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Every registered claim with its reading (``mean``, ``low``, ``high``, ``seeds``, the
    per-seed ``differences`` in points, verdicts, the class ``bootstrap``), in the
    registration's order; a claim without a reading yet has only its declaration. ``stopped``
    (claim text -> look) replaces the ledger's decisions (:func:`first_reading`'s)."""
    reg = study["registration"]
    configs = {r["name"]: r["config"] for r in study["rows"]}
    stopped = current_stop_looks(directory) if stopped is None else stopped
    readings = cl.claim_readings(reg, configs, by_row, stopped, fixed=fixed)
    family = {c["text"] for c in reg["claims"] if c["family"]}
    level = cl.look_level(reg["looks"], reg["alpha"])
    record = reg.get("family_by", "table")
    other = "paper" if record == "table" else "table"
    # Holm's correction over part of the family would be looser than over all of it: it waits
    # until every claim of the family is read at a look.
    waiting = sum(1 for t in family if t not in readings or readings[t].interim)
    corrected = {} if waiting else cl.holm_verdicts(readings, family, level, cl.family_groups(reg))
    beside = (
        {} if waiting else cl.holm_verdicts(readings, family, level, cl.family_groups(reg, other))
    )
    labels = {r["name"]: r["label"] for r in study["rows"]}
    out = []
    for claim in reg["claims"]:
        claim = {"fixed": "", **claim, **_smallest(claim)}
        reading = readings.get(claim["text"])
        entry: dict[str, Any] = {**claim, "compared": _compared(claim, labels, configs, fixed)}
        entry["holm_waiting"] = waiting if claim["family"] else 0
        if reading is None:
            out.append(entry)
            continue
        d = reading.difference
        a, b = cl.claim_values(claim, configs, by_row, reg["metric"], fixed)
        boot = class_bootstrap(claim, reading, by_row, configs, reg["metric"])
        entry.update(
            seeds=d.n,
            mean=d.mean,
            low=d.low,
            high=d.high,
            level=d.level,
            look=reading.look,
            where=reading.where(len(reg["looks"])),
            verdict=d.verdict(),
            holm=corrected.get(claim["text"]),
            holm_other=beside.get(claim["text"]),
            family_by=record,
            # An interim reading decides nothing, against the paper's effect neither.
            against_paper="- (interim)" if reading.interim else against_paper(d, claim["effect"]),
            differences=[100 * (a[s] - b[s]) for s in _seeds_of(reading, a, b)],
            bootstrap=None
            if boot is None
            else {
                "mean": boot[1].mean,
                "low": boot[1].low,
                "high": boot[1].high,
                "verdict": boot[1].verdict(),
                "seeds_only": {"low": boot[0].low, "high": boot[0].high},
            },
        )
        out.append(entry)
    against_papers_holm(out, level)
    return out


def _smallest(claim: Mapping[str, Any]) -> dict[str, Any]:
    """A registered claim's effects (``effects``, or its one ``effect``), and the smallest as
    its ``effect`` and ``source``: the one the claim is read against."""
    printed = list(claim.get("effects") or [])
    if not printed and claim.get("effect") is not None:
        printed = [{"value": claim["effect"], "source": claim.get("source", "")}]
    if not printed:
        return {"effects": [], "effect": None}
    low = min(printed, key=lambda e: e["value"])
    return {"effects": printed, "effect": low["value"], "source": low["source"]}


def against_papers_holm(entries: list[dict[str, Any]], level: float) -> None:
    """The readings against the papers' effects under Holm's correction across them
    (``against_paper_holm``; ``against_papers`` counts them): each claim read at a look, with
    an effect, tests "its true difference is its smallest effect or more" one-sided
    (:meth:`jdml.statistics.Paired.p_below`) at the error the interval-below reading has alone,
    half of ``1 - level``; a claim Holm rejects is **smaller than reported**, any other **not
    below it**."""
    from jdml.statistics import holm

    tested = [e for e in entries if "mean" in e and e["look"] and e["effect"] is not None
              and e["seeds"] >= 2]  # fmt: skip
    # As Holm's verdicts: over every claim with an effect, or (some not read yet) none.
    waiting = sum(1 for e in entries if e["effect"] is not None) - len(tested)
    for e in entries:
        e["against_papers"] = 0 if waiting else len(tested)
        e["against_papers_waiting"] = waiting
    if not tested or waiting:
        return
    p_values = [tables.difference(e).p_below(e["effect"] / 100) for e in tested]
    for e, flag in zip(tested, holm(p_values, (1 - level) / 2), strict=True):
        e["against_paper_holm"] = "smaller than reported" if flag else "not below it"


def _rows(study: dict, by_row: dict, directory: str) -> list[dict[str, Any]]:
    chosen = selections(directory)
    out = []
    for row in study["rows"]:
        records = by_row.get(row["name"], {})
        tests = [r["results"]["test"] for _, r in sorted(records.items())]
        metrics = {}
        for m in study["metrics"]:
            values = [t[m] for t in tests if m in t]
            if values:
                mean, std = mean_std(values)
                metrics[m] = {"mean": mean, "std": std, "values": values}
        picked = chosen.get(row["name"], {})
        out.append(
            {
                "name": row["name"],
                "label": row["label"],
                "seeds": sorted(records),
                "selected": picked.get("values"),
                "trial": picked.get("trial"),
                "tried": picked.get("tried", 0 if picked.get("trial") is None else None),
                "failed": picked.get("failed", 0),
                "shared_from": picked.get("shared_from"),
                "score": picked.get("score"),
                "epochs": sorted({r["meta"].get("epoch") for r in records.values()}),
                "test": metrics,
            }
        )
    return out


def budget_sentence(rows: list[dict[str, Any]], study: dict, selection: str) -> str:
    """The tuning budget, and whether every row spent it (a comparison at equal tuning)."""
    budget = study["budget"]
    fewer = [r["label"] for r in rows if r["selected"] is not None and budget > 1
             and (r["tried"] or 0) < budget]  # fmt: skip
    text = (
        f"The budget: {budget} candidate(s) per row ({study['sampler']} sampler), scored on "
        f"{selection} at seed {study['tune_seed']}"
    )
    if not fewer:
        return text + "; every row searched with it."
    return (
        text + f"; {len(fewer)} of {len(rows)} rows searched fewer (their values were their own "
        f"or selected for another row), so this is not a comparison at equal tuning: "
        f"{'; '.join(fewer)}."
    )


def _rows_table(rows: list[dict[str, Any]], study: dict) -> str:
    metrics = study["metrics"]
    header = ["row", "seeds", "selected values", "candidates tried (failed)", "selected val score",
              *(f"test {m}" for m in metrics)]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        values = "-" if r["selected"] is None else (", ".join(
            f"{k}={value_text(v)}" for k, v in r["selected"].items()) or "(none)")  # fmt: skip
        tried = (
            "-"
            if r["selected"] is None
            else (untuned_text(r) if not r["tried"] else f"{r['tried']} ({r['failed']})")
        )
        score = "-" if r["score"] is None else f"{100 * r['score']:.2f}"
        cells = [r["label"], str(len(r["seeds"])), values, tried, score]
        for m in metrics:
            found = r["test"].get(m)
            if found is None:
                cells.append("-")
            elif len(found["values"]) > 1:
                cells.append(f"{100 * found['mean']:.2f} ± {100 * found['std']:.2f}")
            else:
                cells.append(f"{100 * found['mean']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def forest_plot(claims: list[dict[str, Any]], metric: str, path: str) -> bool:
    """The claims' paired differences and intervals, one line each, coloured by their Holm
    verdict (their own outside the family); the claims against a fixed baseline, often tens of
    points away, are left out (the table has them). False if no claim is shown."""
    from jdml.visualize.figure import figure, save_png

    shown = [c for c in claims if "mean" in c and not c.get("fixed")]
    if not shown:
        return False
    with figure(900, int(42 * len(shown) + 140), layout="constrained") as fig:
        ax = fig.add_subplot()
        for y, c in enumerate(reversed(shown)):
            colour = VERDICT_COLOURS[c["holm"] or c["verdict"]]
            if c["seeds"] > 1:
                ax.plot([100 * c["low"], 100 * c["high"]], [y, y], color=colour, lw=2)
            ax.plot(100 * c["mean"], y, "o", color=colour)
            if c["effect"] is not None:
                ax.plot(c["effect"], y, "|", color="black", ms=10)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(shown)), [c["text"] for c in reversed(shown)], fontsize=8)
        ax.set_xlabel(f"Δ test {metric}, points (paired over seeds; |: the paper's effect)")
        handles = [
            ax.plot([], [], color=col, marker="o", lw=2, label=v)[0]
            for v, col in VERDICT_COLOURS.items()
        ]
        title = "verdict (Holm's in the family)"
        fig.legend(handles=handles, fontsize=8, loc="outside right upper", title=title,
                   title_fontsize=8)  # fmt: skip
        save_png(fig, path)
    return True


def validation_plot(study: dict, by_row: dict, path: str) -> bool:
    """Each row's validation curve of its seed runs (mean and std band over seeds)."""
    from jdml.visualize.curves import curves_with_bands

    metric = study["registration"]["metric"]
    series = []
    for row in study["rows"]:
        curves = [r.get("val_curve", []) for _, r in sorted(by_row.get(row["name"], {}).items())]
        epochs = sorted({p["epoch"] for c in curves for p in c if p.get("epoch") is not None})
        table = [{p["epoch"]: p.get(metric) for p in c} for c in curves]
        full = [e for e in epochs if all(isinstance(t.get(e), int | float) for t in table)]
        if not full or not table:
            continue
        values = np.array([[100 * t[e] for e in full] for t in table], np.float64)
        series.append((row["label"], np.array(full, np.float64), values))
    return curves_with_bands(series, path, xlabel="epoch", ylabel=f"validation {metric} (%)")


def _dataset_and_epochs(study: dict) -> tuple[str, int]:
    """The data set's name and the epoch budget of the study's rows (their first row's)."""
    config = study["rows"][0]["config"] if study["rows"] else {}
    name = str(config.get("data.name") or os.path.basename(str(config.get("data.path", ""))))
    return name or "data", int(config.get("train.epochs") or 0)


def _fixed(directory: str) -> dict[str, dict[str, Any]]:
    try:
        return baselines.read(directory)
    except ValueError as e:
        raise ReportError(str(e)) from None


#: What ``jdml study report DIR --print PART`` prints (``budget:N``: a window of N epochs;
#: ``table:ROW,...``: those rows side by side, the first the others are compared with).
PARTS = ("claims", "claims-before", "readings", "seeds-needed", "design", "classes", "tune",
         "selection", "registration", "budget:N", "table:ROW,...")  # fmt: skip


def part(directory: str, name: str, seeds: int | None = None, title: str | None = None) -> str:
    """One part of the study's report (a name of :data:`PARTS`), as Markdown; a table reads
    only the first ``seeds`` seeds if given, under the header ``title``.

    Raises:
      ReportError: not a study folder, an unknown part or row.
    """
    study = load(directory)
    reg = study["registration"]
    level = cl.look_level(reg["looks"], reg["alpha"])
    if name == "design":
        return tables.design(reg["looks"], level)
    by_row = rec.seed_records(directory)
    claims = claim_entries(study, by_row, directory, _fixed(directory))
    dataset, epochs = _dataset_and_epochs(study)
    if name == "claims":
        title = f"{dataset} test, {epochs} epochs"
        text = tables.claims_table(claims, title, reg["metric"])
        if any(c.get("look") for c in claims):  # interim readings decide nothing
            text += "\n" + tables.holm_sentence(claims) + "\n" + tables.paper_sentence(claims)
        return text
    if name == "claims-before":
        first = first_reading(directory, reg["looks"])
        if first is None:
            return ("No seed was trained again and no look decided again: the claims table is "
                    "the first reading.\n")  # fmt: skip
        before = claim_entries(study, first[0], directory, _fixed(directory), stopped=first[1])
        title = f"{dataset} test, {epochs} epochs, before"
        return (tables.claims_table(before, title, reg["metric"]) + "\n"
                + tables.holm_sentence(before) + "\n" + tables.paper_sentence(before))  # fmt: skip
    if name == "selection":
        return selection_table(directory, study)
    if name == "registration":
        return registration_text(directory, study)
    if name == "readings":
        return tables.readings(claims)
    if name == "seeds-needed":
        return tables.seeds_needed(claims, level)
    if name == "classes":
        return tables.classes_table(claims)
    if name == "tune":
        return tune_table(directory, study)
    if name.startswith("table:"):
        rows = {r["name"]: r for r in study["rows"]}
        names = [n for n in name[6:].split(",") if n]
        fixed = _fixed(directory)
        unknown = [n for n in names if n not in rows and n not in fixed]
        if unknown or not names:
            raise ReportError(
                f"--print {name!r}: no row(s) {unknown or names}; the study's rows: "
                f"{', '.join(rows)} (and the fixed baselines {', '.join(fixed) or 'none'})"
            )
        head = title or f"{dataset} test, %, {epochs} epochs"
        try:
            return tables.group_table(names, rows, by_row, fixed, study["metrics"], head, seeds)
        except ValueError as e:
            raise ReportError(f"--print {name!r}: {e}") from None
    if name.startswith("budget:") and name[7:].isdigit():
        labels = {r["name"]: r["label"] for r in study["rows"]}
        try:
            return tables.budget_table(
                claims, by_row, labels, dataset, epochs, int(name[7:]), reg["metric"]
            )
        except ValueError as e:
            raise ReportError(str(e)) from None
    raise ReportError(f"--print {name!r}: choose one of {', '.join(PARTS)}")


def plot_claims(directory: str, path: str) -> bool:
    """The forest plot of the study's claims (:func:`forest_plot`) written to ``path``."""
    study = load(directory)
    claims = claim_entries(study, rec.seed_records(directory), directory, _fixed(directory))
    return forest_plot(claims, study["registration"]["metric"], path)


def report(directory: str, out: str | None = None) -> dict[str, Any]:
    """Writes the study's page, plots and JSON to ``out`` (default ``DIR/report``).

    Returns:
      ``{"markdown": the page, "files": the files written, "data": the JSON's content}``.

    Raises:
      ReportError: ``directory`` is not a study folder.
    """
    from jdml.workdir import check_writable

    study = load(directory)
    out = out or os.path.join(directory, "report")
    check_writable(out, "output folder (--out)")
    by_row = rec.seed_records(directory)
    reg = study["registration"]
    fixed = _fixed(directory)
    claims = claim_entries(study, by_row, directory, fixed)
    rows = _rows(study, by_row, directory)
    amendments = ledger.amendments(directory)
    frozen = next((e for e in ledger.events(directory) if e.get("event") == "registered"), None)
    files = []
    plot = os.path.join(out, "claims.png")
    if forest_plot(claims, reg["metric"], plot):
        files.append(plot)
    curves = os.path.join(out, "validation_curves.png")
    if validation_plot(study, by_row, curves):
        files.append(curves)
    level = cl.look_level(reg["looks"], reg["alpha"])
    dataset, epochs = _dataset_and_epochs(study)
    run_command = study.get("command") or f"jdml study run STUDY --dir {directory}"
    report_command = f"jdml study report {directory}" + (
        f" --out {out}" if out != os.path.join(directory, "report") else ""
    )
    selection = (
        "one validation hold-out"
        if study["selection"]["folds"] == 1
        else f"the mean over {study['selection']['folds']} class-disjoint folds"
    )
    commands = f"Commands: `{report_command}`, from the runs of `{run_command}`."
    read = tables.read(claims)
    sentences = classes = ""
    if any(c.get("look") for c in claims):  # interim readings decide nothing
        sentences = tables.holm_sentence(claims) + "\n" + tables.paper_sentence(claims) + "\n"
        classes = "## The test classes as a second source of variance\n\n"
        classes += tables.classes_table(claims) + "\n"
    parts = [
        f"# {study['name']}\n\n",
        f"Generated from the records in `{directory}`; every table by `{report_command}` (one "
        f"part alone: `--print {'|'.join(PARTS)}`).\n\n",
        "## Claims\n\n",
        tables.claims_table(claims, f"{dataset} test, {epochs} epochs", reg["metric"]),
        f"\nTest classes (unseen), points; Δ: the per-seed paired difference, mean and Student-t "
        f"interval at the looks' level {100 * level:.2f} % (Pocock, {len(reg['looks'])} look(s) "
        f"of {', '.join(map(str, reg['looks']))} seeds, alpha {reg['alpha']:g}); Holm: across "
        f"the family at the same error. Pre-registration {registered_text(frozen)}. "
        f"{commands}\n\n",
        sentences,
        "![the claims' paired differences and intervals](claims.png)\n\n" if plot in files else "",
        ("## Readings per paper\n\n" + tables.readings(claims) + "\n") if read else "",
        "## The design\n\n",
        tables.design(reg["looks"], level),
        ("\n" + tables.seeds_needed(claims, level)) if read else "",
        "\n## Rows\n\n",
        _rows_table(rows, study),
        f"\n{budget_sentence(rows, study, selection)} Test: mean ± sample std over seeds. "
        f"{commands}\n\n",
        "![validation curves](validation_curves.png)\n\n" if curves in files else "",
        classes,
        "## Amendments\n\n",
        amendments_text(amendments),
    ]
    page = "".join(parts)
    data = {
        "study": study["name"],
        "registration": reg,
        "registered": frozen,
        "fixed": fixed,
        "claims": claims,
        "rows": rows,
        "amendments": amendments,
        "commands": {"run": run_command, "report": report_command},
    }
    md, js = os.path.join(out, "report.md"), os.path.join(out, "report.json")
    atomic_write(md, page)
    atomic_write(js, json.dumps(data, indent=1, default=float) + "\n")
    return {"markdown": page, "files": [md, js, *files], "data": data}
