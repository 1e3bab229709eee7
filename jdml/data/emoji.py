"""The ``emoji`` dataset: one emoji concept rendered by several independent designs.

A cross-design retrieval benchmark shaped like Stanford Online Products: many classes, few
instances per class. A class is one emoji (a Unicode emoji sequence, e.g. U+1F600 grinning
face); an instance is one design's drawing of it.

Designs (:data:`DESIGNS`) and their sources, npm packages pinned by version and sha256
(:data:`SOURCES`):

* ``google`` (Noto Color Emoji, Apache-2.0) and ``twitter`` (Twemoji, CC-BY-4.0): the 64 px
  PNGs of ``emoji-datasource-google`` / ``emoji-datasource-twitter`` (package MIT);
* ``openmoji-color`` and ``openmoji-black`` (CC-BY-SA-4.0): the SVGs of ``openmoji``;
* ``fluent-color`` (Microsoft's Fluent Emoji, MIT): the colour SVGs of ``fluentui-emoji``
  (``icons/modern``), a third party's npm repackaging (MIT, its own copyright line, no
  Microsoft notice in the tarball), named by the CLDR short name and matched to code points through
  OpenMoji's annotations. Its ``flat`` set is left out: a mechanical simplification of the
  colour set, it is the raw-pixel nearest neighbour of its ``fluent-color`` twin for 95% of
  its images (a near-copy, not a design). The monochrome outline ``openmoji-black`` stays: a
  line drawing without colour is a real change of style (although it shares OpenMoji's
  outlines). The proprietary Apple and Facebook sets are not used.

Classes
  Only base emoji are classes; skin-tone variants are left out (neither instances of their base
  nor classes of their own): as instances they would give a class six recoloured copies of the
  same drawing per design (a within-design shortcut, and classes 6x larger than the others); as
  classes they differ from their base by colour alone, and a tone of a drawing would sit in the
  training half while another tone of the very same drawing is tested. A class needs at least
  :data:`MIN_DESIGNS` designs (visible drawings). The subcategories in
  :data:`DROPPED_SUBCATEGORIES` are left out (the manifest's ``subcategory_stats`` has the
  measured distances of every subcategory): the country and subdivision flags carry their
  identity in colour alone (the outline design draws every flag alike: raw-pixel nearest
  neighbour of an outline flag is of the right country 0% of the time, against 85-90% for
  the colour designs, which draw flags as near-copies of each other), and the skin-tone
  swatches are colour patches with no concept. The keycaps stay: their designs differ about
  as much as other symbols'.

Copies
  Some designs draw two emoji alike (OpenMoji's outline of every coloured circle, heart or
  square is one drawing; its "man X" and "person X" often too; after recentring, Twemoji's
  white squares of four sizes are one square). Drawings at RMS pixel distance at most
  :data:`DUPLICATE_RMS` (0-255) are one picture (:mod:`jdml.data.duplicates`): a picture drawn
  for several classes is dropped from all of them, a design copying another design's drawing of
  the same class (OpenMoji's outline of a black-and-white emoji) keeps only the first, and a
  class left with fewer than :data:`MIN_DESIGNS` designs is dropped. The manifest's
  ``duplicates`` lists every dropped drawing and class, and counts how many drawings have
  another class's drawing within 0-15 of them, the measurement the threshold was read from.

Credits
  The manifest's ``attribution`` (from :mod:`jdml.data.notices`) names every design's creator,
  copyright, licence and source and what the build changes; the repository's ``NOTICE`` too.

Classes are ordered by the sha256 of their code point sequence: a stable order that mixes the
Unicode categories, so the first half (training) and the second half (test) of
``split_by_class`` hold the same mixture of smileys, animals, objects and symbols.

Pixels
  Every drawing is rendered to RGBA at 64 px (SVGs with resvg into a 64 px square; the PNGs are
  64 px already), composited onto white with the same straight-alpha rule, cropped to its
  visible pixels (alpha >= :data:`ALPHA_MIN`) and resized (Lanczos, aspect kept) so its longer
  side is :data:`CONTENT_SIZE` px, centred on a white 64 x 64 RGB square. So every source has the
  same background and margins, and no source can be told by its framing.

Cache
  ``python -m jdml data fetch emoji`` runs ``npm pack <package>@<version>`` for every source
  into ``<cache>/tarballs`` (``<cache>`` is ``$JDML_CACHE/emoji`` or ``~/.cache/jdml/emoji``),
  refuses a tarball whose sha256 differs from the pinned one, and reads the images straight
  from the tarballs into ``<cache>/emoji.npz`` (images, labels, class_names, designs,
  design_names) and ``<cache>/manifest.json`` (sources with sha256 and licence, designs, classes,
  measured statistics, the npz's sha256). The build is deterministic: the same tarballs give
  byte-identical files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import unicodedata
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from jdml.data.arrays import ImageArrays
from jdml.data.duplicates import cross_class_counts, drop_duplicates, find_groups, neighbours
from jdml.data.notices import manifest_block
from jdml.data.sources import DATASETS, _check_channels, _check_image_size, resize_images
from jdml.errors import DataError, EmojiFetchError
from jdml.fileio import atomic_write, cache_root, sha256_file

FORMAT_VERSION = 2  # 2: duplicate drawings removed (DUPLICATE_RMS)
IMAGE_SIZE = 64
CONTENT_SIZE = 56  # the longer side of every drawing's visible box
ALPHA_MIN = 16  # pixels at least this opaque bound the drawing
MIN_DESIGNS = 4
#: Drawings at most this RMS pixel distance (0-255) apart are one picture (see the docstring).
DUPLICATE_RMS = 6.0
FETCH_COMMAND = "python -m jdml data fetch emoji"
INSTALL_HINT = "pip install 'jdml[emoji]'"

#: (category, subcategory) pairs of emoji.json left out (see the module docstring).
DROPPED_SUBCATEGORIES: tuple[tuple[str, str], ...] = (
    ("Flags", "country-flag"),
    ("Flags", "subdivision-flag"),
    ("Component", "skin-tone"),
)


@dataclasses.dataclass(frozen=True)
class Source:
    """One pinned npm package."""

    package: str
    version: str
    sha256: str
    integrity: str  # npm's dist.integrity of the tarball
    license: str

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def filename(self) -> str:
        return f"{self.package.lstrip('@').replace('/', '-')}-{self.version}.tgz"


@dataclasses.dataclass(frozen=True)
class Design:
    """One design: where its drawings lie in a source tarball."""

    name: str
    package: str
    kind: str  # "datasource" (64 px PNGs named by code points), "openmoji" or "fluent" SVGs
    folder: str
    license: str


SOURCES: tuple[Source, ...] = (
    Source(
        "emoji-datasource-google",
        "16.0.0",
        "fb5fd131b362aab7a55542d2a147a79708cce0a8b1c1bbacd470172708b5c438",
        "sha512-ZRexfzs7MVoLnmzZmNsO4TKhnAJp5D++Vm6PpUpH/jEQQlemp3l88CjZ+DoZ2faM9R4QxZkOPJCoT8DlPhfQ3A==",
        "package MIT; Noto Emoji images Apache-2.0",
    ),
    Source(
        "emoji-datasource-twitter",
        "16.0.0",
        "f64a530c63bca463bd8317fdc4615ce63a53a0c65018e4ce2d848aaba7a28877",
        "sha512-7F+uCuHH+7Qnrc15P5tnbvKkg9E6tlzi4MnT2uW1RlN4pLYTza6cP/dstIfSDMtpjFLWuZewWg8jBbuL2eyELQ==",
        "package MIT; Twemoji images CC-BY-4.0",
    ),
    Source(
        "openmoji",
        "17.0.0",
        "55ee7d13485dec86e9f38c1f3a645a13382d33ff97c0cd845ee824b0aef45e68",
        "sha512-EBnYrNGdcdw+OSXmENeNE1yBNRu6tOraTmoOyUbJkTmvT/+XETp8RZLSJFzD3lrPc5N9CzsyPnRTk0Vp4UaI9w==",
        "CC-BY-SA-4.0",
    ),
    Source(
        "fluentui-emoji",
        "1.3.0",
        "ec892e607e854859b812c7d827801756adc19955b0ef56d4ae8afcddd19492c5",
        "sha512-JTXXwqIie2rWTgOkIJDJxr0WtwTz2WU4kdOq8buLVThYwQ264aFR2jdTyuon2oEbLqqGMT64zI4btyn1saB2xw==",
        "MIT (the npm repackaging, Copyright (c) 2022 Mohammad Abu Mattar); the SVGs are "
        "Microsoft's Fluent Emoji, MIT",
    ),
)

DESIGNS: tuple[Design, ...] = (
    Design(
        "google", "emoji-datasource-google", "datasource", "package/img/google/64/", "Apache-2.0"
    ),
    Design(
        "twitter", "emoji-datasource-twitter", "datasource", "package/img/twitter/64/", "CC-BY-4.0"
    ),
    Design("openmoji-color", "openmoji", "openmoji", "package/color/svg/", "CC-BY-SA-4.0"),
    Design("openmoji-black", "openmoji", "openmoji", "package/black/svg/", "CC-BY-SA-4.0"),
    Design("fluent-color", "fluentui-emoji", "fluent", "package/icons/modern/", "MIT"),
)

DATASOURCE_JSON = "package/emoji.json"
OPENMOJI_JSON = "package/data/openmoji.json"


# --------------------------------------------------------------------------- paths


def default_cache_dir() -> Path:
    """``$JDML_CACHE/emoji`` or ``~/.cache/jdml/emoji``."""
    return cache_root("emoji")


def _root(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir not in (None, "") else default_cache_dir()


def cache_paths(cache_dir: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """The array file and the manifest in the cache folder."""
    root = _root(cache_dir)
    return root / "emoji.npz", root / "manifest.json"


# --------------------------------------------------------------------------- fetch


def check_tarball(path: Path, source: Source) -> None:
    """Raises :class:`EmojiFetchError` unless ``path`` has the pinned sha256."""
    got = sha256_file(path)
    if got != source.sha256:
        raise EmojiFetchError(
            f"{path} has sha256 {got}, but {source.spec} is pinned to {source.sha256}; "
            f"delete the file and run `{FETCH_COMMAND}` again"
        )


def fetch_sources(
    cache_dir: str | os.PathLike[str] | None = None,
    sources: Sequence[Source] = SOURCES,
    npm: str = "npm",
) -> dict[str, Path]:
    """``npm pack`` every source into ``<cache>/tarballs`` (kept ones are checked, not refetched).

    Returns:
      The tarball of every package.
    """
    folder = _root(cache_dir) / "tarballs"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for source in sources:
        path = folder / source.filename
        if not path.is_file():
            exe = shutil.which(npm)
            if exe is None:
                raise EmojiFetchError(
                    f"npm is not installed; it fetches {source.spec} (install Node.js, or put "
                    f"{source.filename} with sha256 {source.sha256} into {folder})"
                )
            cmd = [exe, "pack", source.spec, "--pack-destination", str(folder), "--silent"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0 or not path.is_file():
                raise EmojiFetchError(
                    f"`npm pack {source.spec}` failed (exit {done.returncode}): "
                    f"{done.stderr.strip()[-500:]}"
                )
        check_tarball(path, source)
        out[source.package] = path
    return out


# --------------------------------------------------------------------------- reading


def emoji_key(code: str) -> str:
    """A code point sequence ("1f600", "2764-FE0F") as upper-case hex without FE0F selectors."""
    return "-".join(cp for cp in code.upper().replace("_", "-").split("-") if cp and cp != "FE0F")


def fluent_slug(name: str) -> str:
    """A CLDR short name as a Fluent file stem: "A button (blood type)" -> "a-button-blood-type"."""
    plain = unicodedata.normalize("NFKD", name)
    plain = "".join(ch for ch in plain if not unicodedata.combining(ch)).lower()
    out, dash = [], False
    for ch in plain:
        if ch.isascii() and ch.isalnum():
            out.append(ch)
            dash = False
        elif not dash and out:
            out.append("-")
            dash = True
    return "".join(out).strip("-")


def read_members(path: Path, wanted: Sequence[str]) -> dict[str, bytes]:
    """The contents of the regular members of a tarball whose names start with a ``wanted``
    prefix (one streaming pass; nothing is written to disk)."""
    out = {}
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            if member.isfile() and member.name.startswith(tuple(wanted)):
                fh = tar.extractfile(member)
                if fh is not None:
                    out[member.name] = fh.read()
    return out


@dataclasses.dataclass
class Concept:
    """A candidate class: its code points, name, category and drawings per design."""

    key: str
    name: str = ""
    category: str = ""
    subcategory: str = ""
    drawings: dict[str, tuple[str, bytes]] = dataclasses.field(default_factory=dict)


def _stem(name: str) -> str:
    return name.rsplit("/", 1)[-1].rsplit(".", 1)[0]


def collect_concepts(tarballs: Mapping[str, Path]) -> dict[str, Concept]:
    """Every base emoji with the drawings each design has of it (raw file bytes)."""
    concepts: dict[str, Concept] = {}
    members = {}
    for package, path in tarballs.items():
        prefixes = [d.folder for d in DESIGNS if d.package == package]
        members[package] = read_members(path, [*prefixes, DATASOURCE_JSON, OPENMOJI_JSON])

    def concept(key: str) -> Concept:
        return concepts.setdefault(key, Concept(key))

    # Metadata: emoji.json (Unicode categories) first, OpenMoji's CLDR names over it.
    by_slug: dict[str, str] = {}
    for package in sorted(members):
        files = members[package]
        if DATASOURCE_JSON in files:
            for entry in json.loads(files[DATASOURCE_JSON]):
                c = concept(emoji_key(entry["unified"]))
                c.name = c.name or str(entry.get("name") or "").lower()
                c.category, c.subcategory = entry["category"], entry["subcategory"]
        if OPENMOJI_JSON in files:
            for entry in json.loads(files[OPENMOJI_JSON]):
                if entry.get("skintone"):
                    continue
                key = emoji_key(entry["hexcode"])
                if key not in concepts:
                    continue  # OpenMoji's own extras: no other design draws them
                concepts[key].name = entry["annotation"]
                by_slug.setdefault(fluent_slug(entry["annotation"]), key)
    for design in DESIGNS:
        files = members.get(design.package, {})
        for name in sorted(files):
            if not name.startswith(design.folder):
                continue
            stem = _stem(name)
            if design.kind == "fluent":
                slug = stem.removesuffix("-default")
                if stem != slug and f"{design.folder}{slug}.svg" in files:
                    continue
                key = by_slug.get(slug)
            else:
                key = emoji_key(stem)
            if key in concepts and concepts[key].category:
                concepts[key].drawings[design.name] = (name, files[name])
    return concepts


# --------------------------------------------------------------------------- pixels


def _render_svg(data: bytes) -> Image.Image:
    try:
        import resvg_py
    except ImportError as err:
        raise DataError(f"rendering the emoji SVGs needs resvg-py: {INSTALL_HINT}") from err
    png = resvg_py.svg_to_bytes(
        svg_string=data.decode("utf-8"),
        width=IMAGE_SIZE,
        height=IMAGE_SIZE,
        skip_system_fonts=True,
    )
    return Image.open(io.BytesIO(bytes(png)))


def decode(name: str, data: bytes) -> np.ndarray:
    """A drawing file (PNG or SVG) as a (64, 64, 4) uint8 RGBA array."""
    image = _render_svg(data) if name.endswith(".svg") else Image.open(io.BytesIO(data))
    with image:
        image = image.convert("RGBA")
        if image.size != (IMAGE_SIZE, IMAGE_SIZE):
            image = image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)
        return np.asarray(image, dtype=np.uint8).copy()


def place(rgba: np.ndarray) -> np.ndarray:
    """Composites RGBA onto white, crops to the visible box and centres it (64 x 64 RGB)."""
    alpha = rgba[..., 3:].astype(np.float64) / 255.0
    rgb = rgba[..., :3].astype(np.float64) * alpha + 255.0 * (1.0 - alpha)
    flat = np.clip(np.round(rgb), 0, 255).astype(np.uint8)
    out = np.full((IMAGE_SIZE, IMAGE_SIZE, 3), 255, np.uint8)
    rows = np.flatnonzero((rgba[..., 3] >= ALPHA_MIN).any(axis=1))
    cols = np.flatnonzero((rgba[..., 3] >= ALPHA_MIN).any(axis=0))
    if len(rows) == 0:
        return out
    crop = flat[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    h, w = crop.shape[:2]
    scale = CONTENT_SIZE / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    resized = np.asarray(
        Image.fromarray(crop).resize((nw, nh), Image.Resampling.LANCZOS), dtype=np.uint8
    )
    top, left = (IMAGE_SIZE - nh) // 2, (IMAGE_SIZE - nw) // 2
    out[top : top + nh, left : left + nw] = resized
    return out


def render(name: str, data: bytes) -> tuple[np.ndarray, bool]:
    """The placed image of a drawing and whether it has any visible pixel."""
    rgba = decode(name, data)
    return place(rgba), bool((rgba[..., 3] >= ALPHA_MIN).any())


# --------------------------------------------------------------------------- build


def class_order_key(key: str) -> str:
    """The stable sort key of a class: the sha256 of its code point sequence."""
    return hashlib.sha256(key.encode("ascii")).hexdigest()


def _distance_stats(images: np.ndarray, labels: np.ndarray, groups: Sequence[str]) -> dict:
    """Per subcategory, over 32 px copies of the images: the mean RMS pixel distance (0-255)
    between two designs of one class (``cross_design``), between two classes of the
    subcategory drawn by different designs (``cross_class``), and their ratio."""
    small = images.reshape(len(images), 32, 2, 32, 2, 3).mean((2, 4))
    flat = small.reshape(len(images), -1).astype(np.float64)
    by_group: dict[str, list[int]] = defaultdict(list)
    for c, g in enumerate(groups):
        by_group[g].append(c)
    out = {}
    for g, classes in sorted(by_group.items()):
        idx = np.flatnonzero(np.isin(labels, classes))
        x, y = flat[idx], labels[idx]
        sq = (x**2).sum(1)
        d = np.sqrt(np.maximum(sq[:, None] + sq[None] - 2 * x @ x.T, 0) / x.shape[1])
        pair = ~np.eye(len(idx), dtype=bool)
        within = d[pair & (y[:, None] == y[None])].mean()
        between = d[y[:, None] != y[None]].mean() if len(classes) > 1 else float("nan")
        out[g] = {
            "classes": len(classes),
            "cross_design": round(float(within), 2),
            "cross_class": round(float(between), 2) if len(classes) > 1 else None,
            "ratio": round(float(within / between), 3) if len(classes) > 1 else None,
        }
    return out


def find_duplicates(
    images: np.ndarray,
    labels: np.ndarray,
    designs: np.ndarray,
    keys: Sequence[str],
    concepts: Mapping[str, Concept],
) -> tuple[np.ndarray, dict]:
    """The drawings a clean set keeps (:func:`jdml.data.duplicates.drop_duplicates` at
    :data:`DUPLICATE_RMS`) and the manifest's record of what is dropped and why."""
    near = neighbours(images, 16)
    groups = find_groups(images, DUPLICATE_RMS, near=near)
    keep, cross, within = drop_duplicates(labels, groups)

    def drawing(i: int) -> dict[str, str]:
        key = keys[int(labels[i])]
        return {"class": key, "name": concepts[key].name, "design": DESIGNS[designs[i]].name}

    return keep, {
        "rms_threshold": DUPLICATE_RMS,
        "nearest_other_class": cross_class_counts(images, labels, near=near),
        "cross_class": [
            {"max_rms": g.max_rms, "drawings": [drawing(i) for i in g.members]} for g in cross
        ],
        "within_class": [
            {
                "max_rms": g.max_rms,
                "kept": drawing(g.members[0]),
                "dropped": [drawing(i)["design"] for i in g.members[1:]],
            }
            for g in within
        ],
    }


