"""Queued provisioning (``cluster.capacity=queued``): the run's TPU node pools are made with queued provisioning on,
and the run asks for all their nodes at once with ONE ProvisioningRequest (autoscaling.x-k8s.io/v1) of the class
``queued-provisioning.gke.io`` that Dynamic Workload Scheduler fulfils; the worker pods consume it by annotation.
Why this way and not through Kueue: docs/gke.md, "Queued provisioning".

Sources:
- GKE docs, "Run a large-scale workload with flex-start with queued provisioning"
  (https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest): GKE "allocates all requested
  resources at the same time"; the node pool takes ``--flex-start`` and ``--enable-queued-provisioning``, autoscaling
  from 0 nodes, ``--location-policy=ANY``, ``--reservation-affinity=none`` and ``--no-enable-autorepair``; without
  Kueue, a PodTemplate, a ProvisioningRequest of the class ``queued-provisioning.gke.io`` naming it, with the
  parameter ``maxRunDurationSeconds`` (the nodes' longest run; GKE's default when it is left out), and the
  pods annotated with the request's name and class.
- ``NodePool.queued_provisioning`` (``QueuedProvisioning.enabled``: "nodes can be only obtained through queuing via
  the Cluster Autoscaler ProvisioningRequest API"): google-cloud-container, container_v1/types/cluster_service.py.
- The ProvisioningRequest API, its annotations and conditions: kubernetes/autoscaler,
  cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go (``PodSet``: "a reference to a
  PodTemplate object that is representing pods that will consume this reservation ... fields relevant to scheduler
  (e.g. node selector tolerations) are consistent between this template and actual pods consuming the Provisioning
  Request"; ``ProvisioningRequestPodAnnotationKey``, ``ProvisioningClassPodAnnotationKey``; the condition types).

On a shared cluster queued in Kueue (``gke.queue``) the run creates neither node pools nor the request: Kueue's
ProvisioningRequest admission check does, once the ClusterQueue reserved quota for the RayCluster's Workload, and
admits it when the request is Provisioned (Kueue docs, "Provisioning Admission Check Controller",
https://kueue.sigs.k8s.io/docs/admission-check-controllers/provisioning/: an AdmissionCheck with ``controllerName:
kueue.x-k8s.io/provisioning-request`` whose parameters name a ProvisioningRequestConfig of the class; "every
annotation with the provreq.kueue.x-k8s.io/ prefix will be directly passed to created ProvisioningRequest"): the
RayCluster carries the request's maximum run duration as such an annotation, and preflight checks the ClusterQueue
lists the check (``checks.kueue``).

Pure functions of (spec, target); nothing here talks to a cloud.
"""

from __future__ import annotations

from typing import Any

from components.platforms.gke.plan.target import Target
from components.spec import RunSpec, names

CAPACITY = "queued"
API_VERSION = "autoscaling.x-k8s.io/v1"
CLASS_NAME = "queued-provisioning.gke.io"
CRD_NAME = "provisioningrequests.autoscaling.x-k8s.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
MAX_RUN_PARAMETER = "maxRunDurationSeconds"
# The request's condition types (types.go): Provisioned, all its nodes are there; Failed, capacity cannot be had;
# BookingExpired and CapacityRevoked, the nodes it gave are no longer the run's to consume.
PROVISIONED = "Provisioned"
ENDED = ("Failed", "BookingExpired", "CapacityRevoked")


# Kueue's ProvisioningRequest admission check (gke.queue with capacity=queued)
CHECK_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
CHECK_CONFIG_KIND = "ProvisioningRequestConfig"
KUEUE_PARAMETER_PREFIX = "provreq.kueue.x-k8s.io/"


def enabled(spec: RunSpec) -> bool:
    return spec.cluster.capacity == CAPACITY


def direct(spec: RunSpec) -> bool:
    """capacity=queued with the run's own node pools: the run makes its ProvisioningRequest itself."""
    return enabled(spec) and not spec.gke.queue


def through_kueue(spec: RunSpec) -> bool:
    """capacity=queued in a Kueue queue: Kueue's ProvisioningRequest admission check makes the request."""
    return enabled(spec) and bool(spec.gke.queue)


