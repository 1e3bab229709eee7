"""Where a run's arrays live: one device, or a mesh whose ``data`` axis splits each batch.

A plain run is placed by :class:`Placement`: without ``parallel.data_devices`` on the default
device; with it on a ``(member, data)`` mesh of one member device (``jdml.mesh``), its state
replicated and its batches split over the data axis (the compiler partitions the step). A
cohort's layout (``jdml.cohort.layout``) extends it with the member axis.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.distributed import global_array, local_rows
from jdml.errors import ConfigError
from jdml.mesh import DATA, mesh_shape, run_mesh
from jdml.nn.batch_norm import BATCH_NORM_MODES
from jdml.state import TrainState


def batch_norm_groups(config: ml_collections.ConfigDict) -> int:
    """How many row blocks of a batch get their own BatchNorm statistics: the data axis's
    devices under ``parallel.batch_norm="per_device"`` with trained BatchNorm, else 1."""
    if config.model.frozen_bn:
        return 1
    devices = mesh_shape(config.cohort.size, config.cohort.devices, config.parallel.data_devices)
    return BATCH_NORM_MODES.get(config.parallel.batch_norm)(devices[1])


class Placement:
    """The devices of a run and the placement of its batches and state.

    Args:
      config: the full run config (``parallel`` and ``train.batch_size``; a cohort's also
        ``cohort``).
      data_devices: the devices of the mesh's data axis (``parallel.data_devices``; 1: no mesh).
    """

    def __init__(self, config: ml_collections.ConfigDict, data_devices: int) -> None:
        self.config = config
        self.data_devices = data_devices
        self.batch_size = int(config.train.batch_size)

    @property
    def on_mesh(self) -> bool:
        """Whether the run's arrays live on a mesh (else on one device)."""
        return self.data_devices != 1

    def _mesh(self) -> Mesh:
        """The mesh of a run on one device of the member axis."""
        return run_mesh(1, 1, self.data_devices)

    @functools.cached_property
    def mesh(self) -> Mesh | None:
        """The ``(member, data)`` mesh; None on one device (built when first needed: inference
        embeds without it).

        Raises:
          ConfigError: if the mesh does not fit the devices present, or its data axis does not
            divide the batch.
        """
        if not self.on_mesh:
            return None
        mesh = self._mesh()
        data = mesh.shape[DATA]
        if self.batch_size % data:
            raise ConfigError(
                f"the mesh's data axis has {data} devices (parallel.data_devices="
                f"{self.data_devices}), which do not divide train.batch_size={self.batch_size}; "
                "set parallel.data_devices to a divisor of the batch size"
            )
        return mesh

    @functools.cached_property
    def replicated(self) -> NamedSharding | None:
        return NamedSharding(self.mesh, P()) if self.on_mesh else None

    @functools.cached_property
    def rows(self) -> tuple[int, int] | None:
        """The rows of the global batch this process builds (multi-host input: those of its
        devices on the data axis); None when it builds all of them."""
        if not self.on_mesh or jax.process_count() == 1:
            return None
        start, stop = local_rows(NamedSharding(self.mesh, P(DATA)), self.batch_size)
        return None if (start, stop) == (0, self.batch_size) else (start, stop)

    def replicate(self, host: Any) -> Any:
        """A host array as the step takes it: replicated on the mesh (unchanged without one)."""
        if not self.on_mesh:
            return host
        host = np.asarray(host)
        return global_array(host, self.replicated, host.shape)

    def place_entry(self, key: str, value: np.ndarray) -> jax.Array:
        """One batch entry as a global array, its batch axis on the data axis."""
        spec, shape = P(DATA), (self.batch_size, *value.shape[1:])
        return global_array(value, NamedSharding(self.mesh, spec), shape)

    def place_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch as global arrays on the mesh (each process supplies its rows); unchanged
        without a mesh."""
        if not self.on_mesh:
            return batch
        return {key: self.place_entry(key, np.asarray(value)) for key, value in batch.items()}

    def state_shardings(self, state: TrainState) -> TrainState:
        """``NamedSharding``s placing the state on the mesh: replicated."""
        return jax.tree.map(lambda _: self.replicated, state)

    def place_state(self, state: TrainState) -> TrainState:
        """The state placed as the step takes it (unchanged without a mesh)."""
        return jax.device_put(state, self.state_shardings(state)) if self.on_mesh else state
