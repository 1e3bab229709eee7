"""TensorBoard event files hold the same scalars as metrics.jsonl, and ``profile_steps``
records a profiler trace."""

from __future__ import annotations

import glob
import os
import struct

import pytest

from jdml.config import validate
from jdml.errors import ConfigError
from jdml.fileio import read_jsonl
from jdml.metric_writer import scalar_tags
from jdml.trainer import train_and_evaluate
from jdml.visualize import retrieval_grid_size
from tests.helpers import make_npz, tiny_config


def read_events(folder: str) -> list:
    """Every Event of the TFRecord files in ``folder`` (length, CRC, data, CRC framing)."""
    from tensorboardX.proto.event_pb2 import Event

    events = []
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            events.append(Event.FromString(data[at + 12 : at + 12 + length]))
            at += 12 + length + 4
    return events


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    npz = make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))
    workdir = str(tmp_path_factory.mktemp("run") / "tb")
    train_and_evaluate(
        tiny_config(npz, **{"profile_steps": "1:3", "train.log_every_steps": 1}), workdir
    )
    return workdir


@pytest.mark.slow
def test_the_event_files_hold_every_scalar_of_metrics_jsonl(run_dir):
    want = {}
    for record in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        for tag, value in scalar_tags(record).items():
            want[(tag, int(record["step"]))] = value
    got = {}
    for event in read_events(os.path.join(run_dir, "tensorboard")):
        for value in event.summary.value:
            if not value.HasField("image"):
                got[(value.tag, event.step)] = value.simple_value
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key
    tags = {tag for tag, _ in got}
    assert {"train/loss", "train/lr", "train/img_s", "eval/test/recall_at_1"} <= tags
    assert "eval/train/rho_spectrum_at_1" in tags


@pytest.mark.slow
def test_each_evaluation_adds_the_spectrum_picture(run_dir):
    steps = [
        event.step
        for event in read_events(os.path.join(run_dir, "tensorboard"))
        for value in event.summary.value
        if value.tag == "eval/train/spectrum" and value.image.encoded_image_string
    ]
    assert steps == [0, 3, 6]


@pytest.mark.slow
def test_each_evaluation_adds_the_retrieval_grid(run_dir):
    """The test split's grid (six queries, six neighbours each) at every evaluation; none for
    the training split."""
    images = {
        (value.tag, event.step): value.image
        for event in read_events(os.path.join(run_dir, "tensorboard"))
        for value in event.summary.value
        if value.tag.endswith("/retrieval")
    }
    assert sorted(images) == [("eval/test/retrieval", step) for step in (0, 3, 6)]
    width, height = retrieval_grid_size(6, 6)
    for image in images.values():
        assert (image.width, image.height) == (width, height)
        assert image.encoded_image_string.startswith(b"\x89PNG")


@pytest.mark.slow
def test_profile_steps_record_a_trace(run_dir):
    traces = glob.glob(os.path.join(run_dir, "profile", "**", "*.xplane.pb"), recursive=True)
    assert traces and os.path.getsize(traces[0]) > 0


@pytest.mark.parametrize("text", ["3", "a:b", "5:5", "-1:2", "1:2:3"])
def test_a_malformed_profile_range_is_refused(text):
    c = tiny_config("unused.npz")
    c.profile_steps = text
    with pytest.raises(ConfigError, match="profile_steps"):
        validate(c)
