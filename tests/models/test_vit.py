"""Vision transformers against timm: small random timm models' weight files read through jdml's
loaders (``.safetensors`` and ``.pth``, timm's and DINOv2's layouts) give timm's features to
1e-5, at the size the weights were made for and, their position embeddings resampled, at
another (``tools/make_vit_golden.py`` wrote the files)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.errors import WeightMismatchError
from jdml.models.pretrained.backbones import load_backbone
from jdml.models.pretrained.convert import CONVERTERS, fill
from jdml.models.pretrained.torch_io import load_weights
from jdml.models.pretrained.vit import bicubic_matrix, resample_position_embeddings
from jdml.models.vit import Architecture, VisionTransformer
from tests.helpers import REPO

DATA = os.path.join(REPO, "tests", "golden", "backbones", "vit")
PLAIN = Architecture(patch=8, dim=24, depth=2, heads=2)
DINOV2_REG = Architecture(patch=8, dim=24, depth=2, heads=2, layer_scale=1e-5, registers=2)


def _features(arch: Architecture, weights: str, x: np.ndarray, pooling: str) -> np.ndarray:
    """jdml's features of ``x`` with the weight file read as ``model.pretrained`` reads it."""
    model = VisionTransformer(arch, pooling=pooling)
    variables = {"params": {"backbone": model.init(jax.random.key(0), jnp.asarray(x))["params"]}}
    filled = load_backbone("vit", os.path.join(DATA, weights))(variables)
    return np.asarray(model.apply({"params": filled["params"]["backbone"]}, jnp.asarray(x)))


@pytest.mark.parametrize("fmt", ["safetensors", "pth"])
@pytest.mark.parametrize(
    "case, arch, expected",
    [
        ("plain", PLAIN, "plain"),
        ("plain", PLAIN, "plain_48"),  # 32 px weights in a 48 px model: resampled positions
        ("dinov2_reg", DINOV2_REG, "dinov2_reg"),
        ("dinov2_reg_original", DINOV2_REG, "dinov2_reg"),  # DINOv2's own layout
    ],
)
@pytest.mark.parametrize("pooling", ["token", "avg"])
def test_features_match_timm(case, arch, expected, fmt, pooling):
    with np.load(os.path.join(DATA, f"{expected}.npz")) as f:
        x, reference = f["x"], f[pooling]
    got = _features(arch, f"{case}.{fmt}", x, pooling)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5 * np.abs(reference).max())


def test_bicubic_resampling_is_torchs():
    with np.load(os.path.join(DATA, "bicubic.npz")) as f:
        grid, up, down = f["grid"], f["up"], f["down"]
    for out, size in ((up, 7), (down, 3)):
        m = bicubic_matrix(5, size)
        got = np.einsum("ia,jb,cab->cij", m, m, grid[0].astype(np.float64))
        np.testing.assert_allclose(got, out[0], rtol=1e-5, atol=1e-6)
    # Class token kept, grid resampled; a non-square grid is one clear error.
    pos = np.random.default_rng(0).standard_normal((1, 1 + 16, 4)).astype(np.float32)
    out = resample_position_embeddings(pos, (1, 1 + 36, 4))
    assert out.shape == (1, 37, 4) and np.array_equal(out[:, 0], pos[:, 0])
    with pytest.raises(ValueError, match="grids must be square"):
        resample_position_embeddings(pos[:, :15], (1, 1 + 36, 4))


def _fill(arch: Architecture, state: dict) -> None:
    """Fills a model of ``arch`` from ``state`` as the ViT converter does."""
    model = VisionTransformer(arch)
    variables = {"params": model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))["params"]}
    converter = CONVERTERS.get("vit")
    fill(variables, converter.prepare(state), converter.rule, source="w.pth",
         ignore=converter.ignore)  # fmt: skip


def test_a_missing_or_unexpected_key_is_named():
    state = load_weights(os.path.join(DATA, "plain.safetensors"))
    _fill(PLAIN, state)  # the file as written fits
    missing = {k: v for k, v in state.items() if k != "blocks.1.attn.proj.weight"}
    with pytest.raises(WeightMismatchError, match=r"1 missing: blocks\.1\.attn\.proj\.weight"):
        _fill(PLAIN, missing)
    extra = {**state, "blocks.7.norm1.weight": np.ones(24, np.float32)}
    with pytest.raises(WeightMismatchError, match=r"not used by the model: blocks\.7\.norm1"):
        _fill(PLAIN, extra)
    # A DINOv2 file with registers for a model without them: the register tokens are unused.
    with pytest.raises(WeightMismatchError, match="reg_token"):
        _fill(PLAIN, load_weights(os.path.join(DATA, "dinov2_reg_original.safetensors")))


def test_a_tensor_that_is_not_finite_float_weights_is_named():
    """Every tensor the model reads must be finite floats (float16 is converted): NaN, inf,
    integer or boolean values are refused naming the tensor; an integer buffer the model does
    not read (BatchNorm's ``num_batches_tracked``) stays allowed."""
    from jdml.errors import WeightFileError

    state = load_weights(os.path.join(DATA, "plain.safetensors"))
    _fill(PLAIN, {k: v.astype(np.float16) for k, v in state.items()})
    _fill(PLAIN, {**state, "norm.num_batches_tracked": np.array(7, np.int64)})
    cases = {
        "pos_embed": (np.full_like(state["pos_embed"], np.inf), "holds 408 NaN or inf"),
        "cls_token": (state["cls_token"] > 0, "holds bool values where the model holds floats"),
        "norm.weight": (np.ones(24, np.int32), "holds int32 values where the model holds floats"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(
            WeightFileError, match=rf"w\.pth: 1 tensor.*{key} \(for params/.*{message}"
        ):
            _fill(PLAIN, {**state, key: value})


def test_an_input_that_is_not_whole_patches_is_refused():
    model = VisionTransformer(PLAIN)
    with pytest.raises(ValueError, match="multiple of 8"):
        model.init(jax.random.key(0), jnp.zeros((1, 36, 36, 3)))


@pytest.mark.parametrize("dtype, tolerance", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_attention_equals_jax_dot_product_attention(dtype, tolerance):
    """The blocks' head-major attention equals ``jax.nn.dot_product_attention`` on the same
    queries, keys and values in its (B, T, heads, D) layout, the layout the ``cudnn`` path
    hands it (values and gradients)."""
    from jdml.models.vit import attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 3, 5, 8)), dtype) for _ in range(3))
    swap = lambda a: jnp.swapaxes(a, 1, 2)  # noqa: E731

    def ours(q, k, v):
        return jnp.sum(attention(q, k, v, "xla").astype(jnp.float32) ** 2)

    def theirs(q, k, v):
        out = jax.nn.dot_product_attention(swap(q), swap(k), swap(v), implementation="xla")
        return jnp.sum(out.astype(jnp.float32) ** 2)

    np.testing.assert_allclose(
        np.asarray(attention(q, k, v, "xla"), np.float32),
        np.asarray(jax.nn.dot_product_attention(swap(q), swap(k), swap(v)), np.float32),
        rtol=tolerance,
        atol=tolerance,
    )
    for a, b in zip(
        jax.grad(ours, (0, 1, 2))(q, k, v), jax.grad(theirs, (0, 1, 2))(q, k, v), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tolerance, atol=tolerance
        )
