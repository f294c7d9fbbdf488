"""How a command ends on an error: one line on stderr, ``tpupipe: error: <message>``, and the exit code it returns
(2 for bad input, the default; 1 for a failure). The command line and the backends share it."""

from __future__ import annotations

import sys


def fail(message: str, code: int = 2) -> int:
    print(f"tpupipe: error: {message}", file=sys.stderr)
    return code
