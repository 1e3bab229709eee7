"""Which implementation a run computes with: one frozen value, built once from the environment
and the JAX backend, passed to what builds the model and to the evaluator, and recorded in the
run's ``results.json`` and ``eval.py``'s output.

Three choices, each a switch of :mod:`jdml.native.switches` (``auto``, ``xla`` or ``onednn``):

* ``conv`` (``$JDML_CONV``): the convolutions of the CPU-fast backbones, oneDNN's native kernels
  (``"onednn"``) or XLA's (``"xla"``);
* ``knn`` (``$JDML_KNN``): where the k nearest are selected: the native kernel (``"native"``),
  XLA's top-k (``"xla"``), the host (``"host"``), or on the CPU backend the host or XLA by k
  (``"auto"``, :func:`jdml.evaluation.knn.search.select_on_host`);
* ``kmeans`` (``$JDML_KMEANS``): the k-means assignment, native (``"onednn"``) or XLA's.

Backends other than CPU always take XLA's ops. The same numbers come out of every choice up to
float32 rounding (the tests compare them); what differs is the speed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import jax

from jdml.native.switches import ENV, KMEANS_ENV, KNN_ENV, onednn_enabled

KNN_SELECTIONS = ("auto", "native", "host", "xla")


@dataclasses.dataclass(frozen=True)
class Backends:
    """The implementations a run computes with.

    Attributes:
      platform: the JAX backend (``"cpu"``, ``"gpu"``, ``"tpu"``).
      conv: ``"onednn"`` or ``"xla"`` convolutions.
      knn: the kNN selection: ``"native"``, ``"auto"`` (host or XLA by k), ``"host"`` or
        ``"xla"``.
      kmeans: ``"onednn"`` or ``"xla"`` k-means assignment.
    """

    platform: str
    conv: str
    knn: str
    kmeans: str

    def __post_init__(self) -> None:
        if self.conv not in ("onednn", "xla") or self.kmeans not in ("onednn", "xla"):
            raise ValueError(
                f"Backends(conv={self.conv!r}, kmeans={self.kmeans!r}): each is 'onednn' or 'xla'"
            )
        if self.knn not in KNN_SELECTIONS:
            raise ValueError(f"Backends(knn={self.knn!r}): choose one of {KNN_SELECTIONS}")

    @property
    def native_conv(self) -> bool:
        return self.conv == "onednn"

    @property
    def native_kmeans(self) -> bool:
        return self.kmeans == "onednn"

    def record(self) -> dict[str, str]:
        """The value as the run's records hold it."""
        return dataclasses.asdict(self)

    def portable(self) -> Backends:
        """The same with XLA's ops everywhere: for programs that leave this process
        (``jax.export`` refuses custom calls, and another machine may lack the library)."""
        return Backends(self.platform, "xla", "xla", "xla")


def knn_selection(environ: Mapping[str, str] | None = None, platform: str | None = None) -> str:
    """The kNN selection of ``$JDML_KNN`` (in ``environ``, default ``os.environ``) on ``platform``
    (default ``jax.default_backend()``): "native" where the kernel runs, else "auto" on CPU and
    "xla" elsewhere (the value is checked on every platform)."""
    platform = jax.default_backend() if platform is None else platform
    if onednn_enabled(KNN_ENV, environ=environ, platform=platform):  # checks the value
        return "native"
    return "auto" if platform == "cpu" else "xla"


def resolve_backends(
    environ: Mapping[str, str] | None = None, platform: str | None = None
) -> Backends:
    """The backends of ``$JDML_CONV``, ``$JDML_KNN`` and ``$JDML_KMEANS`` (in ``environ``,
    default ``os.environ``) on ``platform`` (default ``jax.default_backend()``).

    Raises:
      ConfigError: a switch's value is not one of auto, xla, onednn; or it is onednn and the
        native library cannot be built.
    """
    environ = os.environ if environ is None else environ
    platform = jax.default_backend() if platform is None else platform

    def native(env: str) -> bool:  # False off the CPU; the value is checked everywhere
        return onednn_enabled(env, environ=environ, platform=platform)

    return Backends(
        platform=platform,
        conv="onednn" if native(ENV) else "xla",
        knn=knn_selection(environ, platform),
        kmeans="onednn" if native(KMEANS_ENV) else "xla",
    )
