"""``jdml.study`` without training: the study file's checks, the Holm-aware stopping rule, the
ledger's pre-registration and amendments, records written once, and the report's numbers on
hand-made records against a computation written out here."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import numpy as np
import pytest
from scipy import stats

from jdml.errors import ConfigError
from jdml.statistics import pocock_level
from jdml.study import Choice, Claim, Float, Folds, Row, Study, ledger, spec
from jdml.study import claims as cl
from jdml.study import records as rec

DATA = {"data.name": "npz", "data.path": "x.npz"}


def _study(**changes) -> Study:
    base = dict(
        name="s",
        rows=(
            Row("a", "revisiting", space={"optim.lr": Float(1e-4, 1e-2, log=True)}),
            Row("b", "revisiting", space={"optim.lr": Choice((1e-3, 2e-3))}),
        ),
        data=DATA,
        claims=(Claim("a beats b", "a", "b"),),
    )
    return Study(**{**base, **changes})


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"rows": ()}, "has no rows"),
        ({"rows": (Row("a b", "revisiting", space={"x": Choice((1,))}),)}, "letters, digits"),
        ({"rows": (Row("a", "r", space={"x": Choice((1,))}),) * 2}, "declared twice"),
        ({"data": {"model.embed_dim": 3}}, r"data\.\* keys only"),
        ({"budget": 0}, "at least 1"),
        ({"rows": (Row("a", "revisiting"), Row("b", "revisiting"))}, "has no search space"),
        ({"looks": (5, 3)}, "increasing"),
        ({"looks": (1,)}, "at least 2"),
        ({"alpha": 0.7}, "alpha"),
        ({"sampler": "cmaes"}, "choose one of: random, tpe, grid"),
        ({"metric": "f1"}, "not among metrics"),
        ({"selection": Folds(1)}, "at least 2 folds"),
        ({"claims": (Claim("x", "a", "c"),)}, "names row 'c'"),
        ({"claims": (Claim("x", "a", "a"),)}, "with itself"),
        ({"claims": (Claim("x", "a", "b"), Claim("x", "b", "a"))}, "declared twice"),
        ({"claims": (Claim("x", "a", "b", effect=math.nan),)}, "finite"),
        ({"claims": (Claim("x", "a", "", fixed="noise"),)}, "choose one of: pixels, features"),
        ({"claims": (Claim("x", "a", "b", fixed="pixels"),)}, "give base=''"),
    ],
)
def test_a_study_that_cannot_run_is_refused_with_its_fix(changes, match):
    with pytest.raises(ConfigError, match=match):
        spec.check(_study(**changes))


@pytest.mark.parametrize(
    "dim, match",
    [(Float(1.0, 1.0), "low < high"), (Float(0.0, 1.0, log=True), "low > 0"),
     (Choice(()), "no values"), ((1, 2), "give Float")],
)  # fmt: skip
def test_a_bad_dimension_is_refused(dim, match):
    rows = (Row("a", "revisiting", space={"optim.lr": dim}), Row("b", "r", space={"x": Int1}))
    with pytest.raises(ConfigError, match=match):
        spec.check(_study(rows=rows, claims=()))


Int1 = Choice((1,))


def test_a_study_file_that_is_missing_or_wrong_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        spec.load(str(tmp_path / "none.py"))
    bad = tmp_path / "bad.py"
    bad.write_text("def get_study(:\n")
    with pytest.raises(ConfigError, match="does not parse: line 1"):
        spec.load(str(bad))
    other = tmp_path / "other.py"
    other.write_text("def get_study():\n    return {'rows': ()}\n")
    with pytest.raises(ConfigError, match=r"returned a dict, not a jdml\.study\.Study"):
        spec.load(str(other))


def test_the_first_candidate_is_the_rows_own_values():
    study = _study(
        rows=(
            Row(
                "a",
                "revisiting",
                space={"optim.lr": Choice((5e-4, 1e-3)), "model.embed_dim": Choice((64, 128))},
            ),
            Row("b", "revisiting", space={"optim.lr": Float(1e-2, 1e-1)}),
        )
    )
    from configs.revisiting import get_config

    preset = get_config()
    first = spec.first_candidate(study, study.rows[0])
    assert first["optim.lr"] == (preset.optim.lr if preset.optim.lr in (5e-4, 1e-3) else 5e-4)
    assert first["model.embed_dim"] == (
        preset.model.embed_dim if preset.model.embed_dim in (64, 128) else 64
    )
    assert spec.first_candidate(study, study.rows[1]) == {"optim.lr": 1e-2}  # clipped into range


# -- the stopping rule ---------------------------------------------------------------------------


def _values_with_p(p: float, n: int, level: float) -> tuple[dict, dict]:
    """Two rows whose n paired differences have the two-sided t-test p-value ``p``."""
    z = np.linspace(-1.0, 1.0, n)
    z = z / z.std(ddof=1)  # sample std 1
    t = stats.t.isf(p / 2, n - 1)
    d = t / math.sqrt(n) + z
    return {s: 0.5 + 0.01 * d[s] for s in range(n)}, {s: 0.5 for s in range(n)}


def test_a_claim_clearing_its_own_interval_but_not_holms_goes_on():
    looks = (5, 10)
    level = pocock_level(2)
    alpha = 1 - level  # 0.0294 at each look
    readings = {}
    for name, p in (("A", 0.02), ("B", 0.5), ("C", 0.6)):
        a, b = _values_with_p(p, 5, level)
        readings[name] = cl.read(a, b, looks, level, None)
    assert readings["A"].difference.p_value() == pytest.approx(0.02, rel=1e-6)
    assert readings["A"].difference.verdict() == "reproduces"  # 0.02 < 0.0294
    corrected = cl.holm_verdicts(readings, {"A", "B", "C"}, level)
    assert alpha / 3 < 0.02 and corrected["A"] == "not resolved"  # Holm's first bound: alpha / 3
    stop, go_on = cl.decide(readings, {"A", "B", "C"}, {}, 1, looks, level)
    assert stop == [] and go_on == ["A", "B", "C"]
    # Alone in its family (or outside it), the same claim stops at look 1.
    assert cl.decide({"A": readings["A"]}, {"A"}, {}, 1, looks, level) == (["A"], [])
    assert cl.decide(readings, {"B", "C"}, {}, 1, looks, level) == (["A"], ["B", "C"])
    # With B settled far beyond Holm's bound, A's bound loosens to alpha / 2 (still > 0.02?
    # no: 0.0147 < 0.02), so it goes on; at the last look everything stops.
    a, b = _values_with_p(1e-6, 5, level)
    readings["B"] = cl.read(a, b, looks, level, None)
    stop, go_on = cl.decide(readings, {"A", "B", "C"}, {}, 1, looks, level)
    assert stop == ["B"] and go_on == ["A", "C"]
    stop, go_on = cl.decide(readings, {"A", "B", "C"}, {"B": 1}, 2, looks, level)
    assert stop == ["A", "C"] and go_on == []


def test_holm_within_each_paper_is_the_family_of_record_when_declared():
    """``family_by="paper"``: Holm's correction runs within each paper's claims (A alone in
    its paper clears its own bound, alpha), where across the whole family its bound is
    alpha / 3; the stopping rule reads the family of record, and the registration says it."""
    looks, level = (5, 10), pocock_level(2)
    readings = {}
    for name, p in (("A", 0.02), ("B", 0.5), ("C", 0.6)):
        readings[name] = cl.read(*_values_with_p(p, 5, level), looks, level, None)
    papers = {"A": "X", "B": "Y", "C": "Y"}
    assert cl.holm_verdicts(readings, {"A", "B", "C"}, level)["A"] == "not resolved"
    assert cl.holm_verdicts(readings, {"A", "B", "C"}, level, papers)["A"] == "reproduces"
    assert cl.decide(readings, {"A", "B", "C"}, {}, 1, looks, level, papers) == (["A"], ["B", "C"])
    assert cl.paper_of("DiVA, Tab. 2") == cl.paper_of("DiVA (control)") == "DiVA"
    study = _study(family_by="paper")
    spec.check(study)
    assert spec.registration(study)["family_by"] == "paper"
    assert "family_by" not in spec.registration(_study())  # the default keeps old digests
    with pytest.raises(ConfigError, match="choose one of: table, paper"):
        spec.check(_study(family_by="claims"))


def test_a_claim_is_read_at_the_look_it_stopped_at():
    looks, level = (3, 6), pocock_level(2)
    a = {s: 0.6 + 0.01 * s for s in range(6)}
    b = {s: 0.5 + 0.02 * (s % 2) for s in range(6)}
    stopped = cl.read(a, b, looks, level, 1)
    going = cl.read(a, b, looks, level, None)
    assert (stopped.look, stopped.difference.n) == (1, 3)
    assert (going.look, going.difference.n) == (2, 6)
    interim = cl.read({0: 0.6, 1: 0.7}, {0: 0.5, 1: 0.5}, looks, level, None)
    assert interim.interim and interim.difference.level == 0.95 and interim.difference.n == 2
    assert interim.where(2) == "95 %, before look 1"
    assert cl.read({}, {0: 1.0}, looks, level, None) is None


# -- ledger and records --------------------------------------------------------------------------


def test_register_freezes_the_claims_now_and_a_later_change_is_an_amendment(tmp_path):
    """``jdml study register``: the registration frozen before any run (no test result yet);
    the same study again changes nothing; a claim's effects declared after a test result are
    an amendment naming the results seen; nothing is trained (no run folder)."""
    from jdml.study import Effect
    from jdml.study.runner import register
    from tests.helpers import make_digits_npz
    from tests.study.digits_study import get_study

    d = str(tmp_path / "study")
    study = get_study(make_digits_npz(str(tmp_path / "digits.npz")))
    first = register(study, d, echo=lambda line: None)
    assert first["event"] == "registered" and "tests_seen" not in first
    assert register(study, d, echo=lambda line: None)["sha256"] == first["sha256"]
    rec.write_once(rec.seed_record_path(d, "margin", 0), {"results": {"test": {}}})
    effects = (Effect(1.0, "a test"), Effect(-0.5, "another"))
    claim = dataclasses.replace(study.claims[0], effect=None, source="", effects=effects)
    changed = dataclasses.replace(study, claims=(claim, *study.claims[1:]))
    event = register(changed, d, echo=lambda line: None)
    assert event["event"] == "amendment" and event["tests_seen"] == 1
    assert event["changed"] == ["claims"] and ledger.frozen(d)["sha256"] == event["sha256"]
    assert not os.path.exists(os.path.join(d, "runs"))
    with open(os.path.join(d, "study.json")) as f:
        assert json.load(f)["registration"]["claims"][0]["effects"][1]["value"] == -0.5


def test_an_amendment_after_test_results_is_recorded_with_the_results_seen(tmp_path):
    d = str(tmp_path)
    first = spec.registration(_study())
    assert ledger.amend_if_changed(d, first, 0) is None  # nothing frozen: no amendment
    ledger.freeze(d, first)
    assert ledger.freeze(d, spec.registration(_study(alpha=0.1)))["registration"] == json.loads(
        json.dumps(first)
    )  # a second freeze keeps the first
    assert ledger.amend_if_changed(d, first, 3) is None
    changed = spec.registration(_study(claims=(Claim("a beats b", "a", "b", effect=2.0),)))
    event = ledger.amend_if_changed(d, changed, 4)
    assert event["changed"] == ["claims"] and event["tests_seen"] == 4
    assert ledger.amend_if_changed(d, changed, 5) is None  # the amendment is now in force
    assert [e["tests_seen"] for e in ledger.amendments(d)] == [4]


def test_a_record_is_written_once(tmp_path):
    path = str(tmp_path / "records" / "a" / "seed0.json")
    assert rec.write_once(path, {"seed": 0})
    assert not rec.write_once(path, {"seed": 99})
    assert rec.read(path) == {"seed": 0}
    assert os.listdir(os.path.dirname(path)) == ["seed0.json"]  # no temporary file left
    with open(path, "w") as f:
        f.write("{cut")
    with pytest.raises(ValueError, match=r"unreadable.*move it away"):
        rec.read(path)


# -- the report on hand-made records -----------------------------------------------------------


def _record(row: str, seed: int, r1: float, hits: np.ndarray | None, classes: np.ndarray):
    from jdml.evaluation import per_query

    record = {
        "row": row,
        "seed": seed,
        "meta": {"epoch": 2},
        "results": {"test": {"recall@1": r1, "map@r": r1 / 2}},
        "val_curve": [{"epoch": 1, "recall@1": 0.5}, {"epoch": 2, "recall@1": 0.6 + seed / 100}],
    }
    if hits is not None:
        record["per_query"] = {"test": per_query.pack(
            {per_query.vector_key("embed", "recall@1"): hits, per_query.classes_key(): classes},
            "embed")}  # fmt: skip
    return record


def test_the_report_equals_a_computation_by_hand(tmp_path):
    from jdml.study.report import report

    d = str(tmp_path / "study")
    study = _study(
        looks=(3,),
        claims=(
            Claim("a beats b", "a", "b", effect=5.0, source="Tab. 1"),
            Claim("b beats a", "b", "a", family=False),
        ),
    )
    configs = {r.name: {"cohort.size": 1} for r in study.rows}
    os.makedirs(d)
    with open(os.path.join(d, "study.json"), "w") as f:
        json.dump(spec.describe(study, configs), f)
    ledger.append(d, {"event": "selected", "row": "a", "trial": 1, "values": {"optim.lr": 2e-3},
                      "score": 0.61, "tried": 4, "failed": 1})  # fmt: skip
    ledger.append(d, {"event": "selected", "row": "b", "trial": 0, "values": {"optim.lr": 1e-3},
                      "score": 0.55, "tried": 4, "failed": 0})  # fmt: skip
    ledger.freeze(d, spec.registration(study))
    rng = np.random.default_rng(0)
    classes = np.repeat(np.arange(5), 4)
    a_r1, b_r1 = [0.62, 0.60, 0.65], [0.55, 0.58, 0.56]
    for s in range(3):
        rec.write_once(
            rec.seed_record_path(d, "a", s),
            _record("a", s, a_r1[s], (rng.random(20) < 0.6).astype(float), classes),
        )
        rec.write_once(
            rec.seed_record_path(d, "b", s),
            _record("b", s, b_r1[s], (rng.random(20) < 0.5).astype(float), classes),
        )
    ledger.amend_if_changed(d, spec.registration(dataclasses.replace(study, alpha=0.1)), 6)
    out = report(d)
    data = out["data"]
    diffs = np.array(a_r1) - np.array(b_r1)
    mean, sd = diffs.mean(), diffs.std(ddof=1)
    half = stats.t.ppf(0.975, 2) * sd / math.sqrt(3)  # one look: 95 %
    claim = data["claims"][0]
    assert claim["mean"] == pytest.approx(mean)
    assert (claim["low"], claim["high"]) == pytest.approx((mean - half, mean + half))
    assert claim["verdict"] == ("reproduces" if mean - half > 0 else "not resolved")
    p = 2 * stats.t.sf(mean / (sd / math.sqrt(3)), 2)
    assert claim["holm"] == ("reproduces" if p <= 0.05 else "not resolved")  # a family of one
    assert claim["against_paper"] == (
        "smaller than reported" if 100 * (mean + half) < 5.0 else "not below it"
    )
    assert claim["bootstrap"] is not None
    assert data["claims"][1]["holm"] is None and data["claims"][1]["mean"] == pytest.approx(-mean)
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["a"]["selected"] == {"optim.lr": 2e-3} and rows["a"]["tried"] == 4
    assert rows["a"]["test"]["recall@1"]["mean"] == pytest.approx(np.mean(a_r1))
    assert rows["a"]["test"]["recall@1"]["std"] == pytest.approx(np.std(a_r1, ddof=1))
    page = out["markdown"]
    assert page.index("## Claims") < page.index("## Rows") < page.index("## Amendments")
    assert "alpha changed after 6 test result(s)" in page
    assert f"{100 * mean:+.2f} [{100 * (mean - half):+.2f}, {100 * (mean + half):+.2f}]" in page
    assert "jdml study report" in page and "jdml study run" in page
    assert {os.path.basename(f) for f in out["files"]} == {
        "report.md", "report.json", "claims.png", "validation_curves.png"}  # fmt: skip
    with open(os.path.join(d, "report", "report.json")) as f:
        assert json.load(f)["claims"][0]["mean"] == pytest.approx(mean)


def test_the_report_of_a_folder_that_is_not_a_study_is_one_line(tmp_path):
    from jdml.errors import ReportError
    from jdml.study.report import report

    with pytest.raises(ReportError, match="not a study folder"):
        report(str(tmp_path))


# -- the selection split ---------------------------------------------------------------------------


def test_class_folds_cover_every_training_class_once():
    from jdml.data.splits import class_folds

    train = np.arange(10, 21)
    folds = class_folds(train, 3, seed=4)
    assert [len(f) for f in folds] == [4, 4, 3]
    assert sorted(np.concatenate(folds).tolist()) == train.tolist()
    assert all(np.all(np.diff(f) > 0) for f in folds)
    assert [f.tolist() for f in class_folds(train, 3, seed=4)] == [f.tolist() for f in folds]


def test_a_fold_is_the_validation_split_and_the_rest_trains():
    from jdml.data.arrays import ImageArrays
    from jdml.data.splits import class_folds, class_halves, split_by_class

    labels = np.repeat(np.arange(16), 3)
    data = ImageArrays(np.zeros((48, 4, 4, 1), np.uint8), labels, tuple(map(str, range(16))))
    train, _ = class_halves(labels)
    for fold, held in enumerate(class_folds(train, 2, seed=0)):
        splits = split_by_class(data, seed=0, folds=2, fold=fold)
        assert sorted(splits["val"].class_names) == sorted(str(c) for c in held)
        assert set(splits["train"].class_names) == {str(c) for c in train} - {str(c) for c in held}


@pytest.mark.parametrize(
    "folds, fold, match",
    [(1, 0, "holds every training class out"), (3, 3, "not one of the 3 folds"),
     (0, 1, "data.val_folds=0")],
)  # fmt: skip
def test_a_fold_that_does_not_exist_is_refused(folds, fold, match):
    from configs.revisiting import get_config
    from jdml.config.validation import validate

    c = get_config()
    c.data.val_folds, c.data.val_fold = folds, fold
    with pytest.raises(ConfigError, match=match):
        validate(c)


def test_too_few_classes_for_the_folds_name_the_fix():
    from jdml.data.splits import class_folds
    from jdml.errors import DataError

    with pytest.raises(DataError, match="at most 2"):
        class_folds(np.arange(5), 3, seed=0)


def test_a_tuning_run_of_a_fold_validates_on_that_fold_and_never_tests():
    from jdml.study.runner import seed_config, tune_config

    study = _study(selection=Folds(3), tune={"train.epochs": 2})
    c = tune_config(study, study.rows[0], {"optim.lr": 1e-3}, fold=2)
    assert (c.data.val_folds, c.data.val_fold, c.train.epochs) == (3, 2, 2)
    assert tuple(c.eval.selected_splits) == () and tuple(c.eval.splits) == ()
    s = seed_config(study, study.rows[0], {"optim.lr": 1e-3}, seed=4)
    assert (s.seed, tuple(s.eval.selected_splits), tuple(s.eval.per_query)) == (
        4,
        ("test", "train"),
        ("recall@1",),
    )  # fmt: skip  (the train spectrum: train_metrics)
    assert s.data.val_folds == 0 and s.optim.lr == 1e-3
    quiet = _study(common={"eval.train_metrics": ()})
    s = seed_config(quiet, quiet.rows[0], {"optim.lr": 1e-3}, seed=4)
    assert tuple(s.eval.selected_splits) == ("test",)


def test_a_grid_smaller_than_the_budget_is_refused():
    rows = (
        Row("a", "revisiting", space={"optim.lr": Choice((1e-3, 2e-3))}),
        Row("b", "revisiting", space={"optim.lr": Float(1e-3, 1e-2)}),
    )
    with pytest.raises(ConfigError, match="fewer than the budget 4"):
        spec.check(_study(rows=rows, sampler="grid"))
    with pytest.raises(ConfigError, match="needs Choice spaces"):
        spec.check(_study(rows=rows, sampler="grid", budget=2))


def test_a_database_url_holds_the_search(tmp_path):
    from jdml.study import search

    url = f"sqlite:///{tmp_path / 'search.db'}"
    space = {"optim.lr": Float(1e-4, 1e-2, log=True), "k": Choice(((1, 2), "x"))}
    s = search.open_row(search.storage(str(tmp_path), url), "a", "tpe", 0, space)
    trial = s.ask()
    values = search.suggest(trial, space)
    search.tell(s, trial.number, 0.5)
    again = search.open_row(search.storage(str(tmp_path), url), "a", "tpe", 0, space)
    assert search.decode_params(space, again.trials[0].params) == values
    assert not os.path.exists(tmp_path / search.JOURNAL)


# -- the runner's phases, with runs that write their records at once ------------------------------


class _Instant:
    """An executor whose runs end at once with a record made from ``score(row, seed, values)``
    (the phases' logic without training)."""

    slots = 2

    def __init__(self, score):
        self.score, self.done, self.started = score, [], []

    def submit(self, task):
        from jdml.study.executor import Done

        with open(task.task_file) as f:
            t = json.load(f)
        self.started.append(task.name)
        value = self.score(t["row"], t["seed"] if t["kind"] == "seed" else None, t["settings"])
        common = {
            "row": t["row"],
            "seed": t["seed"],
            "settings": t["settings"],
            "config_sha256": t["config_sha256"],
            "val_curve": [{"epoch": 1, "recall@1": value}],
        }
        if t["kind"] == "tune":
            record = {**common, "trial": t["trial"], "fold": t["fold"],
                      "best": {"recall@1": value, "epoch": 1}}  # fmt: skip
        else:
            record = {**common, "meta": {"epoch": 1}, "results": {"test": {"recall@1": value}}}
        rec.write_once(t["record"], record)
        self.done.append(Done(task, 0, "ok", 0.0))

    def running(self):
        return len(self.done)

    def wait(self):
        out, self.done = self.done, []
        return out

    def close(self):
        pass


def test_the_looks_train_only_the_rows_of_the_claims_that_go_on(tmp_path):
    from jdml.study.runner import run
    from tests.helpers import make_npz

    npz = make_npz(str(tmp_path / "d.npz"))
    lr = Choice((1e-3, 2e-3))
    study = Study(
        name="looks",
        rows=tuple(Row(n, "revisiting", space={"optim.lr": lr}) for n in ("good", "base", "same")),
        data={"data.name": "npz", "data.path": npz},
        budget=2,
        looks=(3, 6),
        claims=(Claim("good beats base", "good", "base"), Claim("same beats base", "same", "base")),
    )
    noise = [0.004, -0.003, 0.001, 0.002, -0.004, 0.0]

    def score(row, seed, settings):
        if seed is None:  # tuning: the larger rate is better on validation
            return 0.5 + 100 * settings["optim.lr"]
        return {"good": 0.6, "base": 0.5, "same": 0.5}[row] + noise[seed] * (row != "base")

    executor = _Instant(score)
    out = run(study, str(tmp_path / "s"), executor, echo=lambda _: None)
    assert out["selected"] == {r: {"optim.lr": 2e-3} for r in ("good", "base", "same")}
    assert out["seeds"] == {"good": [0, 1, 2], "base": list(range(6)), "same": list(range(6))}
    looks = ledger.look_decisions(str(tmp_path / "s"))
    assert looks[1]["stop"] == ["good beats base"] and looks[1]["go_on"] == ["same beats base"]
    assert looks[2]["stop"] == ["same beats base"] and looks[2]["go_on"] == []
    tunes = [n for n in executor.started if n.startswith("tune")]
    assert len(tunes) == 6  # 2 candidates x 3 rows: the same budget
    # Run again: everything is recorded, nothing starts, the ledger gains nothing.
    before = ledger.events(str(tmp_path / "s"))
    again = _Instant(score)
    run(study, str(tmp_path / "s"), again, echo=lambda _: None)
    assert again.started == [] and ledger.events(str(tmp_path / "s")) == before
    # A changed claim after the test results is an amendment, counted.
    changed = dataclasses.replace(study, claims=(*study.claims, Claim("x", "good", "same")))
    run(changed, str(tmp_path / "s"), _Instant(score), echo=lambda _: None)
    [amendment] = ledger.amendments(str(tmp_path / "s"))
    assert amendment["changed"] == ["claims"] and amendment["tests_seen"] == 15
    # A row whose config changed under its records is refused, and nothing is replaced.
    from jdml.study.runner import StudyError

    rows = (dataclasses.replace(study.rows[0], overrides={"model.embed_dim": 8}), *study.rows[1:])
    with pytest.raises(StudyError, match="'good''s config has changed since"):
        run(dataclasses.replace(changed, rows=rows), str(tmp_path / "s"), _Instant(score),
            echo=lambda _: None)  # fmt: skip
    assert rec.read(rec.seed_record_path(str(tmp_path / "s"), "good", 0))["results"]["test"][
        "recall@1"] == pytest.approx(0.604)  # fmt: skip


def test_a_candidates_score_is_its_mean_over_the_folds(tmp_path):
    from jdml.study.runner import candidate_score

    d = str(tmp_path)
    for fold, value in enumerate((0.5, 0.7, 0.9)):
        rec.write_once(
            rec.tune_record_path(d, "a", 4, fold), {"best": {"recall@1": value, "epoch": 2}}
        )
    assert candidate_score(d, "a", 4, 3) == pytest.approx(0.7)
    assert candidate_score(d, "a", 5, 3) is None


def test_a_diverged_candidate_is_spent_and_a_crashed_one_runs_again(tmp_path):
    from jdml.study.executor import Done
    from jdml.study.runner import StudyError, run
    from tests.helpers import make_npz

    npz = make_npz(str(tmp_path / "d.npz"))
    lr = Choice((1e-3, 2e-3))
    study = Study(
        name="failures",
        rows=(
            Row("a", "revisiting", space={"optim.lr": lr}),
            Row("b", "revisiting", space={"optim.lr": lr}),
        ),
        data={"data.name": "npz", "data.path": npz},
        budget=2,
        looks=(2,),
    )

    def score(row, seed, settings):  # row a diverges at the larger rate
        return math.nan if row == "a" and settings.get("optim.lr") == 2e-3 else 0.5

    class Crashing(_Instant):
        """Row b's second candidate crashes once (no record, a non-zero exit)."""

        crashed = False

        def submit(self, task):
            if task.name == "tune b trial1" and not Crashing.crashed:
                Crashing.crashed = True
                self.started.append(task.name)
                self.done.append(Done(task, 1, "error: killed", 0.0))
                return
            super().submit(task)

    d = str(tmp_path / "s")
    with pytest.raises(StudyError, match="1 tuning run\\(s\\) failed \\(tune b trial1\\)"):
        run(study, d, Crashing(score), echo=lambda _: None)
    assert set(selections_of(d)) == {"a"}  # b waits for its crashed candidate
    assert selections_of(d)["a"]["failed"] == 1 and selections_of(d)["a"]["values"] == {
        "optim.lr": 1e-3}  # fmt: skip
    again = Crashing(score)
    run(study, d, again, echo=lambda _: None)
    assert again.started[0] == "tune b trial1"  # the same candidate, its values kept
    assert selections_of(d)["b"]["tried"] == 2 and selections_of(d)["b"]["failed"] == 0


def selections_of(directory: str) -> dict:
    from jdml.study.runner import selections

    return selections(directory)


def _converted_history(tmp_path, third: bool = False):
    """A folder as records made before the study design leave it: both rows trained at the
    method's values (the baseline's shared, never searched), seeds 0-2, look 1 decided by each
    claim's own verdict. Returns the study, the folder, those values and the runs' scores.
    ``third``: a third row like the baseline, with a claim of its own."""
    from tests.helpers import make_npz

    npz = make_npz(str(tmp_path / "d.npz"))
    lr = Choice((2e-3, 1e-3))
    study = Study(
        name="history",
        rows=(
            Row("method", "revisiting", space={"optim.lr": lr}),
            Row("base", "revisiting", space={"optim.lr": lr}),
            *([Row("third", "revisiting", space={"optim.lr": lr})] if third else []),
        ),
        data={"data.name": "npz", "data.path": npz},
        budget=2,
        sampler="grid",
        looks=(3, 6),
        claims=(
            Claim("method beats base", "method", "base"),
            *([Claim("method beats third", "method", "third")] if third else []),
        ),
    )
    d = str(tmp_path / "s")
    old = {"optim.lr": 2e-3}
    ledger.append(d, {"event": "selected", "row": "method", "trial": 0, "values": old,
                      "score": 0.9, "tried": 2, "failed": 0})  # fmt: skip
    shared = {"score": None, "tried": 0, "failed": 0, "shared_from": ["method"]}
    for row in ("base", "third")[: 1 + third]:
        ledger.append(d, {"event": "selected", "row": row, "trial": None, "values": old, **shared})
    for row, value in (("method", 0.62), ("base", 0.50), ("third", 0.55))[: 2 + third]:
        for s in range(3):
            rec.write_once(rec.seed_record_path(d, row, s), {
                "row": row, "seed": s, "settings": old, "meta": {"epoch": 1},
                "results": {"test": {"recall@1": value + 0.01 * (s == 1)}},
                "val_curve": [{"epoch": 1, "recall@1": 0.5}]})  # fmt: skip
    ledger.freeze(d, spec.registration(study), tests_seen=6)
    stop = ["method beats base", "method beats third"][: 1 + third]
    ledger.append(d, {"event": "look", "look": 1, "stop": stop, "go_on": [],
                      "rule": "own verdict"})  # fmt: skip
    noise = [0.002, -0.003, 0.004, 0.0, -0.001, 0.003]

    def score(row, seed, settings):
        if seed is None:  # tuning: the smaller rate is better for the baseline
            return 0.5 + (0.1 if settings["optim.lr"] == 1e-3 else 0.0)
        return {"method": 0.62, "base": 0.61}[row] + noise[seed] * (row == "base")

    return study, d, old, score


def test_a_row_never_searched_is_searched_and_its_older_seeds_train_again(tmp_path):
    """Records made before the study design (a baseline trained at values selected for
    another row, the looks decided by each claim's own interval): the next run searches that
    row with the budget; where its selection differs from what its records were trained with,
    they move to ``superseded/`` (kept, not replaced) and its seeds train again; the looks are
    decided again under Holm's rule. The searched row is neither searched nor trained again."""
    from jdml.study.runner import run, selections

    study, d, old, score = _converted_history(tmp_path)
    executor = _Instant(score)
    run(study, d, executor, echo=lambda _: None)
    tunes = [n for n in executor.started if n.startswith("tune")]
    assert tunes == ["tune base trial0", "tune base trial1"]  # the method kept its search
    assert selections(d)["base"]["values"] == {"optim.lr": 1e-3}
    [moved] = [e for e in ledger.events(d) if e["event"] == "superseded"]
    assert moved["row"] == "base" and moved["seeds"] == [0, 1, 2] and moved["values"] == old
    for s in range(3):  # kept as they were, and retrained with the selection
        kept = rec.read(os.path.join(d, "superseded", "records", "base", f"seed{s}.json"))
        assert kept["settings"] == old and kept["results"]["test"]["recall@1"] >= 0.5
        assert rec.read(rec.seed_record_path(d, "base", s))["settings"] == {"optim.lr": 1e-3}
    assert not any(n.startswith("method seed") and int(n[-1]) < 3 for n in executor.started)
    looks = [e for e in ledger.events(d) if e["event"] == "look"]
    assert looks[-2]["look"] == 1 and "rule" not in looks[-2]  # decided again, by Holm's rule
    assert looks[-2]["go_on"] == ["method beats base"]  # close now: seeds 3-5 for both rows
    assert sorted(rec.seed_records(d)["method"]) == list(range(6))

    # The report: the claim before (the first records at the first rule's look) and after,
    # and what each row's tuning cost.
    from jdml.study.provenance import first_reading
    from jdml.study.report import part

    by_row, stopped = first_reading(d, [3, 6])
    assert stopped == {"method beats base": 1} and sorted(by_row["base"]) == [0, 1, 2]
    assert all(r["settings"] == old for r in by_row["base"].values())  # the superseded ones
    before = part(d, "claims-before")
    after = part(d, "claims")
    line = next(x for x in before.splitlines() if "| method beats base |" in x)
    cells = [c.strip() for c in line.split("|")]
    assert cells[4] == "3" and cells[5].startswith("+12.00 [+12.00, +12.00]")  # 0.62 - 0.50
    assert "look 1 of 2" in cells[6]
    line = next(x for x in after.splitlines() if "| method beats base |" in x)
    assert [c.strip() for c in line.split("|")][4] == "6"  # decided again, at look 2
    rows = {x.split("|")[1].strip(): [c.strip() for c in x.split("|")[2:-1]]
            for x in part(d, "selection").splitlines() if x.startswith("| m") or
            x.startswith("| b")}  # fmt: skip
    assert rows["base"] == ["2 searched (0 diverged)", "optim.lr=0.001 (60.00)",
                            "optim.lr=0.002", "0, 1, 2", "2", "6", "11"]  # fmt: skip
    assert rows["method"][1:] == ["optim.lr=0.002 (90.00)", "the selection", "-", "0", "6", "6"]
    assert "In all 17 runs: 2 tuning runs (validation only), 12 seed runs recorded now, and 3 " \
        "superseded" in part(d, "selection")  # fmt: skip
    # Every test result the run recorded has its event after the registration, with the hash.
    tested = [e for e in ledger.events(d) if e["event"] == "tested"]
    assert sorted((e["row"], e["seed"]) for e in tested) == sorted(
        [("base", s) for s in range(6)] + [("method", s) for s in range(3, 6)])  # fmt: skip
    for e in tested:
        with open(rec.seed_record_path(d, e["row"], e["seed"]), "rb") as f:
            assert e["record_sha256"] == hashlib.sha256(f.read()).hexdigest()
    said = part(d, "registration")
    assert "after 6 test result(s) had been recorded" in said
    assert f"Test results the ledger records after it: 9, the first at {tested[0]['time']}." in said


def test_seeds_trained_under_old_key_names_or_unknown_values_train_again():
    """The seeds a selection supersedes, over explicit records: settings recorded under a key's
    old name (DM2's ``cohort.*`` before ``exchange.dm2.*``, as the converted emoji records
    have them) are read under the new one, so a changed selection retrains them; a record that
    does not name every searched key trains again; a record with the selection's values, or
    with values no selection ever had (a hand-set run the row's digest check guards), stays."""
    from jdml.study.records import stale_seeds, trained_values

    space = {"exchange.dm2.mutual_weight": Choice((5.0, 20.0)),
             "exchange.dm2.temporal_rate": Choice((0.5, 0.8))}  # fmt: skip
    row = Row("dm2-3-md", "dm2", space=space)
    old = {"exchange.dm2.mutual_weight": 5.0, "exchange.dm2.temporal_rate": 0.8}
    records = {
        0: {
            "settings": {"optim.lr": 2e-4, "cohort.mutual_weight": 5.0, "cohort.temporal_rate": 0.8}
        },
        1: {"settings": {"exchange.dm2.mutual_weight": 5.0, "exchange.dm2.temporal_rate": 0.8}},
        2: {"settings": {"cohort.mutual_weight": 5.0}},  # the rate not recorded
        3: {"settings": {"exchange.dm2.mutual_weight": 5.0, "exchange.dm2.temporal_rate": 0.5}},
        4: {"settings": {"exchange.dm2.mutual_weight": 9.0, "exchange.dm2.temporal_rate": 0.8}},
    }
    trained = {s: trained_values(r, row.space) for s, r in records.items()}
    assert trained[0] == old and trained[1] == old
    assert trained[2] == {"exchange.dm2.mutual_weight": 5.0}
    now = {"exchange.dm2.mutual_weight": 5.0, "exchange.dm2.temporal_rate": 0.5}
    assert stale_seeds(trained, row.space, now, [old]) == [0, 1, 2]
    assert stale_seeds(trained, row.space, old, []) == [2]  # the selection kept: only the unknown
    assert stale_seeds(trained, row.space, now, []) == [2]  # no earlier selection to have trained


def test_holm_waits_for_every_claim_of_the_family(tmp_path):
    """While a row's seeds train again, its claims have no reading: the claims table gives no
    Holm verdict (over part of the family it would be looser) and says what it waits for."""
    from jdml.study.executor import Done
    from jdml.study.report import part
    from jdml.study.runner import StudyError, run

    study, d, _, score = _converted_history(tmp_path, third=True)

    def tuned(row, seed, settings):  # the third row keeps its values; the baseline's change
        if seed is None and row == "third":
            return 0.5 + (0.1 if settings["optim.lr"] == 2e-3 else 0.0)
        return score(row, seed, settings) if row != "third" else 0.55

    class BaseCrashes(_Instant):
        def submit(self, task):
            if task.name.startswith("base seed"):
                self.done.append(Done(task, 1, "error: killed", 0.0))
                return
            super().submit(task)

    with pytest.raises(StudyError, match="look 1 is incomplete"):
        run(study, d, BaseCrashes(tuned), echo=lambda _: None)
    assert sorted(rec.superseded_records(d)) == ["base"] and "base" not in rec.seed_records(d)
    text = part(d, "claims")
    line = next(x for x in text.splitlines() if "| method beats third |" in x)
    assert "- (waiting for 1 claim(s))" in line and "**reproduces**" in line
    assert "Holm's correction waits until every claim of the family is read at a look (1 not " \
        "yet)" in text  # fmt: skip
    line = next(x for x in text.splitlines() if "| method beats base |" in x)
    assert "no seeds yet" in line
    assert part(d, "readings").startswith(
        "Interim: 1 claim(s) have no seeds yet and Holm's correction waits for 1 claim(s)"
    )


def test_a_test_result_the_ledger_missed_is_logged_once_when_found(tmp_path):
    """A seed record this tool made (it has a config digest) whose ``tested`` event a killed
    driver never wrote gets one, flagged late, when the study runs again, and only once; a
    record made before the tool (no digest) gets none."""
    from jdml.study.runner import _log_untold_tests

    d = str(tmp_path / "s")
    rec.write_once(rec.seed_record_path(d, "a", 0), {"row": "a", "seed": 0, "config_sha256": "x"})
    rec.write_once(rec.seed_record_path(d, "a", 1), {"row": "a", "seed": 1})
    _log_untold_tests(d)
    _log_untold_tests(d)
    [event] = [e for e in ledger.events(d) if e["event"] == "tested"]
    assert (event["row"], event["seed"]) == ("a", 0) and event["logged_late"]
    with open(rec.seed_record_path(d, "a", 0), "rb") as f:
        assert event["record_sha256"] == hashlib.sha256(f.read()).hexdigest()
