"""Device views against the Pillow views: every photo augmentation's pixels on real photos and on
fixed edge-case boxes, Pillow's resample taps, the same parameters from the same seed in the
pipeline, resident and streamed photos, and DiVA, Sharing Matters and a DM2 cohort trained with
device views (resumed bit for bit)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import skimage.data
from PIL import Image

from jdml.config import set_keys, validate
from jdml.data import photo_augment as pa
from jdml.data.device_pixels import Frames, host_canvases, make_views, stored
from jdml.data.device_views import blend, hsv_tables, render, view_arrays, view_shape
from jdml.data.pipeline import input_pipeline
from jdml.data.resample import pillow_taps, resample_reference
from jdml.data.transforms import PIL_FILTERS
from jdml.errors import ConfigError
from jdml.fileio import read_jsonl
from jdml.run import Run
from jdml.trainer import train_and_evaluate
from tests import benchmark_trees as trees
from tests.helpers import (
    REPO,
    TINY_OVERRIDES,
    restore_latest,
    tiny_config,
    write_tiny_config_file,
)
from tests.helpers import photo_overrides as helper_photo_overrides

CLASS_IDS = (97, 98, 99, 100, 101, 102, 103, 104)


@functools.cache
def photos() -> list[np.ndarray]:
    """Real photos of several sizes and both orientations (scikit-image's samples)."""
    return [
        skimage.data.astronaut(),  # 512 x 512
        skimage.data.coffee(),  # 400 x 600, landscape
        skimage.data.chelsea()[:, :290],  # 300 x 290, portrait
        skimage.data.rocket()[:, 100:300],  # 427 x 200, tall
        skimage.data.coffee()[150:170, 200:223],  # 20 x 23, smaller than the views
    ]


def device_pixels(images, params, size, *, resize=0, colour=False, filter="bilinear"):
    """The device views of ``images`` with ``params``, as uint8 levels."""
    frames = Frames.of(np.array([im.shape[:2] for im in images]))
    shape = view_shape(size, frames.rows, frames.cols, resize=resize, colour=colour, filter=filter)
    canvases = host_canvases(images, frames.rows, frames.cols)
    tables = tuple(jnp.asarray(t) for t in hsv_tables()) if colour else None
    fn = jax.jit(lambda c, t, a, tb: render(c, t, a, shape, tb))
    out = np.asarray(fn(canvases, frames.transposed, view_arrays(params, shape), tables))
    levels = np.rint(out * 255.0)
    np.testing.assert_array_equal(out, levels / np.float32(255))  # ToTensor's x / 255 exactly
    return levels.astype(np.uint8)


def pillow_pixels(images, params) -> np.ndarray:
    return np.stack([pa.pillow_view(im, p) for im, p in zip(images, params, strict=True)])


def draws(name: str, count: int, size: int, seed: int = 0):
    """``count`` views of the photos drawn as augmentation ``name`` draws them."""
    rng = np.random.default_rng(seed)
    images = [photos()[i % len(photos())] for i in range(count)]
    draw = {
        "base": lambda h, w: pa.rrc_view_params(h, w, rng, size),
        "big": lambda h, w: pa.rrc_view_params(h, w, rng, size),
        "adv": lambda h, w: pa.rrc_view_params(h, w, rng, size, 0.2),
        "realistic": lambda h, w: pa.rrc_view_params(h, w, rng, size, 0.4),
        "red": lambda h, w: pa.red_view_params(h, w, rng, size, 32 + size),
        "eval": lambda h, w: pa.eval_view_params(h, w, 32 + size, size),
        "vit": lambda h, w: pa.rrc_view_params(h, w, rng, size, scale=(0.2, 1.0), filter="bicubic"),
        "eval_bicubic": lambda h, w: pa.eval_view_params(h, w, 32 + size, size, "bicubic"),
    }[name]
    return images, [draw(*im.shape[:2]) for im in images]


@pytest.mark.smoke
@pytest.mark.parametrize(
    "name", ["base", "big", "red", "eval", "adv", "realistic", "vit", "eval_bicubic"]
)
def test_device_views_equal_the_pillow_views_on_real_photos(name):
    size = 64 if name != "big" else 72
    images, params = draws(name, 15, size)
    colour = name in ("adv", "realistic")
    filter = params[0].filter
    got = device_pixels(images, params, size, resize=32 + size, colour=colour, filter=filter)
    np.testing.assert_array_equal(got, pillow_pixels(images, params))
    if colour:  # the draws did exercise grayscale and every jitter operation
        assert any(p.gray for p in params)
        assert {op for p in params for op, _ in p.jitter} == {0, 1, 2, 3}


def test_fixed_boxes_with_their_edge_cases_equal_pillow():
    """On one square canvas (one pass order computed, the canvas transposed where the other
    comes first): photos stored as they are and transposed, both of Pillow's pass orders."""
    astronaut, tall = photos()[0], photos()[3]
    wide = skimage.data.coffee()[:300, :500]  # stored transposed; the canvas is 512 x 512
    view = pa.ViewParams
    cases = [
        (wide, view((0, 0, 300, 500), (48, 48), (0, 0), 48, flip=True)),
        (wide, view((10, 30, 290, 40), (48, 48), (0, 0), 48)),  # the vertical pass first
        (astronaut, view((0, 0, 512, 512), (48, 48), (0, 0), 48)),  # the whole photo, shrunk 10x
        (astronaut, view((100, 200, 1, 1), (48, 48), (0, 0), 48, flip=True)),  # one pixel
        (astronaut, view((10, 20, 7, 300), (48, 48), (0, 0), 48)),  # a thin strip
        (astronaut, view((511, 0, 1, 512), (48, 48), (0, 0), 48)),  # the last row
        (astronaut, view((5, 3, 48, 48), (48, 48), (0, 0), 48, flip=True)),  # no resample
        (tall, view((0, 0, 427, 200), (200, 94), (76, 23), 48)),  # resize, then a window
        (tall, view((0, 0, 427, 60), (48, 48), (0, 0), 48, gray=True)),  # the vertical pass first
        (tall, view((3, 4, 30, 20), (48, 48), (0, 0), 48, jitter=((3, -0.5), (1, 1.4)))),
        (tall, view((3, 4, 30, 20), (48, 48), (0, 0), 48, jitter=((2, 0.0), (0, 1.9), (3, 0.5)))),
    ]
    images, params = zip(*cases, strict=True)
    got = device_pixels(list(images), list(params), 48, resize=200, colour=True)
    np.testing.assert_array_equal(got, pillow_pixels(images, params))
    # The same boxes with the bicubic filter: negative weights, overshoots clipped to 0 and 255.
    bicubic = [dataclasses.replace(p, filter="bicubic") for p in params]
    got = device_pixels(list(images), bicubic, 48, resize=200, colour=True, filter="bicubic")
    np.testing.assert_array_equal(got, pillow_pixels(images, bicubic))


#: Blend factors where the exact ``d + f * (x - d)`` lands on an integer for some pixel pairs
#: (a multiply-add fused without the product's rounding gave one level less: 361 of the 65,536
#: pairs at 0.6, 1,547 at 1.2, on the CPU), and drawn ones, within ColorJitter's range and past 1.
BLEND_FACTORS = (0.6, 1.2, *np.random.default_rng(78).uniform(0.0, 2.0, 4).round(6).tolist())


@pytest.mark.parametrize("factor", BLEND_FACTORS)
def test_blend_equals_pillow_on_every_pixel_pair(factor):
    """``blend`` against ``Image.blend`` on all 65,536 (degenerate, pixel) level pairs."""
    grid = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8))
    degenerate, pixels = (jnp.asarray(a, jnp.int32) for a in grid)
    got = jax.jit(blend)(degenerate, pixels, jnp.float32(factor))
    want = Image.blend(*(Image.fromarray(a) for a in grid), factor)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("factor", BLEND_FACTORS[:2])
