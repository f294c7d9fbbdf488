"""What the tests share: the repository, the `tpupipe` command, run ids of this test session's own, and waiting on a
condition with a deadline."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable
from pathlib import Path

from components.platforms.waiting import DeadlineExceeded, wait_for
from components.spec import names

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Made once per test session: two sessions on one machine never share a run id, so neither tears down (kills by the
# run's marker) what the other started.
SESSION = secrets.token_hex(3)


def tpupipe_cmd() -> list[str]:
    return [str(BIN / "tpupipe")]


def unique_run_id(name: str) -> str:
    """``name`` made this test session's own (``e2e-good`` -> ``e2e-good-3fa9c1``), a valid run id."""
    return names.run_id_from(f"{name}-{SESSION}", "")


def wait_until[T](
    condition: Callable[[], T],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    detail: Callable[[], object] | None = None,
) -> T:
    """Call ``condition`` until it returns something true (returned); after ``timeout_s``, fail saying what was
    waited for and what was seen: ``detail()``, else the condition's last answer."""
    last: list = [None]

    def poll():
        last[0] = condition()
        return last[0] or None

    try:
        return wait_for(poll, timeout_s=timeout_s, what=what, interval_s=interval_s)
    except DeadlineExceeded:
        seen = detail() if detail else last[0]
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (seen: {seen!r})") from None
