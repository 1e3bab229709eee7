"""The README and the documentation pages in docs/ hold together where the site build does not look.

``mkdocs build --strict`` (CI's full part, mkdocs.yml) checks the links between the pages of
docs/. These tests check the rest without mkdocs: the README's links into docs/ reach an existing
file and heading (under the anchors GitHub and the site both give it), the sections the README
shares with the site's pages are the same text, the README's test command is the one CI runs,
and the site's navigation lists every page.
"""

from __future__ import annotations

import os
import re
import unicodedata

import pytest

from tests.helpers import REPO

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# The sections of the README that the site's pages carry too, word for word: (heading, page).
SHARED = [("## Quick start", "docs/index.md"), ("## Your own data", "docs/datasets.md")]


def _read(path: str) -> str:
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a ``#`` comment in a block is no heading)."""
    lines, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            lines.append(line)
    return lines


def site_anchor(heading: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's toc extension)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    """The anchors of a Markdown file's headings that both GitHub and the site give."""
    found = set()
    for line in _prose_lines(_read(path)):
        match = re.match(r"^#{1,6} (.+?)\s*$", line)
        if match:
            heading = match.group(1).replace("`", "").replace("*", "")
            if site_anchor(heading) == github_anchor(heading):
                found.add(site_anchor(heading))
    return found


def readme_links() -> list[str]:
    """The README's relative link and image targets (web addresses left out)."""
    text = "\n".join(_prose_lines(_read("README.md")))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t)]


def test_anchors_follow_github_and_the_site():
    heading = "Emoji: the papers' protocol on real artwork"
    assert site_anchor(heading) == github_anchor(heading)
    assert site_anchor(heading) == "emoji-the-papers-protocol-on-real-artwork"
    assert site_anchor("A - B") != github_anchor("A - B")  # such a heading gets no anchor


def test_readme_links_reach_existing_files_and_headings():
    links = readme_links()
    assert len(links) >= 15  # the feature table's and the documentation list's links are found
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        if not os.path.exists(os.path.join(REPO, path)):
            broken.append(f"{target}: no file {path}")
        elif anchor and anchor not in anchors(path):
            broken.append(f"{target}: no heading of {path} has the anchor #{anchor}")
    assert not broken, "broken README links:\n" + "\n".join(broken)


def section(text: str, heading: str) -> str:
    """The text of a section, from its heading to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)
    end, fence = len(lines), False
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("```"):
            fence = not fence
        if not fence and re.match(rf"^#{{1,{level}}} ", lines[i]):
            end = i
            break
    return "\n".join(lines[start:end]).strip()


@pytest.mark.parametrize(("heading", "page"), SHARED)
def test_the_readme_and_the_site_share_sections_word_for_word(heading, page):
    assert section(_read("README.md"), heading) == section(_read(page), heading)


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", section(_read("README.md"), "## Quick start"))
    assert len(commands) == 2  # train and evaluate; the tests
    ci = _read(".ci/run").split("# The README's test command (keep the two in sync):\n", 1)[1]
    assert commands[1].endswith(" && " + ci.splitlines()[0].strip())


def test_the_site_navigation_lists_every_page():
    listed = re.findall(r"^\s*- [^:\n]+: (\S+\.md)\s*$", _read("mkdocs.yml"), re.M)
    pages = sorted(
        os.path.relpath(os.path.join(root, name), os.path.join(REPO, "docs"))
        for root, _, names in os.walk(os.path.join(REPO, "docs"))
        for name in names
        if name.endswith(".md")
    )
    assert sorted(listed) == pages


def test_notice_and_readme_credit_every_design():
    """NOTICE is the text ``jdml.data.notices`` generates, and the README's credits name every
    design's work, creator and licence."""
    from jdml.data.notices import ATTRIBUTIONS, FIGURES, notice_text

    assert _read("NOTICE") == notice_text()
    readme = _read("README.md")
    credits = readme[readme.index("## Credits and licences") :]
    for a in ATTRIBUTIONS:
        assert a.work.split(",")[0].split(" (")[0] in credits, a.work
        assert a.creator.split(" (")[0] in credits and a.license in credits, a.creator
    for figure in FIGURES:
        assert os.path.exists(os.path.join(REPO, figure)), figure
    for name in ("Apache-2.0.txt", "CC-BY-SA-4.0.txt"):
        assert os.path.getsize(os.path.join(REPO, "LICENSES", name)) > 10_000
