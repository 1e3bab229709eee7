"""Which implementation a run computes with: one frozen value, resolved once from the config's
``backends`` section, the environment and the JAX backend, passed to what builds the model and
to the evaluator, and recorded in the run's ``results.json`` and ``eval.py``'s output.

Three choices, each a key of ``backends`` (``--config.backends.conv=xla``) whose ``"auto"``
defers to a switch of :mod:`jdml.native.switches` (``auto``, ``xla`` or ``onednn``), the
process-wide default:

* ``conv`` (``$JDML_CONV``): the convolutions of the CPU-fast backbones, oneDNN's native kernels
  (``"onednn"``) or XLA's (``"xla"``);
* ``knn`` (``$JDML_KNN``): where the k nearest are selected: the native kernel (``"native"``),
  XLA's top-k (``"xla"``), the host (``"host"``), or on the CPU backend the host or XLA by k
  (``"auto"``, :func:`jdml.evaluation.knn.search.select_on_host`);
* ``kmeans`` (``$JDML_KMEANS``): the k-means assignment, native (``"onednn"``) or XLA's.

:func:`resolve_backends` is the only reader of those variables: a config value other than
``"auto"`` wins, ``"auto"`` takes the variable where it is set, and else the native kernels where
the library builds. Backends other than CPU always take XLA's ops. The same numbers come out of
every choice up to float32 rounding (the tests compare them); what differs is the speed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from jdml.errors import ConfigError
from jdml.native.switches import ENV, KMEANS_ENV, KNN_ENV, MODES, mode_enabled, onednn_enabled
from jdml.platform import platform as current_platform

KNN_SELECTIONS = ("auto", "native", "host", "xla")
#: The values each key of a config's ``backends`` section takes.
SETTINGS = {"conv": MODES, "knn": KNN_SELECTIONS, "kmeans": MODES}
#: The variable each key's ``"auto"`` defers to.
VARIABLES = {"conv": ENV, "knn": KNN_ENV, "kmeans": KMEANS_ENV}


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
    (default :func:`jdml.platform.platform`): "native" where the kernel runs, else "auto" on CPU and
    "xla" elsewhere (the value is checked on every platform)."""
    platform = current_platform() if platform is None else platform
    if onednn_enabled(KNN_ENV, environ=environ, platform=platform):  # checks the value
        return "native"
    return "auto" if platform == "cpu" else "xla"


def check_backends(section: Mapping[str, Any] | None) -> None:
    """Checks a config's ``backends`` section (None: none, every key ``"auto"``).

    Raises:
      ConfigError: a key holds a value that is not one of its :data:`SETTINGS`.
    """
    for key, choices in SETTINGS.items():
        value = _setting(section, key)
        if value not in choices:
            raise ConfigError(
                f"backends.{key}={value!r}; choose one of {', '.join(choices)} (auto: "
                f"${VARIABLES[key]} where it is set, else the native kernels where they build)"
            )


def _setting(section: Mapping[str, Any] | None, key: str) -> Any:
    """The value of ``key`` in a ``backends`` section (``"auto"`` where it is missing)."""
    return "auto" if section is None else section.get(key, "auto")


def resolve_backends(
    section: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    platform: str | None = None,
) -> Backends:
    """The backends of a config's ``backends`` section (None: every key ``"auto"``), with
    ``$JDML_CONV``, ``$JDML_KNN`` and ``$JDML_KMEANS`` (in ``environ``, default ``os.environ``)
    for its ``"auto"`` keys, on ``platform`` (default :func:`jdml.platform.platform`): a config
    value other than ``"auto"`` wins over the variable.

    Raises:
      ConfigError: a value is not one of its choices; or it is onednn (native for knn) and the
        native library cannot be built.
    """
    check_backends(section)
    environ = os.environ if environ is None else environ
    platform = current_platform() if platform is None else platform

    def native(key: str) -> bool:  # False off the CPU; the values are checked everywhere
        value = _setting(section, key)
        if value == "auto":
            return onednn_enabled(VARIABLES[key], environ=environ, platform=platform)
        return mode_enabled(value, VARIABLES[key], platform, f"backends.{key}")

    knn = _setting(section, "knn")
    if knn == "auto":
        knn = knn_selection(environ, platform)
    elif knn == "native":
        knn = "native" if mode_enabled("onednn", KNN_ENV, platform, "backends.knn") else "xla"
    return Backends(
        platform=platform,
        conv="onednn" if native("conv") else "xla",
        knn=knn,
        kmeans="onednn" if native("kmeans") else "xla",
    )
