"""The embedded glyph dataset: size, pinned fonts, placement, look-alikes, cache behaviour."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jdml.data import fonts, glyphs
from jdml.data.arrays import ImageArrays
from jdml.fileio import sha256_file
from tests.helpers import REPO as REPO_DIR

REPO = Path(REPO_DIR)


@pytest.fixture(scope="module")
def table(glyph_cache_dir: Path) -> glyphs.GlyphTable:
    """The session's glyph table (codepoint class order, with instance indices)."""
    return glyphs.load_glyph_table(32, glyph_cache_dir)


def _fail(*args: object, **kwargs: object) -> None:
    raise AssertionError("the dataset was rebuilt although the cache is valid")


def _per_instance(table: glyphs.GlyphTable, char: str) -> dict[int, np.ndarray]:
    """Instance index -> (S, S) image of ``char``."""
    c = table.data.class_names.index(char)
    idx = np.flatnonzero(table.data.labels == c)
    return {int(table.instances[i]): table.data.images[i, :, :, 0] for i in idx}


def _ink_rows(image: np.ndarray) -> tuple[int, int]:
    """First and last row with clear ink."""
    rows = np.flatnonzero((image > 96).any(axis=1))
    return int(rows[0]), int(rows[-1])


# ----------------------------------------------------------------------------- pins and size


def test_pins_agree_with_pyproject() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert extras["optional-dependencies"]["glyphs"] == list(fonts.FONT_PINS)


def test_at_least_40_pinned_families_all_used(table: glyphs.GlyphTable) -> None:
    families = [fonts.parse_pin(p)[0].removeprefix("fontpkg-") for p in fonts.FONT_PINS]
    assert len(set(families)) >= 40
    assert table.manifest["families"] == families
    used = {entry["package"] for entry in table.manifest["inputs"]["fonts"]}
    assert used == {fonts.parse_pin(p)[0] for p in fonts.FONT_PINS}


def test_many_classes_each_with_many_instances(glyph_data: ImageArrays) -> None:
    assert glyph_data.images.shape[1:] == (32, 32, 1)
    assert glyph_data.images.dtype == np.uint8
    assert glyph_data.num_classes >= 150
    counts = np.bincount(glyph_data.labels, minlength=glyph_data.num_classes)
    assert counts.min() >= glyphs.MIN_INSTANCES
    names = glyph_data.class_names
    assert len(set(names)) == len(names) and all(len(n) == 1 for n in names)


def test_instances_are_regular_bold_italic(table: glyphs.GlyphTable) -> None:
    by_family: dict[str, list[dict]] = {}
    for entry in table.manifest["instances"]:
        by_family.setdefault(entry["family"], []).append(entry)
    roboto = by_family["roboto"]
    assert [(e["style"], e["variation"]["wght"]) for e in roboto] == [
        ("normal", 400.0),
        ("normal", 700.0),
        ("italic", 400.0),
    ]
    comfortaa = by_family["comfortaa"]  # variable, no italic: light replaces italic
    assert [e["variation"]["wght"] for e in comfortaa] == [400.0, 700.0, 300.0]
    assert [e["static_weight"] for e in by_family["lobster"]] == [400]  # one static file


# ----------------------------------------------------------------------------- classes


def test_classes_sorted_by_codepoint_and_interleaved_by_default(
    table: glyphs.GlyphTable, glyph_data: ImageArrays, glyph_cache_dir: Path
) -> None:
    names = table.data.class_names
    assert [ord(n) for n in names] == sorted(ord(n) for n in names)
    assert glyph_data.class_names == names[0::2] + names[1::2]
    assert np.array_equal(glyph_data.images, table.data.images)
    new_names = np.array(glyph_data.class_names)[glyph_data.labels]
    old_names = np.array(names)[table.data.labels]
    assert np.array_equal(new_names, old_names)
    plain = glyphs.load_glyphs(32, glyph_cache_dir, class_order="codepoint")
    assert plain.class_names == names


