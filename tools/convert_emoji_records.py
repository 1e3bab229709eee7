"""Converts the emoji protocol's records into study folders (``jdml study report`` reads them).

The records the emoji scripts wrote before the study tool existed
(``experiments/results/emoji-*/<row>[-frozen3]/seed<k>.json``, the tuning runs in
``emoji-v2-tune-20/tune-<method>-<variant>/seed0.json``) are moved, with ``git mv`` inside a
checkout so that their history follows them, to ``records/<row>/seed<k>.json`` and
``records/tune/<row>/trial<n>.json`` of their folder; a tuning record gains the fields the
study's tuning records have (its trial, its best validation epoch, its settings under the keys'
current names). Then ``study.json`` and ``ledger.jsonl`` are written as ``jdml study run``
would have, telling what happened:

* ``selected``: each tuned row's candidate with the best validation Recall@1 (ties: the first
  of its grid) over its 4 candidates; every other row's values are those its records were
  trained with, shared from the search of another row (``shared_from``), or the presets' own
  (format 1, whose records name no settings);
* ``registered``: the study's pre-registration, marked with the number of test results that
  existed when it was made (all of them: the claims were declared along the way, their family
  and effects after the results);
* ``look``: each look's decision as it was taken, by each claim's own verdict (the stopping
  rule then ignored Holm's correction).

The folders and their studies (:data:`FOLDERS`): ``emoji-v2-45`` is ``experiments/emoji_study.py``
with its tuning runs; ``emoji-45``, ``-20`` and ``-60`` are the first build of the set (format 1),
trained with the presets' values, without the equal-dimension controls, and DM2 also with every
stage trained (rows ``dm2-3-*-every-stage``); ``emoji-views-10`` the device views' check.

Then (:func:`split_wider`) the rows no claim reads (the wider Revisiting comparison) move from
``emoji-v2-45`` to ``emoji-wider-45``, the study ``experiments/emoji_study.py:wider``, so that
the claims' study searches and seeds only its own rows; margin's and R-margin's records (the
comparison's references, searched in ``emoji-v2-45``) are copied there, their ledger events
saying so.

    python tools/convert_emoji_records.py [--root experiments/results]

A folder already converted (it has a ``study.json``) is skipped; nothing is overwritten.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jdml.config import flatten_config  # noqa: E402
from jdml.fileio import atomic_write  # noqa: E402
from jdml.keys import RENAMED_KEYS  # noqa: E402
from jdml.study import Study, baselines, ledger, spec  # noqa: E402
from jdml.study import records as rec  # noqa: E402
from jdml.study.claims import claim_readings  # noqa: E402
from jdml.study.runner import seed_config  # noqa: E402

STUDY = os.path.join(ROOT, "experiments", "emoji_study.py")
#: folder -> (the study's variant, :func:`study_of`; the folder of its tuning runs or None).
FOLDERS = {
    "emoji-v2-45": ("", "emoji-v2-tune-20"),
    "emoji-45": ("format1:45", None),
    "emoji-20": ("format1:20", None),
    "emoji-60": ("format1:60", None),
    "emoji-views-10": ("views", None),
}
#: The method each tuning grid belongs to -> the study's row it was searched on, and the grid's
#: candidates in the order they were listed (their trial numbers).
SEARCHES = {
    "margin": ("margin", ["lr0.0001", "lr5e-05", "lr0.0002", "lr0.0004"]),
    "R-margin": ("R-margin", ["p0.2", "p0.05", "p0.1", "p0.35"]),
    "diva": ("diva", ["a0.2-d128", "a0.1-d128", "a0.2-d224", "a0.1-d224"]),
    "sharing": ("sharing-decor", ["w1-g500", "w0.5-g500", "w1-g100", "w0.5-g100"]),
    "dm2": ("dm2-3-md+td+vd", ["l20-r0.5", "l5-r0.5", "l20-r0.8", "l5-r0.8"]),
}
CONTROLS = ("diva-4D", "sharing-class256", "sharing-2class")  # rows format 1 did not have
PIXELS = "raw pixels (64 x 64 x 3, L2-normalised)"
FEATURES = "ImageNet features (pooled 1280-d, L2-normalised)"
INITIAL = "ImageNet features, random 128-d head (the network before fine-tuning)"


def study_of(variant: str) -> Study:
    """The study a folder's records belong to: ``experiments/emoji_study.py`` itself, or
    ``format1:<epochs>`` (its rows but the controls, at the presets' values, and DM2's also
    with every stage trained) or ``views`` (margin with the base augmentation, its views made
    by Pillow or on the device)."""
    study = spec.load(STUDY)
    if variant == "views":
        views = tuple(
            dataclasses.replace(study.row("margin"), name=f"views-{v}",
                                label=f"base augmentation, {label} views",
                                overrides={"data.augment": "base", "data.views": v})
            for v, label in (("host", "Pillow"), ("device", "device"))
        )  # fmt: skip
        return dataclasses.replace(study, name="Views made on the device against Pillow's",
                                   rows=views, claims=(), budget=1, sampler="tpe",
                                   common={**study.common, "train.epochs": 10})  # fmt: skip
    if not variant:
        return study
    wider = spec.load(STUDY, "wider")  # format 1 had every row of both studies
    names = {r.name for r in study.rows}
    study = dataclasses.replace(study, rows=(*study.rows,
                                *(r for r in wider.rows if r.name not in names)))  # fmt: skip
    kept = [dataclasses.replace(r, overrides={k: v for k, v in r.overrides.items()
            if k != "optim.lr"}) for r in study.rows if r.name not in CONTROLS]  # fmt: skip
    every = [dataclasses.replace(r, name=f"{r.name}-every-stage", overrides={
             k: v for k, v in r.overrides.items() if k != "model.frozen_stages"})
             for r in kept if r.name.startswith("dm2-")]  # fmt: skip
    names = {r.name for r in kept}
    return dataclasses.replace(
        study,
        name=f"{study.name}, format 1",
        rows=(*kept, *every),
        claims=tuple(c for c in study.claims if {c.row, c.base} - {""} <= names),
        common={**study.common, "train.epochs": int(variant.split(":")[1])},
        budget=1,
        sampler="tpe",
    )


def source_dir(row: spec.Row) -> str:
    """The folder the emoji scripts kept a row's records in."""
    if row.name.endswith("-every-stage"):
        return row.name.removesuffix("-every-stage")
    return f"{row.name}-frozen3" if row.overrides.get("model.frozen_stages") == 3 else row.name


