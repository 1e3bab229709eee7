"""The device mesh of every run: a ``member`` axis over which a cohort's members are spread and a
``data`` axis over which each member's batch is split (data parallelism).

A plain run on one device has no mesh; one with ``parallel.data_devices > 1`` a mesh of one
member device; a stacked cohort ``cohort.devices`` member devices (each steps its block of
members under ``jax.shard_map``); the data axis is left to the compiler's automatic
partitioning, which splits the batch and gathers what the losses need.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from jdml.errors import ConfigError

AXIS = "member"
DATA = "data"  # splits each member's batch (automatic partitioning)


def mesh_shape(size: int, devices: int, data_devices: int = 1) -> tuple[int, int]:
    """``(member devices, data devices)`` of a run's mesh: ``devices`` devices on the member
    axis (0: as many as divide ``size`` and fit), each member's batch split over
    ``data_devices`` devices (0: every device the member axis leaves).

    Raises:
      ConfigError: if ``devices`` does not divide the cohort size, or the mesh needs more devices
        than there are.
    """
    available = len(jax.devices())
    if devices <= 0:
        fits = available // max(1, data_devices)
        devices = max(d for d in range(1, max(1, min(size, fits)) + 1) if size % d == 0)
    if data_devices <= 0:
        data_devices = max(1, available // devices)
    if devices * data_devices > available or size % devices:
        raise ConfigError(
            f"cohort.devices={devices} must divide cohort.size={size}, and cohort.devices x "
            f"parallel.data_devices={data_devices} be at most the {available} device(s) "
            "present; use 0 for either to choose automatically"
        )
    return devices, data_devices


def run_mesh(size: int, devices: int, data_devices: int = 1) -> Mesh:
    """The ``(member, data)`` mesh of a run of ``size`` members, of
    ``mesh_shape(size, devices, data_devices)``."""
    shape = mesh_shape(size, devices, data_devices)
    grid = np.asarray(jax.devices()[: shape[0] * shape[1]]).reshape(shape)
    return Mesh(grid, (AXIS, DATA))
