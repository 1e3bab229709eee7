"""jdml on an accelerator against what a user would run instead, on the same device.

Three sections (``--sections step,eval,train``; ``sweep`` is a fourth, on request), each
printing a table and writing it as JSON to ``--out`` as soon as it is done (a run stopped later
keeps the finished sections):

* ``step``: the train step at batch 112 of (1) ResNet-50 at 224 px with frozen BatchNorm (the
  papers' ImageNet protocol: margin loss with distance-weighted mining, Adam with coupled weight
  decay, 128-d L2-normalised embedding) and (2) the glyph default (the small ResNet at 32 px),
  or (``--nets vit_s16,vit_b16``) the ViT-S/16 and ViT-B/16 backbones in that protocol (timm's
  models on the PyTorch side), each in float32 and bfloat16, against the same network in
  PyTorch: eager (channels-last;
  float32 with TF32 convolutions and matmuls, which XLA also uses at its default precision;
  bfloat16 under autocast) and ``torch.compile`` of the forward pass and loss (default mode),
  with a plain pairwise margin loss (no mining) and Adam. Random weights and one fixed batch
  of random images; the step times include no input pipeline. Every contender runs in turn in
  each round (``jdml.throughput.alternating_rounds``); the figures are medians. jdml's line
  also gives its FLOPs (matrix products and convolutions) and MFU.
* ``eval``: retrieval at Stanford Online Products' size (60,502 x 128 float32 embeddings in
  11,316 classes of 2-12 images, clustered): recall@1,2,4,8 and MAP@R by
  ``evaluate_embeddings`` against a plain PyTorch matmul + top-k in blocks of 4,096 queries
  (the same metrics from its neighbours), and faiss-gpu where installed; the first call
  (compilation included, in a fresh process) and warm calls; then k-means into 11,316
  clusters (each initialisation) and NMI.
* ``sweep`` (not in the default list): the evaluator's times under other block sizes, which
  chose its accelerator defaults.
* ``train``: ``train.py`` end to end on the glyph default for ``--train-steps`` steps:
  images/s from its ``metrics.jsonl`` (after the first log point, so compilation is
  excluded), the wall time of the whole command, and the input pipeline's own rate.

Usage (on a GPU host; every section runs on CPU too, slowly, with small flags):

    python bench/bench_gpu.py --out bench/results/gpu
    python bench/bench_gpu.py --sections step --nets glyphs --dtypes float32 --steps 2 \
        --repeats 1 --batch 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from configs.revisiting import get_config
from jdml.config import apply_overrides
from jdml.run import Run
from jdml.step import make_train_step
from jdml.throughput import FlopCount, alternating_rounds, model_flops, throughput_line

REPO = Path(__file__).resolve().parent.parent
SOP_POINTS, SOP_CLASSES, SOP_DIM = 60_502, 11_316, 128
RETRIEVAL = ("recall@1", "recall@2", "recall@4", "recall@8", "map@r")


def device_name() -> str:
    """The default device as a person names it (e.g. 'NVIDIA H200 (gpu), jax 0.11.2')."""
    d = jax.devices()[0]
    return f"{d.device_kind} ({d.platform}), jax {jax.__version__}"


def write(out: Path | None, name: str, record: dict[str, Any]) -> None:
    """Writes one section's record to ``out/<name>.json`` (when an output folder is given)."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.json.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(out / f"{name}.json")


# --- step ------------------------------------------------------------------------------------


def _npz(path: Path, size: int, channels: int, classes: int = 64, per_class: int = 4) -> Path:
    """A small npz of random uint8 images (only the batch's shapes matter for timing)."""
    if not path.exists():
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (classes * per_class, size, size, channels), np.uint8)
        labels = np.repeat(np.arange(classes), per_class)
        np.savez(path, images=images, labels=labels)
    return path


#: The vision transformers of the step section: jdml's backbone name -> timm's model name.
VITS = {"vit_s16": "vit_small_patch16_224", "vit_b16": "vit_base_patch16_224"}


