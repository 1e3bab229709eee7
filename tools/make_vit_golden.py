"""Records small timm vision transformers with random weights and their features, for the ViT
converter's tests.

Each case is a small ``timm`` ``VisionTransformer`` (the same module as ``vit_small_patch16_224``,
DINO's and DINOv2's, at a few blocks and a narrow width) whose every tensor is drawn at random,
so that each one changes the features. The weights go to ``tests/golden/backbones/vit/`` as
``.safetensors`` and ``.pth`` (``torch.save`` of the state dict), with the model's features of a
fixed input (``forward_features``, then the class token and the mean of the patch tokens) in
``<case>.npz``; ``tests/models/test_vit.py`` reads the files through jdml's loaders and compares.

* ``plain``: the original layout (a class token with a position), 32 px, patch 8, with timm's
  ImageNet head (the converter must skip it);
* ``plain_48``: the same weights in a 48 px model, their position embeddings resampled by timm's
  ``checkpoint_filter_fn`` as timm loads them (the converter resamples them itself);
* ``dinov2_reg``: layer scale and two register tokens (timm's ``no_embed_class`` layout);
* ``dinov2_reg_original``: the same weights in DINOv2's own layout (``register_tokens``, a
  class-token position, ``mask_token``), which must give the same features.

Also ``bicubic.npz``: ``torch.nn.functional.interpolate(..., "bicubic", antialias=True)`` of a
random grid to larger and smaller sizes, for the resampling alone.

torch and timm are not jdml dependencies; run this in a separate environment:

  python3 -m venv /work/refenv
  /work/refenv/bin/pip install torch==2.14.1 timm==1.0.31 safetensors
  /work/refenv/bin/python tools/make_vit_golden.py
"""

from __future__ import annotations

import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "backbones", "vit")
SEED = 20261205
# timm VisionTransformer arguments of each case.
CASES = {
    "plain": dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=5),
    "dinov2_reg": dict(
        img_size=32,
        patch_size=8,
        embed_dim=24,
        depth=2,
        num_heads=2,
        num_classes=0,
        init_values=1e-5,
        reg_tokens=2,
        no_embed_class=True,
    ),
}


def randomize(model, rng: np.random.Generator) -> None:
    """Draws every tensor: weights N(0, 0.2^2), norm scales 1 + N(0, 0.1^2), biases and tokens
    N(0, 0.1^2), layer scales U(0.2, 0.6)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                value = rng.uniform(0.2, 0.6, p.shape)
            elif "norm" in name and name.endswith("weight"):
                value = 1 + 0.1 * rng.standard_normal(p.shape)
            elif p.ndim >= 2 and not name.endswith(("token", "pos_embed")):
                value = 0.2 * rng.standard_normal(p.shape)
            else:
                value = 0.1 * rng.standard_normal(p.shape)
            p.copy_(torch.tensor(value, dtype=p.dtype))


def features(model, x: np.ndarray) -> dict[str, np.ndarray]:
    """The class token and the mean of the patch tokens of ``forward_features`` (after the
    final norm), for an NHWC input."""
    import torch

    with torch.no_grad():
        tokens = model.forward_features(torch.tensor(x).permute(0, 3, 1, 2)).numpy()
    return {"token": tokens[:, 0], "avg": tokens[:, model.num_prefix_tokens :].mean(axis=1)}


def save(name: str, state: dict, x: np.ndarray, feats: dict[str, np.ndarray]) -> None:
    import torch
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in state.items()}
    save_file(state, os.path.join(OUT, f"{name}.safetensors"))
    torch.save(state, os.path.join(OUT, f"{name}.pth"))
    np.savez(os.path.join(OUT, f"{name}.npz"), x=x, **feats)


def main() -> None:
    import timm.models.vision_transformer as vt
    import torch
    import torch.nn.functional as F

    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(SEED)
    x32 = rng.standard_normal((2, 32, 32, 3)).astype(np.float32)
    x48 = rng.standard_normal((2, 48, 48, 3)).astype(np.float32)
    for name, kwargs in CASES.items():
        model = vt.VisionTransformer(**kwargs).eval()
        randomize(model, rng)
        state = model.state_dict()
        save(name, state, x32, features(model, x32))
        if name == "plain":
            bigger = vt.VisionTransformer(**{**kwargs, "img_size": 48}).eval()
            bigger.load_state_dict(vt.checkpoint_filter_fn(dict(state), bigger))
            np.savez(os.path.join(OUT, "plain_48.npz"), x=x48, **features(bigger, x48))
        else:  # DINOv2's own layout of the same weights
            original = {k: v for k, v in state.items() if k not in ("reg_token", "pos_embed")}
            cls_position = torch.tensor(0.1 * rng.standard_normal((1, 1, kwargs["embed_dim"])))
            original["cls_token"] = state["cls_token"] - cls_position.float()
            original["pos_embed"] = torch.cat([cls_position.float(), state["pos_embed"]], dim=1)
            original["register_tokens"] = state["reg_token"]
            original["mask_token"] = torch.zeros(1, kwargs["embed_dim"])
            save(f"{name}_original", original, x32, features(model, x32))
    grid = torch.tensor(rng.standard_normal((1, 3, 5, 5)), dtype=torch.float32)
    up = F.interpolate(grid, size=(7, 7), mode="bicubic", antialias=True, align_corners=False)
    down = F.interpolate(grid, size=(3, 3), mode="bicubic", antialias=True, align_corners=False)
    np.savez(os.path.join(OUT, "bicubic.npz"), grid=grid.numpy(), up=up.numpy(), down=down.numpy())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
