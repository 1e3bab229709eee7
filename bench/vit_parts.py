"""Where the ViT step's time goes on this CPU: each part of one ViT-S/16 block, forward and
backward, in XLA (jdml's code) and in PyTorch eager, in one process with alternating rounds.

Parts, at batch 16 and 224 px (197 tokens of width 384, 6 heads):

* ``block``: jdml's ``Block`` against timm's ``Block``;
* ``the four dense layers``: qkv, projection and the two MLP layers alone (their matrix
  products, with a residual add so the graph keeps them);
* ``attention``: jdml's (``jdml.models.vit.attention``, on (B, heads, T, 64)) and
  ``jax.nn.dot_product_attention`` (on (B, T, heads, 64)) against
  ``scaled_dot_product_attention``;
* ``one batched product``: the scores Q K^T of every head (96 products of 197 x 64 x 197);
* ``LayerNorm``, ``GELU`` (erf) and ``softmax`` on their tensors.

The rows marked "oneDNN's" take the products of ``jdml.nn.matmul`` (a run's
``backends.conv=onednn`` on CPU). Each row is the sum of squares' gradient (forward and
backward). The ratio is XLA's time over
PyTorch's; run it with ``XLA_FLAGS`` set to compare XLA's CPU libraries.

Usage: python bench/vit_parts.py [--repeats 5]   (needs torch and timm)
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jdml.models.vit import LN_EPS, Block, attention
from jdml.nn.matmul import native_dot_general, product
from jdml.throughput import alternating_rounds

B, T, D, H = 16, 197, 384, 6


class DenseLayers(nn.Module):
    """The block's four dense layers without the rest (``native``: oneDNN's products)."""

    native: bool = False

    @nn.compact
    def __call__(self, x):
        dense = functools.partial(
            nn.Dense, **({"dot_general": native_dot_general} if self.native else {})
        )
        y = dense(3 * D)(x)[..., :D]
        x = x + dense(D)(y)
        return x + dense(D)(dense(4 * D)(x))


def jax_grad(fn, *arrays):
    """The jitted gradient of sum(fn(*arrays) ** 2) in every argument, as a timed call."""
    arrays = [jax.tree.map(jnp.asarray, a) for a in arrays]
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=tuple(range(len(arrays)))))
    return lambda: grad(*arrays)


def jax_module(module, x):
    params = module.init(jax.random.key(0), jnp.asarray(x[:1]))
    return jax_grad(lambda p, x: module.apply(p, x), params, x)


def torch_grad(fn, *arrays):
    import torch

    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]

    def run():
        for t in tensors:
            t.grad = None
        (fn(*tensors) ** 2).sum().backward()

    return run


def torch_module(module, x):
    import torch

    tensor = torch.tensor(x, requires_grad=True)

    def run():
        module.zero_grad(set_to_none=True)
        tensor.grad = None
        (module(tensor) ** 2).sum().backward()

    return run


def parts() -> dict[str, tuple]:
    """name -> (XLA call, PyTorch call)."""
    import torch
    from timm.models.vision_transformer import Block as TimmBlock

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    hidden = rng.standard_normal((B, T, 4 * D)).astype(np.float32)
    scores = rng.standard_normal((B, H, T, T)).astype(np.float32)
    tokens = rng.standard_normal((B, T, H, D // H)).astype(np.float32)
    heads = np.ascontiguousarray(tokens.transpose(0, 2, 1, 3))

    class TorchDense(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
            self.fc1, self.fc2 = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

        def forward(self, x):
            x = x + self.proj(self.qkv(x)[..., :D])
            return x + self.fc2(self.fc1(x))

    def layer_norm(x):
        return nn.LayerNorm(LN_EPS).apply(
            {"params": {"scale": jnp.ones(D), "bias": jnp.zeros(D)}}, x
        )

    return {
        "block": (
            jax_module(Block(H, 0.0, jnp.float32), x),
            torch_module(TimmBlock(D, H, qkv_bias=True), x),
        ),
        "block, oneDNN's products": (
            jax_module(Block(H, 0.0, jnp.float32, native_conv=True), x),
            torch_module(TimmBlock(D, H, qkv_bias=True), x),
        ),
        "the four dense layers": (jax_module(DenseLayers(), x), torch_module(TorchDense(), x)),
        "the four dense layers, oneDNN's": (
            jax_module(DenseLayers(native=True), x),
            torch_module(TorchDense(), x),
        ),
        "attention (jdml's, heads ahead of tokens)": (
            jax_grad(lambda q, k, v: attention(q, k, v, "xla"), heads, heads, heads),
            torch_grad(torch.nn.functional.scaled_dot_product_attention, heads, heads, heads),
        ),
        "attention (jdml's), oneDNN's products": (
            jax_grad(lambda q, k, v: attention(q, k, v, "xla", True), heads, heads, heads),
            torch_grad(torch.nn.functional.scaled_dot_product_attention, heads, heads, heads),
        ),
        "attention (jax.nn.dot_product_attention)": (
            jax_grad(jax.nn.dot_product_attention, tokens, tokens, tokens),
            torch_grad(torch.nn.functional.scaled_dot_product_attention, heads, heads, heads),
        ),
        "one batched product (Q K^T)": (
            jax_grad(lambda q, k: jnp.einsum("bhtd,bhsd->bhts", q, k), heads, heads),
            torch_grad(lambda q, k: q @ k.transpose(-1, -2), heads, heads),
        ),
        "one batched product (Q K^T), oneDNN's": (
            jax_grad(
                lambda q, k: product(
                    q.reshape(-1, T, D // H), k.reshape(-1, T, D // H), False, True
                ),
                heads,
                heads,
            ),
            torch_grad(lambda q, k: q @ k.transpose(-1, -2), heads, heads),
        ),
        "LayerNorm": (
            jax_grad(layer_norm, x),
            torch_grad(lambda x: torch.nn.functional.layer_norm(x, (D,), eps=LN_EPS), x),
        ),
        "GELU (erf)": (
            jax_grad(lambda h: jax.nn.gelu(h, approximate=False), hidden),
            torch_grad(torch.nn.functional.gelu, hidden),
        ),
        "softmax": (
            jax_grad(lambda s: jax.nn.softmax(s, axis=-1), scores),
            torch_grad(lambda s: torch.softmax(s, -1), scores),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    flags = os.environ.get("XLA_FLAGS", "")
    print(f"jax {jax.__version__} on {jax.devices()[0]}; XLA_FLAGS={flags!r}")
    print("\n| part (forward and backward) | XLA ms | PyTorch eager ms | XLA / PyTorch |")
    print("|---|---|---|---|")
    for name, (ours, theirs) in parts().items():
        timings = alternating_rounds({"xla": ours, "torch": theirs}, args.repeats, warmup=2)
        xla, torch_ms = (1e3 * statistics.median(timings[k].rounds) for k in ("xla", "torch"))
        print(f"| {name} | {xla:.1f} | {torch_ms:.1f} | {xla / torch_ms:.2f} |")


if __name__ == "__main__":
    main()
