"""Real-photo transfer check: EfficientNet-Lite0 ImageNet features against raw pixels.

With no labelled natural-image set installable here, the check is instance retrieval on real
photos: scikit-image's photographs (astronaut, cat, coffee, rocket, motorcycle, coins, Hubble
field, retina, textures, ...) are the classes, and each gets ``--views`` random views made by
the ``realistic`` augmentation's operations (RandomResizedCrop of a small area, grayscale with
probability 0.2, colour jitter 0.4, flip), so retrieving a view's siblings means recognising what
a small part of a photo shows. Views are embedded by

* raw pixels (the 224 x 224 view, and a 32 x 32 thumbnail of it),
* EfficientNet-Lite0 with random weights (the architecture alone),
* EfficientNet-Lite0 with its ImageNet weights (``model.pretrained=packaged``),

and evaluated with jdml's leave-one-out retrieval metrics. Usage:

  python experiments/photo_transfer.py [--views 24] [--scale 0.08 0.3] [--seed 0]
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import skimage
from PIL import Image

from jdml.data.photo_augment import color_jitter, hflip, resized_crop, rrc_params, to_grayscale
from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.models.efficientnet import MEAN, STD, EfficientNetLite0
from jdml.models.pretrained.backbones import load_backbone

PHOTOS = (
    "astronaut.png",
    "brick.png",
    "camera.png",
    "chelsea.png",
    "coffee.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "moon.png",
    "motorcycle_left.png",
    "retina.jpg",
    "rocket.jpg",
)
METRICS = ["recall@1", "map@r", "nmi"]


def views(count: int, scale: tuple[float, float], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` augmented 224 x 224 views of every photo, uint8, and their photo labels."""
    folder = os.path.join(os.path.dirname(skimage.__file__), "data")
    images, labels = [], []
    for label, name in enumerate(PHOTOS):
        with Image.open(os.path.join(folder, name)) as photo:
            rgb = np.asarray(photo.convert("RGB"))
        rng = np.random.default_rng((seed, label))
        for _ in range(count):
            box = rrc_params(rgb.shape[0], rgb.shape[1], rng, scale=scale, ratio=(3 / 4, 4 / 3))
            view = resized_crop(rgb, box, 224)
            if rng.random() < 0.2:
                view = to_grayscale(view)
            view = color_jitter(view, rng, 0.4, 0.4, 0.4, 0.4)
            images.append(hflip(view) if rng.random() < 0.5 else view)
            labels.append(label)
    return np.stack(images), np.asarray(labels, np.int32)


def lite0_features(images: np.ndarray, pretrained: bool, batch: int = 64) -> np.ndarray:
    """Pooled 1280-d EfficientNet-Lite0 features (eval mode) of uint8 images."""
    model = EfficientNetLite0()
    x0 = jnp.zeros((1, 224, 224, 3))
    variables = model.init(jax.random.PRNGKey(0), x0)
    if pretrained:
        wrapped = {k: {"backbone": v} for k, v in variables.items()}
        filled = load_backbone("efficientnet_lite0", "packaged")(wrapped)
        variables = {k: v["backbone"] for k, v in filled.items()}
    apply = jax.jit(model.apply)
    out = []
    for start in range(0, len(images), batch):
        chunk = images[start : start + batch].astype(np.float32) / 255.0
        out.append(np.asarray(apply(variables, (chunk - MEAN) / STD)))
    return np.concatenate(out)


def thumbnails(images: np.ndarray, size: int = 32) -> np.ndarray:
    return np.stack(
        [np.asarray(Image.fromarray(x).resize((size, size), Image.Resampling.BOX)) for x in images]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--views", type=int, default=24)
    parser.add_argument("--scale", type=float, nargs=2, default=(0.08, 0.3))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    images, labels = views(args.views, tuple(args.scale), args.seed)
    print(
        f"{len(PHOTOS)} photos x {args.views} views ({len(images)} images, crops of "
        f"{args.scale[0]:g}-{args.scale[1]:g} of the photo's area) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    as_float = functools.partial(np.asarray, dtype=np.float32)
    rows = {
        "raw pixels, 224 x 224 x 3": as_float(images.reshape(len(images), -1)) / 255.0,
        "raw pixels, 32 x 32 x 3 thumbnail": as_float(thumbnails(images)).reshape(len(images), -1)
        / 255.0,
        "EfficientNet-Lite0, random weights": lite0_features(images, pretrained=False),
        "EfficientNet-Lite0, ImageNet weights": lite0_features(images, pretrained=True),
    }
    print(f"{'embedding':40s} " + " ".join(f"{m:>9s}" for m in METRICS))
    for name, x in rows.items():
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        result = evaluate_embeddings(x, labels, METRICS, seed=args.seed)
        print(f"{name:40s} " + " ".join(f"{100 * result[m]:9.2f}" for m in METRICS))


if __name__ == "__main__":
    main()
