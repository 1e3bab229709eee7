"""The visualisation layer: retrieval grids, 2-D projections, embedding maps, training curves,
spectra and the self-contained HTML report (numpy and matplotlib only, no JAX)."""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

from jdml.visualize import (
    embedding_map,
    embedding_maps,
    embedding_maps_size,
    html_report,
    project_2d,
    retrieval_grid,
    retrieval_grid_size,
    spectrum_plot,
    training_curves,
)

VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source"}


def _png_size(path: str) -> tuple[int, int]:
    """Asserts ``path`` is a non-empty PNG and returns its (width, height)."""
    assert os.path.getsize(path) > 0
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def _no_temporaries(folder) -> None:
    """Asserts no temporary file of an atomic write is left in ``folder``."""
    assert not [name for name in os.listdir(folder) if ".tmp" in name]


# ---------------------------------------------------------------------------------------------
# Retrieval grid
# ---------------------------------------------------------------------------------------------


def _grid_inputs(q: int, k: int, channels: int, dtype: str):
    rng = np.random.default_rng(0)
    if dtype == "uint8":
        queries = rng.integers(0, 256, (q, 20, 24, channels), dtype=np.uint8)
        neighbours = rng.integers(0, 256, (q, k, 20, 24, channels), dtype=np.uint8)
    else:
        queries = rng.random((q, 20, 24, channels), dtype=np.float32)
        neighbours = rng.random((q, k, 20, 24, channels), dtype=np.float32)
    correct = rng.random((q, k)) > 0.5
    return queries, neighbours, correct