def move(source: str, target: str, git: bool) -> None:
    """Moves a file (``git mv`` in a checkout, so that its history follows it)."""
    if os.path.exists(target):
        raise SystemExit(f"error: {target} exists; nothing is overwritten")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if git:
        subprocess.run(["git", "mv", source, target], cwd=ROOT, check=True)
    else:
        os.rename(source, target)
    with contextlib.suppress(OSError):
        os.removedirs(os.path.dirname(source))  # the emptied folders


def settings(record: dict) -> dict:
    """A record's settings under the keys' current names."""
    return {RENAMED_KEYS.get(k, k): v for k, v in (record.get("settings") or {}).items()}


def best(record: dict) -> tuple[float, int]:
    """The best validation Recall@1 over the trained epochs and its epoch (ties: the earliest)."""
    curve = [(p["recall@1"], p["epoch"]) for p in record["val_curve"] if p.get("epoch")]
    return max(curve, key=lambda x: (x[0], -x[1]))


def convert_tuning(study: Study, directory: str, tune: str, git: bool) -> dict[str, dict]:
    """Moves the tuning records; returns the tuned rows' ``selected`` events."""
    events = {}
    for method, (row, grid) in SEARCHES.items():
        scores = []
        for trial, variant in enumerate(grid):
            source = os.path.join(tune, f"tune-{method}-{variant}", "seed0.json")
            with open(source) as f:
                record = json.load(f)
            value, epoch = best(record)
            scores.append((value, trial, settings(record)))
            target = rec.tune_record_path(directory, row, trial, None)
            move(source, target, git)
            record.update(trial=trial, fold=None, best={"recall@1": value, "epoch": epoch},
                          settings=settings(record))  # fmt: skip
            atomic_write(target, json.dumps(record, indent=1) + "\n")
        value, trial, chosen = max(scores, key=lambda s: (s[0], -s[1]))
        values = {k: chosen[k] for k in study.row(row).space}
        events[row] = {"event": "selected", "row": row, "trial": trial, "score": value,
                       "values": values, "tried": len(grid), "failed": 0}  # fmt: skip
    return events


