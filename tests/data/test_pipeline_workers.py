"""Worker processes build the same training batches as threads, in step order, and resume;
the pipeline's automatic sizes; the batched augmentation gives the per-image batches."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import ml_collections
import numpy as np
import pytest

from jdml.config import validate
from jdml.config.saved import flatten_config
from jdml.config.schema import base_config
from jdml.data.arrays import ImageArrays
from jdml.data.augment import affine_augment, make_augmentation
from jdml.data.benchmarks import read_benchmark
from jdml.data.pipeline import (
    TrainBatch,
    host_cores,
    input_pipeline,
    resolve_pipeline_sizes,
    train_batches,
)
from jdml.errors import ConfigError
from jdml.samplers import SAMPLERS
from tests import benchmark_trees as trees
from tests.helpers import tiny_config


@dataclasses.dataclass(frozen=True)
class StepSampler:
    """A picklable sampler: 4 indices drawn from (seed, step), as the real samplers do."""

    size: int

    def batch(self, step: int) -> np.ndarray:
        return np.random.default_rng((7, step)).choice(self.size, 4, replace=False)


@pytest.fixture(scope="module")
def make_batch(tmp_path_factory) -> TrainBatch:
    root = trees.write_cub(tmp_path_factory.mktemp("cub"), class_ids=(1, 2, 3, 4), per_class=3)
    files = read_benchmark("cub200", str(root), verify_counts=False)["train"]
    files = dataclasses.replace(files, resize=20, crop=16)
    augment = make_augmentation(
        ml_collections.ConfigDict({"augment": "base", "image_size": 16, "resize": 20})
    )
    return TrainBatch(data=files, sampler=StepSampler(len(files)), augment=augment, seed=3)


def collect(make_batch: TrainBatch, start: int, workers: int) -> list[dict[str, np.ndarray]]:
    return list(
        train_batches(
            make_batch,
            start_step=start,
            total_steps=6,
            num_threads=2,
            prefetch=2,
            num_workers=workers,
        )
    )


@pytest.mark.slow
def test_worker_processes_give_the_thread_batches_in_order(make_batch) -> None:
    threads = collect(make_batch, 0, 0)
    workers = collect(make_batch, 0, 2)
    assert len(threads) == len(workers) == 6
    for a, b in zip(threads, workers, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert threads[0]["images"].shape == (4, 16, 16, 3)
    assert not np.array_equal(threads[0]["images"], threads[1]["images"])
    # Resuming at step 4 gives the uninterrupted run's last two batches.
    resumed = collect(make_batch, 4, 2)
    for a, b in zip(threads[4:], resumed, strict=True):
        np.testing.assert_array_equal(a["images"], b["images"])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("num_workers", -2, "data.num_workers=-2 must be at least -1"),
        ("num_threads", -3, "data.num_threads=-3 must be at least -1"),
        ("num_threads", 0, "data.num_threads=0: set at least 1 reader thread, or -1"),
    ],
)
def test_worker_settings_are_checked(key, value, message) -> None:
    config = tiny_config("unused.npz", **{f"data.{key}": value})
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(config)


@pytest.mark.parametrize(
    "extra",
    [{}, {"views": 2, "streams": 2}, {"views": 2, "members": (0, 2)}],
    ids=["plain", "views+streams", "members"],
)
def test_a_process_builds_only_its_rows_and_they_equal_the_whole_batch(make_batch, extra):
    """Multi-host input: rows (start, stop) of the global batch, built alone from (seed, step),
    are exactly those rows of the batch one process builds, for every view, stream and member."""
    whole = dataclasses.replace(make_batch, **extra)
    for step in (0, 5):
        full = whole(step)
        halves = [dataclasses.replace(whole, rows=r)(step) for r in ((0, 2), (2, 4))]
        assert full.keys() == halves[0].keys() == halves[1].keys()
        for key, value in full.items():
            axis = 1 if extra.get("members") and key in ("images", "images_b") else 0  # members
            joined = np.concatenate([h[key] for h in halves], axis=axis)
            np.testing.assert_array_equal(joined, value, err_msg=key)
        assert not np.array_equal(
            full["images"][..., :2, :, :, :], full["images"][..., 2:, :, :, :]
        )


# --------------------------------------------------------------------------- automatic sizes


@pytest.mark.parametrize(
    ("threads", "workers", "backend", "cores", "decodes", "want"),
    [
        # The CPU backend keeps 2 threads and no worker process, whatever the host.
        (-1, -1, "cpu", 64, True, (2, 0)),
        (-1, -1, "cpu", 2, False, (2, 0)),
        (-1, 3, "cpu", 64, True, (2, 3)),
        # An accelerator: every core but 2; threads for images in memory...
        (-1, -1, "gpu", 16, False, (14, 0)),
        (-1, -1, "tpu", 96, False, (94, 0)),
        (-1, -1, "gpu", 2, False, (2, 0)),
        # ... worker processes of 2 threads for photos decoded per batch, if two fit.
        (-1, -1, "gpu", 16, True, (2, 7)),
        (-1, -1, "gpu", 8, True, (2, 3)),
        (-1, -1, "gpu", 5, True, (3, 0)),
        # A value set explicitly wins; the other is derived around it.
        (8, 0, "gpu", 16, True, (8, 0)),
        (8, -1, "gpu", 16, True, (8, 0)),
        (3, -1, "gpu", 32, True, (3, 10)),
        (-1, 0, "gpu", 16, True, (14, 0)),
        (-1, 4, "gpu", 16, True, (2, 4)),
        (-1, 4, "gpu", 16, False, (3, 4)),
        (1, 0, "gpu", 16, False, (1, 0)),
    ],
)
def test_pipeline_sizes_follow_the_backend_and_the_cores(
    threads, workers, backend, cores, decodes, want
) -> None:
    sizes = resolve_pipeline_sizes(threads, workers, backend=backend, cores=cores, decodes=decodes)
    assert (sizes.threads, sizes.workers) == want
    if threads != -1 and workers != -1:
        assert sizes.reason == "as set"
    else:
        assert backend.lower() in sizes.reason.lower()
    assert sizes.describe().startswith(
        f"{want[1]} worker processes of {want[0]} threads" if want[1] else f"{want[0]} thread"
    )


def test_host_cores_reads_the_affinity_where_there_is_one(monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert host_cores() == 3
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    assert host_cores() == 12
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert host_cores() == 1


def test_input_pipeline_sizes_in_memory_images_for_the_backend(monkeypatch) -> None:
    """The trainer's call: the config's -1 sizes resolved for the host's cores and the
    backend; images in memory get threads on an accelerator."""
    import jdml.data.pipeline as pipeline

    monkeypatch.setattr(pipeline, "host_cores", lambda: 16)
    data = ImageArrays(
        images=np.zeros((8, 4, 4, 1), np.uint8),
        labels=np.repeat(np.arange(4), 2).astype(np.int32),
        class_names=tuple("abcd"),
    )
    make_batch = TrainBatch(data=data, sampler=StepSampler(8), augment=affine_augment, seed=1)
    cfg = base_config().data
    assert (cfg.num_threads, cfg.num_workers, cfg.decode_cache) == (-1, -1, False)
    same, sizes = input_pipeline(make_batch, cfg, backend="gpu")
    assert same is make_batch and (sizes.threads, sizes.workers) == (14, 0)
    _, sizes = input_pipeline(make_batch, cfg, backend="cpu")
    assert (sizes.threads, sizes.workers) == (2, 0)


def test_train_batches_sizes_itself_for_auto_values(make_batch, monkeypatch) -> None:
    """A library caller may pass -1 straight to train_batches: on the CPU backend that is
    2 threads in this process, and the batches are those of explicit sizes."""
    import jdml.data.pipeline as pipeline

    seen = {}
    resolve = pipeline.resolve_pipeline_sizes

    def spy(*args, **kwargs):
        seen["sizes"] = resolve(*args, **kwargs)
        return seen["sizes"]

    monkeypatch.setattr(pipeline, "resolve_pipeline_sizes", spy)
    monkeypatch.setattr(pipeline, "platform", lambda: "cpu")
    batches = list(
        train_batches(
            make_batch, start_step=0, total_steps=2, num_threads=-1, prefetch=2, num_workers=-1
        )
    )
    assert (seen["sizes"].threads, seen["sizes"].workers) == (2, 0)
    np.testing.assert_array_equal(batches[1]["images"], make_batch(1)["images"])


def test_an_old_config_with_explicit_sizes_still_resumes() -> None:
    """config.json files written before the sizes were automatic hold 2 and 0: they resume
    (the sizes may change between runs), and load with their own values."""
    from jdml.config.saved import incompatible_keys, saved_config, to_json

    new = json.loads(to_json(tiny_config("unused.npz", **{"data.num_threads": -1})))
    old = json.loads(to_json(tiny_config("unused.npz")))
    old["data"].update(num_threads=2, num_workers=0)
    del old["data"]["decode_cache"]  # a key added later: its default keeps the old behaviour
    defaults = flatten_config(json.loads(to_json(base_config())))
    assert incompatible_keys(old, new, defaults=defaults) == []
    old["data"]["decode_cache"] = True  # other pixels: not the same run
    assert incompatible_keys(old, new, defaults=defaults) == ["data.decode_cache: True -> False"]
    del old["data"]["decode_cache"]
    loaded = saved_config(json.dumps(old))
    assert (loaded.data.num_threads, loaded.data.num_workers) == (2, 0)
    assert loaded.data.decode_cache is False
    validate(loaded)


# --------------------------------------------------------------------------- batched augmentation


def _one_call_per_image(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """affine_augment under another name: the pipeline calls it once per image."""
    return affine_augment(images, rng)


@pytest.mark.parametrize(
    "extra",
    [{}, {"views": 2, "streams": 2}, {"views": 2, "members": (0, 2)}, {"rows": (3, 9)}],
    ids=["plain", "views+streams", "members", "rows"],
)
def test_batched_augmentation_gives_the_per_image_batches(extra) -> None:
    """An augmentation of PER_ROW_DRAWS is applied to the whole batch from every row's draws;
    the batches equal those of one call per image with its own generator, for every view,
    stream, member and row range."""
    rng = np.random.default_rng(0)
    data = ImageArrays(
        images=rng.integers(0, 256, (40, 12, 12, 1), dtype=np.uint8),
        labels=np.repeat(np.arange(10), 4).astype(np.int32),
        class_names=tuple(str(i) for i in range(10)),
    )
    sampler = SAMPLERS.get("class_random")(data.labels, batch_size=12, samples_per_class=2, seed=4)
    batched = TrainBatch(data=data, sampler=sampler, augment=affine_augment, seed=5, **extra)
    looped = dataclasses.replace(batched, augment=_one_call_per_image)
    for step in (0, 7):
        a, b = batched(step), looped(step)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
