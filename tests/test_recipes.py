"""The published ViT recipe (configs/recipes.py): its settings per dataset, the weights it needs,
and a tiny run of it end to end on a CUB tree, from a DINO-style weight file, evaluated once."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from configs.recipes import RECIPES, get_config
from jdml.config import set_keys, validate
from jdml.errors import ConfigError
from jdml.fileio import read_jsonl
from jdml.run import Run
from jdml.trainer import train_and_evaluate
from tests import benchmark_trees as trees
from tests.helpers import REPO, restore_latest

# (data, samples per class, batch, epochs, evaluation resize): the recipe's commands.
SETTINGS = [
    ("cub200", 9, 900, 50, 256),
    ("cars196", 9, 882, 300, 224),
    ("sop", 2, 900, 200, 224),
    ("inshop", 2, 900, 400, 224),
]


@pytest.mark.parametrize("data, images, batch, epochs, resize", SETTINGS)
def test_the_recipe_per_dataset(data, images, batch, epochs, resize):
    c = get_config(f"recipe=hyp_vit_sphere,data={data}")
    assert (c.data.name, c.sampler.samples_per_class, c.train.batch_size) == (data, images, batch)
    assert (c.train.epochs, c.eval.every_epochs, c.data.resize) == (epochs, epochs, resize)
    assert c.model.backbone == "vit_s16" and c.model.embed_dim == 384
    assert c.model.frozen_stages == 0 and c.model.head_init == "orthogonal"
    assert c.loss.name == "ntxent" and c.loss.ntxent.slot_pairs and c.loss.ntxent.temperature == 0.1
    assert (c.optim.name, c.optim.lr, c.optim.weight_decay, c.optim.clip_norm) == (
        "adamw",
        1e-5,
        0.01,
        3.0,
    )
    assert c.data.augment == "vit" and c.data.eval_interpolation == "bicubic"
    assert c.data.val_fraction == 0.0 and not c.eval.at_start
    assert set(RECIPES["hyp_vit_sphere"].reported[data]) == {
        int(m.split("@")[1]) for m in c.eval.metrics if m.startswith("recall@")
    }
    with pytest.raises(ConfigError, match=r"--config\.model\.pretrained=<path>"):
        validate(c)


def test_unknown_recipe_dataset_or_argument_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown recipe 'hyp'; choose one of: hyp_vit_sphere"):
        get_config("recipe=hyp")
    with pytest.raises(ConfigError, match="no settings for data=glyphs; choose one of: cub200"):
        get_config("data=glyphs")
    with pytest.raises(ConfigError, match=r"unknown config argument\(s\) \['loss'\]"):
        get_config("loss=margin")


@pytest.mark.slow
def test_a_tiny_run_of_the_recipe_end_to_end(tmp_path):
    """The recipe with its network shrunk (a 2-block ViT from a timm weight file whose 32 px
    positions are resampled to 16 px) on 4 CUB training classes of 4 photos: batches of distinct
    classes (2 steps an epoch), the bicubic views, the frozen patch embedding, one evaluation
    after the last epoch."""
    root = trees.write_cub(tmp_path, class_ids=(97, 98, 99, 100, 101, 102), per_class=4)
    c = get_config("recipe=hyp_vit_sphere,data=cub200")
    set_keys(
        c,
        {
            "data.path": str(root),
            "data.verify_counts": False,
            "data.image_size": 16,
            "data.resize": 20,
            "data.num_threads": 1,
            "model.backbone": "vit",
            "model.vit.patch": 8,
            "model.vit.dim": 24,
            "model.vit.depth": 2,
            "model.vit.heads": 2,
            "model.embed_dim": 24,
            "model.pretrained": os.path.join(REPO, "tests/golden/backbones/vit/plain.pth"),
            "sampler.samples_per_class": 2,
            "train.batch_size": 4,
            "train.epochs": 2,
            "train.progress_bar": False,
            "eval.every_epochs": 2,
            "eval.batch_size": 8,
        },
    )
    validate(c)
    workdir = tmp_path / "run"
    train_and_evaluate(c, str(workdir))
    records = read_jsonl(str(workdir / "metrics.jsonl"))
    steps = [r["step"] for r in records if "loss" in r]
    assert max(steps) == 4  # 4 classes / 2 per batch: 2 steps an epoch, 2 epochs
    evaluations = [r for r in records if r.get("split") == "test" and "recall@1" in r]
    assert [r["step"] for r in evaluations] == [4]  # once, after the last epoch
    assert 0.0 <= evaluations[0]["recall@1"] <= 1.0
    assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)
    with open(workdir / "config.json") as f:
        assert json.load(f)["loss"]["ntxent"]["slot_pairs"] is True
    # The patch embedding kept the file's weights; the blocks and the head trained.
    run = Run(c)
    start = jax.tree.map(np.asarray, run.initial_state.params["model"])
    end = restore_latest(str(workdir), run).params["model"]
    for name, moved in (("patch_embed_proj", False), ("blocks_1", True)):
        before, after = start["backbone"][name], end["backbone"][name]
        pairs = zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
        assert any(not np.array_equal(a, b) for a, b in pairs) == moved, name
    kernel = start["head_discriminative"]["kernel"]
    np.testing.assert_allclose(kernel.T @ kernel, np.eye(24), atol=1e-5)  # orthogonal at start


def test_the_datasets_page_quotes_the_recipe_as_configured():
    """docs/datasets.md's table of the recipe: each row's batch, epochs and reported Recall@k are
    the ones configs/recipes.py holds."""
    with open(os.path.join(REPO, "docs", "datasets.md")) as f:
        text = f.read()
    section = text[text.index("### A published ViT recipe") :]
    recipe = RECIPES["hyp_vit_sphere"]
    for data, images, batch, epochs, _ in SETTINGS:
        [row] = [
            line for line in section.splitlines() if line.startswith("| ") and f"`{data}`" in line
        ]
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        classes = batch // images
        assert cells[2] == f"{batch} ({classes} x {images})" and cells[3] == str(epochs), row
        quoted = ", ".join(f"R@{k} {v}" for k, v in recipe.reported[data].items())
        assert cells[4] == quoted, row
