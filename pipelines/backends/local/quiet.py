"""What ``tpupipe run`` shows while a run goes: progress, not plumbing.

kfp.local prints every task's executor input and output, its artifacts, and everything the task prints, the Ray jobs'
streamed logs among it: hundreds of lines before the summary. Without ``--verbose`` the driver's standard output and
error (and so every task's, which inherit them) go to the run's ``logs/pipeline.log`` whole, and the terminal gets the
lines a person follows a run by: each stage as it starts (``== stage``) and ends (with its seconds), what the stage
says it is doing (the cluster starting, a job re-attached; once, and not the results the summary shows again), the
progress bars of training and evaluation (``components/stages/progress.py``: on a terminal drawn again in place; piped,
a bar's first and last lines and at most one a minute between), warnings, errors, and what the driver itself says (an
interrupt, teardown). ``--verbose`` streams everything, as kfp.local prints it.
"""

from __future__ import annotations

import codecs
import os
import re
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from components.platforms import interrupts
from components.stages import progress

ANSI = re.compile(r"\x1b\[[0-9;]*m")
KFP_LOG = re.compile(r"^\d\d:\d\d:\d\d\.\d+ - (?P<level>[A-Z]+) - (?P<message>.*)$")
TASK_START = re.compile(r"^Executing task '(?P<task>[\w-]+)'")
TASK_END = re.compile(r"^Task '(?P<task>[\w-]+)' finished with status (?P<status>\w+)")
# A task's output that is plumbing: kfp's executor (its log lines, the executor input's JSON, the outputs and
# artifacts it prints), the streamed log of a Ray job (``[train] ...``), and the Ray SDK's own INFO lines.
PLUMBING = re.compile(
    r"""^(?:[\[\]{}"]|\)|Output:\ |uri=|metadata=|\w+:\ \w+\(\ name=|\d{4}-\d\d-\d\d\ [\d:,.]+\s+(?:INFO|DEBUG)\b)""",
    re.X,
)
# What a stage says of its result that the summary shows again at the end (components/stages/report.py).
# Also a job's submission (the stage's start said it), an epoch's loss (the train bar shows it) and what the data
# snapshot found (the summary's data line and status say it).
RESULTS = re.compile(
    r"^(?:check_slice:\ (?:\d+/\d+\ ranks\ verified|all-reduce\ of)|evaluate:\ [\w-]+\ loss"
    r"|register:\ |gate:\ |promote:\ champion|\w+:\ submitted\ Ray\ job\ |train:\ epoch\ \d|snapshot_data:\ )",
    re.X,
)
# A progress line that repeats the last one shown but for its figures ("waiting for 3 nodes ... 20s" after "... 10s")
# is shown again only this long after it: a long wait still says it is waiting, once a minute.
REPEAT_S = 60.0
DIGITS = re.compile(r"\d+(?:\.\d+)?")
POLL_S = 0.1


