"""The papers' claims on the emoji set, as a study: every row, every claim, its paper's effect.

Every row fine-tunes the ImageNet-pretrained EfficientNet-Lite0 of the ``data=emoji`` preset
(``configs/datasets.py``, ``EMOJI_PROTOCOL``: frozen BatchNorm, batch 112 with SPC-2, Adam,
64 px, 45 epochs) on the first half of the classes minus the 15 % held out for validation; the
checkpoint with the best validation Recall@1 is evaluated once on the unseen test classes.
Each row searches its own key hyperparameters on validation (a grid of 4, seed 0, 20 epochs);
the methods' rows train at the learning rate margin's search selected (``LR``). Seeds 0-4
(look 1), then 5-9 for the rows of the claims still unresolved (look 2).

    jdml study run experiments/emoji_study.py --dir runs/emoji-study --slots 2
    jdml study report runs/emoji-study

The wider Revisiting comparison (more losses and samplers against margin, no claim) is the
study ``experiments/emoji_study.py:wider``, at the same budget and epochs, seeds 0-4.

``experiments/results/emoji-v2-45`` holds the first run of the claims' rows, by the scripts
this file replaced (``tools/convert_emoji_records.py``): its ledger says how it departed from
this; ``experiments/results/emoji-wider-45`` the wider rows' first run (one seed each, at
margin's learning rate, split from it by the same tool).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from configs.diva import ablation_config
from configs.revisiting import get_config as revisiting_config
from configs.sharing import get_config as sharing_config
from jdml.config import metric_term
from jdml.study import Choice, Claim, Effect, Row, Study

LR = 2e-4  # margin's learning rate, selected on validation (its search: 1e-4, 5e-5, 2e-4, 4e-4)
RATES = Choice((1e-4, 5e-5, 2e-4, 4e-4))  # the baselines' search
RHO = {"eval.train_metrics": ("rho_spectrum@1",)}  # the train spectrum after the run
DIVA_DIM = 512  # DiVA's total embedding dimension, split over the heads of each row
DIVA = {"aux_weight": Choice((0.2, 0.1)), "main_dim": Choice((128, 224))}
WEIGHT = {"aux.shared.weight": Choice((1.0, 0.5))}
SHARING = {**WEIGHT, "decorrelation.weights": Choice(((500.0,), (100.0,)))}
DM2 = {"exchange.dm2.mutual_weight": Choice((20.0, 5.0)),
       "exchange.dm2.temporal_rate": Choice((0.5, 0.8))}  # fmt: skip
PUSH = {"miner.rho_distance.push_prob": Choice((0.2, 0.05, 0.1, 0.35))}
SAMPLERS = ("d2_coreset", "disthist_batchmatch", "fid_batchmatch", "full_random", "greedy_coreset")


def extra_heads(c: ml_collections.ConfigDict, copies: int, dim: int) -> None:
    """``copies`` more ``dim``-d heads of the main head's loss and miner, all concatenated: the
    equal-dimension control of a method whose extra heads learn other tasks."""
    main = c.model.head
    with c.unlocked():
        c.model.embed_dim = dim
        for k in range(2, copies + 2):
            term = metric_term(c.loss.name, c.miner.name, head=f"{main}{k}", weight=1.0, dim=dim)
            term.loss = ml_collections.ConfigDict(c.loss.to_dict())
            term.miner = ml_collections.ConfigDict(c.miner.to_dict())
            c.aux[f"{main}{k}"] = term
        c.eval.heads = (main, *(f"{main}{k}" for k in range(2, copies + 2)))
        c.eval.combinations = ((1.0,) * (copies + 1),)


def diva(keep: tuple[str, ...], decorrelate: bool = True, copies: int = 0):
    """DiVA's Tab. 2 row with the auxiliary terms ``keep`` at one total dimension (or, with
    ``copies``, that many more discriminative heads: the control)."""

    def build(knobs: Mapping[str, Any]) -> ml_collections.ConfigDict:
        main = knobs.get("main_dim") if keep else None
        c = ablation_config("emoji", keep, decorrelate=decorrelate, total_dim=DIVA_DIM,
                            main_dim=main, aux_weight=knobs.get("aux_weight"))  # fmt: skip
        if copies:
            extra_heads(c, copies, DIVA_DIM // (copies + 1))
        return c

    return build


def sharing_alone() -> ml_collections.ConfigDict:
    """Sharing Matters' class and shared heads, not decorrelated (Tab. 7a's both+sep)."""
    c = sharing_config("data=emoji")
    c.decorrelation.pairs, c.decorrelation.weights = (), ()
    return c


def class_heads(copies: int):
    """Sharing's class head alone (margin, SPC-4 as Sharing trains), with ``copies`` more."""

    def build() -> ml_collections.ConfigDict:
        c = revisiting_config("loss=margin,data=emoji")
        c.sampler.samples_per_class = 4
        extra_heads(c, copies, 128)
        return c

    return build


