"""The run report: grouping by config, best-checkpoint and max-over-epochs values, rho at the best
epoch, mean and std over seeds, CSV, plots, and the ``jdml report`` command's errors."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from jdml.__main__ import main as jdml_main
from jdml.config import base_config, to_json
from jdml.errors import ReportError
from jdml.report import find_runs, group_runs, load_run, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(workdir, *, seed, sampler, evals, val=None, spectra=None):
    """A run directory as training writes it: config.json and metrics.jsonl.

    Args:
      evals: {step: (test recall@1, test map@r, train rho)}; epoch = step / 10.
      val: {step: val recall@1} (a validation split) or None.
      spectra: {step: spectrum} train spectra.
    """
    os.makedirs(workdir)
    c = base_config()
    c.seed = seed
    c.sampler.name = sampler
    c.data.val_fraction = 0.2 if val else 0.0
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(to_json(c))
    lines = [{"kind": "train", "step": 5, "epoch": 0.5, "loss": 0.3}]
    for step, (recall, mapr, rho) in evals.items():
        epoch = step // 10
        lines.append(
            {"kind": "eval", "split": "test", "step": step, "epoch": epoch}
            | {"recall@1": recall, "map@r": mapr}
        )
        lines.append(
            {"kind": "eval", "split": "train", "step": step, "epoch": epoch, "rho_spectrum@1": rho}
        )
        if val:
            lines.append(
                {
                    "kind": "eval",
                    "split": "val",
                    "step": step,
                    "epoch": epoch,
                    "recall@1": val[step],
                }
            )
        if spectra and step in spectra:
            lines.append(
                {"kind": "spectrum", "split": "train", "step": step, "epoch": epoch}
                | {"spectrum": list(spectra[step])}
            )
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines)
        f.write('{"kind": "eval", "split": "te')  # a line cut short by a kill is ignored


# Two experiments x three seeds; each run: {step: (recall@1, map@r, rho)}.
EVALS = {
    ("class_random", 0): {0: (0.1, 0.01, 0.9), 10: (0.5, 0.2, 0.5), 20: (0.7, 0.3, 0.4)},
    ("class_random", 1): {0: (0.1, 0.01, 0.9), 10: (0.6, 0.25, 0.45), 20: (0.55, 0.35, 0.3)},
    ("class_random", 2): {0: (0.1, 0.01, 0.9), 10: (0.4, 0.1, 0.6), 20: (0.65, 0.28, 0.35)},
    ("greedy_coreset", 0): {0: (0.1, 0.01, 0.9), 10: (0.8, 0.4, 0.2), 20: (0.8, 0.45, 0.25)},
    ("greedy_coreset", 1): {0: (0.1, 0.01, 0.9), 10: (0.75, 0.4, 0.3), 20: (0.85, 0.42, 0.2)},
    ("greedy_coreset", 2): {0: (0.1, 0.01, 0.9), 10: (0.9, 0.5, 0.1), 20: (0.7, 0.55, 0.15)},
}
# Validation Recall@1 of the coreset runs: selects step 20, 10, 20 (the test maxima differ).
VAL = {0: {0: 0.0, 10: 0.3, 20: 0.5}, 1: {0: 0.0, 10: 0.6, 20: 0.4}, 2: {0: 0.0, 10: 0.1, 20: 0.2}}


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(0)
    for (sampler, seed), evals in EVALS.items():
        spectra = {step: np.sort(rng.random(8))[::-1] for step in evals}
        spectra = {step: s / s.sum() for step, s in spectra.items()}
        _write_run(
            str(root / sampler / f"seed{seed}"),
            seed=seed,
            sampler=sampler,
            evals=evals,
            val=VAL[seed] if sampler == "greedy_coreset" else None,
            spectra=spectra,
        )
    return str(root)


def _expected(sampler, metric_index, protocol):
    values = []
    for seed in range(3):
        evals = {s: v for s, v in EVALS[(sampler, seed)].items() if s > 0}
        if protocol == "max":
            values.append(max(v[metric_index] for v in evals.values()))
            continue
        if sampler == "greedy_coreset":  # selected on validation Recall@1
            score = {s: VAL[seed][s] for s in evals}
        else:  # selected on test Recall@1, ties to the earliest step
            score = {s: v[0] for s, v in evals.items()}
        best = max(evals, key=lambda s: (score[s], -s))
        values.append(evals[best][metric_index])
    return np.array(values)


def test_runs_are_found_and_grouped_by_config(runs_root):
    workdirs = find_runs([runs_root])
    assert len(workdirs) == 6
    groups = group_runs([load_run(w) for w in workdirs])
    # The experiments differ in the sampler (and data.val_fraction); seeds are merged.
    assert sorted(groups) == [
        "data.val_fraction=0.0, sampler.name=class_random",
        "data.val_fraction=0.2, sampler.name=greedy_coreset",
    ]
    assert all([r.seed for r in g] == [0, 1, 2] for g in groups.values())
    assert sorted(group_runs([load_run(w) for w in workdirs], "dir")) == [
        "class_random",
        "greedy_coreset",
    ]


def test_selection_uses_validation_when_present(runs_root):
    run = load_run(os.path.join(runs_root, "greedy_coreset", "seed1"))
    assert run.selection_split == "val" and run.best_step() == 10
    run = load_run(os.path.join(runs_root, "class_random", "seed1"))
    assert run.selection_split == "test" and run.best_step() == 10


def test_csv_values_match_numpy(runs_root, tmp_path):
    out = report([runs_root], str(tmp_path), group_by="dir")
    with open(out["files"][1]) as f:
        rows = {(r["experiment"], r["protocol"], r["metric"]): r for r in csv.DictReader(f)}
    for sampler in ("class_random", "greedy_coreset"):
        for protocol in ("best", "max"):
            for index, metric in ((0, "recall@1"), (1, "map@r")):
                xs = _expected(sampler, index, protocol)
                row = rows[(sampler, protocol, metric)]
                assert float(row["mean"]) == pytest.approx(xs.mean(), rel=1e-5)
                assert float(row["std"]) == pytest.approx(xs.std(ddof=1), rel=1e-5)
                assert int(row["n"]) == 3
        rho = _expected(sampler, 2, "best")
        row = rows[(sampler, "rho", "rho_spectrum@1")]
        assert row["split"] == "train"
        assert float(row["mean"]) == pytest.approx(rho.mean(), rel=1e-5)
        assert [float(x) for x in row["seeds"].split(";")] == pytest.approx(list(rho))


def test_markdown_tables_and_plots(runs_root, tmp_path):
    out = report([runs_root], str(tmp_path), group_by="dir")
    text = out["markdown"]
    xs = 100 * _expected("greedy_coreset", 0, "best")
    assert f"| greedy_coreset | 3 | val | {xs.mean():.2f} ± {xs.std(ddof=1):.2f} |" in text
    xs = 100 * _expected("class_random", 0, "max")
    assert f"| class_random | 3 | test | {xs.mean():.2f} ± {xs.std(ddof=1):.2f} |" in text
    rho = _expected("class_random", 2, "best")
    assert f"{rho.mean():.4f} ± {rho.std(ddof=1):.4f} |" in text
    pngs = [f for f in out["files"] if f.endswith(".png")]
    assert [os.path.basename(f) for f in pngs] == ["recall_at_1_over_epochs.png", "spectrum.png"]
    for path in pngs:
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC
    with open(os.path.join(str(tmp_path), "report.md")) as f:
        assert f.read() == text


def test_one_seed_and_missing_training_evaluations(tmp_path):
    _write_run(
        str(tmp_path / "a" / "seed0"),
        seed=0,
        sampler="class_random",
        evals=EVALS[("class_random", 0)],
    )
    _write_run(
        str(tmp_path / "b" / "seed0"), seed=0, sampler="full_random", evals={0: (0.1, 0.0, 1.0)}
    )
    out = report([str(tmp_path)], str(tmp_path / "r"), metrics=["recall@1"])
    assert list(out["experiments"]) == ["a"]  # the run without a trained evaluation is left out
    assert "| a | 1 | test | 70.00 |" in out["markdown"]  # one seed: no std
    assert not any(f.endswith("spectrum.png") for f in out["files"])  # no spectra recorded


def test_errors_name_the_problem(tmp_path, capsys):
    with pytest.raises(ReportError, match="no run directories"):
        report([str(tmp_path)])
    with pytest.raises(ReportError, match="not a directory"):
        report([str(tmp_path / "missing")])
    _write_run(
        str(tmp_path / "x" / "seed0"),
        seed=0,
        sampler="class_random",
        evals=EVALS[("class_random", 0)],
    )
    with pytest.raises(ReportError, match=r"\['nmi'\] were not evaluated"):
        report([str(tmp_path)], metrics=["nmi"])
    with pytest.raises(SystemExit) as e:  # refused before anything is written
        jdml_main(["report", str(tmp_path), "--curve-metric", "nmii"])
    assert e.value.code == 2 and not (tmp_path / "report").exists()
    err = capsys.readouterr().err
    assert "error: --curve-metric 'nmii' was not evaluated on 'test'" in err
    assert "choose one of: recall@1" in err
    with pytest.raises(SystemExit) as e:
        jdml_main(["report", str(tmp_path / "missing")])
    assert e.value.code == 2
    assert "error: " in capsys.readouterr().err


def test_command_writes_the_report(runs_root, tmp_path, capsys):
    jdml_main(["report", runs_root, "--out", str(tmp_path), "--group-by", "dir"])
    printed = capsys.readouterr().out
    assert "class_random: 3 run(s)" in printed and "spectrum.png" in printed
    assert os.path.exists(tmp_path / "report.csv")


def test_paired_differences_against_the_first_experiment(runs_root, tmp_path):
    """greedy_coreset - class_random, seed by seed at the selected checkpoints, with the 95 %
    Student-t interval computed here by hand."""
    text = report([runs_root], str(tmp_path), group_by="dir", metrics=["recall@1"])["markdown"]
    assert "### Paired differences against class_random" in text
    d = 100 * (_expected("greedy_coreset", 0, "best") - _expected("class_random", 0, "best"))
    half = 4.302652729911275 * d.std(ddof=1) / np.sqrt(3)  # t(0.975, 2 degrees of freedom)
    row = (
        f"| greedy_coreset | 3 | {d.mean():+.2f} [{d.mean() - half:+.2f}, {d.mean() + half:+.2f}] |"
    )
    assert row in text
