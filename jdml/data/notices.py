"""Who made the emoji artwork, under which licence, and what jdml changed: one copy, used by
the manifest of the built set, the ``NOTICE`` file, the README and the figures that show it.

Every design of :mod:`jdml.data.emoji` is a third party's artwork. Its licence asks for the
creator, a copyright line, the licence and a link, and (CC BY, CC BY-SA, Apache-2.0) a note of
what was modified; CC BY-SA 4.0 (OpenMoji) also asks that an adaptation shared is shared under
the same licence, so a figure holding OpenMoji drawings is CC BY-SA 4.0.
"""

from __future__ import annotations

import dataclasses
import textwrap

from PIL import Image, ImageDraw, ImageFont

#: What the build does to every drawing (the modification the licences ask to be noted).
MODIFICATION = (
    "rendered or read at 64 px, composited onto white, cropped to the visible drawing, resized "
    "(Lanczos, longer side 56 px) and recentred on a 64 x 64 square; copies and near-copies "
    "removed"
)


@dataclasses.dataclass(frozen=True)
class Attribution:
    """The credit one design's artwork asks for."""

    designs: tuple[str, ...]  # the design names of jdml.data.emoji.DESIGNS it covers
    work: str
    creator: str
    copyright: str
    license: str  # SPDX identifier
    license_url: str
    source: str  # where the artwork comes from
    via: str  # how jdml gets it

    def line(self) -> str:
        return (
            f"{self.work} by {self.creator} ({self.copyright}), {self.license} "
            f"<{self.license_url}>, from {self.source}; {self.via}"
        )


ATTRIBUTIONS: tuple[Attribution, ...] = (
    Attribution(
        ("google",),
        "Noto Emoji images",
        "Google",
        "Copyright Google LLC",
        "Apache-2.0",
        "https://www.apache.org/licenses/LICENSE-2.0",
        "https://github.com/googlefonts/noto-emoji (v2.048)",
        "read from the npm package emoji-datasource-google 16.0.0 (Cal Henderson, MIT)",
    ),
    Attribution(
        ("twitter",),
        "Twemoji graphics",
        "Twitter, Inc and other contributors (maintained fork by jdecked)",
        "Copyright Twitter, Inc and other contributors",
        "CC-BY-4.0",
        "https://creativecommons.org/licenses/by/4.0/",
        "https://github.com/jdecked/twemoji (v16.0.1)",
        "read from the npm package emoji-datasource-twitter 16.0.0 (Cal Henderson, MIT)",
    ),
    Attribution(
        ("openmoji-color", "openmoji-black"),
        "OpenMoji, the open-source emoji and icon project",
        "the OpenMoji designers (HfG Schwäbisch Gmünd and contributors)",
        "All emojis designed by OpenMoji",
        "CC-BY-SA-4.0",
        "https://creativecommons.org/licenses/by-sa/4.0/",
        "https://openmoji.org (npm package openmoji 17.0.0)",
        "its data/openmoji.json (CC-BY-SA-4.0) also gives the class names",
    ),
    Attribution(
        ("fluent-color",),
        "Fluent Emoji (the 'modern' colour SVGs)",
        "Microsoft",
        "Copyright Microsoft Corporation",
        "MIT",
        "https://github.com/microsoft/fluentui-emoji",
        "https://github.com/microsoft/fluentui-emoji",
        "read from the npm package fluentui-emoji 1.3.0, a third-party repackaging by Mohammad "
        "Abu Mattar (MIT, Copyright (c) 2022 Mohammad Abu Mattar) whose tarball carries only "
        "its own notice, not Microsoft's",
    ),
)

#: The licence a figure or file holding drawings of every design is shared under.
COMBINED_LICENSE = "CC-BY-SA-4.0"


def manifest_block() -> dict[str, object]:
    """The attribution block of the emoji manifest."""
    return {
        "modification": MODIFICATION,
        "license_of_the_built_set": (
            f"{COMBINED_LICENSE} as a whole (it adapts OpenMoji's drawings); every design "
            "also stays under its own licence below"
        ),
        "designs": [dataclasses.asdict(a) for a in ATTRIBUTIONS],
    }


def figure_notice() -> str:
    """The notice a figure showing emoji artwork carries."""
    credits = "; ".join(f"{a.work}: {a.copyright}, {a.license}" for a in ATTRIBUTIONS)
    return (
        f"Emoji artwork adapted ({MODIFICATION.split(';')[0]}) from {credits}. "
        f"This figure: {COMBINED_LICENSE}. Details: NOTICE in the jdml repository."
    )


def stamp(image: Image.Image, text: str | None = None) -> Image.Image:
    """``image`` with ``text`` (default :func:`figure_notice`) written in a strip under it."""
    text = figure_notice() if text is None else text
    font = ImageFont.load_default()
    probe = ImageDraw.Draw(image)
    char = max(1, int(probe.textlength("x" * 20, font=font) / 20))
    lines = textwrap.wrap(text, width=max(20, (image.width - 8) // char))
    height = int(probe.textbbox((0, 0), "Ag", font=font)[3]) + 3
    out = Image.new("RGB", (image.width, image.height + len(lines) * height + 6), "white")
    out.paste(image.convert("RGB"), (0, 0))
    draw = ImageDraw.Draw(out)
    for n, line in enumerate(lines):
        draw.text((4, image.height + 3 + n * height), line, fill=(40, 40, 40), font=font)
    return out


#: The repository's files that show emoji artwork (each carries :func:`figure_notice`).
FIGURES: tuple[str, ...] = (
    "docs/figures/emoji_contact_sheet.png",
    "docs/figures/emoji_retrieval_grid.png",
)


def _fill(text: str, indent: str = "") -> str:
    return textwrap.fill(
        text,
        94,
        initial_indent=indent,
        subsequent_indent=" " * len(indent),
        break_on_hyphens=False,
        break_long_words=False,
    )


def notice_text() -> str:
    """The repository's ``NOTICE`` file."""
    credits = "\n".join(_fill(a.line(), "  * ") for a in ATTRIBUTIONS)
    figures = "\n".join(f"  * {f}" for f in FIGURES)
    paragraphs = [
        "jdml: third-party material\n==========================",
        _fill(
            "The emoji dataset is built on the user's machine from pinned npm packages "
            "(`python -m jdml data fetch emoji`); no drawing of it is shipped here except in "
            "the figures listed below."
        ),
        "Emoji artwork, by design:",
        credits,
        _fill(f"Changes made to every drawing: {MODIFICATION}."),
        _fill(
            "Figures in this repository that show the artwork (each carries a notice in the "
            "image; as adaptations of OpenMoji's drawings they are licensed CC BY-SA 4.0, "
            "https://creativecommons.org/licenses/by-sa/4.0/):"
        ),
        figures,
        _fill(
            "Licence texts: LICENSES/Apache-2.0.txt (Noto Emoji images); "
            "LICENSES/CC-BY-SA-4.0.txt (OpenMoji, and the figures above); CC BY 4.0 "
            "(Twemoji): https://creativecommons.org/licenses/by/4.0/legalcode; MIT (Fluent "
            "Emoji): https://github.com/microsoft/fluentui-emoji."
        ),
    ]
    return "\n\n".join(paragraphs) + "\n"
