"""The decode cache of benchmark photos: its pixels, what it changes, and how it survives a changed
photo, a corrupt one, a foreign file, a damaged or old cache, a second process and a killed
build."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ml_collections
import numpy as np
import pytest
from PIL import Image

from jdml.config import validate
from jdml.data.benchmarks import decode_cache as dc
from jdml.data.benchmarks import decode_image, read_benchmark
from jdml.data.photo_augment import red_augment
from jdml.data.pipeline import TrainBatch, input_pipeline
from jdml.errors import ConfigError, DataError
from tests import benchmark_trees as trees
from tests.helpers import REPO, tiny_config

RESIZE = 12  # the fixture's JPEGs are 8-20 px: some are shrunk, some kept as they are


@pytest.fixture
def files(tmp_path):
    root = trees.write_cub(tmp_path / "data", class_ids=(1, 2, 3), per_class=4)
    photos = read_benchmark("cub200", str(root), verify_counts=False)["train"]
    return dataclasses.replace(photos, resize=RESIZE, crop=8)


def test_the_cache_holds_each_photo_decoded_and_shrunk(files, tmp_path):
    cached = dc.open_cache(files, RESIZE, tmp_path / "cache", threads=2)
    assert len(cached) == len(files) and files.decodes and not cached.decodes
    np.testing.assert_array_equal(cached.labels, files.labels)
    assert cached.class_names == files.class_names
    kept = 0
    for i in range(len(files)):
        photo = decode_image(files.paths[i])
        np.testing.assert_array_equal(cached.decode(i), dc.shrink(photo, RESIZE))
        assert min(cached.decode(i).shape[:2]) == min(min(photo.shape[:2]), RESIZE)
        kept += min(photo.shape[:2]) <= RESIZE
    assert 0 < kept < len(files)  # the fixture has both kinds
    # A selection keeps its photos; a pickled copy (a grain worker's) reads the same pixels.
    some = cached.subset(np.array([5, 1]))
    np.testing.assert_array_equal(some.decode(0), cached.decode(5))
    copy = pickle.loads(pickle.dumps(some))
    np.testing.assert_array_equal(copy.decode(1), cached.decode(1))


def test_evaluation_view_and_red_crops_are_unchanged_by_the_cache(files, tmp_path):
    """The resize of a cached photo to the evaluation's short side is the identity, so the
    evaluation view and the ``red`` augmentation give the same pixels; RandomResizedCrop
    (``base``) reads its crops from the smaller photo."""
    cached = dc.open_cache(files, RESIZE, tmp_path / "cache", threads=1)
    index = np.arange(len(files))
    np.testing.assert_array_equal(cached.eval_images(index), files.eval_images(index))
    a = red_augment(files.load(index), np.random.default_rng(3), size=8, resize=RESIZE)
    b = red_augment(cached.load(index), np.random.default_rng(3), size=8, resize=RESIZE)
    np.testing.assert_array_equal(a, b)


def test_a_bicubic_evaluation_view_gets_a_bicubic_cache_of_its_own(files, tmp_path):
    """data.eval_interpolation=bicubic: the cache shrinks with the bicubic filter, under another
    key, so the bicubic evaluation view is unchanged by it as well."""
    bicubic = dataclasses.replace(files, filter="bicubic")
    assert dc.cache_key(bicubic, RESIZE) != dc.cache_key(files, RESIZE)
    cached = dc.open_cache(bicubic, RESIZE, tmp_path / "cache", threads=1)
    bilinear = dc.open_cache(files, RESIZE, tmp_path / "cache", threads=1)
    assert cached.file != bilinear.file and cached.filter == "bicubic"
    index = np.arange(len(files))
    np.testing.assert_array_equal(cached.eval_images(index), bicubic.eval_images(index))
    assert not np.array_equal(bicubic.eval_images(index), files.eval_images(index))


def test_a_second_open_and_a_second_process_reuse_the_cache(files, tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    first = dc.open_cache(files, RESIZE, folder, threads=2)
    stamp = os.stat(first.file).st_mtime_ns

    def no_build(*args, **kwargs):
        raise AssertionError("the cache was built again")

    monkeypatch.setattr(dc, "build_cache", no_build)
    again = dc.open_cache(files, RESIZE, folder, threads=2)
    assert again.file == first.file
    setup = "import jdml.data.benchmarks.decode_cache as dc\ndc.build_cache = None  # not needed"
    out = _run_in_process(files, folder, setup)
    assert out == first.file and os.stat(first.file).st_mtime_ns == stamp


def test_two_processes_building_at_once_both_get_the_complete_cache(files, tmp_path):
    folder = tmp_path / "cache"
    procs = [_start_process(files, folder, "") for _ in range(2)]
    outs = [_finish(p) for p in procs]
    assert outs[0] == outs[1]
    cached = dc.open_cache(files, RESIZE, folder, threads=1)
    for i in range(len(files)):
        np.testing.assert_array_equal(
            cached.decode(i), dc.shrink(decode_image(files.paths[i]), RESIZE)
        )
    assert sorted(p.name for p in folder.iterdir()) == [Path(outs[0]).name]  # no temporaries


def test_a_changed_photo_builds_a_new_cache(files, tmp_path):
    folder = tmp_path / "cache"
    old = dc.open_cache(files, RESIZE, folder, threads=1)
    path = Path(files.paths[3])
    Image.fromarray(np.full((30, 40, 3), 200, np.uint8)).save(path, format="JPEG")
    new = dc.open_cache(files, RESIZE, folder, threads=1)
    assert new.file != old.file and os.path.exists(old.file)
    np.testing.assert_array_equal(new.decode(3), dc.shrink(decode_image(str(path)), RESIZE))
    assert new.decode(3).shape == (12, 16, 3)
    np.testing.assert_array_equal(new.decode(2), old.decode(2))
    # Another resize is another cache too.
    assert dc.open_cache(files, RESIZE + 2, folder, threads=1).file not in (old.file, new.file)


def test_a_corrupt_photo_is_named_and_leaves_nothing(files, tmp_path):
    folder = tmp_path / "cache"
    bad = Path(files.paths[4])
    bad.write_bytes(b"not a jpeg at all")
    with pytest.raises(DataError, match=f"cannot decode image {bad}.*re-extract"):
        dc.open_cache(files, RESIZE, folder, threads=2)
    assert list(folder.iterdir()) == []
    bad.unlink()
    with pytest.raises(DataError, match=f"image {bad} does not exist"):
        dc.open_cache(files, RESIZE, folder, threads=2)


def test_a_file_the_cache_did_not_write_is_never_replaced(files, tmp_path):
    folder = tmp_path / "cache"
    key = dc.cache_key(files, RESIZE)
    foreign = dc.cache_file(files, RESIZE, key, folder)
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"someone's own data")
    with pytest.raises(DataError, match="is not a jdml decode cache; move it away"):
        dc.open_cache(files, RESIZE, folder, threads=1)
    assert foreign.read_bytes() == b"someone's own data"


def test_an_incomplete_cache_of_ours_is_rebuilt(files, tmp_path):
    folder = tmp_path / "cache"
    path = Path(dc.open_cache(files, RESIZE, folder, threads=1).file)
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])  # e.g. copied away and back, cut short
    cached = dc.open_cache(files, RESIZE, folder, threads=1)
    assert path.read_bytes() == whole and cached.decode(0).shape[2] == 3


def _invert_pixels(data: bytearray, start: int) -> None:
    data[start : start + 20_000] = bytes(255 - b for b in data[start : start + 20_000])


def _swap_first_shape(data: bytearray, start: int) -> None:
    assert struct.unpack_from("<2i", data, dc._HEADER_BYTES) == (36, 48)
    struct.pack_into("<2i", data, dc._HEADER_BYTES, 48, 36)


def _cut_short(data: bytearray, start: int) -> None:
    del data[-1000:]


def _version_1(data: bytearray, start: int) -> None:
    """The same cache as version 1 wrote it: a 64-byte header without checksums."""
    fields = struct.unpack_from("<8sIQI32sQ", data)[2:]
    head = struct.pack("<8sIQI32sQ", b"JDMLDEC1", 1, *fields)
    table = bytes(data[dc._HEADER_BYTES : dc._HEADER_BYTES + 8 * fields[0]])
    data[:start] = (head + table).ljust(start, b"\0")


@pytest.mark.parametrize(
    "damage, why",
    [
        (_invert_pixels, "fails its pixel checksum"),
        (_swap_first_shape, "fails its header checksum (header or shape table)"),
        (_cut_short, "is incomplete"),
        (_version_1, "is of an older version (JDMLDEC1, without checksums)"),
    ],
)
def test_a_damaged_or_old_cache_is_rebuilt_never_read(files, tmp_path, caplog, damage, why):
    """20,000 inverted pixel bytes, a shape (36, 48) swapped to (48, 36), a cache cut short, or
    one of version 1 (no checksums): rebuilt in its place, with a warning saying why."""
    rng = np.random.default_rng(0)
    for path in files.paths:  # 36 x 48 photos, kept as they are at 48 px: 62,208 pixel bytes
        Image.fromarray(rng.integers(0, 256, (36, 48, 3), np.uint8)).save(path, format="JPEG")
    folder = tmp_path / "cache"
    path = Path(dc.open_cache(files, 48, folder, threads=1).file)
    whole = bytearray(path.read_bytes())
    damaged = whole.copy()
    damage(damaged, dc._pixels_offset(len(files)))
    path.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="jdml"):
        cached = dc.open_cache(files, 48, folder, threads=2)
    assert f"The decode cache {path} {why}; building it again" in caplog.text
    assert path.read_bytes() == whole
    for i in range(len(files)):
        np.testing.assert_array_equal(cached.decode(i), decode_image(files.paths[i]))


def test_a_killed_build_leaves_no_cache_and_the_next_build_completes(files, tmp_path):
    """A build killed half way leaves only its temporary; the next build writes the complete
    cache, and once the temporary is stale (its process gone, untouched for a while) a build
    removes it."""
    folder = tmp_path / "cache"
    slow = textwrap.dedent(
        """
        import time
        import jdml.data.benchmarks.decode_cache as dc
        decoded = dc._decoded
        def slow(*args):
            time.sleep(0.5)
            return decoded(*args)
        dc._decoded = slow
        """
    )
    proc = _start_process(files, folder, slow)
    deadline = time.time() + 60
    while not list(folder.glob(".*.tmp")) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    temporaries = list(folder.glob(".*.tmp"))
    assert len(temporaries) == 1 and not list(folder.glob(f"*{dc.SUFFIX}"))
    cached = dc.open_cache(files, RESIZE, folder, threads=2)
    np.testing.assert_array_equal(cached.decode(7), dc.shrink(decode_image(files.paths[7]), 12))
    assert temporaries[0].exists()  # recent: it might still be written by a live process
    old = time.time() - dc.STALE_SECONDS - 10
    os.utime(temporaries[0], (old, old))
    Path(cached.file).unlink()
    dc.open_cache(files, RESIZE, folder, threads=2)
    assert not temporaries[0].exists()


def test_no_room_for_the_cache_is_one_clear_error(files, tmp_path, monkeypatch):
    usage = type("usage", (), {"free": 1000})
    monkeypatch.setattr(dc.shutil, "disk_usage", lambda folder: usage)
    with pytest.raises(DataError, match=r"needs about .* GiB .*decode_cache=False"):
        dc.open_cache(files, 256, tmp_path / "cache", threads=1)


def test_the_pipeline_reads_the_training_photos_from_the_cache(files, tmp_path, monkeypatch):
    """``data.decode_cache=True``: the training split comes from the cache (opened once per run),
    and the pipeline is sized for images that are read, not decoded."""
    import jdml.data.pipeline as pipeline

    monkeypatch.setattr(pipeline, "host_cores", lambda: 16)
    make_batch = TrainBatch(data=files, sampler=None, augment=red_augment, seed=0)
    cfg = ml_collections.ConfigDict(
        {
            "decode_cache": False,
            "resize": RESIZE,
            "cache_size": 0,
            "cache_dir": str(tmp_path / "cache"),
            "num_threads": -1,
            "num_workers": -1,
        }
    )
    same, sizes = input_pipeline(make_batch, cfg, backend="gpu")
    assert same.data is files and (sizes.threads, sizes.workers) == (2, 7)
    cfg.decode_cache = True
    cached, sizes = input_pipeline(make_batch, cfg, backend="gpu")
    assert isinstance(cached.data, dc.CachedPhotos) and (sizes.threads, sizes.workers) == (14, 0)
    again, _ = input_pipeline(make_batch, cfg, backend="gpu")
    assert again.data is cached.data


def test_a_larger_cache_size_keeps_more_of_each_photo(files, tmp_path):
    """``data.cache_size`` above ``data.resize``: photos up to that short side are cached as they
    are (their crops are the reference's), larger ones shrunk to it; the evaluation view still
    resizes to ``data.resize``."""
    make_batch = TrainBatch(data=files, sampler=None, augment=red_augment, seed=0)
    cfg = ml_collections.ConfigDict(
        {
            "decode_cache": True,
            "resize": RESIZE,
            "cache_size": 16,
            "cache_dir": str(tmp_path / "cache"),
            "num_threads": 1,
            "num_workers": 0,
        }
    )
    cached = input_pipeline(make_batch, cfg, backend="cpu")[0].data
    for i in range(len(files)):
        photo = decode_image(files.paths[i])
        np.testing.assert_array_equal(cached.decode(i), dc.shrink(photo, 16))
    assert any(min(cached.decode(i).shape[:2]) > RESIZE for i in range(len(files)))
    assert cached.eval_images(np.arange(3)).shape == (3, 8, 8, 3)
    with pytest.raises(ConfigError, match=r"data\.cache_size=10 is below data\.resize=12"):
        validate(tiny_config("unused.npz", **{"data.resize": 12, "data.cache_size": 10}))


def test_the_decode_cache_is_for_photos_read_from_files():
    config = tiny_config("unused.npz", **{"data.decode_cache": True})
    validate(config)  # in-memory data: nothing to cache, nothing refused
    config.data.name, config.data.source = "cub200", "tfds"
    config.data.channels, config.data.augment = 3, "base"
    config.data.image_size, config.data.resize = 32, 40
    with pytest.raises(ConfigError, match=r"data\.decode_cache=True caches photos read from files"):
        validate(config)


# --------------------------------------------------------------------------- helpers


def _script(files, folder: Path, setup: str) -> str:
    """A Python program that opens the cache of ``files`` in ``folder`` after ``setup`` and
    prints its file."""
    root = str(Path(files.paths[0]).parents[2])
    return "\n".join(
        [
            "import sys",
            f"sys.path.insert(0, {REPO!r})",
            setup,
            "from jdml.data.benchmarks import read_benchmark",
            "from jdml.data.benchmarks.decode_cache import open_cache",
            f"files = read_benchmark('cub200', {root!r}, verify_counts=False)['train']",
            f"print(open_cache(files, {RESIZE}, {str(folder)!r}, threads=2).file)",
        ]
    )


def _start_process(files, folder: Path, setup: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _script(files, folder, setup)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out.strip().splitlines()[-1]


def _run_in_process(files, folder: Path, setup: str) -> str:
    return _finish(_start_process(files, folder, setup))
