"""Every paper claim the emoji tables test, with its verdict from the paired interval.

Each claim says that one row beats another in test Recall@1 (of the embedding the paper
reports: one head, or the heads or members concatenated). Over the seeds both rows have, the
per-seed differences give a mean and a Student-t interval (``jdml.statistics.paired``); the
claim **reproduces** when the interval lies above 0, **does not reproduce** when it lies below,
and is **not resolved** when it holds 0 or rests on one seed.

The design, declared before any row had its seeds 3 and 4 (:data:`LOOKS`): every row is
trained with seeds 0-4 (look 1); a claim still unresolved there gets seeds 5-9 for both its
rows (look 2). Both looks read the interval at Pocock's level for two looks (97.06 %), so that
a claim without a true difference gets a verdict at either look with a chance of about 5 %
(5.2 % simulated); reading both at 95 % would give one with 8.7 %
(``tests/test_statistics.py``). A table of fewer seeds than look 1 is interim, read at 95 %,
and decides nothing: seeds 3 and 4 follow for every row whatever it says.

Beside each claim's own verdict the table gives its verdict under Holm's correction across the
family of the table's claims (:func:`in_family`: every claim comparing two trained rows that is
read at a look), so that the chance of any false verdict in the whole table, not only in each
claim, stays at the design's level (:func:`holm_verdicts`).

The records are those of ``experiments/emoji_protocol.py`` (``--results``). With ``--seeds``
reaching look 1, each claim is read at the furthest look both its rows have every seed of; a
claim short of look 1 is read over the first :data:`INTERIM_SEEDS` seeds instead, at 95 % and
labelled "before look 1", so that a table filling in shows every claim at the reading its
records allow. A claim whose rows lack even those seeds is left out.

Usage: python experiments/emoji_claims.py [--results experiments/results/emoji-v2-45]
           [--epochs 45] [--seeds 0 1 2 3 4 5 6 7 8 9] [--plot claims.png]
       python experiments/emoji_claims.py --seeds 0 1 2 3 4 --look2-rows -1   # or 3 (DM2's)
           (the rows look 2 trains: those of the claims unresolved at look 1, comma-separated)
       python experiments/emoji_claims.py --classes
           (the claims whose records keep per-query hits, read over seeds and test classes)
       python experiments/emoji_claims.py --budget 5
           (whether the budget reaches each claim row's plateau: how many seeds select the last
           epoch, and how much validation Recall@1 the last 5 epochs add)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emoji_protocol as protocol

from jdml.evaluation.per_query import paired_differences
from jdml.statistics import (
    Paired,
    false_verdict_rate,
    holm,
    mean_std,
    paired,
    pocock_level,
    seeds_to_resolve,
    two_way_bootstrap,
)

# The looks of the design: the number of seeds (0, 1, ...) each look reads.
LOOKS = (5, 10)
LOOK_LEVEL = pocock_level(len(LOOKS))
INTERIM_LEVEL = 0.95
INTERIM_SEEDS = 3  # the seeds of an interim reading, when a claim's rows are short of look 1


@dataclasses.dataclass(frozen=True)
class Claim:
    paper: str
    text: str
    row: str
    base: str
    concat: bool  # the concatenated heads / members, as the paper reports them
    frozen: int = -1  # DM2's rows train the stages after 3
    fixed: str | None = None  # a baseline without training (baselines.json), not a row
    # The effect the paper reports for the claim, in Recall@1 points: the smallest across the
    # paper's datasets, and where it is printed (table, dataset). None: no direct number.
    effect: float | None = None
    effect_source: str = ""


def against_paper(d: Paired, effect: float | None) -> str:
    """The reading against the paper's effect (points), declared before it was applied: an
    interval wholly below it is **smaller than reported**; any other is **not below it**. As
    the effect is the smallest the paper prints across its datasets, "smaller than reported"
    rules out every effect the paper reports at the look's level; "not below it" says only that
    some reported effect is still within reach, not that the paper's larger ones are. It can
    hold together with "not resolved" about zero: an interval around 0 that ends below the
    paper's effect does not decide the sign, yet rules that effect out."""
    if effect is None or d.n < 2:
        return "-"
    return "smaller than reported" if 100 * d.high < effect else "not below it"


