"""Config keys on the ground floor: a component's keys and defaults, and setting dotted keys.

Components (loss terms, cohorts, backbones) build and read their config sections with these
helpers; ``jdml.config`` assembles the whole schema from the components on top of them. This
module imports nothing from jdml but ``errors``, so any module may use it without a cycle.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import ml_collections

from jdml.errors import ConfigError

# Keys of a component's signature that the library fills in itself.
_RUNTIME_ARGS = frozenset(
    {
        "parent",
        "name",
        "num_classes",
        "miner_name",
        "key",
        "embeddings",
        "labels",
        "batch_size",
        "samples_per_class",
        "seed",
    }
)


class NamedComponents(Protocol):
    """What this module reads of a registry (``jdml.registry.Registry``): its names, their
    objects and the facts they were registered with."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> Any: ...

    def meta(self, name: str) -> Mapping[str, Any]: ...


def component_defaults(obj: Any) -> dict[str, Any]:
    """Returns the overridable hyperparameters of a registered component with their defaults.

    Args:
      obj: a Flax module class (dataclass fields) or a function / class (keyword arguments).

    Returns:
      hyperparameter name -> default, without the arguments the library fills in itself.
    """
    out: dict[str, Any] = {}
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.name in _RUNTIME_ARGS or not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    target = obj.__init__ if inspect.isclass(obj) else obj
    for p in inspect.signature(target).parameters.values():
        if p.name in _RUNTIME_ARGS or p.name == "self" or p.default is inspect.Parameter.empty:
            continue
        out[p.name] = p.default
    return out


def to_config_value(value: Any) -> Any:
    """``value`` as a config holds it: lists become tuples (ml_collections can override tuples
    from the command line, not lists)."""
    return tuple(value) if isinstance(value, list) else value


def optional_names(obj: Any) -> set[str]:
    """Hyperparameters of ``obj`` annotated as accepting None (e.g. ``upper_cutoff: float |
    None``)."""
    if dataclasses.is_dataclass(obj):
        annotations = {f.name: f.type for f in dataclasses.fields(obj)}
    else:
        target = obj.__init__ if inspect.isclass(obj) else obj
        annotations = {p.name: p.annotation for p in inspect.signature(target).parameters.values()}
    return {k for k, a in annotations.items() if "None" in str(a)}


def config_entry(value: Any, optional: bool = False) -> Any:
    """A config value, or for an ``optional`` key a reference that also accepts None from the
    command line (``--config.x=None``)."""
    value = to_config_value(value)
    return ml_collections.FieldReference(value, field_type=object) if optional else value


def component_section(registry: NamedComponents) -> ml_collections.ConfigDict:
    """One sub-section per registered component with its hyperparameters and their defaults
    (``loss.margin.beta``, ...); the caller adds the section's ``name``."""
    section = ml_collections.ConfigDict()
    for name in registry.names():
        obj = registry.get(name)
        optional = optional_names(obj)
        section[name] = ml_collections.ConfigDict(
            {k: config_entry(v, k in optional) for k, v in component_defaults(obj).items()}
        )
    return section


#: The backbones' own keys, once flat in ``model`` (``model.vit_pooling``), now in a section
#: per backbone family (``model.vit.pooling``) as every other component's are.
_VIT_KEYS = ("pooling", "attention", "patch", "dim", "depth", "heads", "layer_scale", "registers")
_SMALL_RESNET_KEYS = ("stem_features", "stem_strides", "stage_features", "stage_blocks",
                      "stage_strides")  # fmt: skip
_BACKBONE_SECTIONS = {
    **{f"model.vit_{key}": f"model.vit.{key}" for key in _VIT_KEYS},
    **{f"model.{key}": f"model.small_resnet.{key}" for key in _SMALL_RESNET_KEYS},
}

#: Keys an earlier version had under another name: old dotted key -> new dotted key (saved
#: configs are read with the new names; a command line or script that sets an old one is told).
RENAMED_KEYS = {
    "cohort.data_devices": "parallel.data_devices",
    # DM2's settings moved from the cohort section into its exchange's own.
    **{
        f"cohort.{key}": f"exchange.dm2.{key}"
        for key in (
            "mutual_weight",
            "warmup_epochs",
            "relation",
            "model_diversity",
            "temporal_diversity",
            "temporal_rate",
            "view_diversity",
        )
    },
    **_BACKBONE_SECTIONS,
}

#: Renames made after studies began keeping config digests (``jdml.study.runner.
#: config_digest``): new dotted key -> the name the digests hash it under, so that a study's
#: records stay its own across the rename.
DIGEST_NAMES = {new: old for old, new in _BACKBONE_SECTIONS.items()}


def renamed(key: str) -> str:
    """A sentence for an error about ``key`` when it is an old name of ``RENAMED_KEYS`` (its
    new name), else ""."""
    new = RENAMED_KEYS.get(key)
    return f" ({key} is now {new}; set that instead)" if new else ""


def set_keys(c: ml_collections.ConfigDict, values: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """Sets every dotted key of ``values`` (``{"data.name": "sop"}``) on ``c``.

    Only keys the config has can be set (the config is the schema); the config's own type checks
    apply to the values.

    Args:
      c: the config, changed in place.
      values: dotted key -> value.

    Returns:
      ``c``.

    Raises:
      ConfigError: naming the key, for an unknown key or a value of the wrong type.
    """
    for dotted, value in values.items():
        *path, name = dotted.split(".")
        section = c
        try:
            for part in path:
                section = section[part]
            if not isinstance(section, ml_collections.ConfigDict) or name not in section:
                raise KeyError(dotted)
            section[name] = value
        except (KeyError, TypeError, AttributeError) as e:
            raise ConfigError(
                f"cannot set {dotted}={value!r} ({type(e).__name__}: {e}){renamed(dotted)}: use a "
                "key of the config (see the config file's keys) with a value of its type"
            ) from None
    return c


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """``"section.key=value"`` strings (scripts' ``--set``) as dotted key -> value.

    A value is read as a Python literal where it is one (numbers, tuples, booleans), else kept
    as a string.

    Raises:
      ConfigError: for an item without ``=``.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"cannot set {item!r}: expected section.key=value")
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def declared_keys(registry: NamedComponents, section: str) -> dict[str, Any]:
    """The keys of ``section`` that the components of ``registry`` declare with their
    registration (their ``keys`` fact: key -> default), e.g. a backbone's own ``model.*`` keys.
    A dotted key (``vit.pooling``) is a key of a sub-section (``model.vit``) that the components
    of one family share.

    Args:
      registry: the components.
      section: the config section the keys belong to (for the message).

    Returns:
      key -> default (a sub-section: a nested dict), in the order of the components' names.

    Raises:
      ValueError: if two components declare one key with different defaults.
    """
    out: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for name in registry.names():
        for key, default in registry.meta(name).get("keys", {}).items():
            *path, leaf = key.split(".")
            target = out
            for part in path:
                target = target.setdefault(part, {})
            if key in owner and target[leaf] != to_config_value(default):
                raise ValueError(
                    f"{owner[key]!r} and {name!r} declare {section}.{key} with different "
                    f"defaults ({target[leaf]!r} and {default!r}); give them one default"
                )
            target.setdefault(leaf, to_config_value(default))
            owner.setdefault(key, name)
    return out


def get_dotted(c: Mapping[str, Any], dotted: str) -> Any:
    """The value of the dotted key ``dotted`` (``vit.pooling``) of ``c``."""
    for part in dotted.split("."):
        c = c[part]
    return c
