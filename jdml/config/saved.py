"""A run's stored config (``config.json``): writing and reading it, and which keys may change
when the run resumes. Reading never executes anything from the file."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import ml_collections

from jdml.config.schema import base_config, schema_leaves
from jdml.keys import RENAMED_KEYS


def to_json(c: ml_collections.ConfigDict) -> str:
    return json.dumps(c.to_dict(), indent=2, sort_keys=True)


def _tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def from_json(text: str) -> ml_collections.ConfigDict:
    """Rebuilds a config written by ``to_json`` (JSON lists become tuples again)."""
    return ml_collections.ConfigDict(_tuples(json.loads(text)))


def _under(defaults: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with the keys it lacks taken from ``defaults``, section by section."""
    out = dict(saved)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _under(value, out[key])
    return out


def upgrade(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config (nested dicts) with the keys of ``RENAMED_KEYS`` under their new names."""
    out = copy.deepcopy(saved)
    for old, new in RENAMED_KEYS.items():
        *old_path, old_key = old.split(".")
        section = out
        for part in old_path:
            section = section.get(part) if isinstance(section, dict) else None
        if not isinstance(section, dict) or old_key not in section:
            continue
        value = section.pop(old_key)
        *new_path, new_key = new.split(".")
        target = out
        for part in new_path:
            target = target.setdefault(part, {})
        target.setdefault(new_key, value)
    cohort = out.get("cohort")
    if isinstance(cohort, dict) and isinstance(cohort.get("members"), list):
        cohort["members"] = [_renamed_member(m) if isinstance(m, str) else m
                             for m in cohort["members"]]  # fmt: skip
    return out


def _renamed_member(spec: str) -> str:
    """A ``cohort.members`` entry (``"model.key=value;..."``) with its renamed keys' new names."""
    items = []
    for item in spec.split(";"):
        key, sep, value = item.strip().partition("=")
        items.append(f"{RENAMED_KEYS.get(key, key)}{sep}{value}" if sep else item.strip())
    return ";".join(i for i in items if i)


def saved_config(text: str, *, keep_unknown: bool = False) -> ml_collections.ConfigDict:
    """A run's ``config.json``: keys added to jdml after the run was trained get their defaults,
    which keep the behaviour the run was trained with, and renamed keys their new names.

    Keys this version does not read (a run written by another version) are dropped for
    evaluation and inference; ``keep_unknown`` keeps them, so that training from a JSON config
    refuses them as a Python config's are (``jdml.config.validation.check_schema``).
    """
    saved = upgrade(json.loads(text))
    if not isinstance(saved, dict):
        raise ValueError(f"the file holds a JSON {type(saved).__name__}, not an object")
    merged = _under(base_config().to_dict(), saved)
    if not keep_unknown:
        merged = _known_only(merged, schema_leaves(merged))
    return ml_collections.ConfigDict(_tuples(merged))


def unread_keys(saved: dict[str, Any]) -> list[str]:
    """The dotted keys of a stored config (nested dicts, as ``config.json`` holds it) that this
    version does not read (a run written by another version; renamed keys are read under their
    new names): those :func:`saved_config` drops, and training from the file refuses."""
    upgraded = upgrade(saved)
    merged = _under(base_config().to_dict(), upgraded)
    known = flatten_config(_known_only(merged, schema_leaves(merged)))
    return sorted(k for k in flatten_config(upgraded) if k not in known)


def resume_command(path: str, workdir: str, saved: dict[str, Any]) -> str:
    """How to resume the run of ``workdir`` with its stored config ``path`` (holding
    ``saved``): the command, after removing the keys this version does not read, if any (the
    command refuses them, as any config file's)."""
    command = f"python train.py --config {path} --workdir {workdir}"
    stale = unread_keys(saved)
    if not stale:
        return command
    return (
        f"remove {', '.join(stale)} from {path} (written by another jdml version, which this one "
        f"does not read), then: {command}"
    )


def _known_only(d: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``d`` without the keys that are not in ``schema`` (dotted keys) nor above one."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if name in schema:
            out[key] = value
        elif isinstance(value, dict) and any(k.startswith(f"{name}.") for k in schema):
            out[key] = _known_only(value, schema, f"{name}.")
    return out


# Keys that may change between runs in the same workdir (they do not change the trained model).
RESUMABLE_CHANGES = (
    "train.epochs",
    "train.log_every_steps",
    "train.checkpoint_every_steps",
    "train.progress_bar",
    "train.tensorboard",
    "profile_steps",
    "data.num_threads",
    "data.prefetch",
    "data.num_workers",
    "data.cache_dir",
    # Where views are made: both paths make the same pixels from the same draws, so a run
    # trained with device views on a GPU resumes with Pillow's on a CPU, and back.
    "data.views",
    "data.device_photos_gib",
    "eval.",
    # Where the arrays live: a checkpoint restores onto another device layout (with
    # parallel.batch_norm="per_device" the statistics then come from the new device count), and
    # evaluation (parallel.eval_devices) runs where it is told with the same results.
    "parallel.data_devices",
    "parallel.eval_devices",
    "cohort.devices",
    # Which implementation computes (jdml.backends): every one gives the same numbers up to
    # float32 rounding, so a run resumes on another; being listed here also keeps them out of
    # jdml.study.runner.config_digest, which existing study records were written without.
    "backends.conv",
    "backends.knn",
    "backends.kmeans",
)


def flatten_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def selected_only(flat: dict[str, Any]) -> dict[str, Any]:
    """Drops the hyperparameters of components that are not selected (loss, miner, sampler).

    Their presence depends on which components the installed version registers, and their
    values do not affect the run. Component sections may be nested (``aux.<term>.loss``).
    """
    out = {}
    for key, value in flat.items():
        parts = key.split(".")
        unselected = False
        for i, part in enumerate(parts[:-2]):
            if part in _COMPONENT_SECTIONS:
                prefix = ".".join(parts[: i + 1])
                unselected = flat.get(f"{prefix}.name") != parts[i + 1]
                break
        if not unselected:
            out[key] = value
    return out


_COMPONENT_SECTIONS = ("loss", "miner", "sampler")


def incompatible_keys(
    old: dict[str, Any],
    new: dict[str, Any],
    allowed: Iterable[str] = RESUMABLE_CHANGES,
    defaults: dict[str, Any] | None = None,
) -> list[str]:
    """Returns the keys whose values differ between two configs and forbid resuming.

    Keys of loss/miner/sampler components that are not selected are ignored, and so are keys
    the old config lacks (written by an earlier version) whose new value is their default in
    ``defaults`` (a flattened config); keys the old config wrote under an earlier name
    (``RENAMED_KEYS``) are compared under their new one.
    """
    fo = selected_only(flatten_config(upgrade(old)))
    fn = selected_only(flatten_config(new))
    allowed = tuple(allowed)
    defaults = defaults or {}
    diffs = []
    for k in sorted(set(fo) | set(fn)):
        if k not in fo and k in defaults and fn.get(k) == defaults[k]:
            continue
        if fo.get(k, "<missing>") != fn.get(k, "<missing>") and not k.startswith(allowed):
            diffs.append(f"{k}: {fo.get(k, '<missing>')!r} -> {fn.get(k, '<missing>')!r}")
    return diffs


ConfigFactory = Callable[..., ml_collections.ConfigDict]


def unreadable_config(path: str, error: BaseException) -> str:
    """The message for a damaged ``config.json``, with the fixes that work."""
    workdir = os.path.dirname(path)
    return (
        f"{path} is unreadable ({type(error).__name__}: {error}); it describes the model of "
        f"this workdir's checkpoints. Restore it from a copy, or write it again from the config "
        f"and flags the run was trained with: python train.py --config <that config> "
        f"--workdir {workdir} --replace_unreadable_config (it resumes the run, or only rewrites "
        "the file if the run is finished)"
    )
