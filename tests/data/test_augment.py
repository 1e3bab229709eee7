"""Augmentations: determinism per (seed, step), identity warp, shapes and ranges."""

from __future__ import annotations

import numpy as np
import pytest

from jdml.data.augment import AUGMENTATIONS, affine_augment, random_affine_params, warp_affine


def test_identity_warp_is_exact():
    img = np.random.default_rng(0).integers(0, 256, (3, 9, 7, 1), dtype=np.uint8)
    out = warp_affine(img, np.tile(np.eye(2), (3, 1, 1)), np.zeros((3, 2)))
    np.testing.assert_array_equal(out, img.astype(np.float32))


def test_shift_moves_content():
    img = np.zeros((1, 8, 8, 1), np.uint8)
    img[0, 2, 3] = 255
    out = warp_affine(img, np.eye(2)[None], np.array([[1 / 8, 2 / 8]]))  # +1 row, +2 cols
    assert out[0, 3, 5, 0] == 255 and out.sum() == 255


def _warp_one_pixel_at_a_time(img, mat, shift):
    """warp_affine's definition evaluated pixel by pixel in float64: the source point of output
    pixel x is A^-1 (x - c - t * size) + c, read bilinearly, coordinates clamped to the image."""
    h, w, _ = img.shape
    centre = np.array([(h - 1) / 2, (w - 1) / 2])
    inv = np.linalg.inv(mat)
    out = np.zeros(img.shape)
    for i in range(h):
        for j in range(w):
            r, c = inv @ (np.array([i, j]) - centre - shift * np.array([h, w])) + centre
            r0, c0 = min(max(int(np.floor(r)), 0), h - 1), min(max(int(np.floor(c)), 0), w - 1)
            r1, c1 = min(r0 + 1, h - 1), min(c0 + 1, w - 1)
            fr, fc = min(max(r - r0, 0.0), 1.0), min(max(c - c0, 0.0), 1.0)
            top = img[r0, c0] * (1 - fc) + img[r0, c1] * fc
            bot = img[r1, c0] * (1 - fc) + img[r1, c1] * fc
            out[i, j] = top * (1 - fr) + bot * fr
    return out


@pytest.mark.parametrize("shape", [(3, 7, 5, 2), (1, 1, 1, 3), (2, 2, 9, 1)])
def test_warp_matches_a_pixel_by_pixel_computation(shape):
    rng = np.random.default_rng(sum(shape))
    img = rng.integers(0, 256, shape, dtype=np.uint8)
    mats, shifts = random_affine_params(
        rng, shape[0], scale=(0.4, 2.5), max_shift=0.6, max_rotate_deg=180
    )
    out = warp_affine(img, mats, shifts)
    assert out.dtype == np.float32 and out.shape == img.shape
    for k in range(shape[0]):
        want = _warp_one_pixel_at_a_time(img[k].astype(np.float64), mats[k], shifts[k])
        np.testing.assert_allclose(out[k], want, rtol=0, atol=2e-4)


def test_warp_of_a_batch_equals_the_warps_of_its_images():
    """The pipeline warps one image at a time (each has its own generator); batching must not
    change a bit."""
    rng = np.random.default_rng(4)
    img = rng.integers(0, 256, (5, 12, 10, 3), dtype=np.uint8)
    mats, shifts = random_affine_params(rng, 5)
    whole = warp_affine(img, mats, shifts)
    one = [warp_affine(img[k : k + 1], mats[k : k + 1], shifts[k : k + 1]) for k in range(5)]
    np.testing.assert_array_equal(whole, np.concatenate(one))


