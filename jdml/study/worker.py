"""One run of a study: ``python -m jdml.study.worker TASK.json``.

The task file (written by ``jdml.study.runner``) holds the run's whole config as JSON, its
folder and its record's path. The worker trains (resuming from the folder's checkpoint if a
killed attempt left one), then writes the record once (:func:`jdml.study.records.write_once`).
A run whose record exists is not trained; a run that finished but has no record (killed in
between) only writes it.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys
from typing import Any

from jdml.study import records as rec


def read_task(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def finished(workdir: str, kind: str) -> str | None:
    """The file a finished run leaves: a tuning run's ``results.json``, a seed run's test
    evaluation of its selected checkpoint (``eval_best_step*.json``)."""
    if kind == "tune":
        path = os.path.join(workdir, "results.json")
        return path if os.path.exists(path) else None
    found = sorted(glob.glob(os.path.join(workdir, "eval_best_step*.json")))
    return found[-1] if found else None


def validation_curve(workdir: str, metrics: list[str]) -> list[dict[str, Any]]:
    """The main head's validation evaluations: step, epoch and ``metrics``."""
    from jdml.fileio import read_jsonl

    return [
        {"step": r["step"], "epoch": r.get("epoch"), **{m: r[m] for m in metrics if m in r}}
        for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
        if r.get("kind") == "eval" and r.get("split") == "val" and "embedding" not in r
    ]


def best_validation(curve: list[dict[str, Any]], metric: str) -> tuple[float, int]:
    """The best ``metric`` over the trained epochs (epoch > 0) and its epoch (ties: the
    earliest), as training selects its checkpoint; NaN and epoch 0 if none is finite."""
    points = [
        (p[metric], p["epoch"])
        for p in curve
        if p.get("epoch") and isinstance(p.get(metric), int | float) and math.isfinite(p[metric])
    ]
    if not points:
        return math.nan, 0
    value, epoch = max(points, key=lambda x: (x[0], -x[1]))
    return float(value), int(epoch)


def data_checksum(config: Any) -> str | None:
    """The sha256 of the data a config reads, where one file holds it: the emoji set's or
    the glyphs' arrays (from their manifests) or ``data.path`` when it is a file; None
    otherwise (an image folder)."""
    if config.data.name == "glyphs":
        from jdml.data.glyphs import _cache_paths

        try:
            with open(_cache_paths(config.data.cache_dir or None, config.data.image_size)[1]) as f:
                return json.load(f).get("arrays_sha256")
        except (OSError, ValueError):
            return None
    if config.data.name == "emoji":
        from jdml.data.emoji import cache_paths

        try:
            with open(cache_paths(config.data.cache_dir or None)[1]) as f:
                return json.load(f).get("npz_sha256")
        except (OSError, ValueError):
            return None
    path = str(config.data.path or "")
    if not path or not os.path.isfile(path):
        return None
    from jdml.fileio import sha256_file

    return sha256_file(path)


def _config(task: dict[str, Any]) -> Any:
    from jdml.config.saved import from_json

    return from_json(task["config"])


def build_record(task: dict[str, Any], device: str) -> dict[str, Any]:
    """The run's record from its folder (see :mod:`jdml.study.records`)."""
    workdir, metrics = task["workdir"], task["metrics"]
    curve = validation_curve(workdir, metrics)
    common = {
        "row": task["row"],
        "seed": task["seed"],
        "epochs": task["epochs"],
        "commit": task["commit"],
        "data_sha256": data_checksum(_config(task)),
        "device": device,
        "settings": task["settings"],
        "config_sha256": task["config_sha256"],
    }
    if task["kind"] == "tune":
        value, epoch = best_validation(curve, task["metric"])
        return {
            **common,
            "trial": task["trial"],
            "fold": task["fold"],
            "best": {task["metric"]: value, "epoch": epoch},
            "val_curve": curve,
        }
    with open(finished(workdir, "seed")) as f:
        evaluation = json.load(f)
    record = {
        **common,
        "meta": evaluation["meta"],
        "results": evaluation["results"],
        "embeddings": evaluation.get("embeddings", {}),
        "val_curve": curve,
    }
    if evaluation.get("per_query"):
        record["per_query"] = evaluation["per_query"]
    return record


def share_compilations(folder: str | None) -> None:
    """Keeps XLA's compiled programs in ``folder``, shared by the study's runs (JAX's
    persistent compilation cache, every program kept however quick to compile), unless the
    environment names a cache of its own (``JAX_COMPILATION_CACHE_DIR``). The runs of a study
    compile the same programs (seeds and folds differ only in their inputs): on 2 CPU cores
    the tests' digits study took 52.4 s with it against 80.1 s without, with equal records
    (``bench/bench_study.py``)."""
    import jax

    if not folder or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def run(task_file: str) -> str:
    """Trains the task's run unless it is finished, writes its record; returns the line
    to print."""
    task = read_task(task_file)
    if os.path.exists(task["record"]):
        return f"recorded already ({task['record']})"
    diverged = None
    if not finished(task["workdir"], task["kind"]):
        share_compilations(task.get("xla_cache"))

        from jdml.config.saved import from_json
        from jdml.errors import NonFiniteEmbeddingError, NonFiniteLossError
        from jdml.trainer import train_and_evaluate

        try:
            train_and_evaluate(from_json(task["config"]), task["workdir"])
        except (NonFiniteLossError, NonFiniteEmbeddingError) as e:
            if task["kind"] != "tune":
                raise
            diverged = str(e).splitlines()[0]  # a candidate's result: its values diverge
    import jax

    record = build_record(task, jax.devices()[0].device_kind)
    if diverged is not None:
        record["best"] = {task["metric"]: math.nan, "epoch": 0}
        record["diverged"] = diverged
    wrote = rec.write_once(task["record"], record)
    if task["kind"] == "tune":
        value, epoch = record["best"][task["metric"]], record["best"]["epoch"]
        said = f"best validation {task['metric']} {100 * value:.2f} at epoch {epoch}"
    else:
        value = record["results"].get("test", {}).get(task["metric"], math.nan)
        said = f"test {task['metric']} {100 * value:.2f} (epoch {record['meta'].get('epoch')})"
    return said + ("" if wrote else " (recorded by another process)")


def main(argv: list[str] | None = None) -> None:
    from jdml.allocator import reexec_with_tcmalloc
    from jdml.cli import run_cli

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m jdml.study.worker TASK.json")
    reexec_with_tcmalloc()
    run_cli(lambda: print(run(argv[0]), flush=True))


if __name__ == "__main__":
    main()
