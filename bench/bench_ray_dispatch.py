"""Why a study's runs are Ray tasks and not Ray Tune trials: the cost of each way per run.

Both ways run the same unit, a Python process that starts and exits (a study's run is one such
process, ``python -m jdml.study.worker``), ``--units`` times, 2 at once on a Ray instance of
this host (127.0.0.1, 2 CPUs, no usage statistics):

* **task**: ``ray.remote(num_cpus=1)`` tasks, as ``jdml.study.executor.RayTasks`` submits them;
* **tune**: a Ray Tune function trainable (``tune.with_resources(..., {"cpu": 1})``) over a
  grid of ``--units`` points, ``max_concurrent_trials=2``, reporting one metric, with its
  results in a temporary folder.

    pip install "ray[tune]"   # Tune is not in Ray's core install
    python bench/bench_ray_dispatch.py [--units 16] [--rounds 3]

Prints each way's seconds per unit (the median over alternating rounds) beyond the unit's
own time (measured alone, without Ray).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1, not the host's IP

UNIT = (sys.executable, "-c", "pass")


def unit() -> int:
    return subprocess.run(UNIT, check=True).returncode


def alone(units: int) -> float:
    start = time.perf_counter()
    for _ in range(units):
        unit()
    return (time.perf_counter() - start) / units


def as_tasks(ray, units: int) -> float:
    remote = ray.remote(num_cpus=1)(unit)
    start = time.perf_counter()
    ray.get([remote.remote() for _ in range(units)])
    return time.perf_counter() - start


def as_trials(units: int) -> float:
    from ray import tune

    def trainable(config):
        unit()
        tune.report({"done": 1})

    with tempfile.TemporaryDirectory() as folder:
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space={"i": tune.grid_search(list(range(units)))},
            tune_config=tune.TuneConfig(max_concurrent_trials=2),
            run_config=tune.RunConfig(storage_path=folder, verbose=0),
        )
        start = time.perf_counter()
        tuner.fit()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import ray

    one = alone(4)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    times: dict[str, list[float]] = {"task": [], "tune": []}
    try:
        as_tasks(ray, 2)  # the workers started once, for both
        for r in range(args.rounds):
            for way in ("task", "tune") if r % 2 == 0 else ("tune", "task"):
                took = as_tasks(ray, args.units) if way == "task" else as_trials(args.units)
                times[way].append(took)
                print(f"  round {r + 1}: {way} {took:.2f} s for {args.units} units", flush=True)
    finally:
        ray.shutdown()
    ideal = one * args.units / 2  # 2 at once, with no cost of dispatch
    print(f"one unit alone: {one:.3f} s; {args.units} units 2 at once, ideally {ideal:.2f} s")
    for way, values in times.items():
        median = statistics.median(values)
        beyond = (median - ideal) / args.units
        print(f"{way}: median {median:.2f} s, {beyond:+.3f} s per unit beyond the ideal")


if __name__ == "__main__":
    main()
