"""The embedded default dataset: characters rendered from a pinned set of real typefaces.

``glyphs`` is a many-class image-retrieval dataset that needs no download beyond the pinned
font packages (``pip install 'jdml[glyphs]'``). It is built once, deterministically, and
cached on disk.

Classes and instances
  A class is a character; an instance is one rendering of it in one typeface, weight and
  style. The candidate characters are the basic Latin letters and digits, the letters of
  Latin-1 Supplement and Latin Extended-A (accented and other fine-grained Latin letters),
  Greek (with tonos and dialytika forms) and the basic Cyrillic block (U+0400-U+045F).
  The typefaces are the :data:`jdml.data.fonts.FONT_PINS` families (serif, sans, mono and display).
  Every family contributes up to three instances: regular (400), bold (700) and italic
  (400); a family without an italic contributes light (300) instead. Variable fonts are
  set to those weights (clipped to the font's weight axis, every other axis at its
  default); static families use the file of the nearest weight. A sample exists only if
  the font's character map really holds the character (no ``.notdef`` boxes) and the
  glyph is not blank. With the pinned fonts: 53 families, 152 instances, 367 classes,
  50,728 images, 80-152 per class (fewer for Greek, which fewer families cover). Fonts
  are rendered as designed, so e.g. a family with old-style figures draws ``0`` like ``o``.

Removing look-alike classes
  Many characters look the same as others: Latin ``o``, Greek ``ο`` and Cyrillic ``о``;
  Latin ``Ë`` and Cyrillic ``Ё``; Greek ``Γ`` and Cyrillic ``Г``. They are one glyph and must
  not be separate classes. The rule: candidates are visited in codepoint order and a
  candidate is dropped when, in more than half of the families that have both, its
  regular rendering (at the analysis size, 32 px) is a near-copy of that of an earlier kept
  character; near-copy means the squared pixel difference is below
  :data:`DUPLICATE_THRESHOLD` times the smaller of the two glyphs' squared ink. Identical
  renderings at different codepoints are removed by the same rule. Candidates found in
  fewer than :data:`MIN_INSTANCES` instances are dropped first. The removed characters and
  the character each duplicates are listed in the cache manifest. The outcome is stable:
  any threshold from 0.005 to 0.03 removes the same 50 characters, all of them Unicode
  confusables (Greek and Cyrillic copies of Latin letters, ``Г``/``Γ``, ``П``/``Π``,
  ``Đ``/``Ð``, ``ћ``/``ħ``). Similar but distinct pairs (``I``/``l``, ``K``/``К``,
  ``ĸ``/``κ``) stay: they differ in most fonts.

Image placement
  Glyphs are rendered white on black, grayscale, ``(N, S, S, 1)`` with ``S`` in [32, 64].
  Every glyph of every font is drawn at the same pixel size (em = 0.70 S) on the same
  baseline (row 0.76 S), so case (``c``/``C``), x-height and diacritics survive; only the
  horizontal position is normalised (ink centred). The glyph is rendered at 2x and reduced
  with an exact integer box filter. Accents and descenders fit; the few glyphs whose ink
  leaves the frame (very tall or wide designs) are clipped and counted in the manifest.

Class order and the unseen-class split
  The DML protocol trains on the first half of the classes and tests on the second half.
  Sorting the classes by codepoint would put basic Latin, Latin-1 and part of Latin
  Extended-A in training and the rest of Latin Extended-A, all of Greek and all of
  Cyrillic in the test: an unseen-script transfer test whose test classes also have fewer
  instances (fewer families cover Greek). That measures script shift more than metric
  learning. By default (``class_order="interleaved"``) the classes are instead ordered by
  the parity of their codepoint rank: every other character in codepoint order (ranks 0,
  2, 4, ...) first, then the rest. The first half therefore holds every other character of
  each script, and the test classes are unseen characters from the same distribution
  (``È`` trained, ``É`` tested; ``Д`` trained, ``Ж`` tested), as in CUB/Cars-style
  benchmarks. With an odd number of classes the last even-rank class falls into the test
  half. ``class_order="codepoint"`` gives the plain codepoint order (script-transfer split).

Cache
  ``load_glyphs`` writes ``<cache_dir>/<S>px/{glyphs.npz, manifest.json}``; ``cache_dir``
  defaults to ``$JDML_CACHE/glyphs`` or ``~/.cache/jdml/glyphs``. The manifest records every
  font file used (package, version, relative path, sha256), the variation settings of every
  instance, the classes (characters and codepoints), the rendering settings and a format
  version. The cache is used only if the installed fonts and settings match it and the
  array file's checksum is right; otherwise (also when a file is corrupt or half written)
  the dataset is rebuilt. Files are written atomically (temporary file + ``os.replace``).

Run ``python -m jdml.data.glyphs [--sheet sheet.png]`` to build the cache and print its size.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import sys
import time
import unicodedata
import warnings
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from jdml.data.arrays import ImageArrays
from jdml.data.fonts import (
    INSTANCE_TARGETS,
    ROMAN_ONLY_EXTRA,
    FontFile,
    Instance,
    character_map,
    locate_fonts,
    select_instances,
    selected_files,
)
from jdml.errors import GlyphCacheError, MissingFontsError
from jdml.fileio import atomic_write, cache_root, sha256_file

FORMAT_VERSION = 1

MIN_INSTANCES = 40  # a class needs at least this many renderings
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 32, 64
DEFAULT_IMAGE_SIZE = 32
EM_FRACTION = 0.70  # font size (pixels per em) as a fraction of the image size
BASELINE_FRACTION = 0.76  # baseline row as a fraction of the image size
SUPERSAMPLE = 2  # render at this multiple, then box-filter down
ANALYSIS_SIZE = 32  # image size at which look-alike classes are detected
DUPLICATE_THRESHOLD = 0.02  # near-copy: squared difference < this * smaller squared ink
DUPLICATE_MAJORITY = 0.5  # dropped when near-copies in more than this fraction of families
ClassOrder = Literal["interleaved", "codepoint"]


# --------------------------------------------------------------------------- characters


def candidate_codepoints() -> tuple[int, ...]:
    """The candidate characters, in codepoint order (see the module docstring)."""
    digits = range(0x30, 0x3A)
    upper, lower = range(0x41, 0x5B), range(0x61, 0x7B)
    latin1 = (c for c in range(0xC0, 0x100) if c not in (0xD7, 0xF7))  # no multiply/divide
    latin_ext_a = range(0x100, 0x180)
    greek = (c for c in range(0x386, 0x3CF) if unicodedata.category(chr(c)).startswith("L"))
    cyrillic = range(0x400, 0x460)
    return tuple(sorted({*digits, *upper, *lower, *latin1, *latin_ext_a, *greek, *cyrillic}))


# --------------------------------------------------------------------------- rendering


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Where glyphs go in an ``image_size`` square (all values at the supersampled scale)."""

    image_size: int

    @property
    def canvas(self) -> int:
        return self.image_size * SUPERSAMPLE

    @property
    def em(self) -> int:
        return round(EM_FRACTION * self.canvas)

    @property
    def baseline(self) -> int:
        return round(BASELINE_FRACTION * self.canvas)


