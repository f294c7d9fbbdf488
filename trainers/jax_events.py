"""What JAX and Orbax report of a JAX trainer's compiles and checkpoint saves, as ``TPUPIPE`` events.

Both report through ``jax.monitoring`` (jax 0.12, ``jax/_src/monitoring.py``: ``register_event_listener``,
``register_event_time_span_listener``, ``register_event_duration_secs_listener``):

- every XLA compile of a program, and every load of one from the persistent compilation cache instead, runs inside
  the time span ``/jax/core/compile/backend_compile_duration`` (``jax/_src/dispatch.py``: ``BACKEND_COMPILE_EVENT``,
  around ``compiler.compile_or_get_cached``), and a load from the cache records ``/jax/compilation_cache/cache_hits``
  inside it (``jax/_src/compiler.py``, ``compile_or_get_cached``); a damaged cache entry is a warning and a compile
  (``_cache_read``), never an error;
- Orbax records how long a save blocked the caller, ``/jax/orbax/write/async/blocking_duration_secs`` (or
  ``/jax/orbax/write/blocking_duration_secs`` for a synchronous save), and the save's whole duration, blocking and
  background, ``/jax/orbax/write/async/total_duration_secs``, on the primary host
  (``orbax/checkpoint/_src/logging/event_tracking.py``, ``record_blocking_completion`` and ``record_completion``).

The events: ``compiled`` (a compile or cache load of at least ``MIN_COMPILE_S``: its end, seconds and whether the
cache had it), ``compile_cache`` (every compile of the process so far, counted: compiles, cache hits, seconds),
``checkpoint_written`` (a save's whole duration, once its background write is done); the seconds a save blocked
training wait in ``take_blocked`` for the trainer's ``checkpoint`` event, which names the step (MaxText logs it once
the save returns: ``maxtext_log.CHECKPOINT_LINE``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

COMPILE_SPAN = "/jax/core/compile/backend_compile_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"
SAVE_BLOCKED = ("/jax/orbax/write/async/blocking_duration_secs", "/jax/orbax/write/blocking_duration_secs")
SAVE_TOTAL = "/jax/orbax/write/async/total_duration_secs"
# Two parts of a save's blocking time, recorded before it (``orbax/checkpoint/_src/checkpointers/
# async_checkpointer.py``, ``AsyncCheckpointer.save``): the hosts' barrier at the save's start, and the wait for the
# previous save's background write.
SAVE_PARTS = {
    "/jax/orbax/write/checkpoint_start_sync_duration_secs": "start_sync_s",
    "/jax/orbax/write/blocking_wait_prev_duration_secs": "wait_previous_s",
}
MIN_COMPILE_S = 0.05  # shorter compiles (MaxText's many small initialisation programs) are counted, not listed


class JaxEvents:
    """Listens to ``jax.monitoring`` and hands each event to ``emit(kind, payload)``; ``summary`` is the totals."""

    def __init__(self, emit: Callable[[str, dict[str, Any]], None]):
        self.emit = emit
        self.lock = threading.Lock()
        self.compiles = self.hits = 0
        self.seconds = 0.0
        self.hit_pending = threading.local()
        self.blocked: float | None = None
        self.parts: dict[str, float] = {}

    def register(self) -> JaxEvents:
        import jax.monitoring

        jax.monitoring.register_event_listener(self.on_event)
        jax.monitoring.register_event_time_span_listener(self.on_span)
        jax.monitoring.register_event_duration_secs_listener(self.on_duration)
        return self

    def on_event(self, event: str, **_: Any) -> None:
        if event == CACHE_HIT:
            self.hit_pending.value = True

    def on_span(self, event: str, start: float, end: float, **_: Any) -> None:
        if event != COMPILE_SPAN:
            return
        hit = bool(getattr(self.hit_pending, "value", False))
        self.hit_pending.value = False
        with self.lock:
            self.compiles += 1
            self.hits += hit
            self.seconds += end - start
        if end - start >= MIN_COMPILE_S:
            self.emit("event", {"event": "compiled", "seconds": round(end - start, 4), "hit": hit, "time": end})

    def on_duration(self, event: str, seconds: float, **_: Any) -> None:
        if event in SAVE_BLOCKED:
            self.blocked = seconds
        elif event in SAVE_PARTS:
            self.parts[SAVE_PARTS[event]] = round(seconds, 4)
        elif event == SAVE_TOTAL:
            self.emit("event", {"event": "checkpoint_written", "seconds": round(seconds, 4), "time": time.time()})

    def take_blocked(self) -> dict[str, float] | None:
        """The seconds the last save blocked training (``seconds``) and its parts Orbax timed, once (None: none
        reported since)."""
        blocked, parts, self.blocked, self.parts = self.blocked, self.parts, None, {}
        return None if blocked is None else {"seconds": round(blocked, 4), **parts}

    def summary(self) -> dict[str, Any]:
        with self.lock:
            return {
                "event": "compile_cache",
                "compiles": self.compiles,
                "hits": self.hits,
                "seconds": round(self.seconds, 3),
                "time": time.time(),
            }
