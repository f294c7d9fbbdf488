"""GKE's limit of node-pool operations on one cluster, against the emulated GKE (``serial_node_pool_operations``,
turned on here: a create or delete refused with GKE's failedPrecondition while another pool's operation runs, the
operation named): a stopped run's deletes (``Platform.release``, not waited on) and its teardown both end with every
pool of the run deleted, a refusal counted as this pool's delete only when the operation it names targets this
pool."""

from __future__ import annotations

import grpc
from google.cloud import container_v1

from components.platforms.gke import GkePlatform
from components.platforms.gke.cloud.cluster import targets
from tests.emulators.project import PROJECT
from tests.gke.test_gke_platform import TWO_SLICES, context, platform

SHARED = TWO_SLICES + " gke.cluster_name=tpupipe-owner"


def _op(target_link: str) -> container_v1.Operation:
    return container_v1.Operation(name="operation-1", target_link=target_link)


def test_an_operation_targets_a_resource_by_its_location_and_path_whatever_the_url_names_the_project_by():
    pool = f"projects/{PROJECT}/locations/us-east5-b/clusters/shared/nodePools/run-s1"
    api = "https://container.googleapis.com/v1/projects/123456789"
    assert targets(_op(f"{api}/zones/us-east5-b/clusters/shared/nodePools/run-s1"), pool)
    assert targets(_op(f"{api}/locations/us-east5-b/clusters/shared/nodePools/run-s1"), pool)
    # Another pool of the cluster, the cluster itself, the same names in another zone: not this pool's operation.
    assert not targets(_op(f"{api}/zones/us-east5-b/clusters/shared/nodePools/run-s0"), pool)
    assert not targets(_op(f"{api}/zones/us-east5-b/clusters/shared"), pool)
    assert not targets(_op(f"{api}/zones/us-east5-a/clusters/shared/nodePools/run-s1"), pool)
    assert not targets(_op(""), pool)


def _shared_run(tmp_path, project_factory):
    """A two-slice run in a shared cluster, provisioned while GKE takes one node-pool operation at a time."""
    project = project_factory()
    owner = context(tmp_path, "owner")
    platform().provision(owner)
    project.gke.serial_node_pool_operations = True
    lines: list[str] = []
    gke = GkePlatform(log=lines.append, poll_s=0.01)
    guest = context(tmp_path, "guest", SHARED)
    gke.provision(guest)
    pools = project.pools("guest")
    assert len(pools) >= 2, pools
    return project, gke, guest, lines


def test_two_pools_deleted_while_gke_refuses_concurrent_operations_both_end_deleted(tmp_path, project_factory):
    """The stopped task's deletes, none waited on: the second pool's delete is refused while the first one's runs
    (the refusal says "currently deleting a node pool", of the first pool); it is asked again once that operation
    ended, and each pool has a delete operation of its own. Then the janitor's teardown leaves no pool of the run."""
    project, gke, guest, lines = _shared_run(tmp_path, project_factory)
    pools = project.pools("guest")
    lines.clear()
    started = gke.release(guest)
    assert sorted(started) == sorted(pools)
    refused = [line for line in lines if "the cluster is busy" in line and "currently deleting a node pool" in line]
    assert refused, lines
    deletes = [e for e in project.gke.state.operations.values() if e.op.operation_type.name == "DELETE_NODE_POOL"]
    assert sorted(e.target for e in deletes) == sorted(pools)  # one delete operation of each pool's own
    result = gke.teardown(guest)
    assert project.pools("guest") == [], result


def test_a_refusal_naming_another_pools_operation_is_not_taken_for_this_pools_delete(tmp_path, project_factory):
    """The second pool's delete is refused while GKE creates a third pool of the cluster: not started, not counted;
    it is asked again once that create ends."""
    project, gke, guest, lines = _shared_run(tmp_path, project_factory)
    cluster = project.clusters("owner")[0]
    pools = project.pools("guest")
    blocking = gke.clients.gke().client.create_node_pool(
        parent=cluster,
        node_pool=container_v1.NodePool(
            name="other-team", initial_node_count=1, config={"machine_type": "e2-standard-4"}
        ),
    )
    lines.clear()
    started = gke.release(guest)
    assert any("currently creating a node pool" in line for line in lines), lines
    assert sorted(started) == sorted(pools)
    create = project.gke.state.operations[f"{cluster.rsplit('/clusters/', 1)[0]}/operations/{blocking.name}"]
    assert create.op.status == container_v1.Operation.Status.DONE  # polled to its end, not skipped
    gke.teardown(guest)
    assert project.pools("guest") == []


def test_deletes_gke_will_not_start_in_the_grace_period_are_not_counted_and_left_to_the_janitor(
    tmp_path, project_factory, monkeypatch
):
    """Another pool's operation outlasts the stopped task's grace (here half a second): none of the run's deletes is
    started, none is reported started; the teardown that follows (the janitor's) deletes every pool once it ends."""
    from components.platforms.gke.run import teardown

    project, gke, guest, lines = _shared_run(tmp_path, project_factory)
    cluster = project.clusters("owner")[0]
    blocking = gke.clients.gke().client.create_node_pool(
        parent=cluster,
        node_pool=container_v1.NodePool(
            name="slow-team", initial_node_count=1, config={"machine_type": "e2-standard-4"}
        ),
    )
    create = project.gke.state.operations[f"{cluster.rsplit('/clusters/', 1)[0]}/operations/{blocking.name}"]
    create.polls_left = 10**6  # it runs on past the grace
    monkeypatch.setattr(teardown, "START_TIMEOUT_S", 0.5)
    lines.clear()
    assert gke.release(guest) == []
    assert any("not started, the cluster busy" in line for line in lines), lines
    assert len(project.pools("guest")) >= 2
    create.polls_left = 1
    gke.teardown(guest)
    assert project.pools("guest") == []


def test_a_delete_gke_refuses_outright_does_not_keep_the_other_pools_from_being_deleted(tmp_path, project_factory):
    """A pool whose delete GKE refuses for good (a permission, a precondition that is no busy cluster) is left to the
    janitor with one line; the other pool's delete is still asked for and starts."""
    project, gke, guest, lines = _shared_run(tmp_path, project_factory)
    pools = project.pools("guest")
    first = sorted(pools)[-1]
    project.gke.fail(
        "DeleteNodePool",
        grpc.StatusCode.PERMISSION_DENIED,
        "Required 'container.nodePools.delete' permission",
        when=lambda request: request.name.endswith(first.rsplit("/", 1)[-1]),
    )
    project.gke.serial_node_pool_operations = False
    lines.clear()
    started = gke.release(guest)
    assert started and first not in started and len(started) == len(pools) - 1, (started, lines)
    assert any("not started" in line and "left to the janitor" in line for line in lines), lines
