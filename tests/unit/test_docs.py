"""The documentation holds together: a README that names the two commands and links every page of docs/, relative
links and anchors that resolve, and no file of the repository that points outside it (a reader cannot open a path on
someone's machine)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# Paths that name a place outside the repository: a sibling checkout's shared folder, a workstation's work tree.
# Spelled in pieces so that this file does not name them itself.
OUTSIDE = re.compile("|".join([re.escape(".." + "/shared"), r"(?<![\w./-])" + re.escape("/" + "work/")]))

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def doc_pages() -> list[Path]:
    return sorted((REPO / "docs").glob("*.md"))


def prose(path: Path) -> str:
    """The Markdown of ``path`` without its fenced code blocks (a link or heading in code is not one)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path))


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith("//")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path``: lower case, punctuation dropped, spaces to hyphens, a
    repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(prose(path)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    return [REPO / name for name in listed if name and (REPO / name).is_file()]


def test_no_tracked_file_names_a_path_outside_the_repository():
    offenders = []
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not offenders, "paths outside the repository (cite a file in it or a public URL):\n" + "\n".join(offenders)


def test_readme_names_the_two_commands():
    """The README's promise: `make run` and `make test` do everything on a fresh machine, named in one section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert "make run" in section and "make test" in section


def test_readme_links_every_docs_page():
    linked = {
        (README.parent / target.split("#", 1)[0]).resolve()
        for target in links(README)
        if is_relative(target) and not target.startswith("#")
    }
    missing = [str(page.relative_to(REPO)) for page in doc_pages() if page.resolve() not in linked]
    assert doc_pages(), "docs/ has no page"
    assert not missing, f"docs pages README.md does not link: {missing}"


@pytest.mark.parametrize("page", [README, *doc_pages()], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in links(page):
        if not is_relative(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page.resolve()
        if not dest.is_relative_to(REPO) or not dest.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.relative_to(REPO)} has no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(broken)


def test_anchor_rule_matches_githubs():
    """The anchors the link check expects, for headings of the kinds the pages use."""
    page = REPO / "docs" / "local.md"
    assert "ctrl-c-a-killed-terminal-a-lost-driver" in anchors(page)
    assert "the-slice-check" in anchors(page)
