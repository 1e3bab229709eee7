"""The parts of ``jdml study report`` that read the claims (``--print PART``) on hand-made
records, against computations written out here: a claim against a fixed baseline, the
readings per paper, the seeds an unresolved claim needs, the design's rates, the epoch budget's
plateau and the class bootstrap; the fixed baselines themselves, and the emoji study file."""

from __future__ import annotations

import glob
import json
import math
import os

import numpy as np
import pytest
from scipy import stats

from jdml.statistics import false_verdict_rate, seeds_to_resolve
from jdml.study import Claim, Float, Row, Study, baselines, ledger, spec
from jdml.study import records as rec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
A = [0.62, 0.60, 0.65]  # row a's test recall@1 over seeds 0-2
B = [0.55, 0.58, 0.56]
PIXELS = 0.40
LATE = [0.01, -0.02, 0.03]  # what epochs 3-4 add to the best of epochs 1-2, per seed of a


def _record(row: str, seed: int, r1: float, gain: float, hits=None, classes=None) -> dict:
    from jdml.evaluation import per_query

    curve = [{"epoch": 0, "recall@1": 0.1}, {"epoch": 1, "recall@1": 0.5},
             {"epoch": 2, "recall@1": 0.6}, {"epoch": 3, "recall@1": 0.55},
             {"epoch": 4, "recall@1": 0.6 + gain}]  # fmt: skip
    record = {"row": row, "seed": seed, "meta": {"epoch": 4 if gain > 0 else 2},
              "results": {"test": {"recall@1": r1}}, "val_curve": curve}  # fmt: skip
    if hits is not None:
        record["per_query"] = {"test": per_query.pack(
            {per_query.vector_key("embed", "recall@1"): hits, per_query.classes_key(): classes},
            "embed")}  # fmt: skip
    return record


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    d = str(tmp_path_factory.mktemp("parts") / "study")
    study = Study(
        name="parts",
        rows=(
            Row("a", "revisiting", space={"optim.lr": Float(1e-4, 1e-2)}, label="A"),
            Row("b", "revisiting", space={"optim.lr": Float(1e-4, 1e-2)}, label="B"),
        ),
        data={"data.name": "npz", "data.path": "x.npz"},
        looks=(3,),
        claims=(
            Claim("a beats pixels", "a", "", paper="P, Tab. 1", family=False, fixed="pixels"),
            Claim("a beats b", "a", "b", effect=9.0, source="P Tab. 2, X", paper="P, Tab. 2"),
            Claim("b beats a", "b", "a", paper="Q (control)"),
        ),
    )
    configs = {
        r.name: {"cohort.size": 1, "data.name": "npz", "train.epochs": 4} for r in study.rows
    }
    os.makedirs(d)
    with open(os.path.join(d, "study.json"), "w") as f:
        json.dump(spec.describe(study, configs), f)
    with open(os.path.join(d, "baselines.json"), "w") as f:
        label = "raw pixels (8 x 8 x 3, L2-normalised)"
        json.dump({"fixed": {"pixels": {"label": label, "recall@1": PIXELS}}}, f)
    ledger.freeze(d, spec.registration(study))
    rng = np.random.default_rng(0)
    classes = np.repeat(np.arange(5), 4)
    for s in range(3):
        hits_a = (rng.random(20) < 0.6).astype(float)
        hits_b = (rng.random(20) < 0.5).astype(float)
        rec.write_once(
            rec.seed_record_path(d, "a", s), _record("a", s, A[s], LATE[s], hits_a, classes)
        )
        rec.write_once(rec.seed_record_path(d, "b", s), _record("b", s, B[s], 0.0, hits_b, classes))
    return d


def _interval(diffs: np.ndarray, level: float) -> tuple[float, float, float]:
    half = stats.t.ppf(0.5 + level / 2, len(diffs) - 1) * diffs.std(ddof=1) / math.sqrt(len(diffs))
    return diffs.mean(), diffs.mean() - half, diffs.mean() + half


def test_a_claim_against_a_fixed_baseline_and_the_claims_table(folder):
    from jdml.study.report import part

    text = part(folder, "claims")
    lines = text.splitlines()
    assert lines[0].startswith("| claim, npz test, 4 epochs | says | rows compared | seeds |")
    assert lines[0].endswith("| bootstrap over seeds and classes |")  # the records keep hits
    mean, low, high = _interval(100 * (np.array(A) - PIXELS), 0.95)
    fixed = lines[2].split(" | ")
    assert fixed[:4] == ["| P, Tab. 1", "a beats pixels", "A - raw pixels", "3"]
    assert fixed[4] == f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]"
    assert fixed[7] == "- (fixed baseline)" and fixed[-1] == "- |"  # no bootstrap: one side fixed
    mean, low, high = _interval(100 * (np.array(A) - np.array(B)), 0.95)
    pair = lines[3].split(" | ")
    assert pair[2] == "A - B (one head)" and pair[4] == f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]"
    assert pair[9] == "+9.00 (P Tab. 2, X)"
    assert pair[10] == ("smaller than reported" if high < 9.0 else "not below it")
    # The fixed claim is outside the family; two papers: Holm within each shown beside.
    assert "| Holm verdict (2 claims) | Holm, per paper |" in lines[0]
    assert "claims with a paper effect are smaller than reported" in text


