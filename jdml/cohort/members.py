"""The members of a run: their names, their configs in a heterogeneous cohort, and the ways a
function runs over the members stacked on a leading member axis.

Every run trains ``L >= 1`` members (a plain run one, a cohort ``cohort.size``); a cohort's
members exchange what ``cohort.exchange`` names (``jdml.cohort.exchanges``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from jdml.errors import ConfigError
from jdml.keys import parse_assignments, set_keys
from jdml.registry import Registry

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
