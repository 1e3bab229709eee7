r"""DiVA (Milbich, Roth et al., ECCV 2020): four heads on one backbone, decorrelated.

  python train.py --config configs/diva.py --workdir runs/diva            # glyphs
  python train.py --config configs/diva.py:data=folder --config.data.path=/data/cub \
      --workdir runs/diva_cub

Heads and terms (the paper's sec. 3 and the reference's sample runs):

* ``discriminative``: margin loss (beta 1.2, learnable per class) with the distance miner: the
  main term (``loss``, ``miner``);
* ``shared``: its own margin loss with the ``random_distance`` miner (class-shared features);
* ``intra``: its own margin loss with the ``intra_random`` miner (intra-class features);
* ``selfsimilarity``: DaNCE against an EMA key network and a queue of past keys;
* decorrelation of each auxiliary head (source) against the discriminative head (target).

The argument after ':' is ``data=<preset>`` (glyphs, folder, npz, or the names cub200,
cars196, sop which select the reference runs' weights and schedule; inshop takes SOP's; point
``data.path`` at the images). Evaluation covers every head alone and the paper's weighted
concatenations.
"""

from __future__ import annotations

import ml_collections

from configs.datasets import preset, reference_loss_overrides
from configs.revisiting import parse_arg
from jdml.config import base_config, dance_term, metric_term, set_keys
from jdml.errors import ConfigError

AUX_HEADS = ("selfsimilarity", "shared", "intra")

# The reference's optimiser on the ImageNet benchmarks (the per-dataset weights, schedule and queue
# are in configs/datasets.py).
REFERENCE_OPTIM = {"optim.lr": 1e-5, "optim.weight_decay": 4e-4}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The DiVA config for ``data=<preset>`` (default glyphs)."""
    args = parse_arg(arg)
    data = args.pop("data", "glyphs")
    if args:
        raise ConfigError(f"unknown config argument(s) {sorted(args)}; use data=<preset>")
    chosen = preset(data)
    s = chosen.diva
    c = base_config()
    set_keys(c, chosen.protocol)
    if chosen.benchmark:
        set_keys(c, REFERENCE_OPTIM)
    c.model.head = "discriminative"
    c.loss.name, c.miner.name = "margin", "distance"
    c.aux.selfsimilarity = dance_term(head="selfsimilarity", weight=s["alpha"])
    c.aux.selfsimilarity.queue_batches = int(s["keys"])
    c.aux.shared = metric_term("margin", "random_distance", head="shared", weight=s["alpha"])
    c.aux.intra = metric_term("margin", "intra_random", head="intra", weight=s["alpha"])
    for section in ("loss", "aux.shared.loss", "aux.intra.loss"):
        set_keys(c, reference_loss_overrides(section, data))  # the reference's divisor
    c.decorrelation.pairs = tuple((head, "discriminative") for head in AUX_HEADS)
    c.decorrelation.weights = (s["rho"],) * len(AUX_HEADS)
    c.optim.milestones = (int(s["milestone"]),)
    c.optim.gamma = s["gamma"]
    c.train.epochs = int(s["epochs"])
    c.eval.heads = ("discriminative", *AUX_HEADS)
    c.eval.combinations = chosen.diva_eval_weights
    c.lock()
    return c


def keep_aux_terms(c: ml_collections.ConfigDict, keep: tuple[str, ...]) -> None:
    """Keeps the auxiliary terms named in ``keep`` (DiVA's ablation rows, its Tab. 2) and the
    decorrelation pairs between the heads that remain."""
    heads = {c.model.head, *(c.aux[name].head for name in keep)}
    with c.unlocked():
        for name in list(c.aux):
            if name not in keep:
                del c.aux[name]
    pairs = [(p, w) for p, w in zip(c.decorrelation.pairs, c.decorrelation.weights, strict=True)]
    pairs = [(p, w) for p, w in pairs if set(p) <= heads]
    c.decorrelation.pairs = tuple(p for p, _ in pairs)
    c.decorrelation.weights = tuple(w for _, w in pairs)


def split_embedding(
    c: ml_collections.ConfigDict, total_dim: int, main_dim: int | None = None
) -> None:
    """Gives every head ``total_dim / (number of heads)`` dimensions (or the main head
    ``main_dim`` and the others equal shares of the rest), so that rows with different heads
    compare at one total size, and evaluates each head and their equal-weight concatenation."""
    heads = [c.model.head, *(t.head for t in c.aux.values())]
    dim = total_dim // len(heads)
    if main_dim is not None and len(heads) > 1:
        if not 0 < main_dim < total_dim or (total_dim - main_dim) % (len(heads) - 1):
            raise ConfigError(
                f"main_dim={main_dim} does not leave {len(heads) - 1} equal shares of "
                f"total_dim={total_dim}"
            )
        dim = (total_dim - main_dim) // (len(heads) - 1)
    c.model.embed_dim = main_dim if main_dim is not None and len(heads) > 1 else dim
    for t in c.aux.values():
        t.dim = dim
    c.eval.heads = tuple(heads)
    c.eval.combinations = ((1.0,) * len(heads),) if len(heads) > 1 else ()


def ablation_config(
    data: str,
    keep: tuple[str, ...],
    *,
    decorrelate: bool = True,
    total_dim: int = 512,
    main_dim: int | None = None,
    aux_weight: float | None = None,
) -> ml_collections.ConfigDict:
    """A row of DiVA's Tab. 2 on ``data``: the discriminative head with the auxiliary terms in
    ``keep`` (decorrelated from it unless told otherwise), all heads sharing ``total_dim`` (the
    discriminative head ``main_dim`` of it if given), the auxiliary terms at weight
    ``aux_weight`` (default: the preset's alpha)."""
    c = get_config(f"data={data}")
    keep_aux_terms(c, keep)
    if not decorrelate:
        c.decorrelation.pairs, c.decorrelation.weights = (), ()
    split_embedding(c, total_dim, main_dim)
    if aux_weight is not None:
        for t in c.aux.values():
            t.weight = float(aux_weight)
    return c
