"""Augmentations: determinism per (seed, step), identity warp, shapes and ranges."""

from __future__ import annotations

import numpy as np
import pytest

from jdml.data.augment import AUGMENTATIONS, affine_augment, warp_affine


def test_identity_warp_is_exact():
    img = np.random.default_rng(0).integers(0, 256, (3, 9, 7, 1), dtype=np.uint8)
    out = warp_affine(img, np.tile(np.eye(2), (3, 1, 1)), np.zeros((3, 2)))
    np.testing.assert_array_equal(out, img.astype(np.float32))


def test_shift_moves_content():
    img = np.zeros((1, 8, 8, 1), np.uint8)
    img[0, 2, 3] = 255
    out = warp_affine(img, np.eye(2)[None], np.array([[1 / 8, 2 / 8]]))  # +1 row, +2 cols
    assert out[0, 3, 5, 0] == 255 and out.sum() == 255


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

    assert AUGMENTATIONS.names_where("photo") == ["adv", "base", "big", "realistic", "red"]
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
