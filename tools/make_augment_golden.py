"""Records torchvision's outputs of the photo augmentations, for tests/data/test_photo_augment.py.

The reference code applies its transforms to PIL images, so this records torchvision's PIL path:
each colour operation at fixed factors, grayscale, resized crops with fixed boxes, the evaluation
Resize + CenterCrop, RandomResizedCrop's boxes, and whole training pipelines (``base``, ``big``,
``red``, ``adv``, ``realistic``) together with every random number torch drew for them, so the
test can replay those draws through jdml's functions and demand identical pixels. Inputs are
small fixed images cut from scikit-image's photos plus a seeded noise image; full-size outputs
are stored as SHA-256 digests only, which keeps ``tests/golden/augment/golden.npz`` small.

torch is not a jdml dependency; run this with a Python that has torch, torchvision and Pillow
(the same Pillow version as the project's, since Pillow does the arithmetic):

  PHOTOS="$(.venv/bin/python -c 'import os, skimage; print(os.path.dirname(skimage.__file__))')"
  /work/refenv/bin/python tools/make_augment_golden.py --photos "$PHOTOS/data"
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Callable

import numpy as np
import PIL
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image

BICUBIC = T.InterpolationMode.BICUBIC

# Kinds of recorded draws (first column of a draw table); a permutation is stored as the
# decimal digits of its entries.
UNIFORM, RANDINT, RAND, RANDPERM = 0, 1, 2, 3

FACTORS = {
    "brightness": [0.0, 0.7, 1.35],
    "contrast": [0.0, 0.65, 1.4],
    "saturation": [0.0, 0.6, 1.4],
    "hue": [-0.5, -0.1, 0.05, 0.23, 0.5],
}
OPS = {
    "brightness": TF.adjust_brightness,
    "contrast": TF.adjust_contrast,
    "saturation": TF.adjust_saturation,
    "hue": TF.adjust_hue,
}
CROP_BOXES = [(0, 0, 30, 46), (3, 5, 10, 12), (7, 2, 20, 9), (29, 45, 1, 1)]
EVAL_SHAPES = [(75, 113), (40, 55), (64, 41), (57, 57), (23, 31)]  # prefixes of the eval image
RRC_SHAPES = [(300, 451), (500, 375), (224, 224), (10, 1000), (1000, 10), (1, 1), (3, 700)]
FULL_PHOTOS = ["chelsea.png", "coffee.png", "rocket.jpg"]


class DrawLog:
    """Wraps torch's random functions that torchvision's transforms call and logs each result."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float]] = []
        self._saved: dict[str, Callable] = {}

    def __enter__(self) -> DrawLog:
        uniform, randint = torch.Tensor.uniform_, torch.randint
        rand, randperm = torch.rand, torch.randperm
        self._saved = {"uniform_": uniform, "randint": randint, "rand": rand, "randperm": randperm}

        def log_uniform(t, *a, **k):
            out = uniform(t, *a, **k)
            self.rows.append((UNIFORM, float(out.item())))
            return out

        def log_randint(*a, **k):
            out = randint(*a, **k)
            self.rows.append((RANDINT, float(out.item())))
            return out

        def log_rand(*a, **k):
            out = rand(*a, **k)
            self.rows.append((RAND, float(out.item())))
            return out

        def log_randperm(*a, **k):
            out = randperm(*a, **k)
            self.rows.append((RANDPERM, float("".join(str(int(v)) for v in out))))
            return out

        torch.Tensor.uniform_ = log_uniform
        torch.randint, torch.rand, torch.randperm = log_randint, log_rand, log_randperm
        return self

    def __exit__(self, *exc) -> None:
        torch.Tensor.uniform_ = self._saved["uniform_"]
        torch.randint, torch.rand = self._saved["randint"], self._saved["rand"]
        torch.randperm = self._saved["randperm"]

    def table(self) -> np.ndarray:
        return np.array(self.rows, dtype=np.float64).reshape(-1, 2)


def pipelines(size: int, big: int, resize: int) -> dict[str, T.Compose]:
    """The reference's training transforms on PIL images (without ToTensor/Normalize)."""
    flip = T.RandomHorizontalFlip(0.5)

    def jittered(strength: float) -> T.Compose:
        jitter = T.ColorJitter(strength, strength, strength, strength)
        return T.Compose([T.RandomResizedCrop(size), T.RandomGrayscale(0.2), jitter, flip])

    return {
        "base": T.Compose([T.RandomResizedCrop(size), flip]),
        "big": T.Compose([T.RandomResizedCrop(big), flip]),
        "red": T.Compose([T.Resize(resize), T.RandomCrop(size), flip]),
        "adv": jittered(0.2),
        "realistic": jittered(0.4),
        # The ViT recipes' view (Hyp-ViT's train_tr): a larger minimum area, bicubic.
        "vit": T.Compose(
            [T.RandomResizedCrop(size, scale=(0.2, 1.0), interpolation=BICUBIC), flip]
        ),
    }


def replay_record(transform: Callable, image: np.ndarray, seed: int) -> tuple[np.ndarray, ...]:
    """torchvision's output for ``seed`` and the draws it made."""
    torch.manual_seed(seed)
    with DrawLog() as log:
        out = np.asarray(transform(Image.fromarray(image)))
    return out, log.table()


def sha(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image, dtype=np.uint8).tobytes()).hexdigest()


