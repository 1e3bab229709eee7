"""Prints the parity tables of the vision transformers and the modern losses: how far jdml is from
the implementations a user would otherwise run, on the committed fixtures.

* ViT against timm: the features of small random timm models (``tools/make_vit_golden.py``),
  read from their weight files through ``model.pretrained``'s loader, against timm's features
  on the same input: both file formats, timm's and DINOv2's layouts, both poolings, the native
  input size and a resampled one.
* Losses against float64 NumPy: each loss's value and gradients against a NumPy computation
  over explicit tuples (the gradients against its central finite differences).
* Losses against pytorch-metric-learning 2.9.0 (``tools/make_pml_fixtures.py``): the value and
  the gradients of the embeddings and of the loss's own parameters.

Each entry is the largest absolute difference over the largest absolute reference value, doubled
(a margin for another CPU's rounding), at least float32's machine epsilon where it is not exact
(another CPU kind moves a product by an ulp: the sub-center ArcFace value measured 9.9e-8 on an
AVX-512 AMD EPYC, at most 1.5e-8 on the Intel Xeon that wrote the page) and rounded up to one
significant digit: a bound that ``tests/test_parity_page.py`` checks against the measurement it
makes again. The tests use 1e-5
as their tolerance.

Usage: python bench/parity.py
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.losses import test_losses_modern as losses  # noqa: E402  (the NumPy references)
from tests.models import test_vit as vit  # noqa: E402

#: (row label, weight file stem, architecture, reference features stem).
VIT_CASES = (
    ("timm layout, 32 px (native)", "plain", vit.PLAIN, "plain"),
    ("timm layout, 48 px (positions resampled)", "plain", vit.PLAIN, "plain_48"),
    ("DINOv2 with registers, timm's layout", "dinov2_reg", vit.DINOV2_REG, "dinov2_reg"),
    ("DINOv2 with registers, DINOv2's layout", "dinov2_reg_original", vit.DINOV2_REG, "dinov2_reg"),
)
PML_LOSSES = ("proxyanchor", "supcon", "ntxent", "circle", "cosface", "subcenter_arcface")


def relative(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|."""
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def bound(value: float) -> str:
    """Twice ``value``, at least float32's epsilon, rounded up to one significant digit, as
    ``3e-07`` (``0`` for an exact match)."""
    if value == 0.0:
        return "0"
    value = max(2.0 * value, float(np.finfo(np.float32).eps))
    exponent = math.floor(math.log10(value))
    digit = math.ceil(round(value / 10.0**exponent, 9))
    if digit == 10:
        digit, exponent = 1, exponent + 1
    return f"{digit}e{exponent:03d}"


def vit_rows() -> list[tuple[str, str, str, float]]:
    """(case, file format, pooling, relative error) of every ViT fixture."""
    rows = []
    for label, stem, arch, expected in VIT_CASES:
        with np.load(os.path.join(vit.DATA, f"{expected}.npz")) as f:
            x, reference = f["x"], {p: f[p] for p in ("token", "avg")}
        for fmt in ("safetensors", "pth"):
            for pooling in ("token", "avg"):
                got = vit._features(arch, f"{stem}.{fmt}", x, pooling)
                rows.append((label, fmt, pooling, relative(got, reference[pooling])))
    return rows


