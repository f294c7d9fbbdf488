"""Transient errors of the Kubernetes API server, and of the Ray dashboard behind its service proxy, retried with
backoff by google-api-core's ``Retry`` (:class:`Retrying`), never past a deadline: the wait's that makes the call
(readiness, a job's), else ``Backoff.budget_s`` from the call's first try.

Transient: the HTTP statuses the Kubernetes API conventions tell a client to retry — 429 (the server's API Priority
and Fairness or its shutdown: after ``Retry-After``), 500, 502, 503 (with exponential backoff) and 504
(https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#error-codes)
— and a connection that fails or breaks: a zonal cluster has one control plane, unreachable while GKE upgrades it
(https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-upgrades). ``kubernetes`` raises ``ApiException``
with the status; Ray's ``SubmissionClient`` a ``RuntimeError`` whose message starts with the status
(``_raise_error`` in ray/dashboard/modules/dashboard_sdk.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from components.spec import InfraError

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
RAY_STATUS = re.compile(r"^Request failed with status code (\d{3}):")


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    maximum_s: float = 30.0
    multiplier: float = 2.0
    budget_s: float = 600.0  # a call outside a wait with its own deadline: about a zonal control plane's upgrade


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an error of the kubernetes client or of Ray's job client carries, else None."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and type(exc).__module__.startswith("kubernetes."):
        return status
    if type(exc) is RuntimeError:
        found = RAY_STATUS.match(str(exc))
        return int(found.group(1)) if found else None
    return None


def is_transient(exc: BaseException) -> bool:
    if status_of(exc) in TRANSIENT_STATUS:
        return True
    import requests
    import urllib3

    return isinstance(exc, urllib3.exceptions.HTTPError | requests.ConnectionError | requests.Timeout | ConnectionError)


class Retrying:
    """``call(what, fn, ...)``: ``fn(...)``, a transient error retried with ``backoff`` until ``until`` (a
    ``time.monotonic()`` deadline; None: ``backoff.budget_s`` from the first try). Past it, an InfraError naming
    ``what`` and the last error."""

    def __init__(self, backoff: Backoff | None = None, log: Callable[[str], None] = print):
        self.backoff = backoff or Backoff()
        self.log = log
        self.until: float | None = None
        # Asked after each transient error: a reason to stop retrying at once (a queued RayCluster Kueue evicted).
        self.abort: Callable[[], str | None] | None = None

    @contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        """Calls made inside retry for at most ``seconds`` from now: a wait's deadline."""
        previous, self.until = self.until, time.monotonic() + seconds
        try:
            yield
        finally:
            self.until = previous

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from google.api_core import exceptions as gexc
        from google.api_core.retry import Retry

        b = self.backoff
        budget = b.budget_s if self.until is None else max(0.0, self.until - time.monotonic())

        def on_error(exc: BaseException) -> None:
            why = self.abort() if self.abort is not None else None
            if why:
                raise InfraError(f"{what}: {why}") from exc
            self.log(f"  {what}: {_short(exc)}; retrying with backoff (for at most {budget:.0f}s)")

        retry = Retry(
            predicate=is_transient,
            initial=b.initial_s,
            maximum=b.maximum_s,
            multiplier=b.multiplier,
            timeout=budget,
            on_error=on_error,
        )
        try:
            return retry(fn)(*args, **kwargs)
        except gexc.RetryError as exc:
            raise InfraError(f"{what}: still failing after {budget:.0f}s of retries: {_short(exc.cause)}") from (
                exc.cause
            )
        except InfraError:
            raise
        except Exception as exc:  # an error not retried: said with the reason to stop, where there is one
            why = self.abort() if self.abort is not None else None
            if why:
                raise InfraError(f"{what}: {why}") from exc
            raise


def _short(exc: BaseException | None) -> str:
    status = status_of(exc) if exc is not None else None
    text = str(getattr(exc, "reason", "") or exc).strip().splitlines()
    return f"{type(exc).__name__}" + (f" {status}" if status else "") + (f" ({text[0][:200]})" if text else "")
