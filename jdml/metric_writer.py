"""Metrics as JSON lines (one object per record) beside the run's config.json."""

from __future__ import annotations

import json
import math
import os
from typing import Any

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

    def __init__(self, path: str, resume_step: int | None = None, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        if enabled and resume_step is not None and os.path.exists(path):
            kept = [r for r in read_jsonl(path) if r.get("step", 0) <= resume_step]
            atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