def test_scripts_and_diacritics_present(table: glyphs.GlyphTable) -> None:
    names = set(table.data.class_names)
    for char in "aAzZ09ÄäÉéßŁłŒœΩλπЖжЯя":
        assert char in names, char


def test_cross_script_look_alikes_removed(table: glyphs.GlyphTable) -> None:
    names = set(table.data.class_names)
    for latin, other in [("o", "ο"), ("o", "о"), ("A", "Α"), ("A", "А"), ("Ë", "Ё"), ("p", "р")]:
        assert latin in names and other not in names, (latin, other)
    removed = {e["char"]: e["same_as"] for e in table.manifest["removed_look_alikes"]}
    assert removed["о"] == "o" and removed["Г"] == "Γ"


def test_no_duplicate_looking_classes_remain(table: glyphs.GlyphTable) -> None:
    """For every pair of kept classes, renderings differ in most instances having both."""
    data, n = table.data, table.data.num_classes

    def stacks():
        for j in np.unique(table.instances):
            rows = np.flatnonzero(table.instances == j)
            present = np.zeros(n, bool)
            present[data.labels[rows]] = True
            images = np.zeros((n, *data.images.shape[1:3]), np.uint8)
            images[data.labels[rows]] = data.images[rows, :, :, 0]
            yield present, images

    shared, near = glyphs.near_copy_fractions(stacks(), n)
    np.fill_diagonal(near, 0)
    worst = np.unravel_index(np.argmax(near / np.maximum(shared, 1)), near.shape)
    pair = (data.class_names[worst[0]], data.class_names[worst[1]])
    assert near[worst] <= glyphs.DUPLICATE_MAJORITY * shared[worst], pair


def test_drop_look_alikes_rule() -> None:
    shared = np.full((4, 4), 10)
    near = np.zeros((4, 4), int)
    near[2, 0] = near[0, 2] = 6  # 2 copies 0 in 6 of 10 fonts: dropped
    near[3, 1] = near[1, 3] = 5  # exactly half: kept
    kept, dropped = glyphs.drop_look_alikes(shared, near)
    assert kept == [0, 1, 3] and dropped == {2: 0}


def test_near_copies_detects_identical_and_distinct() -> None:
    a = np.zeros((8, 8), np.uint8)
    a[2:6, 3] = 255
    b = a.copy()
    c = np.zeros((8, 8), np.uint8)
    c[3, 1:7] = 255
    present = np.array([True, True, True])
    shared, near = glyphs.near_copy_fractions([(present, np.stack([a, b, c]))], 3)
    assert near[0, 1] == 1 and near[0, 2] == 0 and shared[0, 2] == 1


# ----------------------------------------------------------------------------- placement


def test_common_baseline_and_case(table: glyphs.GlyphTable) -> None:
    """Same size and baseline everywhere: case, descenders and accents survive.

    A few designs (e.g. the pixel font without descenders) differ; 95% must agree.
    """
    x, big_x, g = (_per_instance(table, ch) for ch in "xXg")
    e, e_acute = _per_instance(table, "E"), _per_instance(table, "É")
    both = sorted(set(x) & set(big_x) & set(g))
    x_top, x_bottom = np.array([_ink_rows(x[j]) for j in both]).T
    big_top, big_bottom = np.array([_ink_rows(big_x[j]) for j in both]).T
    g_bottom = np.array([_ink_rows(g[j])[1] for j in both])
    baseline = (glyphs.Geometry(32).baseline - 1) // glyphs.SUPERSAMPLE  # last row above it
    assert np.mean(np.abs(x_bottom - baseline) <= 1) >= 0.95
    assert np.mean(np.abs(x_bottom - big_bottom) <= 1) >= 0.95
    assert np.mean(big_top < x_top) >= 0.95  # capitals are taller than lowercase
    assert np.mean(g_bottom > x_bottom + 2) >= 0.95  # descenders go below the baseline
    accent = [_ink_rows(e_acute[j])[0] < _ink_rows(e[j])[0] for j in e_acute]
    assert np.mean(accent) >= 0.95


