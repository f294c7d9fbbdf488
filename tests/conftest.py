import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BIN = Path(sys.executable).parent


def tpupipe_cmd() -> list[str]:
    return [str(BIN / "tpupipe")]


os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
