"""Waiting as a small loop with an injected clock: steppable in tests, a deadline always."""

from __future__ import annotations

import time
from collections.abc import Callable

from components.spec import InfraError


class DeadlineExceeded(InfraError, TimeoutError):
    """A wait ran past its deadline; the message names what was waited for."""


def wait_for[T](
    poll: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 1.0,
    progress: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``poll`` until it returns something other than None, or raise DeadlineExceeded after timeout_s.
    ``poll`` raises to abort (a failure it recognises); ``progress`` gets the elapsed seconds each round."""
    started = clock()
    while True:
        result = poll()
        if result is not None:
            return result
        elapsed = clock() - started
        if elapsed >= timeout_s:
            raise DeadlineExceeded(f"timed out after {timeout_s:.0f}s waiting for {what}")
        if progress:
            progress(elapsed)
        sleep(interval_s)
