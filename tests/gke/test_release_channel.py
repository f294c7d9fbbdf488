"""Node management as the cluster's release channel allows it, against the emulated GKE that enforces GKE's rule
(``tests/emulators/gke.py``): a cluster created without ``releaseChannel`` is enrolled in REGULAR, and on a channel a
node pool with auto-upgrade off is refused with GKE's 400. The flex-start plan's pools (auto-repair off) are
accepted; the same body with auto-upgrade off is not."""

from __future__ import annotations

import json

import pytest
from google.api_core import exceptions as gexc
from google.cloud import container_v1

from components.platforms.gke.cloud.cluster import cluster_manager
from components.platforms.gke.plan import resources
from components.platforms.gke.plan.target import target
from components.platforms.gke.run.handlers import exclusion_window
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT, PROJECT_NUMBER

FLEX_START = ONE_SLICE.replace("us-east5-b", "us-east5-a") + " cluster.capacity=flex-start"  # a zone offering it
PARENT = f"projects/{PROJECT}/locations/us-east5-b"


def _created(client, body: dict) -> container_v1.Cluster:
    op = client.create_cluster(parent=PARENT, cluster=container_v1.Cluster.from_json(json.dumps(body)))
    for _ in range(10):  # the emulator finishes the operation after a few polls
        if client.get_operation(name=f"{PARENT}/operations/{op.name}").status == container_v1.Operation.Status.DONE:
            return client.get_cluster(name=f"{PARENT}/clusters/{body['name']}")
    raise AssertionError(f"cluster {body['name']} never ran")


def _plan(overrides: str):
    """The cluster's and the first TPU pool's bodies as provision sends them (the nodes' account's number filled in)."""
    spec = resolve("local-fsdp", overrides)
    t = target(spec, "rc")
    bodies = json.dumps([resources.cluster(spec, t), resources.tpu_node_pools(spec, t)[0]])
    cluster, pool = json.loads(bodies.replace("PROJECT_NUMBER", PROJECT_NUMBER))
    cluster.pop("subnetwork")  # the run's own, which provision makes first (tests/gke/test_private_nodes.py)
    exclusion_window(cluster, spec.run.deadline_h)  # its maintenance exclusion's window, as provision fills it in
    return cluster, pool


def test_the_cluster_body_states_its_channel_and_flex_start_pools_keep_auto_upgrade_on():
    cluster, pool = _plan(FLEX_START)
    assert cluster["releaseChannel"] == {"channel": resources.RELEASE_CHANNEL}
    assert pool["management"] == {"autoRepair": False, "autoUpgrade": True}


def test_the_flex_start_plans_node_pool_is_accepted_and_auto_upgrade_off_is_refused(project_factory):
    project_factory()
    client = cluster_manager()
    cluster_body, pool_body = _plan(FLEX_START)
    cluster = _created(client, cluster_body)
    assert cluster.release_channel.channel == container_v1.ReleaseChannel.Channel.REGULAR
    client.create_node_pool(parent=cluster.self_link, node_pool=container_v1.NodePool.from_json(json.dumps(pool_body)))

    refused = {**pool_body, "name": "off", "management": {"autoRepair": False, "autoUpgrade": False}}
    with pytest.raises(gexc.InvalidArgument) as caught:
        client.create_node_pool(
            parent=cluster.self_link, node_pool=container_v1.NodePool.from_json(json.dumps(refused))
        )
    assert "Auto_upgrade cannot be false when release_channel REGULAR is set." in str(caught.value)


def test_a_cluster_created_without_a_channel_is_enrolled_in_regular_and_refuses_auto_upgrade_off(project_factory):
    project_factory()
    client = cluster_manager()
    cluster_body, pool_body = _plan(ONE_SLICE)
    del cluster_body["releaseChannel"]  # as the body was before it stated one
    cluster = _created(client, cluster_body)
    assert cluster.release_channel.channel == container_v1.ReleaseChannel.Channel.REGULAR
    old = {**pool_body, "management": {"autoRepair": False}}  # what flex-start pools sent: auto-upgrade false
    with pytest.raises(gexc.InvalidArgument, match="Auto_upgrade cannot be false"):
        client.create_node_pool(parent=cluster.self_link, node_pool=container_v1.NodePool.from_json(json.dumps(old)))


def test_a_version_that_has_reached_only_rapid_is_created_on_rapid_and_one_everywhere_on_stable(
    tmp_path, project_factory
):
    """GKE offers a version on Rapid first, then Regular, then Stable: the cluster is created on the most stable
    channel that offers the pinned version, not refused because Regular has not got it yet."""
    from tests.emulators.gke import VERSIONS
    from tests.gke.test_gke_platform import context, platform

    project = project_factory()
    project.gke.channels = {"RAPID": VERSIONS, "REGULAR": VERSIONS[:-1], "STABLE": VERSIONS[:-2]}
    platform().provision(context(tmp_path, "rapid", ONE_SLICE + " gke.cluster_version=1.36"))
    (name,) = project.clusters("rapid")
    cluster = project.gke.state.clusters[name]
    assert cluster.release_channel.channel == container_v1.ReleaseChannel.Channel.RAPID
    assert cluster.current_master_version == VERSIONS[-1]
    platform().provision(context(tmp_path, "stable", ONE_SLICE + " gke.cluster_version=1.34"))
    (name,) = project.clusters("stable")
    assert project.gke.state.clusters[name].release_channel.channel == container_v1.ReleaseChannel.Channel.STABLE
    platform().provision(context(tmp_path, "default", ONE_SLICE))  # no pin: the default channel's default
    (name,) = project.clusters("default")
    assert project.gke.state.clusters[name].release_channel.channel == container_v1.ReleaseChannel.Channel.REGULAR
