"""The evaluator's automatic block sizes follow the backend: cache-sized blocks on CPU, large
ones on accelerators, an explicit module setting on every backend."""

from __future__ import annotations

import jax
import pytest

from jdml.evaluation.kmeans import assignment
from jdml.evaluation.knn import blocks


@pytest.mark.parametrize(
    ("backend", "scores", "assign"),
    [("cpu", 2**22, 2**21), ("gpu", 2**28, 2**27), ("tpu", 2**28, 2**27)],
)
def test_block_sizes_follow_the_backend(monkeypatch, backend, scores, assign):
    monkeypatch.setattr(blocks, "BLOCK_SCORES", None)  # the tests' small_blocks unset
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert blocks.block_scores() == scores
    assert assignment.assign_scores() == assign
    # SOP's size: 60,502 queries against chunks of 15,136 references, 11,316 clusters.
    rows = blocks.query_block(60_502, 15_136, blocks.DEFAULT_BLOCK_SIZE)
    assert rows == max(512, scores // 15_136)
    assert assignment.block_rows(60_502, 11_316, None) == max(64, assign // 11_316)


def test_an_explicit_setting_wins_on_every_backend(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(blocks, "BLOCK_SCORES", 6 * 100)
    monkeypatch.setattr(assignment, "ASSIGN_SCORES", 4 * 13)
    assert blocks.query_block(1000, 100, 2) == 6
    assert assignment.block_rows(1000, 4, None) == 64  # at least MIN_BLOCK_ROWS
    assert assignment.block_rows(1000, 4, 13) == 13
