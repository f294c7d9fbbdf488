"""Failover after provisioning, against the emulated project: a rung of the capacity ladder whose TPU nodes come from
zero shows its stockout only while deploy_raycluster waits for the RayCluster (the cluster autoscaler's FailedScaleUp
on a flex-start pool GKE has no TPUs for, and its backoff after one; a ProvisioningRequest Failed before admission);
the run starts the deletes of that rung's TPU node pools first, records it in the ledger with its cost, provisions
the next rung and deploys there. The whole pipeline through such a failover: test_gke_pipeline.py."""

from __future__ import annotations

import grpc
import pytest

from components.platforms import ledger as ledgers
from components.platforms.gke import GkePlatform
from components.platforms.gke.plan import queued
from components.platforms.gke.run import readiness
from components.platforms.gke.run.deploy import FAILED_SCALE_UP_GRACE_ENV, UNSCHEDULABLE_GRACE_ENV
from tests.emulators.project import ONE_SLICE
from tests.gke.test_gke_platform import context

FLEX_THEN_SPOT = ONE_SLICE.replace("us-east5-b", "us-east5-a") + " cluster.capacity=flex-start,spot"
QUEUED_THEN_SPOT = ONE_SLICE + " cluster.capacity=queued,spot cluster.ready_timeout_s=60"


@pytest.fixture
def fast(monkeypatch):
    """Readiness' graces cut to the emulator's seconds; the Hugging Face token the deploy needs."""
    monkeypatch.setenv(UNSCHEDULABLE_GRACE_ENV, "30")
    monkeypatch.setenv(FAILED_SCALE_UP_GRACE_ENV, "1")
    monkeypatch.setenv("HF_TOKEN", "hf_test")


def _pool_calls(project) -> list[str]:
    """CreateNodePool and DeleteNodePool calls in the order GKE took them."""
    return [c for c in project.gke.state.calls if c in ("CreateNodePool", "DeleteNodePool")]


def _tpu_pool(project, run_id: str):
    """The run's (first) TPU node pool as GKE holds it."""
    (cluster,) = project.clusters(run_id)
    return next(p for p in project.gke.state.clusters[cluster].node_pools if p.name.endswith("-s0"))


def test_a_flex_start_stockout_seen_in_readiness_moves_to_spot_after_deleting_the_flex_start_pool(
    tmp_path, project_factory, fast
):
    project = project_factory()
    project.gke.flex_start_stocked_out("us-east5-a")
    project.kube.scale_up_s, project.kube.ready_without_ray = 0.3, True
    ctx = context(tmp_path, "flexfail", FLEX_THEN_SPOT)
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    assert gke.provision(ctx)["capacity"] == "flex-start"  # GKE makes a flex-start pool with no nodes: no stockout yet
    assert _tpu_pool(project, "flexfail").config.flex_start

    deployed = gke.deploy_raycluster(ctx)

    assert deployed["available_workers"] == 1
    # The flex-start pods saw the autoscaler's scale-up fail, retried, in readiness.
    with project.kube.lock:
        reasons = [e["reason"] for (p, _, _), e in project.kube.objects.items() if p == "events"]
    assert reasons.count("FailedScaleUp") >= 2
    # The flex-start pool was deleted (its delete done) before the spot pool of the same name was created.
    assert _pool_calls(project)[-3:] == ["CreateNodePool", "DeleteNodePool", "CreateNodePool"]
    tpu = _tpu_pool(project, "flexfail")
    assert tpu.config.spot and not tpu.config.flex_start
    # The ledger names both rungs: the one left (why, where, its cost: no node came, none billed) and the one taken.
    ledger = ledgers.load(ctx.store)
    assert ledger["candidate"] == {"zone": "us-east5-a", "capacity": "spot"}
    (left,) = ledger["tried"]
    assert (left["zone"], left["capacity"], left["left_at"], left["chip_s"]) == (
        "us-east5-a",
        "flex-start",
        "deploy_raycluster",
        0.0,
    )
    assert "scale-up failed" in left["error"] and "GCE out of resources" in left["error"]
    assert any("has no capacity" in line and "trying the next rung, spot in us-east5-a" in line for line in logs)
    # Later stages run on spot: the spending is counted at spot's price (the rung taken), not flex-start's.
    assert gke.limits(ctx).missing_prices == ("tpu/v6e/spot",)
    gke.teardown(ctx)
    assert project.leftovers("flexfail") == {}


