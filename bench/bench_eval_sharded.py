"""Memory per device of the sharded exact kNN (``jdml.evaluation.sharded``) on D = 1, 2, 4 devices.

At the scale of Stanford Online Products (60,000 x 512 float32 embeddings in classes of about
5, leave-one-out, k = 32) each device count runs in its own process with
``XLA_FLAGS=--xla_force_host_platform_device_count=D`` (the device count is fixed when JAX
starts). Each process compiles the sharded kNN program for its mesh and reads the compiled
program's memory per device (``memory_analysis()``: arguments + outputs + temporaries), then
runs it once and times it, and saves the neighbours; the process of the first D also runs the
one-device search ``jdml.evaluation.knn.knn``. The parent prints a table with the ratios to
D = 1 and checks that every D found the neighbours of D = 1 and of the one-device search, in
the same order, and the same distances. For comparison, the title gives what every device
would hold if it kept all N references (the alternative to passing them around a ring): N x
(d + 1) floats.

On a CPU host the fake devices share its cores: the table shows the memory per device and the
results, not a speed-up (the wall time does not fall with D, and rises with the load of other
processes). On real devices the same program divides the work by D.

Usage: python bench/bench_eval_sharded.py [--n 60000] [--dim 512] [--k 32] [--devices 1,2,4]
           [--skip-one-device]
       (about 40 s per device count and 40 s for the one-device search at the default size on
       2 CPU cores, about 3 minutes in all; --n 10000 for a quick run)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

CLASS_SIZE = 5


def embeddings(n: int, dim: int, seed: int) -> np.ndarray:
    """(n, dim) float32 points in classes of ``CLASS_SIZE``: a random centre per class plus
    noise of the same scale, so that neighbours are mostly but not only of the same class."""
    rng = np.random.default_rng(seed)
    classes = np.arange(n) // CLASS_SIZE
    centres = rng.standard_normal((classes[-1] + 1, dim), dtype=np.float32)
    return centres[classes] + rng.standard_normal((n, dim), dtype=np.float32)


def worker(args: argparse.Namespace) -> None:
    """One device count: the compiled program's memory, one timed run, the neighbours saved."""
    import jax

    from jdml.backends import resolve_backends
    from jdml.evaluation.knn import knn
    from jdml.evaluation.sharded import eval_mesh, knn_program, shard_rows

    mesh = eval_mesh(0)
    x = embeddings(args.n, args.dim, args.seed)
    program, inputs = knn_program(
        args.n, None, args.dim, args.k, mesh=mesh, exclude_self=True, distance="euclidean"
    )
    start = time.perf_counter()
    compiled = program.lower(*inputs).compile()
    compile_s = time.perf_counter() - start
    stats = compiled.memory_analysis()
    placed = shard_rows(x, mesh, inputs[0].shape[0] // mesh.size)
    start = time.perf_counter()
    distances, indices = jax.block_until_ready(compiled(placed))
    run_s = time.perf_counter() - start
    np.save(os.path.join(args.out, f"indices{mesh.size}.npy"), np.asarray(indices)[: args.n])
    np.save(os.path.join(args.out, f"distances{mesh.size}.npy"), np.asarray(distances)[: args.n])
    one_device_s = None
    if args.one_device:
        start = time.perf_counter()
        selection = resolve_backends().knn  # the one-device evaluator's
        distances, indices = knn(x, x, args.k, exclude_self=True, selection=selection)
        one_device_s = time.perf_counter() - start
        np.save(os.path.join(args.out, "indices_knn.npy"), np.asarray(indices))
        np.save(os.path.join(args.out, "distances_knn.npy"), np.asarray(distances))
    print(
        json.dumps(
            {
                "devices": mesh.size,
                "arguments": stats.argument_size_in_bytes,
                "outputs": stats.output_size_in_bytes,
                "temporaries": stats.temp_size_in_bytes,
                "compile_s": compile_s,
                "run_s": run_s,
                "one_device_s": one_device_s,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60000, help="embeddings (queries = references)")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--devices", default="1,2,4", help="device counts, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip-one-device", action="store_true", help="do not compare with knn (one device)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--one-device", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    counts = [int(d) for d in args.devices.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for devices in counts:
            env = dict(os.environ)
            env["XLA_FLAGS"] = (
                env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
            ).strip()
            command = [sys.executable, __file__, "--worker", "--out", out]
            command += ["--n", str(args.n), "--dim", str(args.dim), "--k", str(args.k)]
            command += ["--seed", str(args.seed)]
            if devices == counts[0] and not args.skip_one_device:
                command.append("--one-device")
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"D={devices} failed:\n{done.stderr}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(
                f"D={devices} done in {rows[-1]['compile_s'] + rows[-1]['run_s']:.0f} s", flush=True
            )
        base = counts[0]
        references = [str(base)] + ([] if args.skip_one_device else ["_knn"])
        same = {}
        for devices in counts:
            indices = np.load(os.path.join(out, f"indices{devices}.npy"))
            distances = np.load(os.path.join(out, f"distances{devices}.npy"))
            for name in references:
                reference_i = np.load(os.path.join(out, f"indices{name}.npy"))
                reference_d = np.load(os.path.join(out, f"distances{name}.npy"))
                same[devices, name] = (
                    int(np.sum(np.any(indices != reference_i, axis=1))),
                    float(np.max(np.abs(distances - reference_d))),
                )

    mb = 1e6
    replicated = args.n * (args.dim + 1) * 4 / mb
    print(
        f"\nsharded exact kNN, {args.n:,} x {args.dim} float32, k={args.k}, leave-one-out "
        f"(references held by every device if replicated: {replicated:.0f} MB)\n"
    )
    header = (
        f"{'D':>2}  {'args MB':>8}  {'out MB':>7}  {'temp MB':>8}  {'total MB':>9}  "
        f"{'vs D=' + str(base):>7}  {'x D':>5}  {'compile s':>9}  {'run s':>7}  "
        + "  ".join(f"{'rows != ' + _label(n):>13}  {'max |dd|':>8}" for n in references)
    )
    print(header)
    print("-" * len(header))
    first = None
    for row in rows:
        total = row["arguments"] + row["outputs"] + row["temporaries"]
        first = first or total
        ratio = total / first
        checks = "  ".join(
            f"{same[row['devices'], n][0]:>13}  {same[row['devices'], n][1]:>8.2g}"
            for n in references
        )
        print(
            f"{row['devices']:>2}  {row['arguments'] / mb:>8.1f}  {row['outputs'] / mb:>7.1f}  "
            f"{row['temporaries'] / mb:>8.1f}  {total / mb:>9.1f}  {ratio:>7.3f}  "
            f"{ratio * row['devices']:>5.2f}  {row['compile_s']:>9.1f}  {row['run_s']:>7.1f}  "
            + checks
        )
    print(
        "\nx D: the memory per device times D (1.0 = memory falls as 1/D). rows != ...: queries "
        "whose neighbours (indices, in order) differ; max |dd|: the largest distance difference."
        "\nFake CPU devices share the cores: the run time shows no speed-up."
    )
    if not args.skip_one_device:
        print(f"one-device knn: {rows[0]['one_device_s']:.1f} s")


def _label(name: str) -> str:
    """The column name of a reference result: ``D=1`` or ``knn``."""
    return "knn" if name == "_knn" else f"D={name}"


if __name__ == "__main__":
    main()
