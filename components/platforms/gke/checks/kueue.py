"""Preflight of a run queued in Kueue on a shared cluster (``gke.queue``), read through the cluster's Kubernetes API
before anything is created; each problem names the field to change:

- Kueue is installed: its LocalQueue CRD is served, with ``kueue.x-k8s.io/v1beta2`` (Kueue v0.15 or later,
  ``cloud.kueue``);
- Kueue manages RayClusters: ``ray.io/raycluster`` in its configuration's ``integrations.frameworks`` (the
  ConfigMap ``cloud.kueue`` names and cites; unreadable: a warning);
- the LocalQueue ``gke.queue`` exists in ``gke.namespace`` and points to a ClusterQueue that exists
  (https://kueue.sigs.k8s.io/docs/concepts/local_queue/);
- that ClusterQueue covers every resource the RayCluster asks for (a workload asking for a resource its ClusterQueue
  does not cover is never admitted), and one of its flavors for ``google.com/tpu`` whose ResourceFlavor's
  ``nodeLabels`` agree with the slice's node selector (accelerator and topology) has a nominal quota of at least the
  run's chips: Kueue admits the RayCluster whole, every slice at once
  (https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/#flavors-and-resources,
  https://kueue.sigs.k8s.io/docs/concepts/resource_flavor/);
- a ClusterQueue in a cohort (``cohortName``) whose own quota is too small but which may borrow the rest from the
  other ClusterQueues of its cohort (their ``lendingLimit``, else their ``nominalQuota``; at most its own
  ``borrowingLimit``) is a warning, not a problem: Kueue admits the run only while the cohort leaves that much unused,
  and may preempt it when a lender reclaims its quota (https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/#cohort;
  the ClusterQueue CRD of Kueue v0.19.2, config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml);
- ``gke.priority_class`` names a WorkloadPriorityClass that exists
  (https://kueue.sigs.k8s.io/docs/concepts/workload_priority_class/);
- with ``cluster.capacity=queued``, the ClusterQueue runs Kueue's ProvisioningRequest admission check for the TPU
  flavor (``admissionChecksStrategy``: a rule with no ``onFlavors``, or one naming the flavor), its AdmissionCheck's
  ``controllerName`` is ``kueue.x-k8s.io/provisioning-request`` and its controller marked it ``Active`` ("if an
  AdmissionCheck is not found or its controller has not marked it as Active, the ClusterQueue will be marked as
  Inactive": https://kueue.sigs.k8s.io/docs/concepts/admission_check/), and its parameters name a
  ProvisioningRequestConfig that exists, of the class ``queued-provisioning.gke.io``
  (https://kueue.sigs.k8s.io/docs/admission-check-controllers/provisioning/), whose ``managedResources`` (when it
  lists any) include ``google.com/tpu`` ("If not empty, the ProvisioningRequest will contain only the podsets that are
  requesting at least one of them. If none of the workloads podsets is requesting at least a managed resource, the
  workload is considered ready": the field's description in Kueue v0.19.2's ProvisioningRequestConfig CRD); a config
  without xpk's ``podSetUpdates`` node selector (``PROVISIONED_NODE_LABEL``) is a warning.

ClusterQueues, ResourceFlavors and WorkloadPriorityClasses are cluster-scoped: a caller who may read only its own
namespace (Kueue's batch user role) gets a warning that they could not be checked, not a problem. What the run may do
in its namespace, Kueue's objects included, is ``k8s_access``' SelfSubjectAccessReviews.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from components.platforms.gke.checks.findings import Problem, Report
from components.platforms.gke.cloud import kueue
from components.platforms.gke.plan import manifests, queued
from components.platforms.gke.plan.target import target
from components.spec import RunSpec
from components.workload import derive as d

if TYPE_CHECKING:
    from components.platforms.gke.cloud.kube import Kube

# The podSetUpdates of xpk's ProvisioningRequestConfig for queued provisioning on GKE: a nodeSelector on the label GKE
# puts on the nodes of a request, valued from the request's ``ResizeRequestName`` class detail
# (AI-Hypercomputer/xpk, src/xpk/templates/kueue_config.yaml.j2); Kueue copies each such detail of the
# request's status.provisioningClassDetails into the pods' nodeSelector on admission ("podSetUpdates ... are used to
# target the provisioned nodes": the ProvisioningRequestConfig CRD of Kueue v0.19.2;
# https://kueue.sigs.k8s.io/docs/admission-check-controllers/provisioning/, "PodSet updates").
PROVISIONED_NODE_LABEL = "autoscaling.gke.io/provisioning-request"
PROVISIONED_NODE_DETAIL = "ResizeRequestName"


def check(kube: Kube, spec: RunSpec, report: Report, run_id: str = "preflight") -> None:
    """The checks above, with ``kube`` a client of the cluster's API in the run's namespace."""
    from kubernetes.client.exceptions import ApiException

    queue, where = spec.gke.queue, f"namespace {kube.namespace}"
    crd = kube.crd(kueue.LOCAL_QUEUE_CRD)
    if crd is None:
        report.problems.append(
            Problem(
                "gke.queue",
                f"Kueue is not installed in cluster {spec.gke.cluster_name} (no CRD {kueue.LOCAL_QUEUE_CRD}): install "
                f"Kueue {kueue.MIN_VERSION} or later (docs/gke.md, 'Shared clusters: Kueue'), or leave gke.queue empty",
            )
        )
        return
    served = [v["name"] for v in crd["spec"].get("versions", []) if v.get("served")]
    if kueue.VERSION not in served:
        report.problems.append(
            Problem(
                "gke.queue",
                f"cluster {spec.gke.cluster_name} runs a Kueue older than {kueue.MIN_VERSION} (it serves "
                f"{', '.join(served)}, not {kueue.VERSION}): upgrade Kueue, or leave gke.queue empty",
            )
        )
        return
    report.checked.append(f"Kueue serves {kueue.GROUP}/{kueue.VERSION} (Kueue {kueue.MIN_VERSION} or later)")
    _ray_integration(kube, spec, report)
    local = kueue.local_queue(kube, queue)
    if local is None:
        report.problems.append(Problem("gke.queue", f"no Kueue LocalQueue {queue} in {where}: {_queues(kube)}"))
        return
    cq_name = local["spec"].get("clusterQueue", "")
    raycluster = manifests.raycluster(spec, target(spec, run_id))
    try:
        cq = kueue.cluster_object(kube, "clusterqueues", cq_name)
        if cq is None:
            report.problems.append(
                Problem("gke.queue", f"LocalQueue {queue} points to ClusterQueue {cq_name}, which does not exist")
            )
            return
        flavor = _quota(kube, spec, queue, cq, raycluster, report)
        if flavor and queued.through_kueue(spec):
            _provisioning_check(kube, queue, cq, flavor, report)
        if (
            spec.gke.priority_class
            and kueue.cluster_object(kube, "workloadpriorityclasses", spec.gke.priority_class) is None
        ):
            report.problems.append(
                Problem("gke.priority_class", f"no Kueue WorkloadPriorityClass {spec.gke.priority_class}")
            )
    except ApiException as exc:
        if exc.status != 403:
            raise
        report.warnings.append(
            f"LocalQueue {queue} points to ClusterQueue {cq_name}, which the caller may not read ({exc.status}): its "
            "flavors, its quota and gke.priority_class are not checked"
        )


def _ray_integration(kube: Kube, spec: RunSpec, report: Report) -> None:
    """Kueue manages RayClusters: ``ray.io/raycluster`` in its configuration's ``integrations.frameworks``
    (``kueue.frameworks``); a configuration the caller may not read is a warning (deploy_raycluster then fails fast
    when Kueue makes no Workload: ``run.queueing``)."""
    from kubernetes.client.exceptions import ApiException

    where = f"ConfigMap {kueue.CONFIG_NAMESPACE}/{kueue.CONFIG_MAP}"
    try:
        enabled = kueue.frameworks(kube)
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise
        report.warnings.append(
            f"Kueue's configuration ({where}) could not be read ({exc.status}): that it manages RayClusters "
            f"({kueue.RAY_INTEGRATION} in integrations.frameworks) is not checked; deploy_raycluster fails if Kueue "
            "makes no Workload for the run's RayCluster"
        )
        return
    if kueue.RAY_INTEGRATION not in enabled:
        report.problems.append(
            Problem(
                "gke.queue",
                f"Kueue in cluster {spec.gke.cluster_name} does not manage RayClusters: its configuration ({where}) "
                f"lists integrations.frameworks {', '.join(enabled) or 'none'}, without {kueue.RAY_INTEGRATION}, so "
                "the run's RayCluster would stay suspended with no Workload; ask its platform team to add it "
                "(docs/gke.md, 'Shared clusters: Kueue'), or leave gke.queue empty",
            )
        )
        return
    report.checked.append(f"Kueue manages RayClusters ({kueue.RAY_INTEGRATION} in its {where})")


def _queues(kube: Kube) -> str:
    items = kube.custom.list_namespaced_custom_object(kueue.GROUP, kueue.VERSION, kube.namespace, "localqueues")
    names = sorted(q["metadata"]["name"] for q in items["items"])
    return f"its LocalQueues are {', '.join(names)}" if names else "it has no LocalQueue"


def _quota(
    kube: Kube, spec: RunSpec, queue: str, cq: dict[str, Any], raycluster: dict[str, Any], report: Report
) -> str | None:
    """Every resource the RayCluster asks for is covered; a TPU flavor matching the slice has quota for all of it:
    that flavor's name, None after a problem."""
    name = cq["metadata"]["name"]
    groups = cq["spec"].get("resourceGroups", [])
    asked: dict[str, float] = {}
    for _, count, template in kueue.pod_sets(raycluster):
        for resource, amount in kueue.pod_requests(template).items():
            asked[resource] = asked.get(resource, 0.0) + amount * count
    uncovered = sorted(r for r in asked if not any(r in g["coveredResources"] for g in groups))
    if uncovered:
        report.problems.append(
            Problem(
                "gke.queue",
                f"ClusterQueue {name} (of LocalQueue {queue}) covers no {', '.join(uncovered)}, which the RayCluster "
                "asks for: Kueue would never admit it; ask its platform team to cover them, or choose another queue",
            )
        )
        return None
    shape = d.slice_shape(spec)
    wanted = int(asked.get(kueue.TPU_RESOURCE, 0))
    selector = _worker_selector(raycluster)
    group = next(g for g in groups if kueue.TPU_RESOURCE in g["coveredResources"])
    matching: list[tuple[str, float]] = []
    for flavor in group["flavors"]:
        found = kueue.cluster_object(kube, "resourceflavors", flavor["name"])
        labels = (found or {}).get("spec", {}).get("nodeLabels", {})
        if found is None or any(labels.get(k) != v for k, v in selector.items() if k in labels):
            continue
        quota = next(kueue.quantity(r["nominalQuota"]) for r in flavor["resources"] if r["name"] == kueue.TPU_RESOURCE)
        matching.append((flavor["name"], quota))
    slice_text = f"{shape.family.gke_accelerator} {shape.topology}"
    if not matching:
        report.problems.append(
            Problem(
                "gke.queue",
                f"ClusterQueue {name} (of LocalQueue {queue}) has no ResourceFlavor for {slice_text} (node labels "
                f"{selector}); flavors: {', '.join(f['name'] for f in group['flavors'])}: choose a queue for this "
                "slice, or change cluster.accelerator / cluster.topology",
            )
        )
        return None
    best, quota = max(matching, key=lambda m: m[1])
    short = (
        f"ClusterQueue {name} (of LocalQueue {queue}) has a quota of {quota:g} {kueue.TPU_RESOURCE} in flavor "
        f"{best}, less than the run's {wanted} ({spec.cluster.num_slices} x {shape.num_chips}-chip {slice_text})"
    )
    if quota < wanted:
        cohort = cq["spec"].get("cohortName", "")
        lent = _borrowable(kube, cq, [f for f, _ in matching], report) if cohort else {}
        fits = [(f, q) for f, q in matching if f in lent and _enough(q, lent[f], wanted)]
        borrowing = max(fits, key=lambda m: m[1]) if fits else None
        if borrowing is not None:
            best, quota = borrowing
            report.warnings.append(
                f"ClusterQueue {name} (of LocalQueue {queue}) has a quota of {quota:g} {kueue.TPU_RESOURCE} in flavor "
                f"{best}, less than the run's {wanted}: the run fits only by borrowing {wanted - quota:g} from the "
                f"other ClusterQueues of its cohort {cohort} ({_lends(lent[best])}); Kueue admits it only "
                "while they leave that much unused, and may preempt it when one of them reclaims its quota "
                "(its preemption.reclaimWithinCohort)"
            )
            report.checked.append(
                f"LocalQueue {queue} -> ClusterQueue {name}: flavor {best} ({slice_text}) has a quota of {quota:g} "
                f"{kueue.TPU_RESOURCE} and borrows in cohort {cohort} ({_lends(lent[best])}), the run asks for {wanted}"
            )
            return best
        lend = f", and its cohort {cohort} lends it at most {max(v or 0.0 for v in lent.values()):g}" if cohort else ""
        report.problems.append(
            Problem(
                "gke.queue",
                f"{short}{lend}: Kueue admits a RayCluster whole and would never admit it; lower "
                "cluster.num_slices, or ask for quota",
            )
        )
        return None
    report.checked.append(
        f"LocalQueue {queue} -> ClusterQueue {name}: flavor {best} ({slice_text}) has a quota of {quota:g} "
        f"{kueue.TPU_RESOURCE}, the run asks for {wanted}"
    )
    return best