def row(name: str, label: str, config, space=None, **overrides: Any) -> Row:
    space = space or {"optim.lr": RATES}
    defaults = {k: d.values[0] for k, d in space.items() if "." not in k}
    return Row(name, config, overrides, space, label, defaults)


R, LR_SET = "revisiting:data=emoji,loss=", {"optim.lr": LR}


def revisiting_rows() -> tuple[Row, Row]:
    """margin and R-margin: a claim's rows, and the references of the wider comparison."""
    return (
        row("margin", "margin (distance miner)", f"{R}margin", **RHO),
        row("R-margin", "R-margin (rho-regularised)", f"{R}margin,miner=rho_distance", PUSH,
            **RHO, **LR_SET),
    )  # fmt: skip


def rows() -> tuple[Row, ...]:
    """The rows of the claims."""
    r, lr = R, LR_SET
    spc4 = {"sampler.samples_per_class": 4}
    dm2 = {"exchange.dm2.warmup_epochs": 1.0, "model.frozen_stages": 3}  # stages after 3 train
    all_aux = ("selfsimilarity", "shared", "intra")
    return (
        *revisiting_rows(),
        row("diva-D", "margin, one 512-d head", diva(())),
        row("diva-4D", "four 128-d margin heads, concatenated", diva((), copies=3)),
        row("diva-DS", "D+S", diva(("shared",)), DIVA, **lr),
        row("diva-DI", "D+I", diva(("intra",)), DIVA, **lr),
        row("diva-DDa", "D+Da", diva(("selfsimilarity",)), DIVA, **lr),
        row("diva", "DiVA (D+Da+S+I)", diva(all_aux), DIVA, **lr),
        row("diva-nodecor", "DiVA without decorrelation", diva(all_aux, False), DIVA, **lr),
        row("sharing-class", "class only", f"{r}margin", **spc4),
        row("sharing-class256", "class only, one 256-d head", f"{r}margin", **spc4,
            **{"model.embed_dim": 256}),
        row("sharing-2class", "two 128-d class heads, concatenated", class_heads(1)),
        row("sharing", "class + shared", sharing_alone, {**WEIGHT, "optim.lr": Choice((LR, 1e-4))}),
        row("sharing-decor", "class + shared, decorrelated", "sharing:data=emoji", SHARING, **lr),
        row("dm2-3-independent", "Independent", "dm2:size=3,diversity=independent,data=emoji",
            **dm2),
        *(row(f"dm2-3-{d}", label, f"dm2:size=3,diversity={d},data=emoji", DM2, **dm2, **lr)
          for d, label in (("md", "MD"), ("md+td", "MD+TD"), ("md+vd", "MD+VD"),
                           ("md+td+vd", "MD+TD+VD"))),
    )  # fmt: skip


def wider_rows() -> tuple[Row, ...]:
    """The wider Revisiting comparison (Tab. 3's losses, Sec. 4's samplers), against margin:
    no claim reads them, so they are a study of their own (``get_study("wider")``)."""
    r = R
    return (
        *revisiting_rows(),
        row("triplet", "triplet", f"{r}triplet", **RHO),
        *(row(loss, loss, f"{r}{loss}") for loss in ("contrastive", "multisimilarity", "proxynca")),
        row("R-triplet", "R-triplet", f"{r}triplet,miner=rho_distance", PUSH, **RHO, **LR_SET),
        *(row(f"sampler-{s}", s, f"{r}margin", **{"sampler.name": s}) for s in SAMPLERS),
    )  # fmt: skip


