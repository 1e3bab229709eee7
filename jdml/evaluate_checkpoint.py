"""Evaluation of a saved checkpoint: ``evaluate_checkpoint(workdir, checkpoint, splits)``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from jdml.checkpoint import Checkpoints
from jdml.config import saved_config
from jdml.config.saved import unreadable_config
from jdml.errors import CheckpointError, ConfigError, OutputPathError
from jdml.evaluation import per_query
from jdml.evaluation.splits import SPECTRUM
from jdml.fileio import atomic_write, check_output_path
from jdml.run import Run
from jdml.workdir import check_writable


def load_config(workdir: str):
    """Reads ``workdir/config.json`` (written by training) as a locked ConfigDict."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise CheckpointError(
            f"{path} does not exist: {workdir} is not a training workdir (train with "
            f"`python train.py --config configs/revisiting.py --workdir {workdir}`)"
        )
    try:
        with open(path) as f:
            config = saved_config(f.read())
    except (OSError, ValueError, TypeError, AttributeError) as e:  # not a config's JSON object
        raise ConfigError(unreadable_config(path, e)) from None
    config.lock()
    return config


def evaluate_checkpoint(
    workdir: str,
    checkpoint: str | int = "best",
    splits: Sequence[str] = ("test",),
    *,
    write: bool = True,
) -> dict[str, Any]:
    """Restores a checkpoint of a workdir and evaluates it on the given splits.

    Args:
      workdir: a training workdir.
      checkpoint: 'best', 'latest' or a step number.
      splits: any of 'train', 'val', 'test'.
      write: write the results to the workdir (see :func:`save_evaluation`); the workdir is
        checked to be writable before anything is computed.

    Returns:
      ``{"checkpoint": ..., "step": ..., "results": {split: {metric: value}}}``, also written to
      ``workdir/eval_<checkpoint>_step<step>.json`` with ``write``.
    """
    workdir = os.path.abspath(workdir)
    config = load_config(workdir)
    if write:
        check_writable(workdir)
    ckpts = Checkpoints(workdir, create=False)
    try:
        ckpts.resolve(checkpoint)  # a wrong name or step fails before the data is loaded
        run = Run(config)
        missing = [s for s in splits if s not in run.splits]
        if missing:
            hint = (
                " (set data.val_fraction > 0 when training to get 'val')"
                if "val" in missing
                else ""
            )
            raise ConfigError(
                f"split(s) {missing} do not exist for this run; available: "
                f"{sorted(run.splits)}{hint}"
            )
        state, meta = ckpts.restore(checkpoint, run.initial_state)
    finally:
        ckpts.close()
    out = evaluate_state(run, state, splits, str(checkpoint), meta)
    if write:
        save_evaluation(workdir, out)
        if str(checkpoint) == "best":
            record_selected(workdir, out)
    return out


def evaluate_state(
    run: Run, state: Any, splits: Sequence[str], checkpoint: str, meta: dict[str, Any]
) -> dict[str, Any]:
    """Evaluates a restored state on ``splits``: the record :func:`evaluate_checkpoint` returns
    (``checkpoint``, ``step``, the checkpoint's ``meta``, ``results`` per split, the run's
    ``backends`` (:class:`jdml.backends.Backends`), and the other
    heads' ``embeddings``, the ``spectra`` and the ``per_query`` values where the run has
    them)."""
    evaluation = run.evaluate(state, {s: run.splits[s] for s in splits})
    out = {
        "checkpoint": checkpoint,
        "step": int(state.step),
        "meta": meta,
        "results": evaluation.metrics,
        "backends": run.backends.record(),  # the kNN selection and k-means it computed with
    }
    if any(evaluation.heads.values()):
        out["embeddings"] = evaluation.heads  # other heads and weighted concatenations, per split
    spectra = {s: v[SPECTRUM].tolist() for s, v in evaluation.vectors.items() if SPECTRUM in v}
    if spectra:
        out["spectra"] = spectra  # normalised singular values of the embeddings, descending
    vectors = evaluation.vectors.items()
    queries = {s: block for s, v in vectors if (block := per_query.pack(v, run.head))}
    if queries:
        out["per_query"] = queries  # eval.per_query's values per query, compressed
    return out


def selected_block(out: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """``results.json``'s ``selected``: the evaluation of the checkpoint selected on validation
    (its step and epoch, the metrics per split and the other heads'), merged split by split
    into ``previous`` when that is of the same step."""
    same = previous if previous and previous.get("step") == out["step"] else {}
    block = {
        "step": out["step"],
        "epoch": out["meta"].get("epoch"),
        "results": {**same.get("results", {}), **out["results"]},
    }
    embeddings = {**same.get("embeddings", {}), **out.get("embeddings", {})}
    if embeddings:
        block["embeddings"] = embeddings
    return block


def record_selected(workdir: str, out: dict[str, Any]) -> None:
    """Puts the best checkpoint's evaluation into the run's ``results.json`` (``selected``), so
    that the run's summary holds its test numbers; a run without a (readable) ``results.json``
    is left as it is."""
    path = os.path.join(os.path.abspath(workdir), "results.json")
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return
    if not isinstance(summary, dict):
        return
    summary["selected"] = selected_block(out, summary.get("selected"))
    atomic_write(path, json.dumps(summary, indent=2))


def result_path(workdir: str, checkpoint: str, step: int) -> str:
    """Where :func:`save_evaluation` writes the result of ``checkpoint`` at ``step``."""
    return os.path.join(os.path.abspath(workdir), f"eval_{checkpoint}_step{step}.json")


def check_result_path(workdir: str, checkpoint: str) -> None:
    """Before an evaluation: refuses a result path that is taken by something that is not a
    regular file (a folder, a link), naming it and a fix that works."""
    ckpts = Checkpoints(workdir, create=False)
    try:
        _, step = ckpts.resolve(checkpoint)
    finally:
        ckpts.close()
    path = result_path(workdir, str(checkpoint), step)
    try:
        check_output_path(path)
    except OutputPathError as e:
        raise OutputPathError(
            f"eval.py writes its result to {path}, which is taken ({str(e).split(':')[0]}); "
            "move it out of the way, then run the same command again"
        ) from None


def save_evaluation(workdir: str, out: dict[str, Any]) -> str:
    """Writes an :func:`evaluate_checkpoint` result to ``workdir/eval_<checkpoint>_step<step>.json``
    and returns the file's path."""
    path = result_path(workdir, out["checkpoint"], out["step"])
    atomic_write(path, json.dumps(out, indent=2))
    return path
