"""What ``tpupipe run`` — the driver: it runs the compiled pipeline with kfp.local, each stage a subprocess — does on
SIGINT (Ctrl-C), SIGTERM and SIGHUP (a closed terminal: what it prints then goes to the run's ``logs/driver.log``).

The first interrupt marks the run interrupted (``components.platforms.interrupts.mark``) and passes the signal on
to the running stage, which stops its work (the Ray job, the GKE or Cloud Build operation, the cluster start) and
exits; kfp.local then runs the exit handler's task, teardown, as after any failure; ``tpupipe run`` prints the summary
(what teardown deleted) and exits 128 + the signal's number (130, 143, 129). Another interrupt says that teardown is
running and what one more would leave behind; that one kills teardown's task (none starts after it) and prints the
command that finishes the cleanup.

A terminal's Ctrl-C reaches the whole foreground process group, the stage's process with the driver: the stage takes
the first signal it gets, and ignores the rest. Teardown's task starts with Ctrl-C ignored (the driver ignores it
after the first, and counts the presses in a thread of its own).
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TextIO, cast

from components.platforms import RunContext, get_platform, interrupts, procs
from components.platforms.store import read_json
from components.stages.table import STAGES

EXECUTOR = "kfp.dsl.executor_main"  # the module a stage process runs (`python -m`)


def task_processes(driver_pid: int) -> list[int]:
    """The processes of this driver's tasks: they carry its pid in their environment and stay in its process group
    (the clusters a stage starts have groups and sessions of their own)."""
    group = os.getpgid(driver_pid)
    return [
        pid
        for pid in procs.carrying(interrupts.DRIVER_ENV, str(driver_pid))
        if pid != driver_pid and procs.group_of(pid) == group
    ]


def running_stages(driver_pid: int) -> list[tuple[int, str]]:
    """``(pid, stage)`` of each stage process (kfp's executor) of this driver that is running now."""
    found = []
    for pid in task_processes(driver_pid):
        args = procs.cmdline(pid)
        if EXECUTOR in args and "--function_to_execute" in args:
            found.append((pid, args[args.index("--function_to_execute") + 1]))
    return found


def teardown_command(ctx: RunContext, output_root: str) -> str:
    return shlex.join(["tpupipe", "teardown", ctx.run_id, "--platform", ctx.platform, "--output-root", output_root])


class Interrupts:
    """While inside: the driver's handler of SIGINT, SIGTERM and SIGHUP (see the module's docstring). ``signum`` is the
    first signal taken (None when none came); ``abandoned`` says whether a later one abandoned teardown."""

    def __init__(self, ctx: RunContext, output_root: str) -> None:
        self.ctx, self.output_root = ctx, output_root
        self.signum: int | None = None
        self.count = 0
        self.abandoned = False
        self._lock = threading.Lock()
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None] = {}
        self._streams = (sys.stdout, sys.stderr)
        self._logging = False
        self._redirect = threading.RLock()

    def __enter__(self) -> Interrupts:
        os.environ[interrupts.DRIVER_ENV] = str(os.getpid())  # every stage (and the keeper) knows the driver
        self._previous = {s: signal.signal(s, self._first) for s in interrupts.SIGNALS}
        # A _Terminal is a TextIO by delegation: it writes and flushes, and hands every other attribute to its stream.
        sys.stdout, sys.stderr = (cast(TextIO, _Terminal(stream, self._to_log)) for stream in self._streams)
        return self

    def __exit__(self, *_exc: object) -> None:
        # After an interrupt the signals stay blocked (see _first): the driver is about to print the summary and exit.
        for s, h in self._previous.items():
            signal.signal(s, h)
        sys.stdout, sys.stderr = self._streams

    def _to_log(self) -> None:
        """The terminal is gone: what the driver prints from now on goes to the run's ``logs/driver.log`` (once)."""
        with self._redirect:  # reentrant: SIGHUP's handler may run inside a redirecting write (twice is harmless)
            if self._logging:
                return
            logs = self.ctx.run_dir / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            log = os.open(logs / "driver.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            for fd in (1, 2):
                os.dup2(log, fd)
            os.close(log)
            self._logging = True

    @staticmethod
    def say(message: str) -> None:
        """Straight to stderr's descriptor: a handler must not re-enter a print the main thread is in."""
        os.write(2, f"\ntpupipe: {message}\n".encode())

    def _current_stage(self) -> str:
        """The stage running now; between two stages, the next one (it will not start)."""
        running = [stage for _pid, stage in running_stages(os.getpid())]
        if running:
            return running[0]
        return next((s for s in STAGES if _status(self.ctx, s) != "succeeded"), STAGES[-1])

    def left_behind(self) -> str:
        left = get_platform(self.ctx.platform).remaining(self.ctx)
        return ", ".join(left) if left else "nothing the ledger records"

    def _first(self, signum: int, _frame: FrameType | None) -> None:
        """The first interrupt (in the main thread): mark the run, pass the signal to the running stage. From then on
        the signals are blocked here and taken by a thread of their own (``_more``, with ``sigwait``), and SIGINT's
        disposition is to ignore it: an ignored signal stays ignored in the processes started after it, through
        their ``sh`` too, so teardown's task never sees a Ctrl-C, not even while Python starts. (Linux keeps a
        blocked signal pending even when its disposition is to ignore it: ``sigwait`` still takes it.)"""
        if self.count:
            return self._more(signum)
        self.count, self.signum = 1, signum
        if signum == signal.SIGHUP:  # the terminal is gone: what the driver prints from now on goes to the run's log
            self._to_log()
        stage = self._current_stage()
        interrupts.mark(self.ctx.store, stage, signum)
        signal.pthread_sigmask(signal.SIG_BLOCK, interrupts.SIGNALS)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        threading.Thread(target=self._take_more, name="tpupipe-interrupts", daemon=True).start()
        if stage == "teardown":
            self.count = 2  # it came during teardown: the next one abandons it
            return self._say_teardown_runs(signum, stage)
        self.say(
            f"{interrupts.signal_name(signum)} during {stage}: stopping it, then tearing down run "
            f"{self.ctx.run_id} (teardown runs to the end; interrupt again to see what stopping it would leave "
            "behind)"
        )
        for pid, running in running_stages(os.getpid()):
            if running != "teardown":
                procs.signal_process(pid, signum)  # a terminal's Ctrl-C got there too: the stage takes the first

    def _take_more(self) -> None:
        while not self.abandoned:
            self._more(signal.sigwait(set(interrupts.SIGNALS)))

    def _more(self, signum: int) -> None:
        with self._lock:
            self.count += 1
            if self.count == 2:
                return self._say_teardown_runs(signum, self._current_stage())
            if self.abandoned:
                return
            # Abandon: no teardown task starts from now on (the mark says so), the one running is killed.
            self.abandoned = True
            interrupts.mark_abandoned(self.ctx.store)
            for pid in task_processes(os.getpid()):
                procs.signal_process(pid, signal.SIGKILL)

    def _say_teardown_runs(self, signum: int, stage: str) -> None:
        self.say(
            f"{interrupts.signal_name(signum)}: teardown of run {self.ctx.run_id} is running"
            + (f" (after {stage} stops)" if stage != "teardown" else "")
            + f"; interrupt again to abandon it, leaving behind: {self.left_behind()}"
        )

    def exit_abandoned(self) -> int:
        """Say what is left and how to finish; the exit status."""
        self.say(
            f"teardown abandoned; left behind: {self.left_behind()}\n"
            f"finish the cleanup with: {teardown_command(self.ctx, self.output_root)}"
        )
        return 128 + (self.signum or signal.SIGINT)


class _Terminal:
    """The driver's stdout or stderr while it runs: a write that a closed terminal refuses (EIO, which may come before
    SIGHUP's handler has run) sends what the driver prints from then on to the run's log, as SIGHUP does, and is
    written there."""

    def __init__(self, stream: TextIO, to_log: Callable[[], None]) -> None:
        self._stream, self._to_log = stream, to_log

    def _again[T](self, call: Callable[..., T], *args: Any) -> T:
        try:
            return call(*args)
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            self._to_log()
            return call(*args)

    def write(self, text: str) -> int:
        return self._again(self._stream.write, text)

    def flush(self) -> None:
        self._again(self._stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _status(ctx: RunContext, stage: str) -> str:
    try:
        status: str = (read_json(ctx.store, f"stages/{stage}.json") or {}).get("status", "")
        return status
    except ValueError:  # a record being written
        return ""
