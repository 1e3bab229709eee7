"""Fine-tuning speed of the emoji protocol: images/s per input size and number of frozen stages.

For each input size in ``--sizes`` and each ``model.frozen_stages`` in ``--frozen``, builds the
``data=emoji`` run (ImageNet-pretrained EfficientNet-Lite0, frozen BN, margin loss with
distance-weighted mining, Adam, batch 112) and times, on one real augmented batch:

* ``train``: the full jitted, state-donating train step of the run;
* ``embed``: the jitted embedding pass of evaluation, at ``--embed-batch``;
* ``torch train`` / ``torch embed`` (only if PyTorch is importable): the same network in
  PyTorch eager (channels_last, the same ImageNet weights, BatchNorm in eval mode with trainable
  affine parameters, the same 128-d L2-normalised head), forward/backward/Adam with a plain
  pairwise margin loss (no mining), and its no-grad embedding pass, as the outside reference.
  Frozen stages run under ``torch.no_grad`` with their parameters out of the optimiser. The
  pooled features of both on the same images are compared first (max abs difference printed).

The settings run in turn within each round (so that machine load affects them alike); every
figure is the median over ``--repeats`` rounds of ``--steps`` calls after a warm-up. Then jdml's
model FLOPs, TFLOP/s and MFU of each setting (``jdml.throughput``). Needs the emoji data
(``python -m jdml data fetch emoji``).

Usage: python bench/bench_finetune_speed.py [--sizes 64,96,128] [--frozen -1,3] [--repeats 3]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from configs.revisiting import get_config
from jdml.allocator import reexec_with_tcmalloc
from jdml.models.efficientnet import (
    BN_EPS,
    HEAD_CHANNELS,
    LITE0_STAGES,
    STEM_CHANNELS,
    EfficientNetLite0,
)
from jdml.models.pretrained.efficientnet import packaged_weights
from jdml.run import Run
from jdml.step import make_train_step
from jdml.throughput import FlopCount, alternating_rounds, model_flops, throughput_line


def contenders(
    size: int, frozen: int, embed_batch: int
) -> tuple[dict[str, Callable[[], None]], dict[str, tuple[FlopCount, str]]]:
    """The train step and the embedding pass of the emoji run at ``size`` px, and jdml's two
    with their model FLOPs and compute dtype."""
    config = get_config("data=emoji")
    config.unlock()
    config.data.image_size = size
    config.model.frozen_stages = frozen
    run = Run(config)
    make_batch = run.batch_maker()
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

    def pooled() -> np.ndarray:
        variables = {"params": params["model"]["backbone"], "batch_stats": stats["backbone"]}
        return np.asarray(EfficientNetLite0().apply(variables, images[:16]))

    fns = {"train": train, "embed": embed}
    dtype = str(config.model.dtype)
    work = {
        "train": (model_flops(step, state[0], batch), dtype),
        "embed": (model_flops(run.embed_fn, params, stats, images), dtype),
    }
    host_batch = {k: np.asarray(v) for k, v in batch.items()}
    torch_fns = torch_contenders(size, frozen, host_batch, np.asarray(images), pooled)
    return {**fns, **torch_fns}, work


def _torch_lite0(frozen: int):
    """EfficientNet-Lite0 in PyTorch with the packaged ImageNet weights (None without torch)."""
    try:
        import torch
        import torch.nn.functional as F
        from torch import nn
    except ImportError:
        return None

    def same_pad(x, kernel: int, stride: int):
        """TensorFlow "SAME" padding (the odd pixel after), as the JAX model pads."""
        pads = []
        for size in (x.shape[3], x.shape[2]):  # F.pad takes the last axis first
            out = -(-size // stride)
            total = max((out - 1) * stride + kernel - size, 0)
            pads += [total // 2, total - total // 2]
        return F.pad(x, pads)

    def bn(channels: int):
        return nn.BatchNorm2d(channels, eps=BN_EPS)

    class Block(nn.Module):
        def __init__(self, cin, cout, kernel, stride, expansion) -> None:
            super().__init__()
            mid = cin * expansion
            if expansion != 1:
                self._expand_conv, self._bn0 = nn.Conv2d(cin, mid, 1, bias=False), bn(mid)
            self.kernel, self.stride, self.residual = kernel, stride, stride == 1 and cin == cout
            # Stride 1: SAME is the symmetric k // 2 inside the conv; stride 2 pads explicitly.
            pad = kernel // 2 if stride == 1 else 0
            self._depthwise_conv = nn.Conv2d(mid, mid, kernel, stride, pad, groups=mid, bias=False)
            self._bn1 = bn(mid)
            self._project_conv, self._bn2 = nn.Conv2d(mid, cout, 1, bias=False), bn(cout)

        def forward(self, x):
            y = x
            if hasattr(self, "_expand_conv"):
                y = F.relu6(self._bn0(self._expand_conv(y)))
            y = self._depthwise_conv(y if self.stride == 1 else same_pad(y, self.kernel, 2))
            y = self._bn2(self._project_conv(F.relu6(self._bn1(y))))
            return y + x if self.residual else y

    class Lite0(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._conv_stem = nn.Conv2d(3, STEM_CHANNELS, 3, 2, bias=False)
            self._bn0 = bn(STEM_CHANNELS)
            blocks, self.stage_ends = [], []
            for repeats, kernel, stride, expansion, cin, cout in LITE0_STAGES:
                for r in range(repeats):
                    first = r == 0
                    blocks.append(
                        Block(cin if first else cout, cout, kernel, stride if first else 1,
                              expansion)
                    )  # fmt: skip
                self.stage_ends.append(len(blocks))
            self._blocks = nn.ModuleList(blocks)
            self._conv_head = nn.Conv2d(LITE0_STAGES[-1][-1], HEAD_CHANNELS, 1, bias=False)
            self._bn1 = bn(HEAD_CHANNELS)
            self.embed = nn.Linear(HEAD_CHANNELS, 128)

        def frozen_part(self, x):
            x = F.relu6(self._bn0(self._conv_stem(same_pad(x, 3, 2))))
            for block in self._blocks[: self.stage_ends[frozen - 1] if frozen > 0 else 0]:
                x = block(x)
            return x

        def pooled(self, x):
            if frozen >= 0:
                with torch.no_grad():
                    x = self.frozen_part(x)
            else:
                x = self.frozen_part(x)
            start = self.stage_ends[frozen - 1] if frozen > 0 else 0
            for block in self._blocks[start:]:
                x = block(x)
            return F.relu6(self._bn1(self._conv_head(x))).mean((2, 3))

        def forward(self, x):
            return F.normalize(self.embed(self.pooled(x)), dim=1)

    torch.manual_seed(0)
    net = Lite0()
    state = torch.load(packaged_weights(), map_location="cpu", weights_only=True)
    missing = net.load_state_dict(state, strict=False).missing_keys
    assert set(missing) == {"embed.weight", "embed.bias"}, missing
    net.eval()  # BatchNorm on its running statistics: the papers' frozen BN
    return torch, net.to(memory_format=torch.channels_last)


def torch_contenders(
    size: int, frozen: int, batch: dict, images: np.ndarray, check: Callable[[], np.ndarray]
) -> dict[str, Callable[[], None]]:
    """The PyTorch train step and embedding pass of the same network, or {} without torch."""
    built = _torch_lite0(frozen)
    if built is None:
        return {}
    torch, net = built
    torch.set_num_threads(2)

    def nchw(x) -> torch.Tensor:
        array = np.array(x, np.float32)  # a writable copy
        return (
            torch.from_numpy(array)
            .permute(0, 3, 1, 2)
            .contiguous(memory_format=torch.channels_last)
        )

    with torch.no_grad():  # the same network: pooled features on the same images
        ours, theirs = check(), net.pooled(nchw(images[:16])).numpy()
    print(f"{size} px: torch against jdml pooled features, max abs diff "
          f"{np.abs(ours - theirs).max():.2e}")  # fmt: skip
    trainable = [p for n, p in net.named_parameters() if _torch_trainable(n, net, frozen)]
    opt = torch.optim.Adam(trainable, lr=1e-4, weight_decay=4e-4)
    x, labels = nchw(batch["images"]), torch.from_numpy(np.asarray(batch["labels"]))
    same = labels[:, None] == labels[None, :]
    x_embed = nchw(images)

    def train() -> None:
        z = net(x)
        d = torch.cdist(z, z)
        loss = torch.where(same, torch.relu(d - 0.6), torch.relu(1.2 - d)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def embed() -> None:
        with torch.no_grad():
            net(x_embed)

    return {"torch train": train, "torch embed": embed}


def _torch_trainable(name: str, net, frozen: int) -> bool:
    """Whether parameter ``name`` is trained with ``frozen`` stages frozen."""
    if frozen < 0:
        return True
    if name.startswith(("_conv_stem", "_bn0")):
        return False
    if name.startswith("_blocks."):
        index = int(name.split(".")[1])
        return index >= (net.stage_ends[frozen - 1] if frozen > 0 else 0)
    return True


def main() -> None:
    reexec_with_tcmalloc()  # XLA's per-step buffers without page faults (jdml.allocator)
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
    fns, work = {}, {}
    for size in sizes:
        for f in frozen:
            parts, counts = contenders(size, f, args.embed_batch)
            for part, fn in parts.items():
                if part.endswith("embed") and f != frozen[0]:
                    continue  # freezing does not change the forward pass
                fns[(part, size, f)] = fn
                if part in counts:
                    work[(part, size, f)] = counts[part]
    times = alternating_rounds(fns, args.repeats, calls=args.steps)
    rate = {}
    for (part, size, f), timing in times.items():
        count = 112 if part.endswith("train") else args.embed_batch
        rate[part, size, f] = count / timing.median
    print(f"{'':<11} {'size':>6}  {'frozen_stages':>13}  {'jdml':>8}  {'torch':>8}  jdml/torch")
    for (part, size, f), value in rate.items():
        if part.startswith("torch"):
            continue
        other = rate.get((f"torch {part}", size, f))
        versus = f"{other:8.0f}  {value / other:10.2f}" if other else f"{'-':>8}  {'-':>10}"
        label = f"{f:>13}" if part == "train" else f"{'':>13}"
        print(f"{part + ' img/s':<11} {size:>4}px  {label}  {value:8.0f}  {versus}")
    print()
    for (part, size, f), (flops, dtype) in work.items():
        name = f"jdml {part} {size}px frozen_stages {f}"
        print(throughput_line(name, flops, times[part, size, f].median, dtype))


if __name__ == "__main__":
    main()
