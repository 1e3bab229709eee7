"""Using trained models: ``jdml.load``, embed -> index -> search, the incompatible-index error,
the ``jdml embed / search / look`` commands, and the Python example of docs/usage.md."""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest
from PIL import Image

import jdml
from jdml.__main__ import main as jdml_main
from jdml.checkpoint import Checkpoints
from jdml.data.loading import load_splits
from jdml.errors import ConfigError, IndexFileError, IndexMismatchError
from jdml.evaluation.embeddings import combine_heads, evaluate_embeddings
from jdml.inference import Index
from jdml.trainer import train_and_evaluate
from jdml.visualize import retrieval_grid_size
from tests.helpers import REPO, make_npz, tiny_config


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "bars.npz"))


@pytest.fixture(scope="module")
def run_dir(npz, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("run") / "tiny")
    train_and_evaluate(tiny_config(npz), workdir)
    return workdir


@pytest.fixture(scope="module")
def model(run_dir):
    return jdml.load(run_dir)


@pytest.fixture(scope="module")
def test_split(model):
    return load_splits(model.config.data)["test"]


@pytest.fixture(scope="module")
def image_tree(test_split, tmp_path_factory):
    """The test split as a folder of class folders of PNG files."""
    root = tmp_path_factory.mktemp("tree")
    for i, (image, label) in enumerate(zip(test_split.images, test_split.labels, strict=True)):
        folder = root / test_split.class_names[label]
        folder.mkdir(exist_ok=True)
        Image.fromarray(image[..., 0]).save(folder / f"{i:03d}.png")
    return root


def test_embeddings_match_the_training_evaluation(model, run_dir, test_split):
    """The loaded model embeds the test split exactly as training evaluated it."""
    with open(f"{run_dir}/results.json") as f:
        best = json.load(f)["best"]
    assert model.step == best["step"]
    embeddings = model.embed_set(test_split, batch_size=32)[model.embedding]
    got = evaluate_embeddings(embeddings, test_split.labels, ["recall@1", "map@r"])
    assert got == pytest.approx({k: best["test"][k] for k in got}, abs=1e-6)
    # Arrays in, the same embeddings out (uint8 or float, any batch size).
    direct = model.embed(test_split.images, batch_size=7)
    np.testing.assert_allclose(direct, embeddings, atol=1e-5)


def test_index_round_trip_finds_the_query_first(model, test_split, tmp_path):
    index = model.index(test_split.images, labels=test_split.labels)
    path = tmp_path / "index.npz"
    index.save(path)
    loaded = Index.load(path)
    np.testing.assert_array_equal(loaded.embeddings, index.embeddings)
    assert loaded.fingerprint == model.fingerprint and loaded.names[3] == "#3"
    hits = loaded.search(
        model.embed(test_split.images[[3, 17]]), k=4, fingerprint=model.fingerprint
    )
    assert [row[0].index for row in hits] == [3, 17]
    assert all(row[0].distance < 1e-3 for row in hits)
    assert [h.rank for h in hits[0]] == [1, 2, 3, 4]
    assert all(a.distance <= b.distance for a, b in zip(hits[0], hits[0][1:], strict=False))


def test_an_index_refuses_queries_of_another_checkpoint_or_embedding(model, run_dir, test_split):
    index = model.index(test_split.images[:20])
    ckpts = Checkpoints(run_dir)
    try:
        other_step = next(s for s in ckpts.steps("latest") if s != model.step)
    finally:
        ckpts.close()
    other = jdml.load(run_dir, checkpoint=other_step)
    with pytest.raises(IndexMismatchError, match=r"their weights differ.*rebuild the index"):
        index.search(other.embed(test_split.images[:2]), fingerprint=other.fingerprint)
    with pytest.raises(IndexMismatchError, match="do not match"):
        index.search(np.zeros((1, 3), np.float32))


def test_index_file_errors(tmp_path):
    with pytest.raises(IndexFileError, match="no index file"):
        Index.load(tmp_path / "missing.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not an npz")
    with pytest.raises(IndexFileError, match="not a readable jdml index"):
        Index.load(garbage)


def test_a_loaded_model_builds_no_method_losses_or_class_counts(run_dir, monkeypatch):
    """Inference builds the run's networks alone (``jdml.build.build_embeddings``): no
    training ``Method``, no loss, no class count (issue 81)."""
    from jdml.methods import method as method_module

    def refuse(*args, **kwargs):
        raise AssertionError("inference built a training Method")

    monkeypatch.setattr(method_module.Method, "__init__", refuse)
    model = jdml.load(run_dir)
    assert model.heads == ("discriminative",)
    assert set(model._params) == {"model"}  # the network's params only, no loss params


