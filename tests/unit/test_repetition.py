"""Cohesion over caps: no block of product code is written twice. A run of ``WINDOW`` or more lines that stands, to the
letter (indentation aside), in two places of ``components``, ``pipelines`` or ``trainers`` fails this test unless it
is one of the pairs already known (``KNOWN``, each a place to look, never to grow): a new repeated block is
refactored into one function where the logic really is the same.

Lines that carry no logic are left out before comparing (blank lines, comments, imports, lone brackets), so a
match is code that repeats, not layout."""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("components", "pipelines", "trainers")
WINDOW = 8
TRIVIAL = re.compile(r"^(#.*|from .* import .*|import .*|[)\]}]+,?:?|\"\"\"|else:|try:|pass|return|\.\.\.)?$")
# The repeated runs present when this test was written, by the files they join (each pair once): places to look.
KNOWN = {
    # One KFP component per stage: KFP reads each component's typed signature, so each names its parameters itself.
    ("components/definitions.py", "components/definitions.py"),
}


def code_lines(path: Path) -> list[tuple[int, str]]:
    out = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not TRIVIAL.match(line):
            out.append((number, line))
    return out


def repeated_pairs(root: Path = REPO) -> dict[tuple[str, str], str]:
    """Every pair of files (or a file with itself) that share a run of ``WINDOW`` code lines, with the first place."""
    seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            lines = code_lines(path)
            name = str(path.relative_to(root))
            for i in range(len(lines) - WINDOW + 1):
                block = "\n".join(text for _, text in lines[i : i + WINDOW])
                seen[hashlib.sha1(block.encode()).hexdigest()].append((name, lines[i][0]))
    pairs: dict[tuple[str, str], str] = {}
    for places in seen.values():
        if len(places) < 2:
            continue
        (a, la), (b, lb) = places[0], places[1]
        if a == b and abs(la - lb) < WINDOW:
            continue
        key = (a, b) if a <= b else (b, a)
        pairs.setdefault(key, f"{a}:{la} ~ {b}:{lb}")
    return pairs


def test_no_new_block_of_code_is_written_twice():
    new = {key: where for key, where in repeated_pairs().items() if key not in KNOWN}
    assert new == {}, "a block written twice (refactor it into one function): " + "; ".join(sorted(new.values()))


def test_a_block_written_twice_is_found(tmp_path):
    body = "".join(f"    x{i} = compute({i}, value)\n" for i in range(WINDOW))
    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "a.py").write_text(f"def f(value):\n{body}")
    (tmp_path / "components" / "b.py").write_text(f"def g(value):\n    other = 1\n{body}")
    assert list(repeated_pairs(tmp_path)) == [("components/a.py", "components/b.py")]