def test_a_provisioning_request_failed_before_admission_moves_to_the_next_rung(tmp_path, project_factory, fast):
    project = project_factory()
    project.kube.provisioner.outcome = "capacity_not_found"
    project.kube.provisioner.provision_s = 0.3
    project.kube.ready_without_ray = True
    ctx = context(tmp_path, "reqfail", QUEUED_THEN_SPOT)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)

    assert gke.deploy_raycluster(ctx)["available_workers"] == 1

    assert [d for d in project.kube.provisioner.decided if d[1].startswith("reqfail")][0][2] == "Failed"
    (left,) = ledgers.load(ctx.store)["tried"]
    assert (left["capacity"], left["left_at"], left["chip_s"]) == ("queued", "deploy_raycluster", 0.0)
    assert "will give the run no TPU nodes" in left["error"] and "CapacityNotFound" in left["error"]
    assert ledgers.load(ctx.store)["candidate"]["capacity"] == "spot"
    assert _pool_calls(project)[-3:] == ["CreateNodePool", "DeleteNodePool", "CreateNodePool"]
    with project.kube.lock:  # the queued rung's requests went with it; the spot rung makes none
        assert not [k for k in project.kube.objects if k[0] == "provisioningrequests"]
    assert (tmp_path / "reqfail" / "logs" / "provisioning_request.json").is_file()  # kept for the post-mortem
    gke.teardown(ctx)
    assert project.leftovers("reqfail") == {}


def test_a_stockout_on_the_last_rung_ends_the_stage_and_nothing_more_is_created(tmp_path, project_factory, fast):
    project = project_factory()
    project.gke.flex_start_stocked_out("us-east5-a")
    project.kube.scale_up_s, project.kube.ready_without_ray = 0.3, True
    ctx = context(tmp_path, "flexonly", FLEX_THEN_SPOT.replace("flex-start,spot", "flex-start"))
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)
    with pytest.raises(readiness.Stockout, match="scale-up failed"):
        gke.deploy_raycluster(ctx)
    assert _pool_calls(project) == ["CreateNodePool"]  # the TPU pool (the CPU pool comes with the cluster); no delete
    assert "tried" not in ledgers.load(ctx.store)
    gke.teardown(ctx)
    assert project.leftovers("flexonly") == {}


def test_the_autoscalers_backoff_after_a_failed_scale_up_is_the_stockout_not_a_stuck_pod(
    tmp_path, project_factory, fast, monkeypatch
):
    """Between FailedScaleUp and its retry the pods' latest event is the autoscaler's NotTriggerScaleUp "in backoff
    after failed scale-up", here for longer than the unschedulable grace: still the flex-start stockout, which the
    run leaves for the next rung."""
    monkeypatch.setenv(UNSCHEDULABLE_GRACE_ENV, "0.2")
    project = project_factory()
    project.gke.flex_start_stocked_out("us-east5-a")
    project.kube.scale_up_s, project.kube.ready_without_ray = 2.4, True  # the backoff said 1.2 s into it
    ctx = context(tmp_path, "backoff", FLEX_THEN_SPOT)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)

    assert gke.deploy_raycluster(ctx)["available_workers"] == 1

    with project.kube.lock:
        said = [e["message"] for (p, _, _), e in project.kube.objects.items() if p == "events"]
    assert any(readiness.SCALE_UP_BACKOFF in m for m in said)
    (left,) = ledgers.load(ctx.store)["tried"]
    assert left["capacity"] == "flex-start" and "GCE out of resources" in left["error"]
    assert ledgers.load(ctx.store)["candidate"]["capacity"] == "spot"
    gke.teardown(ctx)
    assert project.leftovers("backoff") == {}


def test_leaving_a_rung_starts_its_pool_deletes_before_deleting_its_kubernetes_objects(tmp_path, project_factory, fast):
    project = project_factory()
    project.kube.provisioner.outcome = "capacity_not_found"
    project.kube.provisioner.provision_s = 0.3
    project.kube.ready_without_ray = True
    ctx = context(tmp_path, "order", QUEUED_THEN_SPOT)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)
    at_delete: list[bool] = []

    def seen(request) -> bool:  # as the delete comes: is the rung's RayCluster still there?
        at_delete.append(any(k[0] == "rayclusters" for k in list(project.kube.objects)))
        return False  # only watching: no fault is taken

    project.gke.fail("DeleteNodePool", grpc.StatusCode.INTERNAL, when=seen)

    assert gke.deploy_raycluster(ctx)["available_workers"] == 1

    assert at_delete and at_delete[0]  # the pool's delete came while the rung's RayCluster was still there
    assert _pool_calls(project)[-3:] == ["CreateNodePool", "DeleteNodePool", "CreateNodePool"]  # gone before
    gke.teardown(ctx)
    assert project.leftovers("order") == {}


# ---------------------------------------------------------------- which readiness failures are a rung's stockout

WAITING = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0, "state": ""}}
UNSCHED = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "waits for its request"}


def _worker(name: str, scheduled: bool, request: str = "") -> dict:
    condition = {"type": "PodScheduled", "status": "True"} if scheduled else UNSCHED
    labels = {"ray.io/node-type": "worker"}
    annotations = {queued.CONSUME_ANNOTATION: request} if request else {}
    meta = {"name": name, "labels": labels, "annotations": annotations}
    return {"metadata": meta, "status": {"conditions": [condition]}}


def _request(*conditions: str, hosts: int = 1) -> dict:
    return {
        "spec": {"podSets": [{"count": hosts}]},
        "status": {"conditions": [{"type": kind, "status": "True", "reason": kind} for kind in conditions]},
    }


