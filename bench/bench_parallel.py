"""Data parallelism on 1, 2 and 4 (fake CPU) devices: the train step, the cost of gathering the
embeddings for global-batch mining, and the evaluator.

In one process with 4 fake CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``,
set here), for the default glyph network and batch (112) with ``parallel.data_devices`` K = 1,
2 and 4, interleaved rounds:
  * ``step``: ms per train step (the miner and the loss see the gathered global batch),
  * ``gather``: ms of the gather the step adds for them: the (112, 128) embeddings all-gathered
    over the data axis and their cotangent reduce-scattered back (the same collectives, alone),
  * ``gather / step``: that overhead as a fraction of the step,
  * ``evaluation``: seconds to embed the test split and compute its metrics with the evaluator
    on K devices (``parallel.eval_devices``),
  * whether the step's loss and the metrics equal K = 1.

The K fake devices share this machine's two cores, so these figures show correctness and the
overhead of the collectives, not the speed-up K accelerators give.

Then each step's model FLOPs (the global batch's), TFLOP/s and MFU (``jdml.throughput``),
against one device's peak, since the fake devices share the host's cores.

Usage: python bench/bench_parallel.py [--steps 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs.revisiting import get_config
from jdml.mesh import DATA
from jdml.run import Run
from jdml.throughput import model_flops, throughput_line

DEVICES = (1, 2, 4)


def _build(devices: int) -> dict:
    c = get_config()
    with c.unlocked():
        c.train.progress_bar = False
        c.parallel.data_devices = devices
        c.parallel.eval_devices = devices
    run = Run(c)
    make = run.batch_maker()
    batches = [make(s) for s in range(4)]
    step = run.make_train_step()
    state = run.prepare(run.initial_state)
    # a mesh program's step places the host batch, then calls its jitted step
    place = getattr(step, "place", lambda batch: batch)
    flops = model_flops(getattr(step, "jitted", step), state, place(batches[0]))
    state, metrics = step(state, batches[0])  # compiles
    jax.block_until_ready(state)
    return {
        "run": run,
        "step": step,
        "state": state,
        "batches": batches,
        "loss": float(metrics["loss"]),
        "gather": _gather_fn(run, devices),
        "flops": flops,
    }


def _gather_fn(run: Run, devices: int):
    """The embeddings' all-gather over the data axis and its transpose, jitted, or None for one
    device (nothing to gather)."""
    if devices == 1:
        return None
    mesh = run.program.placement.mesh
    batch, dim = int(run.config.train.batch_size), int(run.config.model.embed_dim)
    x = jax.device_put(np.ones((batch, dim), np.float32), NamedSharding(mesh, P(DATA)))

    def gathered(x):
        return jax.lax.all_gather(x, DATA, tiled=True)

    def loss(x):
        g = jax.shard_map(gathered, mesh=mesh, in_specs=P(DATA), out_specs=P(), check_vma=False)
        return jnp.sum(g(x) ** 2)

    fn = jax.jit(jax.grad(loss))
    jax.block_until_ready(fn(x))
    return lambda: fn(x)


def _time_steps(entry: dict, steps: int) -> float:
    state, batches = entry["state"], entry["batches"]
    start = time.perf_counter()
    for i in range(steps):
        state, metrics = entry["step"](state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    entry["state"] = state
    return (time.perf_counter() - start) / steps * 1e3


def _time_gather(entry: dict, steps: int) -> float:
    if entry["gather"] is None:
        return 0.0
    start = time.perf_counter()
    for _ in range(steps):
        out = entry["gather"]()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / steps * 1e3


def _evaluate(entry: dict) -> tuple[float, dict]:
    run = entry["run"]
    start = time.perf_counter()
    results = run.evaluate(entry["state"], {"test": run.splits["test"]}).metrics
    return time.perf_counter() - start, results["test"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if len(jax.devices()) < max(DEVICES):
        sys.exit(
            f"error: needs {max(DEVICES)} devices; run with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={max(DEVICES)}"
        )
    cases = {k: _build(k) for k in DEVICES}
    steps = {k: [] for k in DEVICES}
    gathers = {k: [] for k in DEVICES}
    evals = {k: [] for k in DEVICES}
    metrics = {}
    for _ in range(args.rounds):
        for k, entry in cases.items():
            steps[k].append(_time_steps(entry, args.steps))
            gathers[k].append(_time_gather(entry, args.steps))
    for entry in cases.values():  # the same state for every K: evaluate the K = 1 state
        entry["state"] = cases[1]["state"]
    for _ in range(args.rounds):
        for k, entry in cases.items():
            seconds, metrics[k] = _evaluate(entry)
            evals[k].append(seconds)
    med = lambda xs: float(np.median(xs))  # noqa: E731
    print(
        f"glyphs, batch {cases[1]['run'].config.train.batch_size}, median of {args.rounds} "
        f"rounds x {args.steps} steps; {len(jax.devices())} fake CPU devices on "
        f"{os.cpu_count()} cores"
    )
    header = (
        f"{'K':>3s} {'step ms':>9s} {'vs K=1':>7s} {'gather ms':>10s} {'gather/step':>12s} "
        f"{'eval s':>8s} {'vs K=1':>7s}  first loss = K=1   metrics = K=1"
    )
    print(header)
    for k in DEVICES:
        step, gather, ev = med(steps[k]), med(gathers[k]), med(evals[k])
        same_loss = np.isclose(cases[k]["loss"], cases[1]["loss"], rtol=1e-5)
        same_metrics = all(
            np.isclose(metrics[k][m], metrics[1][m], rtol=1e-6, atol=1e-7) for m in metrics[1]
        )
        print(
            f"{k:3d} {step:9.1f} {step / med(steps[1]):7.2f} {gather:10.2f} "
            f"{gather / step:12.3f} {ev:8.2f} {ev / med(evals[1]):7.2f}  "
            f"{bool(same_loss)!s:17s} {bool(same_metrics)}"
        )
    for k, entry in cases.items():
        dtype = str(entry["run"].config.model.dtype)
        print(throughput_line(f"K={k} step", entry["flops"], med(steps[k]) / 1e3, dtype))


if __name__ == "__main__":
    main()