def net_config(net: str, dtype: str, batch: int, scratch: Path, vit_attention: str = "xla"):
    """The config of a benchmarked network: ``resnet50`` (the ImageNet protocol at 224 px with
    random weights, on random images), ``vit_s16`` or ``vit_b16`` (the same protocol with the
    vision transformer as the backbone) or ``glyphs`` (the default run)."""
    if net == "glyphs":
        overrides = [f"model.dtype={dtype}", f"train.batch_size={batch}"]
        return apply_overrides(get_config(), overrides)
    path = _npz(scratch / "random224.npz", 256, 3)
    overrides = [
        "data.name=npz",
        f"data.path={path}",
        "model.pretrained=",
        f"model.dtype={dtype}",
        f"train.batch_size={batch}",
    ]
    if net in VITS:
        overrides += [f"model.backbone={net}", f"model.vit.attention={vit_attention}"]
    return apply_overrides(get_config("data=cub200"), overrides)


def jdml_step(config) -> tuple[Callable[[], Any], Callable[[], FlopCount], np.ndarray]:
    """jdml's jitted, state-donating train step on one real batch of the run: the work to time,
    its FLOP count, and the batch's images (NHWC) for the PyTorch side."""
    run = Run(config)
    batch = {k: jnp.asarray(v) for k, v in run.batch_maker()(0).items()}
    step = make_train_step(run.method, run.tx)
    state = [jax.tree.map(jnp.copy, run.initial_state)]

    def call() -> Any:
        state[0], metrics = step(state[0], batch)
        return metrics

    return call, lambda: model_flops(step, state[0], batch), np.asarray(batch["images"])


def _torch_small_resnet(m, channels: int):
    """The glyph default's small ResNet in PyTorch (3x3 stem, basic blocks, 1x1 projections,
    global average pooling, linear 128-d head)."""
    from torch import nn

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
            y = self.b2(self.c2(nn.functional.relu(self.b1(self.c1(x)))))
            return nn.functional.relu(y + (self.proj(x) if self.proj is not None else x))

    layers = [
        nn.Conv2d(channels, m.stem_features, 3, m.stem_strides, 1, bias=False),
        nn.BatchNorm2d(m.stem_features),
        nn.ReLU(),
    ]
    cin = m.stem_features
    for feat, blocks, stride in zip(m.stage_features, m.stage_blocks, m.stage_strides, strict=True):
        for j in range(blocks):
            layers.append(Block(cin, feat, stride if j == 0 else 1))
            cin = feat
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 128))


