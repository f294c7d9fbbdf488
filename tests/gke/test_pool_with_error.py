"""A TPU node pool GKE reports RUNNING_WITH_ERROR (container v1 NodePool.Status: created and partially usable, its
statusMessage saying why), against the emulated project: readiness reports it with its message; a pool whose nodes
come from zero with a stockout in its message is the rung's stockout, which the capacity ladder moves on from; any
other message is only reported, and named in the error at the deadline. At provision, a pool that comes up so out of
capacity is the rung's capacity error, and a pool usable as it is goes on, said."""

from __future__ import annotations

import pytest

from components.platforms import ledger as ledgers
from components.platforms.gke import GkePlatform
from components.platforms.gke.run import readiness
from components.platforms.waiting import DeadlineExceeded
from tests.emulators.gke import IGM_STOCKOUT_MESSAGE
from tests.emulators.project import ONE_SLICE
from tests.gke.test_gke_platform import context
from tests.gke.test_readiness_failover import FLEX_THEN_SPOT, _pool_calls, _tpu_pool, fast  # noqa: F401

NOT_CAPACITY = "us-east5-b: Deploy error: 1 node of 1 failed to register with the control plane"


def _flex_start(pool) -> bool:
    return pool.config.flex_start


def test_a_flex_start_pool_running_with_error_out_of_capacity_moves_the_run_to_spot(
    tmp_path,
    project_factory,
    fast,  # noqa: F811 - the fixture
):
    project = project_factory(fault="scale_from_zero")
    project.kube.scale_up_s, project.kube.ready_without_ray = 3.0, True  # the nodes would come after 3 s
    ctx = context(tmp_path, "poolerr", FLEX_THEN_SPOT)
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    assert gke.provision(ctx)["capacity"] == "flex-start"
    project.gke.pools_running_with_error(IGM_STOCKOUT_MESSAGE, when=_flex_start)  # as its scale-up fails

    assert gke.deploy_raycluster(ctx)["available_workers"] == 1

    assert any("RUNNING_WITH_ERROR: us-east5-a: Deploy error" in line for line in logs)  # the progress said it
    (left,) = ledgers.load(ctx.store)["tried"]
    assert (left["capacity"], left["left_at"]) == ("flex-start", "deploy_raycluster")
    assert "RUNNING_WITH_ERROR" in left["error"] and "ZONE_RESOURCE_POOL_EXHAUSTED" in left["error"]
    assert _pool_calls(project)[-3:] == ["CreateNodePool", "DeleteNodePool", "CreateNodePool"]
    assert _tpu_pool(project, "poolerr").config.spot
    gke.teardown(ctx)
    assert project.leftovers("poolerr") == {}


def test_a_fixed_pool_running_with_error_is_reported_and_named_at_the_deadline_not_a_stockout(
    tmp_path,
    project_factory,
    fast,  # noqa: F811 - the fixture
):
    project = project_factory(fault="scale_from_zero")
    project.kube.scale_up_s = 100.0  # the nodes do not come within the deadline
    ctx = context(tmp_path, "poolrep", ONE_SLICE + " cluster.ready_timeout_s=1.5")
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    gke.provision(ctx)
    project.gke.pools_running_with_error(NOT_CAPACITY)

    with pytest.raises(DeadlineExceeded) as raised:
        gke.deploy_raycluster(ctx)

    assert not isinstance(raised.value, readiness.Stockout)
    assert f"node pool poolrep-s0 RUNNING_WITH_ERROR: {NOT_CAPACITY}" in str(raised.value)
    assert "tried" not in ledgers.load(ctx.store)
    gke.teardown(ctx)
    assert project.leftovers("poolrep") == {}


def test_a_from_zero_pool_running_with_error_not_out_of_capacity_is_not_a_stockout():
    machine = readiness.Readiness(unschedulable_grace_s=30, from_zero=True)
    waiting = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0, "state": ""}}
    assert machine.step(waiting, [], 0.0, pools={"p": ("RUNNING_WITH_ERROR", NOT_CAPACITY)}) is None
    assert machine.step(waiting, [], 100.0, pools={"p": ("RUNNING_WITH_ERROR", NOT_CAPACITY)}) is None
    assert f"node pool p RUNNING_WITH_ERROR: {NOT_CAPACITY}" in machine.last
    assert machine.step(waiting, [], 101.0, pools={"p": ("RUNNING", "")}) is None  # back to RUNNING: no longer said
    assert "RUNNING_WITH_ERROR" not in machine.last


def test_a_pool_created_running_with_error_out_of_capacity_is_the_rungs_capacity_error(tmp_path, project_factory):
    project = project_factory()
    project.gke.pools_running_with_error(IGM_STOCKOUT_MESSAGE, when=lambda p: p.name.endswith("-s0"))
    ctx = context(tmp_path, "poolprov", ONE_SLICE)
    from components.platforms.gke.cloud import cluster as gke_cluster

    with pytest.raises(gke_cluster.CapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        GkePlatform(log=lambda m: None, poll_s=0.05).provision(ctx)
    assert project.leftovers("poolprov") == {}


def test_a_pool_read_refused_during_readiness_is_said_and_the_wait_goes_on(tmp_path, project_factory, monkeypatch):
    import grpc

    monkeypatch.setenv("HF_TOKEN", "hf_test")
    project = project_factory()
    project.kube.ready_without_ray = True
    ctx = context(tmp_path, "poolread", ONE_SLICE)
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    gke.provision(ctx)
    project.gke.fail("GetNodePool", grpc.StatusCode.PERMISSION_DENIED, times=1000)

    assert gke.deploy_raycluster(ctx)["available_workers"] == 1

    assert "GetNodePool" in project.gke.state.calls[-20:]
    assert any("could not read the TPU node pools this time" in line for line in logs)
    project.gke.faults.clear()
    gke.teardown(ctx)
    assert project.leftovers("poolread") == {}
