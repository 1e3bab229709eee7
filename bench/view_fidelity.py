"""Device views against the Pillow views (torchvision's PIL path) on real pictures, in uint8 levels.

For every photo augmentation (and the evaluation view) the script draws views as the pipeline
does (``ViewParams``, torchvision's order), makes each one with Pillow and on the device
(``jdml.data.device_views.render``, jitted), and prints the largest and the mean absolute
difference and the share of differing values. Two sets of pictures: scikit-image's sample photos
(several sizes, both orientations) at 224 px, and the emoji set (64 px artwork; built by
``python -m jdml data fetch emoji``, skipped when absent) at 64 px.

It also measures the JAX libraries that could have done the pixel work, on the same views:

* ``jax.image.scale_and_translate`` (linear, antialiased) on each crop's padded canvas, the form a
  jitted step with static shapes needs: its filter reads the pixels next to the crop, where
  torchvision crops first, and its rounding is not Pillow's fixed point;
* dm-pix's ``adjust_contrast``/``adjust_saturation``/``adjust_hue`` (float HSV, per-channel
  contrast means) against Pillow's with the same factor.

``--blend`` checks the arithmetic of brightness, contrast and saturation (Pillow's
``Image.blend``, ``d + f * (x - d)`` in float32) on all 65,536 (degenerate, pixel) level pairs
against Pillow: ``jdml.data.device_views.blend`` and the plain form it replaced, which XLA on the
CPU fuses into a multiply-add, for the factors where the exact value lands on an integer (0.6,
1.2) and drawn ones.

``--cache`` measures what the decode cache's resolution costs instead: RandomResizedCrop views
(224 px) cropped from each photo as the cache stores it (short side 256, the default, or 512),
the box drawn on the original photo and mapped to the cached one, against the same view of the
original photo (what the reference crops), by the crop's share of the photo; and the views'
high-frequency energy (mean absolute Laplacian) as a share of the original's: below 100 %, the
views are softer.

    python bench/view_fidelity.py            # about two minutes on 2 CPU cores
    python bench/view_fidelity.py --views 64
    python bench/view_fidelity.py --blend    # a few seconds
    python bench/view_fidelity.py --cache
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import skimage.data
from PIL import Image

from jdml.data import photo_augment as pa
from jdml.data.device_pixels import Frames, host_canvases
from jdml.data.device_views import blend, hsv_tables, render, view_arrays, view_shape
from jdml.fileio import cache_root

# The ViT recipe's views come last, so the earlier rows keep their seeds (the list index).
AUGMENTATIONS = ("base", "big", "red", "adv", "realistic", "eval", "vit", "eval_bicubic")


def sample_photos() -> list[np.ndarray]:
    names = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "retina")
    return [np.ascontiguousarray(getattr(skimage.data, n)()[..., :3]) for n in names]


def emoji_images(count: int) -> list[np.ndarray]:
    path = os.path.join(cache_root("emoji"), "emoji.npz")
    if not os.path.exists(path):
        return []
    with np.load(path) as data:
        images = data["images"]
    rng = np.random.default_rng(0)
    return [images[i] for i in rng.choice(len(images), count, replace=False)]


def draw(name: str, images: list[np.ndarray], size: int, resize: int, seed: int):
    rng = np.random.default_rng(seed)
    jitter = {"adv": 0.2, "realistic": 0.4}.get(name, 0.0)
    out = []
    for image in images:
        h, w = image.shape[:2]
        if name == "red":
            out.append(pa.red_view_params(h, w, rng, size, resize))
        elif name == "eval":
            out.append(pa.eval_view_params(h, w, resize, size))
        elif name == "eval_bicubic":
            out.append(pa.eval_view_params(h, w, resize, size, "bicubic"))
        elif name == "vit":
            out.append(pa.rrc_view_params(h, w, rng, size, scale=(0.2, 1.0), filter="bicubic"))
        else:
            out.append(pa.rrc_view_params(h, w, rng, size, jitter))
    return out


def device_views(images, params, size, resize, colour) -> np.ndarray:
    frames = Frames.of(np.array([im.shape[:2] for im in images]))
    filter = params[0].filter
    shape = view_shape(size, frames.rows, frames.cols, resize=resize, colour=colour, filter=filter)
    tables = tuple(jnp.asarray(t) for t in hsv_tables()) if colour else None
    fn = jax.jit(lambda c, t, a, tb: render(c, t, a, shape, tb))
    canvases = host_canvases(images, frames.rows, frames.cols)
    out = fn(canvases, frames.transposed, view_arrays(params, shape), tables)
    return np.rint(np.asarray(out) * 255).astype(np.int32)


def library_resize(images, params, size) -> np.ndarray:
    """``jax.image.scale_and_translate`` of each crop box on the padded canvas (Pillow's crop
    and resize is what it stands in for)."""
    out = []
    for image, p in zip(images, params, strict=True):
        top, left, h, w = p.box
        scale = jnp.array([size / h, size / w])
        shift = -jnp.array([top, left]) * scale
        view = jax.image.scale_and_translate(
            jnp.asarray(image, jnp.float32),
            (size, size, 3),
            (0, 1),
            scale,
            shift,
            method="linear",
            antialias=True,
        )
        view = jnp.clip(jnp.round(view), 0, 255)
        out.append(np.asarray(view[:, ::-1] if p.flip else view, np.int32))
    return np.stack(out)


def library_colour(images, params, size) -> dict[str, np.ndarray]:
    """dm-pix's contrast, saturation and hue on each geometric view, against Pillow's."""
    import dm_pix as pix

    ops = {
        "contrast": (1, pix.adjust_contrast, lambda f: f),
        "saturation": (2, pix.adjust_saturation, lambda f: f),
        "hue": (3, pix.adjust_hue, lambda f: f),
    }
    rng = np.random.default_rng(1)
    out = {}
    for name, (op, fn, arg) in ops.items():
        diffs = []
        for image, p in zip(images, params, strict=True):
            geometric = pa.pillow_view(image, pa.ViewParams(p.box, p.resized, p.window, size))
            factor = float(rng.uniform(-0.4, 0.4) if op == 3 else rng.uniform(0.6, 1.4))
            want = pa.JITTER_OPS[op](geometric, factor).astype(np.int32)
            got = fn(jnp.asarray(geometric, jnp.float32) / 255, arg(factor))
            got = np.clip(np.rint(np.asarray(got) * 255), 0, 255).astype(np.int32)
            diffs.append(np.abs(got - want))
        out[name] = np.stack(diffs)
    return out


#: The crop's share of the photo, binned for ``--cache``.
AREA_BINS = ((0.08, 0.25), (0.25, 0.5), (0.5, 1.01))


def laplacian_energy(view: np.ndarray) -> float:
    """Mean absolute 4-neighbour Laplacian of a uint8 view: its fine detail."""
    v = view.astype(np.float64)
    lap = 4 * v[1:-1, 1:-1] - v[:-2, 1:-1] - v[2:, 1:-1] - v[1:-1, :-2] - v[1:-1, 2:]
    return float(np.abs(lap).mean())


def cache_section(views: int) -> None:
    """RandomResizedCrop views from the decode cache's photo against the original's."""
    from jdml.data.benchmarks.decode_cache import shrink

    photos = sample_photos()
    print("\nRandomResizedCrop(224) from the cached photo against the original photo's view")
    print(
        f"({views} boxes per photo on {len(photos)} scikit-image photos, short sides "
        f"{min(min(p.shape[:2]) for p in photos)}-{max(min(p.shape[:2]) for p in photos)} px)\n"
    )
    print(
        "| cache short side | crop share of the photo | views | mean abs diff | "
        "largest diff | detail kept |"
    )
    print("|---|---|---|---|---|---|")
    for side in (256, 512):
        rows: dict[tuple, list] = {b: [] for b in AREA_BINS}
        rng = np.random.default_rng(side)
        for photo in photos:
            cached = shrink(photo, side)
            sy, sx = cached.shape[0] / photo.shape[0], cached.shape[1] / photo.shape[1]
            for _ in range(views):
                top, left, h, w = pa.rrc_params(photo.shape[0], photo.shape[1], rng)
                box = (top, left, h, w)
                ch = min(max(1, round(h * sy)), cached.shape[0])
                cw = min(max(1, round(w * sx)), cached.shape[1])
                ct = min(round(top * sy), cached.shape[0] - ch)
                cl = min(round(left * sx), cached.shape[1] - cw)
                want = pa.pillow_view(photo, pa.ViewParams(box, (224, 224), (0, 0), 224))
                got = pa.pillow_view(
                    cached, pa.ViewParams((ct, cl, ch, cw), (224, 224), (0, 0), 224)
                )
                share = h * w / (photo.shape[0] * photo.shape[1])
                diff = np.abs(got.astype(np.int32) - want)
                kept = laplacian_energy(got) / max(laplacian_energy(want), 1e-9)
                for low, high in AREA_BINS:
                    if low <= share < high:
                        rows[(low, high)].append((diff.mean(), diff.max(), kept))
        for (low, high), values in rows.items():
            if not values:
                continue
            mean, top, kept = (np.array(v) for v in zip(*values, strict=True))
            print(
                f"| {side} | {low:.2f}-{min(high, 1.0):.2f} | {len(values)} | {mean.mean():.2f} | "
                f"{int(top.max())} | {100 * kept.mean():.0f} % |"
            )


def plain_blend(degenerate: jax.Array, pixels: jax.Array, factor: jax.Array) -> jax.Array:
    """``d + f * (x - d)`` written as it reads (the device's blend before issue 78)."""
    out = degenerate.astype(jnp.float32) + factor * (pixels - degenerate).astype(jnp.float32)
    return jnp.clip(jnp.floor(out), 0, 255).astype(jnp.int32)


def blend_section(drawn: int) -> None:
    """Pixel pairs where each blend differs from Pillow's, per factor; the drawn factors (from
    ColorJitter's ranges, 0 to 2) summed in one row."""
    grid = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8))
    degenerate, pixels = (jnp.asarray(a, jnp.int32) for a in grid)
    images = [Image.fromarray(a) for a in grid]
    forms = {"plain d + f * (x - d)": jax.jit(plain_blend), "device_views.blend": jax.jit(blend)}
    factors = np.random.default_rng(0).uniform(0.0, 2.0, drawn).astype(np.float32)
    print(f"JAX {jax.__version__} on {jax.default_backend()}; all 65,536 level pairs a factor\n")
    print("| factor | " + " | ".join(f"{name}: pairs off Pillow" for name in forms) + " |")
    print("|---|" + "---|" * len(forms))
    wrong = dict.fromkeys(forms, 0)
    for factor in [0.6, 1.2, *factors]:
        want = np.asarray(Image.blend(*images, float(factor)))
        counts = {
            name: int(np.sum(np.asarray(fn(degenerate, pixels, jnp.float32(factor))) != want))
            for name, fn in forms.items()
        }
        if factor in (0.6, 1.2):
            print(f"| {factor} | " + " | ".join(f"{n:,}" for n in counts.values()) + " |")
        else:
            wrong = {name: wrong[name] + n for name, n in counts.items()}
    cells = " | ".join(f"{n:,} of {65536 * drawn:,}" for n in wrong.values())
    print(f"| {drawn} drawn in [0, 2) (seed 0) | {cells} |")


