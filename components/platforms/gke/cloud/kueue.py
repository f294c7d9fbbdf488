"""Kueue's objects as a run on a shared cluster reads them (``gke.queue``), through the run's Kubernetes client.

Kueue's API is ``kueue.x-k8s.io/v1beta2``: served since Kueue v0.15, its storage version since v0.16 (the CRDs of
those tags, kubernetes-sigs/kueue config/components/crd/bases/; v1beta1 is still served); LocalQueues and Workloads
are namespaced, ClusterQueues and ResourceFlavors cluster-scoped. A RayCluster's Workload is the one whose owner
reference names it (https://kueue.sigs.k8s.io/docs/concepts/workload/). Where a pending workload stands in its queue
comes from Kueue's visibility API (``visibility.kueue.x-k8s.io``, its v1beta2 since v0.15; the VisibilityOnDemand
feature gate, on by default since v0.9: kubernetes-sigs/kueue pkg/features/kube_features.go;
https://kueue.sigs.k8s.io/docs/tasks/manage/monitor_pending_workloads/pending_workloads_on_demand/).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from components.platforms.gke.cloud.kube import Kube

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
VISIBILITY = "visibility.kueue.x-k8s.io/v1beta2"
LOCAL_QUEUE_CRD = f"localqueues.{GROUP}"
MIN_VERSION = "v0.15"  # the first Kueue release that serves kueue.x-k8s.io/v1beta2
TPU_RESOURCE = "google.com/tpu"


# Kueue's own configuration (its ``Configuration``) is the ConfigMap kueue-system/kueue-manager-config, key
# controller_manager_config.yaml (kubernetes-sigs/kueue config/default/kustomization.yaml: namespace kueue-system,
# namePrefix kueue-; config/components/manager/kustomization.yaml: the manager-config ConfigMap of that file). Its
# ``integrations.frameworks`` lists the job kinds Kueue manages; ``ray.io/raycluster`` is in the release's default list
# (config/components/manager/controller_manager_config.yaml). Without it Kueue makes no Workload for a RayCluster, and
# a RayCluster created suspended stays suspended.
CONFIG_NAMESPACE = "kueue-system"
CONFIG_MAP = "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"
RAY_INTEGRATION = "ray.io/raycluster"


def frameworks(kube: Kube) -> list[str]:
    """The integrations Kueue's configuration enables (ApiException when its ConfigMap cannot be read)."""
    import yaml

    found = kube.core.read_namespaced_config_map(CONFIG_MAP, CONFIG_NAMESPACE)
    config = yaml.safe_load((found.data or {}).get(CONFIG_KEY, "")) or {}
    return list((config.get("integrations") or {}).get("frameworks") or [])


def _missing(exc: BaseException) -> bool:
    return getattr(exc, "status", None) == 404


def local_queue(kube: Kube, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return cast(
            dict[str, Any],
            kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.namespace, "localqueues", name),
        )
    except ApiException as exc:
        if _missing(exc):
            return None
        raise


def cluster_object(kube: Kube, plural: str, name: str) -> dict[str, Any] | None:
    """A ClusterQueue or ResourceFlavor (cluster-scoped); None when there is none."""
    from kubernetes.client.exceptions import ApiException

    try:
        return cast(dict[str, Any], kube.custom.get_cluster_custom_object(GROUP, VERSION, plural, name))
    except ApiException as exc:
        if _missing(exc):
            return None
        raise


def cluster_queues(kube: Kube) -> list[dict[str, Any]]:
    """Every ClusterQueue of the cluster (cluster-scoped)."""
    return list(kube.custom.list_cluster_custom_object(GROUP, VERSION, "clusterqueues")["items"])


def flavor_quota(cq: dict[str, Any], flavor: str, resource: str) -> dict[str, Any] | None:
    """The ClusterQueue's quota of ``resource`` in ``flavor`` (``nominalQuota``, ``borrowingLimit``,
    ``lendingLimit``); None when it lists none."""
    return next(
        (
            r
            for g in cq["spec"].get("resourceGroups", [])
            for f in g["flavors"]
            if f["name"] == flavor
            for r in f["resources"]
            if r["name"] == resource
        ),
        None,
    )


def workload_of(kube: Kube, raycluster: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the RayCluster (its owner); None before Kueue made it."""
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, kube.namespace, "workloads")["items"]
    return next(
        (
            w
            for w in items
            if any(
                r.get("kind") == "RayCluster" and r.get("name") == raycluster
                for r in w["metadata"].get("ownerReferences", [])
            )
        ),
        None,
    )


def pending(kube: Kube, queue: str) -> list[dict[str, Any]]:
    """The LocalQueue's pending workloads in queue order (``positionInLocalQueue``, ``positionInClusterQueue``)."""
    answer = kube.retrying.call(
        "pending workloads",
        kube.api.call_api,
        f"/apis/{VISIBILITY}/namespaces/{{namespace}}/localqueues/{{name}}/pendingworkloads",
        "GET",
        {"namespace": kube.namespace, "name": queue},
        [],
        {"Accept": "application/json"},
        response_type="object",
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
    )
    return list(answer.get("items", []))


def condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in (workload.get("status") or {}).get("conditions", []) if c.get("type") == kind),
        None,
    )


def is_true(workload: dict[str, Any], kind: str) -> bool:
    found = condition(workload, kind)
    return found is not None and found["status"] == "True"


def chips(workload: dict[str, Any]) -> int:
    """The TPU chips the workload asks for: each pod set's google.com/tpu times its count."""
    sets = workload["spec"].get("podSets", [])
    return int(sum(pod_requests(p["template"]).get(TPU_RESOURCE, 0) * p.get("count", 1) for p in sets))


# Kubernetes quantity suffixes (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/).
SUFFIXES = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
SUFFIXES.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40})


def quantity(text: Any) -> float:
    """A Kubernetes quantity (``4``, ``500m``, ``16Gi``) as a number."""
    import re

    found = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    if found is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = found.groups()
    return float(number) * SUFFIXES[suffix]


def pod_requests(template: dict[str, Any]) -> dict[str, float]:
    """What a pod asks for: each container's requests, its limits where it sets no request (the API server defaults a
    request to its limit: https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/)."""
    out: dict[str, float] = {}
    for container in template.get("spec", {}).get("containers", []):
        resources = container.get("resources", {})
        for name, value in {**resources.get("limits", {}), **resources.get("requests", {})}.items():
            out[name] = out.get(name, 0.0) + quantity(value)
    return out


def pod_sets(raycluster: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """The RayCluster as Kueue sees it: (name, count, pod template) for the head and each worker group, count =
    replicas x numOfHosts (https://kueue.sigs.k8s.io/docs/tasks/run/rayclusters/)."""
    spec = raycluster["spec"]
    out = [("head", 1, spec["headGroupSpec"]["template"])]
    for group in spec.get("workerGroupSpecs", []):
        out.append((group["groupName"], group.get("replicas", 1) * group.get("numOfHosts", 1), group["template"]))
    return out
