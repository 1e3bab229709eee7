"""``jdml data check``: unreadable files, single-image classes and copies across classes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from jdml.__main__ import main
from jdml.data.check import check


def _png(path, value: int, size: int = 16) -> None:
    rng = np.random.default_rng(value)
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


@pytest.fixture(scope="module")
def dirty(tmp_path_factory):
    """A folder dataset: class ``a`` with two pictures and a corrupt file, ``b`` with a copy of
    one of ``a``'s and its own, ``c`` with one picture."""
    root = tmp_path_factory.mktemp("dirty")
    for name in "abc":
        (root / name).mkdir()
    _png(root / "a" / "1.png", 1)
    _png(root / "a" / "2.png", 2)
    (root / "a" / "3.png").write_bytes(b"not a png")
    _png(root / "b" / "1.png", 1)  # the same picture as a/1.png
    _png(root / "b" / "2.png", 3)
    _png(root / "c" / "1.png", 4)
    return root


def test_check_finds_every_problem(dirty):
    (report,) = check(str(dirty), image_size=16)
    assert report.images == 5 and report.classes == 3
    assert len(report.unreadable) == 1 and "3.png" in report.unreadable[0]
    assert report.single_image_classes == ["c"]
    assert [g["classes"] for g in report.cross_class] == [["a", "b"]]
    assert report.cross_class[0]["max_rms"] == 0.0
    assert report.within_class == [] and not report.clean


def test_the_command_prints_the_problems_and_exits_1(dirty, tmp_path, capsys):
    out_json = tmp_path / "report.json"
    with pytest.raises(SystemExit) as exit_:
        main(["data", "check", str(dirty), "--image-size", "16", "--json", str(out_json)])
    assert exit_.value.code == 1
    out = capsys.readouterr().out
    assert "unreadable files: 1" in out and "single-image classes: 1 (c)" in out
    assert "copies across classes (RMS <= 6): 1 groups, 2 images" in out
    assert "verdict: NOT clean" in out
    saved = json.loads(out_json.read_text())
    assert saved[0]["cross_class"][0]["classes"] == ["a", "b"]


def test_a_clean_npz_passes(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = tmp_path / "clean.npz"
    np.savez(path, images=rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8),
             labels=np.array([0, 0, 1, 1, 2, 2]))  # fmt: skip
    main(["data", "check", str(path), "--image-size", "8"])
    out = capsys.readouterr().out
    assert "6 images, 3 classes" in out and "verdict: clean" in out


def test_a_missing_path_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["data", "check", str(tmp_path / "nowhere")])
    assert exit_.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--dataset" in err[0]


def test_an_unknown_loader_lists_the_known_ones(dirty, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["data", "check", str(dirty), "--dataset", "nope"])
    assert exit_.value.code != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown dataset 'nope'") and "cub200" in err and "npz" in err


def test_a_benchmark_is_checked_split_by_split(tmp_path):
    """CUB's layout (classes 1-100 train, 101-200 test): a corrupt photo is unreadable, a photo
    copied into another class of its split is a copy across classes."""
    from tests.benchmark_trees import CUB_FOLDER, cub_class_name, write_cub

    folder = write_cub(tmp_path, class_ids=(99, 100, 101, 102))
    images = folder / "images"
    (images / cub_class_name(99) / "Bird_99_0001.jpg").write_bytes(b"truncated")
    first = images / cub_class_name(101) / "Bird_101_0000.jpg"
    (images / cub_class_name(102) / "Bird_102_0002.jpg").write_bytes(first.read_bytes())
    reports = {r.name: r for r in check(str(tmp_path / CUB_FOLDER), "cub200", image_size=16)}
    assert set(reports) == {"cub200 train", "cub200 test"}
    train, test = reports["cub200 train"], reports["cub200 test"]
    assert len(train.unreadable) == 1 and "Bird_99_0001.jpg" in train.unreadable[0]
    assert train.images == 5 and train.cross_class == []
    assert [sorted(set(g["classes"])) for g in test.cross_class] == [
        [cub_class_name(101), cub_class_name(102)]
    ]
    assert not train.clean and not test.clean
