"""DM2 cohorts: L members of any method trained together, exchanging relation matrices.

Park, Kim, You, Cho, "Diversified Mutual Learning for Deep Metric Learning" (DM2):

* every member is a full model of the base method (the Revisiting baseline, DiVA, ...); their
  params, optimiser states, batch statistics and method states (EMA keys, queues) are stacked on a
  leading member axis and trained by one jitted step (the members of a device traced one after
  the other into it, ``cohort.member_loop="unroll"``, or vectorised, ``"vmap"``);
* member ``l`` minimises its own loss plus ``lambda * L^l_DM2`` (``jdml.losses.mutual``), with the
  peers' relation matrices as constants, so the gradient of the summed cohort loss with respect
  to member ``l``'s params is exactly the gradient of its own objective (Algorithm 1);
* model diversity: each member's embedding layers get their own random initialisation (the
  backbone starts from the same weights, as a pretrained one would);
* temporal diversity: member ``l`` (1-based) applies its update with probability ``2^-(l-1)``
  (``cohort.temporal_rate^(l-1)``, 0.5 by default); a
  skipped member keeps params, optimiser state, batch statistics and method state unchanged;
* view diversity: each member sees its own augmentation of the same images.

The state and the step of every run, one member or a cohort, are ``jdml.step``'s, their
storage and placement ``jdml.layout``'s, and the relation terms DM2's entry of
``jdml.exchanges`` (``cohort.exchange="dm2"``); this module holds what is particular to cohorts.
The member axis is the ``member`` axis of a device mesh: ``jax.shard_map`` gives each device its
block of members; the relation matrices (B x B per member) are all-gathered. On one device the
same code runs with the whole cohort in one block. A second mesh axis ``data`` (left to the
compiler's automatic partitioning) splits each member's batch over ``parallel.data_devices``
devices: data parallelism within a member, with the same results as on one device.

Member 1 starts as the plain run of the same config and seed (same init, same batches and
augmentations, same randomness); with lambda = 0 and no temporal diversity every member equals
an independent run from its own initialisation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from jdml.errors import ConfigError
from jdml.keys import parse_assignments, set_keys
from jdml.registry import Registry

AXIS = "member"
DATA = "data"  # splits each member's batch (automatic partitioning)
VIEWS = ("images", "images_b")  # batch entries with a member axis under view diversity


def member_name(index: int) -> str:
    """The evaluation name of member ``index`` (0-based) : ``member1``, ``member2``, ..."""
    return f"member{index + 1}"


def member_overrides(spec: str) -> dict[str, Any]:
    """One entry of ``cohort.members``: ``";"``-separated ``model.key=value`` overrides (values
    read as Python literals where they are one, else as strings) as dotted key -> value.

    Raises:
      ConfigError: for an item without ``=`` or a key outside the ``model`` section.
    """
    items = [item.strip() for item in spec.split(";") if item.strip()]
    values = parse_assignments(items)
    outside = [k for k in values if not k.startswith("model.")]
    if outside:
        raise ConfigError(
            f"cohort.members entry {spec!r} sets {', '.join(outside)}: a member may only change "
            "its network (model.* keys); the data, losses and optimiser are the cohort's"
        )
    return values


def member_configs(config: ml_collections.ConfigDict) -> tuple[ml_collections.ConfigDict, ...]:
    """The config of each member of a heterogeneous cohort (``cohort.members``): the run's
    config with that member's ``model.*`` overrides; () for a cohort of identical members.

    Raises:
      ConfigError: if ``cohort.members`` does not have one entry per member, or an entry sets an
        unknown key or a value of the wrong type.
    """
    specs = tuple(config.cohort.members)
    if not specs:
        return ()
    if len(specs) != int(config.cohort.size) or len(specs) < 2:
        raise ConfigError(
            f"cohort.members has {len(specs)} entries for cohort.size={config.cohort.size}: "
            'give one entry per member ("" keeps the run\'s model), and at least two'
        )
    out = []
    for spec in specs:
        member = ml_collections.ConfigDict(config.to_dict())
        member.cohort.members = ()
        out.append(set_keys(member, member_overrides(spec)))
    return tuple(out)


def update_probabilities(size: int, temporal: bool, rate: float = 0.5) -> np.ndarray:
    """Per-member update probability: ``rate^(l-1)`` for l = 1..L with temporal diversity (the
    paper's ``2^-(l-1)`` at the default rate 0.5), else 1."""
    if not temporal:
        return np.ones(size, np.float32)
    return np.power(float(rate), np.arange(size)).astype(np.float32)


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


def cohort_mesh(size: int, devices: int, data_devices: int = 1) -> Mesh:
    """The ``(member, data)`` mesh of a run, of ``mesh_shape(size, devices, data_devices)``."""
    shape = mesh_shape(size, devices, data_devices)
    grid = np.asarray(jax.devices()[: shape[0] * shape[1]]).reshape(shape)
    return Mesh(grid, (AXIS, DATA))


def stack_members(trees: list[Any]) -> Any:
    """Trees of equal structure stacked leaf by leaf on a new leading member axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


#: Ways to run ``fn`` over the members of a device, by ``cohort.member_loop`` name.
MEMBER_LOOPS: Registry[Callable[..., Any]] = Registry("member loop")


@MEMBER_LOOPS.register("unroll")
def unrolled(fn: Callable[..., Any], *args: Any) -> Any:
    """The members traced one after the other into the step (compile time grows with their
    number; each runs ordinary convolutions)."""
    count = jax.tree.leaves(args)[0].shape[0]
    return stack_members([fn(*jax.tree.map(lambda x, i=i: x[i], args)) for i in range(count)])


@MEMBER_LOOPS.register("vmap")
def vectorised(fn: Callable[..., Any], *args: Any) -> Any:
    """The members vectorised, which turns convolutions into grouped ones: worth trying on
    accelerators, but on XLA's CPU backend measured 2.6x slower than two separate networks
    already for two members (and a ``lax.map`` loop is worse still: convolution gradients inside
    a loop body ran 27x slower)."""
    return jax.vmap(fn)(*args)


def over_members(fn: Callable[..., Any], loop: str, *args: Any) -> Any:
    """Applies ``fn`` to each member's slice of ``args`` (leading member axis), stacking outputs,
    the ``MEMBER_LOOPS`` way named ``loop`` (``"unroll"`` or ``"vmap"``)."""
    return MEMBER_LOOPS.get(loop)(fn, *args)
