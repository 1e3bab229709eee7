"""Whether a change left the compiled train steps as they were: each run's step compiled by this
tree and by a git commit (``--before``, checked out in a temporary worktree), compared as XLA's
optimised HLO without its debug information (source files, lines, stack frames).

An identical program runs at the same speed: where a change should not touch a run's arithmetic
(a refactor, a new path for another backbone), this answers "no step slower" exactly, where a
timing could only bound it. It prints one line per run and exits 1 if one differs.

Runs, on the tests' tiny data (16 px, or 32 px for the ImageNet backbones), with this process's
backends (oneDNN's kernels on CPU where they build): ``glyph`` (the default small ResNet),
``resnet50``, ``efficientnet_lite0``, ``vit`` (a small one).

Usage: python bench/same_programs.py --before REF [--runs glyph,resnet50,efficientnet_lite0,vit]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = {
    "glyph": {},
    "resnet50": {"model.backbone": "resnet50", "data.image_size": 32},
    "efficientnet_lite0": {"model.backbone": "efficientnet_lite0", "data.image_size": 32},
    "vit": {
        "model.backbone": "vit",
        "model.vit.patch": 4,
        "model.vit.dim": 32,
        "model.vit.depth": 2,
        "model.vit.heads": 2,
    },
}
# What the child prints per run: "<name> <sha256 of the program without debug information>".
CHILD = """
import hashlib, importlib.util, json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, {root!r})
os.chdir({root!r})
from tests.helpers import make_npz, tiny_config
from jdml.run import Run
spec = importlib.util.spec_from_file_location("same_programs", {tool!r})
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)
runs = json.loads({runs!r})
npz = make_npz({npz!r})
for name, overrides in runs.items():
    run = Run(tiny_config(npz, **overrides))
    step = run.make_train_step()
    text = step.lower(run.initial_state, run.batch_maker()(0)).compile().as_text()
    clean = tool.without_debug_information(text)
    print(name, hashlib.sha256(clean.encode()).hexdigest(), flush=True)
"""


def without_debug_information(text: str) -> str:
    """XLA's HLO text from its module line on, without metadata, source tables and frames."""
    text = text[text.find("HloModule") :]
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    text = re.sub(r"^\d+ (\{[^}]*\}|\"[^\"]*\")\n", "", text, flags=re.M)
    text = re.sub(r", stack_frame_id=\d+", "", text)
    return re.sub(r"\s*//.*", "", text)


def program_hashes(root: str, runs: dict, npz: str) -> dict[str, str]:
    """Each run's program hash, compiled by the tree at ``root`` in a process of its own."""
    code = CHILD.format(root=root, runs=json.dumps(runs), npz=npz, tool=os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=root
    )
    if out.returncode:
        raise SystemExit(f"error: compiling the steps of {root} failed:\n{out.stderr[-2000:]}")
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git commit to compare with")
    parser.add_argument("--runs", default=",".join(RUNS))
    args = parser.parse_args()
    names = args.runs.split(",")
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"error: unknown runs {unknown}: choose among {', '.join(RUNS)}")
    runs = {n: RUNS[n] for n in names}
    with tempfile.TemporaryDirectory() as scratch:
        before = os.path.join(scratch, "before")
        subprocess.run(
            ["git", "-C", REPO, "worktree", "add", "-q", "--detach", before, args.before],
            check=True,
        )
        try:
            npz = os.path.join(scratch, "tiny.npz")
            old = program_hashes(before, runs, npz)
            new = program_hashes(REPO, runs, npz)
        finally:
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", before])
    print(f"the train steps' compiled programs, {args.before} against this tree:")
    same = True
    for name in names:
        equal = old[name] == new[name]
        same &= equal
        print(f"  {name:20s} {'identical' if equal else 'DIFFERENT'} ({new[name][:12]})")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
