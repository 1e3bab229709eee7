"""Every Pillow mode decodes to the 8-bit pixels it means (jdml.data.pixels), through the folder
source's reader and the benchmark readers' decoder, from real files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jdml.data.benchmarks.images import decode_image
from jdml.data.sources import read_image
from jdml.errors import DataError

SIZE = 8
RAMP16 = np.linspace(0, 65535, SIZE * SIZE).round().reshape(SIZE, SIZE).astype(np.uint16)
EXPECTED16 = np.rint(RAMP16 / 257.0).astype(np.uint8)


def _gray(path: Path) -> np.ndarray:
    return read_image(path, SIZE, 1)[..., 0]


def _rgb(path: Path) -> np.ndarray:
    return read_image(path, SIZE, 3)


def test_16_bit_png_is_scaled_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "g16.png"
    Image.fromarray(RAMP16).save(path)
    assert Image.open(path).mode == "I;16"
    np.testing.assert_array_equal(_gray(path), EXPECTED16)
    np.testing.assert_array_equal(_rgb(path), np.repeat(EXPECTED16[..., None], 3, axis=-1))
    np.testing.assert_array_equal(decode_image(str(path))[..., 1], EXPECTED16)


def test_32_bit_integer_image(tmp_path: Path) -> None:
    path = tmp_path / "i32.tif"
    Image.fromarray(RAMP16.astype(np.int32)).save(path)
    assert Image.open(path).mode == "I"
    np.testing.assert_array_equal(_gray(path), EXPECTED16)
    Image.fromarray(np.full((SIZE, SIZE), 70000, np.int32)).save(tmp_path / "big.tif")
    with pytest.raises(DataError, match=r"big\.tif.*outside 0\.\.65535"):
        _gray(tmp_path / "big.tif")


@pytest.mark.parametrize("scale", [1.0, 255.0])
def test_float_image(tmp_path: Path, scale: float) -> None:
    values = np.linspace(0, 1, SIZE * SIZE).reshape(SIZE, SIZE).astype(np.float32)
    path = tmp_path / "f.tif"
    Image.fromarray(values * np.float32(scale)).save(path)
    assert Image.open(path).mode == "F"
    np.testing.assert_array_equal(_gray(path), np.rint(values * 255.0).astype(np.uint8))


def test_float_image_out_of_range_is_refused(tmp_path: Path) -> None:
    Image.fromarray(np.full((SIZE, SIZE), -3.0, np.float32)).save(tmp_path / "neg.tif")
    with pytest.raises(DataError, match=r"neg\.tif.*mode F"):
        _gray(tmp_path / "neg.tif")


def test_gray_with_alpha_is_composited_on_white(tmp_path: Path) -> None:
    gray = np.full((SIZE, SIZE), 40, np.uint8)
    alpha = np.zeros((SIZE, SIZE), np.uint8)
    alpha[:, : SIZE // 2] = 255  # left half opaque, right half transparent
    path = tmp_path / "la.png"
    Image.fromarray(np.stack([gray, alpha], axis=-1), "LA").save(path)
    assert Image.open(path).mode == "LA"
    out = _gray(path)
    assert (out[:, : SIZE // 2] == 40).all() and (out[:, SIZE // 2 :] == 255).all()
    half = np.array(alpha // 2)
    Image.fromarray(np.stack([gray, half], axis=-1), "LA").save(path)
    expected = np.rint((40 * 127 + 255 * (255 - 127)) / 255)  # alpha 127 over white
    assert abs(int(_gray(path)[0, 0]) - expected) <= 1


def test_rgba_is_composited_on_white_and_benchmarks_drop_alpha(tmp_path: Path) -> None:
    rgba = np.zeros((SIZE, SIZE, 4), np.uint8)
    rgba[..., 0] = 200  # red everywhere, transparent everywhere: the picture is empty
    path = tmp_path / "rgba.png"
    Image.fromarray(rgba, "RGBA").save(path)
    assert (_rgb(path) == 255).all()
    # torchvision's convert("RGB") keeps the hidden colour; the benchmark readers match it.
    np.testing.assert_array_equal(decode_image(str(path))[..., 0], np.full((SIZE, SIZE), 200))


def test_palette_with_transparency(tmp_path: Path) -> None:
    index = np.zeros((SIZE, SIZE), np.uint8)
    index[: SIZE // 2] = 1
    image = Image.fromarray(index, "P")
    image.putpalette([0, 0, 0, 10, 120, 30] + [0] * (3 * 254))
    image.info["transparency"] = 0  # palette entry 0 is transparent
    path = tmp_path / "p.png"
    image.save(path, transparency=0)
    opened = Image.open(path)
    assert opened.mode == "P" and "transparency" in opened.info
    out = _rgb(path)
    np.testing.assert_array_equal(out[0, 0], [10, 120, 30])
    np.testing.assert_array_equal(out[-1, -1], [255, 255, 255])


def test_palette_without_transparency(tmp_path: Path) -> None:
    index = np.arange(SIZE * SIZE, dtype=np.uint8).reshape(SIZE, SIZE) % 2
    image = Image.fromarray(index, "P")
    image.putpalette([5, 6, 7, 250, 0, 100] + [0] * (3 * 254))
    image.save(tmp_path / "p.png")
    out = _rgb(tmp_path / "p.png")
    np.testing.assert_array_equal(out[0, 0], [5, 6, 7])
    np.testing.assert_array_equal(out[0, 1], [250, 0, 100])


def test_cmyk(tmp_path: Path) -> None:
    cmyk = np.zeros((SIZE, SIZE, 4), np.uint8)
    cmyk[..., 0] = 255  # full cyan: no red
    path = tmp_path / "cmyk.jpg"
    Image.fromarray(cmyk, "CMYK").save(path, quality=100)
    assert Image.open(path).mode == "CMYK"
    out = _rgb(path)
    assert out[..., 0].max() < 10 and out[..., 1].min() > 245 and out[..., 2].min() > 245


def test_bilevel(tmp_path: Path) -> None:
    bits = (np.arange(SIZE * SIZE).reshape(SIZE, SIZE) % 3 == 0).astype(np.uint8) * 255
    path = tmp_path / "b.png"
    Image.fromarray(bits).convert("1").save(path)
    assert Image.open(path).mode == "1"
    np.testing.assert_array_equal(_gray(path), bits)


def test_symlinks_are_followed_and_dangling_ones_reported(tmp_path: Path) -> None:
    """The folder source follows links to class folders and to image files."""
    from jdml.data.sources import load_folder

    store = tmp_path / "store"
    store.mkdir()
    for i in range(2):
        Image.fromarray(np.full((SIZE, SIZE), 10 * i, np.uint8)).save(store / f"{i}.png")
    root = tmp_path / "root"
    (root / "linked_files").mkdir(parents=True)
    for i in range(2):
        (root / "linked_files" / f"{i}.png").symlink_to(store / f"{i}.png")
    (root / "linked_folder").symlink_to(store, target_is_directory=True)
    data = load_folder(path=str(root), image_size=SIZE, channels=1)
    assert data.class_names == ("linked_files", "linked_folder")
    assert len(data) == 4
    (root / "linked_files" / "gone.png").symlink_to(tmp_path / "missing.png")
    with pytest.raises(DataError, match=r"gone\.png.*skip_unreadable"):
        load_folder(path=str(root), image_size=SIZE, channels=1)
