"""Looking at what a model learned: retrieval grids, embedding maps, training curves, spectra
and a self-contained HTML report of a run.

Everything works on numpy arrays and run directories; matplotlib is imported lazily, and the
metric registry (for which metrics are percentages) when a table or axis needs it.
"""

from __future__ import annotations

from jdml.visualize.figures import (
    embedding_map,
    embedding_maps,
    embedding_maps_size,
    load_records,
    project_2d,
    retrieval_grid,
    retrieval_grid_size,
    spectrum_plot,
    training_curves,
)
from jdml.visualize.html import html_report

__all__ = [
    "embedding_map",
    "embedding_maps",
    "embedding_maps_size",
    "html_report",
    "load_records",
    "project_2d",
    "retrieval_grid",
    "retrieval_grid_size",
    "spectrum_plot",
    "training_curves",
]