@pytest.mark.parametrize(
    "conditions, stockout",
    [(("Failed",), True), (("Provisioned", "BookingExpired"), True), (("Provisioned", "CapacityRevoked"), False)],
)
def test_a_request_failed_or_expired_before_the_pods_landed_is_a_stockout_a_revoked_one_is_not(conditions, stockout):
    machine = readiness.Readiness(unschedulable_grace_s=30, request_names=("r",), from_zero=True)
    with pytest.raises(readiness.RayClusterNotReady) as raised:
        machine.step(WAITING, [_worker("w", False)], now=0, requests={"r": _request(*conditions)})
    assert isinstance(raised.value, readiness.Stockout) is stockout


def test_a_booking_that_expired_counts_its_hosts_from_provisioned_to_expiry():
    machine = readiness.Readiness(unschedulable_grace_s=300, request_names=("r",), from_zero=True)
    assert machine.step(WAITING, [_worker("w", False)], now=0, requests={"r": _request(hosts=2)}) is None
    assert machine.step(WAITING, [_worker("w", False)], now=5, requests={"r": _request("Provisioned", hosts=2)}) is None
    with pytest.raises(readiness.Stockout) as raised:
        machine.step(
            WAITING, [_worker("w", False)], now=65, requests={"r": _request("Provisioned", "BookingExpired", hosts=2)}
        )
    assert raised.value.host_s == 2 * 60  # two hosts booked for a minute, no pod landed on them


def test_a_booking_that_expires_after_the_pods_landed_ends_nothing():
    machine = readiness.Readiness(unschedulable_grace_s=30, request_names=("r",), from_zero=True)
    landed = [_worker("w", True, request="r")]
    assert machine.step(WAITING, landed, now=0, requests={"r": _request("Provisioned")}) is None
    assert machine.step(WAITING, landed, now=700, requests={"r": _request("Provisioned", "BookingExpired")}) is None
    ready = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 1, "state": "ready"}}
    assert machine.step(ready, landed, now=701, requests={"r": _request("Provisioned", "BookingExpired")}) is True
    with pytest.raises(readiness.RayClusterNotReady):  # revoked: the nodes are taken back even so
        machine.step(
            WAITING, landed, now=702, requests={"r": _request("Provisioned", "BookingExpired", "CapacityRevoked")}
        )


def _scale_up(reason: str, message: str, at: str, name: str) -> dict:
    return {
        "metadata": {"name": name},
        "involvedObject": {"name": "w"},
        "reason": reason,
        "message": message,
        "lastTimestamp": f"2026-12-05T10:00:{at}Z",
    }


@pytest.mark.parametrize("from_zero, grace, raised", [(True, 5, readiness.Stockout), (False, 0, None)])
def test_the_backoff_after_a_failed_scale_up_counts_as_that_failure(from_zero, grace, raised):
    """The NotTriggerScaleUp of the backoff after a FailedScaleUp is the failed scale-up: where nodes come from zero
    a Stockout once it repeated past the grace (not a pod stuck with no scale-up), the FailedScaleUp's cause named;
    on a fixed pool, final at once."""
    failed = _scale_up("FailedScaleUp", "GCE out of resources", "00", "e1")
    backoff = _scale_up(
        "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 in backoff after failed scale-up", "01", "e2"
    )
    machine = readiness.Readiness(unschedulable_grace_s=1, failed_scale_up_grace_s=grace, from_zero=from_zero)
    pods = [_worker("w", False)]
    if raised is None:
        with pytest.raises(readiness.RayClusterNotReady, match="GCE out of resources") as fixed:
            machine.step(WAITING, pods, now=0, events=[failed, backoff])
        assert not isinstance(fixed.value, readiness.Stockout)
        return
    assert machine.step(WAITING, pods, now=0, events=[failed]) is None
    assert machine.step(WAITING, pods, now=3, events=[failed, backoff]) is None  # past the unschedulable grace
    with pytest.raises(raised, match="GCE out of resources"):
        machine.step(WAITING, pods, now=6, events=[failed, backoff])


def test_the_deadline_with_pods_waiting_for_nodes_is_a_stockout_only_where_nodes_come_from_zero():
    from components.platforms.waiting import DeadlineExceeded

    class Waiting:
        def get(self, kind, name):
            return WAITING

        def pods(self, selector):
            return [_worker("w", False)]

        def pod_events(self):
            return [
                {"involvedObject": {"name": "w"}, "reason": "TriggeredScaleUp", "lastTimestamp": "2026-12-05T10:00:00Z"}
            ]

    for from_zero, raised in ((True, readiness.Stockout), (False, DeadlineExceeded)):
        now = [0.0]

        def sleep(seconds, now=now):
            now[0] += seconds

        with pytest.raises(raised, match="timed out after 30s"):
            readiness.wait_ready(
                Waiting(),
                "rc",
                30,
                unschedulable_grace_s=10,
                from_zero=from_zero,
                clock=lambda now=now: now[0],
                sleep=sleep,
                log=lambda m: None,
            )
