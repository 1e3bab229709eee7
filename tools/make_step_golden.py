"""Records the train step's numbers for three runs, bit for bit: the guard of the member spine's
refactors.

Three runs of the tiny glyph-like fixture (``tests.helpers.make_npz``, 16 px, 12 classes), each
trained 4 steps from its initial state on the batches of its own sampler, with 4 simulated CPU
devices (as the tests have):

* ``plain``: one member;
* ``stacked``: a DM2 cohort of 2 identical members, one on each of 2 devices (every diversity
  on, the mutual weight from the first step);
* ``listed``: a heterogeneous DM2 cohort of 2 (the second member with an 8-d embedding), its
  batch split over 2 devices.

For each it records every step's metrics and the final params, batch statistics, optimiser
state and method state. ``tests/test_step_golden.py`` trains the same runs again and requires
every number to be identical to the last bit on a CPU with the same AVX-512 support as the one
the record was made on (elsewhere: to 1e-5). Run it before a change that must keep the step's
numbers, commit the record, then make the change.

    python tools/make_step_golden.py [--out tests/golden/step/bitwise.npz]
    python tools/make_step_golden.py --check   # this tree against the record: a table
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    )

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jdml.run import Run
from tests.helpers import cpu_kind, make_npz, recorded_cpu_kind, tiny_config

STEPS = 4
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "step", "bitwise.npz")
COHORT = {"cohort.size": 2, "exchange.dm2.warmup_epochs": 0.0}
RUNS: dict[str, dict[str, object]] = {
    "plain": {},
    "stacked": {**COHORT, "cohort.devices": 2},
    # A heterogeneous cohort keeps both members on every device: the batch is split instead.
    "listed": {
        **COHORT,
        "cohort.members": ("", "model.embed_dim=8"),
        "parallel.data_devices": 2,
    },
}


def compute(name: str, npz: str) -> dict[str, np.ndarray]:
    """Run ``name``'s metrics per step and its final state, as flat named arrays."""
    run = Run(tiny_config(npz, **RUNS[name]))
    step = run.make_train_step()
    state = run.prepare(run.initial_state)
    make = run.batch_maker()
    record: dict[str, np.ndarray] = {}
    for s in range(STEPS):
        state, metrics = step(state, {k: jnp.asarray(v) for k, v in make(s).items()})
        for key, value in metrics.items():
            record[f"step{s}/{key}"] = np.asarray(value)
    fields = {
        "params": state.params,
        "batch_stats": state.batch_stats,
        "opt_state": state.opt_state,
        "method_state": state.method_state,
    }
    for field, tree in fields.items():
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            if hasattr(leaf, "dtype"):
                record[f"{field}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
    return record


def check(record: str) -> None:
    """Prints, per run, how many of the record's arrays this tree reproduces bit for bit, and
    the largest absolute difference of the others."""
    with np.load(record) as f:
        made_on = recorded_cpu_kind(f)
        recorded = {k: f[k] for k in f.files if ":" in k}
    print(f"record {record} (made on a CPU of kind {made_on}; this one: {cpu_kind()})")
    print("run       arrays  bit-identical  max |difference|")
    with tempfile.TemporaryDirectory() as scratch:
        npz = make_npz(os.path.join(scratch, "tiny.npz"))
        for name in RUNS:
            want = {k.split(":", 1)[1]: v for k, v in recorded.items() if k.startswith(f"{name}:")}
            now = compute(name, npz)
            keys = sorted(set(want) | set(now))
            same = sum(k in now and k in want and np.array_equal(now[k], want[k]) for k in keys)
            worst = max(
                (
                    float(np.max(np.abs(now[k].astype(np.float64) - want[k])))
                    for k in keys
                    if k in now and k in want and now[k].size
                ),
                default=0.0,
            )
            print(f"{name:8s} {len(keys):7d} {same:14d}  {worst:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--check", action="store_true", help="compare with the record at --out")
    args = parser.parse_args()
    if args.check:
        check(args.out)
        return
    arrays = {"cpu_kind": np.asarray(cpu_kind())}
    with tempfile.TemporaryDirectory() as scratch:
        npz = make_npz(os.path.join(scratch, "tiny.npz"))
        for name in RUNS:
            for key, value in compute(name, npz).items():
                arrays[f"{name}:{key}"] = value
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}: {len(RUNS)} runs, {len(arrays)} arrays")


if __name__ == "__main__":
    main()