def _enough(quota: float, lent: float | None, wanted: int) -> bool:
    """Quota and what the cohort lends are enough for the run (what it lends unknown: it may be)."""
    return lent is None or quota + lent >= wanted


def _lends(lent: float | None) -> str:
    return "what they lend could not be read" if lent is None else f"they lend it up to {lent:g}"


def _borrowable(kube: Kube, cq: dict[str, Any], flavors: list[str], report: Report) -> dict[str, float | None]:
    """Flavor -> the most ``cq`` may borrow of its TPU chips in its cohort: what the cohort's other ClusterQueues lend
    (each its ``lendingLimit``, else all its ``nominalQuota``), at most its own ``borrowingLimit`` (none: no limit).
    The ClusterQueue CRD's ``cohortName``, ``borrowingLimit`` and ``lendingLimit`` (Kueue v0.19.2,
    config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml; https://kueue.sigs.k8s.io/docs/concepts/
    cluster_queue/#cohort, #borrowinglimit, #lendinglimit). A Cohort object's own quota or parent (hierarchical
    cohorts) is not counted: then what it lends is unknown, and the run is warned, not refused. None when the caller
    may not list ClusterQueues (a warning says so)."""
    from kubernetes.client.exceptions import ApiException

    name, cohort = cq["metadata"]["name"], cq["spec"]["cohortName"]
    try:
        others = [
            o
            for o in kueue.cluster_queues(kube)
            if o["spec"].get("cohortName") == cohort and o["metadata"]["name"] != name
        ]
    except ApiException as exc:
        if exc.status != 403:
            raise
        report.warnings.append(
            f"the ClusterQueues of cohort {cohort} could not be listed ({exc.status}): what ClusterQueue {name} may "
            "borrow there is not checked"
        )
        return dict.fromkeys(flavors)
    if _hierarchical(kube, cohort):
        report.warnings.append(
            f"cohort {cohort} is a Cohort object with its own quota or a parent (a hierarchical cohort: "
            "https://kueue.sigs.k8s.io/docs/concepts/hierarchical_cohort/): what ClusterQueue "
            f"{name} may borrow through it is not counted here, so a run that does not fit its own quota is let "
            "through for Kueue to decide"
        )
        return dict.fromkeys(flavors)
    out: dict[str, float | None] = {}
    for flavor in flavors:
        entries = [kueue.flavor_quota(other, flavor, kueue.TPU_RESOURCE) for other in others]
        lent = sum(kueue.quantity(e.get("lendingLimit", e["nominalQuota"])) for e in entries if e is not None)
        limit = (kueue.flavor_quota(cq, flavor, kueue.TPU_RESOURCE) or {}).get("borrowingLimit")
        out[flavor] = lent if limit is None else min(lent, kueue.quantity(limit))
    return out


