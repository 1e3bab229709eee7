"""The switches of the native kernels: ``$JDML_CONV`` chooses the convolution on CPU,
``$JDML_KMEANS`` the k-means assignment and ``$JDML_KNN`` the nearest-neighbour selection:

* ``auto`` (default): the native kernels where the library compiles, else XLA's ops, with one
  warning saying why and how to install oneDNN;
* ``xla``: always XLA's ops (the pure-XLA path, the same on every backend);
* ``onednn``: the native kernels, and an error if the library cannot be built.

Other backends than CPU always take XLA's ops. The variables are the process-wide defaults of a
config's ``backends`` section; :func:`jdml.backends.resolve_backends` alone reads them, once,
and passes the result down (no primitive reads the environment).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping

from jdml.errors import ConfigError
from jdml.native import build
from jdml.platform import platform as current_platform

ENV = "JDML_CONV"
KMEANS_ENV = "JDML_KMEANS"
KNN_ENV = "JDML_KNN"
MODES = ("auto", "xla", "onednn")
# What falls back to XLA, and what it costs, per switch (the fallback's warning).
FALLBACKS = {
    ENV: "CPU convolutions fall back to XLA's, 1.1-1.5x slower to train",
    KMEANS_ENV: "CPU k-means falls back to XLA's ops, about 1.5x slower from 100 clusters on",
    KNN_ENV: "CPU nearest-neighbour search falls back to XLA's top-k and numpy's selection",
}
INSTALL_HINT = "install a C++ compiler and oneDNN (Debian: apt-get install g++ libdnnl-dev)"
# The config value that silences each switch's fallback warning.
SILENCE = {
    ENV: "backends.conv=xla",
    KMEANS_ENV: "backends.kmeans=xla",
    KNN_ENV: "backends.knn=host",
}


def conv_mode(env: str = ENV, environ: Mapping[str, str] | None = None) -> str:
    """``$JDML_CONV`` (or another switch, ``env``) in ``environ`` (default ``os.environ``),
    checked (see the module docstring)."""
    environ = os.environ if environ is None else environ
    mode = environ.get(env, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ConfigError(f"{env}={mode!r} is not one of {', '.join(MODES)}: set {env}=auto")
    return mode


@functools.cache
def _unavailable() -> str | None:
    """Why the library cannot be used (``None``: it can)."""
    try:
        build.library()
    except build.NativeBuildError as err:
        return str(err)
    return None


def onednn_enabled(
    env: str = ENV, environ: Mapping[str, str] | None = None, platform: str | None = None
) -> bool:
    """Whether the native kernels of switch ``env`` run: CPU convolutions (``$JDML_CONV``, the
    default), the k-means assignment (``$JDML_KMEANS``) or the kNN selection (``$JDML_KNN``);
    the switch's mode (in ``environ``, default ``os.environ``), the backend (``platform``,
    default :func:`jdml.platform.platform`) and whether the library builds decide. Only
    :func:`jdml.backends.resolve_backends` asks, once per run."""
    return mode_enabled(conv_mode(env, environ), env, platform)


def mode_enabled(
    mode: str, env: str = ENV, platform: str | None = None, setting: str | None = None
) -> bool:
    """Whether the native kernels of switch ``env`` run in ``mode`` (one of :data:`MODES`) on
    ``platform`` (default :func:`jdml.platform.platform`); ``setting``: what chose the mode,
    named in the error (default the variable ``env``).

    Raises:
      ConfigError: ``mode`` is onednn on the CPU backend and the library cannot be built.
    """
    if mode == "xla" or (platform or current_platform()) != "cpu":
        return False
    reason = _unavailable()
    if reason is None:
        return True
    if mode == "onednn":
        where = setting or env
        raise ConfigError(f"{where}=onednn but {reason}: {INSTALL_HINT}, or set {where}=auto")
    _warn_once(env, reason)
    return False


@functools.cache
def _warn_once(env: str, reason: str) -> None:
    """The fallback's warning of switch ``env``, once per process and reason."""
    warnings.warn(
        f"{FALLBACKS[env]} ({reason}); {INSTALL_HINT}, or set --config.{SILENCE[env]} (or "
        f"{env}=xla) to silence this",
        RuntimeWarning,
        stacklevel=3,
    )
