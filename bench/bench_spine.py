"""The train step of this tree against an earlier commit's, interleaved: is any step slower?

The three runs of the step's bitwise record (``tools/make_step_golden.py``: a plain run, a
stacked DM2 cohort of 2 on 2 devices, a heterogeneous cohort of 2 with its batch split over 2
devices; the tiny 16 px fixture, 4 simulated CPU devices) are built once in each tree, each in a
worker process of its own that keeps its compiled step. The rounds then alternate: in each
round every worker times ``--steps`` steps (each waited for), the two trees' workers one after
the other, in an order that flips every round. It prints each run's median step time per tree
over the rounds, their ratio (this tree / the earlier one), and the interval of the paired
per-round differences. With ``--processes P`` it does all that P times, each time in fresh
workers, and the interval is over the P pairs' mean differences: one compiled program in one
process can be a little faster or slower than the next (the stacked cohort's sign changed between
invocations), which rounds within one process cannot see.

    python bench/bench_spine.py [--before c4f61e9] [--rounds 7] [--steps 30] [--processes 5]

The earlier tree is extracted with ``git archive`` into a temporary folder; both import from
their own tree, with this checkout's virtual environment.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = ("plain", "stacked", "listed")


def overrides(name: str, dm2_section: bool) -> dict[str, object]:
    """The run's config keys in the tree's spelling (DM2's settings moved to ``exchange.dm2``)."""
    warmup = "exchange.dm2.warmup_epochs" if dm2_section else "cohort.warmup_epochs"
    cohort = {"cohort.size": 2, warmup: 0.0}
    return {
        "plain": {},
        "stacked": {**cohort, "cohort.devices": 2},
        "listed": {
            **cohort,
            "cohort.members": ("", "model.embed_dim=8"),
            "parallel.data_devices": 2,
        },
    }[name]


def worker(tree: str, name: str, steps: int) -> None:
    """Builds run ``name`` in ``tree``, compiles its step, then times ``steps`` steps for each
    ``go`` line on stdin (one JSON line of per-step milliseconds each) until ``quit``."""
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    )
    sys.path.insert(0, tree)
    import jax
    import jax.numpy as jnp

    from jdml.config import base_config
    from jdml.run import Run
    from tests.helpers import make_npz, tiny_config

    folder = tempfile.mkdtemp()
    npz = make_npz(os.path.join(folder, "tiny.npz"))
    dm2_section = "dm2" in base_config().exchange
    run = Run(tiny_config(npz, **overrides(name, dm2_section)))
    step = run.make_train_step()
    state = run.prepare(run.initial_state)
    make = run.batch_maker()
    batches = [{k: jnp.asarray(v) for k, v in make(s).items()} for s in range(8)]
    for s in range(3):  # compile and warm up
        state, metrics = step(state, batches[s % 8])
    jax.block_until_ready((state, metrics))
    print(json.dumps({"ready": name}), flush=True)
    count = 0
    for line in sys.stdin:
        if line.strip() != "go":
            break
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            state, metrics = step(state, batches[count % 8])
            jax.block_until_ready((state, metrics))
            times.append((time.perf_counter() - start) * 1e3)
            count += 1
        print(json.dumps({"ms": times}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="c4f61e9", help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="fresh worker pairs, one after the other; with 3 or more the interval is over them",
    )
    parser.add_argument(
        "--runs",
        default=",".join(RUNS),
        help="comma-separated (the cohorts need 2 devices: on one GPU, --runs plain)",
    )
    parser.add_argument("--worker", nargs=2, metavar=("TREE", "RUN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # imports from its own tree only
        worker(args.worker[0], args.worker[1], args.steps)
        return
    sys.path.insert(0, REPO)
    from jdml.statistics import paired

    folder = tempfile.mkdtemp(prefix="jdml-before-")
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", args.before], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    commit = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    trees = {"before": folder, "after": REPO}
    runs = [r for r in args.runs.split(",") if r]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        raise SystemExit(f"error: unknown run(s) {unknown}; choose from {', '.join(RUNS)}")
    print(f"before: {args.before}; after: {commit} (this tree, with its uncommitted changes)")
    medians: dict[tuple[str, str], list[list[float]]] = {
        (name, label): [] for name in runs for label in trees
    }
    for p in range(args.processes):
        for key, values in time_in_fresh_workers(trees, runs, args, p).items():
            medians[key].append(values)
    print(
        f"\n{args.processes} process pair(s) x {args.rounds} rounds of {args.steps} steps; median "
        "ms per step over all rounds; the interval is over the rounds' paired differences, and "
        "with several process pairs over the pairs' mean differences (a compiled program's "
        "own luck, layout and thread placement, varies between processes)"
    )
    print("run      before   after   after/before   after-before (95% t interval, ms)")
    for name in runs:
        before, after = medians[name, "before"], medians[name, "after"]
        if args.processes > 1:
            diff = paired([statistics.mean(a) for a in after], [statistics.mean(b) for b in before])
        else:
            diff = paired(after[0], before[0])
        b = statistics.median([x for xs in before for x in xs])
        a = statistics.median([x for xs in after for x in xs])
        print(
            f"{name:8s} {b:7.2f} {a:7.2f}   {a / b:10.3f}     "
            f"{diff.mean:+.2f} [{diff.low:+.2f}, {diff.high:+.2f}]"
        )
    if args.processes > 1:
        print("each pair's mean after-before (ms):")
        for name in runs:
            pairs = zip(medians[name, "after"], medians[name, "before"], strict=True)
            means = [statistics.mean(a) - statistics.mean(b) for a, b in pairs]
            print(f"{name:8s} " + " ".join(f"{m:+.2f}" for m in means))


def time_in_fresh_workers(
    trees: dict[str, str], runs: list[str], args: argparse.Namespace, pair: int
) -> dict[tuple[str, str], list[float]]:
    """Starts one worker per run and tree, then times ``args.rounds`` alternating rounds:
    (run, tree) -> the median ms per step of each round. The workers exit at the end."""
    workers = {}
    for name in runs:
        for label, tree in trees.items():
            command = [sys.executable, __file__, "--worker", tree, name, "--steps", str(args.steps)]
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree
            )
            json.loads(proc.stdout.readline())  # compiled
            workers[name, label] = proc
            print(f"  pair {pair + 1}: {name} {label}: compiled", flush=True)
    medians: dict[tuple[str, str], list[float]] = {key: [] for key in workers}
    for r in range(args.rounds):
        order = ("before", "after") if (r + pair) % 2 == 0 else ("after", "before")
        for name in runs:
            for label in order:
                proc = workers[name, label]
                proc.stdin.write("go\n")
                proc.stdin.flush()
                times = json.loads(proc.stdout.readline())["ms"]
                medians[name, label].append(statistics.median(times))
        print(f"  pair {pair + 1}: round {r + 1}/{args.rounds} done", flush=True)
    for proc in workers.values():
        proc.stdin.write("quit\n")
        proc.stdin.close()
        proc.wait()
    return medians


if __name__ == "__main__":
    main()
