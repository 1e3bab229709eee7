"""Looking at what a model learned: retrieval grids, embedding maps, training curves, spectra
and a self-contained HTML report of a run.

Everything works on numpy arrays and run directories; matplotlib is imported lazily, and the
metric registry (for which metrics are percentages) when a table or axis needs it.
"""

from __future__ import annotations

from jdml.visualize.curves import load_records, spectrum_plot, training_curves
from jdml.visualize.html import html_report
from jdml.visualize.maps import embedding_map, embedding_maps, embedding_maps_size, project_2d
from jdml.visualize.retrieval import retrieval_grid, retrieval_grid_size, split_retrieval_grid

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
    "split_retrieval_grid",
    "training_curves",
]
