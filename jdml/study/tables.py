"""The text parts of a study's report that read its claims: each printed alone by ``jdml study
report DIR --print PART`` (for a page that quotes them) and gathered on the report's page.

Every function takes the claims as :func:`jdml.study.report.claim_entries` gives them (dicts:
the registration's claim plus its reading) and returns Markdown ending in a newline.

* :func:`claims_table`: one row per claim: its paper and what it says, the rows compared (and
  the embedding read: one head, a cohort's member 1, or the concatenation), seeds, the paired
  difference with its interval, the look, its verdict, its Holm verdict, the paper's effect and
  the reading against it, and the class bootstrap when any claim's records keep per-query hits;
* :func:`holm_sentence`, :func:`paper_sentence`: what Holm's correction changes, and which
  claims are smaller than their paper reports;
* :func:`readings`: one paragraph per paper, one line per claim;
* :func:`seeds_needed`: the seeds an unresolved claim would need at its paper's effect;
* :func:`design`: the looks' level and its simulated false-verdict rates;
* :func:`budget_table`: whether the epoch budget reaches each claim row's plateau;
* :func:`classes_table`: the claims read over seeds and test classes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jdml.statistics import Paired, false_verdict_rate, mean_std, seeds_to_resolve

Entry = Mapping[str, Any]


def difference(c: Entry) -> Paired:
    """A read claim's paired difference (fractions, as the records hold the metric)."""
    return Paired(c["mean"], c["low"], c["high"], c["seeds"], c["level"])


def read(claims: Sequence[Entry]) -> list[Entry]:
    return [c for c in claims if "mean" in c]


def group(c: Entry) -> str:
    """The paper a claim belongs to (:func:`jdml.study.claims.paper_of`)."""
    from jdml.study.claims import paper_of

    return paper_of(c["paper"]) or "Claims"


def where(c: Entry) -> str:
    """Where in the paper a claim is (``"a control"`` for a comparison the study adds)."""
    if "(control)" in c["paper"]:
        return "a control"
    return c["paper"].split(", ", 1)[-1] if ", " in c["paper"] else ""


def _paper_effect(c: Entry) -> str:
    """The smallest effect the paper prints, where, and of how many."""
    if c["effect"] is None:
        return "-"
    where = [c["source"]] if c["source"] else []
    if len(c.get("effects") or ()) > 1:
        where.append(f"smallest of {len(c['effects'])}")
    return f"{c['effect']:+.2f}" + (f" ({'; '.join(where)})" if where else "")


def against(c: Entry) -> str:
    """A claim's reading against its paper's effect: under Holm's correction across the
    readings where it has one (:func:`jdml.study.report.against_papers_holm`), else its own."""
    return c.get("against_paper_holm") or c["against_paper"]


def _holm_cell(c: Entry) -> str:
    if c.get("holm"):
        return f"**{c['holm']}**"
    if c["look"] == 0:
        return "- (interim)"
    if c.get("holm_waiting"):
        return f"- (waiting for {c['holm_waiting']} claim(s))"
    return "- (fixed baseline)" if c.get("fixed") else "- (not in the family)"


def _bootstrap_cell(c: Entry) -> str:
    boot = c.get("bootstrap")
    if boot is None:
        return "-"
    return f"[{100 * boot['low']:+.2f}, {100 * boot['high']:+.2f}] {boot['verdict']}"


