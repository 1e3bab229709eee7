"""Records reference features of the ImageNet backbones with their own PyTorch frameworks.

For each backbone the reference model is built by its framework (torchvision, timm, Cadene's
``pretrainedmodels``; never with downloaded weights), given deterministic synthetic weights
(:func:`synthetic_weights`: every tensor of the state dict, BatchNorm running statistics
included, from a NumPy generator seeded by the key, so the weights depend only on the key names
and shapes), run in eval mode on a fixed synthetic batch (:func:`synthetic_input`), and its
pooled features (the tensor the ImageNet classifier receives) are written to
``tests/golden/backbones/<backbone>.npz`` with the state dict's key names, shapes and dtypes, the
SHA-256 of the weights and of the input. The ~25-100 MB weights themselves are not stored:
``tests/models/test_backbones.py`` rebuilds them from the key list with the same functions (imported
from this file, which needs torch only inside ``main``). ``resnet50_stem.pt`` is a real
``torch.save`` file of the ResNet-50 stem, for the zip-format path of the weight reader.

torch is not a jdml dependency; run this in a separate environment:

  python3 -m venv /work/refenv
  /work/refenv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm six
  /work/refenv/bin/pip install --no-deps pretrainedmodels munch
  /work/refenv/bin/python tools/make_backbone_golden.py            # all backbones
  /work/refenv/bin/python tools/make_backbone_golden.py resnet50   # or some of them
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "backbones")
SEED = 20260
# Input height = width per backbone: large enough that no 3x3 convolution meets a map smaller
# than its kernel (the XLA CPU trap), with ceil-mode pools that round up. BN-Inception's own
# forward pass ends in a 7x7 average pool, so 224 is the smallest input it runs on.
SIZES = {"resnet50": 128, "googlenet": 128, "bninception": 224}
BATCH = 2
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Spec = tuple[str, tuple[int, ...], str]  # key, shape, numpy dtype name


def synthetic_tensor(key: str, shape: tuple[int, ...], dtype: str, seed: int = SEED) -> np.ndarray:
    """The synthetic value of one state-dict tensor, from its key, shape and dtype alone.

    Convolution and linear weights are He-scaled normals, so activations keep their scale
    through the depth (divided by 128 for BN-Inception's first convolution, which sees 0-255
    pixels). BatchNorm scales lie in [0.5, 1.5] ([0.1, 0.3] for ResNet's ``bn3``), biases and
    running means are small normals and running variances lie in [0.5, 2], so the conversion
    of every BatchNorm tensor changes the features. ``num_batches_tracked``
    (unused) is a fixed count.
    """
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    if np.dtype(dtype).kind in "iu":
        return np.full(shape, 7, dtype)
    if key.endswith("running_var"):
        value = rng.uniform(0.5, 2.0, shape)
    elif key.endswith("running_mean") or key.endswith("bias"):
        value = 0.1 * rng.standard_normal(shape)
    elif key.endswith("bn3.weight"):
        # The last BatchNorm of a ResNet bottleneck's residual branch: small scales (as trained
        # ResNets have them) keep the sum over 16 blocks at O(10) instead of O(1000).
        value = rng.uniform(0.1, 0.3, shape)
    elif len(shape) == 1:  # BatchNorm weight
        value = rng.uniform(0.5, 1.5, shape)
    else:
        fan_in = int(np.prod(shape[1:]))
        value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        if key == "conv1_7x7_s2.weight":
            # BN-Inception's first convolution sees 0-255 pixels, not unit-scale ones.
            value /= 128.0
    return value.astype(dtype)


def synthetic_weights(specs: Iterable[Spec], seed: int = SEED) -> dict[str, np.ndarray]:
    """A state dict of :func:`synthetic_tensor` values for ``(key, shape, dtype)`` specs."""
    return {key: synthetic_tensor(key, tuple(shape), dtype, seed) for key, shape, dtype in specs}


def digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the keys and bytes of arrays in sorted key order."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).tobytes())
    return h.hexdigest()


def synthetic_input(size: int, seed: int = SEED) -> np.ndarray:
    """A fixed batch of RGB images (BATCH, size, size, 3) in [0, 1], NHWC float32."""
    return np.random.default_rng(seed).random((BATCH, size, size, 3), dtype=np.float32)


def normalise(x01: np.ndarray, mean: Iterable[float], std: Iterable[float]) -> np.ndarray:
    """``(x - mean) / std`` per RGB channel, in float32."""
    mean = np.asarray(tuple(mean), np.float32)
    std = np.asarray(tuple(std), np.float32)
    return ((x01 - mean) / std).astype(np.float32)


def _specs(state_dict: Mapping[str, Any]) -> list[Spec]:
    return [(k, tuple(v.shape), str(v.numpy().dtype)) for k, v in sorted(state_dict.items())]


def _capture(model: Any, module: Any, x: np.ndarray) -> np.ndarray:
    """The input ``module`` receives when ``model`` runs its own eval-mode forward pass on NHWC
    ``x`` (the ImageNet classifier's input = the pooled features)."""
    import torch

    seen = {}
    hook = module.register_forward_pre_hook(lambda m, args: seen.update(value=args[0]))
    with torch.no_grad():
        model.eval()
        model(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))))
    hook.remove()
    return seen["value"]


