"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from jdml.data.arrays import ImageArrays


@pytest.fixture(scope="session")
def glyph_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A glyphs cache (32 px) built once per test session; returns its folder."""
    from jdml.data.glyphs import load_glyph_table

    path = tmp_path_factory.mktemp("glyph-cache")
    load_glyph_table(32, path)
    return path


@pytest.fixture(scope="session")
def glyph_data(glyph_cache_dir: Path) -> ImageArrays:
    """The glyphs dataset at 32 px (default class order), read from the session cache."""
    from jdml.data.glyphs import load_glyphs

    return load_glyphs(32, glyph_cache_dir)