def claims_table(claims: Sequence[Entry], title: str, metric: str) -> str:
    """The claims table (claims without a reading yet have a row of dashes)."""
    family = sum(1 for c in claims if c.get("holm") or c.get("holm_waiting"))
    boot = any(c.get("bootstrap") for c in claims)
    tested = max((c.get("against_papers", 0) for c in claims), default=0)
    corrected = f" (Holm across {tested})" if tested else ""
    record = next((c["family_by"] for c in claims if c.get("family_by")), "table")
    beside = len({group(c) for c in claims if c.get("holm")}) > 1  # the other family differs
    other = "Holm, per paper" if record == "table" else "Holm, whole table"
    holm = "Holm verdict" + (", per paper" if record == "paper" else "")
    header = (
        f"| claim, {title} | says | rows compared | seeds | Δ {metric} [CI] | CI level, look "
        f"| verdict | {holm} ({family} claims) |" + (f" {other} |" if beside else "")
        + f" paper's effect (smallest) | against the paper's effect{corrected} |"
        + (" bootstrap over seeds and classes |" if boot else "")
    )  # fmt: skip
    lines = [header, "|---" * (10 + beside + boot) + "|"]
    for c in claims:
        cells = [c["paper"] or "-", c["text"], c["compared"]]
        if "mean" not in c:
            cells += ["0", "-", "no seeds yet", "-", "-", *["-"] * beside, _paper_effect(c), "-"]
        else:
            cells += [str(c["seeds"]), difference(c).cell(), c["where"], f"**{c['verdict']}**"]
            cells += [_holm_cell(c)]
            if beside:
                cells.append(f"**{c['holm_other']}**" if c.get("holm_other") else "-")
            cells += [_paper_effect(c), against(c)]
        if boot:
            cells.append(_bootstrap_cell(c))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _named(c: Entry) -> str:
    return f"{c['paper']}: {c['text']}" if c["paper"] else c["text"]


def holm_sentence(claims: Sequence[Entry]) -> str:
    """Which verdicts Holm's correction across the family of record changes (and, where the
    claims come from several papers, which the other family would)."""
    waiting = max((c.get("holm_waiting", 0) for c in claims), default=0)
    if waiting:
        return (
            f"Holm's correction waits until every claim of the family is read at a look "
            f"({waiting} not yet); the verdicts above are each claim's own.\n"
        )
    family = [c for c in read(claims) if c.get("holm")]
    record = next((c["family_by"] for c in family), "table")
    how = {"table": f"across the {len(family)} claims",
           "paper": f"within each paper's claims ({len(family)} in all)"}  # fmt: skip
    changed = [f"{_named(c)} ({c['verdict']} -> {c['holm']})"
               for c in family if c["holm"] != c["verdict"]]  # fmt: skip
    text = f"Holm's correction {how[record]} (the family of record) changes "
    text += f"{len(changed)} verdict(s): {'; '.join(changed)}." if changed else "no verdict."
    if len({group(c) for c in family}) > 1:
        other = "paper" if record == "table" else "table"
        moved = [f"{_named(c)} ({c['verdict']} -> {c['holm_other']})"
                 for c in family if c["holm_other"] != c["verdict"]]  # fmt: skip
        text += f" {how[other][0].upper()}{how[other][1:]} instead, it would change "
        text += f"{len(moved)}: {'; '.join(moved)}." if moved else "none."
    return text + "\n"


def paper_sentence(claims: Sequence[Entry]) -> str:
    """How many claims with a paper effect are smaller than reported under Holm's correction
    across those readings, which, and what the correction changes."""
    waiting = max((c.get("against_papers_waiting", 0) for c in claims), default=0)
    if waiting:
        return (
            f"The readings against the papers' effects wait for Holm's correction until every "
            f"claim with an effect is read at a look ({waiting} not yet); the table shows each "
            "claim's own reading.\n"
        )
    tested = [c for c in read(claims) if c.get("against_paper_holm")]
    smaller = [_named(c) for c in tested if c["against_paper_holm"] == "smaller than reported"]
    changed = [f"{_named(c)} ({c['against_paper']} -> {c['against_paper_holm']})"
               for c in tested if c["against_paper"] != c["against_paper_holm"]]  # fmt: skip
    text = (
        f"{len(smaller)} of the {len(tested)} claims with a paper effect are smaller than "
        "reported (the one-sided test of their difference below the smallest effect the paper "
        f"prints rejects, under Holm's correction across the {len(tested)})"
        + (f": {'; '.join(smaller)}." if smaller else ".")
    )
    if changed:
        text += f" The correction changes {len(changed)} reading(s): {'; '.join(changed)}."
    return text + "\n"