@pytest.mark.parametrize(
    ("channels", "dtype"), [(1, "uint8"), (3, "uint8"), (1, "float32"), (3, "float64")]
)
def test_retrieval_grid_writes_png_of_documented_size(tmp_path, channels, dtype):
    queries, neighbours, correct = _grid_inputs(2, 3, channels, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a glyph missing from the font
        path = retrieval_grid(
            queries,
            neighbours,
            correct,
            tmp_path / "grid.png",
            query_labels=[0, 1],
            neighbour_labels=[[0, 1, 2], [1, 1, 7]],
            class_names=["alpha", "beta", "a rather long class name"],
            title="Nearest neighbours",
        )
    assert path == str(tmp_path / "grid.png")
    assert (
        _png_size(path)
        == (110 * 4 + 16, 22 + 130 * 2 + 30)
        == retrieval_grid_size(2, 3, title=True)
    )
    _no_temporaries(tmp_path)


def test_retrieval_grid_without_labels_or_title(tmp_path):
    queries, neighbours, correct = _grid_inputs(3, 5, 1, "float32")
    path = retrieval_grid(queries, neighbours, correct, tmp_path / "sub" / "grid.png")
    assert _png_size(path) == (110 * 6 + 16, 22 + 130 * 3) == retrieval_grid_size(3, 5)


def test_retrieval_grid_images_look_right(tmp_path):
    """The query frame is blue, a correct neighbour's green, a wrong one's red."""
    queries = np.full((1, 16, 16, 3), 255, np.uint8)
    neighbours = np.full((1, 2, 16, 16, 3), 255, np.uint8)
    path = retrieval_grid(queries, neighbours, [[True, False]], tmp_path / "g.png")
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB")).astype(int)
    top = 22 + 4 + 1  # header, cell padding, inside the 3 px frame line
    for left, colour in [(7, (31, 119, 180)), (126 + 7, (44, 160, 44)), (236 + 7, (214, 39, 40))]:
        assert np.abs(pixels[top + 40, left] - colour).max() < 40, (left, pixels[top + 40, left])


@pytest.mark.parametrize(
    ("queries", "neighbours", "correct", "kwargs", "message"),
    [
        ((2, 8, 8), (2, 3, 8, 8, 1), (2, 3), {}, "query_images must have shape"),
        ((2, 8, 8, 2), (2, 3, 8, 8, 2), (2, 3), {}, "C = 1 or 3"),
        ((2, 8, 8, 1), (3, 3, 8, 8, 1), (2, 3), {}, r"neighbour_images must have shape"),
        ((2, 8, 8, 1), (2, 3, 8, 8), (2, 3), {}, r"neighbour_images must have shape"),
        ((2, 8, 8, 1), (2, 3, 9, 8, 1), (2, 3), {}, r"query images' shape"),
        ((2, 8, 8, 1), (2, 3, 8, 8, 1), (3, 2), {}, r"correct must have shape \(Q, K\) = \(2, 3\)"),
        ((2, 8, 8, 1), (2, 3, 8, 8, 1), (2, 3), {"query_labels": [1]}, "query_labels"),
        ((2, 8, 8, 1), (2, 3, 8, 8, 1), (2, 3), {"neighbour_labels": [1, 2]}, "neighbour_labels"),
    ],
)
def test_retrieval_grid_shape_errors(tmp_path, queries, neighbours, correct, kwargs, message):
    with pytest.raises(ValueError, match=message):
        retrieval_grid(
            np.zeros(queries, np.float32),
            np.zeros(neighbours, np.float32),
            np.zeros(correct, bool),
            tmp_path / "g.png",
            **kwargs,
        )
    assert not os.path.exists(tmp_path / "g.png")


def test_retrieval_grid_value_errors(tmp_path):
    queries, neighbours, correct = _grid_inputs(1, 2, 3, "float32")
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        retrieval_grid(queries * 2 - 1, neighbours, correct, tmp_path / "g.png")
    with pytest.raises(ValueError, match="uint8"):
        retrieval_grid(queries.astype(np.int64), neighbours, correct, tmp_path / "g.png")


# ---------------------------------------------------------------------------------------------
# Projections and embedding maps
# ---------------------------------------------------------------------------------------------


def _clustered(n: int, classes: int, dim: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % classes
    centres = rng.normal(size=(classes, dim)) * 4
    return (centres[labels] + rng.normal(size=(n, dim))).astype(np.float32), labels


def test_project_2d_methods():
    x, _ = _clustered(40, 4)
    points, used = project_2d(x, method="pca")
    assert used == "pca" and points.shape == (40, 2)
    np.testing.assert_array_equal(points, project_2d(x, method="pca")[0])  # deterministic
    np.testing.assert_allclose(points.mean(0), 0.0, atol=1e-6)

    points, used = project_2d(x, method="tsne", seed=1)
    assert used == "tsne" and points.shape == (40, 2) and np.isfinite(points).all()

    big = np.random.default_rng(0).normal(size=(5001, 3))
    umap_installed = importlib.util.find_spec("umap") is not None
    assert project_2d(x[:3])[1] == "pca"  # too few points for a neighbour embedding
    if umap_installed:
        assert project_2d(x, method="umap")[0].shape == (40, 2)
    else:
        assert project_2d(big)[1] == "pca"  # auto: t-SNE only up to 5000 points
        with pytest.raises(ImportError, match="pip install umap-learn"):
            project_2d(x, method="umap")

    with pytest.raises(ValueError, match="unknown projection method"):
        project_2d(x, method="mds")
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        project_2d(x[0])
    with pytest.raises(ValueError, match="NaN"):
        project_2d(np.full((5, 2), np.nan))


def test_project_2d_degenerate_inputs():
    assert project_2d(np.ones((1, 4)), method="pca")[0].shape == (1, 2)
    points, _ = project_2d(np.arange(6.0)[:, None], method="pca")  # D = 1
    assert points.shape == (6, 2) and np.all(points[:, 1] == 0)


def test_embedding_map_many_classes_and_names(tmp_path):
    x, labels = _clustered(300, 30)
    names = {i: f"class <{i}>" for i in range(30)}
    first = embedding_map(
        x, labels, tmp_path / "a.png", method="pca", max_points=120, class_names=names, title="T"
    )
    assert _png_size(first) == (800, 640)
    again = embedding_map(
        x, labels, tmp_path / "b.png", method="pca", max_points=120, class_names=names, title="T"
    )
    with open(first, "rb") as f, open(again, "rb") as g:
        assert f.read() == g.read()  # the subset and drawing order are deterministic
    _no_temporaries(tmp_path)


def test_embedding_map_legend_with_class_names(tmp_path):
    x, labels = _clustered(60, 5)
    path = embedding_map(
        x, labels, tmp_path / "m.png", class_names=["zero", "one", "two", "three", "four"]
    )  # auto: t-SNE (or UMAP when installed)
    assert _png_size(path) == (800, 640)
    with pytest.raises(ValueError, match="labels must have shape"):
        embedding_map(x, labels[:-1], tmp_path / "bad.png", method="pca")


def test_embedding_maps_panels(tmp_path):
    x, labels = _clustered(80, 5)
    heads = {"main": x, "member2": x[:, :4], "concat:1,1": np.concatenate([x, x], 1)}
    path = embedding_maps(heads, labels, tmp_path / "heads.png", method="pca", title="Heads")
    assert _png_size(path) == (3 * 420 + 180, 480) == embedding_maps_size(3, legend=True)

    x, labels = _clustered(80, 25)
    path = embedding_maps({"a": x, "b": x}, labels, tmp_path / "many.png", method="pca")
    assert _png_size(path) == (2 * 420, 480) == embedding_maps_size(2, legend=False)

    with pytest.raises(ValueError, match="empty"):
        embedding_maps({}, labels, tmp_path / "x.png")
    with pytest.raises(ValueError, match="'b'"):
        embedding_maps({"a": x, "b": x[:10]}, labels, tmp_path / "x.png", method="pca")


# ---------------------------------------------------------------------------------------------
# Metric records: training curves and spectra
# ---------------------------------------------------------------------------------------------


def _records() -> list[dict]:
    out = []
    for step in range(10, 101, 10):
        out.append(
            {
                "kind": "train",
                "step": step,
                "epoch": step / 50,
                "loss": 1.0 / step,
                "member1/loss": 0.8 / step,
                "mutual/loss": 0.01 / step,
                "mutual/weight": 2.0,
                "img_s": 1234.0,
                "valid_fraction": 0.9,
                "active_fraction": 0.5,
                "updated_fraction": 1.0,
            }
        )
    for step, recall in [(0, 0.3), (50, 0.7), (100, 0.8123)]:
        base = {"kind": "eval", "split": "test", "step": step, "epoch": step // 50}
        out.append(base | {"recall@1": recall, "map@r": recall / 2, "nmi": 0.6})
        out.append(base | {"embedding": "member2", "recall@1": recall - 0.05, "map@r": 0.3})
        out.append(
            {"kind": "eval", "split": "train", "step": step, "epoch": step // 50}
            | {"rho_spectrum@1": 1.3134}
        )
        spectrum = list(np.exp(-np.arange(16) * (0.1 + step / 200)))
        out.append(
            {"kind": "spectrum", "split": "train", "step": step, "epoch": step // 50}
            | {"spectrum": spectrum}
        )
    return out


def _write_metrics(path, records, malformed: bool = True) -> None:
    lines = [json.dumps(r) for r in records]
    if malformed:
        lines.insert(3, '{"kind": "train", "step": 35, "lo')  # a line cut short by a kill
        lines.insert(5, "[1, 2]")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def test_training_curves_from_file_with_malformed_lines(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write_metrics(metrics, _records())
    with pytest.warns(UserWarning, match="malformed|not an object") as caught:
        path = training_curves(metrics, tmp_path / "curves.png", metrics=("recall@1", "map@r"))
    messages = [str(w.message) for w in caught]
    assert any("metrics.jsonl:4: skipping malformed line" in m for m in messages), messages
    assert any("metrics.jsonl:6: skipping a line that is not an object" in m for m in messages)
    assert _png_size(path) == (1200, 450)
    _no_temporaries(tmp_path)


def test_training_curves_from_records_and_partial_data(tmp_path):
    records = _records()
    assert _png_size(training_curves(records, tmp_path / "a.png")) == (1200, 450)
    train_only = [r for r in records if r["kind"] == "train"]
    assert _png_size(training_curves(train_only, tmp_path / "b.png")) == (1200, 450)
    eval_only = [r for r in records if r["kind"] == "eval"]
    assert _png_size(training_curves(eval_only, tmp_path / "c.png", split="val")) == (1200, 450)
    with_nan = [*train_only, {"kind": "train", "step": 110, "loss": "nan", "aux_loss": -1.0}]
    assert _png_size(training_curves(with_nan, tmp_path / "d.png")) == (1200, 450)


def test_training_curves_errors(tmp_path):
    missing = tmp_path / "nope" / "metrics.jsonl"
    with pytest.raises(FileNotFoundError, match="nope"):
        training_curves(missing, tmp_path / "x.png")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.jsonl"):
        training_curves(empty, tmp_path / "x.png")
    with pytest.raises(ValueError, match="no metric records"):
        training_curves([], tmp_path / "x.png")
    assert not os.path.exists(tmp_path / "x.png")


def test_spectrum_plot(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write_metrics(metrics, _records(), malformed=False)
    path = spectrum_plot(metrics, tmp_path / "spectrum.png")
    assert _png_size(path) == (700, 450)
    one = [r for r in _records() if r["kind"] == "spectrum"][:1]
    assert _png_size(spectrum_plot(one, tmp_path / "one.png")) == (700, 450)
    with pytest.raises(ValueError, match="no 'spectrum' records for split 'test'"):
        spectrum_plot(metrics, tmp_path / "none.png", split="test")


# ---------------------------------------------------------------------------------------------
# HTML report
# ---------------------------------------------------------------------------------------------


class _TagChecker(HTMLParser):
    """Records unbalanced tags, images and every href/src of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.images: list[dict] = []
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [v for k, v in attrs.items() if k in ("href", "src") and v]
        if tag == "img":
            self.images.append(attrs)
        if tag not in VOID_TAGS:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()
        else:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")


def _write_run(workdir) -> None:
    os.makedirs(workdir)
    config = {
        "method": {"name": "dm2", "note": "<script>alert('x')</script> & more"},
        "loss": {"name": "triplet", "margin": 0.2},
        "seed": 0,
    }
    results = {
        "selection_split": "test",
        "selection_metric": "recall@1",
        "untrained": {"test": {"recall@1": 0.3, "map@r": 0.15}, "train": {"rho_spectrum@1": 1.7}},
        "final": {"step": 100, "test": {"recall@1": 0.8123, "map@r": 0.40615}},
        "best": {
            "step": 100,
            "epoch": 2,
            "test": {"recall@1": 0.8123, "map@r": 0.40615, "note": "text is skipped"},
            "train": {"rho_spectrum@1": 1.3134},
            "embeddings": {"test": {"member2": {"recall@1": 0.7623}}},
        },
        "train_step_compiles": 1,
    }
    evaluation = {
        "checkpoint": "best",
        "step": 100,
        "meta": {"epoch": 2, "recall@1": 0.8123, "split": "test"},
        "results": {"test": {"recall@1": 0.8123, "recall@2": 0.9001}},
        "embeddings": {"test": {"member2": {"recall@1": 0.7623}}},
        "spectra": {"train": [0.5, 0.3, 0.2]},
    }
    for name, data in [
        ("config.json", config),
        ("results.json", results),
        ("eval_best_step100.json", evaluation),
    ]:
        with open(os.path.join(workdir, name), "w") as f:
            json.dump(data, f)
    _write_metrics(os.path.join(workdir, "metrics.jsonl"), _records(), malformed=False)


def test_html_report_is_self_contained_and_escaped(tmp_path):
    workdir = tmp_path / "my_run"
    _write_run(workdir)
    queries, neighbours, correct = _grid_inputs(1, 2, 3, "uint8")
    grid = retrieval_grid(queries, neighbours, correct, tmp_path / "grid.png")

    path = html_report(workdir, images=[grid])
    assert path == os.path.join(workdir, "report.html")
    with open(path, encoding="utf-8") as f:
        page = f.read()

    checker = _TagChecker()
    checker.feed(page)
    checker.close()
    assert not checker.errors and not checker.stack, (checker.errors, checker.stack)
    assert len(checker.images) == 3  # training curves, spectrum, the grid
    assert all(img["src"].startswith("data:image/png;base64,") for img in checker.images)
    assert page.count('<img src="data:image/png;base64,') == 3
    assert all(link.startswith("data:") for link in checker.links)
    assert "http://" not in page and "https://" not in page

    assert "<title>my_run report</title>" in page and "<h1>my_run</h1>" in page
    for key in ("method", "loss", "triplet", "margin", "seed"):
        assert f"&quot;{key}&quot;" in page
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page
    assert "81.23" in page and "40.62" in page and "76.23" in page  # recall@1, map@r in percent
    assert "1.3134" in page and "1.7000" in page  # rho as is
    assert "90.01" in page and "eval_best_step100.json" in page
    assert "best (step 100, epoch 2)" in page
    assert "text is skipped" not in page

    assert _png_size(workdir / "figures" / "training_curves.png") == (1200, 450)
    assert _png_size(workdir / "figures" / "spectrum_train.png") == (700, 450)
    _no_temporaries(workdir)


def test_html_report_out_and_missing_files(tmp_path):
    workdir = tmp_path / "bare"
    workdir.mkdir()
    out = html_report(workdir, out=tmp_path / "elsewhere" / "r.html", figures_dir=tmp_path / "f")
    with open(out, encoding="utf-8") as f:
        page = f.read()
    assert "config.json not found" in page and "results.json not found" in page
    assert "metrics file not found" in page
    assert not os.path.exists(workdir / "report.html")
    with pytest.raises(FileNotFoundError, match=r"missing\.png"):
        html_report(workdir, images=[tmp_path / "missing.png"])
    with pytest.raises(FileNotFoundError, match="run directory"):
        html_report(tmp_path / "no_such_run")