def test_glyphs_centred_and_rarely_clipped(table: glyphs.GlyphTable) -> None:
    images = table.data.images[..., 0].astype(np.float64)
    cols = images.sum(axis=1)
    centre = (cols * np.arange(32)).sum(axis=1) / cols.sum(axis=1)
    assert np.abs(np.median(centre) - 15.5) < 1.0
    assert table.manifest["stats"]["clipped_images"] < 0.01 * len(images)


def test_no_missing_glyph_rendered(table: glyphs.GlyphTable) -> None:
    instances = table.manifest["instances"]
    maps = {
        (e["package"], e["path"]): fonts.character_map(fonts._package_dir(e["package"]) / e["path"])
        for e in instances
    }
    for j, entry in enumerate(instances):
        cmap = maps[(entry["package"], entry["path"])]
        labels = table.data.labels[table.instances == j]
        assert all(ord(table.data.class_names[c]) in cmap for c in np.unique(labels))


def test_render_at_64_fits_accents_and_descenders() -> None:
    instance = fonts.select_instances(fonts.locate_fonts(["fontpkg-roboto==3.15"]))[0]
    geometry = glyphs.Geometry(64)
    font = glyphs.open_instance(instance, geometry.em)
    for char in "ÅÇgjŲ":
        image, clipped = glyphs.render_glyph(font, char, geometry)
        assert image.shape == (64, 64) and not clipped, char
    assert glyphs.render_glyph(font, " ", geometry) is None  # blank: no sample


def test_image_size_is_validated(tmp_path: Path) -> None:
    for bad in (31, 65, 32.0):
        with pytest.raises(ValueError, match=r"\[32, 64\]"):
            glyphs.load_glyphs(bad, tmp_path)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- cache


@pytest.mark.slow
def test_rebuild_is_byte_identical(glyph_cache_dir: Path, tmp_path: Path) -> None:
    glyphs.load_glyph_table(32, tmp_path)
    for name in ("glyphs.npz", "manifest.json"):
        assert (tmp_path / "32px" / name).read_bytes() == (
            glyph_cache_dir / "32px" / name
        ).read_bytes(), name


