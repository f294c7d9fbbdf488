"""The torch image runs every process on tcmalloc, as torch_tpu asks (torch-tpu 0.2.0,
``torch_tpu/_tcmalloc_check.py``): its Dockerfile read as instructions, there being no Docker engine here."""

from __future__ import annotations

import re
import shlex

from tests.helpers import REPO

DOCKERFILE = REPO / "images" / "torch" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined and comments left out."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), " ".join(rest.split())))
    return found


def preloaded() -> tuple[str, list[tuple[str, str]]]:
    """The path the image's ``LD_PRELOAD`` names (its ARG resolved), and the instructions before that ENV."""
    steps = instructions(DOCKERFILE.read_text())
    args = dict(a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a)
    index, value = next(
        (i, a.split("=", 1)[1]) for i, (word, a) in enumerate(steps) if word == "ENV" and "LD_PRELOAD=" in a
    )
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], value), steps[:index]


def test_the_torch_image_installs_tcmalloc_checks_it_is_there_and_preloads_it():
    path, before = preloaded()
    assert path == "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"  # Debian's file, both package names
    runs = [a for word, a in before if word == "RUN"]
    install = next(a for a in runs if "libtcmalloc-minimal4" in a)
    assert {"libtcmalloc-minimal4t64", "libtcmalloc-minimal4"} <= set(shlex.split(re.sub(r"[()]", " ", install)))
    assert 'test -e "$TCMALLOC"' in install  # a build without the library fails there, not at the first import
