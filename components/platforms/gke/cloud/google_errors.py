"""What a Google Cloud API's error means to the gke platform's adapters (``cluster.Adapter`` and those built on it):
``UNAVAILABLE`` and ``DEADLINE_EXCEEDED`` transient, retried with backoff (``call_with_retry``); ``RESOURCE_EXHAUSTED``
a quota or a stockout (:class:`CapacityError`, the user's to resolve) unless it is a rate limit; a change refused while
another operation holds the cluster (``is_busy``), asked again later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
BUSY_MARKERS = ("try again once it is done", "incompatible operation")


class CapacityError(InfraError):
    """No capacity (a stockout) or no quota for what the run asks: the user's to resolve, not retried."""


class GkeError(InfraError):
    """A GKE operation that ended in an error other than capacity."""


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


def is_rate_limit(exc) -> bool:
    return getattr(exc, "reason", None) == RATE_LIMITED


def call_with_retry(
    what: str, fn: Callable[[], Any], retry: RetryPolicy, log: Callable[[str], None], sleep: Callable[[float], None]
) -> Any:
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
