"""How long deploy_raycluster waits, against the Kubernetes emulator: a flex-start pool whose first scale-ups fail
(stockouts the cluster autoscaler retries) is waited for, not failed; a fixed pool's deadline derives from its hosts
and its image, and a pool never ready fails at that deadline (an injected clock) naming the pods' reasons."""

from __future__ import annotations

import math

import pytest

from components.platforms import RunContext
from components.platforms.gke import GkePlatform
from components.platforms.gke.run import readiness
from components.platforms.store import LocalStore
from components.platforms.waiting import DeadlineExceeded
from components.spec import names, ready_limits
from components.spec.readiness import FIXED_BASE_S, HOST_S, IMAGE_GIB, PULL_MIB_S
from components.workload import resolve
from tests.emulators.project import ONE_SLICE

FLEX_START = ONE_SLICE.replace("us-east5-b", "us-east5-a") + " cluster.capacity=flex-start"  # a zone offering it


def context(tmp_path, run_id: str, overrides: str) -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke"
    )


class Clock:
    """The readiness wait's clock: each sleep moves it on."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _failed_scale_ups(project, pod: str) -> int:
    with project.kube.lock:
        return sum(
            1
            for (plural, _, _), e in project.kube.objects.items()
            if plural == "events" and e["reason"] == "FailedScaleUp" and e["involvedObject"]["name"] == pod
        )


def test_a_flex_start_pool_whose_first_two_scale_ups_fail_is_waited_for_until_its_nodes_come(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory(fault="scale_from_zero")
    project.kube.scale_up_s, project.kube.stockouts = 0.4, 2  # out of resources twice, then the nodes come
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "stockout", FLEX_START + " cluster.ready_timeout_s=60")
    assert ready_limits(ctx.spec).failed_scale_up_grace_s == 1800  # the cluster autoscaler's longest backoff
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)
    assert gke.deploy_raycluster(ctx)["available_workers"] == 1
    assert _failed_scale_ups(project, "stockout-tpu-v6e-4-0-0") == 2
    gke.teardown(ctx)
    assert project.leftovers("stockout") == {}


FAILED = "Node scale up in zones us-east5-a associated with this pod failed: GCE out of resources."
UNSCHED = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]


def _event(name: str, reason: str, at: int) -> dict:
    return {
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": "w0"},
        "reason": reason,
        "message": FAILED if reason == "FailedScaleUp" else "pod triggered scale-up",
        "count": 1,
        "lastTimestamp": f"2026-11-30T10:{at // 60:02d}:{at % 60:02d}Z",
    }


def test_the_state_machine_retries_failed_scale_ups_for_its_grace_then_fails_naming_them():
    pending = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0, "state": ""}}
    pods = [{"metadata": {"name": "w0"}, "spec": {"containers": [{}]}, "status": {"conditions": UNSCHED}}]
    flex = readiness.Readiness(unschedulable_grace_s=120, failed_scale_up_grace_s=1800)
    events = [_event("e1", "TriggeredScaleUp", 0), _event("e2", "FailedScaleUp", 60)]
    assert flex.step(pending, pods, now=60, events=events) is None
    events += [_event("e3", "TriggeredScaleUp", 360), _event("e4", "FailedScaleUp", 420)]
    assert flex.step(pending, pods, now=1000, events=events) is None  # past the unschedulable grace: retried
    assert "after a FailedScaleUp the autoscaler retries" in flex.last
    with pytest.raises(readiness.RayClusterNotReady, match=r"failed 2 times over 1800s .*GCE out of resources"):
        flex.step(pending, pods, now=1860, events=events)
    # A fixed pool: the first FailedScaleUp is final.
    with pytest.raises(readiness.RayClusterNotReady, match="scale-up failed: FailedScaleUp"):
        readiness.Readiness(unschedulable_grace_s=120).step(pending, pods, now=60, events=events[:2])


def test_a_fixed_pools_deadline_derives_from_its_hosts_and_image():
    one = ready_limits(resolve("local-fsdp", ONE_SLICE)).deadline_s
    assert one == math.ceil(FIXED_BASE_S + IMAGE_GIB["fsdp"] * 1024 / PULL_MIB_S + HOST_S * 1)
    big = ready_limits(resolve("llama3-8b-v6e-16x2", ""))  # 2 slices x 4 hosts, the MaxText image
    assert big.deadline_s == math.ceil(FIXED_BASE_S + IMAGE_GIB["maxtext"] * 1024 / PULL_MIB_S + HOST_S * 8)
    assert "8 hosts" in big.by and big.failed_scale_up_grace_s == 0
    assert ready_limits(resolve("local-fsdp", ONE_SLICE + " cluster.ready_timeout_s=42")).deadline_s == 42


def test_a_fixed_pool_never_ready_fails_at_its_derived_deadline_naming_the_pods_reasons(
    tmp_path, project_factory, monkeypatch
):
    project_factory(fault="never_starts")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "stuck", ONE_SLICE + " cluster.ready_timeout_s=0.5")
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)
    # The stage, its deadline cut short: the error names every pod and why it is not running.
    reasons = "pods not running: stuck-head ContainerCreating; stuck-tpu-v6e-4-0-0 ContainerCreating"
    with pytest.raises(DeadlineExceeded, match=reasons):
        gke.deploy_raycluster(ctx)
    # The same RayCluster waited on for the derived deadline, on an injected clock.
    deadline = ready_limits(context(tmp_path, "stuck", ONE_SLICE).spec).deadline_s
    kube, _, _ = gke.clients.kube(ctx)
    clock = Clock()
    with pytest.raises(DeadlineExceeded, match=r"stuck-tpu-v6e-4-0-0 ContainerCreating") as exc:
        readiness.wait_ready(
            kube,
            names.raycluster("stuck"),
            deadline,
            unschedulable_grace_s=120,
            poll_s=2.0,
            log=lambda m: None,
            clock=clock,
            sleep=clock.sleep,
        )
    assert deadline <= clock.now <= deadline + 2.0, (clock.now, deadline)
    assert "stuck-head ContainerCreating" in str(exc.value)
    gke.teardown(ctx)
