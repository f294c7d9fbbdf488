"""Which Google Cloud errors the shared retry asks again (components/cloud/errors.py): the exceptions google-api-core
makes of an HTTP answer (``from_http_response``, as every REST client raises them) and of a gRPC status, and the
policy's backoff and attempt limit; one gRPC status through a real client, against the Cloud Build emulator."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest
import requests
from google.api_core import exceptions

from components.cloud.errors import (
    RATE_LIMIT_RETRY,
    GkeError,
    RateLimited,
    RetryPolicy,
    call_with_retry,
    is_rate_limited,
    is_transient,
)

URL = "https://compute.googleapis.com/compute/v1/projects/tpupipe-emulated/global/networks"


def no_jitter() -> float:
    """A constant draw: the waits are the policies' exponential delays themselves."""
    return 0.0


def rest_error(status: int, reason: str = "", errors_reason: str = "") -> exceptions.GoogleAPICallError:
    """What api_core raises for an HTTP answer of ``status`` in Google's JSON error shape, with an ErrorInfo
    ``reason`` and an ``errors[].reason`` when given (https://cloud.google.com/apis/design/errors)."""
    entry = {"message": f"HTTP {status}", **({"reason": errors_reason} if errors_reason else {})}
    error: dict = {"code": status, "message": f"HTTP {status}", "errors": [entry]}
    if reason:
        error["details"] = [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": "googleapis.com"}
        ]
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps({"error": error}).encode()
    response.request = requests.Request("POST", URL).prepare()
    return exceptions.from_http_response(response)


def test_api_core_raises_an_http_429_as_too_many_requests_not_resource_exhausted():
    assert type(rest_error(429)) is exceptions.TooManyRequests
    assert type(rest_error(500)) is exceptions.InternalServerError
    assert type(rest_error(502)) is exceptions.BadGateway
    assert type(rest_error(408)) is exceptions.GoogleAPICallError and rest_error(408).code == 408


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_the_http_statuses_google_lists_as_transient_are(status):
    assert is_transient(rest_error(status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 412, 501])
def test_other_http_statuses_are_not(status):
    assert not is_transient(rest_error(status))


def test_an_http_429_that_names_a_quota_is_not_asked_again():
    assert not is_transient(rest_error(429, "RESOURCE_QUOTA_EXCEEDED"))
    assert is_transient(rest_error(429, "RATE_LIMIT_EXCEEDED"))


@pytest.mark.parametrize(
    ("errors_reason", "reason", "transient"),
    [
        ("rateLimitExceeded", "", True),  # Compute's rate limit (https://cloud.google.com/compute/api-quota)
        ("userRateLimitExceeded", "", True),
        ("", "RATE_LIMIT_EXCEEDED", True),
        ("", "RESOURCE_OPERATION_RATE_EXCEEDED", False),  # an operation's error code, no answer's reason
        ("rateLimitExceeded", "RATE_LIMIT_EXCEEDED", True),
        ("forbidden", "", False),  # a refused permission
        ("quotaExceeded", "", False),
        ("", "SERVICE_DISABLED", False),
        ("", "RESOURCE_QUOTA_EXCEEDED", False),
    ],
)
def test_an_http_403_is_asked_again_only_when_it_names_a_rate_limit(errors_reason, reason, transient):
    error = rest_error(403, reason, errors_reason)
    assert type(error) is exceptions.Forbidden and is_transient(error) is transient


