"""Photo augmentations against torchvision's recorded outputs (tools/make_augment_golden.py).

Every comparison with torchvision is exact: the reference applies its transforms to PIL images,
and jdml does the same arithmetic through the same Pillow calls (checked: the golden file records
the Pillow version it was made with). Random pipelines are compared by replaying, through a
stand-in generator, the very numbers torch drew when the golden outputs were recorded.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import PIL
import pytest
import skimage  # the full-size photos (a test dependency)
from PIL import Image

from jdml.data import photo_augment as pa
from jdml.data.augment import AUGMENTATIONS
from tests.helpers import GOLDEN

GOLDEN_FILE = os.path.join(GOLDEN, "augment", "golden.npz")
UNIFORM, RANDINT, RAND, RANDPERM = 0, 1, 2, 3  # the tool's codes for recorded draws
PIPELINES = {  # name -> the batch function with the small sizes the golden file was made with
    "base": lambda x, rng: pa.base_augment(x, rng, size=32),
    "big": lambda x, rng: pa.big_augment(x, rng, size=40),
    "red": lambda x, rng: pa.red_augment(x, rng, size=32, resize=40),
    "adv": lambda x, rng: pa.adv_augment(x, rng, size=32),
    "realistic": lambda x, rng: pa.realistic_augment(x, rng, size=32),
    "vit": lambda x, rng: pa.vit_augment(x, rng, size=32),
}
IMAGES = ["cat", "coffee", "noise"]


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN_FILE) as g:
        data = {k: g[k] for k in g.files}
    assert str(data["versions"][2]) == PIL.__version__, "golden made with another Pillow"
    return data


@pytest.fixture(scope="module")
def photos_dir() -> str:
    return os.path.join(os.path.dirname(skimage.__file__), "data")


def full_photo(folder: str, name: str) -> np.ndarray:
    with Image.open(os.path.join(folder, name)) as im:
        return np.array(im.convert("RGB"))


def sha(batch: np.ndarray) -> str:
    pixels = np.rint(batch[0] * 255.0).astype(np.uint8)
    return hashlib.sha256(pixels.tobytes()).hexdigest()


class Replay:
    """Stands in for ``np.random.Generator``: hands out torch's recorded draws in order and
    checks that each is asked for by the matching call with compatible bounds."""

    def __init__(self, table: np.ndarray) -> None:
        self.rows = [(int(k), float(v)) for k, v in table]
        self.used = 0

    def _next(self, kind: int) -> float:
        assert self.used < len(self.rows), "more draws than torchvision made"
        k, v = self.rows[self.used]
        assert k == kind, f"draw {self.used}: torchvision made kind {k}, jdml asked for {kind}"
        self.used += 1
        return v

    def uniform(self, low: float, high: float) -> float:
        v = self._next(UNIFORM)
        assert low - 1e-6 <= v <= high + 1e-6  # torch's bounds were float32
        return v

    def integers(self, low: int, high: int) -> int:
        v = int(self._next(RANDINT))
        assert low <= v < high
        return v

    def random(self) -> float:
        return self._next(RAND)

    def permutation(self, n: int) -> np.ndarray:
        digits = f"{int(self._next(RANDPERM)):0{n}d}"
        return np.array([int(c) for c in digits])

    def exhausted(self) -> bool:
        return self.used == len(self.rows)


# ----------------------------------------------------------------------------- fixed operations


@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("op", ["brightness", "contrast", "saturation", "hue"])
def test_colour_ops_equal_torchvision(golden, op, image):
    fn = getattr(pa, f"adjust_{op}")
    src = golden[f"image__{image}"]
    for factor, expected in zip(golden[f"factors__{op}"], golden[f"{op}__{image}"], strict=True):
        np.testing.assert_array_equal(fn(src, float(factor)), expected, err_msg=f"{op} {factor}")


@pytest.mark.parametrize("image", IMAGES)
def test_grayscale_equals_torchvision(golden, image):
    out = pa.to_grayscale(golden[f"image__{image}"])
    np.testing.assert_array_equal(out, golden[f"grayscale__{image}"])


def test_resized_crop_equals_torchvision(golden):
    for box, expected in zip(golden["crop_boxes"], golden["resized_crop__cat"], strict=True):
        out = pa.resized_crop(golden["image__cat"], tuple(int(v) for v in box), 24)
        np.testing.assert_array_equal(out, expected, err_msg=str(box))


@pytest.mark.parametrize("filter, key", [("bilinear", "eval"), ("bicubic", "evalbicubic")])
def test_eval_equals_torchvision(golden, filter, key):
    for h, w in golden["eval_shapes"]:
        out = pa.eval_photos([golden["image__eval"][:h, :w]], resize=40, crop=32, filter=filter)
        np.testing.assert_array_equal(out[0], golden[f"{key}__{h}x{w}"] / np.float32(255.0))


@pytest.mark.parametrize("filter, key", [("bilinear", "fulleval"), ("bicubic", "fullevalbicubic")])
def test_eval_full_photos_equal_torchvision(golden, photos_dir, filter, key):
    for name in ("chelsea.png", "coffee.png", "rocket.jpg"):
        out = pa.eval_photos([full_photo(photos_dir, name)], filter=filter)
        assert out.shape == (1, 224, 224, 3)
        assert sha(out) == str(golden[f"{key}__{name}"]), name


def test_flip_is_exact():
    img = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    flipped = pa.hflip(img)
    np.testing.assert_array_equal(
        flipped, np.asarray(Image.fromarray(img).transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    )
    np.testing.assert_array_equal(flipped[:, 0], img[:, -1])
    np.testing.assert_array_equal(pa.hflip(flipped), img)


def test_hue_and_jitter_reject_out_of_range():
    img = np.zeros((2, 2, 3), np.uint8)
    with pytest.raises(ValueError):
        pa.adjust_hue(img, 0.6)
    with pytest.raises(ValueError):
        pa.color_jitter(img, np.random.default_rng(0), 0.1, 0.1, 0.1, 0.7)


def test_jitter_with_zero_strengths_only_draws_the_order():
    img = np.random.default_rng(1).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    rng = Replay(np.array([[RANDPERM, 3120.0]]))
    np.testing.assert_array_equal(pa.color_jitter(img, rng, 0, 0, 0, 0), img)
    assert rng.exhausted()


# ----------------------------------------------------------------------------- random boxes


def test_rrc_params_replay_torchvision(golden):
    cases, draws, offsets = golden["rrc_cases"], golden["rrc_draws"], golden["rrc_offsets"]
    for case, start, stop in zip(cases, offsets[:-1], offsets[1:], strict=True):
        rng = Replay(draws[start:stop])
        box = pa.rrc_params(int(case[0]), int(case[1]), rng)
        assert box == tuple(int(v) for v in case[2:]), case
        assert rng.exhausted()


@pytest.mark.parametrize("shape", [(375, 500), (500, 375), (224, 224), (90, 200), (64, 48)])
def test_rrc_params_respect_bounds(shape):
    height, width = shape
    area = height * width
    rng = np.random.default_rng(3)
    for _ in range(2000):
        top, left, h, w = pa.rrc_params(height, width, rng)
        assert top >= 0 and left >= 0 and top + h <= height and left + w <= width
        # w, h are sqrt(area * ratio), sqrt(area / ratio) rounded: some real (w0, h0) within
        # half a pixel of (w, h) must have its area fraction in [0.08, 1] and w0 / h0 in
        # [3/4, 4/3].
        assert 0.08 * area <= (w + 0.5) * (h + 0.5) and (w - 0.5) * (h - 0.5) <= area
        assert (w + 0.5) / (h - 0.5) >= 3 / 4 and (w - 0.5) / (h + 0.5) <= 4 / 3


@pytest.mark.parametrize(
    "shape, box",
    [((10, 1000), (0, 493, 10, 13)), ((1000, 10), (493, 0, 13, 10)), ((3, 700), (0, 348, 3, 4))],
)
def test_rrc_params_fall_back_to_a_central_crop(shape, box):
    rng = np.random.default_rng(0)
    assert pa.rrc_params(*shape, rng) == box  # no attempt can fit: the ratio is clamped
    fresh = np.random.default_rng(0)
    fresh.uniform(size=20)  # exactly the 10 x 2 failed attempts were drawn
    assert rng.uniform() == fresh.uniform()


def test_random_crop_params():
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    assert pa.random_crop_params(32, 32, 32, rng) == (0, 0, 32, 32)
    assert rng.bit_generator.state == state  # nothing drawn for an exact fit, as torchvision
    for _ in range(200):
        top, left, h, w = pa.random_crop_params(40, 57, 32, rng)
        assert (h, w) == (32, 32) and 0 <= top <= 8 and 0 <= left <= 25
    with pytest.raises(ValueError):
        pa.random_crop_params(31, 40, 32, rng)


# ----------------------------------------------------------------------------- batch pipelines


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipelines_replay_torchvision(golden, name, seed):
    rng = Replay(golden[f"draws__{name}__{seed}"])
    out = PIPELINES[name]([golden["image__eval"]], rng)
    np.testing.assert_array_equal(out[0], golden[f"pipe__{name}__{seed}"] / np.float32(255.0))
    assert rng.exhausted()


@pytest.mark.parametrize("name", ["base", "big", "red", "adv", "realistic", "vit"])
def test_full_size_pipelines_replay_torchvision(golden, photos_dir, name):
    fn = AUGMENTATIONS.get(name)
    for photo in ("chelsea.png", "coffee.png", "rocket.jpg"):
        for seed in range(2):
            rng = Replay(golden[f"fulldraws__{name}__{photo}__{seed}"])
            out = fn([full_photo(photos_dir, photo)], rng)
            assert sha(out) == str(golden[f"fullpipe__{name}__{photo}__{seed}"]), (photo, seed)
            assert rng.exhausted()


def test_registered_under_the_reference_names():
    assert {"base", "big", "red", "adv", "realistic"} <= set(AUGMENTATIONS.names())
    assert AUGMENTATIONS.get("base") is pa.base_augment


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_batches_are_seeded_and_well_formed(name):
    gen = np.random.default_rng(7)
    photos = [
        gen.integers(0, 256, (60, 45, 3), dtype=np.uint8),
        gen.integers(0, 256, (41, 90, 3), dtype=np.uint8),
        gen.integers(0, 256, (50, 50), dtype=np.uint8),  # grey, 2-D
        gen.integers(0, 256, (44, 70, 1), dtype=np.uint8),  # grey, one channel
    ]
    fn = PIPELINES[name]
    a = fn(photos, np.random.default_rng((0, 5, 1)))
    b = fn(photos, np.random.default_rng((0, 5, 1)))
    c = fn(photos, np.random.default_rng((0, 6, 1)))
    side = 40 if name == "big" else 32
    assert a.shape == (4, side, side, 3) and a.dtype == np.float32
    assert a.min() >= 0.0 and a.max() <= 1.0
    np.testing.assert_array_equal(np.rint(a * 255) / np.float32(255), a)  # ToTensor's x / 255
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    for grey in a[2:]:  # grey photos stay grey through every operation
        np.testing.assert_array_equal(grey[..., 0], grey[..., 1])
        np.testing.assert_array_equal(grey[..., 0], grey[..., 2])


def test_uniform_array_batch_and_default_sizes():
    photos = np.random.default_rng(2).integers(0, 256, (2, 300, 260, 3), dtype=np.uint8)
    rng = np.random.default_rng(0)
    assert AUGMENTATIONS.get("base")(photos, rng).shape == (2, 224, 224, 3)
    assert AUGMENTATIONS.get("big")(photos, rng).shape == (2, 256, 256, 3)
    assert AUGMENTATIONS.get("red")(photos, rng).shape == (2, 224, 224, 3)
    assert pa.eval_photos(photos).shape == (2, 224, 224, 3)


def test_inputs_are_left_untouched():
    photo = np.random.default_rng(4).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    keep = photo.copy()
    for fn in PIPELINES.values():
        fn([photo], np.random.default_rng(1))
    np.testing.assert_array_equal(photo, keep)


def test_rejects_non_uint8_or_odd_channels():
    with pytest.raises(TypeError):
        pa.base_augment([np.zeros((40, 40, 3), np.float32)], np.random.default_rng(0), size=32)
    with pytest.raises(ValueError):
        pa.base_augment([np.zeros((40, 40, 4), np.uint8)], np.random.default_rng(0), size=32)