def test_valid_cache_is_reused_fast(glyph_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(glyphs, "build_glyphs", _fail)
    start = time.perf_counter()
    data = glyphs.load_glyphs(32, glyph_cache_dir)
    assert time.perf_counter() - start < 5.0
    assert data.num_classes >= 150


def test_cache_dir_defaults_to_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JDML_CACHE", str(tmp_path))
    assert glyphs.default_cache_dir() == tmp_path / "glyphs"
    monkeypatch.delenv("JDML_CACHE")
    assert glyphs.default_cache_dir() == Path.home() / ".cache" / "jdml" / "glyphs"


def test_manifest_records_provenance(table: glyphs.GlyphTable) -> None:
    manifest = table.manifest
    inputs = manifest["inputs"]
    assert inputs["format_version"] == glyphs.FORMAT_VERSION and inputs["image_size"] == 32
    font = inputs["fonts"][0]
    assert set(font) == {"package", "version", "path", "sha256"} and len(font["sha256"]) == 64
    assert [c["char"] for c in manifest["classes"]] == list(table.data.class_names)
    assert manifest["classes"][0]["codepoint"].startswith("U+")
    assert all("variation" in e for e in manifest["instances"])


def _damage(kind: str, folder: Path) -> None:
    """Breaks a copied cache in one of several ways."""
    npz, manifest = folder / "glyphs.npz", folder / "manifest.json"
    if kind == "truncated_arrays":
        npz.write_bytes(npz.read_bytes()[:1000])
    elif kind == "garbage_manifest":
        manifest.write_text("{not json")
    elif kind == "missing_manifest":
        manifest.unlink()
    elif kind == "changed_font":
        data = json.loads(manifest.read_text())
        data["inputs"]["fonts"][0]["sha256"] = "0" * 64
        manifest.write_text(json.dumps(data))
    elif kind == "incomplete_manifest":
        data = json.loads(manifest.read_text())
        del data["classes"]
        manifest.write_text(json.dumps(data))
    elif kind == "inconsistent_arrays":  # checksum right, content wrong
        with np.load(npz) as arrays:
            labels = arrays["labels"][:-1]
        np.savez(npz, images=np.zeros((len(labels), 32, 32, 1), np.uint8), labels=labels)
        data = json.loads(manifest.read_text())
        data["arrays_sha256"] = sha256_file(npz)
        manifest.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "kind",
    [
        "truncated_arrays",
        "garbage_manifest",
        "missing_manifest",
        "changed_font",
        "incomplete_manifest",
        "inconsistent_arrays",
    ],
)
def test_damaged_cache_is_rebuilt(
    kind: str,
    table: glyphs.GlyphTable,
    glyph_cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shutil.copytree(glyph_cache_dir, tmp_path / "cache")
    _damage(kind, tmp_path / "cache" / "32px")
    calls = []

    def fake_build(image_size: int, pins: object = None) -> glyphs.GlyphTable:
        calls.append(image_size)
        return table

    monkeypatch.setattr(glyphs, "build_glyphs", fake_build)
    with pytest.warns(UserWarning, match="rebuilding the glyphs cache"):
        glyphs.load_glyph_table(32, tmp_path / "cache")
    assert calls == [32]
    monkeypatch.setattr(glyphs, "build_glyphs", _fail)  # now valid again
    again = glyphs.load_glyph_table(32, tmp_path / "cache")
    assert np.array_equal(again.data.images, table.data.images)


# ----------------------------------------------------------------------------- errors


def test_missing_font_package_names_it_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fonts._installed_version
    monkeypatch.setattr(
        fonts,
        "_installed_version",
        lambda package: None if package == "fontpkg-lobster" else real(package),
    )
    with pytest.raises(fonts.MissingFontsError) as info:
        glyphs.load_glyphs(32, tmp_path)
    message = str(info.value)
    assert "fontpkg-lobster is not installed" in message
    assert "pip install 'jdml[glyphs]'" in message
    assert "'fontpkg-lobster==2.100'" in message
    assert "fontpkg-roboto" not in message
    assert isinstance(info.value, ImportError)


def test_wrong_font_version_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real = fonts._installed_version
    monkeypatch.setattr(
        fonts,
        "_installed_version",
        lambda package: "0.1" if package == "fontpkg-roboto" else real(package),
    )
    with pytest.raises(fonts.MissingFontsError, match=r"fontpkg-roboto is at version 0\.1"):
        fonts.locate_fonts()


def test_unknown_pin_is_reported() -> None:
    with pytest.raises(fonts.MissingFontsError, match="fontpkg-no-such-font is not installed"):
        fonts.locate_fonts(["fontpkg-no-such-font==1.0"])


def test_version_comparison_ignores_leading_zeros() -> None:
    assert fonts._same_version("1.045", "1.45")
    assert fonts._same_version("5.2.post1", "5.2.post1")
    assert not fonts._same_version("1.4", "1.45")


# ----------------------------------------------------------------------------- command line


def test_main_prints_summary_and_writes_sheet(
    glyph_cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sheet = tmp_path / "sheet.png"
    assert glyphs.main(["--cache-dir", str(glyph_cache_dir), "--sheet", str(sheet)]) == 0
    out = capsys.readouterr().out
    assert "classes" in out and "images" in out and "look-alikes removed" in out
    with Image.open(sheet) as image:
        assert image.size == (12 * 34 + 2, 20 * 34 + 2)


def test_main_reports_missing_fonts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fonts, "_installed_version", lambda package: None)
    assert glyphs.main(["--cache-dir", str(tmp_path)]) == 2
    assert "pip install 'jdml[glyphs]'" in capsys.readouterr().err


def test_data_modules_do_not_import_jax() -> None:
    code = (
        "import sys, jdml.data.glyphs, jdml.data.sources, jdml.data.splits;"
        "print('jax' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "False"
