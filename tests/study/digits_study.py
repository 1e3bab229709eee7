"""The tests' study: margin against triplet on scikit-learn's digits, 2 candidates per row, 2
seeds in one look, 1 epoch of a tiny network (``python -m jdml study run
tests/study/digits_study.py:<digits.npz> --dir DIR``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from jdml.study import Choice, Claim, Row, Study
from tests.helpers import TINY_OVERRIDES


def get_study(npz: str) -> Study:
    common = {k: v for k, v in TINY_OVERRIDES.items() if not k.startswith("data.")}
    common.update({"train.epochs": 1, "eval.train_metrics": (), "train.tensorboard": False})
    data = {k: v for k, v in TINY_OVERRIDES.items() if k.startswith("data.")}
    data.update({"data.path": npz, "data.val_fraction": 0.3})
    rates = Choice((1e-3, 3e-3))
    return Study(
        name="digits: margin against triplet",
        rows=(
            Row("margin", "revisiting:loss=margin", space={"optim.lr": rates}),
            Row("triplet", "revisiting:loss=triplet", space={"optim.lr": rates}),
        ),
        data=data,
        common=common,
        budget=2,
        looks=(2,),
        claims=(
            Claim("triplet beats margin", "triplet", "margin", effect=1.0, source="a test"),
            Claim("margin beats the pixels", "margin", "", family=False, fixed="pixels"),
        ),
    )