# The papers' effects (``effect``): the smallest Recall@1 gain each paper prints for the claim
# across its datasets, read from its tables (for DM2 its member "Net A", the single model it
# reports; DiVA's Tab. 4, Sharing Matters' Tab. 7a and DM2's Tab. 1 print one or two datasets).
# None where the paper prints no direct number: the controls this benchmark adds, and
# rho-regularisation, whose Tab. 2 values are missing from the text copy available here.
CLAIMS: tuple[Claim, ...] = (
    Claim("Revisiting, Tab. 1", "fine-tuning beats the ImageNet features", "margin", "",
          False, fixed="ImageNet features (pooled 1280-d, L2-normalised)"),
    Claim("Revisiting, Tab. 1", "fine-tuning beats raw pixels (the stronger baseline here)",
          "margin", "", False, fixed="raw pixels (64 x 64 x 3, L2-normalised)"),
    Claim("Revisiting, Sec. 5", "rho-regularisation improves margin", "R-margin", "margin", False),
    Claim("DiVA, Tab. 2", "DiVA's four heads beat one head of the same dimension", "diva",
          "diva-D", True, effect=0.9, effect_source="DiVA Tab. 2, SOP"),
    Claim("DiVA, Tab. 2", "the shared head adds to the discriminative one", "diva-DS", "diva-D",
          True, effect=0.6, effect_source="DiVA Tab. 2, SOP"),
    Claim("DiVA, Tab. 2", "the intra-class head adds to the discriminative one", "diva-DI",
          "diva-D", True, effect=0.3, effect_source="DiVA Tab. 2, SOP"),
    Claim("DiVA, Tab. 2", "DaNCE's head adds to the discriminative one", "diva-DDa", "diva-D",
          True, effect=0.4, effect_source="DiVA Tab. 2, SOP"),
    Claim("DiVA, Tab. 4", "decorrelating the heads helps", "diva", "diva-nodecor", True,
          effect=0.8, effect_source="DiVA Tab. 4, its one dataset (CUB's numbers)"),
    Claim("DiVA (control)", "DiVA's heads beat four margin heads of the same dimension", "diva",
          "diva-4D", True),
    # Sharing Matters' method is the class head with a shared head of its own, decorrelated
    # (Tab. 7a's both+sep+decor), reported as the 256-d concatenation against a 256-d baseline.
    Claim("Sharing Matters, Tab. 1-4", "the method beats one class head of its dimension "
          "(256-d)", "sharing-decor", "sharing-class256", True, effect=2.1,
          effect_source="Sharing Matters Tab. 3, SOP"),
    Claim("Sharing Matters (control)", "... and beats two 128-d class heads, concatenated",
          "sharing-decor", "sharing-2class", True),
    Claim("Sharing Matters, Tab. 4", "the method's class head alone beats the class-only "
          "baseline", "sharing-decor", "sharing-class", False, effect=2.0,
          effect_source="Sharing Matters Tab. 4 (margin, against Baseline128), CARS196"),
    Claim("Sharing Matters, Tab. 7a", "a shared head adds to the class head (256-d against "
          "128-d)", "sharing", "sharing-class", True, effect=1.7,
          effect_source="Sharing Matters Tab. 7a, CARS196 (its one dataset)"),
    Claim("Sharing Matters, Tab. 7a", "decorrelating the shared head from the class head helps",
          "sharing-decor", "sharing", True, effect=2.9,
          effect_source="Sharing Matters Tab. 7a (both+sep+decor - both+sep), CARS196"),
    Claim("DM2, Table 1", "the mutual term (MD) lifts a member", "dm2-3-md", "dm2-3-independent",
          False, frozen=3, effect=0.55, effect_source="DM2 Tab. 1, Net A, Cars-196"),
    Claim("DM2, Table 1", "MD+VD lifts a member", "dm2-3-md+vd", "dm2-3-independent", False,
          frozen=3, effect=2.19, effect_source="DM2 Tab. 1, Net A, CUB"),
    Claim("DM2, Table 1", "DM2 (MD+TD+VD) lifts a member", "dm2-3-md+td+vd",
          "dm2-3-independent", False, frozen=3, effect=3.83,
          effect_source="DM2 Tab. 1, Net A, CUB"),
    Claim("DM2, Table 1", "DM2's cohort beats independent members (ensemble)", "dm2-3-md+td+vd",
          "dm2-3-independent", True, frozen=3, effect=1.61,
          effect_source="DM2 Tab. 1, ensemble, Cars-196"),
)  # fmt: skip