def open_instance(instance: Instance, size: int) -> ImageFont.FreeTypeFont:
    """A Pillow font for an instance at ``size`` pixels per em."""
    font = ImageFont.truetype(str(instance.font.path), size, layout_engine=ImageFont.Layout.BASIC)
    if instance.variation:
        font.set_variation_by_axes([value for _, value in instance.variation])
    return font


def render_glyph(
    font: ImageFont.FreeTypeFont, char: str, geometry: Geometry
) -> tuple[np.ndarray, bool] | None:
    """Renders one character: fixed size and baseline, ink centred horizontally.

    Returns:
      ``(image (S, S) uint8, clipped)``, or None when the glyph has no ink.
    """
    side = geometry.canvas
    scratch = Image.new("L", (3 * side, 3 * side), 0)
    ImageDraw.Draw(scratch).text(
        (side, side + geometry.baseline), char, font=font, fill=255, anchor="ls"
    )
    ink = scratch.getbbox()  # (left, top, right, bottom) of the non-zero pixels
    if ink is None:
        return None
    left = min(max((ink[0] + ink[2] - side) // 2, 0), 2 * side)
    clipped = ink[0] < left or ink[2] > left + side or ink[1] < side or ink[3] > 2 * side
    # Image.reduce is an exact box filter: the rounded mean of each factor x factor block.
    window = scratch.crop((left, side, left + side, 2 * side)).reduce(SUPERSAMPLE)
    return np.asarray(window), clipped


# --------------------------------------------------------------------------- look-alikes


def _pairwise_near_copies(images: np.ndarray) -> np.ndarray:
    """Boolean (n, n) matrix: image i is a near-copy of image j (see DUPLICATE_THRESHOLD).

    Float64 products of uint8 values are exact, so the result does not depend on the BLAS.
    """
    flat = images.reshape(len(images), -1).astype(np.float64)
    ink = np.einsum("ij,ij->i", flat, flat)
    dist = ink[:, None] + ink[None, :] - 2.0 * (flat @ flat.T)
    return dist < DUPLICATE_THRESHOLD * np.minimum(ink[:, None], ink[None, :])


def near_copy_fractions(
    stacks: Iterable[tuple[np.ndarray, np.ndarray]], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Counts, over fonts, for every pair of characters, shared fonts and near copies.

    Args:
      stacks: per font, ``(present (n,) bool, images (n, S, S) uint8)``.
      n: number of characters.

    Returns:
      ``(shared, near)``: int (n, n) matrices.
    """
    shared = np.zeros((n, n), np.int32)
    near = np.zeros((n, n), np.int32)
    for present, images in stacks:
        idx = np.flatnonzero(present)
        shared[np.ix_(idx, idx)] += 1
        near[np.ix_(idx, idx)] += _pairwise_near_copies(images[idx])
    return shared, near


def drop_look_alikes(shared: np.ndarray, near: np.ndarray) -> tuple[list[int], dict[int, int]]:
    """Greedy rule: keep a character unless it is a near copy of an earlier kept one.

    Returns:
      ``(kept indices, {dropped index: index of the kept character it copies})``.
    """
    kept: list[int] = []
    dropped: dict[int, int] = {}
    for c in range(shared.shape[0]):
        for k in kept:
            if shared[c, k] and near[c, k] > DUPLICATE_MAJORITY * shared[c, k]:
                dropped[c] = k
                break
        else:
            kept.append(c)
    return kept, dropped


def _analysis_stack(
    instance: Instance, codepoints: Sequence[int], cmap: frozenset[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Renders the candidates of one font at the analysis size."""
    geometry = Geometry(ANALYSIS_SIZE)
    font = open_instance(instance, geometry.em)
    present = np.zeros(len(codepoints), bool)
    images = np.zeros((len(codepoints), ANALYSIS_SIZE, ANALYSIS_SIZE), np.uint8)
    for i, cp in enumerate(codepoints):
        if cp in cmap:
            out = render_glyph(font, chr(cp), geometry)
            if out is not None:
                present[i], images[i] = True, out[0]
    return present, images


# --------------------------------------------------------------------------- build


@dataclasses.dataclass(frozen=True)
class GlyphTable:
    """The built dataset with its provenance.

    Attributes:
      data: images and labels, classes in codepoint order.
      instances: int32 (N,), index into ``manifest["instances"]`` of every sample.
      manifest: the cache manifest (fonts, instances, classes, settings, statistics).
    """

    data: ImageArrays
    instances: np.ndarray
    manifest: dict[str, Any]


def _check_image_size(image_size: int) -> None:
    if not isinstance(image_size, int) or not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE:
        raise ValueError(
            f"glyph image_size must be an integer in [{MIN_IMAGE_SIZE}, {MAX_IMAGE_SIZE}], "
            f"got {image_size!r}"
        )


def _cache_inputs(image_size: int, used: Sequence[FontFile]) -> dict[str, Any]:
    """Everything the cached arrays depend on; the cache is valid only if this matches."""
    return {
        "format_version": FORMAT_VERSION,
        "image_size": image_size,
        "render": {
            "em_fraction": EM_FRACTION,
            "baseline_fraction": BASELINE_FRACTION,
            "supersample": SUPERSAMPLE,
            "analysis_size": ANALYSIS_SIZE,
            "duplicate_threshold": DUPLICATE_THRESHOLD,
            "duplicate_majority": DUPLICATE_MAJORITY,
            "min_instances": MIN_INSTANCES,
            "instance_targets": [list(t) for t in INSTANCE_TARGETS],
            "roman_only_extra": list(ROMAN_ONLY_EXTRA),
            "candidates": list(candidate_codepoints()),
        },
        "fonts": [
            {
                "package": f.package,
                "version": f.version,
                "path": f.relpath,
                "sha256": sha256_file(f.path),
            }
            for f in used
        ],
    }


def _class_entry(cp: int) -> dict[str, Any]:
    char = chr(cp)
    return {"char": char, "codepoint": f"U+{cp:04X}", "name": unicodedata.name(char, "")}


def _instance_entry(index: int, instance: Instance) -> dict[str, Any]:
    return {
        "index": index,
        "family": instance.family,
        "package": instance.font.package,
        "path": instance.font.relpath,
        "style": instance.font.style,
        "static_weight": instance.font.weight,
        "variation": dict(instance.variation),
    }


def _render_samples(
    instances: Sequence[Instance],
    cmaps: Sequence[frozenset[int]],
    codepoints: Sequence[int],
    geometry: Geometry,
) -> tuple[list[list[tuple[int, np.ndarray]]], list[tuple[int, int]]]:
    """Renders every character in every instance that has it.

    Returns:
      per character, the list of ``(instance index, image)``; and the ``(codepoint,
      instance index)`` of the renderings whose ink left the frame.
    """
    per_class: list[list[tuple[int, np.ndarray]]] = [[] for _ in codepoints]
    clipped: list[tuple[int, int]] = []
    for j, (instance, cmap) in enumerate(zip(instances, cmaps, strict=True)):
        font = open_instance(instance, geometry.em)
        for c, cp in enumerate(codepoints):
            if cp not in cmap:
                continue
            out = render_glyph(font, chr(cp), geometry)
            if out is not None:
                per_class[c].append((j, out[0]))
                if out[1]:
                    clipped.append((cp, j))
    return per_class, clipped


def _regular_instances(instances: Sequence[Instance]) -> dict[str, int]:
    """Family -> index of its first (regular) instance, in family order."""
    regular: dict[str, int] = {}
    for j, inst in enumerate(instances):
        regular.setdefault(inst.family, j)
    return regular


def choose_classes(
    instances: Sequence[Instance], cmaps: Sequence[frozenset[int]]
) -> tuple[list[int], list[int], dict[int, int]]:
    """Applies the coverage and look-alike rules to the candidate characters.

    Returns:
      ``(kept codepoints, uncommon codepoints, {dropped look-alike: kept codepoint it copies})``.
    """
    candidates = candidate_codepoints()
    coverage = [sum(cp in cmap for cmap in cmaps) for cp in candidates]
    common = [cp for cp, n in zip(candidates, coverage, strict=True) if n >= MIN_INSTANCES]
    uncommon = [cp for cp, n in zip(candidates, coverage, strict=True) if n < MIN_INSTANCES]
    regular = _regular_instances(instances).values()
    stacks = (_analysis_stack(instances[j], common, cmaps[j]) for j in regular)
    kept_idx, dropped = drop_look_alikes(*near_copy_fractions(stacks, len(common)))
    copies = {common[c]: common[k] for c, k in dropped.items()}
    return [common[i] for i in kept_idx], uncommon, copies


def _assemble(
    samples: Sequence[tuple[int, Sequence[tuple[int, np.ndarray]]]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stacks ``(codepoint, [(instance, image), ...])`` per class into images, labels, instances."""
    images = np.stack([img for _, rows in samples for _, img in rows])[..., None]
    labels = np.array([c for c, (_, rows) in enumerate(samples) for _ in rows], np.int32)
    instances = np.array([j for _, rows in samples for j, _ in rows], np.int32)
    return images, labels, instances


def build_glyphs(
    image_size: int = DEFAULT_IMAGE_SIZE, pins: Sequence[str] | None = None
) -> GlyphTable:
    """Renders the dataset from the installed pinned fonts (no cache involved)."""
    _check_image_size(image_size)
    files = locate_fonts(pins)
    used = selected_files(files)
    instances = select_instances(files)
    cmap_of = {f.path: character_map(f.path) for f in used}
    cmaps = [cmap_of[inst.font.path] for inst in instances]
    kept, uncommon, copies = choose_classes(instances, cmaps)

    per_class, clipped = _render_samples(instances, cmaps, kept, Geometry(image_size))
    samples = [(cp, s) for cp, s in zip(kept, per_class, strict=True) if len(s) >= MIN_INSTANCES]
    uncommon += [cp for cp, s in zip(kept, per_class, strict=True) if len(s) < MIN_INSTANCES]
    images, labels, inst_index = _assemble(samples)
    families = list(_regular_instances(instances))
    counts = [len(s) for _, s in samples]
    manifest = {
        "inputs": _cache_inputs(image_size, used),
        "classes": [_class_entry(cp) for cp, _ in samples],
        "instances": [_instance_entry(j, inst) for j, inst in enumerate(instances)],
        "families": families,
        "removed_look_alikes": [
            {**_class_entry(cp), "same_as": chr(kept_cp)} for cp, kept_cp in copies.items()
        ],
        "removed_uncommon": [_class_entry(cp) for cp in uncommon],
        "stats": {
            "num_classes": len(samples),
            "num_images": len(labels),
            "num_instances": len(instances),
            "num_families": len(families),
            "min_per_class": min(counts),
            "max_per_class": max(counts),
            "clipped_images": len(clipped),
        },
        "clipped": [{"char": chr(cp), "instance": j} for cp, j in clipped],
    }
    data = ImageArrays(
        images=images,
        labels=labels,
        class_names=tuple(chr(cp) for cp, _ in samples),
        source=_source_name(len(families), image_size),
    )
    return GlyphTable(data, inst_index, manifest)


def _source_name(num_families: int, image_size: int) -> str:
    return f"glyphs ({num_families} typefaces, {image_size}px)"


# --------------------------------------------------------------------------- cache


def default_cache_dir() -> Path:
    """``$JDML_CACHE/glyphs`` or ``~/.cache/jdml/glyphs``."""
    return cache_root("glyphs")


def _cache_paths(cache_dir: str | os.PathLike[str] | None, image_size: int) -> tuple[Path, Path]:
    """The array file and manifest for ``image_size`` (``None`` or "" -> the default folder)."""
    root = Path(cache_dir) if cache_dir not in (None, "") else default_cache_dir()
    folder = root / f"{image_size}px"
    return folder / "glyphs.npz", folder / "manifest.json"


def _npz_bytes(table: GlyphTable) -> bytes:
    """The array file content (compressed npz; the same arrays give the same bytes)."""
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        images=table.data.images,
        labels=table.data.labels,
        instances=table.instances,
    )
    return buffer.getvalue()


def write_cache(table: GlyphTable, cache_dir: str | os.PathLike[str] | None) -> None:
    """Stores a built table: arrays first, then the manifest holding their checksum."""
    npz_path, manifest_path = _cache_paths(cache_dir, table.data.images.shape[1])
    payload = _npz_bytes(table)
    manifest = {**table.manifest, "arrays_sha256": hashlib.sha256(payload).hexdigest()}
    atomic_write(npz_path, payload, durable=True)
    text = json.dumps(manifest, indent=1, ensure_ascii=False, sort_keys=True)
    atomic_write(manifest_path, text, durable=True)


def read_cache(
    cache_dir: str | os.PathLike[str] | None, image_size: int, inputs: dict[str, Any]
) -> GlyphTable:
    """Loads a cached table whose inputs equal ``inputs``.

    Raises:
      GlyphCacheError: missing, stale, corrupt or inconsistent cache (the message says which).
    """
    npz_path, manifest_path = _cache_paths(cache_dir, image_size)
    for path in (npz_path, manifest_path):
        if not path.is_file():
            raise GlyphCacheError(f"cache file {path} is missing")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise GlyphCacheError(f"unreadable manifest {manifest_path}: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("inputs") != inputs:
        raise GlyphCacheError(f"cache {manifest_path.parent} was built from other fonts/settings")
    payload = npz_path.read_bytes()
    if hashlib.sha256(payload).hexdigest() != manifest.get("arrays_sha256"):
        raise GlyphCacheError(f"array file {npz_path} is corrupt (checksum mismatch)")
    try:
        with np.load(npz_path, allow_pickle=False) as npz:
            images, labels, instances = npz["images"], npz["labels"], npz["instances"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        raise GlyphCacheError(f"array file {npz_path} is unreadable: {err}") from err
    try:
        names = tuple(str(entry["char"]) for entry in manifest["classes"])
        source = _source_name(len(manifest["families"]), image_size)
    except (KeyError, TypeError) as err:
        raise GlyphCacheError(f"manifest {manifest_path} is incomplete ({err!r})") from err
    n = len(labels)
    if (
        images.shape != (n, image_size, image_size, 1)
        or images.dtype != np.uint8
        or instances.shape != (n,)
        or (n and (labels.min() < 0 or labels.max() >= len(names)))
    ):
        raise GlyphCacheError(f"array file {npz_path} does not match its manifest")
    data = ImageArrays(images, labels.astype(np.int32), names, source)
    return GlyphTable(data, instances.astype(np.int32), manifest)


def load_glyph_table(
    image_size: int = DEFAULT_IMAGE_SIZE,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    rebuild: bool = False,
) -> GlyphTable:
    """The dataset with its provenance, from the cache or freshly built (then cached)."""
    _check_image_size(image_size)
    inputs = _cache_inputs(image_size, selected_files(locate_fonts()))
    npz_path, manifest_path = _cache_paths(cache_dir, image_size)
    if not rebuild and (npz_path.exists() or manifest_path.exists()):
        try:
            return read_cache(cache_dir, image_size, inputs)
        except GlyphCacheError as err:
            warnings.warn(f"rebuilding the glyphs cache: {err}", stacklevel=2)
    table = build_glyphs(image_size)
    write_cache(table, cache_dir)
    return table


def interleaved_order(num_classes: int) -> np.ndarray:
    """Even codepoint ranks first, then odd ranks (see the module docstring)."""
    return np.concatenate([np.arange(0, num_classes, 2), np.arange(1, num_classes, 2)])


def reorder_classes(data: ImageArrays, order: np.ndarray) -> ImageArrays:
    """Renumbers classes so that new class ``j`` is old class ``order[j]``."""
    new_of_old = np.empty(len(order), np.int32)
    new_of_old[order] = np.arange(len(order), dtype=np.int32)
    return dataclasses.replace(
        data,
        labels=new_of_old[data.labels],
        class_names=tuple(data.class_names[i] for i in order),
    )


def load_glyphs(
    image_size: int = DEFAULT_IMAGE_SIZE,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    class_order: ClassOrder = "interleaved",
) -> ImageArrays:
    """The glyphs dataset: (N, S, S, 1) uint8 images, labels and the characters as names.

    Args:
      image_size: side ``S`` in pixels, in [32, 64].
      cache_dir: cache folder (default ``$JDML_CACHE/glyphs`` or ``~/.cache/jdml/glyphs``).
      class_order: ``"interleaved"`` (default) or ``"codepoint"``; see the module docstring.

    Raises:
      MissingFontsError: the pinned font packages are not installed.
    """
    data = load_glyph_table(image_size, cache_dir).data
    if class_order == "codepoint":
        return data
    if class_order == "interleaved":
        return reorder_classes(data, interleaved_order(data.num_classes))
    raise ValueError(f"class_order must be 'interleaved' or 'codepoint', got {class_order!r}")


# --------------------------------------------------------------------------- command line


def contact_sheet(
    table: GlyphTable, chars: str | None = None, num_classes: int = 20, num_instances: int = 12
) -> Image.Image:
    """A grid image: one row per class, ``num_instances`` renderings spread over the fonts.

    Classes are ``chars`` if given, else ``num_classes`` spread evenly over the class list.
    """
    data = table.data
    if chars:
        wanted = [data.class_names.index(c) for c in chars if c in data.class_names]
    else:
        wanted = np.linspace(0, data.num_classes - 1, num_classes).round().astype(int).tolist()
    size, gap = data.images.shape[1], 2
    sheet = np.full(
        (len(wanted) * (size + gap) + gap, num_instances * (size + gap) + gap), 96, np.uint8
    )
    for row, c in enumerate(wanted):
        idx = np.flatnonzero(data.labels == c)
        picks = idx[np.linspace(0, len(idx) - 1, num_instances).round().astype(int)]
        for col, i in enumerate(picks):
            y, x = gap + row * (size + gap), gap + col * (size + gap)
            sheet[y : y + size, x : x + size] = data.images[i, :, :, 0]
    return Image.fromarray(sheet)


def main(argv: Sequence[str] | None = None) -> int:
    """Builds (or checks) the cache and prints its size; optionally writes a contact sheet."""
    parser = argparse.ArgumentParser(
        prog="python -m jdml.data.glyphs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--image-size", type=int, default=DEFAULT_IMAGE_SIZE)
    parser.add_argument("--cache-dir", default=None, help="default: $JDML_CACHE/glyphs")
    parser.add_argument("--rebuild", action="store_true", help="ignore an existing cache")
    parser.add_argument("--sheet", default=None, help="write a PNG contact sheet here")
    parser.add_argument("--sheet-chars", default=None, help="characters to show on the sheet")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        table = load_glyph_table(args.image_size, args.cache_dir, rebuild=args.rebuild)
    except (MissingFontsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    stats = table.manifest["stats"]
    print(
        f"glyphs {args.image_size}px: {stats['num_classes']} classes, "
        f"{stats['num_instances']} instances from {stats['num_families']} families, "
        f"{stats['num_images']} images ({stats['min_per_class']}-{stats['max_per_class']} "
        f"per class, {stats['clipped_images']} clipped); {elapsed:.1f} s"
    )
    removed = "".join(e["char"] for e in table.manifest["removed_look_alikes"])
    print(f"look-alikes removed ({len(removed)}): {removed}")
    if args.sheet:
        contact_sheet(table, args.sheet_chars).save(args.sheet)
        print(f"contact sheet written to {args.sheet}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
