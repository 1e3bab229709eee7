"""The pinned typefaces of the glyph dataset (:mod:`jdml.data.glyphs`): where the installed font
packages keep their files, which instances (weight and style) each family contributes, and the
one-line error naming a missing or mismatched package and its fix.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fontTools.ttLib import TTFont

from jdml.errors import MissingFontsError

#: The pinned font packages; must equal the ``glyphs`` extra in pyproject.toml.
FONT_PINS: tuple[str, ...] = (
    "fontpkg-alegreya-sans==2.4",
    "fontpkg-arimo==1.341",
    "fontpkg-bitter==3.21",
    "fontpkg-cardo==1.45",
    "fontpkg-comfortaa==3.105",
    "fontpkg-cormorant-garamond==4.1",
    "fontpkg-eb-garamond==1.3",
    "fontpkg-exo-2==2.10",
    "fontpkg-fira-code==5.2.post1",
    "fontpkg-fira-sans==4.203",
    "fontpkg-fraunces==1.0",
    "fontpkg-geologica==1.10",
    "fontpkg-ibm-plex-mono==2.3",
    "fontpkg-ibm-plex-sans==3.201",
    "fontpkg-ibm-plex-serif==2.6",
    "fontpkg-inter==4.1.post1",
    "fontpkg-jetbrains-mono==2.211",
    "fontpkg-josefin-sans==2.1",
    "fontpkg-jost==3.710",
    "fontpkg-lato==2.15",
    "fontpkg-literata==3.103",
    "fontpkg-lobster==2.100",
    "fontpkg-lora==3.8",
    "fontpkg-manrope==4.505",
    "fontpkg-merriweather==2.100",
    "fontpkg-montserrat==9.0",
    "fontpkg-noto-sans==2.15",
    "fontpkg-noto-serif==2.15",
    "fontpkg-nunito==3.602",
    "fontpkg-open-sans==3.3",
    "fontpkg-oswald==4.103",
    "fontpkg-play==2.101",
    "fontpkg-playfair-display==1.203",
    "fontpkg-press-start-2p==3.0",
    "fontpkg-pt-sans==2.3",
    "fontpkg-pt-serif==1.0",
    "fontpkg-raleway==4.26",
    "fontpkg-roboto==3.15",
    "fontpkg-roboto-condensed==3.8",
    "fontpkg-roboto-mono==3.1",
    "fontpkg-roboto-slab==2.2",
    "fontpkg-rubik==2.300",
    "fontpkg-russo-one==1.0",
    "fontpkg-sofia-sans==4.101",
    "fontpkg-source-code-pro==1.26",
    "fontpkg-source-sans-3==3.52",
    "fontpkg-source-serif-4==4.4",
    "fontpkg-space-mono==1.3",
    "fontpkg-spectral==2.5",
    "fontpkg-unbounded==1.701",
    "fontpkg-vollkorn==5.1",
    "fontpkg-yanone-kaffeesatz==2.3",
    "fontpkg-zilla-slab==1.2",
)


#: (style, weight) targets of each family; the last replaces italic for roman-only families.
INSTANCE_TARGETS: tuple[tuple[str, int], ...] = (("normal", 400), ("normal", 700), ("italic", 400))
ROMAN_ONLY_EXTRA: tuple[str, int] = ("normal", 300)

INSTALL_HINT = "pip install 'jdml[glyphs]'"


@dataclasses.dataclass(frozen=True)
class FontFile:
    """One font file of an installed font package.

    Attributes:
      package: distribution name, e.g. ``fontpkg-roboto``.
      version: installed version of the package.
      relpath: path of the file inside the package directory, e.g. ``files/Roboto[...].ttf``.
      path: absolute path of the file.
      style: ``"normal"`` or ``"italic"``.
      weight: weight of a static file; ``None`` for a variable font.
    """

    package: str
    version: str
    relpath: str
    path: Path
    style: str
    weight: int | None

    @property
    def family(self) -> str:
        return self.package.removeprefix("fontpkg-")


@dataclasses.dataclass(frozen=True)
class Instance:
    """A rendering setup: a font file and its variation axis values (fvar order)."""

    font: FontFile
    variation: tuple[tuple[str, float], ...] = ()

    @property
    def family(self) -> str:
        return self.font.family


def parse_pin(pin: str) -> tuple[str, str]:
    """Splits ``"name==version"`` into its parts."""
    name, sep, version = pin.partition("==")
    if not sep or not name or not version:
        raise ValueError(f"font pin {pin!r} is not of the form 'name==version'")
    return name.strip(), version.strip()


def _installed_version(package: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _same_version(installed: str, pinned: str) -> bool:
    """PEP 440 equality for plain versions: numeric segments compare as numbers (1.045 == 1.45)."""

    def norm(v: str) -> list[str]:
        return [str(int(s)) if s.isdigit() else s.lower() for s in v.strip().split(".")]

    return norm(installed) == norm(pinned)


def _package_dir(package: str) -> Path | None:
    """Directory of the importable module of a font package, or None."""
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _missing_fonts_message(problems: Sequence[str], pins: Sequence[str]) -> str:
    """The error text for missing or mismatched font packages (``pins``: the ones to install)."""
    wanted = " ".join(f"'{p}'" for p in pins)
    return (
        "the glyphs dataset needs its pinned font packages: "
        + "; ".join(problems)
        + f". Install them with `{INSTALL_HINT}` (from the jdml checkout) or with "
        + f"`pip install {wanted}`"
    )


def _package_files(package: str, version: str, root: Path) -> list[FontFile]:
    """The font files of one package, as described by its ``metadata.json``."""
    meta_path = root / "metadata.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise MissingFontsError(
            f"font package {package} is broken ({meta_path}: {err}); reinstall it with "
            f"`pip install --force-reinstall {package}=={version}`"
        ) from err
    files = []
    for entry in meta["files"]:
        path = root / entry["path"]
        if not path.is_file():
            raise MissingFontsError(
                f"font package {package} lacks {entry['path']}; reinstall it with "
                f"`pip install --force-reinstall {package}=={version}`"
            )
        weight = None if entry.get("variable") else int(entry["weight"])
        files.append(FontFile(package, version, entry["path"], path, entry["style"], weight))
    return files


def locate_fonts(pins: Sequence[str] | None = None) -> list[FontFile]:
    """All font files of the pinned packages, in pin order.

    Raises:
      MissingFontsError: naming every package that is missing or at another version, with
        the command that installs them.
    """
    pins = FONT_PINS if pins is None else pins
    problems, bad_pins, found = [], [], []
    for pin in pins:
        package, version = parse_pin(pin)
        installed = _installed_version(package)
        root = _package_dir(package) if installed is not None else None
        if installed is None or root is None:
            problems.append(f"{package} is not installed")
        elif not _same_version(installed, version):
            problems.append(f"{package} is at version {installed}, pinned {version}")
        else:
            found.append((package, version, root))
            continue
        bad_pins.append(pin)
    if problems:
        raise MissingFontsError(_missing_fonts_message(problems, bad_pins))
    return [f for package, version, root in found for f in _package_files(package, version, root)]


def _nearest_static(files: Sequence[FontFile], style: str, weight: int) -> FontFile | None:
    """The static file of ``style`` whose weight is nearest to ``weight`` (lighter on ties)."""
    options = [f for f in files if f.style == style and f.weight is not None]
    if not options:
        return None
    return min(options, key=lambda f: (abs(f.weight - weight), f.weight, f.relpath))


def _variable_instance(font: FontFile, weight: int, axes: Sequence[Any]) -> Instance:
    """The instance of a variable font at ``weight`` (clipped); other axes at default."""
    values = []
    for axis in axes:
        value = axis.defaultValue
        if axis.axisTag == "wght":
            value = min(max(float(weight), axis.minValue), axis.maxValue)
        values.append((axis.axisTag, float(value)))
    return Instance(font, tuple(values))


def _family_targets(files: Sequence[FontFile]) -> tuple[tuple[str, int], ...]:
    """The (style, weight) targets of a family: regular, bold, italic (or light)."""
    if any(f.style == "italic" for f in files):
        return INSTANCE_TARGETS
    return (*(t for t in INSTANCE_TARGETS if t[0] != "italic"), ROMAN_ONLY_EXTRA)


def _fvar_axes(path: Path) -> list[Any]:
    """The variation axes of a font file (empty for a static font)."""
    font = TTFont(path, lazy=True)
    try:
        return list(font["fvar"].axes) if "fvar" in font else []
    finally:
        font.close()


def _by_family(files: Sequence[FontFile]) -> list[list[FontFile]]:
    """The files grouped by package, packages in the given order."""
    families: dict[str, list[FontFile]] = {}
    for f in files:
        families.setdefault(f.package, []).append(f)
    return list(families.values())


def _target_fonts(files: Sequence[FontFile]) -> list[tuple[FontFile, int]]:
    """Per target of a family: its file (the variable file of the style, else the static
    file of the nearest weight) and the target weight."""
    chosen = []
    for style, weight in _family_targets(files):
        variable = [f for f in files if f.style == style and f.weight is None]
        font = variable[0] if variable else _nearest_static(files, style, weight)
        if font is not None:
            chosen.append((font, weight))
    return chosen


def family_instances(files: Sequence[FontFile]) -> list[Instance]:
    """The distinct instances of one family, regular first (see the module docstring)."""
    instances: list[Instance] = []
    for font, weight in _target_fonts(files):
        if font.weight is None:
            instance = _variable_instance(font, weight, _fvar_axes(font.path))
        else:
            instance = Instance(font)
        if instance not in instances:
            instances.append(instance)
    return instances


def select_instances(files: Sequence[FontFile]) -> list[Instance]:
    """The instances of all families, family by family in the given order."""
    return [inst for fam in _by_family(files) for inst in family_instances(fam)]


def selected_files(files: Sequence[FontFile]) -> list[FontFile]:
    """The files that ``select_instances`` uses (found without opening any font)."""
    used: list[FontFile] = []
    for fam in _by_family(files):
        used += [font for font, _ in _target_fonts(fam) if font not in used]
    return used


def character_map(path: Path) -> frozenset[int]:
    """Codepoints the font really maps to a glyph."""
    font = TTFont(path, lazy=True)
    try:
        return frozenset(font.getBestCmap() or {})
    finally:
        font.close()