def readings(claims: Sequence[Entry]) -> str:
    """One paragraph per paper (in the claims' order): its verdicts of record counted (Holm's
    in the family, a claim's own outside it), then one line per claim with what the table does
    not show: how many seeds lie above 0 and the per-seed std, its verdict of record and the
    uncorrected one where they differ, and the reading against the paper's effects."""
    papers: dict[str, list[Entry]] = {}
    for c in read(claims):
        papers.setdefault(group(c), []).append(c)
    parts = []
    for paper, found in papers.items():
        lines, counts, smaller = [], {}, 0
        for c in found:
            diffs = c["differences"]
            verdict = c.get("holm") or c["verdict"]
            counts[verdict] = counts.get(verdict, 0) + 1
            at = f" ({where(c)})" if where(c) else ""
            line = (
                f"- {c['text']}{at}: {sum(x > 0 for x in diffs)} of {len(diffs)} seeds above 0, "
                f"per-seed std {mean_std(diffs)[1]:.2f}; **{verdict}**"
            )
            if verdict != c["verdict"]:
                line += f" ({c['verdict']} before Holm's correction)"
            if c["effect"] is not None:
                smaller += against(c) == "smaller than reported"
                line += f"; against the paper's effects: {against(c)}"
                if against(c) != c["against_paper"]:
                    line += f" ({c['against_paper']} before Holm's correction)"
            lines.append(line + ".")
        said = ", ".join(f"{k} {v}" for v, k in sorted((v, k) for k, v in counts.items()))
        head = f"**{paper}** ({len(lines)} claims: {said}"
        head += f"; {smaller} smaller than reported)" if smaller else ")"
        parts.append(head + "\n\n" + "\n".join(lines))
    unread = len(claims) - len(read(claims))
    waiting = max((c.get("holm_waiting", 0) for c in claims), default=0)
    if waiting:  # the verdicts of record are not known yet
        parts.insert(0, (
            f"Interim: {unread} claim(s) have no seeds yet and Holm's correction waits for "
            f"{waiting} claim(s) of the family, so each line gives the claim's own verdict and "
            "its own reading against the paper's effects."
        ))  # fmt: skip
    return "\n\n".join(parts) + "\n"


def seeds_needed(claims: Sequence[Entry], level: float, power: float = 0.8) -> str:
    """For every claim not resolved whose paper's smallest effect is a gain: the seeds one look
    at ``level`` would need to resolve a true difference of that effect with probability
    ``power`` (:func:`jdml.statistics.seeds_to_resolve`), taking as the true per-seed std the
    observed one (observed-power reasoning, optimistic) and its 95 % upper bound
    (:func:`jdml.statistics.std_upper_bound`)."""
    from jdml.statistics import std_upper_bound

    lines = [
        "| claim not resolved | seeds read | per-seed std | paper's effect | seeds to resolve it "
        f"({100 * power:g} % power, {100 * level:.2f} %) | at the std's 95 % upper bound |",
        "|---|---|---|---|---|---|",
    ]
    for c in read(claims):
        if c["effect"] is None or c["effect"] <= 0 or c["verdict"] != "not resolved":
            continue
        std = mean_std(c["differences"])[1]
        if std <= 0:
            continue
        n = _seeds_to_resolve(c["effect"], std, level, power)
        upper = _seeds_to_resolve(c["effect"], std_upper_bound(std, c["seeds"]), level, power)
        lines.append(
            f"| {_named(c)} | {c['seeds']} | {std:.2f} | {c['effect']:+.2f} | {n} | {upper} |"
        )
    return "\n".join(lines) + "\n"


def _seeds_to_resolve(effect: float, std: float, level: float, power: float) -> str:
    """:func:`jdml.statistics.seeds_to_resolve` as a cell ("more than 10000" past its search)."""
    try:
        return str(seeds_to_resolve(effect, std, level, power))
    except ValueError:
        return "more than 10000"


def design(looks: Sequence[int], level: float) -> str:
    """The design's numbers, computed: the level every look reads, and the simulated chance of
    a false verdict over all looks at that level and at 95 %
    (:func:`jdml.statistics.false_verdict_rate`)."""
    at_level = false_verdict_rate(level, tuple(looks))
    at_95 = false_verdict_rate(0.95, tuple(looks))
    two = len(looks) == 2
    return (
        f"{'Both' if two else f'All {len(looks)}'} looks read the interval at Pocock's level for "
        f"{len(looks)} looks, {100 * level:.2f} %: a claim without a true difference then gets a "
        f"verdict at {'either' if two else 'some'} look with a chance of {100 * at_level:.1f} % "
        f"(simulated with normal per-seed differences, looks at "
        f"{' and '.join(map(str, looks))} seeds), where reading {'both' if two else 'all'} at "
        f"95 % would give one with {100 * at_95:.1f} %.\n"
    )


