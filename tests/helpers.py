"""What the tests share: the repository and the `tpupipe` command."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tpupipe_cmd() -> list[str]:
    return [str(BIN / "tpupipe")]