def numpy_rows() -> list[tuple[str, float, float]]:
    """(loss, value error, embedding-gradient error) against the float64 NumPy references."""
    x, labels = losses.X, losses.LABELS
    cases = [
        ("supcon", {}, lambda v: losses.np_supcon(v, labels)),
        ("ntxent", {}, lambda v: losses.np_ntxent(v, labels)),
        ("circle (gamma 4)", {"gamma": 4.0}, None),
    ]
    rows = []
    for name, kwargs, reference in cases:
        loss = name.split(" ")[0]
        value, g_x, _ = losses._jdml(loss, x, labels, **kwargs)
        if loss == "circle":  # its weights are constants of the gradient (taken at x)
            want = losses.np_circle(x, labels, gamma=4.0)
            numeric = losses._numeric_grad(lambda v: losses._np_circle(v, labels, 0.4, 4.0, x), x)
        else:
            want, numeric = reference(x), losses._numeric_grad(reference, x)
        rows.append((name, abs(value - want) / abs(want), relative(g_x, numeric)))
    value, g_x, _ = losses._jdml("proxyanchor", x, labels, losses.PROXIES, num_classes=5)
    reference = losses.np_proxyanchor(x, labels, losses.PROXIES)
    numeric = losses._numeric_grad(lambda v: losses.np_proxyanchor(v, labels, losses.PROXIES), x)
    rows.append(("proxyanchor", abs(value - reference) / abs(reference), relative(g_x, numeric)))
    for name, reference, class_rows in (
        ("cosface", losses.np_cosface, 5),
        ("subcenter_arcface", losses.np_subcenter_arcface, 15),
    ):
        w = np.random.default_rng(9).standard_normal((class_rows, 4))
        value, g_x, _ = losses._jdml(name, x, labels, w, num_classes=5, scale=4.0)
        want = reference(x, labels, w, scale=4.0)
        numeric = losses._numeric_grad(lambda v, r=reference, w=w: r(v, labels, w, scale=4.0), x)
        rows.append((f"{name} (scale 4)", abs(value - want) / abs(want), relative(g_x, numeric)))
    for classes, views in ((4, 2), (3, 3), (2, 4)):
        xs = np.random.default_rng(classes * 10 + views).standard_normal((classes * views, 5))
        ys = np.repeat(np.arange(classes), views)
        value, g_x, _ = losses._jdml("ntxent", xs, ys, slot_pairs=True)

        def reference(v, classes=classes, views=views):
            return losses.np_hypvit_sphere(v, classes, views)

        want = reference(xs)
        name = f"ntxent slot_pairs ({classes} classes x {views} views; Hyp-ViT's loop)"
        rows.append(
            (
                name,
                abs(value - want) / abs(want),
                relative(g_x, losses._numeric_grad(reference, xs)),
            )
        )
    return rows


def pml_rows() -> list[tuple[str, float, float, float | None]]:
    """(loss, value error, embedding-gradient error, parameter-gradient error or None) against
    pytorch-metric-learning's recorded values."""
    with np.load(losses.PML) as f:
        fixture = {k: f[k] for k in f.files}
    rows = []
    for name in PML_LOSSES:
        weights = {
            "proxyanchor": fixture["proxies"],
            "cosface": fixture.get("cosface:class_map"),
            "subcenter_arcface": fixture.get("subcenter_arcface:class_map"),
        }.get(name)
        kwargs = {"proxyanchor": {"num_classes": 5}, **losses.CLASS_MAPS}.get(name, {})
        value, g_x, g_w = losses._jdml(name, fixture["x"], fixture["labels"], weights, **kwargs)
        want = float(fixture[f"{name}:loss"])
        params = None if g_w is None else relative(g_w, fixture[f"{name}:grad_params"])
        rows.append(
            (name, abs(value - want) / abs(want), relative(g_x, fixture[f"{name}:grad_x"]), params)
        )
    return rows


def tables(fmt=bound) -> str:
    """The three tables as Markdown, each difference written by ``fmt`` (default: its bound)."""
    lines = ["ViT features against timm 1.0.31 (small random models, float32):", ""]
    lines += ["| case | file | pooling | max relative difference |", "|---|---|---|---|"]
    for case, fmt_name, pooling, err in vit_rows():
        lines.append(f"| {case} | `.{fmt_name}` | {pooling} | {fmt(err)} |")
    lines += ["", "Losses against float64 NumPy over explicit tuples (gradients: central"]
    lines += ["differences):", ""]
    lines += ["| loss | value | gradient of the embeddings |", "|---|---|---|"]
    for name, value, grad in numpy_rows():
        lines.append(f"| {name} | {fmt(value)} | {fmt(grad)} |")
    lines += ["", "Losses against pytorch-metric-learning 2.9.0 (where its defaults differ from"]
    lines += ["the papers: the losses table of the usage page):", ""]
    lines += ["| loss | value | gradient of the embeddings | gradient of its parameters |"]
    lines += ["|---|---|---|---|"]
    for name, value, grad, params in pml_rows():
        third = "-" if params is None else fmt(params)
        lines.append(f"| {name} | {fmt(value)} | {fmt(grad)} | {third} |")
    return "\n".join(lines)


def main() -> None:
    print(tables())


if __name__ == "__main__":
    main()
