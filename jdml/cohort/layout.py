"""The layout of a cohort's members: which members there are, how their state is stored, and
where it lives (the mesh's ``member`` axis, the placement of their views and state).

The members are trained in groups; the members of a group share one method and are stacked on a
leading member axis. One class per storage of the state, each a :class:`Layout` (a
:class:`jdml.placement.Placement` with a member axis):

* :class:`Stacked`: identical members, each field stacked on a member axis (one group of L),
  placed on the mesh's ``member`` axis;
* :class:`Listed`: a heterogeneous cohort (``cohort.members``), each field ``{member<l>: tree}``
  (L groups of one), replicated over the devices of the data axis.

``split`` and ``join`` convert a field between its storage and the step's groups.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.cohort.members import VIEWS, member_name, stack_members
from jdml.distributed import global_array
from jdml.mesh import AXIS, DATA, run_mesh
from jdml.placement import Placement
from jdml.state import TrainState

MEMBER_FIELDS = ("params", "batch_stats", "opt_state", "rng", "method_state")
Groups = tuple[Any, ...]  # one tree per group, each with a leading member axis


def _add_axis(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[None], tree)


def _drop_axis(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[0], tree)


class Layout(Placement):
    """Which members a cohort trains, how their state is stored and where it is placed (the
    storage is the subclass's; :func:`make_layout` picks it).

    Args:
      config: the full run config (``cohort``, ``parallel`` and ``train.batch_size``).
      size: the number of members.
      data_devices: the devices of the mesh's data axis (``parallel.data_devices``).
      view_diversity: whether each member views the batch through its own augmentation (the
        exchange's declaration, ``jdml.cohort.exchanges.Exchange.view_diversity``).
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        size: int,
        data_devices: int,
        view_diversity: bool = False,
    ) -> None:
        super().__init__(config, data_devices)
        self.size = size
        self.names = tuple(member_name(i) for i in range(size))
        self.view_diversity = view_diversity

    #: Whether the step runs under ``shard_map`` over the member axis on a mesh (each device
    #: steps its block of members).
    shards_members = True
    #: The mesh axis of a view's member axis under view diversity (None: replicated).
    view_axis: str | None = AXIS

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
        """Member ``index``'s slice of the state, as the state of a plain run."""
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

    def place_entry(self, key: str, value: np.ndarray) -> jax.Array:
        """One batch entry as a global array: a view (or its parameters) on the member axis
        under view diversity (each process supplies its own members' views), the batch axis on
        the data axis."""
        if key.split(":")[0] in VIEWS and self.view_diversity:
            spec = P(self.view_axis, DATA)
            shape = (self.size, self.batch_size, *value.shape[2:])
            return global_array(value, NamedSharding(self.mesh, spec), shape)
        return super().place_entry(key, value)

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
    every member on every device of the data axis (on one device without a mesh), its
    optimiser its own (``jdml.optim.per_member``)."""

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
    config: ml_collections.ConfigDict, listed: bool = False, view_diversity: bool = False
) -> Layout:
    """The layout of a cohort's members.

    Args:
      config: the full run config (``cohort.size`` members).
      listed: whether each member has its own method (a heterogeneous cohort).
      view_diversity: whether each member views the batch through its own augmentation.
    """
    kind = Listed if listed else Stacked
    return kind(config, int(config.cohort.size), int(config.parallel.data_devices), view_diversity)