def test_unknown_embedding_lists_the_choices(run_dir):
    with pytest.raises(
        ConfigError, match="unknown embedding 'nope'; choose one of: discriminative"
    ):
        jdml.load(run_dir, embedding="nope")


def test_embed_and_search_commands(run_dir, image_tree, tmp_path, capsys):
    index_path = tmp_path / "tree_index.npz"
    jdml_main(["embed", run_dir, str(image_tree), "--out", str(index_path), "--batch-size", "16"])
    index = Index.load(index_path)
    files = sorted(image_tree.rglob("*.png"))
    assert len(index) == len(files) and index.class_names == tuple(
        sorted(p.name for p in image_tree.iterdir())
    )
    query = str(files[5])
    out_json = tmp_path / "hits.json"
    jdml_main(["search", str(index_path), query, "-k", "3", "--json", str(out_json)])
    printed = capsys.readouterr().out
    assert f"query {query}" in printed
    results = json.loads(out_json.read_text())["results"]
    first = results[0]["neighbours"][0]
    assert first["name"] == query and first["rank"] == 1 and first["distance"] < 1e-3
    assert first["class_name"] == files[5].parent.name
    # Queries embedded by another checkpoint are refused with exit status 2.
    with pytest.raises(SystemExit) as exit_info:
        jdml_main(["search", str(index_path), query, "--checkpoint", "latest", "--embedding", "x"])
    assert exit_info.value.code == 2
    assert "unknown embedding 'x'" in capsys.readouterr().err


def test_look_writes_the_pictures_and_the_report(run_dir, tmp_path, capsys):
    out = tmp_path / "look"
    jdml_main(["look", run_dir, "--out", str(out), "--queries", "3", "-k", "4", "--method", "pca"])
    assert "report.html" in capsys.readouterr().out
    sizes = {
        "retrieval_grid.png": retrieval_grid_size(3, 4, title=True),
        "embedding_map.png": (800, 640),
        "training_curves.png": (1200, 450),
    }
    for name, size in sizes.items():
        with Image.open(out / name) as image:
            assert image.size == size, name
    html = (out / "report.html").read_text()
    assert html.count('<img src="data:image/png;base64,') >= 3
    with pytest.raises(SystemExit) as exit_info:
        jdml_main(["look", run_dir, "--split", "val"])
    assert exit_info.value.code == 2
    assert "split 'val' does not exist for this run" in capsys.readouterr().err


