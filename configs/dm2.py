r"""DM2 (Park et al., "Diversified Mutual Learning for Deep Metric Learning"): a cohort of models
of any method exchanging relation matrices, with model, temporal and view diversity.

  python train.py --config configs/dm2.py --workdir runs/dm2                 # glyphs, L = 4

The argument after ':' is a comma-separated list of key=value:

* ``size=<L>``: the cohort size (default 4; 1 trains one model, with the exchange's keys at
  their defaults: it exchanges nothing);
* ``diversity=<set>``: the paper's Table 1 rows: ``independent`` (lambda = 0: members trained
  side by side without exchanging anything, each with its own init and augmentations), ``md``,
  ``md+td``, ``md+vd``, ``md+td+vd`` (DM2, the default);
* ``method=revisiting|diva``: what every member runs (default: the paper's triplet loss with
  distance-weighted sampling; ``diva`` gives a cohort of DiVA models);
* ``loss=<name>``: the members' loss for ``method=revisiting`` (default triplet);
* ``data=<preset>``: glyphs, folder, npz, or cub200 / cars196 / sop / inshop for the paper's
  settings.

The cohort's members are spread over the devices of a ``member`` mesh axis
(``--config.cohort.devices``, 0 = as many as divide the cohort size); on one CPU they run vmapped
on the one device. Any key can be overridden with ``--config.<key>=<value>``.
"""

from __future__ import annotations

import ml_collections

from configs.datasets import preset
from configs.diva import get_config as diva_config
from configs.revisiting import get_config as revisiting_config
from configs.revisiting import parse_arg
from jdml.config import set_keys
from jdml.errors import ConfigError

# Table 1's rows: (mutual term on, model diversity, temporal diversity, view diversity).
DIVERSITIES: dict[str, tuple[bool, bool, bool, bool]] = {
    "independent": (False, True, False, True),
    "md": (True, True, False, False),
    "md+td": (True, True, True, False),
    "md+vd": (True, True, False, True),
    "md+td+vd": (True, True, True, True),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The DM2 config for ``size=,diversity=,method=,loss=,data=`` (all optional)."""
    args = parse_arg(arg)
    size = int(args.pop("size", "4"))
    diversity = args.pop("diversity", "md+td+vd")
    method = args.pop("method", "revisiting")
    loss = args.pop("loss", "triplet")
    data = args.pop("data", "glyphs")
    if args:
        raise ConfigError(
            f"unknown config argument(s) {sorted(args)}; use size=, diversity=, method=, loss=, "
            "data="
        )
    if diversity not in DIVERSITIES:
        raise ConfigError(
            f"unknown diversity {diversity!r}; choose one of: {', '.join(DIVERSITIES)}"
        )
    chosen = preset(data)
    # Members run their method's preset, including its loss options on the benchmarks (the
    # margin loss's reference divisor: REFERENCE_LOSS_OPTIONS in configs/datasets.py).
    if method == "revisiting":
        c = revisiting_config(f"loss={loss},data={data}")
    elif method == "diva":
        c = diva_config(f"data={data}")  # DiVA's own per-dataset weights and schedule
    else:
        raise ConfigError(f"unknown method {method!r}; choose revisiting or diva")
    mutual, model, temporal, view = DIVERSITIES[diversity]
    with c.unlocked():
        if method == "revisiting":  # the paper's section 4.2 settings (configs/datasets.py)
            set_keys(c, chosen.dm2)
        # A single model (size=1) exchanges nothing: its exchange.dm2 keys keep their defaults
        # (a run refuses keys it does not use, jdml.config.usage).
        exchange = size > 1
        settings = chosen.dm2_any_method.items()
        set_keys(c, {k: v for k, v in settings if exchange or not k.startswith("exchange.")})
        c.cohort.size = size
        if exchange:
            c.exchange.dm2.mutual_weight = c.exchange.dm2.mutual_weight if mutual else 0.0
            c.exchange.dm2.model_diversity = model
            c.exchange.dm2.temporal_diversity = temporal
            c.exchange.dm2.view_diversity = view
    c.lock()
    return c
