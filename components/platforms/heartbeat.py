"""The driver's heartbeat: while a stage of a run works, its process writes the time to ``heartbeat.json`` in the
run's store every :data:`INTERVAL_S`, so that whoever finds the run's resources (the janitor; a submit that names
its run id) can tell a live run from one whose driver is gone, whatever its age. The heartbeat is an object of its
own, not a field of the ledger: the ledger is written whole by the stage as it creates things, and a second writer
of it would race them (``components.platforms.ledger``)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

from components.platforms.store import RunStore, read_json, write_json

KEY = "heartbeat.json"
INTERVAL_S = 60.0
# Fresh: beaten within this. Between two stages of a Vertex AI run no task beats while the next one's container
# starts (a minute or two), hence several intervals.
STALE_S = 10 * INTERVAL_S


def beat(store: RunStore, stage: str, now: float | None = None) -> None:
    write_json(
        store,
        KEY,
        {"at": time.time() if now is None else now, "stage": stage, "host": socket.gethostname(), "pid": os.getpid()},
    )


def age_s(store: RunStore, now: float | None = None) -> float | None:
    """Seconds since the run's last heartbeat; None when it has none."""
    found = read_json(store, KEY) or {}
    if "at" not in found:
        return None
    return (time.time() if now is None else now) - float(found["at"])


def fresh(store: RunStore, now: float | None = None) -> float | None:
    """The heartbeat's age when it is fresh (the run's driver is alive), else None."""
    age = age_s(store, now)
    return age if age is not None and age < STALE_S else None


@contextlib.contextmanager
def beating(store: RunStore, stage: str, interval_s: float = INTERVAL_S) -> Iterator[None]:
    """Beat now and every ``interval_s`` until the block ends. A write that fails (a transient storage error) is
    skipped: the next beat tries again, and a run is never failed by its heartbeat."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            with contextlib.suppress(Exception):
                beat(store, stage)

    with contextlib.suppress(Exception):
        beat(store, stage)
    thread = threading.Thread(target=loop, name=f"heartbeat-{stage}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