def test_affine_deterministic_per_seed_and_in_range():
    img = np.random.default_rng(1).integers(0, 256, (4, 16, 16, 1), dtype=np.uint8)
    a = affine_augment(img, np.random.default_rng((0, 5, 1)))
    b = affine_augment(img, np.random.default_rng((0, 5, 1)))
    c = affine_augment(img, np.random.default_rng((0, 6, 1)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.dtype == np.float32 and a.shape == img.shape and a.min() >= 0 and a.max() <= 1


def test_registry_names():
    assert {"none", "affine"} <= set(AUGMENTATIONS.names())


def test_augmentations_carry_their_photo_flag_and_config_keywords() -> None:
    import ml_collections

    from jdml.data.augment import make_augmentation
    from jdml.errors import UnknownNameError

    assert AUGMENTATIONS.names_where("photo") == ["adv", "base", "big", "realistic", "red", "vit"]
    assert AUGMENTATIONS.meta("vit")["filter"] == "bicubic"
    assert AUGMENTATIONS.meta("red")["config"] == {"size": "image_size", "resize": "resize"}
    assert dict(AUGMENTATIONS.meta("affine")) == {}
    with pytest.raises(TypeError):
        AUGMENTATIONS.meta("red")["photo"] = False  # read-only
    with pytest.raises(UnknownNameError, match="known augmentation names"):
        AUGMENTATIONS.meta("blur")
    cfg = ml_collections.ConfigDict({"augment": "red", "image_size": 8, "resize": 10})
    assert make_augmentation(cfg).keywords == {"size": 8, "resize": 10}
    cfg.augment = "adv"
    assert make_augmentation(cfg).keywords == {"size": 8}
    cfg.augment = "affine"
    assert make_augmentation(cfg) is affine_augment


@pytest.mark.parametrize(
    "prefix",
    [(0, 0, 1, 0), (3, 17, 2, 1), (2**32 + 5, 2**40, 4, 0), (123456789, 99999, 1, 3)],
)
def test_row_uniforms_equal_each_rows_generator(prefix):
    """The per-row generators written out over arrays draw what ``row_rng`` draws, bit for bit
    (also with words above 32 bits, and for rows past 2^32, which fall back to the generators)."""
    from jdml.data.pipeline import row_rng, row_uniforms

    rows = np.array([0, 1, 2, 57, 111, 4095, 2**31])
    got = row_uniforms(*prefix, rows, 5)
    want = np.stack([row_rng(*prefix, int(r)).random(5) for r in rows])
    np.testing.assert_array_equal(got, want)
    assert row_uniforms(*prefix, np.array([2**32, 3]), 2).shape == (2, 2)
    assert row_uniforms(*prefix, np.array([], np.int64), 3).shape == (0, 3)


def test_uniform_draws_are_numpy_uniforms():
    """``rng.uniform(low, high)`` is ``low + (high - low) * rng.random()``: what the per-row
    form of an augmentation relies on."""
    from jdml.data.augment import _uniform

    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for low, high in ((0.85, 1.15), (-8.0, 8.0), (-0.1, 0.1)):
        np.testing.assert_array_equal(
            a.uniform(low, high, 1000), _uniform(low, high, b.random(1000))
        )


@pytest.mark.parametrize("name", ["affine", "none"])
@pytest.mark.parametrize("shape", [(37, 32, 32, 1), (9, 20, 24, 3)])
def test_per_row_form_equals_one_call_per_image(name, shape):
    """The pipeline's batched form of an augmentation gives the pixels of one call per image,
    each with its own generator, bit for bit."""
    from jdml.data.augment import PER_ROW_DRAWS
    from jdml.data.pipeline import row_rng, row_uniforms

    augment = AUGMENTATIONS.get(name)
    count, apply = PER_ROW_DRAWS[augment]
    img = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    for step in (0, 13):
        rows = np.arange(4, 4 + shape[0])
        got = apply(img, row_uniforms(7, step, 1, 0, rows, count))
        want = [augment(img[i : i + 1], row_rng(7, step, 1, 0, int(r))) for i, r in enumerate(rows)]
        np.testing.assert_array_equal(got, np.concatenate(want))
        assert got.dtype == np.float32


def test_warp_in_pieces_equals_one_pass(monkeypatch):
    """Large batches are warped in cache-sized pieces; the pixels are those of one pass."""
    import jdml.data.augment as augment

    rng = np.random.default_rng(8)
    img = rng.integers(0, 256, (21, 16, 16, 2), dtype=np.uint8)
    mats, shifts = random_affine_params(rng, 21)
    pieces = warp_affine(img, mats, shifts)
    monkeypatch.setattr(augment, "_WARP_PIXELS", 10**9)
    np.testing.assert_array_equal(pieces, warp_affine(img, mats, shifts))
