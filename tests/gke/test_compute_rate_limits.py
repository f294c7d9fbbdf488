"""Compute Engine's rate limits through the gke platform's Compute adapter (components/platforms/gke/cloud/compute.py)
and the emulated Compute Engine, on one fake clock: a burst of inserts over a rate quota is refused until the quota
refills at the next minute (https://cloud.google.com/compute/api-quota), and an operation that ends in
RESOURCE_OPERATION_RATE_EXCEEDED is asked for again."""

from __future__ import annotations

import pytest

from components.cloud.errors import GkeError, RetryPolicy
from components.platforms.gke.cloud import compute as gke_compute
from tests.emulators.project import PROJECT

NETWORK = f"projects/{PROJECT}/global/networks/burst-{{}}"


class Clock:
    """Seconds since the epoch that pass only when slept."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def adapter(clock: Clock, lines: list[str], **options) -> gke_compute.Compute:
    return gke_compute.Compute(
        gke_compute.clients(),
        log=lines.append,
        poll_s=0.01,
        clock=clock,
        sleep=clock.sleep,
        random=lambda: 0.0,
        **options,
    )


def burst(compute: gke_compute.Compute, count: int) -> None:
    body = {"name": "", "autoCreateSubnetworks": False}
    for index in range(count):
        compute.ensure("network", NETWORK.format(index), {**body, "name": f"burst-{index}"}, lambda kind, path: None)


@pytest.mark.parametrize("rate_retry", [None, RetryPolicy()], ids=["rate-limit policy", "ordinary policy"])
def test_a_burst_over_a_rate_quota_waits_for_the_next_minute(project_factory, rate_retry):
    """Four inserts in the first second of a minute whose quota allows three: the fourth is refused until the minute
    ends. The rate-limit policy's waits (5, 10, 20, 30 s) reach the next minute and the fourth network is made; with
    the ordinary policy (1, 2, 4, 8 s: 15 s), as before, the insert gives up inside the minute."""
    project = project_factory()
    clock = Clock(60 * 1000 + 1.0)
    project.compute.clock = clock
    project.compute.limit_rate("default", 3)
    lines: list[str] = []
    compute = adapter(clock, lines, rate_retry=rate_retry)
    if rate_retry is not None:
        with pytest.raises(GkeError, match="create network burst-3: still Forbidden after 5 attempts"):
            burst(compute, 4)
        assert len(project.compute.names("networks")) == 3 and clock() < 60 * 1001
        return
    burst(compute, 4)
    assert len(project.compute.names("networks")) == 4 and clock() >= 60 * 1001
    assert [line.split("retrying in ")[1].split("s")[0] for line in lines if "retrying" in line] == [
        "5",
        "10",
        "20",
        "30",
    ]


def test_an_operation_that_ends_rate_limited_is_asked_for_again(project_factory):
    """RESOURCE_OPERATION_RATE_EXCEEDED is the code of a failed operation's error: the operation made nothing, so the
    insert is asked again, a new request with a new request id, after the rate-limit backoff."""
    project = project_factory()
    clock = Clock(60 * 1000.0)
    project.compute.operation_rate("networks.insert")
    lines: list[str] = []
    burst(adapter(clock, lines), 1)
    assert project.compute.names("networks") == ["burst-0"]
    inserts = [e.op for e in project.compute.state.operations.values() if e.op["operationType"] == "insert"]
    assert len(inserts) == 2 and inserts[0]["clientOperationId"] != inserts[1]["clientOperationId"]
    assert any("RateLimited" in line and "RESOURCE_OPERATION_RATE_EXCEEDED" in line for line in lines)
