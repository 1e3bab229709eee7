"""The README's "Losses and miners in your own loop" example runs as printed, and the functional
API refuses what it does not know."""

from __future__ import annotations

import math
import os
import re

import pytest

from jdml.errors import UnknownNameError
from tests.helpers import REPO


def _example() -> str:
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    section = text.split("## Losses and miners in your own loop", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.smoke
def test_the_readme_example_trains_a_user_model(capsys):
    namespace: dict = {}
    exec(compile(_example(), "README.md", "exec"), namespace)  # the README of this repository
    losses = namespace["losses"]
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0]
    assert "margin loss" in capsys.readouterr().out


def test_unknown_names_hyperparameters_and_values_are_refused():
    import jdml.losses
    import jdml.miners

    with pytest.raises(UnknownNameError, match="margin"):
        jdml.losses.get("margn")
    with pytest.raises(TypeError, match=r"takes no \['margn'\].*'margin'"):
        jdml.losses.get("margin", num_classes=4, margn=0.1)
    with pytest.raises(ValueError, match=r"margin=-1\.0"):
        jdml.losses.get("margin", num_classes=4, margin=-1.0)
    with pytest.raises(TypeError, match="miner 'distance'"):
        jdml.miners.get("distance", cutoff=0.5)
    assert jdml.losses.get("triplet", margin=0.3).margin == 0.3
