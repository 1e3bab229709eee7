r"""Revisiting-DML (Roth et al., ICML 2020): any loss, miner and sampler on one embedding head.

The default is the paper's strong baseline, margin loss (beta 1.2, learnable per class) with
distance-weighted mining and SPC-2 batches, here on the embedded glyph dataset:

  python train.py --config configs/revisiting.py --workdir runs/glyphs
  python train.py --config configs/revisiting.py:data=glyphs --workdir runs/glyphs_triplet \
      --config.loss.name=triplet --config.miner.name=random

Your own data (an image folder root/<class>/<image> or an npz with 'images' and 'labels'):

  python train.py --config configs/revisiting.py:data=folder --config.data.path=/data/myset \
      --workdir runs/myset

The argument after ':' is a comma-separated list of key=value (data=<preset>).
"""

from __future__ import annotations

import ml_collections

from jdml.config import ConfigError, base_config

# Dataset presets: overrides of the base config per dataset.
PRESETS: dict[str, dict[str, object]] = {
    "glyphs": {},
    "folder": {"data.name": "folder", "data.image_size": 64},
    "npz": {"data.name": "npz"},
}


def parse_arg(arg: str | None) -> dict[str, str]:
    """Parses 'k=v,k2=v2' (an empty or missing argument gives {})."""
    out = {}
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"config argument {item!r} is not key=value (e.g. data=glyphs)")
        out[key.strip()] = value.strip()
    return out


def apply_overrides(c: ml_collections.ConfigDict, overrides: dict[str, object]) -> None:
    """Sets dotted keys ('data.name') on a config."""
    for dotted, value in overrides.items():
        *path, key = dotted.split(".")
        node = c
        for part in path:
            node = node[part]
        node[key] = value


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = parse_arg(arg)
    data = args.pop("data", "glyphs")
    if args:
        raise ConfigError(
            f"unknown config argument(s) {sorted(args)}; the only one is data=<preset>"
        )
    if data not in PRESETS:
        raise ConfigError(f"unknown data preset {data!r}; choose one of: {', '.join(PRESETS)}")
    c = base_config()
    apply_overrides(c, PRESETS[data])
    c.lock()
    return c
