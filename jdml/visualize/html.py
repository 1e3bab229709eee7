"""A single self-contained HTML page about one training run.

The page holds the run's config, its results (``results.json``) and checkpoint evaluations
(``eval_*.json`` written by eval.py), and pictures: the training curves and singular-value
spectra drawn from ``metrics.jsonl`` plus any PNGs the caller passes (e.g. a retrieval grid or
an embedding map). It works offline: no external CSS, scripts or fonts, PNGs are embedded as
base64 data URIs, and every text from the run is HTML-escaped.
"""

from __future__ import annotations

import base64
import glob
import html
import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from jdml.fileio import atomic_write
from jdml.visualize.curves import load_records, spectrum_plot, training_curves
from jdml.visualize.figure import is_fraction_metric

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_RESULT_SECTIONS = ("untrained", "best", "final")
_META_KEYS = ("step", "epoch")

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 2em auto; max-width: 1280px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.path, .note { color: #666; font-size: 0.9em; }
pre { background: #f6f8fa; padding: 1em; overflow: auto; font-size: 0.85em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dt { font-weight: 600; }
dd { margin: 0; }
"""


def _esc(value: Any) -> str:
    """Any value as HTML-escaped text (quotes too)."""
    return html.escape(str(value), quote=True)


def _is_number(value: Any) -> bool:
    """Whether a JSON value is a number (bools excluded)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read_json(path: str) -> tuple[Any, str | None]:
    """Reads a JSON file.

    Args:
      path: the file.

    Returns:
      ``(data, None)``, or ``(None, message)`` if it is missing or unreadable.
    """
    if not os.path.isfile(path):
        return None, f"{os.path.basename(path)} not found"
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, f"could not read {os.path.basename(path)}: {e}"


def metric_rows(obj: Any, label: str = "") -> list[tuple[str, dict[str, float]]]:
    """Flattens nested dicts of metrics into table rows.

    A dict's numeric entries (except "step" and "epoch") form one row named by the path of
    keys leading to it; nested dicts (splits, embeddings, heads) give further rows; anything
    else (strings, lists, bools) is skipped.

    Args:
      obj: e.g. ``{"test": {"recall@1": 0.8}, "embeddings": {"test": {"member2": {...}}}}``.
      label: the path so far.

    Returns:
      ``[(row name, {metric: value})]`` in document order.
    """
    if not isinstance(obj, Mapping):
        return []
    values = {str(k): float(v) for k, v in obj.items() if _is_number(v) and k not in _META_KEYS}
    rows = [(label, values)] if values else []
    for key, value in obj.items():
        if isinstance(value, Mapping):
            rows.extend(metric_rows(value, f"{label} / {key}" if label else str(key)))
    return rows


def _format(value: float, percent: bool) -> str:
    """A metric value: percent with 2 decimals, or with 4 decimals."""
    if math.isnan(value):
        return "nan"
    return f"{100.0 * value:.2f}" if percent else f"{value:.4f}"


def _table(rows: list[tuple[str, dict[str, float]]], first_header: str) -> str:
    """An HTML table with one row per entry and one column per metric.

    A column is in percent when its metric is a fraction (:func:`is_fraction_metric`) and all
    its values lie in [0, 1].

    Args:
      rows: ``[(row name, {metric: value})]``.
      first_header: the heading of the row-name column.

    Returns:
      The table's HTML ("" for no rows).
    """
    if not rows:
        return ""
    columns = list(dict.fromkeys(m for _, values in rows for m in values))
    percent = {}
    for c in columns:
        finite = [v[c] for _, v in rows if c in v and math.isfinite(v[c])]
        percent[c] = is_fraction_metric(c) and all(-1e-9 <= x <= 1 + 1e-9 for x in finite)
    head = "".join(f"<th>{_esc(c)}{' (%)' if percent[c] else ''}</th>" for c in columns)
    lines = [f"<table>\n<tr><th>{_esc(first_header)}</th>{head}</tr>"]
    for name, values in rows:
        cells = "".join(
            f'<td class="num">{_esc(_format(values[c], percent[c])) if c in values else "–"}</td>'
            for c in columns
        )
        lines.append(f"<tr><td>{_esc(name)}</td>{cells}</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _section_label(name: str, section: Mapping[str, Any]) -> str:
    """A results section's row name with its step and epoch, e.g. "best (step 675, epoch 3)"."""
    where = [f"{k} {section[k]:g}" for k in _META_KEYS if _is_number(section.get(k))]
    return f"{name} ({', '.join(where)})" if where else name


def _results_html(results: Any) -> str:
    """The results section: selection info and one table over the untrained/best/final rows.

    Args:
      results: the parsed ``results.json``.

    Returns:
      HTML.
    """
    if not isinstance(results, Mapping):
        return '<p class="note">results.json is not an object; skipped.</p>'
    scalars = {k: v for k, v in results.items() if not isinstance(v, Mapping | list)}
    parts = []
    if scalars:
        items = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in scalars.items())
        parts.append(f"<dl>{items}</dl>")
    sections = [s for s in _RESULT_SECTIONS if isinstance(results.get(s), Mapping)]
    sections += [
        k for k, v in results.items() if isinstance(v, Mapping) and k not in _RESULT_SECTIONS
    ]
    rows = []
    for name in sections:
        rows.extend(metric_rows(results[name], _section_label(name, results[name])))
    table = _table(rows, "checkpoint / split")
    parts.append(table or '<p class="note">No numeric results.</p>')
    return "\n".join(parts)


def _eval_html(path: str) -> str:
    """One eval.py output (``eval_<checkpoint>_step<step>.json``) as a heading and table.

    Args:
      path: the file.

    Returns:
      HTML.
    """
    name = os.path.basename(path)
    data, error = _read_json(path)
    if error is not None:
        return f'<h3>{_esc(name)}</h3>\n<p class="note">{_esc(error)}</p>'
    if not isinstance(data, Mapping):
        return f'<h3>{_esc(name)}</h3>\n<p class="note">Not an object; skipped.</p>'
    heading = name
    if "checkpoint" in data or "step" in data:
        heading += f": checkpoint {data.get('checkpoint', '?')}, step {data.get('step', '?')}"
    if "results" in data or "embeddings" in data:
        rows = metric_rows(data.get("results"))
        rows += metric_rows(data.get("embeddings"))
    else:  # another shape, e.g. {split: {metric: value}}
        rows = metric_rows({k: v for k, v in data.items() if k not in ("meta", "spectra")})
    table = _table(rows, "split / embedding") or '<p class="note">No numeric results.</p>'
    return f"<h3>{_esc(heading)}</h3>\n{table}"


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _figure_html(path: str, caption: str) -> str:
    """A PNG embedded as a base64 data URI in a <figure>.

    Args:
      path: the PNG file.
      caption: the caption text.

    Returns:
      HTML.

    Raises:
      FileNotFoundError: if the file does not exist.
      ValueError: if it is not a PNG.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"image not found: {path}")
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(PNG_MAGIC) or len(data) < 24:
        raise ValueError(f"not a PNG file: {path}")
    width, height = _png_size(data)
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return (
        f'<figure><img src="{uri}" width="{width}" height="{height}" alt="{_esc(caption)}">'
        f"<figcaption>{_esc(caption)}</figcaption></figure>"
    )


def _eval_split(records: list[dict[str, Any]], preferred: Any) -> str:
    """The split to plot in the training curves: the selection split if evaluated, else the
    first evaluated split, else "test"."""
    splits = list(dict.fromkeys(r.get("split") for r in records if r.get("kind") == "eval"))
    if isinstance(preferred, str) and preferred in splits:
        return preferred
    return next((s for s in splits if isinstance(s, str)), "test")


def _run_figures(workdir: str, figures_dir: str, selection_split: Any) -> tuple[list[str], list]:
    """Draws the training curves and spectra of a run from its ``metrics.jsonl``.

    Args:
      workdir: the run directory.
      figures_dir: where to write the PNGs.
      selection_split: the split the run selects checkpoints on (from results.json), or None.

    Returns:
      ``(notes, figures)``: messages about what could not be drawn, and ``(path, caption)``
      of each PNG written.
    """
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    try:
        records, _ = load_records(metrics_path)
    except (OSError, ValueError) as e:
        return [f"No figures: {e}"], []
    notes, figures = [], []
    split = _eval_split(records, selection_split)
    try:
        out = training_curves(
            records, os.path.join(figures_dir, "training_curves.png"), split=split, title=""
        )
        figures.append((out, f"Training losses and evaluation metrics ({split} split)"))
    except (OSError, ValueError) as e:
        notes.append(f"Training curves not drawn: {e}")
    spectrum_splits = sorted(
        {r.get("split") for r in records if r.get("kind") == "spectrum"} - {None},
        key=lambda s: (s != "train", str(s)),
    )
    for s in spectrum_splits:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in str(s))
        try:
            out = spectrum_plot(
                records,
                os.path.join(figures_dir, f"spectrum_{safe}.png"),
                split=str(s),
                title=f"Singular-value spectrum ({s} split)",
            )
            figures.append((out, f"Normalised singular-value spectrum of the {s} embeddings"))
        except (OSError, ValueError) as e:
            notes.append(f"Spectrum of {s!r} not drawn: {e}")
    return notes, figures


def html_report(
    workdir: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str] | None = None,
    images: Iterable[str | os.PathLike[str]] = (),
    figures_dir: str | os.PathLike[str] | None = None,
) -> str:
    """Writes a self-contained HTML report of a training run.

    Sections: the config (``config.json``, collapsible), the results (``results.json``:
    untrained / best / final per split, and any per-embedding entries; fractions in percent
    with 2 decimals, other metrics with 4), the checkpoint evaluations (``eval_*.json``), and
    figures: training curves and spectra drawn from ``metrics.jsonl`` into ``figures_dir``,
    then the PNGs in ``images``. Missing or unreadable files are noted on the page rather than
    raising.

    Args:
      workdir: the run directory.
      out: the HTML file to write (default ``<workdir>/report.html``).
      images: extra PNG files to embed (e.g. a retrieval grid), captioned by file name.
      figures_dir: where the drawn PNGs go (default ``<workdir>/figures``).

    Returns:
      The path of the HTML file.

    Raises:
      FileNotFoundError: if ``workdir`` or one of ``images`` does not exist.
      ValueError: if one of ``images`` is not a PNG.
    """
    workdir = os.fspath(workdir)
    if not os.path.isdir(workdir):
        raise FileNotFoundError(f"run directory not found: {workdir}")
    out = os.fspath(out) if out is not None else os.path.join(workdir, "report.html")
    figures_dir = (
        os.fspath(figures_dir) if figures_dir is not None else os.path.join(workdir, "figures")
    )
    name = os.path.basename(os.path.normpath(os.path.abspath(workdir)))
    extra = [os.fspath(p) for p in images]
    for p in extra:  # checked before anything is drawn or written
        if not os.path.isfile(p):
            raise FileNotFoundError(f"image not found: {p}")

    body = [f"<h1>{_esc(name)}</h1>", f'<p class="path">{_esc(os.path.abspath(workdir))}</p>']

    config, error = _read_json(os.path.join(workdir, "config.json"))
    body.append("<h2>Config</h2>")
    if error is None:
        text = json.dumps(config, indent=2, ensure_ascii=False)
        body.append(f"<details><summary>config.json</summary><pre>{_esc(text)}</pre></details>")
    else:
        body.append(f'<p class="note">{_esc(error)}</p>')

    results, error = _read_json(os.path.join(workdir, "results.json"))
    body.append("<h2>Results</h2>")
    body.append(_results_html(results) if error is None else f'<p class="note">{_esc(error)}</p>')

    eval_files = sorted(glob.glob(os.path.join(glob.escape(workdir), "eval_*.json")))
    if eval_files:
        body.append("<h2>Checkpoint evaluations</h2>")
        body.extend(_eval_html(p) for p in eval_files)

    selection = results.get("selection_split") if isinstance(results, Mapping) else None
    notes, figures = _run_figures(workdir, figures_dir, selection)
    body.append("<h2>Figures</h2>")
    body.extend(f'<p class="note">{_esc(n)}</p>' for n in notes)
    body.extend(_figure_html(path, caption) for path, caption in figures)
    body.extend(_figure_html(p, os.path.basename(p)) for p in extra)

    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f"<title>{_esc(name)} report</title>",
            f"<style>{_CSS}</style>",
            "</head>",
            "<body>",
            *body,
            "</body>",
            "</html>",
            "",
        ]
    )
    atomic_write(out, page)
    return out