def _difference(
    claim: Claim, args: argparse.Namespace, seeds: list[int], level: float
) -> Paired | None:
    """The claim's paired difference over ``seeds`` at ``level``, or None unless both its rows
    have a record for every one of them (a claim is stated in full or not at all)."""
    a = argparse.Namespace(**{**vars(args), "seeds": seeds, "frozen_stages": claim.frozen})
    if claim.fixed:
        base = protocol.baselines(args.results, [], compute=False).get(claim.fixed)
        values = protocol._by_seed(claim.row, a, None)
        if not base or not values:
            return None
        found = sorted(values)
        d = paired([values[k] for k in found], [base["recall@1"][0]] * len(found), level)
    else:
        d = protocol.difference(claim.row, claim.base, a, claim.concat, level)
    return d if d is not None and d.n >= len(seeds) else None


def claim_difference(claim: Claim, args: argparse.Namespace) -> tuple[Paired, str] | None:
    """The claim's paired difference in test Recall@1 and the look it is read at, or None.

    With fewer of ``args.seeds`` than the first look, the difference over all of them at 95 %
    ("before look 1"). Otherwise the first look's (its number of seeds, lowest first) at the
    design's level, and the next look's where that one is unresolved and the records reach it;
    where the records do not reach look 1, the interim reading over the first
    :data:`INTERIM_SEEDS` seeds.
    """
    seeds = sorted(args.seeds)
    interim = seeds if len(seeds) < LOOKS[0] else seeds[:INTERIM_SEEDS]
    found = None
    for k, look in enumerate(LOOKS, 1):
        d = _difference(claim, args, seeds[:look], LOOK_LEVEL) if look <= len(seeds) else None
        if d is None:
            break
        found = (d, f"{100 * LOOK_LEVEL:.2f} %, look {k} of {len(LOOKS)}")
        if d.verdict() != "not resolved":
            break
    if found is None:
        d = _difference(claim, args, interim, INTERIM_LEVEL)
        found = None if d is None else (d, f"{100 * INTERIM_LEVEL:.0f} %, before look 1")
    return found


def in_family(claim: Claim, look: str) -> bool:
    """Whether a claim read at ``look`` belongs to the family Holm's correction runs over: every
    claim of the table that compares two trained rows and is read at a look of the design.
    Left out are the two claims against a fixed baseline (fine-tuning against features or
    pixels: 25-42 points, far beyond any correction, and counting them would only loosen the
    correction of the others) and interim readings, which decide nothing."""
    return not claim.fixed and "before look" not in look


def holm_verdicts(args: argparse.Namespace) -> dict[int, str]:
    """The verdict of each claim of the family (:func:`in_family`; by its index in
    :data:`CLAIMS`) under Holm's correction across the family: its p-value at the look it is
    read at, against that look's nominal error (1 - :data:`LOOK_LEVEL`), so that the chance of
    any false verdict in the table stays at the design's per-claim level. A claim Holm rejects
    keeps the sign of its mean; any other is not resolved."""
    readings = {i: claim_difference(c, args) for i, c in enumerate(CLAIMS)}
    family = [i for i, f in readings.items() if f is not None and in_family(CLAIMS[i], f[1])]
    if not family:
        return {}
    flags = holm([readings[i][0].p_value() for i in family], 1 - LOOK_LEVEL)
    out = {}
    for i, flag in zip(family, flags, strict=True):
        mean = readings[i][0].mean
        out[i] = ("reproduces" if mean > 0 else "does not reproduce") if flag else "not resolved"
    return out


