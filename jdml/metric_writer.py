"""Metrics as JSON lines (one object per record) beside the run's config.json, and as TensorBoard
event files in ``<workdir>/tensorboard`` (``tensorboard --logdir runs/``)."""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np

from jdml.fileio import atomic_write, read_jsonl


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricWriter:
    """Appends records to ``workdir/metrics.jsonl``.

    Args:
      path: the JSON-lines file.
      resume_step: when resuming from a checkpoint at this step, records of later steps (written
        by the interrupted run after its last checkpoint, and about to be recomputed identically)
        are dropped first, so the file reads as one uninterrupted run; -1 when starting without
        a checkpoint (every record of an earlier start, its untrained evaluation included, is
        dropped).
      enabled: False in the processes of a multi-process run other than process 0 (they write
        nothing; process 0 writes the one file).
    """

    def __init__(
        self,
        path: str,
        resume_step: int | None = None,
        enabled: bool = True,
        tensorboard: bool = False,
    ) -> None:
        self.path = path
        self.enabled = enabled
        if enabled and resume_step is not None and os.path.exists(path):
            kept = [r for r in read_jsonl(path) if r.get("step", 0) <= resume_step]
            atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))
        self.board = None
        if enabled and tensorboard:
            from tensorboardX import SummaryWriter

            # purge_step: TensorBoard hides what an interrupted run wrote after the checkpoint
            # resumed from, as the JSON lines drop it.
            purge = None if resume_step is None else resume_step + 1
            folder = os.path.join(os.path.dirname(path), "tensorboard")
            self.board = SummaryWriter(folder, purge_step=purge, flush_secs=30)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        if self.board is not None:
            for tag, value in scalar_tags(record).items():
                self.board.add_scalar(tag, value, int(record["step"]))

    def add_image(self, tag: str, image: np.ndarray, step: int) -> None:
        """An (H, W, 3) uint8 picture in TensorBoard's images (nothing without TensorBoard)."""
        if self.board is not None:
            self.board.add_image(tag, image, step, dataformats="HWC")

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None


def _tag(name: str) -> str:
    return re.sub(r"[^-/\w.]", "_", name.replace("@", "_at_"))


def scalar_tags(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of a record: ``train/<name>`` for training, and
    ``eval/<split>[/<embedding>]/<metric>`` for an evaluation (the main head unnamed). Tags keep
    TensorBoard's characters (letters, digits, ``_-./``): ``recall@1`` is ``recall_at_1``,
    ``concat:1,1`` is ``concat_1_1``."""
    kind = record.get("kind")
    if kind == "train":
        prefix = "train"
    elif kind == "eval":
        parts = ("eval", record.get("split"), record.get("embedding"))
        prefix = "/".join(p for p in parts if p)
    else:
        return {}
    skip = {"kind", "step", "epoch", "split", "embedding"}
    return {
        _tag(f"{prefix}/{k}"): float(v)
        for k, v in record.items()
        if k not in skip and isinstance(v, int | float) and not isinstance(v, bool)
    }
