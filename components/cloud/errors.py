"""What a Google Cloud API's error means to the adapters (:class:`Adapter`, the base of every Google Cloud adapter):
transient answers retried with backoff (``call_with_retry``, ``is_transient``): gRPC's ``UNAVAILABLE`` and
``DEADLINE_EXCEEDED``, and over REST the HTTP statuses Google lists as transient, 408, 429 and the 5xx of a server or
gateway in trouble, and a 403 that names a rate limit (Compute Engine's); a rate limit (``is_rate_limited``) with its
own longer backoff (``RATE_LIMIT_RETRY``), past the minute in which rate quotas refill; ``RESOURCE_EXHAUSTED`` a quota
or a stockout (:class:`CapacityError`, the user's to resolve) unless it is a rate limit; a change refused while
another operation holds the cluster (``is_busy``), asked again later.
"""

from __future__ import annotations

import random as _random
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


class RateLimited(GkeError):
    """A long-running operation that ended in a rate limit (``is_rate_limited``): what it was to do is not done, and a
    new request may start it again once the rate refills (Compute Engine's ``RESOURCE_OPERATION_RATE_EXCEEDED``:
    ``compute.OPERATION_RATE_CODES``)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Truncated exponential backoff with proportional jitter: the wait before a retry is its exponential delay
    (``initial_s`` times ``multiplier`` per retry, at most ``max_s``) and up to ``jitter`` of it again, drawn at random,
    so callers that failed together do not all come back together (Cloud Storage's retry strategy "uses exponential
    backoff with jitter", https://cloud.google.com/storage/docs/retry-strategy; google-api-core draws each wait at
    random too, ``random.uniform(0.0, max_delay)`` in ``exponential_sleep_generator``,
    google/api_core/retry/retry_base.py at 2.44.0). The exponential delay is the least wait rather than the most, as
    it is in api_core: the rate-limit policy's waits must add up to more than a minute (``RATE_LIMIT_RETRY``)."""

    attempts: int = 5
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.5

    def delay_s(self, retry: int, draw: float = 0.0) -> float:
        """The wait before retry number ``retry`` (1: the first), ``draw`` the random number in [0, 1) it is jittered
        by (0: the exponential delay itself)."""
        return min(self.initial_s * self.multiplier ** (retry - 1), self.max_s) * (1.0 + self.jitter * draw)


# The backoff of a rate limit: a rate quota is counted per minute and refills "at the start of the next synchronized
# interval, such as 10:01:00" ("If your project exceeds a rate quota, you receive a 403 error with the reason
# rateLimitExceeded. To resolve this error, wait a minute then try your request again":
# https://cloud.google.com/compute/api-quota), so its retries span more than a minute: at least 5, 10, 20, 30, 30, 30 s
# (125 s; up to half as much again, jittered) before the seventh and last try, where the ordinary policy's 1, 2, 4, 8 s
# (15 s, at most 22.5 s) end inside the minute the limit was met in.
RATE_LIMIT_RETRY = RetryPolicy(attempts=7, initial_s=5.0, multiplier=2.0, max_s=30.0)


# RESOURCE_EXHAUSTED is a quota (the user's to raise) or a rate limit (asked again later); Google's APIs say which in
# the error's ErrorInfo reason (google/api/error_reason.proto: RATE_LIMIT_EXCEEDED, "the request is denied because it
# violates a rate limit", apart from RESOURCE_QUOTA_EXCEEDED).
RATE_LIMITED = "RATE_LIMIT_EXCEEDED"
QUOTA_EXCEEDED = "RESOURCE_QUOTA_EXCEEDED"
# A REST API's rate limit that comes as HTTP 403, not 429: Compute Engine's ("If your project exceeds a rate quota, you
# receive a 403 error with the reason rateLimitExceeded", https://cloud.google.com/compute/api-quota; and its concurrent
# operation limit, "a 403 error with the reason rateLimitExceeded", https://cloud.google.com/compute/operations-quota),
# the ``errors[].reason`` of Google's JSON error (https://cloud.google.com/apis/design/errors), where a per-user limit
# says userRateLimitExceeded: the two 403 reasons google-api-python-client asks again (``_should_retry_response``,
# https://github.com/googleapis/google-api-python-client/blob/main/googleapiclient/http.py); or a 403 whose ErrorInfo
# is error_reason.proto's RATE_LIMIT_EXCEEDED ("If the quota is a rate quota, then 403 RATE_LIMIT_EXCEEDED is
# returned": https://cloud.google.com/docs/quotas/troubleshoot). api_core keeps the first as the exception's
# ``errors`` (the JSON's ``error.errors``) and the ErrorInfo of ``error.details`` as its ``reason``
# (``format_http_response_error``, google/api_core/exceptions.py at 2.44.0). Compute's RESOURCE_OPERATION_RATE_EXCEEDED
# is no answer's reason but the code of a failed operation's error (``compute.OPERATION_RATE_CODES``).
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
# The HTTP statuses of a REST answer that are transient: "HTTP 408, 429, and 5xx response codes" (Cloud Storage's retry
# strategy, https://cloud.google.com/storage/docs/retry-strategy, "Response"), the 5xx as google-cloud-storage retries
# them (_RETRYABLE_STATUS_CODES, google/cloud/storage/retry.py at 3.17.1: 500, 502, 503, 504; 501 Not Implemented
# never passes with time). api_core raises each as its own class (google/api_core/exceptions.py at 2.44.0: 429
# TooManyRequests, 500 InternalServerError, 502 BadGateway, 503 ServiceUnavailable, 504 GatewayTimeout; 408 has none,
# a GoogleAPICallError whose code is 408).
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})