def torch_steps(config, images: np.ndarray, labels: np.ndarray) -> dict[str, Callable[[], Any]]:
    """PyTorch eager and ``torch.compile`` train steps of the same network and batch (empty
    without PyTorch or without a CUDA device)."""
    try:
        import torch
        import torchvision
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    m = config.model
    if m.backbone in VITS:
        try:
            import timm
        except ImportError:
            print("(no PyTorch ViT rows: timm is not installed)")
            return {}
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True  # as XLA's default float32 precision on GPU
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    if m.backbone == "resnet50":
        net = torchvision.models.resnet50(num_classes=128)
        net.fc = torch.nn.Linear(2048, 128)
    elif m.backbone in VITS:  # the class token into a 128-d linear head, as jdml's
        net = timm.create_model(VITS[m.backbone], pretrained=False, num_classes=128)
    else:
        net = _torch_small_resnet(m.small_resnet, images.shape[-1])
    net = net.cuda().to(memory_format=torch.channels_last)
    if m.frozen_bn:  # BatchNorm on running statistics, affine parameters trained
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.eval()
    x = torch.from_numpy(images).cuda().permute(0, 3, 1, 2)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.from_numpy(labels.astype(np.int64)).cuda()
    bf16 = config.model.dtype == "bfloat16"

    def loss_of(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            e = torch.nn.functional.normalize(net(x).float(), dim=1)
        d = torch.cdist(e, e)
        same = (y[:, None] == y[None, :]).float()
        beta, margin = 1.2, 0.2
        pos = torch.relu(d - beta + margin) * same
        neg = torch.relu(beta - d + margin) * (1 - same)
        return (pos + neg).sum() / len(y) ** 2

    opt = torch.optim.Adam(net.parameters(), lr=1e-5, weight_decay=4e-4)
    compiled = torch.compile(loss_of)

    def step(fn) -> Callable[[], Any]:
        def call() -> None:
            opt.zero_grad(set_to_none=True)
            fn(x, y).backward()
            opt.step()
            torch.cuda.synchronize()

        return call

    return {"torch eager": step(loss_of), "torch.compile": step(compiled)}


def step_section(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Times jdml's step against PyTorch for every network and dtype."""
    rows = []
    for net in args.nets:
        for dtype in args.dtypes:
            config = net_config(net, dtype, args.batch, scratch, args.vit_attention)
            jdml, flops_of, images = jdml_step(config)
            labels = np.repeat(np.arange(len(images) // 2), 2)[: len(images)]
            contenders = {"jdml": jdml, **torch_steps(config, images, labels)}
            times = alternating_rounds(contenders, args.repeats, calls=args.steps, warmup=2)
            flops = flops_of()
            row = {"net": net, "dtype": dtype, "batch": len(images), "flops": flops.flops}
            for name, timing in times.items():
                row[name] = {"ms": 1e3 * timing.median, "first_s": timing.first}
            row["mfu_line"] = throughput_line("jdml step", flops, times["jdml"].median, dtype)
            rows.append(row)
            print_step_row(row)
            write(args.out, "step", {"device": device_name(), "rows": rows})  # so far
    return {"device": device_name(), "rows": rows}


def print_step_row(row: dict[str, Any]) -> None:
    """One network and dtype: ms/step and images/s of each contender, and their ratio."""
    print(f"\n{row['net']}, {row['dtype']}, batch {row['batch']}:")
    base = row["jdml"]["ms"]
    for name in ("jdml", "torch eager", "torch.compile"):
        if name in row:
            ms = row[name]["ms"]
            ips = 1e3 * row["batch"] / ms
            first = row[name]["first_s"]
            print(f"  {name:<14} {ms:8.2f} ms {ips:9.0f} img/s {ms / base:6.2f}x jdml's time"
                  f"   (first call {first:.1f} s)")  # fmt: skip
    print("  " + row["mfu_line"], flush=True)


# --- eval ------------------------------------------------------------------------------------


def sop_like(
    points: int = SOP_POINTS, classes: int = SOP_CLASSES, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """L2-normalised 128-d points in classes of 2-9 (SOP's 60,502 in 11,316: mean 5.3), each
    class a noisy cluster around its own direction."""
    rng = np.random.default_rng(seed)
    sizes = np.full(classes, points // classes)
    sizes[rng.choice(classes, points - sizes.sum(), replace=False)] += 1
    shift = rng.integers(-2, 3, classes // 2)  # spread the sizes, keeping the total
    sizes[: len(shift)] += shift
    sizes[len(shift) : 2 * len(shift)] -= shift
    labels = np.repeat(np.arange(classes), sizes)
    centres = rng.standard_normal((classes, SOP_DIM)).astype(np.float32)
    x = centres[labels] + 1.4 * rng.standard_normal((len(labels), SOP_DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), labels.astype(np.int32)


def torch_retrieval(x: np.ndarray, labels: np.ndarray, block: int = 4096) -> Callable[[], dict]:
    """recall@1,2,4,8 and MAP@R by a plain PyTorch matmul + top-k over blocks of queries."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Exact float32 products, as jdml's search (no TF32: a ranking needs every bit).
    torch.backends.cuda.matmul.allow_tf32 = False
    xt = torch.from_numpy(x).to(device)
    yt = torch.from_numpy(labels.astype(np.int64)).to(device)
    counts = torch.bincount(yt)
    r = counts[yt] - 1  # same-class others per query
    k = int(r.max())
    sq = (xt * xt).sum(1)

    def call() -> dict:
        hits, ap = [], []
        for s in range(0, len(xt), block):
            q = xt[s : s + block]
            d = sq[s : s + block, None] + sq[None, :] - 2 * q @ xt.T
            d[torch.arange(len(q)), torch.arange(s, s + len(q))] = float("inf")
            nn = torch.topk(d, max(k, 8), dim=1, largest=False).indices
            rel = (yt[nn] == yt[s : s + block, None]).float()
            hits.append(rel[:, :8].cumsum(1).clamp(max=1))
            rq = r[s : s + block]
            mask = torch.arange(rel.shape[1], device=rel.device)[None, :] < rq[:, None]
            prec = rel.cumsum(1) / torch.arange(1, rel.shape[1] + 1, device=rel.device)
            ap.append((prec * rel * mask).sum(1) / rq)
        if device == "cuda":
            torch.cuda.synchronize()
        hit = torch.cat(hits).mean(0)
        out = {f"recall@{j}": float(hit[j - 1]) for j in (1, 2, 4, 8)}
        out["map@r"] = float(torch.cat(ap).mean())
        return out

    return call


def faiss_retrieval(x: np.ndarray, labels: np.ndarray) -> Callable[[], dict] | None:
    """recall@1 by faiss-gpu's exact search (None where faiss has no GPU)."""
    try:
        import faiss
    except ImportError:
        return None
    if not hasattr(faiss, "StandardGpuResources"):
        return None
    res = faiss.StandardGpuResources()

    def call() -> dict:
        index = faiss.GpuIndexFlatL2(res, x.shape[1])
        index.add(x)
        _, nn = index.search(x, 2)
        return {"recall@1": float(np.mean(labels[nn[:, 1]] == labels))}

    return call


FIRST_CALL = """
import json, sys, time
import numpy as np
sys.path.insert(0, {repo!r})
data = np.load({path!r})
from jdml.evaluation.embeddings import evaluate_embeddings
times = []
for _ in range(2):
    start = time.perf_counter()
    evaluate_embeddings(data["x"], data["labels"], {metrics!r}, kmeans_init={init!r})
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def first_call(
    path: Path, metrics: list[str], init: str = "k-means++", xla_flags: str = ""
) -> tuple[float, float]:
    """Seconds of ``evaluate_embeddings``'s first and second calls in a fresh process
    (compilation included in the first, JAX's start-up in neither), with ``xla_flags`` added to
    ``$XLA_FLAGS``; prints the compilations of more than 0.1 s it made."""
    code = FIRST_CALL.format(repo=str(REPO), path=str(path), metrics=metrics, init=init)
    flags = f"{os.environ.get('XLA_FLAGS', '')} {xla_flags}".strip()
    env = {**os.environ, "JAX_LOG_COMPILES": "1", "XLA_FLAGS": flags}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    for line in out.stderr.splitlines():
        if "Finished" in line and " in " in line:
            seconds = line.rsplit(" in ", 1)[1].split()[0]
            with contextlib.suppress(ValueError):
                if float(seconds) > 0.1:
                    print("   ", line.split("] ", 1)[-1][:160])
    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    return first, second


def eval_section(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Times the evaluator at SOP's size against PyTorch (and faiss-gpu); on a GPU the first
    call also without XLA's autotuning (which compiles and times candidate kernels) and with
    cuBLAS instead of Triton for the products."""
    from jdml.evaluation.embeddings import evaluate_embeddings
    from jdml.evaluation.kmeans import kmeans

    x, labels = sop_like(args.eval_points, args.eval_classes)
    classes = args.eval_classes
    path = scratch / "sop_like.npz"
    np.savez(path, x=x, labels=labels)
    record: dict[str, Any] = {"device": device_name(), "points": len(x), "classes": classes}
    contenders: dict[str, Callable[[], Any]] = {
        "jdml": lambda: evaluate_embeddings(x, labels, list(RETRIEVAL))
    }
    with contextlib.suppress(ImportError, AssertionError, RuntimeError):  # no torch or CUDA
        contenders["torch matmul+topk"] = torch_retrieval(x, labels)
    faiss_call = faiss_retrieval(x, labels)
    if faiss_call is not None:
        contenders["faiss-gpu (recall@1)"] = faiss_call
    print(f"\nretrieval, {len(x):,} x {SOP_DIM} in {classes:,} classes:")
    variants = {"default": ""}
    if jax.devices()[0].platform == "gpu":
        variants["no autotuning"] = "--xla_gpu_autotune_level=0"
        variants["cuBLAS products"] = "--xla_gpu_enable_triton_gemm=false"
    record["first_call_s"] = {}
    for name, flags in variants.items():
        first, second = first_call(path, list(RETRIEVAL), xla_flags=flags)
        record["first_call_s"][name] = {"first": first, "second": second}
        print(f"  jdml in a fresh process, XLA flags {name}: first call {first:.2f} s, "
              f"second {second:.3f} s", flush=True)  # fmt: skip
    times = alternating_rounds(contenders, args.repeats, calls=1, warmup=2)
    print(f"  warm, median of {args.repeats} rounds:")
    base = times["jdml"].median
    record["retrieval"] = {}
    for name, timing in times.items():
        values = {k: round(100 * v, 3) for k, v in timing.result.items() if k in RETRIEVAL}
        record["retrieval"][name] = {"s": timing.median, "values": values}
        print(f"  {name:<22} {timing.median:8.3f} s  {timing.median / base:5.2f}x jdml  {values}")
    record["kmeans"] = {}
    for init in args.kmeans_inits:
        timing = alternating_rounds(
            {init: lambda init=init: kmeans(x, classes, init=init).centroids},
            args.repeats,
            warmup=1,
        )[init]
        record["kmeans"][init] = {"first_s": timing.first, "warm_s": timing.median}
        print(f"  k-means into {classes:,} clusters, init {init:<10}: first call "
              f"{timing.first:6.2f} s, warm {timing.median:6.3f} s", flush=True)  # fmt: skip
    timing = alternating_rounds({"nmi": lambda: evaluate_embeddings(x, labels, ["nmi"])}, 1)
    record["nmi"] = {"first_s": timing["nmi"].first, "warm_s": timing["nmi"].median}
    print(f"  NMI (k-means++ as evaluate_embeddings runs it): first {timing['nmi'].first:.2f} s, "
          f"warm {timing['nmi'].median:.3f} s", flush=True)  # fmt: skip
    return record


def sweep_section(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """The evaluator's warm time at SOP's size under other block sizes: the kNN query blocks
    (``knn.blocks.BLOCK_SCORES`` scores per block) and the k-means assignment blocks
    (``kmeans.assignment.ASSIGN_SCORES``), to choose the accelerator defaults."""
    from jdml.evaluation import kmeans as kmeans_module
    from jdml.evaluation.embeddings import evaluate_embeddings
    from jdml.evaluation.kmeans import assignment
    from jdml.evaluation.knn import blocks as knn_module

    x, labels = sop_like(args.eval_points, args.eval_classes)
    record: dict[str, Any] = {"device": device_name(), "knn": {}, "kmeans": {}}
    default_block, default_assign = knn_module.BLOCK_SCORES, assignment.ASSIGN_SCORES
    print(f"\nsweep at {len(x):,} x {SOP_DIM}:", flush=True)
    defaults = (
        knn_module.GROUP_SIZE,
        knn_module.DEFAULT_CHUNK_SIZE,
        knn_module.ACCELERATOR_CHUNK_SIZE,
    )
    for chunk in args.sweep_chunk_sizes:
        knn_module.DEFAULT_CHUNK_SIZE = knn_module.ACCELERATOR_CHUNK_SIZE = chunk
        for group in args.sweep_group_sizes:  # a group wider than any row: XLA's top-k alone
            knn_module.GROUP_SIZE = group
            for log2 in args.sweep_block_scores:
                knn_module.BLOCK_SCORES = 2**log2
                fn = lambda: evaluate_embeddings(x, labels, list(RETRIEVAL))  # noqa: E731
                t = alternating_rounds({"r": fn}, 3)
                key = f"chunk {chunk}, group {group}, 2^{log2} scores"
                record["knn"][key] = {"first_s": t["r"].first, "warm_s": t["r"].median}
                print(f"  retrieval, {key}: first {t['r'].first:6.2f} s, "
                      f"warm {t['r'].median:6.3f} s", flush=True)  # fmt: skip
    knn_module.BLOCK_SCORES = default_block
    (
        knn_module.GROUP_SIZE,
        knn_module.DEFAULT_CHUNK_SIZE,
        knn_module.ACCELERATOR_CHUNK_SIZE,
    ) = defaults
    for init in args.kmeans_inits:
        for log2 in args.sweep_assign_scores:
            assignment.ASSIGN_SCORES = 2**log2
            fn = lambda init=init: kmeans_module.kmeans(x, args.eval_classes, init=init).centroids  # noqa: E731
            t = alternating_rounds({"k": fn}, 2)
            record["kmeans"][f"{init} 2^{log2}"] = {
                "first_s": t["k"].first,
                "warm_s": t["k"].median,
            }
            print(f"  k-means {init:<10} ASSIGN_SCORES 2^{log2}: first {t['k'].first:6.2f} s, "
                  f"warm {t['k'].median:6.3f} s", flush=True)  # fmt: skip
    assignment.ASSIGN_SCORES = default_assign
    return record


# --- train -----------------------------------------------------------------------------------


def train_section(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """``train.py`` on the glyph default for ``--train-steps`` steps: end-to-end images/s."""
    workdir = scratch / "train-glyphs"
    config = get_config()
    steps_per_epoch = 50728 // 2 // config.train.batch_size  # about the training half
    epochs = max(1, math.ceil(args.train_steps / steps_per_epoch))
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        "--config",
        str(REPO / "configs" / "revisiting.py"),
        "--workdir",
        str(workdir),
        f"--config.train.epochs={epochs}",
        "--config.train.progress_bar=False",
        "--config.eval.every_epochs=1000",
        "--config.train.log_every_steps=25",
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:])
        return {"device": device_name(), "error": done.stderr[-2000:]}
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    rates = [r["img_s"] for r in train[1:]]
    record = {
        "device": device_name(),
        "command": " ".join(cmd[1:]),
        "steps": train[-1]["step"] if train else 0,
        "wall_s": wall,
        "img_s_median": float(np.median(rates)) if rates else None,
        "log": [line for line in done.stdout.splitlines() if "pipeline" in line.lower()][:5],
    }
    print(f"\ntrain.py, glyph default, {record['steps']} steps: {record['img_s_median']:.0f} "
          f"img/s (median of the log points after the first), command {wall:.1f} s")  # fmt: skip
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", default="step,eval,train")
    parser.add_argument("--nets", default="glyphs,resnet50")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batch", type=int, default=112)
    parser.add_argument("--vit-attention", default="xla", choices=("xla", "cudnn"))
    parser.add_argument("--steps", type=int, default=20, help="calls per round")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--eval-points", type=int, default=SOP_POINTS)
    parser.add_argument("--eval-classes", type=int, default=SOP_CLASSES)
    parser.add_argument("--kmeans-inits", default="k-means++,random,reference")
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--sweep-block-scores", default="22,25,28", help="log2 values")
    parser.add_argument("--sweep-group-sizes", default="16,1073741824")
    parser.add_argument("--sweep-chunk-sizes", default="16384,131072")
    parser.add_argument("--sweep-assign-scores", default="21,27", help="log2 values")
    parser.add_argument("--out", type=Path, help="folder for one JSON file per section")
    args = parser.parse_args()
    args.nets = args.nets.split(",")
    args.dtypes = args.dtypes.split(",")
    args.kmeans_inits = [s for s in args.kmeans_inits.split(",") if s]
    args.sweep_block_scores = [int(v) for v in args.sweep_block_scores.split(",") if v]
    args.sweep_chunk_sizes = [int(v) for v in args.sweep_chunk_sizes.split(",") if v]
    args.sweep_group_sizes = [int(v) for v in args.sweep_group_sizes.split(",") if v]
    args.sweep_assign_scores = [int(v) for v in args.sweep_assign_scores.split(",") if v]
    sections = {
        "step": step_section,
        "eval": eval_section,
        "sweep": sweep_section,
        "train": train_section,
    }
    unknown = set(args.sections.split(",")) - set(sections)
    if unknown:
        raise SystemExit(
            f"error: unknown section(s) {sorted(unknown)}; choose from {list(sections)}"
        )
    print(f"device: {device_name()}; host cores: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.sections.split(","):
            record = sections[name](args, Path(scratch))
            write(args.out, name, record)


if __name__ == "__main__":
    main()
