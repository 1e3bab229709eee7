"""Converts the emoji protocol's records into the study layout of ``experiments/emoji_study.py``.

The records the emoji scripts wrote before the study tool existed
(``experiments/results/emoji-v2-45/<row>[-frozen3]/seed<k>.json``, the tuning runs in
``experiments/results/emoji-v2-tune-20/tune-<method>-<variant>/seed0.json`` and
``baselines.json``) are moved, with ``git mv`` inside a checkout so that their history
follows them, to ``<results>/records/<row>/seed<k>.json`` and
``<results>/records/tune/<row>/trial<n>.json``; a tuning record gains the fields the study's
tuning records have (its trial and best validation epoch). Then ``study.json`` and
``ledger.jsonl`` are written as ``jdml study run`` would have, telling what happened:

* ``selected``: each tuned row's candidate with the best validation Recall@1 (ties: the first
  of its grid), scored over its 4 candidates; every other row's values are those its records
  were trained with, shared from the search of another row (``shared_from``), not its own;
* ``registered``: the study's pre-registration, marked with the number of test results that
  existed when it was made (all of them: the claims were declared along the way, their
  family and effects after the results);
* ``look``: each look's decision as it was taken, by each claim's own verdict (the stopping
  rule then ignored Holm's correction).

    python tools/convert_emoji_records.py [--results experiments/results/emoji-v2-45]
        [--tune experiments/results/emoji-v2-tune-20] [--study experiments/emoji_study.py]

A folder already converted (it has a ``study.json``) is refused; nothing is overwritten.
"""

from __future__ import annotations

import argparse
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
from jdml.study import baselines, ledger, spec  # noqa: E402
from jdml.study import records as rec  # noqa: E402
from jdml.study.runner import claim_readings, seed_config  # noqa: E402

#: The method each tuning grid belongs to -> the study's row it was searched on, and the grid's
#: candidates in the order they were listed (their trial numbers).
SEARCHES = {
    "margin": ("margin", ["lr0.0001", "lr5e-05", "lr0.0002", "lr0.0004"]),
    "R-margin": ("R-margin", ["p0.2", "p0.05", "p0.1", "p0.35"]),
    "diva": ("diva", ["a0.2-d128", "a0.1-d128", "a0.2-d224", "a0.1-d224"]),
    "sharing": ("sharing-decor", ["w1-g500", "w0.5-g500", "w1-g100", "w0.5-g100"]),
    "dm2": ("dm2-3-md+td+vd", ["l20-r0.5", "l5-r0.5", "l20-r0.8", "l5-r0.8"]),
}
PIXELS = "raw pixels (64 x 64 x 3, L2-normalised)"
FEATURES = "ImageNet features (pooled 1280-d, L2-normalised)"


def move(source: str, target: str, git: bool) -> None:
    """Moves a file (``git mv`` in a checkout, so that its history follows it)."""
    if os.path.exists(target):
        raise SystemExit(f"error: {target} exists; nothing is overwritten")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if git:
        subprocess.run(["git", "mv", source, target], cwd=ROOT, check=True)
    else:
        os.rename(source, target)


def settings(record: dict) -> dict:
    """A record's settings under the keys' current names."""
    return {RENAMED_KEYS.get(k, k): v for k, v in record.get("settings", {}).items()}


def best(record: dict) -> tuple[float, int]:
    """The best validation Recall@1 over the trained epochs and its epoch (ties: the earliest)."""
    curve = [(p["recall@1"], p["epoch"]) for p in record["val_curve"] if p.get("epoch")]
    return max(curve, key=lambda x: (x[0], -x[1]))


def convert_tuning(study: spec.Study, directory: str, tune: str, git: bool) -> list[dict]:
    """Moves the tuning records; returns the tuned rows' ``selected`` events."""
    events = []
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
            record.update(trial=trial, fold=None, best={"recall@1": value, "epoch": epoch})
            atomic_write(target, json.dumps(record, indent=1) + "\n")
        value, trial, chosen = max(scores, key=lambda s: (s[0], -s[1]))
        space = study.row(row).space
        events.append({"event": "selected", "row": row, "trial": trial, "score": value,
                       "values": {k: chosen[k] for k in space}, "tried": len(grid),
                       "failed": 0})  # fmt: skip
    return events


