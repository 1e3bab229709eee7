"""Worker processes build the same training batches as threads, in step order, and resume."""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np
import pytest

from jdml.config import validate
from jdml.data.augment import make_augmentation
from jdml.data.benchmarks import read_benchmark
from jdml.data.pipeline import TrainBatch, train_batches
from jdml.errors import ConfigError
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


@pytest.mark.parametrize(("key", "value"), [("num_workers", -1), ("num_threads", 0)])
def test_worker_settings_are_checked(key, value) -> None:
    config = tiny_config("unused.npz", **{f"data.{key}": value})
    with pytest.raises(ConfigError, match=f"data.{key}={value} must be at least"):
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