def test_colour_jitter_at_factors_that_land_on_integers_equals_pillow(factor):
    """Brightness, contrast and saturation views of a photo of random colours (every level in
    every channel) at the factors that hit the case."""
    image = np.random.default_rng(0).integers(0, 256, (48, 48, 3), np.uint8)
    view = pa.ViewParams((0, 0, 48, 48), (48, 48), (0, 0), 48)
    params = [dataclasses.replace(view, jitter=((op, factor),)) for op in (0, 1, 2)]
    got = device_pixels([image] * 3, params, 48, resize=48, colour=True)
    np.testing.assert_array_equal(got, pillow_pixels([image] * 3, params))


@pytest.mark.parametrize(("in_len", "out_len"), [(1, 5), (7, 7), (300, 224), (512, 48), (5, 640)])
@pytest.mark.parametrize("filter", ["bilinear", "bicubic"])
def test_pillow_taps_reproduce_pillow_resize(in_len, out_len, filter):
    image = photos()[0][:in_len, : max(in_len // 2, 1)]
    ref = Image.fromarray(np.ascontiguousarray(image)).resize(
        (image.shape[1], out_len), PIL_FILTERS[filter]
    )
    np.testing.assert_array_equal(resample_reference(image, out_len, image.shape[1], filter), ref)
    first, coef = pillow_taps(in_len, out_len, filter)
    assert first.min() >= 0 and (first + (coef != 0).sum(1)).max() <= in_len
    # Pillow's fixed-point weights sum to one (2^22) up to their rounding.
    assert np.abs(coef.sum(1).astype(np.int64) - (1 << 22)).max() <= coef.shape[1]
    assert (coef.min() < 0) == (filter == "bicubic" and in_len not in (1, out_len))


def test_pillow_taps_on_random_crops_equal_pillow():
    """Random crop sizes to random output sizes, both filters: Pillow's pixels exactly."""
    rng = np.random.default_rng(0)
    image = photos()[0]
    for _ in range(60):
        h, w = (int(v) for v in rng.integers(1, 512, size=2))
        out_h, out_w = (int(v) for v in rng.integers(1, 300, size=2))
        crop = np.ascontiguousarray(image[:h, :w])
        for filter, pil in PIL_FILTERS.items():
            ref = np.asarray(Image.fromarray(crop).resize((out_w, out_h), pil))
            got = resample_reference(crop, out_h, out_w, filter)
            np.testing.assert_array_equal(got, ref, err_msg=f"{filter} {h}x{w} -> {out_h}x{out_w}")


@pytest.fixture(scope="module")
def cub(tmp_path_factory):
    root = trees.write_cub(tmp_path_factory.mktemp("cub"), class_ids=CLASS_IDS, per_class=4)
    return root, tmp_path_factory.mktemp("decoded")


def photo_overrides(cub, **overrides):
    """The shared photo settings (:func:`tests.helpers.photo_overrides`) with the decode cache."""
    root, cache = cub
    return helper_photo_overrides(
        root, **{"data.decode_cache": True, "data.cache_dir": str(cache), **overrides}
    )


def cub_config(cub, **overrides):
    return tiny_config("unused.npz", **photo_overrides(cub, **overrides))


def realized(run: Run, step: int) -> dict[str, np.ndarray]:
    """The batch of ``step`` as the step sees it (device views made, as in the jitted step)."""
    batch, _ = input_pipeline(run.batch_maker(), run.config.data)
    views = run.device_views
    out = jax.jit(functools.partial(make_views, views.spec))(batch(step), views.resident)
    return {k: np.asarray(v) for k, v in out.items()}


def host_batch(run: Run, step: int) -> dict[str, np.ndarray]:
    batch, _ = input_pipeline(run.batch_maker(), run.config.data)
    return batch(step)


@pytest.mark.parametrize("augment", ["base", "red", "adv", "realistic", "vit"])
def test_the_pipeline_draws_the_same_views_on_both_paths(cub, augment):
    device = Run(cub_config(cub, **{"data.augment": augment, "data.views": "device"}))
    host = Run(cub_config(cub, **{"data.augment": augment, "data.views": "host"}))
    assert device.device_views is not None and host.device_views is None
    for step in (0, 1):
        got, want = realized(device, step), host_batch(host, step)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_set_over_the_memory_budget_streams_with_the_same_views(cub, caplog):
    resident = Run(cub_config(cub, **{"data.views": "device"}))
    with caplog.at_level(logging.INFO, logger="jdml"):
        streamed = Run(cub_config(cub, **{"data.views": "device", "data.device_photos_gib": 1e-6}))
        assert streamed.device_views is not None
    assert "are streamed" in caplog.text
    assert "pixels" not in streamed.device_views.resident
    batch, _ = input_pipeline(streamed.batch_maker(), streamed.config.data)
    assert batch(0)["canvas"].dtype == np.uint8 and "photos" not in batch(0)
    np.testing.assert_array_equal(realized(streamed, 0)["images"], realized(resident, 0)["images"])


def diva_config(cub, **overrides):
    from configs.diva import get_config

    c = get_config("data=npz")
    set_keys(c, {**TINY_OVERRIDES, **photo_overrides(cub)})
    set_keys(c, {"aux.selfsimilarity.queue_batches": 2, "decorrelation.hidden": 8})
    set_keys(c, {"eval.combinations": ((0.5, 1.0, 1.0, 1.0),), **overrides})
    validate(c)
    return c


def sharing_config(cub, **overrides):
    """Sharing Matters' alternating variant: its shared head trains on a second stream."""
    from configs.sharing import get_config

    c = get_config("data=npz,alternating=1")
    set_keys(c, {**TINY_OVERRIDES, **photo_overrides(cub), **overrides})
    validate(c)
    return c


METHODS = {
    "diva": diva_config,
    "sharing": sharing_config,
    "dm2": lambda cub, **o: cub_config(cub, **{"cohort.size": 2, **o}),
}


@pytest.mark.slow
@pytest.mark.smoke
@pytest.mark.parametrize("method", sorted(METHODS))
def test_methods_train_with_device_views_as_with_host_views(cub, method, tmp_path):
    """DiVA (two views), Sharing Matters (a second stream) and a DM2 cohort with view diversity
    (a view per member): the device batch equals the host batch, and two steps give the same
    losses."""
    make = METHODS[method]
    runs = {where: Run(make(cub, **{"data.views": where})) for where in ("device", "host")}
    batch = host_batch(runs["host"], 0)
    assert realized(runs["device"], 0).keys() == batch.keys()
    if method == "diva":
        assert "images_b" in batch
    if method == "sharing":
        assert "images_1" in batch
    if method == "dm2":
        assert batch["images"].shape[0] == 2  # one view per member
    losses = {}
    for where, run in runs.items():
        step, state = run.make_train_step(), run.prepare(run.initial_state)
        make_batch, _ = input_pipeline(run.batch_maker(), run.config.data)
        for s in range(2):
            state, metrics = step(state, make_batch(s))
        losses[where] = float(metrics["loss"])
        assert step._cache_size() == 1
    assert np.isfinite(losses["device"])
    np.testing.assert_allclose(losses["device"], losses["host"], rtol=1e-5)


@pytest.mark.slow
def test_a_resumed_run_with_device_views_equals_an_uninterrupted_one(cub, tmp_path):
    config = diva_config(cub, **{"data.views": "device", "train.epochs": 2})
    whole = tmp_path / "whole"
    train_and_evaluate(config, str(whole))
    parts = tmp_path / "parts"
    first = diva_config(cub, **{"data.views": "device", "train.epochs": 1})
    train_and_evaluate(first, str(parts))  # stops after epoch 1, as a killed run would
    config_json = (parts / "config.json").read_text()
    (parts / "config.json").write_text(config_json.replace('"epochs": 1', '"epochs": 2'))
    train_and_evaluate(config, str(parts))
    run = Run(config)
    for a, b in zip(
        jax.tree.leaves(restore_latest(str(whole), run)),
        jax.tree.leaves(restore_latest(str(parts), run)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_run_with_device_views_killed_mid_run_resumes_to_identical_params(cub, tmp_path):
    """``train.py`` with device views, SIGKILLed once its second checkpoint is written, then run
    again: it ends with the params and evaluations of an uninterrupted run."""
    overrides = photo_overrides(
        cub, **{"data.views": "device", "train.epochs": 3, "train.checkpoint_every_steps": 1}
    )
    cfg_file = write_tiny_config_file(str(tmp_path), "unused.npz", **overrides)
    whole, killed = tmp_path / "whole", tmp_path / "killed"

    def command(workdir):
        return [sys.executable, os.path.join(REPO, "train.py"), f"--config={cfg_file}",
                f"--workdir={workdir}"]  # fmt: skip

    done = subprocess.run(command(whole), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    proc = subprocess.Popen(command(killed), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    ckpts, deadline, killed_at = killed / "checkpoints", time.time() + 300, None
    while time.time() < deadline and proc.poll() is None:
        steps = [int(d) for d in os.listdir(ckpts) if d.isdigit()] if ckpts.is_dir() else []
        if steps and max(steps) >= 2:
            proc.send_signal(signal.SIGKILL)
            killed_at = max(steps)
            break
        time.sleep(0.02)
    proc.wait()
    assert killed_at is not None and killed_at < 6, "the run ended before it could be killed"
    done = subprocess.run(command(killed), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming from the checkpoint" in done.stderr + done.stdout
    run = Run(tiny_config("unused.npz", **overrides))
    for a, b in zip(
        jax.tree.leaves(restore_latest(str(whole), run)),
        jax.tree.leaves(restore_latest(str(killed), run)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def evals(workdir):
        return [r for r in read_jsonl(str(workdir / "metrics.jsonl")) if r["kind"] == "eval"]

    assert evals(killed) == evals(whole)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"data.views": "gpu"}, "data.views='gpu'; choose one of: auto, host, device"),
        ({"data.views": "device", "data.augment": "affine"}, "not of data.augment='affine'"),
        ({"data.device_photos_gib": -2.0}, "data.device_photos_gib"),
    ],
)
def test_view_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny_config("unused.npz", **overrides))


@pytest.mark.slow
def test_a_run_resumes_with_its_views_made_elsewhere(cub, tmp_path):
    """A run trained with host views continues with device views (the same pixels): the
    workdir's config is not refused, and the run ends as an uninterrupted host-view run."""
    host = cub_config(cub, **{"data.views": "host", "train.epochs": 2})
    train_and_evaluate(host, str(tmp_path / "whole"))
    train_and_evaluate(cub_config(cub, **{"data.views": "host"}), str(tmp_path / "mixed"))
    device = cub_config(cub, **{"data.views": "device", "train.epochs": 2})
    train_and_evaluate(device, str(tmp_path / "mixed"))
    run = Run(host)
    for a, b in zip(
        jax.tree.leaves(restore_latest(str(tmp_path / "whole"), run)),
        jax.tree.leaves(restore_latest(str(tmp_path / "mixed"), run)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_the_photos_go_to_the_device_only_when_training_asks(cub):
    """A run built for evaluation (``eval.py`` builds one) holds no training photos on the
    device; the first batch maker or train step builds them once."""
    run = Run(cub_config(cub, **{"data.views": "device"}))
    assert run.views_place == "device" and "device_views" not in run.__dict__
    run.batch_maker()
    assert run.device_views is run.device_views and "pixels" in run.device_views.resident


def test_device_views_of_photos_decoded_per_draw_ask_for_the_cache(cub):
    with pytest.raises(ConfigError, match=r"data\.decode_cache=True"):
        Run(cub_config(cub, **{"data.views": "device", "data.decode_cache": False}))


@pytest.mark.slow
@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 (fake) devices")
@pytest.mark.parametrize(
    "mesh",
    [
        {"cohort.size": 2, "cohort.devices": 2},  # each member's views on its own device
        {"cohort.size": 2, "cohort.devices": 2, "parallel.data_devices": 2},
        {"parallel.data_devices": 2},  # one member, its batch split over two devices
    ],
)
def test_device_views_on_a_mesh_train_as_on_one_device(cub, mesh):
    """On a mesh each device holds its shard of the resident photos and the view parameters
    are placed as the views they make: the losses are those of the one-device run."""
    runs = [
        Run(cub_config(cub, **{"data.views": "device", "exchange.dm2.warmup_epochs": 0.0, **o}))
        for o in ({k: v for k, v in mesh.items() if k == "cohort.size"}, mesh)
    ]
    assert runs[1].program.placement.on_mesh
    pixels, frames = runs[1].device_views.resident["pixels"], runs[1].device_views.spec.frames
    devices = runs[1].program.placement.mesh.size
    assert frames.shards == devices and len(pixels.addressable_shards) == devices
    assert {s.data.shape[0] for s in pixels.addressable_shards} == {frames.shard_rows}
    losses = []
    for run in runs:
        step, state = run.make_train_step(), run.prepare(run.initial_state)
        make_batch, _ = input_pipeline(run.batch_maker(), run.config.data)
        history = []
        for s in range(2):
            state, metrics = step(state, make_batch(s))
            history.append(float(metrics["loss"]))
        assert step._cache_size() == 1
        losses.append(history)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


@pytest.mark.parametrize(
    "shapes, shards",
    [
        ([(30, 20), (20, 30), (25, 25), (40, 10), (8, 9)], 4),  # both orientations
        ([(30, 20), (20, 30)], 4),  # more devices than photos: empty shards
        ([(12, 12)], 2),
        ([(5, 7)] * 9, 3),
    ],
)
def test_frames_split_whole_photos_over_the_devices(shapes, shards):
    frames, whole = Frames.of(np.array(shapes), shards), Frames.of(np.array(shapes))
    long = np.array(shapes).max(axis=1)
    shard = frames.shard_of(np.arange(len(shapes)))
    assert frames.shards == shards and np.all(np.diff(shard) >= 0)
    for g in range(shards):
        local = frames.starts[shard == g] - g * frames.shard_rows
        rows = long[shard == g]
        np.testing.assert_array_equal(local, np.cumsum(rows) - rows)  # packed from row 0
        assert local.size == 0 or local[-1] + rows[-1] + frames.rows <= frames.shard_rows
    assert frames.resident_bytes < whole.resident_bytes or shards > len(shapes)
    np.testing.assert_array_equal(whole.starts, np.cumsum(long) - long)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 (fake) devices")
@pytest.mark.parametrize("grid", [(1, 4), (2, 2), (4, 1)])
def test_canvases_gathered_from_a_split_set_equal_the_whole_sets(grid):
    """Each device cuts the canvases it holds and the mesh sums them: the batch's canvases,
    placed on the data axis, equal those cut from the unsplit set (repeated photos too)."""
    from jax.sharding import Mesh

    from jdml.data.device_pixels import gather_canvases, gather_sharded, place_resident
    from jdml.mesh import AXIS, DATA

    images = photos()
    split = type("Split", (), {"load": lambda self, index: [images[i] for i in index]})()
    shapes = np.array([im.shape[:2] for im in images])
    mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(grid), (AXIS, DATA))
    frames, whole = Frames.of(shapes, 4), Frames.of(shapes)
    pixels = place_resident(split, frames, mesh)
    assert [s.data.shape[0] for s in pixels.addressable_shards] == [frames.shard_rows] * 4
    index = np.array([4, 0, 0, 3, 1, 2, 4, 1], np.int32)
    fn = jax.jit(lambda p, s, i: gather_sharded(p, s, i, frames.rows, frames, mesh))
    got = fn(pixels, jnp.asarray(frames.starts, jnp.int32), index)
    batch = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(DATA))
    assert got.sharding.is_equivalent_to(batch, got.ndim)
    want = gather_canvases(
        place_resident(split, whole, None), jnp.asarray(whole.starts[index]), whole.rows
    )
    for b, i in enumerate(index):  # a canvas runs on into whatever follows the photo
        rows, cols = sorted(shapes[i], reverse=True)
        np.testing.assert_array_equal(got[b, :rows, :cols], want[b, :rows, :cols])
        np.testing.assert_array_equal(got[b, :rows, :cols], stored(images[i]))
