"""The benchmark readers on small fixture trees in each official layout, and the tfds sources."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jdml.data.benchmarks import (
    BENCHMARKS,
    FileList,
    decode_image,
    find_unreadable,
    read_benchmark,
    tfds_source,
)
from jdml.errors import DataError, UnknownNameError
from tests import benchmark_trees as trees


def _read(name: str, root: Path, **kwargs: bool) -> dict[str, FileList]:
    return read_benchmark(name, str(root), verify_counts=False, **kwargs)


def _check_paths(files: FileList, folder: Path) -> None:
    for path in files.paths:
        assert os.path.isabs(path) and os.path.isfile(path)
        assert Path(path).is_relative_to(folder)


def test_registry_lists_the_benchmarks() -> None:
    assert BENCHMARKS.names() == ["cars196", "cub200", "inshop", "sop"]
    with pytest.raises(UnknownNameError, match="known benchmark names: cars196"):
        read_benchmark("imagenet", "/nowhere")


# ----------------------------------------------------------------------------- CUB


@pytest.mark.parametrize("use_parent", [False, True])
def test_cub_splits_by_class_id(tmp_path: Path, use_parent: bool) -> None:
    folder = trees.write_cub(tmp_path, class_ids=(99, 100, 101, 102), per_class=3)
    splits = _read("cub200", tmp_path if use_parent else folder)
    assert set(splits) == {"train", "test"}
    train, test = splits["train"], splits["test"]
    assert train.class_names == (trees.cub_class_name(99), trees.cub_class_name(100))
    assert test.class_names == (trees.cub_class_name(101), trees.cub_class_name(102))
    for files in (train, test):
        assert len(files) == 6 and files.num_classes == 2
        assert files.labels.dtype == np.int32
        assert files.labels.tolist() == [0, 0, 0, 1, 1, 1]
        _check_paths(files, folder / "images")
    # Each image's label names the class folder it lies in.
    for path, label in zip(test.paths, test.labels, strict=True):
        assert Path(path).parent.name == test.class_names[label]


def test_cub_counts_are_checked_by_default(tmp_path: Path) -> None:
    folder = trees.write_cub(tmp_path)
    with pytest.raises(DataError) as err:
        read_benchmark("cub200", str(folder))
    message = str(err.value)
    assert "images.txt lists 6 train images of 2 classes" in message
    assert "the full CUB-200-2011 has 5,864 of 100" in message
    assert "5,924 of 100" in message and "verify_counts=False" in message


def test_cub_missing_index_file_is_named(tmp_path: Path) -> None:
    folder = trees.write_cub(tmp_path)
    (folder / "image_class_labels.txt").unlink()
    with pytest.raises(DataError, match=r"image_class_labels\.txt is missing; expected"):
        _read("cub200", folder)


def test_cub_missing_root_names_the_layout(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist.*CUB_200_2011/ with images\.txt"):
        _read("cub200", tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"no CUB-200-2011 in .* or its subfolders"):
        _read("cub200", tmp_path)


def test_cub_missing_image_is_named(tmp_path: Path) -> None:
    folder = trees.write_cub(tmp_path)
    gone = Path(_read("cub200", folder)["test"].paths[4])
    gone.unlink()
    with pytest.raises(
        DataError, match=rf"1 of the 12 listed images are missing \({re.escape(str(gone))}\)"
    ):
        _read("cub200", folder)
    assert len(_read("cub200", folder, check_files=False)["test"]) == 6


def test_cub_damaged_index_is_reported(tmp_path: Path) -> None:
    folder = trees.write_cub(tmp_path)
    with (folder / "images.txt").open("a") as f:
        f.write("13\n")
    with pytest.raises(DataError, match=r"images\.txt line 13 has 1 fields"):
        _read("cub200", folder)


# ----------------------------------------------------------------------------- Cars196


@pytest.mark.parametrize("use_parent", [False, True])
def test_cars_annotation_layout(tmp_path: Path, use_parent: bool) -> None:
    folder = trees.write_cars_mat(tmp_path, class_ids=(97, 98, 99, 100), per_class=3)
    splits = _read("cars196", tmp_path if use_parent else folder)
    train, test = splits["train"], splits["test"]
    assert train.class_names == (trees.cars_class_name(97), trees.cars_class_name(98))
    assert test.class_names == (trees.cars_class_name(99), trees.cars_class_name(100))
    # The struct's test flag alternates within each class and must not affect the split.
    assert train.labels.tolist() == test.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert [Path(p).name for p in train.paths[:2]] == ["000001.jpg", "000002.jpg"]
    for files in (train, test):
        _check_paths(files, folder / "car_ims")


def test_cars_fixture_is_a_struct_array(tmp_path: Path) -> None:
    from scipy.io import loadmat

    mat = loadmat(trees.write_cars_mat(tmp_path) / "cars_annos.mat")
    assert mat["annotations"].shape == (1, 12)
    assert mat["annotations"].dtype.names[0] == "relative_im_path"
    assert mat["class_names"].shape == (1, 196)


@pytest.mark.parametrize("images_subfolder", [False, True])
@pytest.mark.parametrize("use_parent", [False, True])
def test_cars_class_folder_layout(tmp_path: Path, images_subfolder: bool, use_parent: bool) -> None:
    folder = trees.write_cars_folders(tmp_path, 4, 3, images_subfolder=images_subfolder)
    splits = _read("cars196", tmp_path if use_parent else folder)
    names = tuple(sorted(trees.cars_class_name(c) for c in range(1, 5)))
    assert splits["train"].class_names == names[:2]
    assert splits["test"].class_names == names[2:]
    for files in splits.values():
        assert files.labels.tolist() == [0, 0, 0, 1, 1, 1]
        for path, label in zip(files.paths, files.labels, strict=True):
            assert Path(path).parent.name == files.class_names[label]


def test_cars_parent_with_other_benchmarks_picks_the_cars(tmp_path: Path) -> None:
    trees.write_cub(tmp_path)  # its images/ is one folder per class too
    folder = trees.write_cars_folders(tmp_path, 4, 2, images_subfolder=True)
    splits = _read("cars196", tmp_path)
    _check_paths(splits["train"], folder / "images")


def test_cars_counts_are_checked_by_default(tmp_path: Path) -> None:
    folder = trees.write_cars_mat(tmp_path)
    with pytest.raises(DataError, match=r"cars_annos\.mat lists 6 train images of 2 classes; "):
        read_benchmark("cars196", str(folder))


def test_cars_wrong_mat_file_is_explained(tmp_path: Path) -> None:
    from scipy.io import savemat

    folder = tmp_path / "cars196"
    folder.mkdir()
    savemat(folder / "cars_annos.mat", {"something": np.zeros(3)})
    with pytest.raises(DataError, match=r"no struct array 'annotations' .*something"):
        _read("cars196", folder)
    (folder / "cars_annos.mat").write_bytes(b"not a mat file at all")
    with pytest.raises(DataError, match=r"cannot read .*cars_annos\.mat as a MATLAB file"):
        _read("cars196", folder)


# ----------------------------------------------------------------------------- SOP


@pytest.mark.parametrize("use_parent", [False, True])
def test_sop_splits(tmp_path: Path, use_parent: bool) -> None:
    folder = trees.write_sop(tmp_path, (1, 2, 3), (11_319, 11_320, 11_321), per_class=2)
    splits = _read("sop", tmp_path if use_parent else folder)
    assert splits["train"].class_names == ("1", "2", "3")
    assert splits["test"].class_names == ("11319", "11320", "11321")
    for files in splits.values():
        assert files.labels.tolist() == [0, 0, 1, 1, 2, 2]
        _check_paths(files, folder)
    assert Path(splits["test"].paths[0]).name == "11319_0.JPG"


def test_sop_count_message(tmp_path: Path) -> None:
    folder = trees.write_sop(tmp_path)
    with pytest.raises(DataError) as err:
        read_benchmark("sop", str(folder))
    assert str(err.value) == (
        f"{folder / 'Ebay_train.txt'} lists 6 train images of 3 classes; the full Stanford "
        f"Online Products has 59,551 of 11,318; {folder / 'Ebay_test.txt'} lists 6 test images "
        "of 3 classes; the full Stanford Online Products has 60,502 of 11,316: is the copy "
        "partial? set --config.data.verify_counts=False to use it anyway (verify_counts=False "
        "from Python)"
    )


def test_sop_missing_test_index(tmp_path: Path) -> None:
    folder = trees.write_sop(tmp_path)
    (folder / "Ebay_test.txt").unlink()
    with pytest.raises(DataError, match=r"Ebay_test\.txt is missing; expected .*Ebay_train\.txt"):
        _read("sop", tmp_path)


# ----------------------------------------------------------------------------- In-Shop


@pytest.mark.parametrize("use_parent", [False, True])
def test_inshop_query_and_gallery_share_labels(tmp_path: Path, use_parent: bool) -> None:
    folder = trees.write_inshop(tmp_path, (1, 2, 3), (4, 5, 6), (7,), per_split=2)
    splits = _read("inshop", tmp_path if use_parent else folder)
    assert set(splits) == {"train", "query", "gallery"}
    train, query, gallery = splits["train"], splits["query"], splits["gallery"]
    assert train.class_names == tuple(trees.inshop_item(i) for i in (1, 2, 3))
    assert train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    shared = tuple(trees.inshop_item(i) for i in (4, 5, 6, 7))
    assert query.class_names == gallery.class_names == shared
    assert len(query) == 6 and len(gallery) == 8
    assert sorted(set(query.labels.tolist())) == [0, 1, 2]
    assert sorted(set(gallery.labels.tolist())) == [0, 1, 2, 3]
    # Same item -> same label: the item id is the image's folder.
    for files in (query, gallery):
        _check_paths(files, folder / "img")
        for path, label in zip(files.paths, files.labels, strict=True):
            assert Path(path).parent.name == shared[label]


def test_inshop_images_unpacked_inside_img_folder(tmp_path: Path) -> None:
    folder = trees.write_inshop(tmp_path)
    (folder / "Img").mkdir()
    (folder / "img").rename(folder / "Img" / "img")
    _check_paths(_read("inshop", folder)["gallery"], folder / "Img" / "img")


def test_inshop_counts(tmp_path: Path) -> None:
    folder = trees.write_inshop(tmp_path)
    with pytest.raises(DataError, match=r"lists 12 train images of 3 items; .* 25,882 of 3,997"):
        read_benchmark("inshop", str(folder))
    index = folder / "Eval" / "list_eval_partition.txt"
    lines = index.read_text().splitlines()
    index.write_text("\n".join(lines[:-3]) + "\n")  # truncated: the first line says more
    with pytest.raises(DataError, match=r"declares 26 images on its first line but lists 23"):
        read_benchmark("inshop", str(folder))
    assert len(_read("inshop", folder)["gallery"]) == 5


def test_inshop_bad_status(tmp_path: Path) -> None:
    folder = trees.write_inshop(tmp_path)
    index = folder / "Eval" / "list_eval_partition.txt"
    index.write_text(index.read_text().replace("gallery", "galery", 1))
    with pytest.raises(DataError, match=r"evaluation_status 'galery' is not one of"):
        _read("inshop", folder)


def test_inshop_missing_index(tmp_path: Path) -> None:
    folder = trees.write_inshop(tmp_path)
    (folder / "Eval" / "list_eval_partition.txt").unlink()
    with pytest.raises(DataError, match=r"no In-Shop .* expected .*Eval/list_eval_partition"):
        _read("inshop", folder)


# ----------------------------------------------------------------------------- decoding


def test_decode_image_converts_modes(tmp_path: Path) -> None:
    gray = tmp_path / "gray.jpg"
    Image.new("L", (10, 6), 128).save(gray)
    cmyk = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (10, 6), (0, 255, 255, 0)).save(cmyk)  # red in CMYK
    palette = tmp_path / "palette.png"
    image = Image.new("P", (10, 6), 1)
    image.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)
    image.info["transparency"] = 0
    image.save(palette, transparency=0)
    deep = tmp_path / "deep.png"
    Image.fromarray(np.full((6, 10), 65535, np.uint16)).save(deep)
    for path in (gray, cmyk, palette, deep):
        array = decode_image(str(path))
        assert array.shape == (6, 10, 3) and array.dtype == np.uint8, path
    assert abs(int(decode_image(str(gray))[0, 0, 0]) - 128) <= 2
    assert decode_image(str(cmyk))[3, 5].tolist()[0] > 200
    assert decode_image(str(palette))[0, 0].tolist() == [0, 0, 255]
    assert decode_image(str(deep))[0, 0].tolist() == [255, 255, 255]


def test_decode_image_applies_exif_orientation(tmp_path: Path) -> None:
    path = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    Image.new("RGB", (16, 8), (10, 200, 10)).save(path, exif=exif)
    assert decode_image(str(path)).shape == (16, 8, 3)


def test_corrupt_images_are_named_and_found(tmp_path: Path) -> None:
    folder = trees.write_cub(tmp_path)
    files = _read("cub200", folder)["train"]
    truncated, garbage = files.paths[1], files.paths[4]
    data = Path(truncated).read_bytes()
    Path(truncated).write_bytes(data[: len(data) // 2])
    Path(garbage).write_bytes(os.urandom(200))
    with pytest.raises(
        DataError, match=rf"(?i)cannot decode image {re.escape(truncated)}: .*trunc"
    ):
        decode_image(truncated)
    with pytest.raises(DataError, match=rf"cannot decode image {re.escape(garbage)}"):
        decode_image(garbage)
    with pytest.raises(DataError, match=r"image .*nothing\.jpg does not exist"):
        decode_image(str(tmp_path / "nothing.jpg"))
    assert decode_image(files.paths[0]).ndim == 3
    assert find_unreadable(files, workers=2) == [truncated, garbage]


# ----------------------------------------------------------------------------- tfds


def test_tfds_birds_are_recut_by_class(tmp_path: Path) -> None:
    # The builder's own splits share classes (a per-image split); the DML split is by class.
    written = trees.prepare_tfds(
        tmp_path, "caltech_birds2011", {"train": [98, 99, 100, 101], "test": [99, 100, 198]}
    )
    splits = tfds_source("caltech_birds2011", str(tmp_path), verify_counts=False)
    train, test = splits["train"], splits["test"]
    assert (len(train), len(test)) == (3, 4)
    assert train.class_names == ("bird_98", "bird_99")
    assert test.class_names == ("bird_100", "bird_101", "bird_198")
    assert sorted(train.labels.tolist()) == [0, 1, 1]
    assert sorted(test.labels.tolist()) == [0, 0, 1, 2]
    pixels_by_label = {}
    for examples in written.values():
        for label, pixels in examples:
            pixels_by_label.setdefault(label, []).append(pixels)
    for split, offset in ((train, 98), (test, 100)):
        for image, label in zip(split.load(np.arange(len(split))), split.labels, strict=True):
            assert image.dtype == np.uint8 and image.shape[2] == 3
            original = int(split.class_names[label].split("_")[1])
            assert original >= offset
            assert any(np.array_equal(image, p) for p in pixels_by_label[original])


def test_tfds_cars_keep_the_builder_class_names(tmp_path: Path) -> None:
    trees.prepare_tfds(tmp_path, "cars196", {"train": [0, 97, 98], "test": [97, 195]})
    splits = tfds_source("cars196", str(tmp_path), verify_counts=False)
    assert len(splits["train"]) == 3 and len(splits["test"]) == 2
    assert splits["train"].class_names[0] == "AM General Hummer SUV 2000"
    assert splits["train"].num_classes == 2 and splits["test"].num_classes == 2
    assert sorted(splits["train"].labels.tolist()) == [0, 1, 1]


def test_tfds_sop_keeps_its_splits(tmp_path: Path) -> None:
    trees.prepare_tfds(
        tmp_path, "stanford_online_products", {"train": [0, 0, 5], "test": [11_318, 22_633]}
    )
    splits = tfds_source("stanford_online_products", str(tmp_path), verify_counts=False)
    assert splits["train"].class_names == ("1", "6")
    assert splits["test"].class_names == ("11319", "22634")
    assert sorted(splits["train"].labels.tolist()) == [0, 0, 1]
    (image,) = splits["test"].load(np.array([1]))
    assert image.ndim == 3 and image.dtype == np.uint8


def test_tfds_counts_are_checked_by_default(tmp_path: Path) -> None:
    trees.prepare_tfds(tmp_path, "cars196", {"train": [0, 1], "test": [100]})
    with pytest.raises(DataError, match=r"cars196 in .* lists 2 train images of 2 classes; "):
        tfds_source("cars196", str(tmp_path))


def test_tfds_missing_dataset_says_how_to_prepare_it(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        tfds_source("stanford_online_products", str(tmp_path))
    message = str(err.value)
    assert f"no prepared stanford_online_products in {tmp_path}" in message
    assert (
        f"tfds build stanford_online_products --data_dir={tmp_path} --file_format=array_record"
    ) in message
    with pytest.raises(DataError, match=r"unknown tfds benchmark 'mnist'; known: caltech_bi"):
        tfds_source("mnist", str(tmp_path))


def test_tfds_missing_split_is_reported(tmp_path: Path) -> None:
    trees.prepare_tfds(tmp_path, "cars196", {"train": [0, 1]})
    with pytest.raises(
        DataError, match=r"cannot open cars196 in .*Unknown split 'test'.*tfds build"
    ):
        tfds_source("cars196", str(tmp_path), verify_counts=False)
