"""A run's train step lowered for a GPU or TPU on a machine without one (``jax.export``).

Under :func:`jdml.platform.lowering_for`, every platform choice takes the accelerator's branch
(XLA's ops, no oneDNN kernel, the accelerator's block sizes), so the program traced on this CPU
is the one the accelerator would compile. ``jax.export`` then lowers it to StableHLO for that
platform, and fails on what would fail there: a custom call registered for the CPU alone (the
native kernels, ``jdml_dnnl_*``), a host callback, or an op without a lowering on that platform.

``tests/test_lowering.py`` lowers every method's step this way, for ``cuda`` and ``tpu``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections

from jdml.platform import lowering_for


def _export(fn: Callable, platform: str, allow: Sequence[str]) -> Callable:
    """``jax.export.export`` of ``fn`` for ``platform``, the custom calls ``allow`` accepted."""
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in allow]
    return jax.export.export(fn, platforms=(platform,), disabled_checks=checks)


def export_for(platform: str, fn: Callable, *args: Any, **kwargs: Any) -> jax.export.Exported:
    """The jitted ``fn`` on ``args`` traced for ``platform`` (``"cuda"``, ``"rocm"``, ``"tpu"``)
    and lowered for it.

    Raises:
      ValueError: ``fn`` holds a call that ``platform`` cannot run (``jax.export``'s message).
    """
    with lowering_for(platform):
        return _export(fn, platform, ())(*args, **kwargs)


def export_train_step(
    config: ml_collections.ConfigDict, platforms: Sequence[str], allow: Sequence[str] = ()
) -> dict[str, jax.export.Exported]:
    """The train step of the run of ``config``, built for the first of ``platforms`` with an
    abstract state (shapes: nothing runs on this machine), traced and lowered for each
    (:func:`export_run_step`)."""
    from jdml.run import Run  # the run builds the whole library: imported when asked for

    with lowering_for(platforms[0]):
        run = Run(config, abstract=True)
    return export_run_step(run, platforms, allow)


def export_run_step(
    run: Any, platforms: Sequence[str], allow: Sequence[str] = ()
) -> dict[str, jax.export.Exported]:
    """The train step of ``run`` (:class:`jdml.run.Run`), traced and lowered for each of
    ``platforms`` on the run's first batch and initial state.

    What a run chooses when it is built (its backends, where its views are made) is the same for
    every accelerator; the step is traced again for each platform. ``allow``: custom calls of
    the platform's own libraries the program may hold (``jax.export`` accepts only those whose
    compatibility is guaranteed, e.g. not cuDNN's fused attention).
    """
    state, batch = run.initial_state, run.batch_maker()(0)
    exported = {}
    for target in platforms:
        with lowering_for(target):
            step = run.make_train_step()
            args = (state, batch)
            if hasattr(step, "arguments"):  # a step that places its arguments (PlacedStep)
                args, step = step.arguments(state, batch), step.jitted
            exported[target] = _export(step, target, allow)(*args)
    return exported
