"""Failover after provisioning, against the emulated project: a rung of the capacity ladder whose TPU nodes come from
zero shows its stockout only while deploy_raycluster waits for the RayCluster (the cluster autoscaler's FailedScaleUp
on a flex-start pool GKE has no TPUs for, a ProvisioningRequest Failed before admission, slices whose requests are
not Provisioned together); the run deletes that rung's TPU node pools first, records it in the ledger with its cost,
provisions the next rung and deploys there. The whole pipeline through such a failover: test_gke_pipeline.py."""

from __future__ import annotations

import pytest

from components.platforms import ledger as ledgers
from components.platforms.gke import GkePlatform
from components.platforms.gke.run import readiness
from components.platforms.gke.run.deploy import FAILED_SCALE_UP_GRACE_ENV, UNSCHEDULABLE_GRACE_ENV
from tests.emulators.project import ONE_SLICE
from tests.gke.test_gke_platform import TWO_SLICES, context

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


def test_a_multi_slice_queued_run_whose_second_slice_is_not_provisioned_in_time_leaves_the_rung(
    tmp_path, project_factory, fast, monkeypatch
):
    """One request per slice's pool: slice 0's is Provisioned, slice 1's never is. The run gives slice 1 a bounded
    wait after slice 0 (``readiness.SLICES_TOGETHER_S``, cut to seconds here), then deletes both pools, counting the
    host-seconds slice 0 billed, and takes the next rung."""
    monkeypatch.setattr(readiness, "SLICES_TOGETHER_S", 1.5)
    project = project_factory()
    project.kube.ready_without_ray = True
    provisioner = project.kube.provisioner
    provisioner.provision_s = 0.2
    run_id = "together"
    provisioner.provision_s_of[f"{run_id}-slice-1"] = 3600.0
    ctx = context(tmp_path, run_id, TWO_SLICES + " cluster.capacity=queued,spot cluster.ready_timeout_s=120")
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)

    assert gke.deploy_raycluster(ctx)["available_workers"] == 8

    (left,) = ledgers.load(ctx.store)["tried"]
    assert left["capacity"] == "queued" and "not Provisioned" in left["error"] and "start together" in left["error"]
    # Slice 0's four hosts were booked from when its request was Provisioned until the run left: billed, counted.
    assert left["chip_s"] >= 4 * 4 * 1.5
    assert ledgers.load(ctx.store)["candidate"]["capacity"] == "spot"
    assert _pool_calls(project).count("DeleteNodePool") == 2  # both slices' queued pools, before the spot ones
    gke.teardown(ctx)
    assert project.leftovers(run_id) == {}


# ---------------------------------------------------------------- which readiness failures are a rung's stockout

WAITING = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0, "state": ""}}
UNSCHED = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "waits for its request"}


def _worker(name: str, scheduled: bool) -> dict:
    condition = {"type": "PodScheduled", "status": "True"} if scheduled else UNSCHED
    labels = {"ray.io/node-type": "worker"}
    return {"metadata": {"name": name, "labels": labels}, "status": {"conditions": [condition]}}


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
