"""The examples in the docstrings a user reads first run as written (``doctest``): a loss
(``jdml.losses.get``), a miner (``jdml.miners.get``) and the statistics. ``jdml.load``'s runs in
``tests/test_inference.py``, on that module's trained run."""

from __future__ import annotations

import doctest

import pytest

import jdml.losses.base
import jdml.miners.base
import jdml.statistics

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def run_examples(obj: object, globs: dict | None = None) -> doctest.TestResults:
    """Runs the docstring examples of ``obj`` (a function or module); fails on none."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in finder.find(obj, globs=dict(globs or {})):
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0, f"{obj!r} has no examples"
    return results


@pytest.mark.parametrize(
    "obj", [jdml.losses.base.get, jdml.miners.base.make_miner, jdml.statistics]
)
def test_the_docstring_examples_run(obj):
    results = run_examples(obj)
    assert results.failed == 0