def _hierarchical(kube: Kube, cohort: str) -> bool:
    """Whether ``cohort`` is a Cohort object that holds quota of its own or has a parent (Kueue v0.19.2,
    apis/kueue/v1beta2/cohort_types.go: ``resourceGroups``, ``parentName``); a cohort named only by its ClusterQueues
    has no object. One the caller may not read counts as hierarchical: its lending is unknown."""
    from kubernetes.client.exceptions import ApiException

    try:
        found = kueue.cluster_object(kube, "cohorts", cohort)
    except ApiException as exc:
        if exc.status != 403:
            raise
        return True
    spec = (found or {}).get("spec") or {}
    return bool(spec.get("resourceGroups") or spec.get("parentName"))


def _provisioning_check(kube: Kube, queue: str, cq: dict[str, Any], flavor: str, report: Report) -> None:
    """capacity=queued through Kueue: the ClusterQueue runs an Active ProvisioningRequest admission check of the
    queued-provisioning class for ``flavor`` (the sources: this module's docstring)."""
    name = cq["metadata"]["name"]
    rules = (cq["spec"].get("admissionChecksStrategy") or {}).get("admissionChecks") or []
    names = [r["name"] for r in rules if not r.get("onFlavors") or flavor in r["onFlavors"]]
    found = {n: kueue.cluster_object(kube, "admissionchecks", n) for n in names}
    checks = {n: c for n, c in found.items() if c and c["spec"].get("controllerName") == queued.CHECK_CONTROLLER}
    fix = (
        f"ask its platform team for a ProvisioningRequest admission check of the class {queued.CLASS_NAME} "
        "(docs/gke.md, 'Queued provisioning'), choose another queue, or another cluster.capacity"
    )
    if not checks:
        report.problems.append(
            Problem(
                "gke.queue",
                f"ClusterQueue {name} (of LocalQueue {queue}) runs no {queued.CHECK_CONTROLLER} admission check for "
                f"flavor {flavor} (its checks: {', '.join(names) or 'none'}), which cluster.capacity=queued needs: "
                + fix,
            )
        )
        return
    whys = []
    for check_name, check in checks.items():
        params = check["spec"].get("parameters") or {}
        active = next((c for c in (check.get("status") or {}).get("conditions", []) if c["type"] == "Active"), None)
        config = (
            kueue.cluster_object(kube, "provisioningrequestconfigs", params.get("name", ""))
            if params.get("kind") == queued.CHECK_CONFIG_KIND
            else None
        )
        if not active or active["status"] != "True":
            why = "is not Active" + (f" ({active.get('reason', '')}: {active.get('message', '')})" if active else "")
        elif config is None:
            why = f"names no {queued.CHECK_CONFIG_KIND} that exists (its parameters: {params or 'none'})"
        elif config["spec"].get("provisioningClassName") != queued.CLASS_NAME:
            other = config["spec"]["provisioningClassName"]
            why = f"names {queued.CHECK_CONFIG_KIND} {params['name']}, of another class ({other})"
        elif kueue.TPU_RESOURCE not in (config["spec"].get("managedResources") or [kueue.TPU_RESOURCE]):
            managed = ", ".join(config["spec"]["managedResources"])
            why = (
                f"names {queued.CHECK_CONFIG_KIND} {params['name']}, whose managedResources ({managed}) leave out "
                f"{kueue.TPU_RESOURCE}: its request would hold none of the slice's pods and the check pass without "
                "capacity, the pods then waiting for nodes no request brings"
            )
        else:
            _pod_set_updates(params["name"], config, report)
            report.checked.append(
                f"ClusterQueue {name}: admission check {check_name} ({queued.CHECK_CONTROLLER}, Active, "
                f"{queued.CHECK_CONFIG_KIND} {params['name']} of the class {queued.CLASS_NAME})"
            )
            return
        whys.append(f"its admission check {check_name} {why}")
    report.problems.append(
        Problem("gke.queue", f"ClusterQueue {name} (of LocalQueue {queue}): {'; '.join(whys)}: {fix}")
    )


def _pod_set_updates(name: str, config: dict[str, Any], report: Report) -> None:
    """A warning when the ProvisioningRequestConfig does not pin the admitted pods to the nodes GKE provisioned for
    their request (``podSetUpdates.nodeSelector``: the node label ``PROVISIONED_NODE_LABEL`` from the request's
    ``ResizeRequestName`` class detail, ``PROVISIONED_NODE_DETAIL``), as xpk's does."""
    selectors = (config["spec"].get("podSetUpdates") or {}).get("nodeSelector") or []
    if any(s.get("key") == PROVISIONED_NODE_LABEL for s in selectors):
        return
    report.warnings.append(
        f"{queued.CHECK_CONFIG_KIND} {name} sets no podSetUpdates.nodeSelector {PROVISIONED_NODE_LABEL} (from the "
        f"request's {PROVISIONED_NODE_DETAIL}): the admitted pods are not pinned to the nodes provisioned for their "
        "own request, and may land on another request's queued nodes"
    )


def _worker_selector(raycluster: dict[str, Any]) -> dict[str, str]:
    groups = raycluster["spec"].get("workerGroupSpecs", [])
    return dict(groups[0]["template"]["spec"].get("nodeSelector", {})) if groups else {}
