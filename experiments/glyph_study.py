"""A study to start from: margin, triplet and rho-regularised margin on the embedded glyphs.

Every row searches its own learning rate (and its loss's or miner's own knob) with the same
budget of 8 candidates, scored on one validation hold-out; every row then trains seeds 0-4,
and the rows of the claims still unresolved under Holm's correction seeds 5-9:

    jdml study run experiments/glyph_study.py --dir runs/glyph-study --slots 2
    jdml study report runs/glyph-study

(``pip install -e '.[study]'`` first: Optuna, and Ray for ``--executor ray``.)
"""

from jdml.study import Claim, Float, Row, Study

RATE = Float(1e-4, 3e-3, log=True)


def get_study(arg: str = "") -> Study:
    return Study(
        name="Revisiting on the glyphs: margin, triplet and rho-regularisation",
        rows=(
            Row(
                "margin",
                "revisiting:loss=margin",
                space={"optim.lr": RATE},
                label="margin (distance miner)",
            ),
            Row(
                "triplet",
                "revisiting:loss=triplet",
                space={"optim.lr": RATE, "loss.triplet.margin": Float(0.05, 0.5)},
                label="triplet (its reference miner)",
            ),
            Row(
                "R-margin",
                "revisiting:loss=margin,miner=rho_distance",
                space={"optim.lr": RATE, "miner.rho_distance.push_prob": Float(0.05, 0.4)},
                label="R-margin (rho-regularised)",
            ),
        ),
        data={"data.name": "glyphs", "data.val_fraction": 0.15},
        common={"train.epochs": 10, "eval.every_epochs": 1},
        budget=8,
        looks=(5, 10),
        claims=(
            Claim("margin beats triplet", "margin", "triplet", paper="Revisiting, Tab. 2"),
            Claim(
                "rho-regularisation improves margin",
                "R-margin",
                "margin",
                paper="Revisiting, Sec. 5",
            ),
        ),
    )