class Shown:
    """Picks the lines to show from kfp.local's stream, one line at a time (its state: when each task started)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started: dict[str, float] = {}  # task -> when it started
        self.said: set[str] = set()
        self.last: tuple[str, float] = ("", 0.0)  # the last task line shown, without its figures, and when

    def __call__(self, line: str) -> str | None:
        text = ANSI.sub("", line.rstrip("\n"))
        stripped = text.strip()
        if not stripped or stripped.startswith("-----"):
            return None
        found = KFP_LOG.match(text)
        if found:
            message = found["message"]
            start, end = TASK_START.match(message), TASK_END.match(message)
            if start:
                self.started[start["task"]] = self.clock()
                return None
            if end:
                began = self.started.pop(end["task"], None)
                status = end["status"].lower().replace("success", "succeeded")
                return f"    {end['task']}: {status}" + (f" ({self.clock() - began:.1f}s)" if began is not None else "")
            return text if found["level"] in ("WARNING", "ERROR", "CRITICAL") else None
        if text[0].isspace():  # a task's output
            if progress.LINE.match(stripped):
                return text  # the terminal draws it (Render)
            if PLUMBING.match(stripped) or RESULTS.match(stripped) or stripped in self.said:
                return None
            self.said.add(stripped)  # said once: a second stage's same line (the image's environment) is not news
            shape, now = DIGITS.sub("#", stripped), self.clock()
            if text.startswith("      ") and shape == self.last[0] and now - self.last[1] < REPEAT_S:
                return None  # a wait's progress, indented under its stage, again: not yet
            self.last = (shape, now)
        return text


class Render:
    """What the terminal gets for each line :class:`Shown` picked: a progress bar's line (``progress.LINE``) on a
    terminal (``tty``) drawn over the bar's last line, the next other line starting on a line of its own; piped, a
    bar's first line (again after a restart moved it back), its last, and between them one line at most every
    ``REPEAT_S``: the log a pipe fills stays short, the run's log has every line."""

    def __init__(self, tty: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.tty, self.clock = tty, clock
        self.open = False  # a bar is drawn on the terminal's current line
        self.bars: dict[str, tuple[int, float]] = {}  # piped: a bar -> (its last done, when it was last shown)

    def __call__(self, line: str) -> str:
        bar = progress.LINE.match(line.strip())
        if bar is None:
            text, self.open = ("\n" if self.open else "") + line + "\n", False
            return text
        if self.tty:
            text, self.open = ("\r\x1b[2K" if self.open else "") + line, True
            return text
        done, total, now = int(bar["done"]), int(bar["total"]), self.clock()
        seen, shown_at = self.bars.get(bar["what"], (None, 0.0))
        show = seen is None or done <= seen or done >= total or now - shown_at >= REPEAT_S
        self.bars[bar["what"]] = (done, now if show else shown_at)
        return line + "\n" if show else ""

    def close(self) -> str:
        """What ends the output: the line a bar is drawn on."""
        text, self.open = "\n" if self.open else "", False
        return text


class Quiet:
    """While inside: file descriptors 1 and 2 are a pipe (the tasks inherit it) that a thread reads as it fills,
    writing everything to ``log`` and the lines :class:`Shown` picks to the terminal the descriptors were before, at
    once (a test, or a person, answers what it shows: a second Ctrl-C during a teardown of a second). Leaving, the
    descriptors are given back (unless something else moved them meanwhile: a closed terminal's ``driver.log``) and
    what is left in the pipe is read."""

    def __init__(self, log: Path):
        self.log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved: tuple[int, int] = (-1, -1)
        self._read = -1

    def __enter__(self) -> Quiet:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        self._read, write = os.pipe()
        for target in (1, 2):
            os.dup2(write, target)
        os.close(write)
        self._thread = threading.Thread(target=self._follow, name="tpupipe-quiet", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        if os.fstat(1).st_ino == os.fstat(self._read).st_ino:  # still the pipe: give the terminal back
            for saved, target in zip(self._saved, (1, 2), strict=True):
                os.dup2(saved, target)
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        for fd in (*self._saved, self._read):
            os.close(fd)

    def _follow(self) -> None:
        # The driver's signals are never this thread's: after the first, the driver blocks them in its threads and
        # takes them with sigwait (pipelines/backends/local/driver.py); a thread that left them unblocked would get
        # them instead.
        signal.pthread_sigmask(signal.SIG_BLOCK, interrupts.SIGNALS)
        shown, out, pending = Shown(), self._saved[0], ""
        render = Render(os.isatty(out))
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode  # a character may span two reads
        with open(self.log, "ab") as log:
            while True:
                ready, _, _ = select.select([self._read], [], [], POLL_S)
                data = os.read(self._read, 65536) if ready else b""
                if not data:
                    if not ready and not self._stop.is_set():
                        continue
                    break  # the end of the pipe, or nothing more once the run is over
                log.write(data)
                log.flush()
                *lines, pending = (pending + decode(data)).split("\n")
                out = _write(out, "".join(render(s) for s in map(shown, lines) if s is not None))
            last = shown(pending) if pending else None
            _write(out, (render(last) if last else "") + render.close())


def _write(fd: int, text: str) -> int:
    """Write ``text`` whole to ``fd``; the descriptor to write to next: -1 once it fails (the terminal is gone, and
    the log has it all)."""
    data = text.encode()
    while data and fd >= 0:
        try:
            data = data[os.write(fd, data) :]
        except OSError:
            return -1
    return fd