def raycluster_annotations(spec: RunSpec) -> dict[str, str]:
    """Through Kueue: the request's maximum run duration, the run's deadline, passed on by Kueue (none else)."""
    if not through_kueue(spec) or max_run_s(spec) is None:
        return {}
    return {KUEUE_PARAMETER_PREFIX + MAX_RUN_PARAMETER: str(max_run_s(spec))}


def request_name(run_id: str) -> str:
    return names.fit(f"{run_id}-slices", names.COMPUTE_NAME_MAX)


def pod_template_name(run_id: str) -> str:
    return names.fit(f"{run_id}-workers", names.COMPUTE_NAME_MAX)


def worker_annotations(spec: RunSpec, t: Target) -> dict[str, str]:
    """The annotations by which the worker pods consume the run's request (none unless the run makes it: through
    Kueue, Kueue adds them when it admits the RayCluster)."""
    if not direct(spec):
        return {}
    return {CONSUME_ANNOTATION: request_name(t.run_id), CLASS_ANNOTATION: CLASS_NAME}


def max_run_s(spec: RunSpec) -> int | None:
    """The request's maximum run duration: the run's deadline (run.deadline_h), else GKE's default (None)."""
    hours = spec.run.deadline_h
    return None if hours is None else int(hours * 3600)


def objects(spec: RunSpec, t: Target, worker_template: dict[str, Any]) -> list[dict[str, Any]]:
    """The PodTemplate of the worker pods and the ONE ProvisioningRequest for every host of every slice (none
    unless the run makes the request itself: ``direct``); ``worker_template`` is the RayCluster worker group's pod
    template."""
    if not direct(spec):
        return []
    labels = names.labels(t.run_id)
    template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": pod_template_name(t.run_id), "namespace": t.namespace, "labels": dict(labels)},
        "template": worker_template,
    }
    parameters = {} if max_run_s(spec) is None else {MAX_RUN_PARAMETER: str(max_run_s(spec))}
    request = {
        "apiVersion": API_VERSION,
        "kind": "ProvisioningRequest",
        "metadata": {"name": request_name(t.run_id), "namespace": t.namespace, "labels": dict(labels)},
        "spec": {
            "provisioningClassName": CLASS_NAME,
            "podSets": [
                {
                    "podTemplateRef": {"name": pod_template_name(t.run_id)},
                    "count": spec.cluster.num_hosts * spec.cluster.num_slices,
                }
            ],
            **({"parameters": parameters} if parameters else {}),
        },
    }
    return [template, request]


def condition(request: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The request's condition ``kind`` when it is True, else None."""
    for cond in ((request or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def ended(request: dict[str, Any] | None) -> str | None:
    """Why the request will give the run no nodes (Failed, BookingExpired, CapacityRevoked: its reason and
    message), else None."""
    for kind in ENDED:
        cond = condition(request, kind)
        if cond is not None:
            return f"{kind}: {cond.get('reason', '')}: {cond.get('message', '')}".rstrip(": ")
    return None


def admission_checks(workload: dict[str, Any] | None) -> str:
    """Through Kueue: where the Workload's admission checks stand (``status.admissionChecks``: Pending, Ready,
    Retry, Rejected: https://kueue.sigs.k8s.io/docs/concepts/admission_check/), "" when it has none."""
    states = ((workload or {}).get("status") or {}).get("admissionChecks") or []
    return "; ".join(f"admission check {s['name']} {s['state']}: {s.get('message', '')}".rstrip(": ") for s in states)


def rejected(workload: dict[str, Any] | None) -> str | None:
    """Why Kueue will not admit the Workload again: an admission check Rejected (the Workload is deactivated: Kueue
    docs, "Admission Check"; the ProvisioningRequest check rejects once its retryStrategy.backoffLimitCount is spent,
    https://kueue.sigs.k8s.io/docs/admission-check-controllers/provisioning/), else None."""
    states = ((workload or {}).get("status") or {}).get("admissionChecks") or []
    found = next((s for s in states if s.get("state") == "Rejected"), None)
    return None if found is None else f"admission check {found['name']} Rejected: {found.get('message', '')}"
