"""Prints the member spine's size: the lines of its central functions and modules, and the Python
frames between ``train.py`` and the first line of a loss.

* lines: the plain and the cohort's ``train_step`` and ``jdml.trainer._train`` (from ``def``
  to the last line), and the modules of the layout, the program and the two steps;
* types: the classes a reader of each ``train_step`` meets in its annotations and those of the
  module's functions it calls (Python's, JAX's and NumPy's not counted);
* frames: ``python train.py`` on a tiny npz (one step) is run in this process; when the train
  step first reaches the margin loss's own first line (through Flax's and the repository's
  wrappers), the stack is read, and the frames of this repository's code (not of installed
  packages) from ``train.py`` down are counted, with the modules they are in.

Issues 71 and 81 compare these before and after their refactors.

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

FUNCTIONS = {
    "jdml/step.py": "train_step",
    "jdml/cohort/step.py": "train_step",
    "jdml/trainer.py": "_train",
}
#: A plain run's spine, then the cohort's (before issue 81's second session: jdml/layout.py,
#: jdml/program.py, jdml/step.py, jdml/cohort/step.py).
MODULES = (
    "jdml/step.py",
    "jdml/program.py",
    "jdml/placement.py",
    "jdml/embedder.py",
    "jdml/cohort/step.py",
    "jdml/cohort/program.py",
    "jdml/cohort/layout.py",
    "jdml/cohort/embeddings.py",
)


def function_lines(path: str, name: str) -> int:
    """Lines of the top-level function ``name`` of ``path`` (decorators and docstring included)."""
    tree = ast.parse((REPO / path).read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise SystemExit(f"error: no function {name} in {path}")


#: Modules whose types a JAX reader knows already (not counted as the step's types).
KNOWN = ("builtins", "types", "typing", "collections", "jax", "jaxlib", "numpy")


def step_types(module: str) -> list[str]:
    """The types a reader of ``module``'s ``train_step`` meets: the classes named in the
    annotations of it and of the module's functions it calls (not Python's, JAX's or NumPy's)."""
    import importlib
    import inspect
    import typing

    mod = importlib.import_module(module)
    step = mod.train_step
    called = {
        node.func.id
        for node in ast.walk(ast.parse(inspect.getsource(step)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    functions = [step] + [
        getattr(mod, n)
        for n in sorted(called)
        if inspect.isfunction(getattr(mod, n, None)) and getattr(mod, n).__module__ == module
    ]
    found: set[str] = set()

    def visit(hint: object) -> None:
        for arg in typing.get_args(hint):
            visit(arg)
        origin = typing.get_origin(hint) or hint
        if isinstance(origin, type) and origin.__module__.split(".")[0] not in KNOWN:
            found.add(f"{origin.__module__}.{origin.__qualname__}")

    for fn in functions:
        for hint in typing.get_type_hints(fn).values():
            visit(hint)
    return sorted(found)


def frames_to_loss() -> list[traceback.FrameSummary]:
    """The repository's frames, from train.py down to the margin loss's own first line (its
    wrappers included), when the train step first traces the loss."""
    import inspect

    from jdml.losses.margin import MarginLoss
    from tests.helpers import make_npz

    seen: list[traceback.FrameSummary] = []
    target = inspect.unwrap(MarginLoss.__call__).__code__

    def ours(frame: traceback.FrameSummary) -> bool:
        return frame.filename.startswith(str(REPO)) and "site-packages" not in frame.filename

    def profile(frame, event, arg):
        if seen or event != "call" or frame.f_code is not target:
            return
        stack = traceback.extract_stack(frame)
        if any(f.name == "train_step" for f in stack):  # the step's, not init's
            mine = [f for f in stack if ours(f)]
            start = next(i for i, f in enumerate(mine) if f.filename.endswith("train.py"))
            seen.extend(mine[start:])

    # train.py as a program starts itself again under tcmalloc (jdml.allocator): in this
    # process that would replace the caller (a test run: pytest started over from its argv).
    allocator = os.environ.get("JDML_ALLOCATOR")
    os.environ["JDML_ALLOCATOR"] = "system"
    sys.setprofile(profile)
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
        sys.setprofile(None)
        if allocator is None:
            del os.environ["JDML_ALLOCATOR"]
        else:
            os.environ["JDML_ALLOCATOR"] = allocator
    return seen


def main() -> None:
    for path, name in FUNCTIONS.items():
        print(f"{path}::{name}: {function_lines(path, name)} lines")
    for path in MODULES:
        if (REPO / path).exists():  # an older revision has other modules
            print(f"{path}: {len((REPO / path).read_text().splitlines())} lines")
    for module in ("jdml.step", "jdml.cohort.step"):
        types = step_types(module)
        print(f"{module}.train_step's reader meets {len(types)} types: {', '.join(types)}")
    frames = frames_to_loss()
    modules = sorted({os.path.relpath(f.filename, REPO) for f in frames})
    print(f"from train.py to the first loss line: {len(frames)} frames in {len(modules)} modules")
    for f in frames:
        print(f"  {os.path.relpath(f.filename, REPO)}:{f.lineno} {f.name}")


if __name__ == "__main__":
    main()