def claim_row(
    claim: Claim, args: argparse.Namespace, holm_verdict: str | None = None, family: int = 0
) -> list[str] | None:
    """The claim's table row, or None when :func:`claim_difference` has no difference;
    ``holm_verdict``: its verdict under Holm's correction across ``family`` claims (None: not
    in the family)."""
    found = claim_difference(claim, args)
    if found is None:
        return None
    d, look = found
    if claim.fixed:
        compared = f"{protocol.ROWS[claim.row][0]} - {claim.fixed.split(' (')[0]}"
    else:
        what = "concatenation" if claim.concat else "one head" if claim.frozen < 0 else "member 1"
        compared = f"{protocol.ROWS[claim.row][0]} - {protocol.ROWS[claim.base][0]} ({what})"
    if holm_verdict is not None:
        corrected = f"**{holm_verdict}**"
    else:
        corrected = "- (interim)" if "before look" in look else "- (fixed baseline)"
    paper = "-" if claim.effect is None else f"{claim.effect:+.2f} ({claim.effect_source})"
    return [
        claim.paper,
        claim.text,
        compared,
        str(d.n),
        d.cell(),
        look,
        f"**{d.verdict()}**",
        corrected,
        paper,
        against_paper(d, claim.effect),
    ]


def look2_rows(args: argparse.Namespace, frozen: int) -> list[str]:
    """The rows whose seeds 5-9 look 2 needs: both rows of every claim (with ``frozen`` stages
    frozen) that look 1 leaves unresolved, in the claims' order, each once (a claim whose rows
    lack a look-1 seed has only an interim reading, and adds none)."""
    rows: list[str] = []
    for claim in CLAIMS:
        if claim.frozen != frozen:
            continue
        d = _difference(claim, args, list(range(LOOKS[0])), LOOK_LEVEL)  # look 1's reading
        if d is not None and d.verdict() == "not resolved":
            rows += [r for r in (claim.row, claim.base) if r and r not in rows]
    return rows


