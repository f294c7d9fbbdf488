"""GKE's taint on queued provisioning nodes (``cloud.google.com/gke-queued=true:NoSchedule``) and the toleration every
pod meant for them carries: the emulated scheduler keeps a pod without it off the request's nodes (Pending while the
nodes are up), and lets the plan's own pods land; Kubernetes' toleration matching rules, one by one."""

from __future__ import annotations

import copy
import time

import pytest

from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import queued
from components.spec import names
from components.workload import resolve
from tests.emulators import provisioning, taints
from tests.emulators.project import ONE_SLICE
from tests.gke.test_preflight import PARENT

QUEUED_TAINT = {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "toleration, taint, matches",
    [
        ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, "k=v:NoSchedule", True),
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, "k=v:NoSchedule", True),  # Equal is the default
        ({"key": "k", "operator": "Equal", "value": "w", "effect": "NoSchedule"}, "k=v:NoSchedule", False),
        ({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, "k=v:NoSchedule", True),  # any value
        ({"key": "j", "operator": "Exists", "effect": "NoSchedule"}, "k=v:NoSchedule", False),
        ({"key": "k", "operator": "Exists"}, "k=v:NoExecute", True),  # no effect: every effect of the key
        ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute"}, "k=v:NoSchedule", False),
        ({"operator": "Exists"}, "k=v:NoSchedule", True),  # an empty key with Exists tolerates everything
        ({"operator": "Equal", "value": "v"}, "k=v:NoSchedule", False),  # an empty key is Exists' only
    ],
)
def test_a_toleration_matches_a_taint_as_kubernetes_documents(toleration, taint, matches):
    key_value, effect = taint.split(":")
    key, value = key_value.split("=")
    assert taints.tolerates(toleration, {"key": key, "value": value, "effect": effect}) is matches


def test_only_refusing_effects_keep_a_pod_off_and_the_refusal_reads_as_the_scheduler_writes_it():
    prefer = {"key": "k", "value": "v", "effect": "PreferNoSchedule"}
    assert taints.untolerated({}, [prefer]) is None  # a preference, never a refusal
    assert taints.untolerated({}, [QUEUED_TAINT]) == QUEUED_TAINT
    assert taints.untolerated({"tolerations": [queued.TOLERATION]}, [QUEUED_TAINT]) is None
    assert provisioning.QUEUED_TAINT == QUEUED_TAINT
    assert taints.refusal(QUEUED_TAINT, 2).startswith(
        "0/2 nodes are available: 2 node(s) had untolerated taint {cloud.google.com/gke-queued: true}."
    )