def is_rate_limit(exc: BaseException) -> bool:
    """An answer that names a rate limit: its ErrorInfo ``RATE_LIMITED``, or ``RATE_LIMIT_REASONS`` among its REST
    ``errors`` (Compute Engine's 403; the ``rateLimitExceeded`` of an HTTP 429 too, "429 Too Many Requests" in
    https://cloud.google.com/storage/docs/json_api/v1/status-codes)."""
    reasons = {e.get("reason") for e in getattr(exc, "errors", None) or () if isinstance(e, dict)}
    return bool(reasons & RATE_LIMIT_REASONS) or getattr(exc, "reason", None) == RATE_LIMITED


def is_rate_limited(exc: BaseException) -> bool:
    """An error that a rate quota's refill ends, asked again with ``RATE_LIMIT_RETRY``: a transient answer that names
    a rate limit (``is_rate_limit``: gRPC's ``RESOURCE_EXHAUSTED``, an HTTP 429 or 403 with ErrorInfo ``RATE_LIMITED``
    or REST ``errors[].reason`` ``rateLimitExceeded``/``userRateLimitExceeded``), or an operation that ended in one
    (:class:`RateLimited`)."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, RateLimited):
        return True
    return isinstance(exc, gexc.GoogleAPICallError) and is_transient(exc) and is_rate_limit(exc)


def over_rest(exc: BaseException) -> bool:
    """Whether a google.api_core error is an HTTP answer: api_core makes a REST client's error from the HTTP response,
    which it keeps as ``response`` (``from_http_response``, ``format_http_response_error``), and a gRPC client's
    from the ``grpc.RpcError`` (``from_grpc_error``), the error of a long-running operation from the operation."""
    return isinstance(getattr(getattr(exc, "response", None), "status_code", None), int)


def is_transient(exc: BaseException) -> bool:
    """An error that passes with time, so the call is asked again: ``UNAVAILABLE`` and ``DEADLINE_EXCEEDED`` (HTTP
    503 and 504), a rate limit's ``RESOURCE_EXHAUSTED`` (``is_rate_limit``; any other is a quota), and an HTTP answer
    (``over_rest``) of another status of ``TRANSIENT_HTTP``, but a 429 whose ErrorInfo names a quota
    (``RESOURCE_QUOTA_EXCEEDED``); and a 403 that is a rate limit (``is_rate_limit``: Compute Engine's, "wait a minute
    then try your request again", https://cloud.google.com/compute/api-quota).
    gRPC's ``INTERNAL``, which api_core raises as the class of HTTP 500, is not retried: only an HTTP 500 is."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.ResourceExhausted):  # gRPC's (an HTTP 429 is a TooManyRequests)
        return is_rate_limit(exc)
    if isinstance(exc, gexc.Forbidden):  # a rate limit, not a refused permission: it passes when the quota refills
        return is_rate_limit(exc)
    if isinstance(exc, (gexc.ServiceUnavailable, gexc.GatewayTimeout)):  # DeadlineExceeded is a GatewayTimeout
        return True
    if not isinstance(exc, gexc.GoogleAPICallError) or not over_rest(exc):
        return False
    if exc.code == 429:
        return getattr(exc, "reason", None) != QUOTA_EXCEEDED
    return exc.code in TRANSIENT_HTTP


def call_with_retry[T](
    what: str,
    fn: Callable[[], T],
    retry: RetryPolicy,
    log: Callable[[str], None],
    sleep: Callable[[float], None],
    rate_retry: RetryPolicy = RATE_LIMIT_RETRY,
    random: Callable[[], float] = _random.random,
) -> T:
    """``fn()``, with a transient error (``is_transient``) asked again with ``retry``'s backoff, ``retry.attempts``
    tries in all, and a rate limit (``is_rate_limited``) with ``rate_retry``'s, each policy counting its own tries;
    each wait jittered by a draw of ``random`` (a number in [0, 1): ``RetryPolicy.delay_s``)."""
    from google.api_core import exceptions as gexc

    failures = {False: 0, True: 0}  # by whether the error was a rate limit
    while True:
        try:
            return fn()
        except Exception as exc:
            limited = is_rate_limited(exc)
            if not limited and not (isinstance(exc, gexc.GoogleAPICallError) and is_transient(exc)):
                raise
            policy = rate_retry if limited else retry
            failures[limited] += 1
            message = getattr(exc, "message", None) or str(exc)
            if failures[limited] >= policy.attempts:
                raise GkeError(
                    f"{what}: still {type(exc).__name__} after {failures[limited]} attempts: {message}"
                ) from exc
            delay = policy.delay_s(failures[limited], random())
            log(
                f"  {what}: {type(exc).__name__} ({message}); retrying in {delay:.0f}s "
                f"(attempt {failures[limited] + 1}/{policy.attempts})"
            )
            sleep(delay)


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
    of them), progress lines, transient codes and rate limits retried (``call``, with ``retry`` and ``rate_retry``,
    their waits jittered by ``random``), and the poll interval, operation deadline, clock and sleep its waits use
    (injected in tests)."""

    def __init__(
        self,
        client: C,
        *,
        log: Callable[[str], None] = print,
        retry: RetryPolicy | None = None,
        rate_retry: RetryPolicy | None = None,
        operation_timeout_s: float = 1800.0,
        poll_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self.client = client
        self.log = log
        self.retry = retry or RetryPolicy()
        self.rate_retry = rate_retry or RATE_LIMIT_RETRY
        self.operation_timeout_s = operation_timeout_s
        self.poll_s = poll_s
        self.clock = clock
        self.sleep = sleep
        self.random = random

    def call[T](self, what: str, fn: Callable[[], T]) -> T:
        return call_with_retry(what, fn, self.retry, self.log, self.sleep, self.rate_retry, self.random)

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
