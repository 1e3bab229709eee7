"""Fine-tuning speed of the emoji protocol: images/s per input size and number of frozen stages.

For each input size in ``--sizes`` and each ``model.frozen_stages`` in ``--frozen``, builds the
``data=emoji`` run (ImageNet-pretrained EfficientNet-Lite0, frozen BN, margin loss with
distance-weighted mining, Adam, batch 112) and times, on one real augmented batch:

* ``train``: the full jitted, state-donating train step of the run;
* ``embed``: the jitted embedding pass of evaluation, at ``--embed-batch``.

The settings run in turn within each round (so that machine load affects them alike); every
figure is the median over ``--repeats`` rounds of ``--steps`` calls after a warm-up. Needs the
emoji data (``python -m jdml data fetch emoji``).

Usage: python bench/bench_finetune_speed.py [--sizes 64,96,128] [--frozen -1,3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from configs.revisiting import get_config
from jdml.data.pipeline import TrainBatch
from jdml.run import Run
from jdml.step import make_train_step


def contenders(size: int, frozen: int, embed_batch: int) -> dict[str, Callable[[], None]]:
    """The train step and the embedding pass of the emoji run at ``size`` px."""
    config = get_config("data=emoji")
    config.unlock()
    config.data.image_size = size
    config.model.frozen_stages = frozen
    run = Run(config)
    make_batch = TrainBatch(
        data=run.splits["train"], sampler=run.sampler, augment=run.augment, seed=0
    )
    batch = {k: jnp.asarray(v) for k, v in make_batch(0).items()}
    step = make_train_step(run.method, run.tx)
    state = [jax.tree.map(jnp.copy, run.initial_state)]
    test = run.splits["test"]
    images = jnp.asarray(test.eval_images(np.arange(embed_batch) % len(test)))
    params, stats = run.initial_state.params, run.initial_state.batch_stats

    def train() -> None:
        state[0], metrics = step(state[0], batch)
        jax.block_until_ready(metrics)

    def embed() -> None:
        jax.block_until_ready(run.embed_fn(params, stats, images))

    return {"train": train, "embed": embed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64,96,128")
    parser.add_argument("--frozen", default="-1,3", help="model.frozen_stages values")
    parser.add_argument("--embed-batch", type=int, default=500)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    frozen = [int(f) for f in args.frozen.split(",")]
    print(f"backend {jax.default_backend()}, {jax.device_count()} device(s), batch 112")
    fns = {}
    for size in sizes:
        for f in frozen:
            for part, fn in contenders(size, f, args.embed_batch).items():
                if part == "embed" and f != frozen[0]:
                    continue  # freezing does not change the forward pass
                fn()  # compile and warm up
                fns[(part, size, f)] = fn
    times: dict[tuple, list[float]] = {key: [] for key in fns}
    for _ in range(args.repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn()
            times[key].append((time.perf_counter() - t0) / args.steps)
    for (part, size, f), ts in times.items():
        ms = statistics.median(ts) * 1e3
        count = 112 if part == "train" else args.embed_batch
        label = f"frozen_stages {f:>2}" if part == "train" else "                 "
        print(f"{part:<5} {size:>3} px  {label}  {ms:8.0f} ms  {count / ms * 1e3:6.0f} images/s")


if __name__ == "__main__":
    main()
