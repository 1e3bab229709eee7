"""Which Optuna sampler a study should default to at the budgets studies afford (4 to 32
candidates per row): random search, TPE, or a grid.

Each draw is a tuning problem like a DML row's: the validation score (points) is a concave
function of log10 of the learning rate peaking at a random rate in [1e-4, 3e-3], falling by
``CURVE`` points per squared decade away from it, with a second knob (a loss margin in [0.05,
0.5]) that costs ``CURVE_2`` points per squared unit of its range away from its own random
optimum; each candidate's score is observed with the seed-to-seed noise ``NOISE`` (about what
one seed of a glyph or emoji run shows). A sampler's **regret** is the true score of the
candidate it selects (the best observed) below the best true score in the space: what the
row loses to its tuning. The grid is the product of equally spaced values (log-spaced rates)
with at most ``budget`` points, in Optuna's seeded random order.

    python bench/bench_study_sampler.py [--draws 200] [--budgets 4 8 16 32]

Prints the mean regret (± its standard error) per sampler and budget, for one knob (the rate
only) and for two.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from jdml.study import search
from jdml.study.spec import Choice, Float

CURVE = 4.0  # points lost per squared decade of learning rate away from the best
CURVE_2 = 6.0  # points lost per squared range of the second knob away from its best
NOISE = 0.7  # the observed score's seed-to-seed standard deviation, points
LOW, HIGH = math.log10(1e-4), math.log10(3e-3)


def true_score(lr: float, margin: float, best: tuple[float, float], two: bool) -> float:
    score = -CURVE * (math.log10(lr) - best[0]) ** 2
    if two:
        score -= CURVE_2 * ((margin - best[1]) / 0.45) ** 2
    return score


def space(kind: str, budget: int, two: bool) -> dict:
    if kind != "grid":
        out = {"optim.lr": Float(10**LOW, 10**HIGH, log=True)}
        if two:
            out["loss.margin"] = Float(0.05, 0.5)
        return out
    per = int(budget ** (1 / 2)) if two else budget
    out = {"optim.lr": Choice(tuple(float(x) for x in np.logspace(LOW, HIGH, per)))}
    if two:
        out["loss.margin"] = Choice(tuple(float(x) for x in np.linspace(0.05, 0.5, per)))
    return out


def regret(kind: str, budget: int, two: bool, draw: int) -> float:
    import optuna

    rng = np.random.default_rng(draw)
    best = (rng.uniform(LOW, HIGH), rng.uniform(0.05, 0.5))
    dims = space(kind, budget, two)
    study = optuna.create_study(direction="maximize", sampler=search.sampler(kind, draw, dims))
    picked = []
    size = math.prod(len(d.values) for d in dims.values()) if kind == "grid" else budget
    for _ in range(min(budget, size)):
        trial = study.ask()
        values = search.suggest(trial, dims)
        lr, margin = values["optim.lr"], values.get("loss.margin", 0.0)
        truth = true_score(lr, margin, best, two)
        observed = truth + NOISE * rng.standard_normal()
        search.tell(study, trial, observed)
        picked.append((observed, truth))
    selected_truth = max(picked)[1]
    return -selected_truth  # the best true score in the space is 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32])
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    start = time.perf_counter()
    print(f"regret in validation points (mean ± standard error over {args.draws} draws; "
          f"curvature {CURVE:g} / decade², second knob {CURVE_2:g}, noise {NOISE:g})")  # fmt: skip
    for two in (False, True):
        print(f"\n{'two knobs' if two else 'one knob (the learning rate)'}")
        print("| budget | random | tpe | grid |")
        print("|---|---|---|---|")
        for budget in args.budgets:
            cells = []
            for kind in ("random", "tpe", "grid"):
                r = np.array([regret(kind, budget, two, d) for d in range(args.draws)])
                cells.append(f"{r.mean():.2f} ± {r.std(ddof=1) / math.sqrt(len(r)):.2f}")
            print(f"| {budget} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