def test_the_readings_and_the_seeds_needed_by_hand(folder):
    from jdml.study.report import part

    diffs = 100 * (np.array(A) - np.array(B))
    mean, low, high = _interval(diffs, 0.95)
    readings = part(folder, "readings")
    assert readings.startswith("**P** (2 claims: ")
    assert (  # what the table does not show: the seeds above 0 and the per-seed std
        f"- a beats b (Tab. 2): {int((diffs > 0).sum())} of 3 seeds above 0, per-seed std "
        f"{diffs.std(ddof=1):.2f}; **"
    ) in readings
    assert f"{mean:+.2f} [" not in readings  # the table's numbers are not repeated
    assert "**Q** (1 claims: " in readings and "- b beats a (a control): " in readings
    from jdml.study.tables import _seeds_to_resolve

    assert _seeds_to_resolve(0.01, 50.0, 0.95, 0.8) == "more than 10000"  # not an error
    needed = part(folder, "seeds-needed")
    verdict = "not resolved" if low <= 0 <= high else "resolved"
    if verdict == "not resolved":
        n = seeds_to_resolve(9.0, diffs.std(ddof=1), 0.95)
        assert f"| P, Tab. 2: a beats b | 3 | {diffs.std(ddof=1):.2f} | +9.00 | {n} |" in needed
    else:
        assert len(needed.splitlines()) == 2


def test_the_design_the_budget_and_the_classes(folder):
    from jdml.study.report import part

    design = part(folder, "design")
    assert f"{100 * false_verdict_rate(0.95, (3,)):.1f} %" in design
    budget = part(folder, "budget:2").splitlines()
    assert budget[0].startswith("| row of a claim, npz validation, 4 epochs | seeds |")
    gains = 100 * np.array(LATE)
    assert budget[2] == (
        f"| A | 3 | 2 | {gains.mean():+.2f} ± {gains.std(ddof=1):.2f} | {gains.max():+.2f} |"
    )
    assert budget[3] == "| B | 3 | 0 | +0.00 ± 0.00 | +0.00 |"
    from jdml.errors import ReportError

    with pytest.raises(ReportError, match="window of 1 to 3"):
        part(folder, "budget:4")
    with pytest.raises(ReportError, match="choose one of"):
        part(folder, "plots")
    classes = part(folder, "classes").splitlines()
    assert len(classes) == 4 and classes[2].startswith("| P, Tab. 2 | a beats b | 3 |")


def test_the_pixels_baseline_by_hand_and_features_need_weights(tmp_path):
    from jdml.study.baselines import ensure, evaluate, read
    from jdml.study.runner import seed_config
    from tests.helpers import make_digits_npz
    from tests.study.digits_study import get_study

    study = get_study(make_digits_npz(str(tmp_path / "digits.npz")))
    config = seed_config(study, study.rows[0], {"optim.lr": 1e-3}, 0)
    found = ensure(str(tmp_path), config, ["pixels"], ["recall@1"], "abc")
    assert read(str(tmp_path)) == found
    from jdml.data.loading import load_splits

    test = load_splits(config.data)["test"]
    x = test.eval_images(np.arange(len(test))).reshape(len(test), -1).astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    r1 = float((test.labels[d.argmin(1)] == test.labels).mean())
    assert found["pixels"]["recall@1"] == pytest.approx(r1, abs=1e-6)
    assert found["pixels"]["label"].startswith("raw pixels (")
    with pytest.raises(ValueError, match=r"model\.pretrained"):
        evaluate(config, ["features"], ["recall@1"])


