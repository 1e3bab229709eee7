"""What running methods as a study costs and gains, on this host (alternating rounds).

* **overhead**: a study of one row, budget 1 (no tuning run), one look of 2 seeds, one slot,
  without the shared compilation cache, against the same two runs as plain ``train.py``
  commands (their ``config.json`` from the study's run folders, so the configs are equal):
  the driver's start (once per study: a rerun of the finished study) and the study's time per
  run above ``train.py``'s beyond it (the target: at most 5 % of a one-minute run);
* **cache**: the tests' digits study (2 rows x 2 candidates x 2 seeds, 1 epoch: runs where
  compiling is a large part) with the runs' shared XLA compilation cache (the default)
  against without, 2 slots each;
* **slots**: the digits study with 2 slots against 1 on 2 cores;
* **ray**: the digits study on a Ray cluster of this host (127.0.0.1, 2 CPUs, 2 runs at once)
  against the local executor's 2 slots.

    python bench/bench_study.py [--rounds 3] [--epochs 10] [--parts overhead,cache,slots,ray]

Each part alternates its two sides round by round (the first side first in odd rounds) and
prints every time, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.helpers import make_digits_npz  # noqa: E402

DIGITS_STUDY = os.path.join(ROOT, "tests", "study", "digits_study.py")
ENV = {
    **os.environ,
    "PYTHONPATH": ROOT,
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray on 127.0.0.1, not the host address
}


def one_row_study(folder: str, npz: str, epochs: int) -> str:
    """A study file: margin on the digits, ``epochs`` epochs, budget 1, 2 seeds."""
    path = os.path.join(folder, "one_row.py")
    with open(path, "w") as f:
        f.write(
            textwrap.dedent(
                f"""
                import sys
                sys.path.insert(0, {ROOT!r})
                from jdml.study import Row, Study
                from tests.helpers import TINY_OVERRIDES

                def get_study():
                    tiny = TINY_OVERRIDES.items()
                    common = {{k: v for k, v in tiny if not k.startswith("data.")}}
                    common.update({{"train.epochs": {epochs}, "eval.train_metrics": (),
                                   "eval.every_epochs": 5, "train.tensorboard": False}})
                    data = {{k: v for k, v in tiny if k.startswith("data.")}}
                    data.update({{"data.path": {npz!r}, "data.val_fraction": 0.3}})
                    return Study(name="one row", rows=(Row("margin", "revisiting:loss=margin"),),
                                 data=data, common=common, budget=1, looks=(2,))
                """
            )
        )
    return path


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env or ENV, cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(
            f"error: {' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return took


def study(file: str, folder: str, *flags: str) -> float:
    shutil.rmtree(folder, ignore_errors=True)
    return timed([sys.executable, "-m", "jdml", "study", "run", file, "--dir", folder, *flags])


def plain(configs: list[str], folder: str) -> float:
    shutil.rmtree(folder, ignore_errors=True)
    total = 0.0
    for i, config in enumerate(configs):
        argv = [sys.executable, "train.py", "--config", config, "--workdir", f"{folder}/run{i}"]
        total += timed(argv)
    return total


def alternate(name: str, rounds: int, a: tuple[str, callable], b: tuple[str, callable]) -> None:
    times: dict[str, list[float]] = {a[0]: [], b[0]: []}
    for r in range(rounds):
        for label, fn in (a, b) if r % 2 == 0 else (b, a):
            times[label].append(fn())
            print(f"  {name} round {r + 1}: {label} {times[label][-1]:.1f} s", flush=True)
    ma, mb = statistics.median(times[a[0]]), statistics.median(times[b[0]])
    print(f"{name}: {a[0]} median {ma:.1f} s, {b[0]} median {mb:.1f} s, ratio {ma / mb:.3f}")
    return ma, mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10, help="the one-row study's runs")
    parser.add_argument("--parts", default="overhead,cache,slots,ray")
    args = parser.parse_args()
    parts = args.parts.split(",")
    work = tempfile.mkdtemp(prefix="bench_study_")
    npz = make_digits_npz(os.path.join(work, "digits.npz"))
    print(f"CPU cores: {len(os.sched_getaffinity(0))}; work in {work}")
    if "overhead" in parts:
        file = one_row_study(work, npz, args.epochs)
        warm = os.path.join(work, "warm")
        study(file, warm, "--no-xla-cache")  # the configs train.py gets, and a warm disk
        configs = [os.path.join(warm, "runs", "margin", f"seed{s}", "config.json") for s in (0, 1)]
        s, p = alternate(
            "overhead",
            args.rounds,
            ("study", lambda: study(file, os.path.join(work, "s"), "--no-xla-cache")),
            ("train.py", lambda: plain(configs, os.path.join(work, "p"))),
        )
        # The driver's own start (imports, the rows' configs checked, the ledger read): a
        # rerun of the finished study, which starts no run.
        fixed = statistics.median(
            timed([sys.executable, "-m", "jdml", "study", "run", file, "--dir", warm])
            for _ in range(3)
        )
        per_run = (s - p - fixed) / 2
        print(
            f"the driver's start, once per study: {fixed:.1f} s; overhead per run beyond "
            f"it: {per_run:+.2f} s on a {p / 2:.1f} s run ({100 * per_run / (p / 2):+.1f} %)"
        )
    digits = f"{DIGITS_STUDY}:{npz}"
    if "cache" in parts:
        alternate(
            "cache",
            args.rounds,
            ("shared cache", lambda: study(digits, os.path.join(work, "c"), "--slots=2")),
            (
                "no cache",
                lambda: study(digits, os.path.join(work, "n"), "--slots=2", "--no-xla-cache"),
            ),
        )
    if "slots" in parts:
        alternate(
            "slots",
            args.rounds,
            ("2 slots", lambda: study(digits, os.path.join(work, "two"), "--slots=2")),
            ("1 slot", lambda: study(digits, os.path.join(work, "one"), "--slots=1")),
        )
    if "ray" in parts:
        env = ENV
        port = "6391"
        subprocess.run(["ray", "stop", "--force"], env=env, capture_output=True)
        subprocess.run(
            ["ray", "start", "--head", f"--port={port}", "--num-cpus=2",
             "--include-dashboard=false", "--disable-usage-stats"],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        try:
            ray_flags = ("--executor=ray", f"--address=127.0.0.1:{port}", "--slots=2")
            alternate(
                "ray",
                args.rounds,
                ("ray", lambda: study(digits, os.path.join(work, "ray"), *ray_flags)),
                ("local", lambda: study(digits, os.path.join(work, "local"), "--slots=2")),
            )
        finally:
            subprocess.run(["ray", "stop", "--force"], env=env, capture_output=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