@pytest.mark.parametrize(
    ("code", "reason", "transient"),
    [
        (grpc.StatusCode.UNAVAILABLE, "", True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "", True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMIT_EXCEEDED", True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "", False),  # a quota: the user's to raise
        (grpc.StatusCode.INTERNAL, "", False),  # api_core's class of HTTP 500, but not an HTTP answer
        (grpc.StatusCode.FAILED_PRECONDITION, "", False),
        (grpc.StatusCode.PERMISSION_DENIED, "RATE_LIMIT_EXCEEDED", True),
        (grpc.StatusCode.PERMISSION_DENIED, "", False),
    ],
)
def test_grpc_statuses(code, reason, transient):
    error_info = {"reason": reason} if reason else None
    assert is_transient(exceptions.from_grpc_status(code, "status", error_info=error_info)) is transient


def failing(*failures: Exception) -> Callable[[], str]:
    """A call that raises ``failures`` one a try, then answers "done"."""
    left = list(failures)

    def call() -> str:
        if left:
            raise left.pop(0)
        return "done"

    return call


@pytest.mark.parametrize("status", [408, 429, 500, 502])
def test_a_transient_http_answer_is_asked_again_with_the_policys_backoff(status):
    call = failing(rest_error(status), rest_error(status))
    sleeps: list[float] = []
    lines: list[str] = []
    policy = RetryPolicy(attempts=5, initial_s=1.0, multiplier=2.0, max_s=30.0)
    assert call_with_retry("create network", call, policy, lines.append, sleeps.append, random=no_jitter) == "done"
    assert sleeps == [1.0, 2.0] and len(lines) == 2 and "(attempt 2/5)" in lines[0]


def test_the_attempts_are_limited_and_the_delay_capped():
    sleeps: list[float] = []
    tries: list[int] = []

    def call() -> None:
        tries.append(1)
        raise rest_error(429)

    policy = RetryPolicy(attempts=4, initial_s=1.0, multiplier=2.0, max_s=3.0)
    with pytest.raises(GkeError, match="create network: still TooManyRequests after 4 attempts"):
        call_with_retry("create network", call, policy, lambda line: None, sleeps.append, random=no_jitter)
    assert len(tries) == 4 and sleeps == [1.0, 2.0, 3.0]


def test_a_permanent_error_is_raised_at_once():
    tries: list[int] = []

    def call() -> None:
        tries.append(1)
        raise rest_error(403)

    with pytest.raises(exceptions.Forbidden):
        call_with_retry("create network", call, RetryPolicy(), lambda line: None, lambda s: None)
    assert tries == [1]


def test_internal_over_grpc_is_not_asked_again(monkeypatch):
    """gRPC's INTERNAL, through the real google-cloud-build client: one call, raised as it came."""
    from components.cloud.build import EMULATOR_HOST_ENV, CloudBuild, client
    from tests.emulators.cloudbuild import CloudBuildEmulator

    emulator = CloudBuildEmulator()
    monkeypatch.setenv(EMULATOR_HOST_ENV, emulator.start())
    try:
        builds = CloudBuild(client(), "tpupipe-emulated", "us-east5", log=lambda line: None, sleep=lambda s: None)
        emulator.fail("ListBuilds", grpc.StatusCode.INTERNAL, "backend error")
        with pytest.raises(exceptions.InternalServerError, match="backend error"):
            builds.find("tpupipe-run-r1")
        assert emulator.state.calls == ["ListBuilds"]
    finally:
        emulator.stop()


@pytest.mark.parametrize(
    ("error", "limited"),
    [
        (rest_error(403, errors_reason="rateLimitExceeded"), True),  # Compute's
        (rest_error(403, "RATE_LIMIT_EXCEEDED"), True),
        (rest_error(429, "RATE_LIMIT_EXCEEDED"), True),
        (rest_error(429, errors_reason="rateLimitExceeded"), True),  # a REST 429's reason
        (rest_error(429, errors_reason="userRateLimitExceeded"), True),
        (
            exceptions.from_grpc_status(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "s", error_info={"reason": "RATE_LIMIT_EXCEEDED"}
            ),
            True,
        ),
        (RateLimited("create network: operation op-1 failed: RESOURCE_OPERATION_RATE_EXCEEDED"), True),
        (rest_error(429), False),  # transient, with the ordinary backoff
        (rest_error(503), False),
        (rest_error(403, errors_reason="forbidden"), False),
        (rest_error(429, "RESOURCE_QUOTA_EXCEEDED"), False),
    ],
)
def test_which_errors_are_rate_limits(error, limited):
    assert is_rate_limited(error) is limited


def test_a_rate_limit_is_asked_again_past_the_minute_its_quota_refills_in():
    """Compute's rate quotas refill at the start of the next minute (https://cloud.google.com/compute/api-quota): the
    rate-limit policy waits 5, 10, 20, 30, 30, 30 s, more than a minute, before its seventh and last try; the
    ordinary policy would have given up after 15 s."""
    sleeps: list[float] = []
    tries: list[int] = []

    def call() -> None:
        tries.append(1)
        raise rest_error(403, errors_reason="rateLimitExceeded")

    with pytest.raises(GkeError, match="still Forbidden after 7 attempts"):
        call_with_retry("create network", call, RetryPolicy(), lambda line: None, sleeps.append, random=no_jitter)
    assert len(tries) == 7 and sleeps == [5.0, 10.0, 20.0, 30.0, 30.0, 30.0] and sum(sleeps) > 120
    assert RATE_LIMIT_RETRY.attempts == 7


def test_rate_limits_and_other_transient_errors_count_against_their_own_policies():
    limited = RateLimited("operation op-1 failed: RESOURCE_OPERATION_RATE_EXCEEDED")
    call = failing(rest_error(503), rest_error(403, errors_reason="rateLimitExceeded"), rest_error(503), limited)
    sleeps: list[float] = []
    lines: list[str] = []
    ordinary, rate = RetryPolicy(attempts=3), RetryPolicy(attempts=3, initial_s=7.0)
    assert call_with_retry("create network", call, ordinary, lines.append, sleeps.append, rate, no_jitter) == "done"
    assert sleeps == [1.0, 7.0, 2.0, 14.0] and "(attempt 3/3)" in lines[-1]


def test_a_rate_limited_429_gets_the_rate_limit_policy_by_its_errors_reason():
    """A REST 429 that says rateLimitExceeded in ``errors[].reason`` (and carries no ErrorInfo) is waited out with the
    rate-limit policy, like a 403 of that reason, not with the ordinary policy's 1, 2 s."""
    call = failing(
        rest_error(429, errors_reason="rateLimitExceeded"), rest_error(429, errors_reason="rateLimitExceeded")
    )
    sleeps: list[float] = []
    assert call_with_retry("list", call, RetryPolicy(), lambda line: None, sleeps.append, random=no_jitter) == "done"
    assert sleeps == [5.0, 10.0]


def test_the_waits_are_jittered_by_the_injected_draws_above_the_exponential_delay():
    """Each wait is the policy's exponential delay and up to half as much again, by a draw in [0, 1): callers that
    failed together come back apart, and the rate-limit policy's waits still add up to more than a minute."""
    draws = iter([0.0, 0.5, 0.999, 0.25, 0.0, 0.0])
    sleeps: list[float] = []
    lines: list[str] = []

    def call() -> None:
        raise rest_error(403, errors_reason="rateLimitExceeded")

    with pytest.raises(GkeError, match="after 7 attempts"):
        call_with_retry("create network", call, RetryPolicy(), lines.append, sleeps.append, random=lambda: next(draws))
    assert sleeps == pytest.approx([5.0, 12.5, 29.99, 33.75, 30.0, 30.0])
    assert "retrying in 12s" in lines[1]
    assert RetryPolicy().delay_s(3, 0.999) < RetryPolicy().delay_s(3) * 1.5
    assert sum(RATE_LIMIT_RETRY.delay_s(n) for n in range(1, RATE_LIMIT_RETRY.attempts)) > 120