def _secrets_named(raycluster: dict) -> set[str]:
    """The Secrets the RayCluster's pods name (volumes, environment): made beforehand, as the run's deploy does."""
    out = set()
    spec = raycluster["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        out |= {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        for container in pod["containers"]:
            out |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", []) if "valueFrom" in e}
    return out


def _apply(project, run_id: str, tolerate: bool) -> tuple[str, str]:
    """The plan's PodTemplate, ProvisioningRequest and RayCluster of a one-slice queued run, created as they are, or
    with the worker pods' toleration taken out (the template and the pods alike); (namespace, request)."""
    spec = resolve("local-fsdp", QUEUED)
    planned = {res.kind: res.body for res in plan.resources(spec, run_id) if res.kind.startswith("k8s/")}
    template = copy.deepcopy(planned["k8s/PodTemplate"])
    raycluster = copy.deepcopy(planned["k8s/RayCluster"])
    worker = raycluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["tolerations"] == [queued.TOLERATION] == template["template"]["spec"]["tolerations"]
    if not tolerate:
        del worker["tolerations"], template["template"]["spec"]["tolerations"]
    namespace = raycluster["metadata"]["namespace"]
    kube = project.kube
    if ("namespaces", "", namespace) not in kube.objects:
        kube.create("namespaces", "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for name in _secrets_named(raycluster):
        if ("secrets", namespace, name) not in kube.objects:
            secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {}}
            kube.create("secrets", namespace, secret)
    kube.create("podtemplates", namespace, template)
    kube.create("provisioningrequests", namespace, planned["k8s/ProvisioningRequest"])
    kube.create("rayclusters", namespace, raycluster)
    return namespace, planned["k8s/ProvisioningRequest"]["metadata"]["name"]


def _workers(project, namespace: str, cluster_label: str) -> list[dict]:
    with project.kube.lock:
        return [
            copy.deepcopy(o)
            for (p, ns, _), o in project.kube.objects.items()
            if p == "pods"
            and ns == namespace
            and o["metadata"]["labels"].get("ray.io/cluster") == cluster_label
            and o["metadata"]["labels"].get("ray.io/node-type") == "worker"
        ]


QUEUED = ONE_SLICE + " cluster.capacity=queued run.deadline_h=6"


def _wait(what, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not what():
        time.sleep(0.05)


def _refused(pod: dict) -> bool:
    return any("untolerated taint" in c.get("message", "") for c in pod["status"].get("conditions", []))


def test_pods_without_the_toleration_stay_pending_on_the_provisioned_tainted_nodes_and_with_it_land(
    project_factory,
):
    project = project_factory()
    kube = project.kube
    kube.ready_without_ray = True
    kube.provisioner.provision_s = 0.2
    # each run's slice pool, with queued provisioning on (the request is fulfilled within it: one slice of one host)
    pools = [
        {
            "name": names.tpu_node_pool(run_id, 0),
            "config": {"machineType": "ct6e-standard-4t", "labels": names.labels(run_id)},
            "initialNodeCount": 0,
            "autoscaling": {"enabled": True, "minNodeCount": 0, "maxNodeCount": 1, "locationPolicy": "ANY"},
            "queuedProvisioning": {"enabled": True},
        }
        for run_id in ("untol", "tol")
    ]
    project.gke.add_cluster(PARENT, {"name": "queued", "nodePools": pools})
    results = {}
    for run_id, tolerate in (("untol", False), ("tol", True)):
        namespace, request = _apply(project, run_id, tolerate)
        cluster = next(k[2] for k in kube.objects if k[0] == "rayclusters" and k[2].startswith(run_id))
        _wait(lambda ns=namespace, r=request: kube.provisioner.provisioned(ns, r))
        assert kube.provisioner.provisioned(namespace, request)  # the request's nodes came, either way
        if tolerate:
            _wait(
                lambda ns=namespace, c=cluster: kube.objects[("rayclusters", ns, c)]["status"].get("state") == "ready"
            )
        else:
            _wait(lambda ns=namespace, c=cluster: all(_refused(p) for p in _workers(project, ns, c)))
            time.sleep(0.5)  # and they stay so
        results[run_id] = (namespace, cluster, _workers(project, namespace, cluster))
    namespace, cluster, workers = results["untol"]
    assert workers
    for pod in workers:  # Pending, as the scheduler says, on nodes that are up
        (cond,) = pod["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "Unschedulable")
        assert "had untolerated taint {cloud.google.com/gke-queued: true}" in cond["message"]
        with kube.lock:
            events = [
                o["reason"]
                for (p, ns, _), o in kube.objects.items()
                if p == "events" and o["involvedObject"]["name"] == pod["metadata"]["name"]
            ]
        assert events == ["FailedScheduling"]
    assert kube.objects[("rayclusters", namespace, cluster)]["status"].get("state") != "ready"
    namespace, cluster, workers = results["tol"]
    assert workers and all({"type": "PodScheduled", "status": "True"} in p["status"]["conditions"] for p in workers)
    assert all(p["status"]["phase"] == "Running" for p in workers)
    assert kube.objects[("rayclusters", namespace, cluster)]["status"]["state"] == "ready"


# ------------------------------------------------------------------ which TPU families GKE queues
@pytest.mark.parametrize(
    "family, topology, hosts",
    [("v5p", "2x2x2", 2), ("v5e", "4x4", 4)],
)
def test_queued_capacity_on_a_family_without_a_public_source_is_refused_at_validate_naming_it(family, topology, hosts):
    from components.spec import SpecError

    shape = f"cluster.accelerator={family} cluster.topology={topology} cluster.num_hosts={hosts} gke.project=my-project"
    for capacity in ("queued", "spot,queued"):  # a rung of a ladder too
        with pytest.raises(SpecError) as refused:
            resolve("llama3-8b-v6e-16x2", f"{shape} cluster.capacity={capacity}")
        text = str(refused.value)
        assert refused.value.field == "cluster.capacity" and refused.value.exit_code == 2
        assert f"queued provisioning of {family} TPU slices has no public GKE source" in text
        assert "Flex start node pools don't support TPUs with queued provisioning" in text
        assert "https://github.com/AI-Hypercomputer/xpk/pull/900" in text
        assert "ray-kueue-dws" in text and "cluster.capacity=flex-start" in text  # the alternative, with its source


def test_queued_capacity_is_offered_for_v6e_and_tpu7x_with_the_source_the_plan_names():
    from components.tpu import catalogue

    sourced = {f.name for f in catalogue.FAMILIES.values() if f.queued_provisioning}
    assert sourced == {"v6e", "tpu7x"}
    spec = resolve("llama3-8b-v6e-16x2", "gke.project=my-project cluster.num_slices=1 cluster.capacity=queued")
    pools = [
        res
        for res in plan.resources(spec, "fam")
        if res.kind == "node-pool" and res.body and "queuedProvisioning" in res.body
    ]
    assert pools and all(catalogue.FAMILIES["v6e"].queued_provisioning in p.summary for p in pools)


def test_several_slices_queued_through_kueue_are_refused_one_is_taken():
    from components.spec import SpecError

    shared = "gke.project=my-project gke.cluster_name=shared gke.queue=team-a cluster.capacity=queued"
    with pytest.raises(SpecError) as refused:
        resolve("llama3-8b-v6e-16x2", shared)
    assert refused.value.field == "cluster.num_slices" and "flex-start behind Kueue" in str(refused.value)
    resolve("gemma4-e2b-v6e-16", shared)
