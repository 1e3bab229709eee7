"""The dataset registry and the generic sources (image folder, npz) with their errors."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jdml.data import sources
from jdml.data.arrays import ImageArrays
from jdml.data.sources import DATASETS
from jdml.errors import DataError


def _save(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (20, 24)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """root/<class>/<images>: PNG and JPEG files of several sizes plus files to be skipped."""
    root = tmp_path / "root"
    _save(root / "cat" / "a.png", (200, 30, 30))
    _save(root / "cat" / "b.JPG", (210, 20, 20), (40, 30))
    _save(root / "dog" / "1.jpeg", (20, 200, 20), (16, 16))
    _save(root / "dog" / "2.png", (20, 210, 20), (50, 10))
    _save(root / "dog" / "3.png", (30, 190, 30))
    _save(root / "bird" / "x.png", (20, 20, 200))
    _save(root / "bird" / "y.bmp", (20, 20, 220))
    (root / "bird" / ".hidden.png").write_bytes(b"not an image")  # hidden: skipped
    (root / "bird" / "notes.txt").write_text("not an image suffix: skipped")
    _save(root / ".cache" / "z.png", (0, 0, 0))  # hidden folder: not a class
    return root


def test_registry_has_the_sources() -> None:
    assert {"glyphs", "folder", "npz"} <= set(DATASETS.names())
    with pytest.raises(KeyError, match=r"known dataset names: .*folder"):
        DATASETS.get("imagenet")


# ----------------------------------------------------------------------------- folder


def test_folder_loads_classes_in_sorted_order(image_tree: Path) -> None:
    data = sources.load_dataset("folder", path=str(image_tree), image_size=16, cache_dir=None)
    assert isinstance(data, ImageArrays)
    assert data.class_names == ("bird", "cat", "dog")
    assert data.images.shape == (7, 16, 16, 1) and data.images.dtype == np.uint8
    assert np.bincount(data.labels).tolist() == [2, 2, 3]


def test_folder_rgb(image_tree: Path) -> None:
    data = DATASETS.get("folder")(path=str(image_tree), image_size=8, cache_dir=None, channels=3)
    assert data.images.shape == (7, 8, 8, 3)
    first_bird = data.images[data.labels == 0][0]
    assert first_bird[..., 2].mean() > 150 and first_bird[..., 0].mean() < 60


def test_folder_keeps_aspect_and_crops_the_centre(tmp_path: Path) -> None:
    image = np.zeros((20, 40), np.uint8)
    image[:, :8] = 255  # a white band at the far left is cropped away
    image[:, 16:24] = 255  # the centre stays
    (tmp_path / "a").mkdir()
    Image.fromarray(image).save(tmp_path / "a" / "wide.png")
    data = sources.load_folder(path=str(tmp_path), image_size=16)
    out = data.images[0, :, :, 0]
    assert out[:, :2].max() < 30  # left edge dark: the left band was cropped off
    assert out[:, 7:9].min() > 200  # centre column white


def test_folder_corrupt_image_names_the_file(image_tree: Path) -> None:
    (image_tree / "cat" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match=r"broken\.png.*skip_unreadable"):
        sources.load_folder(path=str(image_tree), image_size=16)
    with pytest.warns(UserWarning, match=r"broken\.png"):
        data = sources.load_folder(path=str(image_tree), image_size=16, skip_unreadable=True)
    assert len(data) == 7


def test_folder_truncated_jpeg_names_the_file(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    Image.effect_noise((64, 64), 50).save(buffer, format="JPEG")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "cut.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    with pytest.raises(DataError, match=r"cut\.jpg"):
        sources.load_folder(path=str(tmp_path), image_size=16)


def test_folder_missing_path_says_what_is_expected(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match=r"nope does not exist.*<class name>/<image files>"):
        sources.load_folder(path=str(missing), image_size=16)
    with pytest.raises(DataError, match="needs a path"):
        sources.load_folder(path="", image_size=16)


def test_folder_empty_or_flat_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no class folders"):
        sources.load_folder(path=str(tmp_path), image_size=16)
    _save(tmp_path / "loose.png", (1, 2, 3))
    with pytest.raises(DataError, match="move them into one subfolder per class"):
        sources.load_folder(path=str(tmp_path), image_size=16)
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(DataError, match=r"empty_class has no image files"):
        sources.load_folder(path=str(tmp_path), image_size=16)


def test_folder_path_is_a_file(tmp_path: Path) -> None:
    _save(tmp_path / "one.png", (1, 2, 3))
    with pytest.raises(DataError, match="is not a folder"):
        sources.load_folder(path=str(tmp_path / "one.png"), image_size=16)


def test_bad_channels(image_tree: Path) -> None:
    with pytest.raises(DataError, match="channels must be 1"):
        sources.load_folder(path=str(image_tree), image_size=16, channels=2)


# ----------------------------------------------------------------------------- npz


def _write_npz(path: Path, **arrays: np.ndarray) -> str:
    np.savez(path, **arrays)
    return str(path)


def test_npz_gray_with_names_and_resize(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 20, 20), dtype=np.uint8)
    labels = np.array([0, 0, 1, 1, 2, 2])
    names = np.array(["zero", "one", "two"])
    path = _write_npz(tmp_path / "d.npz", images=images, labels=labels, class_names=names)
    data = sources.load_dataset("npz", path=path, image_size=16, cache_dir=None)
    assert data.images.shape == (6, 16, 16, 1)
    assert data.labels.dtype == np.int32 and data.labels.tolist() == labels.tolist()
    assert data.class_names == ("zero", "one", "two")


def test_npz_same_size_is_unchanged_and_rgb(tmp_path: Path) -> None:
    images = np.arange(4 * 8 * 8, dtype=np.uint8).reshape(4, 8, 8, 1)
    path = _write_npz(tmp_path / "d.npz", images=images, labels=np.array([0, 1, 0, 1]))
    data = sources.load_npz(path=path, image_size=8)
    assert np.array_equal(data.images, images)
    assert data.class_names == ("0", "1")
    rgb = sources.load_npz(path=path, image_size=8, channels=3)
    assert rgb.images.shape == (4, 8, 8, 3) and np.array_equal(rgb.images[..., 1], images[..., 0])


def test_npz_missing_key(tmp_path: Path) -> None:
    path = _write_npz(tmp_path / "d.npz", images=np.zeros((2, 8, 8), np.uint8))
    with pytest.raises(DataError, match=r"lacks 'labels' \(keys found: images\)"):
        sources.load_npz(path=path, image_size=8)


def test_npz_length_mismatch(tmp_path: Path) -> None:
    path = _write_npz(
        tmp_path / "d.npz", images=np.zeros((3, 8, 8), np.uint8), labels=np.array([0, 1])
    )
    with pytest.raises(DataError, match="3 images but 2 labels"):
        sources.load_npz(path=path, image_size=8)


def test_npz_bad_arrays(tmp_path: Path) -> None:
    floats = _write_npz(
        tmp_path / "f.npz", images=np.zeros((2, 8, 8), np.float32), labels=np.array([0, 1])
    )
    with pytest.raises(DataError, match="convert it to uint8"):
        sources.load_npz(path=floats, image_size=8)
    few_names = _write_npz(
        tmp_path / "n.npz",
        images=np.zeros((2, 8, 8), np.uint8),
        labels=np.array([0, 3]),
        class_names=np.array(["a", "b"]),
    )
    with pytest.raises(DataError, match="2 class_names but labels up to 3"):
        sources.load_npz(path=few_names, image_size=8)
    negative = _write_npz(
        tmp_path / "m.npz", images=np.zeros((2, 8, 8), np.uint8), labels=np.array([0, -1])
    )
    with pytest.raises(DataError, match="negative"):
        sources.load_npz(path=negative, image_size=8)


def test_npz_not_an_npz(tmp_path: Path) -> None:
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(DataError, match=r"cannot read .*junk\.npz"):
        sources.load_npz(path=str(tmp_path / "junk.npz"), image_size=8)
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(DataError, match="not an npz archive"):
        sources.load_npz(path=str(tmp_path / "single.npy"), image_size=8)
    with pytest.raises(DataError, match=r"missing\.npz does not exist.*'images'"):
        sources.load_npz(path=str(tmp_path / "missing.npz"), image_size=8)


# ----------------------------------------------------------------------------- glyphs


@pytest.mark.slow
def test_glyphs_source_uses_the_cache(glyph_cache_dir: Path, glyph_data: ImageArrays) -> None:
    data = DATASETS.get("glyphs")(path="", image_size=32, cache_dir=str(glyph_cache_dir))
    assert data.class_names == glyph_data.class_names
    assert np.array_equal(data.labels, glyph_data.labels)
    # RGB for RGB-pretrained backbones: the gray value repeated over the three channels.
    rgb = DATASETS.get("glyphs")(path="", image_size=32, cache_dir=str(glyph_cache_dir), channels=3)
    assert rgb.images.shape == (*glyph_data.images.shape[:3], 3)
    assert np.array_equal(rgb.images, np.repeat(glyph_data.images, 3, axis=-1))
    with pytest.raises(DataError, match="channels must be 1"):
        DATASETS.get("glyphs")(path="", image_size=32, cache_dir=None, channels=2)
    with pytest.raises(DataError, match="32 to 64 px"):
        DATASETS.get("glyphs")(path="", image_size=16, cache_dir=None)


def test_glyphs_source_reports_missing_fonts_as_data_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jdml.data import fonts

    monkeypatch.setattr(fonts, "_installed_version", lambda package: None)
    with pytest.raises(DataError, match=r"fontpkg-roboto is not installed.*jdml\[glyphs\]"):
        DATASETS.get("glyphs")(path="", image_size=32, cache_dir=str(tmp_path))