def late_gain(curve: Sequence[Mapping[str, Any]], cut: int, metric: str) -> float:
    """How many points of validation ``metric`` the epochs after ``cut`` add to the best of the
    epochs up to it (negative: the curve peaked before ``cut``).

    Raises:
      ValueError: the curve has no epoch on one side of ``cut``.
    """
    early = [e[metric] for e in curve if e.get("epoch") is not None and e["epoch"] <= cut]
    late = [e[metric] for e in curve if e.get("epoch") is not None and e["epoch"] > cut]
    if not early or not late:
        raise ValueError(f"the validation curve has no epoch on both sides of epoch {cut}")
    return 100 * (max(late) - max(early))


def _points(x: float) -> str:
    """``x`` signed, to two decimals, with no "-0.00" for a value that rounds to zero."""
    return f"{round(float(x), 2) + 0.0:+.2f}"


def budget_table(
    claims: Sequence[Entry],
    by_row: Mapping[str, Mapping[int, Mapping[str, Any]]],
    labels: Mapping[str, str],
    dataset: str,
    epochs: int,
    window: int,
    metric: str,
) -> str:
    """Whether the epoch budget reaches the plateau of every row a claim compares, in the
    claims' order: of the row's seed records, how many select their last epoch on validation,
    and the validation ``metric`` the last ``window`` epochs add to the best epoch before them
    (mean ± sample std over the seeds, and the largest).

    Raises:
      ValueError: ``window`` outside 1 to ``epochs - 1``, or a curve too short for it.
    """
    if not 0 < window < epochs:
        raise ValueError(f"--print budget:{window}: give a window of 1 to {epochs - 1} epochs")
    lines = [
        f"| row of a claim, {dataset} validation, {epochs} epochs | seeds | seeds selecting epoch "
        f"{epochs} | val {metric} added by epochs {epochs - window + 1}-{epochs}, mean ± std "
        "| largest |",
        "|---|---|---|---|---|",
    ]
    done: set[str] = set()
    for c in claims:
        for row in (c["row"], c["base"]):
            if not row or row in done or not by_row.get(row):
                continue
            done.add(row)
            records = by_row[row]
            last = sum(r["meta"].get("epoch") == epochs for r in records.values())
            gains = []
            for seed, record in sorted(records.items()):
                try:
                    gains.append(late_gain(record["val_curve"], epochs - window, metric))
                except ValueError as e:
                    raise ValueError(f"row {row!r} seed {seed}: {e}") from None
            mean, std = mean_std(gains)
            spread = f" ± {std:.2f}" if len(gains) > 1 else ""
            lines.append(
                f"| {labels[row]} | {len(records)} | {last} | {_points(mean)}{spread} "
                f"| {_points(max(gains))} |"
            )
    return "\n".join(lines) + "\n"