def test_documented_python_example_runs(run_dir, capsys):
    """The Python example of docs/usage.md, run as written on a trained glyph-like run."""
    with open(f"{REPO}/docs/usage.md") as f:
        page = f.read()
    section = page.split("## Using a trained model", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'workdir = "runs/glyphs"' in code
    code = code.replace('workdir = "runs/glyphs"', f"workdir = {run_dir!r}")
    exec(compile(code, "docs/usage.md", "exec"), {})
    assert "nearest" in capsys.readouterr().out


@pytest.mark.slow
def test_cohort_ensemble_is_the_members_concatenation(npz, tmp_path):
    workdir = str(tmp_path / "cohort")
    config = tiny_config(npz, **{"cohort.size": 2, "train.epochs": 1, "eval.at_start": False})
    train_and_evaluate(config, workdir)
    member = jdml.load(workdir)
    ensemble = jdml.load(workdir, embedding="ensemble")
    assert member.heads == ("member1", "member2") and member.embedding == "member1"
    images = load_splits(member.config.data)["test"].images
    all_embeddings = member.embed_all(images)
    np.testing.assert_allclose(
        ensemble.embed(images),
        combine_heads(all_embeddings, {"member1": 1.0, "member2": 1.0}),
        atol=1e-6,
    )
    assert ensemble.fingerprint["weights"] == member.fingerprint["weights"]
    out = str(tmp_path / "ensemble.jaxexp")
    ensemble.export(out)  # the exported ensemble: every member, concatenated
    exported = jax.export.deserialize(bytearray((tmp_path / "ensemble.jaxexp").read_bytes()))
    np.testing.assert_allclose(
        exported.call(images.astype(np.float32) / 255.0), ensemble.embed(images), atol=1e-6
    )
    index = member.index(images)
    with pytest.raises(IndexMismatchError, match="their embedding differ"):
        index.search(ensemble.embed(images[:1]), fingerprint=ensemble.fingerprint)


@pytest.mark.smoke
def test_export_runs_with_only_jax_and_numpy(model, run_dir, test_split, tmp_path, capsys):
    """``jdml export``: the serialized embedding function reproduces ``jdml.load(...).embed``
    on the test split to 1e-6, for any batch size, in a process that imports only jax and
    numpy."""
    import subprocess
    import sys

    out = str(tmp_path / "model.jaxexp")
    jdml_main(["export", run_dir, "--out", out])
    assert "wrote" in capsys.readouterr().out
    with open(out + ".json") as f:
        info = json.load(f)
    assert info["platforms"] == ["cpu"] and info["embedding"] == model.embedding
    images = test_split.images.astype(np.float32) / 255.0
    np.save(tmp_path / "images.npy", images)
    script = f"""
import sys
import jax, numpy as np
exported = jax.export.deserialize(bytearray(open({out!r}, "rb").read()))
images = np.load({str(tmp_path / "images.npy")!r})
parts = [np.asarray(exported.call(images[:7])), np.asarray(exported.call(images[7:]))]
np.save({str(tmp_path / "out.npy")!r}, np.concatenate(parts))
assert not any(m == "jdml" or m.startswith("jdml.") for m in sys.modules), "jdml imported"
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=str(tmp_path)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(got, model.embed(test_split.images), rtol=1e-6, atol=1e-6)


def test_export_refuses_an_unknown_platform(run_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        jdml_main(["export", run_dir, "--out", str(tmp_path / "m"), "--platforms", "cpu,gpu"])
    assert e.value.code != 0
    assert "unknown platform(s) ['gpu']" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda x: x.astype(np.int64), r"dtype int64: pass uint8 levels 0\.\.255"),
        (lambda x: x.astype(np.uint16), r"dtype uint16"),
        (lambda x: x.astype(np.float32), r"must lie in \[0, 1\], these span \[0, 255\]"),
        (lambda x: x.astype(np.float64) / 255 - 0.5, r"span \[-0\.5, 0\.5\]"),
        (lambda x: np.full(x.shape, np.nan, np.float32), r"span \[nan, nan\]"),
        (lambda x: x[:0], r"no images to embed"),
    ],
)  # fmt: skip
def test_embed_refuses_images_it_would_misread(model, test_split, make, message):
    """``Model.embed`` takes uint8 levels or floats in [0, 1], as the CLI does: anything else
    (levels in another dtype, floats in 0..255, an empty batch) is one DataError."""
    from jdml.errors import DataError

    images = test_split.images[:4]
    want = model.embed(images)
    np.testing.assert_array_equal(model.embed(images.astype(np.float32) / 255.0), want)
    with pytest.raises(DataError, match=message):
        model.embed(make(images))
    with pytest.raises(DataError, match="no images to embed"):
        model.embed([])


def test_embed_takes_jax_arrays_as_arrays(model, test_split):
    """A JAX array (the natural input in one's own loop) is images, not a list of file names:
    the same embeddings as the NumPy array, the same dtype rules, and ``#<i>`` names in an
    index."""
    import jax.numpy as jnp

    from jdml.errors import DataError

    images = test_split.images[:4]
    want = model.embed(images)
    np.testing.assert_array_equal(model.embed(jnp.asarray(images)), want)
    floats = jnp.asarray(images, jnp.float32) / 255.0
    np.testing.assert_array_equal(model.embed(floats), model.embed(np.asarray(floats)))
    with pytest.raises(DataError, match=r"span \[0, 255\]"):
        model.embed(jnp.asarray(images, jnp.float32))
    assert model.index(jnp.asarray(images)).names == ("#0", "#1", "#2", "#3")


def test_a_folder_among_the_files_to_embed_is_named_as_one(model, tmp_path):
    """``Model.embed([a folder])`` says that it is a folder and what to give instead, never
    "fix or delete the file"."""
    from jdml.errors import DataError

    with pytest.raises(DataError, match=r"is a folder, not an image file: give the image files"):
        model.embed([str(tmp_path)])


def test_the_load_example_runs_on_a_trained_run(run_dir):
    """``jdml.load``'s docstring example, with ``workdir`` this module's run."""
    from tests.test_doctests import run_examples

    assert run_examples(jdml.load, {"workdir": run_dir}).failed == 0
