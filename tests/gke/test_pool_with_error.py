"""A TPU node pool GKE reports RUNNING_WITH_ERROR (container v1 NodePool.Status: created and partially usable, its
statusMessage saying why), against the emulated project: readiness reports it with its message and names it in the
error at the deadline, but it is not by itself a stockout (where nodes come from zero GKE documents the autoscaler's
FailedScaleUp for that). At provision, a pool that comes up so out of capacity is the rung's capacity error; a TPU
slice's pool with any other message fails the run (a slice trains only on all of its hosts)."""

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

# A message made for these tests (no public record of GKE's non-capacity RUNNING_WITH_ERROR texts was found): any
# statusMessage that names no stockout.
NOT_CAPACITY = "us-east5-a: Deploy error: 1 node of 1 failed to register with the control plane"


def _flex_start(pool) -> bool:
    return pool.config.flex_start


def test_a_from_zero_pool_running_with_error_out_of_capacity_is_reported_not_taken_for_a_stockout(
    tmp_path,
    project_factory,
    fast,  # noqa: F811 - the fixture
):
    project = project_factory(fault="scale_from_zero")
    project.kube.scale_up_s, project.kube.ready_without_ray = 3.0, True  # the nodes come after 3 s
    ctx = context(tmp_path, "poolerr", FLEX_THEN_SPOT)
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    assert gke.provision(ctx)["capacity"] == "flex-start"
    project.gke.pools_running_with_error(IGM_STOCKOUT_MESSAGE, when=_flex_start)

    assert gke.deploy_raycluster(ctx)["available_workers"] == 1  # the nodes came: the run goes on, on flex-start

    assert any("RUNNING_WITH_ERROR: us-east5-a: Deploy error" in line for line in logs)  # the progress said it
    assert "tried" not in ledgers.load(ctx.store)
    assert _pool_calls(project).count("DeleteNodePool") == 0
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


def test_a_slice_pool_created_running_with_error_not_out_of_capacity_fails_naming_it(tmp_path, project_factory):
    project = project_factory()
    project.gke.pools_running_with_error(NOT_CAPACITY, when=lambda p: p.name.endswith("-s0"))
    ctx = context(tmp_path, "poolpart", ONE_SLICE)
    from components.platforms.gke.cloud import cluster as gke_cluster

    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    with pytest.raises(gke_cluster.GkeError, match="poolpart-s0 is RUNNING_WITH_ERROR, only partly usable") as raised:
        gke.provision(ctx)
    assert not isinstance(raised.value, gke_cluster.CapacityError)
    assert NOT_CAPACITY.split(": ", 1)[1] in str(raised.value)
    gke.teardown(ctx)
    assert project.leftovers("poolpart") == {}


def test_a_flex_start_pool_created_running_with_error_is_said_at_provision_and_left_to_readiness(
    tmp_path,
    project_factory,
    fast,  # noqa: F811 - the fixture
):
    project = project_factory(fault="scale_from_zero")
    project.gke.pools_running_with_error(IGM_STOCKOUT_MESSAGE, when=_flex_start)
    ctx = context(tmp_path, "poolzero", FLEX_THEN_SPOT)
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)

    assert gke.provision(ctx)["capacity"] == "flex-start"  # no capacity error: its nodes are not asked for yet

    assert any("RUNNING_WITH_ERROR before its nodes come" in line for line in logs)
    assert "tried" not in ledgers.load(ctx.store)
    gke.teardown(ctx)
    assert project.leftovers("poolzero") == {}
