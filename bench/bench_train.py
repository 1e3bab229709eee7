"""Training throughput of the default glyph baseline at batch 112, with reference runs.

Times, in the same process and on the same batch:

* ``jdml step``: the full jitted train step (forward, distance-weighted mining, margin loss,
  backward, Adam with coupled weight decay, the non-finite guard), state donated;
* ``backbone only``: the same network's forward/backward/Adam with a plain sum-of-squares loss,
  so the ratio shows what mining and the loss add;
* ``input pipeline``: the grain pipeline alone (SPC-2 sampling, gather, affine augmentation);
* ``torch eager`` (only if PyTorch is importable): the same backbone written in PyTorch, eager,
  forward/backward/Adam with the sum-of-squares loss, as an outside reference point.

Every figure is the median of ``--repeats`` rounds of ``--steps`` steps after a warm-up, and the
contenders run in turn so that machine load affects them alike.

Usage: python bench/bench_train.py [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs.revisiting import get_config
from jdml.data.pipeline import TrainBatch, train_batches
from jdml.run import Run
from jdml.step import make_train_step


def _torch_step(config, batch_np: np.ndarray) -> Callable[[], None] | None:
    try:
        import torch
        from torch import nn
    except ImportError:
        return None
    torch.manual_seed(0)
    m = config.model

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.proj = None
            if stride != 1 or cin != cout:
                self.proj = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + (self.proj(x) if self.proj is not None else x))

    layers = [
        nn.Conv2d(1, m.stem_features, 3, m.stem_strides, 1, bias=False),
        nn.BatchNorm2d(m.stem_features),
        nn.ReLU(),
    ]
    cin = m.stem_features
    for feat, blocks, stride in zip(m.stage_features, m.stage_blocks, m.stage_strides, strict=True):
        for j in range(blocks):
            layers.append(Block(cin, feat, stride if j == 0 else 1))
            cin = feat
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 128))
    net = net.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=4e-4)
    x = torch.from_numpy(batch_np).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = net(x).square().sum()
        loss.backward()
        opt.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    config = get_config()
    run = Run(config)
    bs = config.train.batch_size
    make_batch = TrainBatch(
        data=run.splits["train"],
        sampler=run.sampler,
        augment=run.augment,
        seed=0,
    )
    batch = {k: jnp.asarray(v) for k, v in make_batch(0).items()}

    step = make_train_step(run.method, run.tx)
    state = [jax.tree.map(jnp.copy, run.initial_state)]

    def jdml_step() -> None:
        state[0], metrics = step(state[0], batch)
        jax.block_until_ready(metrics)

    tx = optax.adam(1e-3)
    model = run.method.train_model
    params0 = run.initial_state.params["model"]
    plain = [(params0, run.initial_state.batch_stats, tx.init(params0))]

    @jax.jit
    def plain_update(params, stats, opt_state, images):
        def loss_fn(p):
            out, upd = model.apply(
                {"params": p, "batch_stats": stats},
                run.method.preprocess(images),
                mutable=["batch_stats"],
            )
            return jnp.sum(jnp.square(out[run.method.head])), upd["batch_stats"]

        (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state

    def backbone_step() -> None:
        p, s, o = plain[0]
        plain[0] = jax.block_until_ready(plain_update(p, s, o, batch["images"]))

    pipe_iter = [None]

    def pipeline_step() -> None:
        if pipe_iter[0] is None:
            pipe_iter[0] = train_batches(
                make_batch, start_step=0, total_steps=10**9, num_threads=2, prefetch=4
            )
        next(pipe_iter[0])

    contenders: dict[str, Callable[[], None]] = {
        "jdml step": jdml_step,
        "backbone only": backbone_step,
        "input pipeline": pipeline_step,
    }
    torch_step = _torch_step(config, np.asarray(batch["images"]))
    if torch_step is not None:
        contenders["torch eager"] = torch_step

    for fn in contenders.values():  # warm-up (compilation)
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                fn()
            times[name].append((time.perf_counter() - start) / args.steps)

    ref = statistics.median(times["jdml step"])
    print(f"batch {bs}, {args.steps} steps x {args.repeats} rounds, median per step")
    print(f"{'':16s} {'ms/step':>9s} {'images/s':>9s} {'time / jdml step':>17s}")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name:16s} {1e3 * t:9.1f} {bs / t:9.0f} {t / ref:17.2f}")
    if torch_step is None:
        print("torch eager: PyTorch not installed (pip install torch==2.13.0 to compare)")


if __name__ == "__main__":
    main()