def effects() -> dict[str, tuple[Effect, ...]]:
    """claim text -> every Recall@1 gain its paper prints for the comparison (each dataset,
    backbone, loss, net, gamma), read from the papers' tables into ``emoji_effects.csv``."""
    out: dict[str, tuple[Effect, ...]] = {}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "emoji_effects.csv")) as f:
        for r in csv.DictReader(f):
            out[r["claim"]] = (*out.get(r["claim"], ()), Effect(float(r["value"]), r["source"]))
    return out


def claims() -> tuple[Claim, ...]:
    printed = effects()

    def claim(paper: str, text: str, a: str, b: str, concat: bool = False) -> Claim:
        return Claim(text, a, b, concat, paper=paper, effects=printed.get(text, ()))

    return (
        Claim("fine-tuning beats the ImageNet features", "margin", "", paper="Revisiting, Tab. 1",
              family=False, fixed="features"),
        Claim("fine-tuning beats raw pixels (the stronger baseline here)", "margin", "",
              paper="Revisiting, Tab. 1", family=False, fixed="pixels"),
        claim("Revisiting, Sec. 5", "rho-regularisation improves margin", "R-margin", "margin"),
        claim("DiVA, Tab. 2", "DiVA's four heads beat one head of the same dimension", "diva",
              "diva-D", True),
        claim("DiVA, Tab. 2", "the shared head adds to the discriminative one", "diva-DS",
              "diva-D", True),
        claim("DiVA, Tab. 2", "the intra-class head adds to the discriminative one", "diva-DI",
              "diva-D", True),
        claim("DiVA, Tab. 2", "DaNCE's head adds to the discriminative one", "diva-DDa", "diva-D",
              True),
        claim("DiVA, Tab. 4", "decorrelating the heads helps", "diva", "diva-nodecor", True),
        claim("DiVA (control)", "DiVA's heads beat four margin heads of the same dimension",
              "diva", "diva-4D", True),
        claim("Sharing Matters, Tab. 1-4", "the method beats one class head of its dimension "
              "(256-d)", "sharing-decor", "sharing-class256", True),
        claim("Sharing Matters (control)", "... and beats two 128-d class heads, concatenated",
              "sharing-decor", "sharing-2class", True),
        claim("Sharing Matters, Tab. 4", "the method's class head alone beats the class-only "
              "baseline", "sharing-decor", "sharing-class"),
        claim("Sharing Matters, Tab. 7a", "a shared head adds to the class head (256-d against "
              "128-d)", "sharing", "sharing-class", True),
        claim("Sharing Matters, Tab. 7a", "decorrelating the shared head from the class head "
              "helps", "sharing-decor", "sharing", True),
        claim("DM2, Table 1", "the mutual term (MD) lifts a member", "dm2-3-md",
              "dm2-3-independent"),
        claim("DM2, Table 1", "MD+VD lifts a member", "dm2-3-md+vd", "dm2-3-independent"),
        claim("DM2, Table 1", "DM2 (MD+TD+VD) lifts a member", "dm2-3-md+td+vd",
              "dm2-3-independent"),
        claim("DM2, Table 1", "DM2's cohort beats independent members (ensemble)",
              "dm2-3-md+td+vd", "dm2-3-independent", True),
    )  # fmt: skip


def get_study(arg: str = "") -> Study:
    """The claims' study; ``wider``: the wider Revisiting comparison, at the same budget and
    epochs, one look of 5 seeds (no claim, so no later look)."""
    if arg not in ("", "wider"):
        raise ValueError(f"emoji_study.py:{arg}: give no argument (the claims) or 'wider'")
    if arg == "wider":
        return Study(
            name="The wider Revisiting comparison on the emoji set",
            rows=wider_rows(),
            data={},
            claims=(),
            common={"eval.train_metrics": (), "train.epochs": 45},
            budget=4,
            sampler="grid",
            tune={"train.epochs": 20},
            looks=(5,),
        )
    return Study(
        name="The papers' claims on the emoji set",
        rows=rows(),
        data={},
        claims=claims(),
        common={"eval.train_metrics": (), "train.epochs": 45},
        budget=4,
        sampler="grid",
        tune={"train.epochs": 20},
        looks=(5, 10),
        # The family of record is the whole table: the page asks whether the papers' claims
        # hold here, read at once, so any false verdict on it counts; each paper's own family
        # is shown beside it.
        family_by="table",
    )
