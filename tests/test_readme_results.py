"""The documentation's emoji result tables against the committed run records.

Every row of a table in README.md or a page of docs/ whose header names "emoji test" and that
reports a trained run (a best epoch) or a baseline without training (raw pixels, ImageNet
features) must be a row that ``experiments/emoji_protocol.py``'s report computes from the records
in ``experiments/results/emoji*`` (for some seed set and budget; the baselines from
``baselines.json`` there): the same seeds, best epochs and metric cells, bold marks aside. Labels
may be longer in the documentation; extra trailing columns (the 60-epoch table's train Recall@1)
are not checked. Tables titled "records not kept" are runs whose records predate the record
files.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.util
import json
import math
import os
import re

import numpy as np
import pytest

from tests.helpers import load_experiment


def _checked_table(title: str) -> bool:
    """Whether a table's rows have their records in the repository: an emoji table, unless its
    title says that the records of its runs were not kept."""
    return (
        "emoji test" in title and "records not kept" not in title and not title.startswith("claim")
    )


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def protocol():
    return load_experiment("emoji_protocol")


def _cells(line: str) -> list[str]:
    cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
    return [re.sub(r",\s+", ",", c) for c in cells]


def documentation_pages() -> list[str]:
    """README.md and every Markdown page under docs/, the places a result table may stand."""
    pages = [os.path.join(ROOT, "README.md")]
    return pages + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))


def documentation_rows() -> list[tuple[list[str], list[str]]]:
    """(table header, row cells) of every checked row of the documentation."""
    lines = []
    for page in documentation_pages():
        with open(page) as f:
            lines += [*f.read().splitlines(), ""]  # a table never runs over two pages
    rows, header = [], None
    for line in lines:
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
        elif _checked_table(header[0]) and not set(line) <= set("|-"):
            rows.append((header, cells))
    return rows


def computed_rows(protocol) -> list[tuple[list[str], list[str]]]:
    """(header, cells) of every row the report computes from the committed records, for each
    budget, frozen-stage setting and seed set found there (DM2 with cohorts of 3)."""
    tables = {n: rows for n, (_, rows) in protocol.TABLES.items() if n != "tune"}
    tables["dm2"] = protocol.add_dm2_rows(3)
    out = []
    for results in sorted(glob.glob(os.path.join(ROOT, "experiments", "results", "emoji*"))):
        records = glob.glob(os.path.join(results, "*", "seed*.json"))
        epochs, frozen, seed_sets = set(), {-1}, [[0], [0, 1], [0, 1, 2]]
        for path in records:
            with open(path) as f:
                record = json.load(f)
            epochs.add(record["epochs"])
            frozen.add(record["frozen_stages"])
        if any("seed4" in p for p in records):
            seed_sets.append([0, 1, 2, 3, 4])
        if any("seed9" in p for p in records):
            seed_sets.append(list(range(10)))  # look 2
        for budget in epochs:
            for stages in frozen:
                for seeds in seed_sets:
                    args = argparse.Namespace(
                        results=results,
                        epochs=budget,
                        seeds=seeds,
                        frozen_stages=stages,
                        compute_baselines=False,  # the committed file only, never the data
                    )
                    for name, rows in tables.items():
                        text = protocol.table(name, rows, args)
                        table = [x for x in text.splitlines() if x.startswith("|")]
                        header = _cells(table[0])
                        out += [(header, _cells(x)) for x in table[2:]]  # below the header
    return out


def _agrees(doc_header, cells, header, computed) -> bool:
    """Whether a documentation row is a computed row: every column the two headers share by
    name (the best epochs and the three metrics at least) holds the same text."""
    if computed[1] == "0":  # a row without records
        return False
    names = {name: i for i, name in enumerate(header) if i > 0}
    shared = [(j, names[name]) for j, name in enumerate(doc_header) if j > 0 and name in names]
    return len(shared) >= 4 and all(cells[j] == computed[i] for j, i in shared if j < len(cells))


def test_readme_emoji_rows_are_computed_from_the_records(protocol):
    rows = documentation_rows()
    assert len(rows) >= 40  # the tables are found
    computed = computed_rows(protocol)
    missing = [
        f"{doc_header[0]}: {' | '.join(cells)}"
        for doc_header, cells in rows
        if not any(_agrees(doc_header, cells, h, c) for h, c in computed)
    ]
    assert not missing, "documentation rows no report computes:\n" + "\n".join(missing)


def test_baselines_are_read_from_the_results_file_without_the_data(protocol, tmp_path):
    """The protocol table's rows without training come from ``<results>/baselines.json``: the
    fixed rows in their order, the random head over the requested seeds that the file has, and
    nothing is computed when ``compute=False`` (no dataset here)."""
    values = {"recall@1": 0.5, "map@r": 0.25, "nmi": 0.75}
    (tmp_path / "baselines.json").write_text(
        json.dumps(
            {
                "fixed": {protocol.FEATURES: values, protocol.PIXELS: values},
                "random_head": {"0": values, "2": {**values, "recall@1": 0.7}},
            }
        )
    )
    rows = protocol.baselines(str(tmp_path), [0, 1, 2], compute=False)
    assert list(rows) == [protocol.PIXELS, protocol.FEATURES, protocol.BASELINE_HEAD]
    assert rows[protocol.PIXELS]["seeds"] is None
    assert rows[protocol.BASELINE_HEAD]["seeds"] == 2
    assert rows[protocol.BASELINE_HEAD]["recall@1"] == [0.5, 0.7]
    assert protocol.baselines(str(tmp_path / "none"), [0], compute=False) == {}


def test_a_corrupt_baselines_file_is_one_error_line(protocol, tmp_path):
    (tmp_path / "baselines.json").write_text('{"fixed": {')
    with pytest.raises(SystemExit, match=r"^error: .*baselines.json is not a baselines file"):
        protocol.baselines(str(tmp_path), [0], compute=False)
    (tmp_path / "baselines.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="delete it and run the report again"):
        protocol.baselines(str(tmp_path), [0], compute=False)


def test_rows_selects_a_subset_in_table_order_and_rejects_unknown_keys(protocol):
    tables = {"rho": ("margin", "R-margin"), "dm2": ("dm2-3-independent", "dm2-3-md")}
    chosen = protocol.select_rows(tables, "dm2-3-md, margin")
    assert chosen == {"rho": ("margin",), "dm2": ("dm2-3-md",)}
    with pytest.raises(SystemExit, match=r"^error: unknown row\(s\) \['md'\].*dm2-3-independent"):
        protocol.select_rows(tables, "margin,md")
    with pytest.raises(SystemExit, match=r"^error: unknown row"):
        protocol.select_rows(tables, " , ")


def _block_at(text: list[str], block: list[str]) -> int:
    """Where ``block`` stands as consecutive lines of ``text`` (-1: nowhere)."""
    return next(
        (i for i in range(len(text)) if text[i : i + len(block)] == block),
        -1,
    )


@pytest.mark.parametrize(
    "results, seeds, least, page",
    [("emoji-45", [0, 1, 2], 12, "history.md"), ("emoji-v2-45", list(range(10)), 14, "results.md")],
    ids=["format1", "format2"],
)
def test_the_claim_tables_are_computed_from_the_records(results, seeds, least, page):
    """Each claim table (format 2 at the top of the results, format 1 in the history) is what
    ``experiments/emoji_claims.py`` prints for the records it names, verdicts included."""
    claims = load_experiment("emoji_claims")
    args = argparse.Namespace(
        results=os.path.join(ROOT, "experiments", "results", results), epochs=45, seeds=seeds
    )
    expected = claims.claims_table(args).splitlines()
    with open(os.path.join(ROOT, "docs", page)) as f:
        text = f.read().splitlines()
    assert _block_at(text, expected) >= 0, "\n".join(expected)
    verdicts = [line.split("|")[7].strip(" *") for line in expected[2:]]
    assert len(verdicts) >= least and set(verdicts) <= {
        "reproduces",
        "does not reproduce",
        "not resolved",
    }
    if len(seeds) >= claims.LOOKS[0]:  # the generated sentences under it: Holm, the papers
        below = _block_at(text, expected) + len(expected)
        assert text[below + 1] == claims.holm_changes(args)
        assert text[below + 3] == claims.paper_summary(args)


def test_late_gain_is_what_the_last_epochs_add_to_the_best_before_them():
    """``emoji_claims.late_gain`` over explicit curves: a rise after the cut, a peak before it
    (negative), a tie (0), and a cut with no epoch on one side (an error, not a number)."""
    claims = load_experiment("emoji_claims")
    curve = lambda *r: [{"epoch": k, "recall@1": v} for k, v in enumerate(r)]  # noqa: E731
    assert claims.late_gain(curve(0.1, 0.5, 0.4, 0.7), 2) == pytest.approx(20.0)
    assert claims.late_gain(curve(0.1, 0.8, 0.4, 0.7), 2) == pytest.approx(-10.0)
    assert claims.late_gain(curve(0.1, 0.6, 0.6, 0.6), 1) == 0.0
    with pytest.raises(ValueError, match="both sides of epoch 3"):
        claims.late_gain(curve(0.1, 0.5, 0.4, 0.7), 3)


def test_the_budget_table_counts_last_epochs_and_late_gains(tmp_path, monkeypatch):
    """``emoji_claims.py --budget``: each row a claim compares, once, over the seeds it has a
    record of this budget for; the seeds whose selected epoch is the last, and the mean ± sample
    std and largest of what the last epochs add on validation, checked by hand."""
    claims = load_experiment("emoji_claims")

    def write(row: str, seed: int, selected: int, recalls: list[float], epochs: int = 4) -> None:
        os.makedirs(tmp_path / row, exist_ok=True)
        record = {
            "epochs": epochs,
            "meta": {"epoch": selected, "split": "val"},
            "val_curve": [{"epoch": k, "recall@1": v} for k, v in enumerate(recalls)],
        }
        (tmp_path / row / f"seed{seed}.json").write_text(json.dumps(record))

    write("diva", 0, 4, [0.1, 0.5, 0.6, 0.6, 0.7])  # +10 over epochs 0-2
    write("diva", 1, 2, [0.1, 0.5, 0.8, 0.7, 0.7])  # -10
    write("diva", 2, 4, [0.1, 0.5, 0.6, 0.6, 0.9], epochs=5)  # another budget: not read
    write("diva-D", 0, 1, [0.1, 0.5, 0.4, 0.4, 0.5])  # +0, one seed: no std
    claim = claims.Claim("p", "t", "diva", "diva-D", True)
    monkeypatch.setattr(claims, "CLAIMS", (claim, claims.Claim("p", "u", "diva", "diva-D", False)))
    args = argparse.Namespace(results=str(tmp_path), epochs=4, seeds=[0, 1, 2])
    rows = claims.budget_table(args, 2).splitlines()
    assert rows[0].startswith("| row of a claim, emoji validation, 4 epochs |")
    assert "epochs 3-4" in rows[0]
    assert rows[2:] == [
        "| DiVA (D+Da+S+I) | 2 | 1 | +0.00 ± 14.14 | +10.00 |",
        "| margin, one 512-d head | 1 | 0 | +0.00 | +0.00 |",
    ]
    for bad in (0, 4):
        with pytest.raises(ValueError, match=f"--budget {bad}: give a window of 1 to 3 epochs"):
            claims.budget_table(args, bad)
    write("diva", 1, 2, [0.1, 0.5])  # a curve cut short: the record is named
    with pytest.raises(ValueError, match=r"diva/seed1\.json: .*both sides of epoch 2"):
        claims.budget_table(args, 2)


def test_the_budget_table_is_computed_from_the_records():
    """The budget table of the format-2 results is what ``emoji_claims.py --budget 5`` prints
    for the committed records."""
    claims = load_experiment("emoji_claims")
    args = argparse.Namespace(
        results=os.path.join(ROOT, "experiments", "results", "emoji-v2-45"),
        epochs=45,
        seeds=list(range(10)),
    )
    expected = claims.budget_table(args, 5).splitlines()
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        text = f.read().splitlines()
    assert len(expected) >= 2 + 18 and _block_at(text, expected) >= 0, "\n".join(expected)


def test_the_tuning_table_is_computed_from_the_records(protocol):
    """The tuning table of the results is what the tune report prints for the committed tuning
    records (a record committed without regenerating the table fails here)."""
    args = argparse.Namespace(
        results=os.path.join(ROOT, "experiments", "results", "emoji-v2-tune-20"),
        epochs=20,
        seeds=[0],
        frozen_stages=-1,
    )
    expected = [x for x in protocol.tune_table(args).splitlines() if x.startswith("|")]
    with open(os.path.join(ROOT, "docs", "results.md")) as f:
        text = f.read().splitlines()
    start = text.index(expected[0])
    assert text[start : start + len(expected)] == expected


def test_every_row_builds_its_config_with_the_selected_settings(protocol):
    """Every row of every table gets a config from the committed tuning records' selections
    (a selected key the row's config lacks, as Sharing's shared weight on the class-only
    control once was, is a ConfigError here rather than hours into the queue)."""
    tune = os.path.join(ROOT, "experiments", "results", "emoji-v2-tune-20")
    protocol.use_selected(tune, 20)
    try:
        for row, (_, build) in protocol.ROWS.items():
            c = build()
            if not row.startswith("tune-margin-"):  # the baseline's lr, shared by every row
                assert c.optim.lr == 2e-4, row
        assert protocol.ROWS["sharing-class"][1]().get("aux", {}).get("shared") is None
        assert protocol.ROWS["sharing"][1]().aux.shared.weight == 1.0
    finally:
        protocol.SETTINGS.clear()


def test_parallel_jobs_train_each_missing_run_once(protocol, monkeypatch, tmp_path):
    """``--jobs``: one process per (row, seed) without a record, a row shared by two tables
    (the margin baseline of protocol and rho) once, each with the arguments of the call."""
    from jdml.study import executor

    started = []

    def run_all(jobs, slots, echo):
        started.extend(jobs)
        return ["R-margin seed 99"]  # one failed: left out of the tables

    monkeypatch.setattr(executor, "run_all", run_all)
    tune = os.path.join(ROOT, "experiments", "results", "emoji-v2-tune-20")
    protocol.use_selected(tune, 20)
    try:
        args = argparse.Namespace(
            results=os.path.join(ROOT, "experiments", "results", "emoji-v2-45"),
            out=str(tmp_path),
            epochs=45,
            seeds=[0, 1, 2, 99],  # 99: a seed no record will ever have
            frozen_stages=-1,
            cohort=3,
            tune_epochs=20,
            tune_results=tune,
            tuned=True,
            check_settings=True,
            jobs=2,
        )
        names = ["protocol", "rho"]
        tables = {n: protocol.TABLES[n][1] for n in names}
        failed = protocol.train_in_parallel(protocol.training_order(names, tables), args)
    finally:
        protocol.SETTINGS.clear()
    assert [j.name for j in started] == ["margin seed 99", "R-margin seed 99"]
    assert failed == [("R-margin", 99)]
    argv = started[1].command
    assert argv[2:6] == ("--tables=rho", "--rows=R-margin", "--seeds", "99")
    assert {"--tuned", "--no-report", f"--out={tmp_path}", "--epochs=45"} <= set(argv)
    assert started[0].log == os.path.join(str(tmp_path), "margin", "seed99.log")


def test_a_claim_is_read_at_the_first_look_that_resolves_it(monkeypatch):
    """The design of ``experiments/emoji_claims.py``: under 5 seeds the 95 % interval; from 5,
    look 1 at the two-look level, and look 2 (10 seeds) only where look 1 is unresolved and
    both rows reach 10 seeds; rows short of look 1 get the interim reading of seeds 0-2."""
    from jdml.statistics import paired

    claims = load_experiment("emoji_claims")
    # Per seed differences: "up" clears 0 at 5 seeds; "late" only at 10; "never" holds 0 at both.
    data = {
        "up": [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.0, 1.1, 0.9],
        "late": [1.0, -0.5, 1.2, 0.1, 0.9, 1.0, 0.8, 1.1, 0.7, 0.9],
        "never": [1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 0.1, -0.1, 0.3, -0.3],
        "short": [1.0, -0.5, 1.2, 0.1, 0.9, 1.0, 0.8],  # "late" whose rows have seeds 0-6 only
    }

    def fake(claim, args, seeds, level):
        values = data[claim.row][: len(seeds)]
        return paired(values, [0.0] * len(values), level) if len(values) == len(seeds) else None

    monkeypatch.setattr(claims, "_difference", fake)
    claim = lambda row: claims.Claim("paper", "text", row, "base", False)  # noqa: E731
    args = lambda n: argparse.Namespace(seeds=list(range(n)))  # noqa: E731
    level = f"{100 * claims.LOOK_LEVEL:.2f} %"
    for row, n, seeds, look, verdict in (
        ("up", 3, 3, "95 %, before look 1", "reproduces"),
        ("up", 10, 5, f"{level}, look 1 of 2", "reproduces"),
        ("late", 5, 5, f"{level}, look 1 of 2", "not resolved"),
        ("late", 10, 10, f"{level}, look 2 of 2", "reproduces"),
        ("never", 10, 10, f"{level}, look 2 of 2", "not resolved"),
        ("short", 10, 5, f"{level}, look 1 of 2", "not resolved"),
    ):
        d, said = claims.claim_difference(claim(row), args(n))
        assert (d.n, said, d.verdict()) == (seeds, look, verdict), row
    assert claims.claim_difference(claim("short"), args(3))[0].n == 3
    # Rows short of look 1: the interim reading over the first three seeds, however many asked.
    data["short"] = data["short"][:4]
    for n in (5, 10):
        d, said = claims.claim_difference(claim("short"), args(n))
        assert (d.n, said) == (3, "95 %, before look 1")
    data["short"] = data["short"][:2]
    assert claims.claim_difference(claim("short"), args(10)) is None
    # Look 2 trains both rows of the claims look 1 leaves unresolved, for DM2's claims apart.
    data["base"] = data["up"]
    monkeypatch.setattr(
        claims,
        "CLAIMS",
        (
            claims.Claim("p", "t", "up", "base", False),
            claims.Claim("p", "t", "late", "base", False),
            claims.Claim("p", "t", "never", "base", False, frozen=3),
            claims.Claim("p", "t", "late", "", False, fixed="raw pixels"),
            claims.Claim("p", "t", "interim", "base", False),  # short of look 1: not yet
        ),
    )
    data["interim"] = data["never"][:4]
    assert claims.look2_rows(args(5), -1) == ["late", "base"]
    assert claims.look2_rows(args(10), 3) == ["never", "base"]


def test_update_claim_tables_replaces_a_stale_table_with_the_commands_output(tmp_path):
    """tools/update_claim_tables.py: the table after a claim command becomes the one the
    command prints now; other fences and the text around stay as they were."""
    spec = importlib.util.spec_from_file_location(
        "update_claim_tables", os.path.join(ROOT, "tools", "update_claim_tables.py")
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    plot = tmp_path / "claims.png"
    command = (
        "python experiments/emoji_claims.py --results experiments/results/emoji-45 \\\n"
        f"  --seeds 0 1 2 --plot {plot}\n"
    )
    stale = "| claim, emoji test | verdict |\n|---|---|\n| old | **reproduces** |\n"
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```bash\necho untouched\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        f"```bash\n{command}```\n\n{stale}\nText after.\n"
    )
    assert tool.update(str(page)) == 1
    text = page.read_text()
    expected = tool.table_lines(tool.run_command(command))
    assert expected and expected[0].startswith("| claim, emoji test")
    assert "\n".join(expected) + "\n\nText after.\n" in text
    assert "| old |" not in text and "| 1 | 2 |" in text and plot.exists()
    assert tool.update(str(page)) == 0  # up to date now

    page.write_text(f"```bash\n{command}```\n\nNo table.\n")
    with pytest.raises(RuntimeError, match="no table after"):
        tool.update(str(page))


def test_holm_reads_the_family_of_trained_claims(monkeypatch):
    """Holm's column over hand-made readings: the family is the claims comparing two trained
    rows read at a look (not a fixed baseline, not an interim reading); a claim that clears its
    own interval but not Holm's step-down bound is not resolved there, and the generated
    sentence names exactly the verdicts that change."""
    from jdml.statistics import paired

    claims = load_experiment("emoji_claims")
    data = {  # per-seed differences over 5 seeds, read at look 1
        "strong": [1.0, 1.1, 0.9, 1.05, 0.95],  # p ~ 1e-6: survives any correction
        "weak": [0.4, 0.9, 0.1, 0.7, 0.5],  # clears its own 97.06 % interval, p ~ 0.01
        "null": [0.5, -0.4, 0.2, -0.3, 0.1],
        "fixed": [30.0, 31.0, 29.0, 30.5, 29.5],
    }

    def fake(claim, args, seeds, level):
        values = data[claim.row][: len(seeds)]
        return paired(values, [0.0] * len(values), level) if len(values) == len(seeds) else None

    monkeypatch.setattr(claims, "_difference", fake)
    family = (
        claims.Claim("p", "strong claim", "strong", "base", False),
        claims.Claim("p", "weak claim", "weak", "base", False),
        claims.Claim("p", "null claim", "null", "base", False),
        claims.Claim("p", "fixed claim", "fixed", "", False, fixed="raw pixels (64 px)"),
    )
    monkeypatch.setattr(claims, "CLAIMS", family)
    monkeypatch.setitem(claims.protocol.ROWS, "strong", ("strong", None))
    monkeypatch.setitem(claims.protocol.ROWS, "weak", ("weak", None))
    monkeypatch.setitem(claims.protocol.ROWS, "null", ("null", None))
    monkeypatch.setitem(claims.protocol.ROWS, "fixed", ("fixed", None))
    monkeypatch.setitem(claims.protocol.ROWS, "base", ("base", None))
    args = argparse.Namespace(seeds=list(range(5)), epochs=45)
    p_weak = fake(family[1], args, range(5), claims.LOOK_LEVEL).p_value()
    assert fake(family[1], args, range(5), claims.LOOK_LEVEL).verdict() == "reproduces"
    # Second smallest p-value: it clears its own level, not Holm's bound at rank 2 of 3.
    assert (1 - claims.LOOK_LEVEL) / 2 < p_weak < 1 - claims.LOOK_LEVEL
    assert claims.holm_verdicts(args) == {0: "reproduces", 1: "not resolved", 2: "not resolved"}
    table = [
        [cell.strip() for cell in line.split("|")[7:9]]
        for line in claims.claims_table(args).splitlines()
    ]
    assert table[0] == ["verdict", "Holm verdict (3 claims)"]
    assert table[3] == ["**reproduces**", "**not resolved**"]  # weak: changed
    assert table[5] == ["**reproduces**", "- (fixed baseline)"]
    assert claims.holm_changes(args) == (
        "Holm's correction across the 3 claims changes 1 verdict(s): p: weak claim "
        "(reproduces -> not resolved)."
    )
    assert claims.paper_summary(args) == (
        "No interval of the 0 claims with a paper effect lies below it."
    )
    # With paper effects (points): the null claim's interval (about -41 to +45) lies below 60.
    family = (
        dataclasses.replace(family[0], effect=60.0, effect_source="T1, X"),
        family[1],
        dataclasses.replace(family[2], effect=60.0, effect_source="T2, Y"),
        family[3],
    )
    monkeypatch.setattr(claims, "CLAIMS", family)
    assert claims.paper_summary(args) == (
        "1 of the 2 claims with a paper effect are smaller than reported (their interval lies "
        "wholly below the smallest effect the paper prints): p: null claim."
    )
    # Interim readings (fewer seeds than look 1) are outside the family.
    args3 = argparse.Namespace(seeds=[0, 1, 2], epochs=45)
    assert claims.holm_verdicts(args3) == {}
    lines = claims.claims_table(args3).splitlines()[2:5]
    assert all(line.split("|")[8].strip() == "- (interim)" for line in lines)


def test_a_claim_is_read_against_the_paper_effect():
    """The rule declared before it is applied: an interval wholly below the paper's effect is
    "smaller than reported" (also when it holds 0: "not resolved" about zero), any other "not
    below it"; no effect or one seed: "-"."""
    from jdml.statistics import Paired

    claims = load_experiment("emoji_claims")
    around_zero = Paired(0.001, -0.004, 0.006, 10, 0.97)  # points: +0.10 [-0.40, +0.60]
    assert around_zero.verdict() == "not resolved"
    for effect, reading in ((0.61, "smaller than reported"), (0.60, "not below it"),
                            (-0.40, "not below it"), (-3.0, "not below it"),
                            (None, "-")):  # fmt: skip
        assert claims.against_paper(around_zero, effect) == reading, effect
    assert claims.against_paper(Paired(0.01, -math.inf, math.inf, 1), 5.0) == "-"
    # Every claim with a paper effect says where it is printed; the controls have none.
    for claim in claims.CLAIMS:
        assert (claim.effect is None) == (not claim.effect_source), claim.text
        if "(control)" in claim.paper or claim.fixed:
            assert claim.effect is None, claim.text