def convert_seeds(study: spec.Study, directory: str, tuned: dict, git: bool) -> list[dict]:
    """Moves the seed records; returns the ``selected`` events of the rows not tuned."""
    events = []
    searched_by = {k: e["row"] for e in tuned.values() for k in e["values"]}
    for row in study.rows:
        found = [p for d in (row.name, f"{row.name}-frozen3")
                 for p in sorted(glob.glob(os.path.join(directory, d, "seed*.json")))]  # fmt: skip
        values = None
        for path in found:
            seed = int(re.fullmatch(r"seed(\d+)\.json", os.path.basename(path)).group(1))
            with open(path) as f:
                trained = settings(json.load(f))
            values = {k: trained[k] for k in row.space}
            move(path, rec.seed_record_path(directory, row.name, seed), git)
        if row.name not in tuned and values is not None:
            shared = sorted({searched_by[k] for k in values})
            events.append({"event": "selected", "row": row.name, "trial": None, "score": None,
                           "values": values, "tried": 0, "failed": 0,
                           "shared_from": shared})  # fmt: skip
    return events


def convert_baselines(directory: str, git: bool) -> None:
    """Names the fixed baselines as the study's claims do (``pixels``, ``features``)."""
    path = os.path.join(directory, "baselines.json")
    with open(path) as f:
        old = json.load(f)
    fixed = {name: {"label": label, **old["fixed"][label]}
             for name, label in (("pixels", PIXELS), ("features", FEATURES))}  # fmt: skip
    atomic_write(path, json.dumps({**old, "fixed": fixed}, indent=1, sort_keys=True) + "\n")


def look_events(study: spec.Study, directory: str) -> list[dict]:
    """Each look's decision as the emoji protocol took it: a claim stopped at look 1 when its
    own interval was settled there."""
    with open(os.path.join(directory, "study.json")) as f:
        configs = {r["name"]: r["config"] for r in json.load(f)["rows"]}
    reg = spec.registration(study)
    fixed = baselines.read(directory)
    at1 = claim_readings(reg, configs, rec.seed_records(directory), {}, at=1, fixed=fixed)
    stop = [c.text for c in study.claims if at1[c.text].difference.verdict() != "not resolved"]
    go_on = [c.text for c in study.claims if c.text not in stop]
    return [
        {"event": "look", "look": 1, "stop": stop, "go_on": go_on, "rule": "own verdict"},
        {"event": "look", "look": 2, "stop": go_on, "go_on": [], "rule": "own verdict"},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="experiments/results/emoji-v2-45")
    parser.add_argument("--tune", default="experiments/results/emoji-v2-tune-20")
    parser.add_argument("--study", default="experiments/emoji_study.py")
    args = parser.parse_args()
    directory = os.path.abspath(args.results)
    if os.path.exists(os.path.join(directory, "study.json")):
        raise SystemExit(f"error: {directory} is converted already (it has a study.json)")
    git = subprocess.run(["git", "ls-files", "--error-unmatch", directory], cwd=ROOT,
                         capture_output=True).returncode == 0  # fmt: skip
    study = spec.load(args.study)
    tuned = {e["row"]: e for e in convert_tuning(study, directory, os.path.abspath(args.tune), git)}
    shared = {e["row"]: e for e in convert_seeds(study, directory, tuned, git)}
    selected = {**tuned, **shared}
    convert_baselines(directory, git)
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
    for event in look_events(study, directory):
        ledger.append(directory, event)
    left = glob.glob(os.path.join(directory, "*", "seed*.json"))
    print(f"converted {seen} seed records and {len(tuned) * 4} tuning records into {directory}"
          + (f"; left unconverted: {left}" if left else ""))  # fmt: skip


if __name__ == "__main__":
    main()
