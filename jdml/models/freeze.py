"""Partial fine-tuning: train only the last stages of a pretrained backbone.

``model.frozen_stages = k`` freezes the stem (stage 0) and the first ``k`` stages; -1 (the
default, and the papers' protocol) trains everything. The backbone cuts the gradient after the
last frozen stage, so that XLA drops the backward pass of the frozen stages (on CPU the early
stages, with the widest maps, cost most of it), and the optimiser leaves their parameters
untouched (no update, no weight decay). With frozen BatchNorm the frozen stages are then a fixed
function of the image. The convention is the one of detection toolkits' ``frozen_stages``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

#: ``model.frozen_stages`` value that freezes nothing.
NOT_FROZEN = -1


def cut_after(x: jnp.ndarray, stage: int, frozen_stages: int) -> jnp.ndarray:
    """``x`` with its gradient cut if ``stage`` (0: the stem) is the last frozen one."""
    return jax.lax.stop_gradient(x) if stage == frozen_stages else x


def frozen_modules(stages: Sequence[Sequence[str]], frozen_stages: int) -> frozenset[str]:
    """Names of the backbone submodules that ``frozen_stages`` freezes.

    Args:
      stages: submodule names per stage, the stem first.
      frozen_stages: -1 (nothing), 0 (the stem) ... ``len(stages) - 1``.

    Raises:
      ValueError: for a value outside that range.
    """
    if not NOT_FROZEN <= frozen_stages < len(stages):
        raise ValueError(
            f"model.frozen_stages={frozen_stages}: choose -1 (train everything), 0 (freeze the "
            f"stem) or up to {len(stages) - 1} (the stem and that many stages)"
        )
    return frozenset(name for stage in stages[: frozen_stages + 1] for name in stage)
