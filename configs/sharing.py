r"""Sharing Matters (Milbich et al., TPAMI): a class head and a shared-characteristics head.

  python train.py --config configs/sharing.py --workdir runs/sharing          # glyphs

* ``class``: margin loss (beta 1.2, learnable per class) with the distance miner on SPC-4
  batches: the main term;
* ``shared``: its own margin loss on cross-class triplets (``shared_neg_distance``: anchor,
  "positive" and negative of three different classes, the negative distance-weighted), which
  learns what classes share;
* decorrelation of the shared head (source) against the class head (target) through psi and
  gradient reversal, weight gamma (the reference's ``--disw``), without re-normalising the
  already unit-norm embeddings; psi has its own learning rate and weight decay 1e-6.

One joint step per batch by default; ``alternating=1`` gives the paper's Algorithm 1 (and the
reference's code): an update of the class term and the decorrelation on the SPC-4 batch, then an
update of the shared term and the decorrelation on a batch drawn uniformly at random. The other
argument after ':' is ``data=<preset>`` (glyphs, folder, npz, or cub200 / cars196 for the
reference runs' gamma and schedule; sop and inshop with the flag default gamma). Evaluation: the
class head selects the checkpoint; the shared head and the concatenation are evaluated too.
"""

from __future__ import annotations

import ml_collections

from configs.datasets import preset, reference_loss_overrides
from configs.revisiting import parse_arg
from jdml.config import base_config, metric_term, set_keys
from jdml.errors import ConfigError


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The Sharing Matters config for ``data=<preset>`` (default glyphs)."""
    args = parse_arg(arg)
    data = args.pop("data", "glyphs")
    alternating = args.pop("alternating", "0") not in ("0", "false", "False")
    if args:
        raise ConfigError(
            f"unknown config argument(s) {sorted(args)}; use data=<preset>, alternating=0|1"
        )
    chosen = preset(data)
    s = chosen.sharing
    c = base_config()
    set_keys(c, chosen.protocol)
    if chosen.benchmark:
        set_keys(c, {"optim.lr": 1e-5, "optim.weight_decay": 4e-4, "optim.milestones": ()})
    c.model.head = "class"
    c.loss.name, c.miner.name = "margin", "distance"
    c.sampler.samples_per_class = 4
    c.aux.shared = metric_term(
        "margin", "shared_neg_distance", head="shared", weight=s["shared_weight"]
    )
    for section in ("loss", "aux.shared.loss"):
        set_keys(c, reference_loss_overrides(section, data))  # the reference's divisor
    c.decorrelation.pairs = (("shared", "class"),)
    c.decorrelation.weights = (s["gamma"],)
    c.decorrelation.renormalize = False
    c.decorrelation.weight_decay = 1e-6
    c.train.epochs = int(s["epochs"])
    if alternating:
        c.phases = (("main", "decorrelation"), ("shared", "decorrelation"))
    c.eval.heads = ("class", "shared")
    c.eval.combinations = ((1.0, 1.0),)
    c.lock()
    return c