def classes_table(claims: Sequence[Entry]) -> str:
    """The claims whose records keep per-query hits, read over seeds alone and over seeds and
    test classes (two bootstraps at the look's level): the intervals, the widening, and
    whether counting the classes changes the verdict."""
    lines = [
        "| claim | says | seeds | t over seeds | bootstrap over seeds | bootstrap over seeds and "
        "classes | width ratio | verdict, seeds / seeds and classes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in read(claims):
        boot = c.get("bootstrap")
        if boot is None or "seeds_only" not in boot:
            continue
        level, n = c["level"], c["seeds"]
        seeds_only = boot["seeds_only"]
        only = Paired(boot["mean"], seeds_only["low"], seeds_only["high"], n, level, "bootstrap")
        both = Paired(boot["mean"], boot["low"], boot["high"], n, level, "bootstrap")
        ratio = (both.high - both.low) / (only.high - only.low)
        lines.append(
            f"| {c['paper'] or '-'} | {c['text']} | {n} | {difference(c).cell()} | {only.cell()} "
            f"| {both.cell()} | {ratio:.2f} | {only.verdict()} / {both.verdict()} |"
        )
    if len(lines) == 2:
        return "No claim's records keep per-query hits (eval.per_query) for all its seeds.\n"
    return "\n".join(lines) + "\n"


def _spread(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """mean ± sample std of ``scale * values`` (one value alone; none: "-")."""
    if not values:
        return "-"
    mean, std = mean_std([scale * x for x in values])
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def _paired_cell(a: Mapping[int, float], b: Mapping[int, float]) -> str:
    from jdml.statistics import paired

    seeds = sorted(set(a) & set(b))
    if not seeds:
        return "-"
    return paired([a[s] for s in seeds], [b[s] for s in seeds], 0.95).cell()


def group_table(
    names: Sequence[str],
    rows: Mapping[str, Mapping[str, Any]],
    by_row: Mapping[str, Mapping[int, Mapping[str, Any]]],
    fixed: Mapping[str, Mapping[str, Any]],
    metrics: Sequence[str],
    title: str,
    seeds: int | None = None,
) -> str:
    """A table of rows side by side: seeds, best epochs, the test ``metrics`` (mean ± sample
    std over the seeds), those of the concatenated heads or cohort members where a row has
    them, the train spectrum's rho where a record has it, and each row's paired difference
    from the first trained row (95 % Student-t, a description: the verdicts are the claims').

    Args:
      names: rows of the study (``rows``: name -> its ``label`` and flattened ``config``), or
        entries of ``baselines.json`` (``pixels``, ``features``: one value, no seeds; an entry
        with ``seeds``, one value per seed, e.g. the network before training).
      by_row: the seed records, row -> seed -> record.
      fixed: the fixed baselines recorded (:func:`jdml.study.baselines.read`).
      metrics: the metrics' columns; the first is the one the differences read.
      title: the first header cell.
      seeds: read only seeds ``0`` to ``seeds - 1`` (None: every seed recorded).
    """
    from jdml.study import claims as cl

    def records(name: str) -> dict[int, Mapping[str, Any]]:
        found = by_row.get(name, {})
        return {s: r for s, r in sorted(found.items()) if seeds is None or s < seeds}

    trained = [n for n in names if n in rows]
    concat = {n: cl.embedding_name(rows[n]["config"], True) for n in trained}
    multi = any(concat.values())
    rho = any("rho_spectrum@1" in r.get("results", {}).get("train", {})
              for n in trained for r in records(n).values())  # fmt: skip
    base = trained[0] if len(trained) > 1 else None
    header = [title, "seeds", "best epoch", *metrics]
    header += [f"concat {m}" for m in metrics] if multi else []
    header += ["rho (train)"] if rho else []
    if base is not None:
        header.append(f"Δ {metrics[0]} vs {rows[base]['label']} [95 % CI]")
        header += [f"Δ concat {metrics[0]} [95 % CI]"] if multi else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        if name not in rows:
            found = fixed.get(name)
            if found is None:
                raise ValueError(f"no row or fixed baseline {name!r} in the study")
            if "seeds" in found:  # one value per seed (the network before training)
                got = [v for s, v in sorted(found["seeds"].items(), key=lambda x: int(x[0]))
                       if seeds is None or int(s) < seeds]  # fmt: skip
                cells = [found.get("label", name), str(len(got)), "-"]
                cells += [_spread([v[m] for v in got if m in v]) for m in metrics]
            else:
                cells = [found.get("label", name), "-", "-"]
                cells += [_spread([found[m]]) if m in found else "-" for m in metrics]
            lines.append("| " + " | ".join(cells + ["-"] * (len(header) - len(cells))) + " |")
            continue
        got = records(name)
        tests = [r["results"]["test"] for r in got.values()]
        epochs = [str(r["meta"].get("epoch", "?")) for r in got.values()]
        cells = [rows[name]["label"], str(len(got)), ",".join(epochs) or "-"]
        cells += [_spread([t[m] for t in tests if m in t]) for m in metrics]
        if multi:
            extra = [r.get("embeddings", {}).get("test", {}).get(concat[name] or "", {})
                     for r in got.values()]  # fmt: skip
            cells += [_spread([e[m] for e in extra if m in e]) for m in metrics]
        if rho:
            spectra = [r["results"]["train"]["rho_spectrum@1"] for r in got.values()
                       if "rho_spectrum@1" in r.get("results", {}).get("train", {})]  # fmt: skip
            cells.append(_spread(spectra, scale=1.0, digits=4))
        if base is not None:
            for joined in (False, True) if multi else (False,):
                if name == base or (joined and concat[name] is None):
                    cells.append("-")
                    continue
                a = cl.values(got, metrics[0], concat[name] if joined else None)
                b = cl.values(records(base), metrics[0], concat[base] if joined else None)
                cells.append(_paired_cell(a, b))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
