"""A training run's evaluations: on unseen classes at the end of every ``eval.every_epochs``
epochs, their records and plots, the choice of the best checkpoint on the selection split, and
the run's summary.

The best checkpoint is chosen on validation (``val``, training classes held out by
``data.val_fraction``), or on the test split when the run holds none out, as the reference does.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import ml_collections
import numpy as np
from PIL import Image

from jdml.checkpoint import Checkpoints
from jdml.data.arrays import ImageSet
from jdml.distributed import is_main_process
from jdml.evaluate_checkpoint import evaluate_state, save_evaluation, selected_block
from jdml.evaluation.splits import SPECTRUM
from jdml.evaluation.table import format_table
from jdml.fileio import read_jsonl
from jdml.metric_writer import MetricWriter
from jdml.run import Run
from jdml.state import TrainState
from jdml.visualize import spectrum_plot, split_retrieval_grid

log = logging.getLogger("jdml")


def selection_split(splits: dict[str, ImageSet]) -> str:
    """The split the best checkpoint is chosen on: ``val`` if the run holds classes out."""
    if "val" in splits:
        return "val"
    log.info(
        "No validation split (data.val_fraction=0): the best checkpoint is selected on the TEST "
        "split, as the reference does; the default data.val_fraction=0.15 selects it on "
        "training classes held out for validation"
    )
    return "test"


def main_eval(record: dict) -> bool:
    """An evaluation record of the main head (other heads' records name their ``embedding``)."""
    return record.get("kind") == "eval" and "embedding" not in record


def eval_records(records: list[dict], split: str) -> list[dict]:
    """The main head's evaluation records of ``split``."""
    return [r for r in records if main_eval(r) and r.get("split") == split]


def summarize(records: list[dict], selection: str, metric: str) -> dict[str, Any]:
    """Builds the run summary from the metric records (untrained, final and best evaluations)."""
    evals = [r for r in records if main_eval(r)]
    by_step: dict[int, dict[str, dict]] = {}
    for r in evals:
        metrics = {k: v for k, v in r.items() if k not in ("kind", "split", "step", "epoch")}
        by_step.setdefault(r["step"], {})[r["split"]] = metrics
    sel = [r for r in eval_records(records, selection) if r["step"] > 0]
    summary: dict[str, Any] = {"selection_split": selection, "selection_metric": metric}
    if 0 in by_step:
        summary["untrained"] = by_step[0]
    if by_step:
        last = max(by_step)
        summary["final"] = {"step": last, **by_step[last]}
    if sel:
        best = max(sel, key=lambda r: (r[metric], -r["step"]))
        summary["best"] = {"step": best["step"], "epoch": best["epoch"], **by_step[best["step"]]}
    return summary


class Evaluations:
    """The evaluations of one training run and its best checkpoint.

    Calling it with a state evaluates it on the evaluated splits, writes the records (and with
    TensorBoard the retrieval grids and spectra), and saves the state as the best checkpoint when
    it beats every earlier evaluation of this workdir on the selection split's metric.

    Args:
      config: the run config (its ``eval`` section).
      run: the run (its splits and evaluator).
      writer: the run's metric writer (its records so far, from a resumed run, are read).
      ckpts: the run's checkpoints.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        run: Run,
        writer: MetricWriter,
        ckpts: Checkpoints,
    ) -> None:
        self.config, self.run, self.writer, self.ckpts = config, run, writer, ckpts
        self.selection = selection_split(run.splits)
        self.metric = config.eval.selection_metric
        self.full_splits = list(dict.fromkeys([*config.eval.splits, self.selection]))
        train_split = ["train"] if config.eval.train_metrics else []
        names = dict.fromkeys([*self.full_splits, *train_split])
        self.splits = {s: run.splits[s] for s in names}
        earlier = read_jsonl(writer.path) if os.path.exists(writer.path) else []
        self.best_value = max(
            (r[self.metric] for r in eval_records(earlier, self.selection) if r["step"] > 0),
            default=-np.inf,
        )

    def __call__(self, state: TrainState, epoch: int) -> None:
        step, writer = int(state.step), self.writer
        evaluation = self.run.evaluate(state, self.splits, self.full_splits, self._grid(step))
        for split, rows in evaluation.heads.items():
            for embedding, values in rows.items():
                record = {"kind": "eval", "split": split, "embedding": embedding}
                writer.write({**record, "step": step, "epoch": epoch, **values})
        for split, values in evaluation.metrics.items():
            writer.write({"kind": "eval", "split": split, "step": step, "epoch": epoch, **values})
            spectrum = evaluation.vectors[split].get(SPECTRUM)
            if spectrum is not None:
                self._spectrum(split, [float(x) for x in spectrum], step, epoch)
        others = {f"{s} {e}": v for s, rows in evaluation.heads.items() for e, v in rows.items()}
        table = {**evaluation.metrics, **others}
        log.info("Evaluation at epoch %d (step %d):\n%s", epoch, step, format_table(table))
        value = evaluation.metrics[self.selection][self.metric]
        if step > 0 and value > self.best_value:
            self.best_value = value
            meta = {"epoch": epoch, self.metric: value, "split": self.selection}
            self.ckpts.save(state, meta, best=True)

    def _grid(self, step: int):
        """With TensorBoard, the callback drawing each evaluated split's retrieval grid (the
        same queries at every evaluation); else None."""
        if self.writer.board is None:
            return None
        distance = str(self.config.eval.distance)

        def draw(split: str, data: ImageSet, embeddings: np.ndarray) -> None:
            if split != "train":
                image = _retrieval_image(data, embeddings, distance)
                self.writer.add_image(f"eval/{split}/retrieval", image, step)

        return draw

    def _spectrum(self, split: str, spectrum: list[float], step: int, epoch: int) -> None:
        record = {"kind": "spectrum", "split": split, "step": step, "epoch": epoch}
        self.writer.write({**record, "spectrum": spectrum})
        if self.writer.board is not None:
            image = _spectrum_image(self.writer, split)
            self.writer.add_image(f"eval/{split}/spectrum", image, step)

    def summary(self) -> dict[str, Any]:
        """The run's summary from every record of the workdir (:func:`summarize`)."""
        path = self.writer.path
        done = read_jsonl(path) if os.path.exists(path) else []
        return summarize(done, self.selection, self.metric)

    def evaluate_selected(self, workdir: str) -> dict[str, Any] | None:
        """The best checkpoint evaluated on ``eval.selected_splits`` (saved in the workdir), as
        the summary's ``selected`` block; None without such splits or a best checkpoint."""
        splits = tuple(self.config.eval.selected_splits)
        if not splits or self.ckpts.best.latest_step() is None:
            return None
        best, meta = self.ckpts.restore("best", self.run.initial_state)
        out = evaluate_state(self.run, best, splits, "best", meta)
        if is_main_process():
            save_evaluation(workdir, out)
        table = format_table(out["results"])
        log.info("The selected checkpoint (step %d):\n%s", out["step"], table)
        return selected_block(out)


def _spectrum_image(writer: MetricWriter, split: str) -> np.ndarray:
    """The run's spectrum plot of ``split`` so far (latest against first), as RGB pixels."""
    with tempfile.TemporaryDirectory() as folder:
        path = spectrum_plot(read_jsonl(writer.path), os.path.join(folder, "s.png"), split=split)
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))


def _retrieval_image(data: ImageSet, embeddings: np.ndarray, distance: str) -> np.ndarray:
    """The retrieval grid of a split (``jdml look``'s six queries and six neighbours, the same
    queries at every call) as RGB pixels."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "grid.png")
        split_retrieval_grid(data, embeddings, path, distance=distance)
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
