"""The documentation's emoji result tables against the committed study folders.

Every row of a table in README.md or a page of docs/ whose header names "emoji test" and that
reports a trained run (a best epoch) or a baseline without training (raw pixels, ImageNet
features, the network before fine-tuning) must be a row that ``jdml study report DIR --print
table:...`` computes from a study folder in ``experiments/results/emoji*`` (for the first N
seeds, compared with some row of the folder): the same seeds, best epochs and metric cells,
bold marks aside. Labels may be longer in the documentation; extra trailing columns (the
60-epoch table's train Recall@1) are not checked. Tables titled "records not kept" are runs
whose records predate the record files. The claims, tuning and budget tables are what their
``jdml study report`` commands print.
"""

from __future__ import annotations

import csv
import glob
import math
import os
import re

import pytest

from jdml.study import baselines, spec, tables
from jdml.study import records as rec
from jdml.study.report import against_paper, load, part
from tests.helpers import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "experiments", "results")
V2 = os.path.join(RESULTS, "emoji-v2-45")


def _checked_table(title: str) -> bool:
    """Whether a table's rows have their records in the repository: an emoji table, unless its
    title says that the records of its runs were not kept."""
    return (
        "emoji test" in title and "records not kept" not in title and not title.startswith("claim")
    )


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


def computed_rows(headers: list[list[str]]) -> list[tuple[list[str], list[str]]]:
    """(header, cells) of every row the report computes from the committed study folders:
    every row and baseline of a folder side by side, for each prefix of seeds the records
    have, compared with each row a documentation header names in its "Δ ... vs <label>"."""
    named = {re.sub(r"^Δ recall@1 vs (.*) \[95 % CI\]$", r"\1", c) for h in headers for c in h}
    out = []
    for folder in sorted(glob.glob(os.path.join(RESULTS, "emoji*"))):
        study = load(folder)
        rows = {r["name"]: r for r in study["rows"]}
        by_row = rec.seed_records(folder)
        fixed = baselines.read(folder)
        most = max(max(v) for v in by_row.values()) + 1
        bases = [n for n, r in rows.items()
                 if re.sub(r",\s+", ",", r["label"]) in named and by_row.get(n)]  # fmt: skip
        for base in bases or [next(iter(rows))]:
            names = [*fixed, base, *(n for n in rows if n != base)]
            for seeds in sorted({1, 2, 3, 5, 10, most}):
                text = tables.group_table(names, rows, by_row, fixed, study["metrics"], "t", seeds)
                table = text.splitlines()
                header = _cells(table[0])
                out += [(header, _cells(x)) for x in table[2:]]
    return out


def _agrees(doc_header, cells, header, computed) -> bool:
    """Whether a documentation row is a computed row: every column the two headers share by
    name (the best epochs and the three metrics at least) holds the same text."""
    if computed[1] == "0":  # a row without records (its seeds train again): dashes alone
        return cells[1] == "0" and set(cells[2:]) == {"-"}
    names = {name: i for i, name in enumerate(header) if i > 0}
    shared = [(j, names[name]) for j, name in enumerate(doc_header) if j > 0 and name in names]
    return len(shared) >= 4 and all(cells[j] == computed[i] for j, i in shared if j < len(cells))


def test_readme_emoji_rows_are_computed_from_the_records():
    rows = documentation_rows()
    assert len(rows) >= 40  # the tables are found
    by_epochs: dict[str, list] = {}  # computed rows by their best epochs
    for header, cells in computed_rows([h for h, _ in rows]):
        by_epochs.setdefault(cells[header.index("best epoch")], []).append((header, cells))
    missing = []
    for doc_header, cells in rows:
        found = by_epochs.get(cells[doc_header.index("best epoch")], [])
        if not any(_agrees(doc_header, cells, h, c) for h, c in found):
            missing.append(f"{doc_header[0]}: {' | '.join(cells)}")
    assert not missing, "documentation rows no report computes:\n" + "\n".join(missing)


def _page(name: str) -> list[str]:
    with open(os.path.join(ROOT, "docs", name)) as f:
        return f.read().splitlines()


def _block_at(text: list[str], block: list[str]) -> int:
    """Where ``block`` stands as consecutive lines of ``text`` (-1: nowhere)."""
    return next(
        (i for i in range(len(text)) if text[i : i + len(block)] == block),
        -1,
    )


@pytest.mark.parametrize(
    "folder, least, page",
    [("emoji-45", 12, "history.md"), ("emoji-v2-45", 14, "results.md")],
    ids=["format1", "format2"],
)
def test_the_claim_tables_are_computed_from_the_records(folder, least, page):
    """Each claim table (format 2 at the top of the results, format 1 in the history) is what
    ``jdml study report DIR --print claims`` prints for its folder, verdicts included, with
    the sentences under it (Holm's changes, the papers' effects) where a claim is read at a
    look."""
    expected = part(os.path.join(RESULTS, folder), "claims").splitlines()
    assert _block_at(_page(page), expected) >= 0, "\n".join(expected)
    verdicts = [line.split("|")[7].strip(" *") for line in expected[2:] if line.startswith("|")]
    assert len(verdicts) >= least and set(verdicts) <= {
        "reproduces",
        "does not reproduce",
        "not resolved",
        "-",  # a claim whose seeds train (again): no reading yet
    }
    looks = folder == "emoji-v2-45"  # format 1's claims are interim: no sentence under them
    assert any(line.startswith("Holm's correction") for line in expected) == looks


