"""Keys a new run does not use: one rule for every key that only one part of jdml reads.

Some keys are read by one part of jdml only: a backbone's own ``model.*`` keys
(``model.vit.attention``: the ViTs'), a dataset loader's own ``data.*`` keys (``data.tfds_name``:
``data.name=tfds``'s), and an exchange's ``exchange.<name>.*`` keys (read by a cohort,
``cohort.size`` > 1, that exchanges with it: ``cohort.exchange``).

**The rule**: such a key holds its default unless the run uses its part. Set to another value
(on the command line or in a config file) for a new run that does not use it, the run is refused
before anything is read or written, with one line naming the key, the part that reads it, and the
fixes: set it back to its default, or use the part. ``optim.layer_decay`` below 1 on a backbone
without layers (:func:`jdml.models.embedding.backbone_layers`) and ``model.frozen_stages`` on one
without stages are refused the same way, and parameter names that match nothing by
``jdml.run.check_parameter_names``. A run that resumes is not checked: it goes on as it was
trained (its stored config is compared instead).

Not under the rule: the hyperparameters of the losses, miners and samplers that are not selected
(``loss.<name>.*``), which a config carries for when one is selected (a preset sets the
reference's options of a loss whatever the loss; validation checks their values, and resuming
ignores them), and the keys of sections that are switched off by a value of their own
(``decorrelation.*`` without ``pairs``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import ml_collections

from jdml.cohort.exchanges import EXCHANGES
from jdml.cohort.members import member_configs
from jdml.config.saved import flatten_config
from jdml.config.schema import base_config
from jdml.data.sources import DATASETS
from jdml.errors import ConfigError
from jdml.models import BACKBONES
from jdml.registry import Registry


@dataclasses.dataclass(frozen=True)
class Part:
    """A part of jdml that reads its own keys (dotted, under ``prefix``), and whether this run
    uses it (``why``: why not, and ``fix``: how to use it, for the message)."""

    prefix: str
    keys: tuple[str, ...]
    used: bool
    why: str = ""
    fix: str = ""


def _owners(registry: Registry, key: str) -> list[str]:
    """The components of ``registry`` that declare ``key`` with their registration."""
    return [n for n in registry.names() if key in registry.meta(n).get("keys", {})]


def _declared_parts(
    registry: Registry, section: str, selector: str, selected: set[str]
) -> Iterator[Part]:
    """One part per key that components of ``registry`` declare in ``section``: used when one
    of ``selected`` (the run's values of ``selector``) declares it."""
    keys = {k for n in registry.names() for k in registry.meta(n).get("keys", {})}
    for key in sorted(keys):
        owners = _owners(registry, key)
        chosen = " or ".join(repr(s) for s in sorted(selected))
        yield Part(
            f"{section}.",
            (key,),
            used=bool(selected & set(owners)),
            why=f"it is read only with {selector} in ({', '.join(owners)}), and this run's is "
            f"{chosen}",
            fix=f"--config.{selector}={owners[0]}",
        )


def _exchange_parts(c: ml_collections.ConfigDict) -> Iterator[Part]:
    """Each exchange's section: used by a cohort (``cohort.size`` > 1) exchanging with it."""
    cohort = c.cohort
    for name in EXCHANGES.names():
        if name not in c.exchange:
            continue
        single = int(cohort.size) == 1
        yield Part(
            f"exchange.{name}.",
            tuple(c.exchange[name].keys()),
            used=not single and cohort.exchange == name,
            why=(
                "a single model (cohort.size=1) exchanges nothing"
                if single
                else f"this cohort exchanges with cohort.exchange={cohort.exchange!r}"
            ),
            fix="--config.cohort.size=2 (or more)"
            if single
            else f"--config.cohort.exchange={name}",
        )


def parts(c: ml_collections.ConfigDict) -> Iterator[Part]:
    """Every part of jdml that reads its own keys, and whether the run of ``c`` uses it."""
    members = member_configs(c) if c.cohort.members else (c,)
    backbones = {str(m.model.backbone) for m in members}
    yield from _declared_parts(BACKBONES, "model", "model.backbone", backbones)
    yield from _declared_parts(DATASETS, "data", "data.name", {str(c.data.name)})
    yield from _exchange_parts(c)


def unused_keys(c: ml_collections.ConfigDict) -> Iterator[tuple[str, Any, Part]]:
    """``(dotted key, value, part)`` of each key the run of ``c`` does not use that is set to
    another value than its default (the base config's)."""
    defaults = flatten_config(base_config().to_dict())
    values = flatten_config(c.to_dict())
    for part in parts(c):
        if part.used:
            continue
        for key in part.keys:
            dotted = f"{part.prefix}{key}"
            value = values.get(dotted)
            if dotted in defaults and not _same(value, defaults[dotted]):
                yield dotted, value, part


def _same(value: Any, default: Any) -> bool:
    """Whether a config value equals its default (tuples and lists alike)."""
    norm = lambda v: tuple(v) if isinstance(v, list | tuple) else v  # noqa: E731
    return norm(value) == norm(default)


def check_unused_keys(c: ml_collections.ConfigDict) -> None:
    """Refuses a key set away from its default for a run that does not use it (the module's
    rule); raises ``ConfigError`` naming the key, why it is not used and the fixes."""
    defaults = flatten_config(base_config().to_dict())
    for key, value, part in unused_keys(c):
        raise ConfigError(
            f"{key}={value!r} is set, but this run does not use it: {part.why}. Set it back to "
            f"its default (--config.{key}={flag_value(defaults[key])}) or leave it out, or use "
            f"it: {part.fix}"
        )


def flag_value(value: Any) -> str:
    """A value as a ``--config.<key>=`` flag takes it: strings bare, tuples as ``(a,b)``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        inner = ",".join(flag_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)