def seed_sources(study: Study, directory: str) -> dict[str, list[tuple[int, str]]]:
    """row -> its (seed, record path) in the old layout; every record must belong to a row."""
    found = {}
    for row in study.rows:
        paths = glob.glob(os.path.join(directory, source_dir(row), "seed*.json"))
        found[row.name] = sorted(
            (int(re.fullmatch(r"seed(\d+)\.json", os.path.basename(p)).group(1)), p) for p in paths
        )
    claimed = {p for v in found.values() for _, p in v}
    stray = sorted(set(glob.glob(os.path.join(directory, "*", "seed*.json"))) - claimed)
    if stray:
        raise SystemExit(f"error: records of no row of the study: {stray}; nothing was moved")
    return found


def convert_seeds(
    study: Study, directory: str, sources: dict, tuned: dict, git: bool
) -> dict[str, dict]:
    """Moves the seed records (``sources``: :func:`seed_sources`); returns the ``selected``
    events of the rows not tuned."""
    events = {}
    searched_by = {k: e["row"] for e in tuned.values() for k in e["values"]}
    for row in study.rows:
        trained = None
        for seed, path in sources[row.name]:
            with open(path) as f:
                trained = settings(json.load(f))
            move(path, rec.seed_record_path(directory, row.name, seed), git)
        if row.name in tuned:
            continue
        event = {"event": "selected", "row": row.name, "trial": None, "score": None,
                 "tried": 0, "failed": 0}  # fmt: skip
        if trained:
            event["values"] = {k: trained[k] for k in row.space}
            event["shared_from"] = sorted({searched_by[k] for k in event["values"]})
        else:  # format 1: the presets' values
            event["values"] = spec.first_candidate(study, row)
        events[row.name] = event
    return events