def claims_table(args: argparse.Namespace) -> str:
    """The claim table: each claim's reading, its own verdict, and its verdict under Holm's
    correction across the family (:func:`holm_verdicts`)."""
    corrected = holm_verdicts(args)
    lines = [
        f"| claim, emoji test, {args.epochs} epochs | says | rows compared | seeds "
        f"| Δ recall@1 [CI] | CI level, look | verdict | Holm verdict ({len(corrected)} claims) "
        "| paper's effect (smallest) | against the paper's effect |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, claim in enumerate(CLAIMS):
        row = claim_row(claim, args, corrected.get(i), len(corrected))
        if row is not None:
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def paper_summary(args: argparse.Namespace) -> str:
    """One sentence: of the claims with a paper effect, those whose interval lies wholly below
    it (generated for the results page)."""
    below, counted = [], 0
    for claim in CLAIMS:
        found = claim_difference(claim, args)
        if claim.effect is None or found is None or found[0].n < 2:
            continue
        counted += 1
        if against_paper(found[0], claim.effect) == "smaller than reported":
            below.append(f"{claim.paper}: {claim.text}")
    if not below:
        return f"No interval of the {counted} claims with a paper effect lies below it."
    return (
        f"{len(below)} of the {counted} claims with a paper effect are smaller than reported "
        f"(their interval lies wholly below the smallest effect the paper prints): "
        f"{'; '.join(below)}."
    )


def holm_changes(args: argparse.Namespace) -> str:
    """One sentence: which claims' verdicts Holm's correction changes (generated for the
    results page, so that it never disagrees with the table)."""
    corrected = holm_verdicts(args)
    changed = []
    for i, verdict in corrected.items():
        d, _ = claim_difference(CLAIMS[i], args)
        if d.verdict() != verdict:
            changed.append(f"{CLAIMS[i].paper}: {CLAIMS[i].text} ({d.verdict()} -> {verdict})")
    if not changed:
        return f"Holm's correction across the {len(corrected)} claims changes no verdict."
    return (
        f"Holm's correction across the {len(corrected)} claims changes {len(changed)} "
        f"verdict(s): {'; '.join(changed)}."
    )


def seed_differences(claim: Claim, args: argparse.Namespace, n: int) -> list[float]:
    """The claim's per-seed differences in test Recall@1 points over its first ``n`` seeds (the
    seeds its reading uses), in seed order."""
    a = argparse.Namespace(**{**vars(args), "frozen_stages": claim.frozen})
    seeds = sorted(args.seeds)[:n]
    row_concat = protocol.embedding_name(claim.row, claim.concat)
    values = protocol._by_seed(claim.row, a, row_concat)
    if claim.fixed:
        base = protocol.baselines(args.results, [], compute=False)[claim.fixed]["recall@1"][0]
        return [100 * (values[s] - base) for s in seeds]
    base_values = protocol._by_seed(
        claim.base, a, protocol.embedding_name(claim.base, claim.concat)
    )
    return [100 * (values[s] - base_values[s]) for s in seeds]


# The papers in the order of the readings, and the claims' paper labels each one covers.
PAPERS = ("Revisiting", "DiVA", "Sharing Matters", "DM2")


def _paper_of(claim: Claim) -> str:
    return next(p for p in PAPERS if claim.paper.startswith(p))


def readings(args: argparse.Namespace) -> str:
    """The short reading per paper, generated from the records: a line counting its claims'
    verdicts, then one line per claim with its difference, the seeds above 0, its verdict, its
    Holm verdict and its reading against the paper's effect."""
    corrected = holm_verdicts(args)
    parts = []
    for paper in PAPERS:
        lines, counts, smaller = [], {}, 0
        for i, claim in enumerate(CLAIMS):
            found = claim_difference(claim, args)
            if _paper_of(claim) != paper or found is None:
                continue
            d, look = found
            diffs = seed_differences(claim, args, d.n)
            above = sum(x > 0 for x in diffs)
            counts[d.verdict()] = counts.get(d.verdict(), 0) + 1
            where = "a control" if "(control)" in claim.paper else claim.paper.split(", ", 1)[-1]
            line = (
                f"- {claim.text} ({where}): {d.cell()} points at "
                f"{look}, {above} of {d.n} seeds above 0, per-seed std "
                f"{mean_std(diffs)[1]:.2f}; **{d.verdict()}**"
            )
            if i in corrected and corrected[i] != d.verdict():
                line += f", **{corrected[i]}** under Holm's correction"
            if claim.effect is not None:
                against = against_paper(d, claim.effect)
                smaller += against == "smaller than reported"
                line += (
                    f"; the paper's effect {claim.effect:+.2f} ({claim.effect_source}): {against}"
                )
            lines.append(line + ".")
        if not lines:
            continue
        said = ", ".join(f"{k} {v}" for v, k in sorted((v, k) for k, v in counts.items()))
        head = f"**{paper}** ({len(lines)} claims: {said}"
        head += f"; {smaller} smaller than reported)" if smaller else ")"
        parts.append(head + "\n\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"


def seeds_needed(args: argparse.Namespace, power: float = 0.8) -> str:
    """For every claim not resolved that has a paper effect: the seeds one look at the design's
    level would need to resolve a true difference of the paper's effect with probability
    ``power``, taking the claim's observed per-seed std as the true one."""
    lines = [
        f"| claim not resolved | seeds read | per-seed std | paper's effect | seeds to resolve it "
        f"({100 * power:g} % power, {100 * LOOK_LEVEL:.2f} %) |",
        "|---|---|---|---|---|",
    ]
    for claim in CLAIMS:
        found = claim_difference(claim, args)
        if found is None or claim.effect is None or found[0].verdict() != "not resolved":
            continue
        d, _ = found
        std = mean_std(seed_differences(claim, args, d.n))[1]
        n = seeds_to_resolve(claim.effect, std, LOOK_LEVEL, power)
        lines.append(
            f"| {claim.paper}: {claim.text} | {d.n} | {std:.2f} | {claim.effect:+.2f} | {n} |"
        )
    return "\n".join(lines) + "\n"


def design() -> str:
    """The design's numbers, computed: the level of each look, and the simulated chance of a
    false verdict over both looks at that level and at 95 %."""
    at_level = false_verdict_rate(LOOK_LEVEL, LOOKS)
    at_95 = false_verdict_rate(0.95, LOOKS)
    return (
        f"Both looks read the interval at Pocock's level for {len(LOOKS)} looks, "
        f"{100 * LOOK_LEVEL:.2f} %: a claim without a true difference then gets a verdict at "
        f"either look with a chance of {100 * at_level:.1f} % (simulated with normal per-seed "
        f"differences, looks at {' and '.join(map(str, LOOKS))} seeds), where reading both at "
        f"95 % would give one with {100 * at_95:.1f} %.\n"
    )


def late_gain(curve: list[dict], cut: int) -> float:
    """How many points of validation Recall@1 the epochs after ``cut`` add to the best of the
    epochs up to it (negative: the curve peaked before ``cut``)."""
    early = [e["recall@1"] for e in curve if e["epoch"] <= cut]
    late = [e["recall@1"] for e in curve if e["epoch"] > cut]
    if not early or not late:
        raise ValueError(f"the validation curve has no epoch on both sides of epoch {cut}")
    return 100 * (max(late) - max(early))


def _points(x: float) -> str:
    """``x`` signed, to two decimals, with no "-0.00" for a value that rounds to zero."""
    return f"{round(float(x), 2) + 0.0:+.2f}"


def budget_table(args: argparse.Namespace, window: int) -> str:
    """Whether the budget reaches the plateau of every row a claim compares, in the claims'
    order: of the seeds with a record, how many select their last epoch on validation, and the
    validation Recall@1 the last ``window`` epochs add to the best epoch before them (mean ±
    sample std over the seeds, and the largest)."""
    if not 0 < window < args.epochs:
        raise ValueError(f"--budget {window}: give a window of 1 to {args.epochs - 1} epochs")
    lines = [
        f"| row of a claim, emoji validation, {args.epochs} epochs | seeds "
        f"| seeds selecting epoch {args.epochs} | val recall@1 added by epochs "
        f"{args.epochs - window + 1}-{args.epochs}, mean ± std | largest |",
        "|---|---|---|---|---|",
    ]
    done = set()
    for claim in CLAIMS:
        for row in (claim.row, claim.base):
            if not row or (row, claim.frozen) in done:
                continue
            done.add((row, claim.frozen))
            a = argparse.Namespace(**{**vars(args), "frozen_stages": claim.frozen})
            records = {s: r for s in sorted(args.seeds) if (r := protocol.load_record(a, row, s))}
            if not records:
                continue
            last = sum(r["meta"]["epoch"] == args.epochs for r in records.values())
            gains = []
            for seed, record in records.items():
                try:
                    gains.append(late_gain(record["val_curve"], args.epochs - window))
                except ValueError as e:
                    raise ValueError(f"{protocol.record_path(a, row, seed)}: {e}") from None
            mean, std = mean_std(gains)
            spread = f" ± {std:.2f}" if len(gains) > 1 else ""
            lines.append(
                f"| {protocol.ROWS[row][0]} | {len(records)} | {last} | {_points(mean)}{spread} "
                f"| {_points(max(gains))} |"
            )
    return "\n".join(lines) + "\n"


def class_reading(claim: Claim, args: argparse.Namespace) -> tuple[Paired, Paired] | None:
    """The claim's reading with the test classes counted: its bootstrap interval over seeds
    alone and its two-way bootstrap interval over seeds and test classes
    (:func:`jdml.statistics.two_way_bootstrap`), both over the seeds and at the level of the
    look :func:`claim_difference` reads it at, or None when a record of those seeds lacks the
    per-query hits (every record before they were kept) or the claim is against a fixed
    baseline."""
    found = None if claim.fixed else claim_difference(claim, args)
    if found is None:
        return None
    d, _ = found
    a = argparse.Namespace(**{**vars(args), "frozen_stages": claim.frozen})
    blocks = [protocol.per_query_blocks(r, a) for r in (claim.row, claim.base)]
    seeds = sorted(args.seeds)[: d.n]
    if any(s not in b for b in blocks for s in seeds):
        return None
    names = (
        protocol.embedding_name(claim.row, claim.concat),
        protocol.embedding_name(claim.base, claim.concat),
    )
    hits, classes, _ = paired_differences(
        {s: blocks[0][s] for s in seeds}, {s: blocks[1][s] for s in seeds}, names
    )
    return (
        two_way_bootstrap(hits, classes, d.level, over_classes=False),
        two_way_bootstrap(hits, classes, d.level),
    )


def classes_table(args: argparse.Namespace) -> str:
    """The claims whose records keep per-query hits, read over seeds and over seeds and test
    classes: the intervals, their widths, and whether counting the classes changes the
    verdict."""
    lines = [
        "| claim | says | seeds | t over seeds | bootstrap over seeds | bootstrap over seeds and "
        "classes | width ratio | verdict, seeds / seeds and classes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for claim in CLAIMS:
        found = class_reading(claim, args)
        if found is None:
            continue
        d, _ = claim_difference(claim, args)
        seeds_only, both = found
        ratio = (both.high - both.low) / (seeds_only.high - seeds_only.low)
        lines.append(
            f"| {claim.paper} | {claim.text} | {d.n} | {d.cell()} | {seeds_only.cell()} "
            f"| {both.cell()} | {ratio:.2f} | {seeds_only.verdict()} / {both.verdict()} |"
        )
    if len(lines) == 2:
        return "No claim's records keep per-query hits (eval.per_query) for all its seeds.\n"
    return "\n".join(lines) + "\n"


def plot_claims(args: argparse.Namespace, path: str) -> None:
    """The claims' paired differences and intervals (at their look's level), one line each,
    coloured by verdict (the fixed-baseline claims, tens of points away, are left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"reproduces": "#1a9641", "does not reproduce": "#d7191c", "not resolved": "#888888"}
    shown = []
    for claim in CLAIMS:
        found = None if claim.fixed else claim_difference(claim, args)
        if found is not None:
            shown.append((f"{claim.paper}: {claim.text}", found[0]))
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(shown) + 1.2))
    for y, (_, d) in enumerate(reversed(shown)):
        colour = colours[d.verdict()]
        if d.n > 1:
            ax.plot([100 * d.low, 100 * d.high], [y, y], color=colour, lw=2)
        ax.plot(100 * d.mean, y, "o", color=colour)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(shown)), [label for label, _ in reversed(shown)], fontsize=8)
    levels = sorted({f"{100 * d.level:g} %" for _, d in shown})
    ax.set_xlabel(f"Δ test Recall@1, points (paired over seeds, {' / '.join(levels)} interval)")
    handles = [plt.Line2D([], [], color=c, marker="o", lw=2, label=v) for v, c in colours.items()]
    # Outside the axes, right of them, so that it never covers an interval or the zero line.
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    seeds = (
        "each claim at the furthest look its records reach"
        if len(args.seeds) >= LOOKS[0]
        else f"seeds {', '.join(map(str, args.seeds))}"
    )
    name = os.path.basename(os.path.normpath(args.results))
    ax.set_title(f"{name}: {args.epochs} epochs, {seeds}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="experiments/results/emoji-v2-45")
    parser.add_argument("--epochs", type=int, default=45)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(LOOKS[-1])))
    parser.add_argument("--plot", help="also draw the intervals into this PNG")
    parser.add_argument(
        "--look2-rows",
        type=int,
        metavar="FROZEN",
        help="print only the rows look 2 trains, of the claims with FROZEN stages frozen (-1, or "
        "3 for DM2's), comma-separated",
    )
    parser.add_argument(
        "--readings",
        action="store_true",
        help="print only the short reading per paper (Markdown), generated from the records",
    )
    parser.add_argument(
        "--seeds-needed",
        action="store_true",
        help="print only the seeds each unresolved claim would need at the paper's effect",
    )
    parser.add_argument(
        "--design",
        action="store_true",
        help="print only the design's level and its simulated false-verdict rates",
    )
    parser.add_argument(
        "--classes",
        action="store_true",
        help="print only the claims whose records keep per-query hits, read with the test "
        "classes as a second source of variance (a two-way bootstrap over seeds and classes)",
    )
    parser.add_argument(
        "--budget",
        type=int,
        metavar="EPOCHS",
        help="print only whether the budget reaches each claim row's plateau: the seeds that "
        "select the last epoch, and the validation Recall@1 the last EPOCHS epochs add",
    )
    args = parser.parse_args()
    if args.budget is not None:
        try:
            print(budget_table(args, args.budget), end="")
        except ValueError as e:
            parser.exit(2, f"error: {e}\n")
        return
    if args.classes:
        print(classes_table(args), end="")
        return
    if args.readings:
        print(readings(args), end="")
        return
    if args.seeds_needed:
        print(seeds_needed(args), end="")
        return
    if args.design:
        print(design(), end="")
        return
    if args.look2_rows is not None:
        print(",".join(look2_rows(args, args.look2_rows)))
        return
    print(claims_table(args), end="")
    if len(args.seeds) >= LOOKS[0]:
        print(holm_changes(args))
        print(paper_summary(args))
    if args.plot:
        plot_claims(args, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
