"""The layout of a run's members: which members there are, how their state is stored, and where
it lives (the device mesh, its ``member`` and ``data`` axes, the placement of batches and state,
the rows of the batch a process builds).

Every run trains ``L >= 1`` members in groups; the members of a group share one method and are
stacked on a leading member axis. Three storages of the state serve the three kinds of run:

* ``single``: one member, stored without a member axis (a plain run's checkpoint holds the
  method's own parameter tree); the step sees it as one group of one;
* ``stacked``: a DM2 cohort of identical members, each field stacked on a member axis (one group
  of L), placed on the mesh's ``member`` axis;
* ``listed``: a heterogeneous cohort (``cohort.members``), each field ``{member<l>: tree}`` (L
  groups of one), replicated over the devices of the data axis.

``split`` and ``join`` convert a field between its storage and the step's groups.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.distributed import global_array, local_rows
from jdml.errors import ConfigError
from jdml.methods.cohort import (
    AXIS,
    DATA,
    VIEWS,
    cohort_mesh,
    member_name,
    mesh_shape,
    stack_members,
)
from jdml.nn.batch_norm import BATCH_NORM_MODES
from jdml.state import TrainState

MEMBER_FIELDS = ("params", "batch_stats", "opt_state", "rng", "method_state")
Groups = tuple[Any, ...]  # one tree per group, each with a leading member axis


def batch_norm_groups(config: ml_collections.ConfigDict) -> int:
    """How many row blocks of a batch get their own BatchNorm statistics: the data axis's
    devices under ``parallel.batch_norm="per_device"`` with trained BatchNorm, else 1."""
    if config.model.frozen_bn:
        return 1
    devices = mesh_shape(config.cohort.size, config.cohort.devices, config.parallel.data_devices)
    return BATCH_NORM_MODES.get(config.parallel.batch_norm)(devices[1])


class Layout:
    """Which members a run trains, how their state is stored and where it is placed.

    Args:
      config: the full run config (``cohort``, ``parallel`` and ``train.batch_size``).
      size: the number of members (default ``cohort.size``); given, the layout is one member's
        alone on one device (e.g. one member's slice of a cohort).
      listed: whether each member has its own method (a heterogeneous cohort).
    """

    def __init__(
        self, config: ml_collections.ConfigDict, size: int | None = None, listed: bool = False
    ) -> None:
        self.config = config
        self.size = int(config.cohort.size if size is None else size)
        self.names = tuple(member_name(i) for i in range(self.size))
        self.kind = "listed" if listed else ("stacked" if self.size > 1 else "single")
        self.data_devices = int(config.parallel.data_devices) if size is None else 1
        self.on_mesh = self.kind == "stacked" or self.data_devices != 1
        # On a mesh the step runs under ``shard_map`` over the member axis (each device steps
        # its block of members), except for listed members, replicated over the data axis.
        self.sharded = self.kind != "listed" and self.on_mesh
        self.view_diversity = bool(config.cohort.view_diversity) and self.size > 1
        self.batch_size = int(config.train.batch_size)

    @property
    def group_sizes(self) -> tuple[int, ...]:
        """The number of members of each group, in member order."""
        return (1,) * self.size if self.kind == "listed" else (self.size,)

    # -- storage --------------------------------------------------------------------------------

    def split(self, field: Any) -> Groups:
        """A member field as the step's groups, each with a leading member axis."""
        if self.kind == "single":
            return (jax.tree.map(lambda x: x[None], field),)
        if self.kind == "stacked":
            return (field,)
        return tuple(jax.tree.map(lambda x: x[None], field[n]) for n in self.names)

    def join(self, groups: Groups) -> Any:
        """The inverse of ``split``."""
        if self.kind == "single":
            return jax.tree.map(lambda x: x[0], groups[0])
        if self.kind == "stacked":
            return groups[0]
        return {n: jax.tree.map(lambda x: x[0], g) for n, g in zip(self.names, groups, strict=True)}

    def store(self, members: list[Any]) -> Any:
        """One field of the state from each member's tree, in member order."""
        if self.kind == "single":
            return members[0]
        if self.kind == "stacked":
            return stack_members(members)
        return dict(zip(self.names, members, strict=True))

    def init_optimizer(self, tx: optax.GradientTransformation, params: list[Any]) -> Any:
        """The optimiser state of every member: per member for identical members (stored as
        the other fields), the cohort's ``{member<l>: state}`` for a listed one (its ``tx`` is
        ``jdml.optim.per_member``)."""
        if self.kind == "listed":
            return tx.init(self.store(params))
        return self.store([tx.init(p) for p in params])

    def update(
        self, tx: optax.GradientTransformation, grads: Groups, opt_state: Groups, params: Groups
    ) -> tuple[Groups, Groups]:
        """``(params, opt_state)`` after the optimiser update of every member."""
        if self.kind == "listed":  # tx is per member over {member<l>: tree}
            join = lambda groups: {  # noqa: E731
                n: jax.tree.map(lambda x: x[0], g) for n, g in zip(self.names, groups, strict=True)
            }
            updates, new_opt = tx.update(join(grads), join(opt_state), join(params))
            new_params = optax.apply_updates(join(params), updates)
            return self.split(new_params), self.split(new_opt)
        updates, new_opt = jax.vmap(tx.update)(grads[0], opt_state[0], params[0])
        return (jax.vmap(optax.apply_updates)(params[0], updates),), (new_opt,)

    def member_state(self, state: TrainState, index: int) -> TrainState:
        """Member ``index``'s slice of the state, as the state of a one-member program."""
        if self.kind == "single":
            return state
        if self.kind == "listed":
            name = self.names[index]
            return state.replace(**{f: getattr(state, f)[name] for f in MEMBER_FIELDS})
        take = lambda tree: jax.tree.map(lambda x: x[index], tree)  # noqa: E731
        return state.replace(**{f: take(getattr(state, f)) for f in MEMBER_FIELDS})

    # -- devices --------------------------------------------------------------------------------

    @functools.cached_property
    def mesh(self) -> Mesh | None:
        """The ``(member, data)`` mesh; None for one member on one device (built when first
        needed: inference embeds without it).

        Raises:
          ConfigError: if the mesh does not fit the devices present, or its data axis does not
            divide the batch.
        """
        if not self.on_mesh:
            return None
        if self.kind == "stacked":
            mesh = cohort_mesh(self.size, int(self.config.cohort.devices), self.data_devices)
        else:  # every member on every device of the data axis
            mesh = cohort_mesh(1, 1, self.data_devices)
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

    def members_drawn(self) -> tuple[int, ...]:
        """The members whose views this process draws: those on its devices under view
        diversity, else none (every member trains on the one batch)."""
        if not self.view_diversity:
            return ()
        if self.kind == "listed":  # every process holds every member
            return tuple(range(self.size))
        block = self.size // self.mesh.devices.shape[0]
        me = jax.process_index()
        return tuple(
            i
            for d, row in enumerate(self.mesh.devices)
            if any(device.process_index == me for device in row)
            for i in range(d * block, (d + 1) * block)
        )

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

    def place_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch as global arrays on the mesh: views on the member axis (each process
        supplies its own members' views) under view diversity, the batch axis on the data axis;
        unchanged without a mesh."""
        if not self.on_mesh:
            return batch
        out = {}
        for key, value in batch.items():
            value = np.asarray(value)
            if key.split(":")[0] in VIEWS and self.view_diversity:  # a view or its parameters
                member_axis = None if self.kind == "listed" else AXIS
                spec, shape = P(member_axis, DATA), (self.size, self.batch_size, *value.shape[2:])
            else:
                spec, shape = P(DATA), (self.batch_size, *value.shape[1:])
            out[key] = global_array(value, NamedSharding(self.mesh, spec), shape)
        return out

    def state_specs(self, state: TrainState) -> TrainState:
        """PartitionSpecs of a state in the step's ``shard_map``: the member fields on the
        ``member`` axis, the rest replicated."""
        shared = lambda tree: jax.tree.map(lambda _: P(), tree)  # noqa: E731
        member = lambda tree: jax.tree.map(lambda _: P(AXIS), tree)  # noqa: E731
        return TrainState(
            step=P(),
            params=member(state.params),
            batch_stats=member(state.batch_stats),
            opt_state=member(state.opt_state),
            rng=member(state.rng),
            nonfinite=P(),
            sampler_state=shared(state.sampler_state),
            method_state=member(state.method_state),
        )

    def state_shardings(self, state: TrainState) -> TrainState:
        """``NamedSharding``s placing each member's state on its device of the mesh (replicated
        over the data axis); single and listed members' states are replicated."""
        if self.kind != "stacked":
            return jax.tree.map(lambda _: self.replicated, state)
        return jax.tree.map(
            lambda spec: NamedSharding(self.mesh, spec),
            self.state_specs(state),
            is_leaf=lambda x: isinstance(x, P),
        )

    def place_state(self, state: TrainState) -> TrainState:
        """The state placed as the step takes it (unchanged without a mesh)."""
        return jax.device_put(state, self.state_shardings(state)) if self.on_mesh else state


def zeros_state(sampler_state: dict | None, **fields: Any) -> TrainState:
    """A state at step 0 with the members' ``fields``."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        nonfinite=jnp.zeros((), jnp.int32),
        sampler_state=sampler_state or {},
        **fields,
    )