def convert_baselines(directory: str) -> None:
    """Names the fixed baselines as the study's claims do (``pixels``, ``features``); the
    untrained network's head per seed becomes ``initial`` (a table's row, no claim's)."""
    path = os.path.join(directory, "baselines.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f)
    fixed = {name: {"label": label, **old["fixed"][label]}
             for name, label in (("pixels", PIXELS), ("features", FEATURES))}  # fmt: skip
    fixed["initial"] = {"label": INITIAL, "seeds": old.pop("random_head")}
    atomic_write(path, json.dumps({**old, "fixed": fixed}, indent=1, sort_keys=True) + "\n")


def look_events(study: Study, directory: str, configs: dict) -> list[dict]:
    """Each look's decision as the emoji protocol took it: a claim stopped at look 1 when its
    own interval was settled there (none where the records do not reach look 1)."""
    reg = spec.registration(study)
    by_row = rec.seed_records(directory)
    fixed = baselines.read(directory)
    at1 = claim_readings(reg, configs, by_row, {}, at=1, fixed=fixed)
    if not study.claims or any(c.text not in at1 or at1[c.text].look != 1 for c in study.claims):
        return []
    stop = [c.text for c in study.claims if at1[c.text].difference.verdict() != "not resolved"]
    go_on = [c.text for c in study.claims if c.text not in stop]
    return [
        {"event": "look", "look": 1, "stop": stop, "go_on": go_on, "rule": "own verdict"},
        {"event": "look", "look": 2, "stop": go_on, "go_on": [], "rule": "own verdict"},
    ]


def convert(directory: str, variant: str, tune: str | None) -> str:
    """Converts one folder; returns what it did."""
    if os.path.exists(os.path.join(directory, "study.json")):
        return f"{directory}: converted already"
    git = subprocess.run(["git", "ls-files", "--error-unmatch", directory], cwd=ROOT,
                         capture_output=True).returncode == 0  # fmt: skip
    study = study_of(variant)
    sources = seed_sources(study, directory)  # every record has its row, before anything moves
    tuned = convert_tuning(study, directory, tune, git) if tune else {}
    selected = {**tuned, **convert_seeds(study, directory, sources, tuned, git)}
    convert_baselines(directory)
    configs = {}
    for row in study.rows:
        config = seed_config(study, row, selected[row.name]["values"], 0)
        configs[row.name] = flatten_config(config.to_dict())
    payload = spec.describe(study, configs)
    payload["command"] = "the emoji protocol's scripts, converted by tools/convert_emoji_records.py"
    atomic_write(os.path.join(directory, "study.json"), json.dumps(payload, indent=1) + "\n")
    for row in study.rows:
        ledger.append(directory, selected[row.name])
    seen = sum(len(v) for v in rec.seed_records(directory).values())
    reg = spec.registration(study)
    ledger.append(directory, {"event": "registered", "sha256": spec.digest(reg),
                              "registration": reg, "tests_seen": seen})  # fmt: skip
    for event in look_events(study, directory, configs):
        ledger.append(directory, event)
    return f"{directory}: {seen} seed records" + (
        f", {4 * len(tuned)} tuning records" * bool(tuned)
    )


WIDER = "emoji-wider-45"
COPIED = ("margin", "R-margin")  # the wider comparison's references, searched in emoji-v2-45


def split_wider(root: str) -> str:
    """Moves the wider rows' records and ledger events from ``emoji-v2-45`` to
    :data:`WIDER` (``git mv``) and copies those of :data:`COPIED` (seeds 0-4, the search);
    returns what it did."""
    source, target = os.path.join(root, "emoji-v2-45"), os.path.join(root, WIDER)
    if os.path.exists(os.path.join(target, "study.json")):
        return f"{target}: split already"
    git = subprocess.run(["git", "ls-files", "--error-unmatch", source], cwd=ROOT,
                         capture_output=True).returncode == 0  # fmt: skip
    study = spec.load(STUDY, "wider")
    selected = {e["row"]: e for e in ledger.events(source) if e.get("event") == "selected"}
    events = []
    for row in study.rows:
        event = {k: v for k, v in selected[row.name].items() if k != "time"}
        if row.name in COPIED:
            event["copied_from"] = "emoji-v2-45"
            for trial in range(study.budget):
                path = rec.tune_record_path(source, row.name, trial, None)
                copy(path, rec.tune_record_path(target, row.name, trial, None))
            for seed in range(study.looks[0]):
                path = rec.seed_record_path(source, row.name, seed)
                copy(path, rec.seed_record_path(target, row.name, seed))
        else:
            for path in glob.glob(os.path.join(source, "records", row.name, "seed*.json")):
                move(path, os.path.join(target, "records", row.name, os.path.basename(path)), git)
        events.append(event)
    configs = {r.name: flatten_config(seed_config(study, r, selected[r.name]["values"],
               0).to_dict()) for r in study.rows}  # fmt: skip
    payload = spec.describe(study, configs)
    payload["command"] = (
        "the emoji protocol's scripts, converted and split by tools/convert_emoji_records.py"
    )
    atomic_write(os.path.join(target, "study.json"), json.dumps(payload, indent=1) + "\n")
    for event in events:
        ledger.append(target, event)
    seen = sum(len(v) for v in rec.seed_records(target).values())
    reg = spec.registration(study)
    ledger.append(target, {"event": "registered", "sha256": spec.digest(reg),
                           "registration": reg, "tests_seen": seen})  # fmt: skip
    return f"{target}: {seen} seed records, split from {source}"


def copy(source: str, target: str) -> None:
    if os.path.exists(target):
        raise SystemExit(f"error: {target} exists; nothing is overwritten")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(source, "rb") as f:
        atomic_write(target, f.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(ROOT, "experiments", "results"))
    args = parser.parse_args()
    for folder, (variant, tune) in FOLDERS.items():
        tuning = os.path.join(args.root, tune) if tune else None
        print(convert(os.path.join(args.root, folder), variant, tuning), flush=True)
    print(split_wider(args.root), flush=True)


if __name__ == "__main__":
    main()
