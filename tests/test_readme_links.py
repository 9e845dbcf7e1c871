"""The README stays what a person deciding to try Tandem reads: short, its links whole, every page
of docs/ reachable from it, and its test command the one CI runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 200

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text outside fenced blocks and code spans, where a [x](y) is a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("//")


def anchors(page: Path) -> set[str]:
    """GitHub's ids for a Markdown page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    ids = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M):
        heading = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def test_the_pages_have_links_to_check():
    assert DOCS, "docs/ holds no pages"
    assert links(README), "the README links nothing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_that_exists(page: Path):
    broken = []
    for target in filter(is_relative, links(page)):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif not file.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: {file.name} has no heading with the id #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < MAX_README_LINES, f"README.md has {lines} lines: engineering detail belongs in docs/"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in filter(is_relative, links(README))}
    missing = [str(page.relative_to(ROOT)) for page in DOCS if page.resolve() not in linked]
    assert not missing, f"pages of docs/ the README does not link: {missing}"


def readme_commands() -> list[str]:
    """The commands of the README's first shell block (the two commands), comments left off."""
    block = re.search(r"^```sh\n(.*?)^```$", README.read_text(encoding="utf-8"), re.M | re.S)
    assert block, "the README has no ```sh block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.split("#", 1)[0].strip()]


def ci_commands() -> list[str]:
    """What .ci/run executes, less the shell's set-up (set, cd, export)."""
    commands = []
    for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and shlex.split(line)[0] not in ("set", "cd", "export"):
            commands.append(line)
    return commands


def test_the_readme_test_command_is_what_ci_runs():
    commands = readme_commands()
    assert commands == ["make run", "make test"], f"the README's two commands changed: {commands}"
    assert ci_commands() == ["make test"], f".ci/run no longer runs the README's test command: {ci_commands()}"
    # the README's own lines, byte for byte, as CI's comment says
    text = README.read_text(encoding="utf-8")
    assert "make run    # the Tandem window, chatting with the offline demo model\n" in text
    assert "make test   # the test suite\n" in text
