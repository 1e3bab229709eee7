"""Reruns the claim-table commands of a documentation page and puts their tables in place.

Every fenced ``bash`` block of the page whose command runs ``experiments/emoji_claims.py`` is run
again (with this Python, from the repository root; its plot is rewritten too), and the first
Markdown table after the block is replaced with the table the command prints. Run it after new
run records land; ``tests/test_readme_results.py`` then checks the page against the records.

    python tools/update_claim_tables.py [docs/results.md]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = "experiments/emoji_claims.py"
FENCE = re.compile(r"```bash\n(.*?)```\n", re.S)


def table_lines(text: str) -> list[str]:
    """The first Markdown table (its run of lines starting with "|") of ``text``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return []
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def run_command(command: str) -> str:
    """Stdout of one documented command (``python`` is this interpreter).

    Raises:
      RuntimeError: if the command fails, with its error output.
    """
    argv = shlex.split(command.replace("\\\n", " "))
    if argv[0] == "python":
        argv[0] = sys.executable
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{command.strip()!r} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def update(page: str) -> int:
    """Replaces the table after each claim command of ``page``; returns how many changed.

    Raises:
      RuntimeError: for a command that fails, or one without a table after it on the page or in
        its output.
    """
    with open(page) as f:
        text = f.read()
    changed = 0
    for match in reversed(list(FENCE.finditer(text))):
        command = match.group(1)
        if SCRIPT not in command:
            continue
        new = table_lines(run_command(command))
        old = table_lines(text[match.end() :])
        if not new or not old:
            raise RuntimeError(f"no table after {command.strip()!r} (printed or on the page)")
        if old == new:
            continue
        changed += 1
        at = text.index("\n".join(old), match.end())
        text = text[:at] + "\n".join(new) + text[at + len("\n".join(old)) :]
    if changed:
        tmp = f"{page}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, page)
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", nargs="?", default=os.path.join(ROOT, "docs", "results.md"))
    args = parser.parse_args()
    try:
        changed = update(args.page)
    except (OSError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    print(f"{args.page}: {changed} claim table(s) changed")


if __name__ == "__main__":
    main()
