"""The ProvisioningRequestConfig behind Kueue's ProvisioningRequest admission check, where it matters to a queued
run (gke.queue with cluster.capacity=queued): ``managedResources`` that leave out google.com/tpu make a request that
holds none of the slice's pods (the emulated Kueue then passes the check with no request at all, as Kueue's CRD
says), which preflight refuses naming gke.queue; a config without xpk's ``podSetUpdates`` node selector is a
warning."""

from __future__ import annotations

import pytest

from components.platforms.gke.plan import manifests
from components.platforms.gke.plan.target import target
from components.workload import resolve
from tests.emulators.kueue import QUEUE_LABEL
from tests.gke.test_kueue import QUEUED_CAPACITY, QUEUED_POOL, _requests, provisioning_check, setup
from tests.gke.test_preflight import _team_cluster, preflight_cli

XPK_UPDATES = {
    "nodeSelector": [
        {"key": "autoscaling.gke.io/provisioning-request", "valueFromProvisioningClassDetail": "ResizeRequestName"}
    ]
}


def _config(kueue, **spec) -> None:
    with kueue.kube.lock:
        kueue.kube.objects[("provisioningrequestconfigs", "", "dws-config")]["spec"].update(spec)


@pytest.mark.parametrize(
    "case, code, expected",
    [
        (
            "gpu only",
            2,
            "gke.queue: ClusterQueue shared-tpu (of LocalQueue team-a): its admission check dws names "
            "ProvisioningRequestConfig dws-config, whose managedResources (nvidia.com/gpu) leave out google.com/tpu",
        ),
        (
            "no pod set updates",
            0,
            "warning: ProvisioningRequestConfig dws-config sets no podSetUpdates.nodeSelector "
            "autoscaling.gke.io/provisioning-request (from the request's ResizeRequestName)",
        ),
        ("as xpk", 0, "ProvisioningRequestConfig dws-config of the class queued-provisioning.gke.io)"),
    ],
    ids=["gpu only", "no pod set updates", "as xpk"],
)
def test_preflight_checks_the_provisioning_request_config_where_it_matters(
    project_factory, capsys, case, code, expected
):
    project = project_factory()
    _team_cluster(project, nodePools=[QUEUED_POOL])
    kueue = setup(project)
    provisioning_check(kueue)
    if case == "gpu only":
        _config(kueue, managedResources=["nvidia.com/gpu"])
    if case == "as xpk":
        _config(kueue, podSetUpdates=XPK_UPDATES)
    got, text = preflight_cli(QUEUED_CAPACITY, capsys)
    assert got == code and expected in text, text
    assert case != "as xpk" or "sets no podSetUpdates" not in text


def test_the_emulated_kueue_makes_no_request_when_no_pod_set_asks_for_a_managed_resource(project_factory):
    project = project_factory()
    _team_cluster(project, nodePools=[QUEUED_POOL])
    kueue = setup(project)
    provisioning_check(kueue)
    _config(kueue, managedResources=["nvidia.com/gpu"])
    spec = resolve("local-fsdp", QUEUED_CAPACITY)
    raycluster = manifests.raycluster(spec, target(spec, "unmanaged"))
    assert raycluster["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    raycluster["metadata"]["uid"] = "uid-1"
    with project.kube.lock:
        project.kube.objects[("rayclusters", "tpupipe", "unmanaged")] = raycluster
        assert kueue.raycluster_created("tpupipe", raycluster)
        workload = kueue.workload_of("tpupipe", "unmanaged")
    assert any(c["type"] == "Admitted" and c["status"] == "True" for c in workload["status"]["conditions"])
    assert _requests(project) == {}  # admitted with no capacity asked for: the slice's pods wait for nodes