def row(label: str, diff: np.ndarray) -> str:
    return f"| {label} | {int(diff.max())} | {diff.mean():.4f} | {100 * np.mean(diff > 0):.3f} % |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=48, help="views per augmentation and set")
    parser.add_argument("--cache", action="store_true", help="the decode cache's resolution")
    parser.add_argument("--blend", action="store_true", help="the colour blend on every level pair")
    parser.add_argument("--factors", type=int, default=200, help="--blend's drawn factors")
    args = parser.parse_args()
    if args.blend:
        blend_section(args.factors)
        return
    if args.cache:
        cache_section(args.views)
        return
    photos = sample_photos()
    sets = [("scikit-image photos", photos, 224, 256)]
    emoji = emoji_images(args.views)
    if emoji:
        sets.append(("emoji set", emoji, 64, 72))
    else:
        print("emoji set absent (python -m jdml data fetch emoji): photos only")
    print(f"JAX {jax.__version__} on {jax.default_backend()}; {args.views} views per row")
    print("\n| views | max abs diff (levels) | mean abs diff | values that differ |")
    print("|---|---|---|---|")
    for set_name, pictures, size, resize in sets:
        images = [pictures[i % len(pictures)] for i in range(args.views)]
        for name in AUGMENTATIONS:
            side = size * 8 // 7 if name == "big" else size  # big: 256 for 224
            params = draw(name, images, side, resize, seed=AUGMENTATIONS.index(name))
            colour = name in ("adv", "realistic")
            got = device_views(images, params, side, resize, colour)
            want = np.stack([pa.pillow_view(im, p) for im, p in zip(images, params, strict=True)])
            print(row(f"{set_name}, {name}: device views", np.abs(got - want)))
    print("\nThe JAX libraries on the same views (scikit-image photos, base's boxes):\n")
    print("| library operation | max abs diff (levels) | mean abs diff | values that differ |")
    print("|---|---|---|---|")
    images = [photos[i % len(photos)] for i in range(args.views)]
    params = draw("base", images, 224, 256, seed=0)
    want = np.stack([pa.pillow_view(im, p) for im, p in zip(images, params, strict=True)])
    got = library_resize(images, params, 224)
    print(row("jax.image.scale_and_translate, crop + resize", np.abs(got - want)))
    try:
        colours = library_colour(images, params, 224)
    except ImportError:
        print("| dm-pix | not installed (pip install dm-pix) | | |")
        return
    for name, diff in colours.items():
        print(row(f"dm-pix adjust_{name}", diff))


if __name__ == "__main__":
    main()
