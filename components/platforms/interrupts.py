"""Interrupts: SIGINT (Ctrl-C), SIGTERM (``kill``, a cancelled Vertex run) and SIGHUP (a closed terminal) end a stage
by stopping what it started.

A stage process runs inside :func:`on_interrupt` blocks: the innermost one's ``stop`` (stop the Ray job, cancel the
GKE operation or the Cloud Build) runs once on the first signal, then :class:`Interrupted` unwinds the stage, which
records itself interrupted; the process exits 128 + the signal's number. Later signals are ignored while it unwinds.
A SIGTERM is not always a stop: where a process's SIGTERM can also mean "this process is being moved, the work goes
on" (a Vertex AI task whose pod is evicted, retried by its pipeline), :func:`sigterm_judged_by` names what decides;
when it says no, nothing is stopped and the stage still ends, so its retry finds what it started still running.
:func:`deferred` holds a signal back while a process is started and recorded, so none is started unrecorded.

The driver (``tpupipe run``, the process that runs the whole pipeline) marks the run interrupted in
``interrupted.json`` in its store (:func:`mark`): a stage that starts after that does not run, and the report says which
stage the interrupt hit. Its pid (and start time) is what the local platform's host keeper watches
(:func:`driver`, :func:`alive`): when the driver is gone, the keeper exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from components.platforms import procs
from components.platforms.store import RunStore, read_json, write_json

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C; kill or a cancelled run; a closed terminal
DRIVER_ENV = "TPUPIPE_DRIVER_PID"  # set by the driver; every stage process (and what it starts) inherits it
MARK_KEY = "interrupted.json"


class Interrupted(SystemExit):
    """The stage was ended by a signal; the process exits 128 + signum. ``at``: when the signal came
    (``time.monotonic()``), for what must still be done within the grace its sender gives."""

    def __init__(self, signum: int, at: float | None = None):
        super().__init__(128 + signum)
        self.signum = signum
        self.at = time.monotonic() if at is None else at

    @property
    def signal_name(self) -> str:
        return signal_name(self.signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class _State:
    received: int | None = None  # the first signal taken; later ones are ignored until the outermost block ends
    depth: int = 0  # on_interrupt blocks entered
    deferring: int = 0
    pending: int | None = None
    sigterm_stops: Callable[[], bool] = staticmethod(lambda: True)  # whether a SIGTERM stops what the stage started
    # What a stop does before the innermost block's own stop (``released_first``), and whether it released.
    release: Callable[[int], bool] | None = None
    released: bool = False


_state = _State()


@contextlib.contextmanager
def sigterm_judged_by(decide: Callable[[], bool]) -> Iterator[None]:
    """While inside, a SIGTERM stops what the stage started only when ``decide()`` says so (it is asked once, when the
    signal comes); SIGINT and SIGHUP always do."""
    previous, _state.sigterm_stops = _state.sigterm_stops, decide
    try:
        yield
    finally:
        _state.sigterm_stops = previous


@contextlib.contextmanager
def released_first(release: Callable[[int], bool]) -> Iterator[None]:
    """While inside, a signal that stops the stage first calls ``release(signum)`` (start deleting what bills), then
    the innermost block's ``stop``: the deletes go out before anything that may wait. When ``release`` says it
    released (True), the stops that follow need not wait for what they stop to end (:func:`released`): its machines
    are going away."""
    previous, _state.release, _state.released = _state.release, release, False
    try:
        yield
    finally:
        _state.release = previous


def released() -> bool:
    """Whether the stop under way has already started deleting what the run runs on (``released_first``)."""
    return _state.released


@contextlib.contextmanager
def on_interrupt(
    stop: Callable[[int], None] = lambda _signum: None, log: Callable[[str], None] = print
) -> Iterator[None]:
    """While inside: the first SIGINT, SIGTERM or SIGHUP calls ``stop(signum)`` and raises :class:`Interrupted`. Only
    the main thread takes signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        if _state.deferring:
            _state.pending = signum
            return
        if _state.received is not None:
            return
        _state.received, at = signum, time.monotonic()
        if signum == signal.SIGTERM and not _sigterm_stops(log):
            raise Interrupted(signum, at)  # what runs is left running: the stage ends without stopping it
        try:
            _state.released = bool(_state.release(signum)) if _state.release is not None else False
        except Exception as exc:  # noqa: BLE001 - the stop below still runs; teardown deletes what is left
            log(f"{signal_name(signum)}: could not start the deletes: {exc}")
        try:
            stop(signum)
        except Exception as exc:  # noqa: BLE001 - the stage still ends; teardown deletes what stop could not
            log(f"{signal_name(signum)}: could not stop cleanly: {exc}")
        raise Interrupted(signum, at)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    _state.depth += 1
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _state.depth -= 1
        if not _state.depth:
            _state.received = None


def _sigterm_stops(log: Callable[[str], None]) -> bool:
    try:
        return _state.sigterm_stops()
    except Exception as exc:  # noqa: BLE001 - what cannot be judged is taken for a stop, as without a judge
        log(f"SIGTERM: could not tell whether it stops the run ({exc}): stopping")
        return True


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal that arrives inside takes effect when the block ends (a process started is a process recorded)."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        if not _state.deferring and _state.pending is not None:
            signum, _state.pending = _state.pending, None
            os.kill(os.getpid(), signum)  # delivered again, now to the handler in force


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """While inside, Ctrl-C does nothing here (teardown: the driver counts the presses and may abandon it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------- the driver's mark


def mark(store: RunStore, stage: str, signum: int) -> None:
    """Record (once) that the run was interrupted by ``signum`` during ``stage``."""
    if not store.exists(MARK_KEY):
        write_json(store, MARK_KEY, {"stage": stage, "signal": signal_name(signum), "at": time.time()})


def mark_abandoned(store: RunStore) -> None:
    """Record that teardown was abandoned: no teardown task starts after this (``tpupipe teardown`` still does)."""
    write_json(store, MARK_KEY, {**(marked(store) or {}), "abandoned": True})


def marked(store: RunStore) -> dict[str, Any] | None:
    """The driver's mark: ``{stage, signal, at}``, or None when the run was not interrupted."""
    found: dict[str, Any] | None = read_json(store, MARK_KEY)  # the JSON object mark() writes
    return found


# ---------------------------------------------------------------- the driver, as the keeper watches it


def driver() -> dict[str, int]:
    """The run's driver: the process named by $TPUPIPE_DRIVER_PID (``tpupipe run`` sets it), else this process."""
    pid = int(os.environ.get(DRIVER_ENV) or os.getpid())
    return {"pid": pid, "started": procs.start_time(pid) or 0}


def alive(record: dict[str, int]) -> bool:
    """Whether the driver ``record`` names is still running (not a later process that got its pid)."""
    return procs.start_time(record["pid"]) == record["started"]
