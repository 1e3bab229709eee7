"""The vision transformer's training step against timm's in PyTorch eager, and its memory.

Times, in one process with alternating rounds (``jdml.throughput.alternating_rounds``) on the
same random batch:

* ``jdml step``: one jitted, state-donating step of the ViT backbone (``--model``, e.g.
  ``vit_s16``), a linear ``--embed``-d head, L2-normalised, ProxyAnchor (jdml's), and AdamW with
  the transformer recipe's parameter groups (no decay on 1-d parameters and tokens);
* ``torch eager`` (when torch and timm import): timm's model of the same name without its
  classifier, the same head, pytorch-metric-learning's ProxyAnchor when it imports (else the
  same formula written in torch), and ``torch.optim.AdamW``.

Both take the class token and run in float32 (``--dtype bfloat16`` for jdml's step only). It
prints the median seconds per step, the ratio, the model FLOPs, TFLOP/s and MFU of the jdml step
(``jdml/throughput.py``), and the compiled step's memory (``memory_analysis``: arguments,
outputs and temporaries) per image of the batch.

``--memory-only`` compiles the step without running it and prints the memory alone (e.g. ViT-B/16
at batch 180 in bfloat16, whose compile fits a CPU although its step would take minutes there).
``--jdml-only`` times jdml's step alone (on a GPU: that it trains at that batch, its time and
MFU; ``bench/bench_gpu.py --nets vit_s16,vit_b16`` compares it with PyTorch there).

``--conv xla,onednn`` times the step with XLA's products and with oneDNN's (``jdml.nn.matmul``,
a run's ``backends.conv``) in the same rounds; ``--forward`` times the forward pass alone
against timm's model under ``torch.inference_mode``.

Usage: python bench/bench_vit.py [--model vit_s16] [--batch 16] [--size 224] [--steps 2]
           [--repeats 3] [--dtype float32|bfloat16] [--memory-only] [--jdml-only]
           [--attention xla|cudnn] [--conv auto|xla|onednn[,...]] [--forward]
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jdml.geometry import l2_normalize
from jdml.losses import LOSSES
from jdml.models.vit import ARCHITECTURES, VisionTransformer
from jdml.throughput import alternating_rounds, model_flops, throughput_line

TIMM_NAMES = {
    "vit_s16": "vit_small_patch16_224",
    "vit_b16": "vit_base_patch16_224",
    "vit_s14_dinov2": "vit_small_patch14_dinov2",
    "vit_b14_dinov2": "vit_base_patch14_dinov2",
}
NO_DECAY = ("1d", "cls_token", "pos_embed", "reg_token")


def backbone_of(args: argparse.Namespace, conv: str) -> VisionTransformer:
    """The ViT of ``--model``, its products oneDNN's where ``conv`` (a ``backends.conv`` mode)
    enables them on this backend."""
    from jdml.native.switches import mode_enabled

    return VisionTransformer(
        ARCHITECTURES[args.model],
        dtype=jnp.dtype(args.dtype),
        attention=args.attention,
        native_conv=mode_enabled(conv, setting="--conv"),
    )


def jdml_step(args: argparse.Namespace, classes: int, conv: str = "auto"):
    """The jitted step, its initial state and a batch."""
    from jdml.optim import decay_mask

    backbone = backbone_of(args, conv)
    loss = LOSSES.get("proxyanchor")(num_classes=classes)
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.standard_normal((args.batch, args.size, args.size, 3)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, classes, args.batch), jnp.int32)
    key = jax.random.key(0)
    backbone_params = backbone.init(key, images[:1])["params"]
    features = ARCHITECTURES[args.model].dim
    params = {
        "backbone": backbone_params,
        "head": {
            "kernel": jax.random.normal(key, (features, args.embed)) / np.sqrt(features),
            "bias": jnp.zeros(args.embed),
        },
        "loss": loss.init(key, jnp.zeros((2, args.embed)), jnp.zeros(2, jnp.int32))["params"],
    }
    tx = optax.adamw(1e-5, weight_decay=0.05, mask=decay_mask(NO_DECAY))

    def objective(params, images, labels):
        x = backbone.apply({"params": params["backbone"]}, images)
        x = l2_normalize(x @ params["head"]["kernel"] + params["head"]["bias"], axis=1)
        return loss.apply({"params": params["loss"]}, x, labels)[0]

    def step(state, images, labels):
        params, opt = state
        value, grads = jax.value_and_grad(objective)(params, images, labels)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), value

    return jax.jit(step, donate_argnums=0), (params, tx.init(params)), images, labels


def torch_step(args: argparse.Namespace, classes: int, images: np.ndarray, labels: np.ndarray):
    """timm's model, the same head and loss, AdamW: a function running one eager step."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(TIMM_NAMES[args.model], pretrained=False, num_classes=0,
                              img_size=args.size)  # fmt: skip
    head = torch.nn.Linear(model.num_features, args.embed)
    try:
        from pytorch_metric_learning.losses import ProxyAnchorLoss

        loss_fn = ProxyAnchorLoss(num_classes=classes, embedding_size=args.embed)
    except ImportError:
        loss_fn = _TorchProxyAnchor(classes, args.embed)
    params = [*model.parameters(), *head.parameters(), *loss_fn.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.05)
    x = torch.tensor(np.asarray(images)).permute(0, 3, 1, 2).contiguous()
    y = torch.tensor(np.asarray(labels)).long()

    def run() -> float:
        opt.zero_grad(set_to_none=True)
        emb = torch.nn.functional.normalize(head(model(x)), dim=1)
        value = loss_fn(emb, y)
        value.backward()
        opt.step()
        return float(value)

    return run


