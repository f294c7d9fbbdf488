"""Progress bars for the steps a stage waits on: training steps (FSDP's ``step`` events, MaxText's per-step metrics)
and evaluation batches (the evaluation job's ``eval_model`` events).

A stage prints one plain line per update, ``progress <what> [#####.....] done/total <unit>  <figures>  ETA ..``;
what a person sees of it is the terminal's business (``pipelines/backends/local/quiet.py``): on a terminal the bar is drawn again in
place, piped it shows a bar's first and last lines and at most one a minute between, and the run's log keeps every
one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PREFIX = "progress "
WIDTH = 24  # the bar's characters
LINE = re.compile(r"^progress (?P<what>\S+) \[[#.]*\] (?P<done>\d+)/(?P<total>\d+) ")
RECENT = 8  # the updates an ETA and a rate are taken over: the last few, not the first's compile


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def bar(what: str, done: int, total: int, unit: str, figures: str = "", eta_s: float | None = None) -> str:
    """One progress line (``LINE`` reads it back)."""
    total = max(total, 1)
    filled = min(WIDTH, WIDTH * max(done, 0) // total)
    eta = f"  ETA {duration(eta_s)}" if eta_s is not None and done < total else ""
    return (
        f"{PREFIX}{what} [{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{total} {unit}"
        + (f"  {figures}" if figures else "")
        + eta
    )


@dataclass
class Bar:
    """Updates of one bar, each printed with ``log``: ``update(done, **figures)`` at each step's end, timed by
    ``clock``; the ETA and the rate from the last ``RECENT`` updates. A step seen again (a restarted worker group
    running it again) moves the bar back."""

    what: str
    total: int
    unit: str
    log: Callable[[str], None]
    clock: Callable[[], float] = time.time
    times: list[tuple[int, float]] = field(default_factory=list)  # (done, when)

    def update(
        self,
        done: int,
        when: float | None = None,
        loss: float | None = None,
        tokens: float = 0.0,
        rate: float | None = None,
        total: int | None = None,
    ) -> str:
        """Print and return the line for ``done`` of ``total`` (given here when the records carry it) at ``when`` (the
        step's own time, else now), with the last ``loss`` known and the tokens per second: ``rate`` as measured, else
        from ``tokens`` a step."""
        self.total = total or self.total
        now = self.clock() if when is None else when
        if self.times and done <= self.times[-1][0]:
            self.times = [t for t in self.times if t[0] < done]  # repeated after a restart: from there again
        self.times = [*self.times, (done, now)][-RECENT:]
        figures, eta = [], None
        if loss is not None:
            figures.append(f"loss {loss:.4f}")
        if rate:
            figures.append(f"{rate:.0f} tokens/s")
        if len(self.times) > 1:
            (d0, t0), (d1, t1) = self.times[0], self.times[-1]
            per = (t1 - t0) / (d1 - d0) if d1 > d0 and t1 > t0 else None
            if per:
                eta = (self.total - done) * per
                if tokens and not rate:
                    figures.append(f"{tokens / per:.0f} tokens/s")
        line = bar(self.what, done, self.total, self.unit, "  ".join(figures), eta)
        self.log(line)
        return line