def build_emoji(tarballs: Mapping[str, Path], sources: Sequence[Source] = SOURCES) -> tuple:
    """Builds the dataset from the (checked) tarballs.

    Returns:
      (arrays, manifest): the npz arrays and the manifest without the npz checksum.
    """
    concepts = collect_concepts(tarballs)
    design_index = {d.name: i for i, d in enumerate(DESIGNS)}
    rendered: dict[str, list[tuple[int, np.ndarray]]] = {}
    blank = 0
    for key in sorted(concepts):
        c = concepts[key]
        if len(c.drawings) < MIN_DESIGNS:
            continue
        rows = []
        for design in sorted(c.drawings, key=design_index.__getitem__):
            image, visible = render(*c.drawings[design])
            if visible:
                rows.append((design_index[design], image))
            else:
                blank += 1
        if len(rows) >= MIN_DESIGNS:
            rendered[key] = rows
    # Measured over every candidate with enough designs, dropped or not.
    measured = sorted(rendered, key=class_order_key)
    m_images = np.stack([im for k in measured for _, im in rendered[k]])
    m_labels = np.concatenate([np.full(len(rendered[k]), i) for i, k in enumerate(measured)])
    groups = [f"{concepts[k].category}/{concepts[k].subcategory}" for k in measured]
    stats = _distance_stats(m_images, m_labels, groups)
    dropped = {f"{a}/{b}" for a, b in DROPPED_SUBCATEGORIES}
    keys = [k for k, g in zip(measured, groups, strict=True) if g not in dropped]
    if not keys:
        raise DataError("no emoji is drawn by enough designs; are the tarballs complete?")
    images = np.stack([im for k in keys for _, im in rendered[k]])
    labels = np.concatenate([np.full(len(rendered[k]), i) for i, k in enumerate(keys)])
    designs = np.asarray([d for k in keys for d, _ in rendered[k]], np.int8)
    keep, duplicates = find_duplicates(images, labels, designs, keys, concepts)
    left = np.bincount(labels[keep], minlength=len(keys))
    kept = [k for i, k in enumerate(keys) if left[i] >= MIN_DESIGNS]
    keep &= left[labels] >= MIN_DESIGNS
    duplicates["classes_dropped"] = [
        {"class": k, "name": concepts[k].name, "designs_left": int(left[i])}
        for i, k in enumerate(keys)
        if left[i] < MIN_DESIGNS
    ]
    duplicates["images_dropped"] = int((~keep).sum())
    rendered = {k: [r for r, ok in zip(rendered[k], keep[labels == i], strict=True) if ok]
                for i, k in enumerate(keys) if k in kept}  # fmt: skip
    keys = kept
    images, designs = images[keep], designs[keep]
    labels = np.concatenate([np.full(len(rendered[k]), i) for i, k in enumerate(keys)])
    labels = labels.astype(np.int32)
    names = [f"{concepts[k].name} ({k})" for k in keys]
    counts = np.bincount(labels)
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "image_size": IMAGE_SIZE,
        "content_size": CONTENT_SIZE,
        "alpha_min": ALPHA_MIN,
        "min_designs": MIN_DESIGNS,
        "sources": [
            {
                "package": s.package,
                "version": s.version,
                "sha256": s.sha256,
                "npm_integrity": s.integrity,
                "license": s.license,
            }
            for s in sources
        ],
        "designs": [
            {"name": d.name, "package": d.package, "folder": d.folder, "license": d.license}
            for d in DESIGNS
        ],
        "attribution": manifest_block(),
        "dropped_subcategories": sorted(dropped),
        "duplicates": duplicates,
        "subcategory_stats": stats,
        "classes": [
            {
                "key": k,
                "name": concepts[k].name,
                "category": concepts[k].category,
                "subcategory": concepts[k].subcategory,
                "designs": [DESIGNS[d].name for d, _ in rendered[k]],
            }
            for k in keys
        ],
        "stats": {
            "num_classes": len(keys),
            "num_images": len(labels),
            "blank_drawings": blank,
            "duplicates_dropped": duplicates["images_dropped"],
            "per_class": {str(n): int((counts == n).sum()) for n in sorted(set(counts))},
            "per_design": {d.name: int((designs == i).sum()) for i, d in enumerate(DESIGNS)},
            "images_sha256": hashlib.sha256(images.tobytes()).hexdigest(),
        },
    }
    arrays = {
        "images": images,
        "labels": labels,
        "class_names": np.asarray(names, dtype=str),
        "designs": designs,
        "design_names": np.asarray([d.name for d in DESIGNS], dtype=str),
    }
    return arrays, manifest


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The npz file content (same arrays, same bytes)."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def write_cache(arrays: Mapping[str, np.ndarray], manifest: dict, cache_dir=None) -> None:
    """Writes the npz, then the manifest holding its sha256."""
    npz_path, manifest_path = cache_paths(cache_dir)
    payload = npz_bytes(arrays)
    manifest = {**manifest, "npz_sha256": hashlib.sha256(payload).hexdigest()}
    atomic_write(npz_path, payload, durable=True)
    text = json.dumps(manifest, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    atomic_write(manifest_path, text, durable=True)


def fetch_and_build(
    cache_dir: str | os.PathLike[str] | None = None,
    sources: Sequence[Source] = SOURCES,
    npm: str = "npm",
) -> dict:
    """Fetches (or checks) the tarballs, builds the dataset and writes the cache; returns the
    manifest."""
    tarballs = fetch_sources(cache_dir, sources, npm)
    arrays, manifest = build_emoji(tarballs, sources)
    write_cache(arrays, manifest, cache_dir)
    return json.loads(cache_paths(cache_dir)[1].read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- loading


def read_cache(cache_dir: str | os.PathLike[str] | None = None) -> tuple[dict, dict]:
    """The cached arrays and manifest, checked against the manifest's sha256."""
    npz_path, manifest_path = cache_paths(cache_dir)
    if not npz_path.is_file() or not manifest_path.is_file():
        raise DataError(
            f"the emoji dataset is not built in {npz_path.parent}; run `{FETCH_COMMAND}` "
            f"(needs npm and {INSTALL_HINT}; set $JDML_CACHE or --cache-dir for another folder)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        payload = npz_path.read_bytes()
    except (OSError, ValueError) as err:
        raise DataError(f"unreadable emoji cache {npz_path.parent}: {err}") from err
    if hashlib.sha256(payload).hexdigest() != manifest.get("npz_sha256"):
        raise DataError(
            f"{npz_path} does not match its manifest (checksum); run `{FETCH_COMMAND}` again"
        )
    with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    return arrays, manifest


@DATASETS.register("emoji")
def load_emoji(
    *,
    path: str = "",
    image_size: int = IMAGE_SIZE,
    cache_dir: str | None = None,
    channels: int = 3,
    skip_unreadable: bool = False,
) -> ImageArrays:
    """The built emoji dataset (``path``, if given, is its cache folder, else ``cache_dir``,
    else ``$JDML_CACHE/emoji`` or ``~/.cache/jdml/emoji``); see the module docstring."""
    del skip_unreadable  # a built array file: checked as a whole
    _check_channels(channels)
    _check_image_size(image_size)
    arrays, _ = read_cache(path or cache_dir or None)
    return ImageArrays(
        images=resize_images(arrays["images"], image_size, channels),
        labels=arrays["labels"].astype(np.int32),
        class_names=tuple(str(x) for x in arrays["class_names"]),
        source=f"emoji {cache_paths(path or cache_dir or None)[0]}",
    )


# --------------------------------------------------------------------------- command line


def contact_sheet(
    arrays: Mapping[str, np.ndarray], num_classes: int = 12, gap: int = 2
) -> Image.Image:
    """One row per design, one column per class (``num_classes`` spread over the class list);
    grey where a design lacks the class."""
    labels, designs, images = arrays["labels"], arrays["designs"], arrays["images"]
    k = int(labels.max()) + 1
    classes = np.linspace(0, k - 1, num_classes).round().astype(int)
    nd, size = len(arrays["design_names"]), images.shape[1]
    sheet = np.full((nd * (size + gap) + gap, len(classes) * (size + gap) + gap, 3), 96, np.uint8)
    for col, c in enumerate(classes):
        for i in np.flatnonzero(labels == c):
            y, x = gap + int(designs[i]) * (size + gap), gap + col * (size + gap)
            sheet[y : y + size, x : x + size] = images[i]
    return Image.fromarray(sheet)
