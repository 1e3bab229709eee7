"""The platform a program is built for: the JAX backend, or the accelerator it is lowered for.

Every choice jdml makes by platform (oneDNN's kernels or XLA's ops, a 1x1 convolution's form, a
block size of the evaluator, where the views are made) asks :func:`platform`, never
``jax.default_backend()`` itself. Within :func:`lowering_for`, :func:`platform` answers the
accelerator named, so that a CPU-only process traces exactly the program a GPU or TPU would run
and ``jax.export`` can lower it for that accelerator (``tests/test_lowering.py``): a CPU-only
custom call or an op with no lowering there then fails on CPU, before any accelerator is lent.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

#: ``jax.export``'s platform names and the backend names ``jax.default_backend()`` gives.
BACKEND_OF = {"cuda": "gpu", "rocm": "gpu", "tpu": "tpu", "cpu": "cpu"}

_LOWERING_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jdml_lowering_for", default=None
)


def platform() -> str:
    """The backend programs are built for now: ``"cpu"``, ``"gpu"`` or ``"tpu"``, the one named
    by an enclosing :func:`lowering_for`, else ``jax.default_backend()``."""
    target = _LOWERING_FOR.get()
    return jax.default_backend() if target is None else target


@contextlib.contextmanager
def lowering_for(target: str) -> Iterator[str]:
    """Builds and traces programs within for ``target``, one of ``jax.export``'s platforms
    (``"cuda"``, ``"rocm"``, ``"tpu"`` or ``"cpu"``): :func:`platform` answers its backend.

    Yields:
      the backend name (``"gpu"`` for cuda and rocm).

    Raises:
      ValueError: ``target`` is not one of those platforms.
    """
    if target not in BACKEND_OF:
        raise ValueError(f"unknown platform {target!r}: choose one of {', '.join(BACKEND_OF)}")
    token = _LOWERING_FOR.set(BACKEND_OF[target])
    try:
        yield BACKEND_OF[target]
    finally:
        _LOWERING_FOR.reset(token)