@pytest.mark.parametrize(
    "what, least, page", [("budget:5", 10, "results.md"), ("tune", 20, "tuning.md")]
)
def test_the_budget_and_tuning_tables_are_computed_from_the_records(what, least, page):
    """The format-2 results' budget table and tuning table (its own page) are what their
    commands print for the committed records (a record committed without regenerating them
    fails here)."""
    expected = part(V2, what).splitlines()
    assert len(expected) >= 2 + least and _block_at(_page(page), expected) >= 0, "\n".join(expected)


def test_the_converted_folders_tell_how_the_emoji_study_was_run():
    """The ledger of the format-2 folder: the tuned rows' selections with their scores, the
    others shared from those searches, the registration made after every test result, and the
    looks' decisions by each claim's own verdict (the rule then ignored Holm's correction)."""
    from jdml.study import ledger

    events = ledger.events(V2)
    [registered] = [e for e in events if e["event"] == "registered"]
    assert registered["tests_seen"] == 180
    # What the conversion wrote (the study's own runs append after it).
    converted = [e for e in events if e["time"] <= registered["time"]]
    selected = {e["row"]: e for e in converted if e["event"] == "selected"}
    tuned = {r for r, e in selected.items() if e["tried"]}
    assert tuned == {"margin", "R-margin", "diva", "sharing-decor", "dm2-3-md+td+vd"}
    assert selected["margin"]["values"] == {"optim.lr": 2e-4}
    assert selected["diva-D"]["shared_from"] == ["margin"]
    # Every effect the papers print, declared after those results and before any new one.
    amended = [e for e in events if e["event"] == "amendment"]
    assert amended and all(e["tests_seen"] == 180 and e["changed"] == ["claims"] for e in amended)
    study = spec.load(os.path.join(ROOT, "experiments", "emoji_study.py"))
    assert ledger.frozen(V2)["sha256"] == spec.digest(spec.registration(study))
    looks = {e["look"]: e for e in converted if e["event"] == "look"}
    assert "DaNCE's head adds to the discriminative one" in looks[1]["stop"]
    assert looks[2]["go_on"] == []
    command = load(V2)["command"]
    assert command.startswith(("the emoji protocol's scripts", "jdml study run")), command


def test_the_wider_rows_are_a_study_of_their_own():
    """The rows no claim reads moved from the claims' folder to emoji-wider-45 (its study is
    ``emoji_study.py:wider``); margin's and R-margin's search and seeds 0-4 are copies there,
    the ledger saying so; the other rows are still to be searched (their values shared)."""
    from jdml.study import ledger
    from jdml.study.runner import searched

    wider_dir = os.path.join(RESULTS, "emoji-wider-45")
    study = spec.load(os.path.join(ROOT, "experiments", "emoji_study.py"), "wider")
    assert [r["name"] for r in load(wider_dir)["rows"]] == [r.name for r in study.rows]
    events = ledger.events(wider_dir)
    selected = {e["row"]: e for e in events if e["event"] == "selected"}
    assert {r for r, e in selected.items() if e.get("copied_from")} == {"margin", "R-margin"}
    assert {r for r, e in selected.items() if searched(e, study)} == {"margin", "R-margin"}
    by_row = rec.seed_records(wider_dir)
    claims_rows = set(rec.seed_records(V2))
    assert not (set(by_row) - {"margin", "R-margin"}) & claims_rows
    for name in ("margin", "R-margin"):
        assert sorted(by_row[name]) == [0, 1, 2, 3, 4]
        for seed, record in by_row[name].items():
            assert record == rec.read(rec.seed_record_path(V2, name, seed))
    [registered] = [e for e in events if e["event"] == "registered"]
    assert registered["tests_seen"] == sum(len(v) for v in by_row.values()) == 20
    assert ledger.frozen(wider_dir)["sha256"] == spec.digest(spec.registration(study))


def test_a_claim_is_read_against_the_paper_effect():
    """The rule declared before it is applied: an interval wholly below the paper's effect is
    "smaller than reported" (also when it holds 0: "not resolved" about zero), any other "not
    below it"; no effect or one seed: "-"."""
    from jdml.statistics import Paired

    around_zero = Paired(0.001, -0.004, 0.006, 10, 0.97)  # points: +0.10 [-0.40, +0.60]
    assert around_zero.verdict() == "not resolved"
    for effect, reading in ((0.61, "smaller than reported"), (0.60, "not below it"),
                            (-0.40, "not below it"), (-3.0, "not below it"),
                            (None, "-")):  # fmt: skip
        assert against_paper(around_zero, effect) == reading, effect
    assert against_paper(Paired(0.01, -math.inf, math.inf, 1), 5.0) == "-"
    # Every claim but the controls, the fixed baselines and rho-regularisation (whose values
    # the text copy lacks) declares the effects its paper prints, each saying where; the file
    # of effects names no claim the study does not have.
    study = spec.load(os.path.join(ROOT, "experiments", "emoji_study.py"))
    for claim in study.claims:
        none = "(control)" in claim.paper or claim.fixed or claim.row == "R-margin"
        assert bool(claim.printed()) != bool(none), claim.text
        assert all(e.source for e in claim.printed()), claim.text
    with open(os.path.join(ROOT, "experiments", "emoji_effects.csv")) as f:
        named = {line["claim"] for line in csv.DictReader(f)}
    assert named <= {c.text for c in study.claims} and len(named) == 13


@pytest.mark.slow
def test_update_claim_tables_replaces_a_stale_table_with_the_commands_output(tmp_path):
    """tools/update_claim_tables.py: the table after a claims command becomes the one the
    command prints now; other fences and the text around stay as they were."""
    tool = load_script("tools/update_claim_tables.py")
    plot = tmp_path / "claims.png"
    command = f"jdml study report experiments/results/emoji-45 --print claims \\\n  --plot {plot}\n"
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
