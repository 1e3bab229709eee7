"""Every paper claim the emoji tables test, with its verdict from the paired interval.

Each claim says that one row beats another in test Recall@1 (of the embedding the paper
reports: one head, or the heads or members concatenated). Over the seeds both rows have, the
per-seed differences give a mean and a 95 % Student-t interval (``jdml.statistics.paired``);
the claim **reproduces** when the interval lies above 0, **does not reproduce** when it lies
below, and is **not resolved** when it holds 0 or rests on one seed. The records are those of
``experiments/emoji_protocol.py`` (``--results``); a claim whose rows lack a record for any of
``--seeds`` is left out (so a table filling in lists only the claims it can state in full).

Usage: python experiments/emoji_claims.py [--results experiments/results/emoji-v2-45]
           [--epochs 45] [--seeds 0 1 2 3 4] [--plot claims.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emoji_protocol as protocol

from jdml.statistics import Paired, paired


@dataclasses.dataclass(frozen=True)
class Claim:
    paper: str
    text: str
    row: str
    base: str
    concat: bool  # the concatenated heads / members, as the paper reports them
    frozen: int = -1  # DM2's rows train the stages after 3
    fixed: str | None = None  # a baseline without training (baselines.json), not a row


CLAIMS: tuple[Claim, ...] = (
    Claim("Revisiting, Tab. 1", "fine-tuning beats the ImageNet features", "margin", "",
          False, fixed="ImageNet features (pooled 1280-d, L2-normalised)"),
    Claim("Revisiting, Tab. 1", "fine-tuning beats raw pixels (the stronger baseline here)",
          "margin", "", False, fixed="raw pixels (64 x 64 x 3, L2-normalised)"),
    Claim("Revisiting, Sec. 5", "rho-regularisation improves margin", "R-margin", "margin", False),
    Claim("DiVA, Tab. 2", "DiVA's four heads beat one head of the same dimension", "diva",
          "diva-D", True),
    Claim("DiVA, Tab. 2", "the shared head adds to the discriminative one", "diva-DS", "diva-D",
          True),
    Claim("DiVA, Tab. 2", "the intra-class head adds to the discriminative one", "diva-DI",
          "diva-D", True),
    Claim("DiVA, Tab. 2", "DaNCE's head adds to the discriminative one", "diva-DDa", "diva-D",
          True),
    Claim("DiVA, Tab. 2", "decorrelating the heads helps", "diva", "diva-nodecor", True),
    Claim("DiVA (control)", "DiVA's heads beat four margin heads of the same dimension", "diva",
          "diva-4D", True),
    # Sharing Matters' method is the class head with a shared head of its own, decorrelated
    # (Tab. 7a's both+sep+decor), reported as the 256-d concatenation against a 256-d baseline.
    Claim("Sharing Matters, Tab. 1-4", "the method beats one class head of its dimension "
          "(256-d)", "sharing-decor", "sharing-class256", True),
    Claim("Sharing Matters (control)", "... and beats two 128-d class heads, concatenated",
          "sharing-decor", "sharing-2class", True),
    Claim("Sharing Matters, Tab. 4", "the method's class head alone beats the class-only "
          "baseline", "sharing-decor", "sharing-class", False),
    Claim("Sharing Matters, Tab. 7a", "a shared head adds to the class head (256-d against "
          "128-d)", "sharing", "sharing-class", True),
    Claim("Sharing Matters, Tab. 7a", "decorrelating the shared head from the class head helps",
          "sharing-decor", "sharing", True),
    Claim("DM2, Table 1", "the mutual term (MD) lifts a member", "dm2-3-md", "dm2-3-independent",
          False, frozen=3),
    Claim("DM2, Table 1", "MD+VD lifts a member", "dm2-3-md+vd", "dm2-3-independent", False,
          frozen=3),
    Claim("DM2, Table 1", "DM2 (MD+TD+VD) lifts a member", "dm2-3-md+td+vd",
          "dm2-3-independent", False, frozen=3),
    Claim("DM2, Table 1", "DM2's cohort beats independent members (ensemble)", "dm2-3-md+td+vd",
          "dm2-3-independent", True, frozen=3),
)  # fmt: skip


def claim_difference(claim: Claim, args: argparse.Namespace) -> Paired | None:
    """The claim's paired difference in test Recall@1, or None unless both its rows have a
    record for every one of ``args.seeds`` (a claim is stated in full or not at all)."""
    a = argparse.Namespace(**{**vars(args), "frozen_stages": claim.frozen})
    if claim.fixed:
        base = protocol.baselines(args.results, [], compute=False).get(claim.fixed)
        values = protocol._by_seed(claim.row, a, None)
        if not base or not values:
            return None
        seeds = sorted(values)
        d = paired([values[k] for k in seeds], [base["recall@1"][0]] * len(seeds))
    else:
        d = protocol.difference(claim.row, claim.base, a, claim.concat)
    return d if d is not None and d.n >= len(args.seeds) else None


def claim_row(claim: Claim, args: argparse.Namespace) -> list[str] | None:
    """The claim's table row, or None when :func:`claim_difference` has no difference."""
    d = claim_difference(claim, args)
    if d is None:
        return None
    if claim.fixed:
        compared = f"{protocol.ROWS[claim.row][0]} - {claim.fixed.split(' (')[0]}"
    else:
        what = "concatenation" if claim.concat else "one head" if claim.frozen < 0 else "member 1"
        compared = f"{protocol.ROWS[claim.row][0]} - {protocol.ROWS[claim.base][0]} ({what})"
    return [claim.paper, claim.text, compared, str(d.n), d.cell(), f"**{d.verdict()}**"]


def claims_table(args: argparse.Namespace) -> str:
    lines = [
        f"| claim, emoji test, {args.epochs} epochs | says | rows compared | seeds "
        "| Δ recall@1 [95 % CI] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for claim in CLAIMS:
        row = claim_row(claim, args)
        if row is not None:
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot_claims(args: argparse.Namespace, path: str) -> None:
    """The claims' paired differences and 95 % intervals, one line each, coloured by verdict
    (the fixed-baseline claims, tens of points away, are left out of the plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"reproduces": "#1a9641", "does not reproduce": "#d7191c", "not resolved": "#888888"}
    shown = []
    for claim in CLAIMS:
        d = None if claim.fixed else claim_difference(claim, args)
        if d is not None:
            shown.append((f"{claim.paper}: {claim.text}", d))
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(shown) + 1.2))
    for y, (_, d) in enumerate(reversed(shown)):
        colour = colours[d.verdict()]
        if d.n > 1:
            ax.plot([100 * d.low, 100 * d.high], [y, y], color=colour, lw=2)
        ax.plot(100 * d.mean, y, "o", color=colour)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(shown)), [label for label, _ in reversed(shown)], fontsize=8)
    ax.set_xlabel("Δ test Recall@1, points (paired over seeds, 95 % interval)")
    handles = [plt.Line2D([], [], color=c, marker="o", lw=2, label=v) for v, c in colours.items()]
    # Outside the axes, right of them, so that it never covers an interval or the zero line.
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(
        f"{os.path.basename(os.path.normpath(args.results))}: {args.epochs} epochs, "
        f"seeds {', '.join(map(str, args.seeds))}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="experiments/results/emoji-v2-45")
    parser.add_argument("--epochs", type=int, default=45)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--plot", help="also draw the intervals into this PNG")
    args = parser.parse_args()
    print(claims_table(args), end="")
    if args.plot:
        plot_claims(args, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
