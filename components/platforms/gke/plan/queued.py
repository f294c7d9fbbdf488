"""Queued provisioning (``cluster.capacity=queued``): the run's TPU node pools are made with queued provisioning on,
and the run asks for each slice's nodes at once with one ProvisioningRequest (autoscaling.x-k8s.io/v1) per slice
node pool, of the class ``queued-provisioning.gke.io`` that Dynamic Workload Scheduler fulfils; each slice's worker
pods (a worker group of their own) consume their slice's request by annotation, and the run starts when every slice's
request is Provisioned. Why this way and not through Kueue: docs/gke.md, "Queued provisioning".

One request per pool, because the open-source cluster autoscaler fulfils a request all or nothing within ONE node
group (inferred for GKE, whose own provisioning class is not open source): with
``allOrNothing`` a node group whose scale-up would leave some of the request's pods out is no option ("Some pods
can't fit to %s, giving up due to all-or-nothing scale-up strategy": kubernetes/autoscaler,
cluster-autoscaler/core/scaleup/orchestrator/orchestrator.go, ``ScaleUp``, at
021bbf41081464628ab138ebe9f604a5d488c173; the atomic provisioning class calls it with ``allOrNothing`` true,
cluster-autoscaler/provisioningrequest/besteffortatomic/provisioning_class.go), and a TPU slice pool holds one slice
(max nodes = its hosts): a request for several slices' hosts fits none. Google's TPU queued provisioning examples make
one pool per slice (cluster-toolkit, examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-tpu-7x,
``num_slices`` pools, ``autoscaling_max_node_count`` "Must match your topology"), and xpk never sends one request for
several slices (https://github.com/AI-Hypercomputer/xpk/pull/631, "Don't set --enable-queued-provisioning for flex
multislice"). Which TPU families GKE takes queued provisioning for at all: the catalogue's
``Family.queued_provisioning`` (checked at validate, ``components.workload.checks.check_queued``).

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

GKE taints the nodes of a queued provisioning node pool ``cloud.google.com/gke-queued=true:NoSchedule``, so every
pod meant for them carries the matching toleration (``TOLERATION``: the worker pods, and so the request's PodTemplate,
which is their template), the run's own request or Kueue's: Google's cluster-toolkit, modules/compute/gke-node-pool
(variables.tf, ``enable_queued_provisioning``: it "adds the cloud.google.com/gke-queued taint to the node pool"), and
its TPU examples, examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-tpu-7x/README.md,
"Tolerations (Mandatory)" (https://github.com/GoogleCloudPlatform/cluster-toolkit at
1047080375afbb44da4b596be314634e7486af4a). Without it the request's nodes come up, bill, and the pods stay Pending.

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
from components.workload import derive

CAPACITY = "queued"
API_VERSION = "autoscaling.x-k8s.io/v1"
CLASS_NAME = "queued-provisioning.gke.io"
CRD_NAME = "provisioningrequests.autoscaling.x-k8s.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
MAX_RUN_PARAMETER = "maxRunDurationSeconds"
# The toleration of GKE's taint on queued provisioning nodes (module docstring), as cluster-toolkit's examples write it.
TOLERATION = {"key": "cloud.google.com/gke-queued", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
# No node selector of its own: GKE labels a queued provisioning pool's nodes with nothing that says so (the label
# cloud.google.com/gke-queued that xpk and cluster-toolkit's test jobs select is one cluster-toolkit puts in the pool's
# own labels, modules/compute/gke-node-pool/main.tf at 1047080375afbb44da4b596be314634e7486af4a, while GKE adds only
# the taint). The run's worker pods select its own pools by the run's label, and consume their slice's request; through
# Kueue, the ResourceFlavor's node labels are added when Kueue admits the run.
# The request's slice topology, as cluster-toolkit's TPU queued provisioning example passes it: its
# ProvisioningRequestConfig's ``parameters: {tpu-topology: "${tpu_topology}"}``
# (examples/gke-consumption-options/dws-flex-start-queued-provisioning/tpu-dws-queues.yaml.tftpl at
# 9dca946c60fd969f22e540e03cf61845b3555d12), which Kueue copies into the ProvisioningRequest's parameters.
TOPOLOGY_PARAMETER = "tpu-topology"
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


def worker_tolerations(spec: RunSpec) -> list[dict[str, str]]:
    """The worker pods' tolerations: GKE's queued provisioning taint under capacity=queued (the run's request or
    Kueue's), none otherwise."""
    return [dict(TOLERATION)] if enabled(spec) else []


def family_text(spec: RunSpec) -> str:
    """Why the run's TPU family may be queued: the public source that shows GKE's queued provisioning for it (the
    catalogue's ``Family.queued_provisioning``; a family without one is refused at validate)."""
    family = derive.slice_shape(spec).family
    return f"GKE queued provisioning of {family.name} slices as Google shows it: {family.queued_provisioning}"


def parameters(spec: RunSpec) -> dict[str, str]:
    """The request's parameters: the slice topology (``TOPOLOGY_PARAMETER``) and the maximum run duration
    (``MAX_RUN_PARAMETER``, always sent: ``max_run_s``)."""
    return {TOPOLOGY_PARAMETER: derive.slice_shape(spec).topology, MAX_RUN_PARAMETER: str(max_run_s(spec))}


def raycluster_annotations(spec: RunSpec) -> dict[str, str]:
    """Through Kueue: the request's parameters (``parameters``), passed on by Kueue to the request it makes (none
    else)."""
    if not through_kueue(spec):
        return {}
    return {KUEUE_PARAMETER_PREFIX + key: value for key, value in parameters(spec).items()}


def request_name(run_id: str, slice_index: int = 0) -> str:
    """The request for the nodes of slice ``slice_index`` (its node pool, ``names.tpu_node_pool``)."""
    suffix = f"-slice-{slice_index}"
    return names.fit(run_id, names.COMPUTE_NAME_MAX - len(suffix)) + suffix


def request_names(spec: RunSpec, run_id: str) -> list[str]:
    """The run's own requests, one per slice (none unless the run makes them: ``direct``)."""
    return [request_name(run_id, i) for i in range(spec.cluster.num_slices)] if direct(spec) else []


def pod_template_name(run_id: str, slice_index: int = 0) -> str:
    suffix = f"-workers-{slice_index}"
    return names.fit(run_id, names.COMPUTE_NAME_MAX - len(suffix)) + suffix


def worker_annotations(spec: RunSpec, t: Target, slice_index: int = 0) -> dict[str, str]:
    """The annotations by which slice ``slice_index``'s worker pods consume its request (none unless the run makes
    it: through Kueue, Kueue adds them when it admits the RayCluster)."""
    if not direct(spec):
        return {}
    return {CONSUME_ANNOTATION: request_name(t.run_id, slice_index), CLASS_ANNOTATION: CLASS_NAME}


def max_run_s(spec: RunSpec) -> int:
    """The request's maximum run duration: the run's deadline (run.deadline_h), capped at flex-start's seven days
    (``checks.FLEX_START_MAX_H``, GKE's default too), which it is without a deadline: sent either way, so the nodes'
    longest run is the run's own and not left to a default."""
    from components.workload.checks import FLEX_START_MAX_H

    hours = spec.run.deadline_h
    return int(min(hours if hours is not None else FLEX_START_MAX_H, FLEX_START_MAX_H) * 3600)


def objects(spec: RunSpec, t: Target, worker_templates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per slice, the PodTemplate of its worker pods and the request for its hosts, all of them on its node pool
    (none unless the run makes the requests itself: ``direct``); ``worker_templates``: the pod template of each
    slice's worker group of the RayCluster, in slice order."""
    if not direct(spec):
        return []
    labels = names.labels(t.run_id)
    out: list[dict[str, Any]] = []
    for i, worker_template in enumerate(worker_templates):
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": pod_template_name(t.run_id, i), "namespace": t.namespace, "labels": dict(labels)},
            "template": worker_template,
        }
        request = {
            "apiVersion": API_VERSION,
            "kind": "ProvisioningRequest",
            "metadata": {"name": request_name(t.run_id, i), "namespace": t.namespace, "labels": dict(labels)},
            "spec": {
                "provisioningClassName": CLASS_NAME,
                "podSets": [
                    {"podTemplateRef": {"name": pod_template_name(t.run_id, i)}, "count": spec.cluster.num_hosts}
                ],
                "parameters": parameters(spec),
            },
        }
        out += [template, request]
    return out


def condition(request: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The request's condition ``kind`` when it is True, else None."""
    conditions: list[dict[str, Any]] = ((request or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind and c.get("status") == "True"), None)


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