def _load(model: Any) -> tuple[list[Spec], str]:
    """Gives ``model`` synthetic weights; returns its specs and the weights' digest."""
    import torch

    specs = _specs(model.state_dict())
    weights = synthetic_weights(specs)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    return specs, digest(weights)


def _pooled(model: Any, module: Any, x: np.ndarray) -> np.ndarray:
    return _capture(model, module, x).numpy().astype(np.float32)


def _map_max(model: Any, module: Any, x: np.ndarray) -> np.ndarray:
    """Spatial max (B, C) of the last feature map, which ``module`` receives."""
    return _capture(model, module, x).amax(dim=(2, 3)).numpy().astype(np.float32)


def resnet50() -> dict[str, Any]:
    """torchvision, timm and Cadene ResNet-50 with the same synthetic backbone weights."""
    import pretrainedmodels
    import timm
    import torch
    import torchvision

    x01 = synthetic_input(SIZES["resnet50"])
    x = normalise(x01, IMAGENET_MEAN, IMAGENET_STD)
    out: dict[str, Any] = {"input_sha256": hashlib.sha256(x01.tobytes()).hexdigest()}
    models = {
        "torchvision": torchvision.models.resnet50(weights=None),
        "timm": timm.create_model("resnet50", pretrained=False),
        "cadene": pretrainedmodels.resnet50(pretrained=None),
    }
    for name, model in models.items():
        specs, sha = _load(model)
        head = model.last_linear if name == "cadene" else model.fc
        out[f"{name}_specs"] = json.dumps(specs)
        out[f"{name}_weights_sha256"] = sha
        out[f"{name}_features"] = _pooled(model, head, x)
    out["torchvision_max"] = _map_max(models["torchvision"], models["torchvision"].avgpool, x)
    # A real torch.save (zip) file of the stem, for the file -> load_weights path.
    state = models["torchvision"].state_dict()
    stem = {k: v for k, v in state.items() if k.split(".")[0] in ("conv1", "bn1")}
    torch.save(stem, os.path.join(OUT, "resnet50_stem.pt"))
    return out


def googlenet() -> dict[str, Any]:
    """torchvision GoogLeNet built as for its ImageNet weights: auxiliary classifiers present in
    the state dict, ``transform_input=True`` (ImageNet-normalised input mapped back to
    ``(x - 0.5) / 0.5`` inside the model)."""
    import torchvision

    x01 = synthetic_input(SIZES["googlenet"])
    x = normalise(x01, IMAGENET_MEAN, IMAGENET_STD)
    model = torchvision.models.googlenet(
        weights=None, aux_logits=True, transform_input=True, init_weights=False
    )
    specs, sha = _load(model)
    return {
        "input_sha256": hashlib.sha256(x01.tobytes()).hexdigest(),
        "torchvision_specs": json.dumps(specs),
        "torchvision_weights_sha256": sha,
        "torchvision_features": _pooled(model, model.fc, x),
        "torchvision_max": _map_max(model, model.avgpool, x),
    }


def bninception() -> dict[str, Any]:
    """Cadene's BN-Inception on its own input convention: BGR, 0-255, minus (104, 117, 128)."""
    import pretrainedmodels

    x01 = synthetic_input(SIZES["bninception"])
    bgr = x01[..., ::-1] * np.float32(255.0) - np.asarray((104, 117, 128), np.float32)
    model = pretrainedmodels.bninception(pretrained=None)
    specs, sha = _load(model)
    return {
        "input_sha256": hashlib.sha256(x01.tobytes()).hexdigest(),
        "cadene_specs": json.dumps(specs),
        "cadene_weights_sha256": sha,
        "cadene_features": _pooled(model, model.last_linear, bgr.astype(np.float32)),
        "cadene_max": _map_max(model, model.global_pool, bgr.astype(np.float32)),
    }


BUILDERS = {"resnet50": resnet50, "googlenet": googlenet, "bninception": bninception}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("backbones", nargs="*", help=f"some of {', '.join(BUILDERS)} (all)")
    args = parser.parse_args()
    unknown = set(args.backbones) - set(BUILDERS)
    if unknown:
        parser.error(f"unknown backbones {sorted(unknown)}; choose from {list(BUILDERS)}")
    import torch

    torch.set_num_threads(2)
    os.makedirs(OUT, exist_ok=True)
    for name in args.backbones or list(BUILDERS):
        record = BUILDERS[name]()
        np.savez_compressed(
            os.path.join(OUT, f"{name}.npz"),
            size=np.int64(SIZES[name]),
            seed=np.int64(SEED),
            **{k: np.asarray(v) for k, v in record.items()},
        )
        scales = {k: float(np.abs(v).max()) for k, v in record.items() if k.endswith("features")}
        print(name, "max |features|:", scales)


if __name__ == "__main__":
    main()
