"""Prints the member spine's size: the lines of its central functions and modules, and the Python
frames between ``train.py`` and the first line of a loss.

* lines: ``jdml.step.train_step`` and ``jdml.trainer._train`` (from ``def`` to the last line),
  and the modules ``jdml/layout.py``, ``jdml/program.py``, ``jdml/step.py``;
* frames: ``python train.py`` on a tiny npz (one step) is run in this process; when the train
  step first traces the margin loss (the default), the stack is read, and the frames of this
  repository's code (not of installed packages) from ``train.py`` down are counted, with the
  modules they are in.

Issue 71 compares these before and after the refactor.

    python tools/spine_metrics.py
"""

from __future__ import annotations

import ast
import os
import runpy
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FUNCTIONS = {"jdml/step.py": "train_step", "jdml/trainer.py": "_train"}
MODULES = ("jdml/layout.py", "jdml/program.py", "jdml/step.py")


def function_lines(path: str, name: str) -> int:
    """Lines of the top-level function ``name`` of ``path`` (decorators and docstring included)."""
    tree = ast.parse((REPO / path).read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise SystemExit(f"error: no function {name} in {path}")


def frames_to_loss() -> list[traceback.FrameSummary]:
    """The repository's frames, from train.py down, when the margin loss is first traced."""
    from jdml.losses.margin import MarginLoss
    from tests.helpers import make_npz

    seen: list[traceback.FrameSummary] = []
    original = MarginLoss.__call__

    def ours(frame: traceback.FrameSummary) -> bool:
        inside = frame.filename.startswith(str(REPO)) and "site-packages" not in frame.filename
        return inside and frame.name != "spy"

    def spy(self, *args, **kwargs):
        stack = traceback.extract_stack()
        if not seen and any(f.name == "train_step" for f in stack):  # the step's, not init's
            mine = [f for f in stack if ours(f)]
            start = next(i for i, f in enumerate(mine) if f.filename.endswith("train.py"))
            seen.extend(mine[start:])
        return original(self, *args, **kwargs)

    MarginLoss.__call__ = spy
    try:
        with tempfile.TemporaryDirectory() as scratch:
            npz = make_npz(os.path.join(scratch, "tiny.npz"), size=32)
            sys.argv = [
                "train.py",
                "--config",
                str(REPO / "configs" / "revisiting.py") + ":data=npz",
                f"--config.data.path={npz}",
                "--config.train.epochs=1",
                "--config.train.steps_per_epoch=1",
                "--config.train.batch_size=16",
                "--config.train.progress_bar=False",
                "--config.eval.at_start=False",
                "--config.eval.splits=()",
                "--config.eval.train_metrics=()",
                "--config.data.val_fraction=0",
                f"--workdir={scratch}/run",
            ]
            try:
                runpy.run_path(str(REPO / "train.py"), run_name="__main__")
            except SystemExit as e:
                if e.code not in (0, None):
                    raise
    finally:
        MarginLoss.__call__ = original
    return seen


def main() -> None:
    for path, name in FUNCTIONS.items():
        print(f"{path}::{name}: {function_lines(path, name)} lines")
    for path in MODULES:
        print(f"{path}: {len((REPO / path).read_text().splitlines())} lines")
    frames = frames_to_loss()
    modules = sorted({os.path.relpath(f.filename, REPO) for f in frames})
    print(f"from train.py to the first loss line: {len(frames)} frames in {len(modules)} modules")
    for f in frames:
        print(f"  {os.path.relpath(f.filename, REPO)}:{f.lineno} {f.name}")


if __name__ == "__main__":
    main()
