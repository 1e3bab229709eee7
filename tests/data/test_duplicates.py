"""Copies and near-copies of images (jdml.data.duplicates) on explicit pixel values."""

from __future__ import annotations

import numpy as np
import pytest

from jdml.data import duplicates as dup


def _images() -> tuple[np.ndarray, np.ndarray]:
    """Eight 4 x 4 x 3 images: 0-2 one picture in three classes (2 a near-copy, every pixel
    off by 3), 3 and 4 one picture twice in class 1, 5 a picture off by 20 from 0 (not a copy
    at 6), 6 and 7 unlike anything."""
    base = np.full((4, 4, 3), 100, np.uint8)
    images = np.stack([base] * 8)
    images[2] += 3  # RMS 3 from 0 and 1
    images[3] = images[4] = 200
    images[5] += 20
    images[6] = 0
    images[7, :2] = 255
    labels = np.array([0, 1, 2, 1, 1, 3, 3, 4])
    return images, labels


def test_distances_are_the_root_mean_square_over_every_value():
    a = np.zeros((3, 2, 2, 3), np.uint8)
    a[1, 0, 0, 0] = 12  # one of 12 values: sqrt(144 / 12) from image 0
    a[2] = 30  # every value: 30 from image 0
    dist, idx = dup.neighbours(a, 2)
    assert idx[0].tolist() == [1, 2]
    assert dist[0] == pytest.approx([np.sqrt(12.0), 30.0])


def test_groups_chain_near_copies_and_split_by_class():
    images, labels = _images()
    groups = dup.find_groups(images, threshold=6.0, k=3)
    assert [g.members for g in groups] == [(0, 1, 2), (3, 4)]
    assert groups[0].max_rms == pytest.approx(3.0)
    assert groups[1].max_rms == 0.0
    cross, within = dup.split_groups(groups, labels)
    assert [g.members for g in cross] == [(0, 1, 2)] and [g.members for g in within] == [(3, 4)]
    assert dup.find_groups(images, threshold=0.0)[0].members == (0, 1)  # exact copies only


def test_exact_copies_are_one_group_however_many():
    images = np.zeros((40, 2, 2, 1), np.uint8)
    images[-1] = 9
    groups = dup.find_groups(images, threshold=0.0, k=2)
    assert [len(g.members) for g in groups] == [39]


def test_drop_keeps_the_first_of_a_class_and_none_across_classes():
    images, labels = _images()
    keep, cross, within = dup.drop_duplicates(labels, dup.find_groups(images, 6.0, k=3))
    assert keep.tolist() == [False, False, False, True, False, True, True, True]
    assert len(cross) == 1 and len(within) == 1


def test_nearest_other_class_counts():
    images, labels = _images()
    counts = dup.cross_class_counts(images, labels, thresholds=(0.0, 3.0, 17.0, 20.0), k=7)
    # 0 and 1 are copies (0 apart), 2 is 3 from them, 5 is 17 from 2 and 20 from 0 and 1;
    # 3, 4, 6 and 7 are at least 80 from any other class's image
    assert counts == {"<= 0": 2, "<= 3": 3, "<= 17": 4, "<= 20": 4}


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="non-empty stack"):
        dup.find_groups(np.zeros((0, 2, 2, 1), np.uint8), 1.0)