def test_claims_with_kept_hits_are_read_over_seeds_and_classes(tmp_path, monkeypatch):
    """``emoji_claims.py --classes`` over hand-made records: a claim whose records of every
    seed of its look keep per-query hits gets the bootstrap over seeds and the two-way one over
    seeds and classes, at the look's level; the per-query means are the records' Recall@1;
    a claim with a record short of hits is left out."""
    from jdml.evaluation import per_query as pq
    from jdml.statistics import two_way_bootstrap

    claims = load_experiment("emoji_claims")
    claim = claims.Claim("p", "rows differ", "R-margin", "margin", False)
    other = claims.Claim("p", "no hits", "triplet", "margin", False)
    monkeypatch.setattr(claims, "CLAIMS", (claim, other))
    rng = np.random.default_rng(0)
    classes = np.repeat(np.arange(20), 5)
    hits = {}
    for row, rate in (("R-margin", 0.8), ("margin", 0.7), ("triplet", 0.7)):
        for seed in range(5):
            h = (rng.random(100) < rate).astype(np.float64)
            hits[row, seed] = h
            record = {"row": row, "seed": seed, "epochs": 45, "frozen_stages": -1,
                      "results": {"test": {"recall@1": float(h.mean())}}}  # fmt: skip
            if row != "triplet" or seed < 4:
                vectors = {pq.classes_key(): classes, pq.vector_key("embedding", "recall@1"): h}
                record["per_query"] = {"test": pq.pack(vectors, "embedding")}
            path = tmp_path / row / f"seed{seed}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(record))
    args = argparse.Namespace(results=str(tmp_path), epochs=45, seeds=list(range(5)))
    d, look = claims.claim_difference(claim, args)
    assert look.endswith("look 1 of 2") and d.n == 5
    seeds_only, both = claims.class_reading(claim, args)
    diffs = np.stack([hits["R-margin", s] - hits["margin", s] for s in range(5)])
    assert both == two_way_bootstrap(diffs, classes, claims.LOOK_LEVEL)
    assert seeds_only == two_way_bootstrap(diffs, classes, claims.LOOK_LEVEL, over_classes=False)
    assert both.mean == pytest.approx(d.mean) and both.level == claims.LOOK_LEVEL
    assert claims.class_reading(other, args) is None  # seed 4 of triplet has no hits
    table = claims.classes_table(args).splitlines()
    assert len(table) == 3 and table[2].startswith("| p | rows differ | 5 | ")
    ratio = (both.high - both.low) / (seeds_only.high - seeds_only.low)
    assert f"| {ratio:.2f} | {seeds_only.verdict()} / {both.verdict()} |" in table[2]
    monkeypatch.setattr(claims, "CLAIMS", (other,))
    assert claims.classes_table(args).startswith("No claim's records keep per-query hits")