def test_the_emoji_study_declares_the_rows_and_claims_of_its_records():
    from jdml.config import flatten_config
    from jdml.config.validation import validate
    from jdml.study import claims as cl
    from jdml.study.runner import seed_config

    study = spec.load(os.path.join(ROOT, "experiments", "emoji_study.py"))
    assert len(study.rows) == 19 and len(study.claims) == 18
    wider = spec.load(os.path.join(ROOT, "experiments", "emoji_study.py"), "wider")
    assert len(wider.rows) == 12 and not wider.claims and wider.looks == (5,)
    # The claims' rows and the wider ones are disjoint but for the wider table's references.
    shared = {r.name for r in study.rows} & {r.name for r in wider.rows}
    assert shared == {"margin", "R-margin"}
    for name in shared:
        assert study.row(name) == wider.row(name)
    assert sum(c.family for c in study.claims) == 16
    concat = {}
    for row in (*study.rows, *wider.rows):
        c = seed_config(study, row, spec.first_candidate(study, row), 0)
        validate(c)
        concat[row.name] = cl.embedding_name(flatten_config(c.to_dict()), True)
    assert concat["diva"] == "concat:1,1,1,1" and concat["diva-D"] is None
    assert concat["sharing-2class"] == "concat:1,1" and concat["dm2-3-md"] == "concat:1,1,1"


def _two_rows(d: str, claims: tuple, a: list[float], b: list[float]) -> None:
    """A study folder of rows a and b, one look of their seeds, the claims registered."""
    study = Study(
        name="effects",
        rows=tuple(Row(n, "revisiting", space={"optim.lr": Float(1e-4, 1e-2)}) for n in "ab"),
        data={"data.name": "npz", "data.path": "x.npz"},
        looks=(len(a),),
        claims=claims,
    )
    os.makedirs(d)
    with open(os.path.join(d, "study.json"), "w") as f:
        json.dump(spec.describe(study, {n: {"cohort.size": 1} for n in "ab"}), f)
    ledger.freeze(d, spec.registration(study))
    for s in range(len(a)):
        rec.write_once(rec.seed_record_path(d, "a", s), _record("a", s, a[s], 0.0))
        rec.write_once(rec.seed_record_path(d, "b", s), _record("b", s, b[s], 0.0))


def test_a_claim_is_smaller_than_reported_only_below_every_effect_under_holm(tmp_path):
    """Each claim is read against the smallest effect its paper prints; the readings are
    corrected together (Holm's step-down on the one-sided t-tests below those effects, at
    half the looks' error): computed here with scipy, and a claim with one effect inside its
    interval is never "smaller than reported"."""
    from jdml.statistics import holm
    from jdml.study import Effect
    from jdml.study.report import part, report

    d = str(tmp_path / "study")
    a, b = [0.620, 0.623, 0.618, 0.621], [0.600, 0.601, 0.600, 0.599]
    claims = (
        Claim("far below", "a", "b", effects=(Effect(6.0, "T1, X"), Effect(5.0, "T2, Y"))),
        Claim("one inside", "a", "b", effects=(Effect(5.0, "T1, X"), Effect(2.1, "T3, Z"))),
        Claim("near", "a", "b", effect=2.6, source="T4"),
    )
    _two_rows(d, claims, a, b)
    diffs = 100 * (np.array(a) - np.array(b))
    _, low, high = _interval(diffs, 0.95)
    assert low < 2.1 < high  # the second claim's smallest effect lies inside the interval
    p = [stats.ttest_1samp(diffs, e, alternative="less").pvalue for e in (5.0, 2.1, 2.6)]
    want = ["smaller than reported" if f else "not below it" for f in holm(p, 0.025)]
    data = report(d)["data"]
    got = {c["text"]: c for c in data["claims"]}
    assert [got[c.text]["against_paper_holm"] for c in claims] == want
    assert want[0] == "smaller than reported" and want[1] == "not below it"
    assert got["far below"]["effect"] == 5.0 and got["far below"]["source"] == "T2, Y"
    for c in data["claims"]:  # the rule, whatever the numbers
        if c["against_paper_holm"] == "smaller than reported":
            assert all(e["value"] > 100 * c["high"] for e in c["effects"]), c["text"]
    table = part(d, "claims")
    assert "| against the paper's effect (Holm across 3) |" in table.splitlines()[0]
    assert "+5.00 (T2, Y; smallest of 2)" in table


def test_no_emoji_claim_is_smaller_than_an_effect_inside_its_interval():
    """Over every committed emoji study folder: a claim read "smaller than reported" has every
    effect its paper prints above its interval; an interim reading has no such verdict."""
    from jdml.study.report import claim_entries, load

    for folder in sorted(glob.glob(os.path.join(ROOT, "experiments", "results", "emoji*"))):
        study = load(folder)
        entries = claim_entries(study, rec.seed_records(folder), folder, baselines.read(folder))
        for c in entries:
            if "mean" not in c:
                continue
            if c["look"] == 0:
                assert c["against_paper"] in ("- (interim)", "-") and "against_paper_holm" not in c
            verdicts = {c["against_paper"], c.get("against_paper_holm")}
            if "smaller than reported" in verdicts:
                assert all(e["value"] > 100 * c["high"] for e in c["effects"]), (folder, c["text"])