class _TorchProxyAnchor:
    """ProxyAnchor (the paper's eq. 4) in torch, when pytorch-metric-learning is absent."""

    def __init__(self, classes: int, dim: int) -> None:
        import torch

        self.proxies = torch.nn.Parameter(torch.randn(classes, dim) * (2 / classes) ** 0.5)

    def parameters(self):
        return [self.proxies]

    def __call__(self, emb, labels):
        import torch

        cos = emb @ torch.nn.functional.normalize(self.proxies, dim=1).T
        own = torch.nn.functional.one_hot(labels, cos.shape[1]).bool()
        zero = torch.zeros(1, cos.shape[1])
        pos = torch.logsumexp(torch.cat([zero, (-32 * (cos - 0.1)).masked_fill(~own, -1e9)]), 0)
        neg = torch.logsumexp(torch.cat([zero, (32 * (cos + 0.1)).masked_fill(own, -1e9)]), 0)
        return pos.sum() / own.any(0).sum() + neg.mean()


def forward_contenders(args: argparse.Namespace, convs: list[str]) -> dict:
    """The forward pass alone (what ``jdml embed`` runs): jdml's jitted backbone per ``conv``
    mode, and timm's model under ``torch.inference_mode`` when torch imports."""
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.standard_normal((args.batch, args.size, args.size, 3)), jnp.float32)
    contenders = {}
    for conv in convs:
        backbone = backbone_of(args, conv)
        params = backbone.init(jax.random.key(0), images[:1])
        forward = jax.jit(backbone.apply).lower(params, images).compile()
        name = f"jdml forward ({conv})"
        contenders[name] = lambda f=forward, p=params: [
            f(p, images).block_until_ready() for _ in range(args.steps)
        ][-1]
    if args.jdml_only:
        return contenders
    try:
        import timm
        import torch
    except ImportError as e:
        print(f"(no torch comparison: {e})")
        return contenders
    model = timm.create_model(TIMM_NAMES[args.model], pretrained=False, num_classes=0,
                              img_size=args.size).eval()  # fmt: skip
    x = torch.tensor(np.asarray(images)).permute(0, 3, 1, 2).contiguous()

    def torch_forward():
        with torch.inference_mode():
            return [model(x) for _ in range(args.steps)][-1]

    contenders["torch inference_mode"] = torch_forward
    return contenders


def memory_line(compiled, batch: int) -> str:
    """The compiled step's memory: arguments, outputs, temporaries, and their sum per image."""
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    total -= m.alias_size_in_bytes  # donated state: the outputs reuse the arguments' buffers
    gib = 2**30
    return (
        f"memory of the compiled step: arguments {m.argument_size_in_bytes / gib:.2f} GiB, "
        f"outputs {m.output_size_in_bytes / gib:.2f} GiB (of which aliased to donated arguments "
        f"{m.alias_size_in_bytes / gib:.2f}), temporaries {m.temp_size_in_bytes / gib:.2f} GiB; "
        f"{total / gib:.2f} GiB in all, {total / batch / 2**20:.1f} MiB per image at batch {batch}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_s16", choices=sorted(TIMM_NAMES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--embed", type=int, default=384)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--jdml-only", action="store_true", help="no PyTorch contender")
    parser.add_argument("--attention", default="xla", choices=("xla", "cudnn"))
    parser.add_argument(
        "--conv",
        default="auto",
        help="the products: a backends.conv mode (auto, xla, onednn) or several, comma-separated "
        "(e.g. xla,onednn: both in the same alternating rounds)",
    )
    parser.add_argument(
        "--forward", action="store_true", help="the forward pass alone, against inference_mode"
    )
    args = parser.parse_args()
    convs = args.conv.split(",")
    print(f"{args.model} at {args.size} px, batch {args.batch}, {args.dtype}, {jax.devices()[0]}")
    if args.forward:
        report(args, alternating_rounds(forward_contenders(args, convs), args.repeats), "pass")
        return
    contenders, flops = {}, {}
    for conv in convs:
        step, state, images, labels = jdml_step(args, args.classes, conv)
        compiled = step.lower(state, images, labels).compile()
        print(f"conv={conv}: {memory_line(compiled, args.batch)}")
        holder = {"state": state}

        def ours(compiled=compiled, holder=holder, images=images, labels=labels):
            out = None
            for _ in range(args.steps):
                holder["state"], out = compiled(holder["state"], images, labels)
            return out

        contenders[f"jdml step ({conv})"] = ours
        shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
        flops[f"jdml step ({conv})"] = model_flops(step, shapes, images, labels)
    if args.memory_only:
        return
    try:
        if not args.jdml_only:
            torch_run = torch_step(args, args.classes, images, labels)
            contenders["torch eager"] = lambda: [torch_run() for _ in range(args.steps)][-1]
    except ImportError as e:
        print(f"(no torch comparison: {e})")
    seconds = report(args, alternating_rounds(contenders, args.repeats), "step")
    for name, value in flops.items():
        print(throughput_line(name, value, seconds[name], args.dtype))


def report(args: argparse.Namespace, timings: dict, unit: str) -> dict[str, float]:
    """Prints the median seconds per ``unit`` of each contender and each jdml one's time as a
    multiple of PyTorch's; returns the medians."""
    seconds = {n: statistics.median(t.rounds) / args.steps for n, t in timings.items()}
    for name, value in seconds.items():
        print(f"{name}: {1e3 * value:.0f} ms per {unit} (median of {args.repeats} rounds)")
    torch_name = next((n for n in seconds if n.startswith("torch")), None)
    for name in seconds:
        if torch_name and name.startswith("jdml"):
            print(f"{name} / {torch_name}: {seconds[name] / seconds[torch_name]:.2f}x its time")
    return seconds


if __name__ == "__main__":
    main()
