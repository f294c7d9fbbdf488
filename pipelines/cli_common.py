"""What every module of the command line shares: the ``--set`` overrides (the flag, and its values joined into one
spec string), and the one way a command fails (a message on stderr, an exit code)."""

from __future__ import annotations

import shlex
import sys


def add_set(parser, text: str) -> None:
    """The ``--set KEY=VALUE ...`` flag of ``parser``, ``text`` its help (``overrides`` reads it)."""
    parser.add_argument("--set", action="append", metavar="KEY=VALUE ...", help=text)


def overrides(sets: list[str] | None) -> str:
    """--set may be given several times, each with one or more key=value items."""
    items = [item for s in (sets or []) for item in shlex.split(s)]
    return " ".join(shlex.quote(i) for i in items)


def fail(message: str, code: int = 2) -> int:
    print(f"tpupipe: error: {message}", file=sys.stderr)
    return code
