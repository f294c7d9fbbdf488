"""What a Google Cloud API's error means to the adapters (:class:`Adapter`, the base of every Google Cloud adapter):
``UNAVAILABLE`` and ``DEADLINE_EXCEEDED`` transient, retried with backoff (``call_with_retry``); ``RESOURCE_EXHAUSTED``
a quota or a stockout (:class:`CapacityError`, the user's to resolve) unless it is a rate limit; a change refused while
another operation holds the cluster (``is_busy``), asked again later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.platforms.waiting import wait_for
from components.spec import InfraError

STOCKOUT_MARKERS = (
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "GCE_STOCKOUT",
    "does not have enough resources",
    "STOCKOUT",
    "QUOTA_EXCEEDED",
    "Insufficient quota",
)
RESOURCE_EXHAUSTED = 8
# GKE's FAILED_PRECONDITION while an operation of its own (an auto-upgrade, another run's node pool) holds the cluster:
# "Operation operation-... is currently upgrading cluster X. Please wait and try again once it is done."
# (https://github.com/hashicorp/terraform-provider-google/issues/3650). It passes when that operation ends, so a
# change is asked again until the operation deadline, as terraform-provider-google does for node pools
# (``retryWhileIncompatibleOperation`` in its container service, resource_container_node_pool.go).
# GKE's answers to a change while another operation holds the cluster or the pool ("Troubleshoot concurrent
# operations": https://cloud.google.com/kubernetes-engine/docs/troubleshooting/concurrent-operations).
BUSY_MARKERS = (
    "try again once it is done",
    "incompatible operation",
    "is currently being created, deleted, updated or repaired",
)


class CapacityError(InfraError):
    """No capacity (a stockout) or no quota for what the run asks: the user's to resolve, not retried. ``resource``:
    the plan's record that had none, once the walk that created it knows (``gke.run.walk``)."""

    resource: Any = None


class GkeError(InfraError):
    """A Google Cloud operation (GKE, Compute Engine, Cloud Build) that ended in an error other than capacity."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 30.0


# RESOURCE_EXHAUSTED is a quota (the user's to raise) or a rate limit (asked again later); Google's APIs say which in
# the error's ErrorInfo reason (google/api/error_reason.proto: RATE_LIMIT_EXCEEDED, "the request is denied because it
# violates a rate limit", apart from RESOURCE_QUOTA_EXCEEDED).
RATE_LIMITED = "RATE_LIMIT_EXCEEDED"


def is_rate_limit(exc: BaseException) -> bool:
    return getattr(exc, "reason", None) == RATE_LIMITED


def call_with_retry[T](
    what: str, fn: Callable[[], T], retry: RetryPolicy, log: Callable[[str], None], sleep: Callable[[float], None]
) -> T:
    """``fn()``, with ``UNAVAILABLE`` and ``DEADLINE_EXCEEDED`` (HTTP 503 and 504 on REST) and a rate limit's
    ``RESOURCE_EXHAUSTED`` (``is_rate_limit``) retried with backoff."""
    from google.api_core import exceptions as gexc

    delay = retry.initial_s
    for attempt in range(1, retry.attempts + 1):
        try:
            return fn()
        except (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.GatewayTimeout, gexc.ResourceExhausted) as exc:
            if isinstance(exc, gexc.ResourceExhausted) and not is_rate_limit(exc):
                raise
            if attempt == retry.attempts:
                raise GkeError(f"{what}: still {type(exc).__name__} after {attempt} attempts: {exc.message}") from exc
            log(
                f"  {what}: {type(exc).__name__} ({exc.message}); retrying in {delay:.0f}s "
                f"(attempt {attempt + 1}/{retry.attempts})"
            )
            sleep(delay)
            delay = min(delay * retry.multiplier, retry.max_s)
    raise AssertionError("unreachable")


def progress_every(period_s: float, poll_s: float, what: str, log: Callable[[str], None]) -> Callable[[float], None]:
    """A ``wait_for`` progress callback that logs ``what`` is running about every ``period_s``."""

    def progress(elapsed: float) -> None:
        if int(elapsed) // period_s != int(elapsed - poll_s) // period_s or elapsed < poll_s:
            log(f"  {what}: running ({elapsed:.0f}s)")

    return progress


def is_capacity_error(message: str) -> bool:
    return any(marker in message for marker in STOCKOUT_MARKERS)


def is_busy(message: str) -> bool:
    """A change refused because another operation holds the cluster (``BUSY_MARKERS``): it will pass later."""
    return any(marker in message.lower() for marker in BUSY_MARKERS)


# ---------------------------------------------------------------- the adapter


class Adapter[C]:
    """What every Google Cloud adapter shares: a client (``C``, its type: a GAPIC client, or what an adapter bundles
    of them), progress lines, transient codes retried (``call``), and the poll interval, operation deadline, clock and
    sleep its waits use (injected in tests)."""

    def __init__(
        self,
        client: C,
        *,
        log: Callable[[str], None] = print,
        retry: RetryPolicy | None = None,
        operation_timeout_s: float = 1800.0,
        poll_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.log = log
        self.retry = retry or RetryPolicy()
        self.operation_timeout_s = operation_timeout_s
        self.poll_s = poll_s
        self.clock = clock
        self.sleep = sleep

    def call[T](self, what: str, fn: Callable[[], T]) -> T:
        return call_with_retry(what, fn, self.retry, self.log, self.sleep)

    def poll_until[T](
        self,
        poll: Callable[[], T | None],
        what: str,
        *,
        every_s: float = 0,
        running: str = "",
        timeout_s: float | None = None,
    ) -> T:
        """``poll`` every ``poll_s`` until it returns something (``components.platforms.waiting.wait_for``), with this
        adapter's clock and sleep; past ``timeout_s`` (the operation deadline unless given) a DeadlineExceeded naming
        ``what``. With ``every_s``, a line about every ``every_s`` that ``running`` (``what`` unless given) is
        running (``progress_every``)."""
        progress = progress_every(every_s, self.poll_s, running or what, self.log) if every_s else None
        return wait_for(
            poll,
            timeout_s=self.operation_timeout_s if timeout_s is None else timeout_s,
            interval_s=self.poll_s,
            progress=progress,
            what=what,
            clock=self.clock,
            sleep=self.sleep,
        )

    def change[T](self, what: str, fn: Callable[[], T]) -> T:
        """``call`` for a change to a cluster (a node pool created or deleted, the cluster updated or deleted): while
        another operation holds the cluster (``is_busy``) it is asked again every ``poll_s`` until the operation
        deadline, with a line when the wait starts and about every minute."""
        from google.api_core import exceptions as gexc

        waited: list[float] = []

        def attempt() -> tuple[T] | None:
            try:
                return (self.call(what, fn),)
            except gexc.FailedPrecondition as exc:
                if not is_busy(exc.message or ""):
                    raise
                if not waited or self.clock() - waited[-1] >= 60:
                    self.log(f"  {what}: the cluster is busy ({exc.message}); asking again every {self.poll_s:.0f}s")
                    waited.append(self.clock())
                return None

        return self.poll_until(attempt, f"{what}: the cluster busy with another operation")[0]