def tensor_path_gap(image: np.ndarray) -> dict[str, int]:
    """Largest difference between torchvision's tensor and PIL paths per colour op (printed)."""
    t = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    gaps = {}
    for name, factors in FACTORS.items():
        for f in factors:
            a = OPS[name](t, f).permute(1, 2, 0).numpy().astype(int)
            b = np.asarray(OPS[name](Image.fromarray(image), f)).astype(int)
            gaps[f"{name} {f}"] = int(np.abs(a - b).max())
    g = TF.rgb_to_grayscale(t).numpy()[0].astype(int)
    gaps["grayscale"] = int(np.abs(g - np.asarray(Image.fromarray(image).convert("L"))).max())
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", required=True, help="scikit-image's data folder")
    parser.add_argument("--out", default="tests/golden/augment/golden.npz")
    args = parser.parse_args()

    def photo(name: str) -> np.ndarray:
        with Image.open(os.path.join(args.photos, name)) as im:
            return np.array(im.convert("RGB"))

    noise = np.random.default_rng(0).integers(0, 256, (23, 31, 3), dtype=np.uint8)
    noise[:4] = noise[:4, :, :1]  # grey pixels (hue undefined) and
    noise[4, :8] = [[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0]] * 2  # pure colours
    images = {
        "cat": photo("chelsea.png")[::10, ::10],  # (30, 46): plain decimation, no resampling
        "coffee": photo("coffee.png")[::12, ::12],  # (34, 50)
        "noise": noise,
    }
    out: dict[str, np.ndarray] = {f"image__{k}": v for k, v in images.items()}
    for name, factors in FACTORS.items():
        out[f"factors__{name}"] = np.array(factors)
        for key, image in images.items():
            pil = Image.fromarray(image)
            out[f"{name}__{key}"] = np.stack([np.asarray(OPS[name](pil, f)) for f in factors])
    for key, image in images.items():
        out[f"grayscale__{key}"] = np.asarray(TF.rgb_to_grayscale(Image.fromarray(image), 3))
        print(key, "tensor - PIL path, max grey levels:", tensor_path_gap(image))

    out["crop_boxes"] = np.array(CROP_BOXES)
    pil_cat = Image.fromarray(images["cat"])
    out["resized_crop__cat"] = np.stack(
        [np.asarray(TF.resized_crop(pil_cat, *box, [24, 24])) for box in CROP_BOXES]
    )
    big_cat = photo("chelsea.png")[::4, ::4]  # (75, 113)
    out["image__eval"] = big_cat
    out["eval_shapes"] = np.array(EVAL_SHAPES)
    evaluation = T.Compose([T.Resize(40), T.CenterCrop(32)])
    bicubic = T.Compose([T.Resize(40, interpolation=BICUBIC), T.CenterCrop(32)])
    for h, w in EVAL_SHAPES:
        out[f"eval__{h}x{w}"] = np.asarray(evaluation(Image.fromarray(big_cat[:h, :w])))
        out[f"evalbicubic__{h}x{w}"] = np.asarray(bicubic(Image.fromarray(big_cat[:h, :w])))

    # RandomResizedCrop boxes with the draws behind them, for many seeds and shapes.
    rows, draws, offsets = [], [], [0]
    for h, w in RRC_SHAPES:
        for seed in range(40):
            torch.manual_seed(seed)
            with DrawLog() as log:
                box = T.RandomResizedCrop.get_params(
                    torch.empty(3, h, w), [0.08, 1.0], [3 / 4, 4 / 3]
                )
            rows.append((h, w, *box))
            draws.append(log.table())
            offsets.append(offsets[-1] + len(log.rows))
    out["rrc_cases"] = np.array(rows)  # h, w, top, left, crop h, crop w
    out["rrc_draws"] = np.concatenate(draws)
    out["rrc_offsets"] = np.array(offsets)

    # Whole pipelines: small sizes on the eval image, default sizes on full photos (digests).
    small = pipelines(size=32, big=40, resize=40)
    full = pipelines(size=224, big=256, resize=256)
    for name in small:
        for seed in range(4):
            pixels, table = replay_record(small[name], big_cat, seed)
            out[f"pipe__{name}__{seed}"], out[f"draws__{name}__{seed}"] = pixels, table
        for pname in FULL_PHOTOS:
            for seed in range(2):
                pixels, table = replay_record(full[name], photo(pname), seed)
                out[f"fullpipe__{name}__{pname}__{seed}"] = np.array(sha(pixels))
                out[f"fulldraws__{name}__{pname}__{seed}"] = table
    full_eval = T.Compose([T.Resize(256), T.CenterCrop(224)])
    full_bicubic = T.Compose([T.Resize(256, interpolation=BICUBIC), T.CenterCrop(224)])
    for pname in FULL_PHOTOS:
        out[f"fulleval__{pname}"] = np.array(
            sha(np.asarray(full_eval(Image.fromarray(photo(pname)))))
        )
        out[f"fullevalbicubic__{pname}"] = np.array(
            sha(np.asarray(full_bicubic(Image.fromarray(photo(pname)))))
        )

    out["versions"] = np.array([torch.__version__, torchvision.__version__, PIL.__version__])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    np.savez_compressed(args.out, **out)
    print(f"wrote {args.out}: {len(out)} arrays, {os.path.getsize(args.out) / 1024:.0f} KB")


if __name__ == "__main__":
    main()
