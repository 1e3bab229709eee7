r"""Revisiting-DML (Roth et al., ICML 2020): any loss, miner and sampler on one embedding head.

The default is the paper's strong baseline, margin loss (beta 1.2, learnable per class) with
distance-weighted mining and SPC-2 batches, here on the embedded glyph dataset:

  python train.py --config configs/revisiting.py --workdir runs/glyphs

The argument after ':' is a comma-separated list of key=value choosing a row of the paper's
main table (Table 2): ``loss=<name>`` (with the miner and embedding normalisation its reference
runs use), ``miner=<name>`` (``miner=rho_distance`` gives the R-variants: R-Margin, R-Triplet,
R-Contrastive, R-SNR), ``sampler=<name>`` (the mini-batch sampler, e.g. ``greedy_coreset``,
``disthist_batchmatch``), ``data=<preset>``:

  python train.py --config configs/revisiting.py:loss=triplet,miner=semihard --workdir runs/t
  python train.py --config configs/revisiting.py:loss=margin,miner=rho_distance --workdir runs/r
  python train.py --config configs/revisiting.py:loss=multisimilarity --workdir runs/ms

Your own data (an image folder root/<class>/<image> or an npz with 'images' and 'labels'):

  python train.py --config configs/revisiting.py:data=folder --config.data.path=/data/myset \
      --workdir runs/myset

Any key can still be overridden with --config.<key>=<value>.
"""

from __future__ import annotations

import ml_collections

from configs.datasets import PRESETS, preset, reference_loss_overrides
from jdml.config import base_config, set_keys
from jdml.errors import ConfigError
from jdml.losses import LOSSES


def rho_push_prob(data: str, loss: str) -> float:
    """The reference's push probability for rho_distance on a dataset with a loss."""
    table = PRESETS[data].rho_push_prob
    return table.get(loss, table["default"])


def loss_overrides(loss: str, miner: str | None, data: str) -> dict[str, object]:
    """Config overrides that select a loss (and miner) as the reference runs them: the loss's
    registered ``reference_miner`` unless ``miner`` is given, and its ``reference_normalize``."""
    if loss not in LOSSES:
        raise ConfigError(f"unknown loss {loss!r}; choose one of: {', '.join(LOSSES.names())}")
    cls = LOSSES.get(loss)  # its reference miner and normalisation
    out: dict[str, object] = {
        "loss.name": loss,
        "miner.name": cls.reference_miner if miner is None else miner,
        "model.normalize": cls.reference_normalize,
    }
    miner = out["miner.name"]
    if miner == "rho_distance":
        out["miner.rho_distance.push_prob"] = rho_push_prob(data, loss)
    out.update(PRESETS[data].loss)
    return out


def parse_arg(arg: str | None) -> dict[str, str]:
    """Parses 'k=v,k2=v2' (an empty or missing argument gives {})."""
    out = {}
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"config argument {item!r} is not key=value (e.g. data=glyphs)")
        out[key.strip()] = value.strip()
    return out


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config for ``loss=<name>,miner=<name>,sampler=<name>,data=<preset>`` (all optional)."""
    args = parse_arg(arg)
    data = args.pop("data", "glyphs")
    loss = args.pop("loss", "margin")
    miner = args.pop("miner", None)
    sampler = args.pop("sampler", None)
    if args:
        raise ConfigError(
            f"unknown config argument(s) {sorted(args)}; use loss=<name>, miner=<name>, "
            "sampler=<name>, data=<preset>"
        )
    c = base_config()
    set_keys(c, preset(data).protocol)
    set_keys(c, loss_overrides(loss, None if miner in (None, "default") else miner, data))
    set_keys(c, reference_loss_overrides("loss", data))
    if sampler is not None:
        c.sampler.name = sampler  # validated with the rest of the config
    c.lock()
    return c
