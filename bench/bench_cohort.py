"""Cost of a DM2 cohort step on glyphs (the default glyph network, batch 112).

Times, in one process with L fake CPU devices and interleaved rounds:
  * ``sequential``: L independent runs one after the other (L x the plain single-model step),
  * ``1 device``: the cohort of L on one device (members vmapped),
  * ``L devices``: the cohort sharded over L devices (one member each, relation matrices
    all-gathered),
  * ``no mutual term``: the cohort on one device with lambda = 0 (relation matrices not computed),
and prints ms per step and ratios: cohort against sequential runs, and the mutual term's
overhead, then each step's model FLOPs, TFLOP/s and MFU (``jdml.throughput``; against one
device's peak: the fake devices share this host's cores). On this 2-core machine the L fake
devices share the same two cores, so the sharded cohort can only show its overhead here, not the
speed-up of L real accelerators.

``--heterogeneous`` times instead the three different networks of
``experiments/glyph_dm2_hetero.py``: each alone (its plain step), and their cohort (one step tracing
the three, relation matrices exchanged inside it) with and without the mutual term, against
the sum of the three plain steps.

Usage: python bench/bench_cohort.py [--members 4] [--steps 20] [--rounds 3] [--heterogeneous]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":
    _members = sys.argv[sys.argv.index("--members") + 1] if "--members" in sys.argv else "4"
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_members}")

import jax
import numpy as np

from configs.dm2 import get_config
from jdml.cohort.members import member_overrides
from jdml.config import set_keys
from jdml.run import Run
from jdml.throughput import model_flops, throughput_line


def _build(size: int, config: object = None, **overrides) -> tuple:
    """(run, its compiled step, its state, 4 batches, the step's model FLOPs)."""
    c = get_config(f"size={size}") if config is None else config
    with c.unlocked():
        c.train.progress_bar = False
    set_keys(c, overrides)
    run = Run(c)
    make = run.batch_maker()
    batches = [make(s) for s in range(4)]
    step = run.make_train_step()
    state = run.initial_state
    # a mesh program's step places the host batch, then calls its jitted step
    place = getattr(step, "place", lambda batch: batch)
    flops = model_flops(getattr(step, "jitted", step), state, place(batches[0]))
    state, _ = step(state, batches[0])  # compile
    jax.block_until_ready(state)
    return run, step, state, batches, flops


def _mfu_lines(cases: dict[str, list], ms: dict[str, float]) -> None:
    """Each case's model FLOPs, TFLOP/s and MFU."""
    for name, entry in cases.items():
        dtype = str(entry[0].config.model.dtype)
        print(throughput_line(name, entry[4], ms[name] / 1e3, dtype))


def _time(entry: list, steps: int) -> float:
    _, step, state, batches, _ = entry
    start = time.perf_counter()
    for i in range(steps):
        state, metrics = step(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    entry[2] = state
    return (time.perf_counter() - start) / steps * 1e3


def _heterogeneous(steps: int, rounds: int) -> None:
    """The cohort of three different networks against its members' plain steps."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(repo, "experiments"))  # the table's script
    from glyph_dm2_hetero import MEMBERS, _config

    cases = {}
    for name, spec in MEMBERS.items():
        alone = {"cohort.size": 1, "cohort.members": (), **member_overrides(spec)}
        cases[f"{name} alone"] = list(_build(1, _config("md+vd", 0, 1), **alone))
    cases["heterogeneous cohort"] = list(_build(3, _config("md+vd", 0, 1)))
    cases["heterogeneous cohort, no mutual term"] = list(_build(3, _config("independent", 0, 1)))
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, entry in cases.items():
            times[name].append(_time(entry, steps))
    ms = {name: float(np.median(t)) for name, t in times.items()}
    alone = sum(v for k, v in ms.items() if k.endswith(" alone"))
    print(f"three different networks, glyphs, batch 112, median of {rounds} rounds x {steps}")
    print(f"{'':40s} {'ms/step':>9s} {'vs sum alone':>13s}")
    for name, value in ms.items():
        print(f"{name:40s} {value:9.1f} {value / alone:13.2f}")
    print(f"{'sum of the three alone':40s} {alone:9.1f} {1.0:13.2f}")
    _mfu_lines(cases, ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heterogeneous", action="store_true")
    args = parser.parse_args()
    if args.heterogeneous:
        _heterogeneous(args.steps, args.rounds)
        return
    size = args.members
    if len(jax.devices()) < size:
        sys.exit(f"needs {size} devices; run with XLA_FLAGS=--xla_force_host_platform_device_count")
    cases = {
        "single model (plain step)": list(_build(1)),
        "cohort, 1 device": list(_build(size, **{"cohort.devices": 1})),
        f"cohort, {size} devices": list(_build(size, **{"cohort.devices": size})),
        "cohort, 1 device, no mutual term": list(
            _build(size, **{"cohort.devices": 1, "exchange.dm2.mutual_weight": 0.0})
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, entry in cases.items():
            times[name].append(_time(entry, args.steps))
    ms = {name: float(np.median(t)) for name, t in times.items()}
    sequential = size * ms["single model (plain step)"]
    print(f"cohort of {size}, glyphs, batch 112, median of {args.rounds} rounds x {args.steps}")
    print(f"{'':36s} {'ms/step':>9s} {'vs sequential':>14s}")
    print(f"{f'{size} sequential independent runs':36s} {sequential:9.1f} {1.0:14.2f}")
    for name, value in ms.items():
        if name.startswith("cohort"):
            print(f"{name:36s} {value:9.1f} {value / sequential:14.2f}")
    overhead = ms["cohort, 1 device"] / ms["cohort, 1 device, no mutual term"]
    print(f"mutual term overhead (1 device): x{overhead:.3f}")
    _mfu_lines(cases, ms)


if __name__ == "__main__":
    main()
