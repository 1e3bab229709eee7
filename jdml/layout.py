"""The layout of a run's members: which members there are, how their state is stored, and where
it lives (the device mesh, its ``member`` and ``data`` axes, the placement of batches and state,
the rows of the batch a process builds).

Every run trains ``L >= 1`` members in groups; the members of a group share one method and are
stacked on a leading member axis. One class per storage of the state, each a :class:`Layout`:

* :class:`OneMember`: one member, stored without a member axis (a plain run's checkpoint holds
  the method's own parameter tree); the step sees it as one group of one;
* :class:`Stacked`: a cohort of identical members, each field stacked on a member axis (one group
  of L), placed on the mesh's ``member`` axis;
* :class:`Listed`: a heterogeneous cohort (``cohort.members``), each field ``{member<l>: tree}``
  (L groups of one), replicated over the devices of the data axis.

``split`` and ``join`` convert a field between its storage and the step's groups.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.distributed import global_array, local_rows
from jdml.errors import ConfigError
from jdml.members import VIEWS, member_name, stack_members
from jdml.mesh import AXIS, DATA, mesh_shape, run_mesh
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


def _add_axis(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[None], tree)


def _drop_axis(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[0], tree)


class Layout:
    """Which members a run trains, how their state is stored and where it is placed (the
    storage is the subclass's; :func:`make_layout` picks it).

    Args:
      config: the full run config (``cohort``, ``parallel`` and ``train.batch_size``).
      size: the number of members.
      data_devices: the devices of the mesh's data axis (``parallel.data_devices``).
      view_diversity: whether each member views the batch through its own augmentation (the
        exchange's declaration, ``jdml.exchanges.Exchange.view_diversity``).
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        size: int,
        data_devices: int,
        view_diversity: bool = False,
    ) -> None:
        self.config = config
        self.size = size
        self.names = tuple(member_name(i) for i in range(size))
        self.data_devices = data_devices
        self.view_diversity = view_diversity and size > 1
        self.batch_size = int(config.train.batch_size)

    #: Whether the step runs under ``shard_map`` over the member axis on a mesh (each device
    #: steps its block of members).
    shards_members = True
    #: The mesh axis of a view's member axis under view diversity (None: replicated).
    view_axis: str | None = AXIS

    @property
    def on_mesh(self) -> bool:
        """Whether the run's arrays live on a mesh (else on one device)."""
        return self.data_devices != 1

    @property
    def sharded(self) -> bool:
        """Whether the step runs under ``shard_map`` over the member axis."""
        return self.shards_members and self.on_mesh

    @property
    def group_sizes(self) -> tuple[int, ...]:
        """The number of members of each group, in member order."""
        return (self.size,)

    # -- storage (the subclass's) ---------------------------------------------------------------

    def split(self, field: Any) -> Groups:
        """A member field as the step's groups, each with a leading member axis."""
        raise NotImplementedError

    def join(self, groups: Groups) -> Any:
        """The inverse of ``split``."""
        raise NotImplementedError

    def store(self, members: list[Any]) -> Any:
        """One field of the state from each member's tree, in member order."""
        raise NotImplementedError

    def member_state(self, state: TrainState, index: int) -> TrainState:
        """Member ``index``'s slice of the state, as the state of a one-member program."""
        raise NotImplementedError

    def init_optimizer(self, tx: optax.GradientTransformation, params: list[Any]) -> Any:
        """The optimiser state of every member, stored as the other fields."""
        return self.store([tx.init(p) for p in params])

    def update(
        self, tx: optax.GradientTransformation, grads: Groups, opt_state: Groups, params: Groups
    ) -> tuple[Groups, Groups]:
        """``(params, opt_state)`` after the optimiser update of every member."""
        updates, new_opt = jax.vmap(tx.update)(grads[0], opt_state[0], params[0])
        return (jax.vmap(optax.apply_updates)(params[0], updates),), (new_opt,)

    # -- devices --------------------------------------------------------------------------------

    def _mesh(self) -> Mesh:
        """The mesh of a run on one (member) device of the member axis."""
        return run_mesh(1, 1, self.data_devices)

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

    def members_drawn(self) -> tuple[int, ...]:
        """The members whose views this process draws: those on its devices under view
        diversity, else none (every member trains on the one batch)."""
        if not self.view_diversity:
            return ()
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
                spec = P(self.view_axis, DATA)
                shape = (self.size, self.batch_size, *value.shape[2:])
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
        """``NamedSharding``s placing the state on the mesh: replicated (a stacked cohort's
        member fields on its devices of the member axis)."""
        return jax.tree.map(lambda _: self.replicated, state)

    def place_state(self, state: TrainState) -> TrainState:
        """The state placed as the step takes it (unchanged without a mesh)."""
        return jax.device_put(state, self.state_shardings(state)) if self.on_mesh else state


class OneMember(Layout):
    """One member, its fields stored as the method's own trees (no member axis)."""

    def split(self, field: Any) -> Groups:
        return (_add_axis(field),)

    def join(self, groups: Groups) -> Any:
        return _drop_axis(groups[0])

    def store(self, members: list[Any]) -> Any:
        return members[0]

    def member_state(self, state: TrainState, index: int) -> TrainState:
        return state


class Stacked(Layout):
    """Identical members, each field stacked on a leading member axis, spread over the devices
    of the mesh's member axis (``cohort.devices``)."""

    @property
    def on_mesh(self) -> bool:
        return True

    def split(self, field: Any) -> Groups:
        return (field,)

    def join(self, groups: Groups) -> Any:
        return groups[0]

    def store(self, members: list[Any]) -> Any:
        return stack_members(members)

    def member_state(self, state: TrainState, index: int) -> TrainState:
        take = lambda tree: jax.tree.map(lambda x: x[index], tree)  # noqa: E731
        return state.replace(**{f: take(getattr(state, f)) for f in MEMBER_FIELDS})

    def _mesh(self) -> Mesh:
        return run_mesh(self.size, int(self.config.cohort.devices), self.data_devices)

    def state_shardings(self, state: TrainState) -> TrainState:
        return jax.tree.map(
            lambda spec: NamedSharding(self.mesh, spec),
            self.state_specs(state),
            is_leaf=lambda x: isinstance(x, P),
        )


class Listed(Layout):
    """Members of their own methods (a heterogeneous cohort), each field ``{member<l>: tree}``;
    every member on every device of the data axis, its optimiser its own
    (``jdml.optim.per_member``)."""

    shards_members = False
    view_axis = None

    @property
    def group_sizes(self) -> tuple[int, ...]:
        return (1,) * self.size

    def split(self, field: Any) -> Groups:
        return tuple(_add_axis(field[n]) for n in self.names)

    def join(self, groups: Groups) -> Any:
        return {n: _drop_axis(g) for n, g in zip(self.names, groups, strict=True)}

    def store(self, members: list[Any]) -> Any:
        return dict(zip(self.names, members, strict=True))

    def member_state(self, state: TrainState, index: int) -> TrainState:
        name = self.names[index]
        return state.replace(**{f: getattr(state, f)[name] for f in MEMBER_FIELDS})

    def init_optimizer(self, tx: optax.GradientTransformation, params: list[Any]) -> Any:
        return tx.init(self.store(params))  # tx is per member over {member<l>: tree}

    def update(
        self, tx: optax.GradientTransformation, grads: Groups, opt_state: Groups, params: Groups
    ) -> tuple[Groups, Groups]:
        updates, new_opt = tx.update(self.join(grads), self.join(opt_state), self.join(params))
        new_params = optax.apply_updates(self.join(params), updates)
        return self.split(new_params), self.split(new_opt)

    def members_drawn(self) -> tuple[int, ...]:
        # every process holds every member
        return tuple(range(self.size)) if self.view_diversity else ()


def make_layout(
    config: ml_collections.ConfigDict,
    size: int | None = None,
    listed: bool = False,
    view_diversity: bool = False,
) -> Layout:
    """The layout of a run's members.

    Args:
      config: the full run config.
      size: the number of members (default ``cohort.size``); given, the layout is one member's
        alone on one device (e.g. one member's slice of a cohort).
      listed: whether each member has its own method (a heterogeneous cohort).
      view_diversity: whether each member views the batch through its own augmentation.
    """
    count = int(config.cohort.size if size is None else size)
    data_devices = int(config.parallel.data_devices) if size is None else 1
    kind = Listed if listed else (Stacked if count > 1 else OneMember)
    return kind(config, count, data_devices, view_diversity)
