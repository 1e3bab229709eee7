"""oneDNN's products (``jdml.nn.matmul``, a run's ``backends.conv=onednn`` on CPU) against XLA's,
values and gradients: the largest differences, as a table.

Rows, at ViT-S/16's sizes (batch 4, 197 tokens, width 384, 6 heads):

* ``dense``: ``nn.Dense(1152)`` with the native dot against ``nn.Dense``;
* ``attention``: :func:`jdml.models.vit.attention` with the native products against XLA's;
* ``ViT (2 blocks)``: a two-block ViT-S/16 with the native products against XLA's, its
  features and every parameter's gradient.

Each in float32 and bfloat16. Printed per row: the largest absolute difference of the output and
of the gradients, each over the largest magnitude of XLA's (a relative figure independent of
the scale). Float32 rounding is 6e-8 relative per operation; a sum of n products differs by
order of magnitude n x 6e-8 in the worst case. bfloat16 outputs round to 2^-8 = 3.9e-3.

Usage: python bench/matmul_parity.py
"""

from __future__ import annotations

import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jdml.models.vit import Architecture, VisionTransformer, attention
from jdml.nn.matmul import native_dot_general

B, T, D, H = 4, 197, 384, 6


def largest(got, want) -> tuple[float, float]:
    """The largest absolute difference over the trees' leaves, and that over XLA's largest
    magnitude."""
    diff = scale = 0.0
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        diff, scale = max(diff, float(np.max(np.abs(a - b)))), max(scale, float(np.max(np.abs(b))))
    return diff, diff / scale


def compare(native_fn, xla_fn, *operands) -> tuple[tuple[float, float], tuple[float, float]]:
    """Output and gradients of sum(f(x) * w) of both functions, compared."""
    out = xla_fn(*operands)
    weights = jnp.asarray(np.random.default_rng(9).normal(size=out.shape), jnp.float32)

    def grads(fn):
        loss = lambda *xs: jnp.sum(fn(*xs).astype(jnp.float32) * weights)  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=tuple(range(len(operands)))))(*operands)

    outputs = largest(jax.jit(native_fn)(*operands), jax.jit(xla_fn)(*operands))
    return outputs, largest(grads(native_fn), grads(xla_fn))


def rows(dtype) -> dict[str, tuple]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    heads = [jnp.asarray(rng.normal(size=(B, H, T, D // H)), dtype) for _ in range(3)]
    plain = nn.Dense(3 * D, dtype=dtype)
    native = nn.Dense(3 * D, dtype=dtype, dot_general=native_dot_general)
    dense_params = plain.init(jax.random.key(0), x)
    arch = Architecture(patch=16, dim=D, depth=2, heads=H)
    images = jnp.asarray(rng.normal(size=(B, 224, 224, 3)), jnp.float32)
    vit, vit_native = (VisionTransformer(arch, dtype=dtype, native_conv=n) for n in (False, True))
    vit_params = vit.init(jax.random.key(0), images)
    return {
        "dense": compare(native.apply, plain.apply, dense_params, x),
        "attention": compare(
            lambda q, k, v: attention(q, k, v, "xla", native=True),
            lambda q, k, v: attention(q, k, v, "xla"),
            *heads,
        ),
        "ViT (2 blocks)": compare(vit_native.apply, vit.apply, vit_params, images),
    }


def main() -> None:
    print(f"jax {jax.__version__} on {jax.devices()[0]}")
    print(
        "\n| part | dtype | output: max abs diff | relative | gradients: max abs diff | relative |"
    )
    print("|---|---|---|---|---|---|")
    for dtype in (jnp.float32, jnp.bfloat16):
        for name, ((out, out_rel), (grad, grad_rel)) in rows(dtype).items():
            print(f"| {name} | {jnp.dtype(dtype).name} | {out:.2e} | {out_rel:.1e} | {grad:.2e} "
                  f"| {grad_rel:.1e} |")  # fmt: skip


if __name__ == "__main__":
    main()
