"""Kueue in the Kubernetes emulator (``KubeEmulator.kueue``): its objects and its controller's part for RayClusters.

The objects (Workload, LocalQueue, ClusterQueue, ResourceFlavor, AdmissionCheck, ProvisioningRequestConfig,
WorkloadPriorityClass of ``kueue.x-k8s.io/v1beta2``) are served and validated against Kueue v0.19.2's CRDs
(``tests/contract/crds/kueue-v0.19.2/``); their CRDs are served only while Kueue is installed. The behaviours, each
after the Kueue document it follows:

- Kueue's configuration is its ConfigMap (``configure``): a RayCluster is managed only while ``ray.io/raycluster``
  is among its ``integrations.frameworks`` (else Kueue makes no Workload for it, and KubeRay keeps a RayCluster created
  suspended without pods);
- a RayCluster labelled ``kueue.x-k8s.io/queue-name`` is suspended (``spec.suspend``) and gets a Workload owned by
  it, one pod set for the head and one per worker group, ``count`` = replicas x numOfHosts ("Kueue controls the
  spec.suspend field of the RayCluster"; "a RayCluster will hold resource quotas while it exists":
  https://kueue.sigs.k8s.io/docs/tasks/run/rayclusters/); its priority is the value of the WorkloadPriorityClass its
  ``kueue.x-k8s.io/priority-class`` label names (https://kueue.sigs.k8s.io/docs/concepts/workload_priority_class/);
  KubeRay makes no pods for a suspended RayCluster, and preemption "triggers Kubernetes to delete active pods"
  (https://docs.ray.io/en/master/cluster/kubernetes/k8s-ecosystem/kueue.html);
- admission: a Workload of a LocalQueue is admitted when, for every pod set, a flavor of its ClusterQueue whose
  ``nodeLabels`` agree with the pods' nodeSelector (on the keys the ClusterQueue's flavors label) has the quota left
  (``nominalQuota`` less what admitted workloads use; in a cohort, what it may borrow too: ``Kueue._room``) for every
  resource the pods request; flavors are tried in the
  order the ClusterQueue lists them (https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/#flavors-and-resources,
  https://kueue.sigs.k8s.io/docs/concepts/resource_flavor/); a request of a resource the ClusterQueue does not cover
  is never admitted. Pending workloads go by priority, then creation; ``StrictFIFO`` stops at the first that does not
  fit, ``BestEffortFIFO`` (the default) tries the rest
  (https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/#queueing-strategy). On admission the flavor's
  ``nodeLabels`` are added to the pod templates' nodeSelector, its ``tolerations`` to their tolerations ("extra
  tolerations that will be added to the pods admitted in the quota associated with this resource flavor": the
  ResourceFlavor CRD, ``tests/contract/crds/kueue-v0.19.2/kueue.x-k8s.io_resourceflavors.yaml``), and the RayCluster
  is unsuspended (https://kueue.sigs.k8s.io/docs/concepts/workload/, "Admission"); a ProvisioningRequest's
  PodTemplate gets the same;
- preemption: with ``preemption.withinClusterQueue: LowerPriority`` a pending workload that does not fit evicts
  admitted ones of lower priority in its ClusterQueue, the lowest priority first and among equals the most recently
  admitted, until it fits; the evicted Workload gets ``Evicted`` (reason ``Preempted``), loses its quota, and its
  RayCluster is suspended again (its pods deleted) and requeued
  (https://kueue.sigs.k8s.io/docs/concepts/preemption/); admitted again, its ``Evicted`` condition turns False;
- a RayCluster deleted takes its Workload with it (owner reference), freeing its quota; the next pending ones are
  admitted (https://kueue.sigs.k8s.io/docs/concepts/workload/);
- the ProvisioningRequest admission check (``ProvisioningChecks`` below: Kueue's Provisioning Admission Check
  Controller, https://kueue.sigs.k8s.io/docs/admission-check-controllers/provisioning/);
- the visibility API's pending workloads of a LocalQueue, in order with their positions
  (``/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{ns}/localqueues/{lq}/pendingworkloads``,
  https://kueue.sigs.k8s.io/docs/tasks/manage/monitor_pending_workloads/pending_workloads_on_demand/).
"""

from __future__ import annotations

import copy
import re
import secrets
import threading
import time

from components.platforms.gke.cloud.kueue import flavor_quota, pod_requests, pod_sets, quantity

GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
KINDS = {
    "workloads": "Workload",
    "localqueues": "LocalQueue",
    "clusterqueues": "ClusterQueue",
    "resourceflavors": "ResourceFlavor",
    "admissionchecks": "AdmissionCheck",
    "provisioningrequestconfigs": "ProvisioningRequestConfig",
    "workloadpriorityclasses": "WorkloadPriorityClass",
    # hierarchical cohorts (Kueue v0.19.2, apis/kueue/v1beta2/cohort_types.go): served, not modelled
    "cohorts": "Cohort",
}
CLUSTER_SCOPED = {"clusterqueues", "resourceflavors", "admissionchecks", "provisioningrequestconfigs"}
CLUSTER_SCOPED |= {"workloadpriorityclasses", "cohorts"}
# Kueue's configuration: the ConfigMap its install makes (kubernetes-sigs/kueue v0.19.2, config/default/
# kustomization.yaml: namespace kueue-system, namePrefix kueue-; config/components/manager/kustomization.yaml), and the
# integrations its default configuration enables, those of them that matter here
# (config/components/manager/controller_manager_config.yaml); a RayCluster is managed only with ray.io/raycluster.
CONFIG_NAMESPACE = "kueue-system"
CONFIG_MAP = "kueue-manager-config"
FRAMEWORKS = ["batch/job", "kubeflow.org/mpijob", "ray.io/rayjob", "ray.io/raycluster", "jobset.x-k8s.io/jobset"]
VISIBILITY_PATH = re.compile(
    r"^/apis/visibility\.kueue\.x-k8s\.io/v1beta2/namespaces/([^/]+)/localqueues/([^/]+)/pendingworkloads$"
)


def _quantity_text(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{round(value * 1000)}m"


def _condition(kind: str, status: bool, reason: str, message: str) -> dict:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class Kueue:
    """Kueue installed in ``kube`` (a KubeEmulator): called by it under its lock."""

    def __init__(self, kube, version: str = "0.19.2"):
        self.kube = kube
        self.version = version
        self.visibility = True  # the visibility API served (its VisibilityOnDemand feature gate, on by default)
        self._order = 0
        self._orders: dict[str, int] = {}  # Workload uid -> its creation order (queue order among equal priorities)
        self._admitted: dict[str, int] = {}  # Workload uid -> when it was last admitted, in admissions
        self._admissions = 0
        self.checks = ProvisioningChecks(self)  # the ProvisioningRequest admission check's controller
        self.configure(FRAMEWORKS)

    def configure(self, frameworks: list[str]) -> None:
        """Kueue's configuration as its install writes it: the ConfigMap kueue-system/kueue-manager-config, whose
        ``integrations.frameworks`` are the job kinds it manages (``FRAMEWORKS``)."""
        import yaml

        text = yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta1",
                "kind": "Configuration",
                "integrations": {"frameworks": list(frameworks)},
            }
        )
        with self.kube.lock:
            self.kube.objects[("namespaces", "", CONFIG_NAMESPACE)] = {"metadata": {"name": CONFIG_NAMESPACE}}
            self.kube.objects[("configmaps", CONFIG_NAMESPACE, CONFIG_MAP)] = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": CONFIG_MAP, "namespace": CONFIG_NAMESPACE},
                "data": {"controller_manager_config.yaml": text},
            }

    def _frameworks(self) -> list[str]:
        import yaml

        config = self.kube.objects.get(("configmaps", CONFIG_NAMESPACE, CONFIG_MAP), {})
        text = config.get("data", {}).get("controller_manager_config.yaml", "")
        return list(((yaml.safe_load(text) or {}).get("integrations") or {}).get("frameworks") or [])

    # ------------------------------------------------------------------ objects
    def apply(self, obj: dict) -> None:
        """What a platform team applies (a ResourceFlavor, a ClusterQueue, a LocalQueue...), checked against its CRD
        as the API server would; then queued workloads are admitted where it now allows."""
        errors = self.kube.crds.errors(obj)
        assert not errors, f"{obj['kind']} {obj['metadata']['name']} is invalid: {errors}"
        plural = next(p for p, kind in KINDS.items() if kind == obj["kind"])
        namespace = "" if plural in CLUSTER_SCOPED else obj["metadata"]["namespace"]
        with self.kube.lock:
            obj = copy.deepcopy(obj)
            obj["metadata"].setdefault("uid", secrets.token_hex(8))
            self.kube.objects[(plural, namespace, obj["metadata"]["name"])] = obj
            self.reconcile()

    def _get(self, plural: str, namespace: str, name: str) -> dict | None:
        return self.kube.objects.get((plural, "" if plural in CLUSTER_SCOPED else namespace, name))

    def _all(self, plural: str) -> list[tuple[str, dict]]:
        return [(ns, o) for (p, ns, _), o in self.kube.objects.items() if p == plural]

    def raycluster_created(self, namespace: str, obj: dict) -> bool:
        """A RayCluster is created: True when Kueue holds it (it has a queue label); KubeRay then makes no pods."""
        labels = obj["metadata"].get("labels", {})
        queue = labels.get(QUEUE_LABEL)
        if not queue or "ray.io/raycluster" not in self._frameworks():
            return False  # not queued, or Kueue does not manage RayClusters: no Workload
        obj["spec"]["suspend"] = True
        obj["status"] = {"state": "suspended", "desiredWorkerReplicas": 0, "readyWorkerReplicas": 0, "conditions": []}
        name = obj["metadata"]["name"]
        sets = [{"name": n, "count": count, "template": _template(t)} for n, count, t in pod_sets(obj)]
        workload_spec: dict = {"queueName": queue, "podSets": sets}
        priority_class = labels.get(PRIORITY_LABEL)
        if priority_class:
            found = self._get("workloadpriorityclasses", "", priority_class)
            ref = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority_class}
            workload_spec["priorityClassRef"] = ref
            workload_spec["priority"] = found["value"] if found else 0
        self._order += 1
        workload = {
            "apiVersion": API_VERSION,
            "kind": "Workload",
            "metadata": {
                "name": f"raycluster-{name}-{secrets.token_hex(3)[:5]}",
                "namespace": namespace,
                "uid": secrets.token_hex(8),
                "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "labels": {f"{GROUP}/job-uid": obj["metadata"]["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": obj["apiVersion"],
                        "kind": "RayCluster",
                        "name": name,
                        "uid": obj["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": workload_spec,
            "status": {"conditions": [_condition("QuotaReserved", False, "Pending", "waiting for quota")]},
        }
        self._orders[workload["metadata"]["uid"]] = self._order
        errors = self.kube.crds.errors(workload)
        assert not errors, f"the emulated Kueue made an invalid Workload: {errors}"
        self.kube.objects[("workloads", namespace, workload["metadata"]["name"])] = workload
        self.reconcile()
        return True

    def raycluster_deleted(self, namespace: str, name: str) -> None:
        """The RayCluster's Workload goes with it (garbage collection of an owned object), its quota freed."""
        for key, obj in list(self.kube.objects.items()):
            if key[0] == "workloads" and key[1] == namespace and _owner(obj) == name:
                self.kube.objects.pop(key)
        self.reconcile()

    def workload_of(self, namespace: str, raycluster: str) -> dict | None:
        return next(
            (o for ns, o in self._all("workloads") if ns == namespace and _owner(o) == raycluster),
            None,
        )

    # ------------------------------------------------------------------ admission
    def _cluster_queue(self, workload: dict) -> str:
        local = self._get("localqueues", workload["metadata"]["namespace"], workload["spec"]["queueName"])
        return (local or {}).get("spec", {}).get("clusterQueue", "")

    def _usage(self, cq_name: str) -> dict[tuple[str, str], float]:
        """(flavor, resource) -> what the admitted workloads of the ClusterQueue use."""
        used: dict[tuple[str, str], float] = {}
        for _, w in self._all("workloads"):
            admission = w.get("status", {}).get("admission")
            if not admission or admission["clusterQueue"] != cq_name:
                continue
            for assignment in admission["podSetAssignments"]:
                for resource, flavor in assignment["flavors"].items():
                    key = (flavor, resource)
                    used[key] = used.get(key, 0.0) + quantity(assignment["resourceUsage"][resource])
        return used

    def _assign(self, cq: dict, workload: dict, used: dict) -> list[dict] | str:
        """The podSetAssignments that fit the ClusterQueue's quota left, or why none does."""
        used = dict(used)
        assignments = []
        for pod_set in workload["spec"]["podSets"]:
            requests = {r: v * pod_set["count"] for r, v in pod_requests(pod_set["template"]).items() if v}
            selector = pod_set["template"].get("spec", {}).get("nodeSelector", {})
            flavors: dict[str, str] = {}
            for resource, amount in requests.items():
                group = next(
                    (g for g in cq["spec"].get("resourceGroups", []) if resource in g["coveredResources"]), None
                )
                if group is None:
                    return f"resource {resource} unavailable in ClusterQueue"
                keys = {k for f in group["flavors"] for k in self._flavor_labels(f["name"])}
                fit = None
                for flavor in group["flavors"]:
                    labels = self._flavor_labels(flavor["name"])
                    if any(labels.get(k) != v for k, v in selector.items() if k in keys):
                        continue
                    if amount <= self._room(cq, flavor["name"], resource, used):
                        fit = flavor["name"]
                        break
                if fit is None:
                    return f"insufficient quota for {resource} in ClusterQueue {cq['metadata']['name']}"
                flavors[resource] = fit
                used[(fit, resource)] = used.get((fit, resource), 0.0) + amount
            assignments.append(
                {
                    "name": pod_set["name"],
                    "count": pod_set["count"],
                    "flavors": flavors,
                    "resourceUsage": {r: _quantity_text(v) for r, v in requests.items()},
                }
            )
        return assignments

    def _room(self, cq: dict, flavor: str, resource: str, used: dict) -> float:
        """What the ClusterQueue can still take of (flavor, resource), ``used`` its own use. Alone: its nominalQuota
        left. In a cohort (``cohortName``), each member keeps nominalQuota - lendingLimit for itself and lends the
        rest (all of it without a lendingLimit) to a pool the members share; a member may use its own part plus the
        pool's unused part, at most nominalQuota + borrowingLimit in all (the ClusterQueue CRD's descriptions of
        cohortName, borrowingLimit and lendingLimit: Kueue v0.19.2,
        config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml; https://kueue.sigs.k8s.io/docs/concepts/
        cluster_queue/#cohort). Hierarchical cohorts (Cohort objects) are not modelled."""

        def quota(queue: dict) -> tuple[float, float, float | None]:  # (nominal, lendable, borrowing limit)
            entry = flavor_quota(queue, flavor, resource) or {"nominalQuota": 0}
            nominal = quantity(entry["nominalQuota"])
            limit = entry.get("borrowingLimit")
            return nominal, quantity(entry.get("lendingLimit", nominal)), None if limit is None else quantity(limit)

        nominal, lendable, limit = quota(cq)
        mine = used.get((flavor, resource), 0.0)
        cohort = cq["spec"].get("cohortName")
        if not cohort:
            return nominal - mine
        pool = pool_used = 0.0
        for _, member in self._all("clusterqueues"):
            if member["spec"].get("cohortName") != cohort:
                continue
            member_nominal, member_lendable, _ = quota(member)
            member_name = member["metadata"]["name"]
            member_used = (
                mine if member_name == cq["metadata"]["name"] else self._usage(member_name).get((flavor, resource), 0.0)
            )
            pool += member_lendable
            pool_used += max(0.0, member_used - (member_nominal - member_lendable))
        room = max(0.0, nominal - lendable - mine) + pool - pool_used
        return room if limit is None else min(room, nominal + limit - mine)

    def _flavor_labels(self, flavor: str) -> dict:
        return (self._get("resourceflavors", "", flavor) or {}).get("spec", {}).get("nodeLabels", {})

    def _with_flavors(self, pod_spec: dict, flavors) -> None:
        """``pod_spec`` (a pod template's) as Kueue admits it with ``flavors``: their nodeLabels in its nodeSelector
        (its own selector wins), their tolerations added to its own."""
        labels: dict = {}
        tolerations = list(pod_spec.get("tolerations") or [])
        for flavor in sorted(set(flavors)):
            labels.update(self._flavor_labels(flavor))
            spec = (self._get("resourceflavors", "", flavor) or {}).get("spec", {})
            tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        pod_spec["nodeSelector"] = {**labels, **pod_spec.get("nodeSelector", {})}
        if tolerations:
            pod_spec["tolerations"] = tolerations

    def pending(self, cq_name: str | None = None) -> list[dict]:
        """Pending workloads (of the ClusterQueue, when named) in queue order: priority, then creation."""
        waiting = [
            o
            for _, o in self._all("workloads")
            if not o.get("status", {}).get("admission") and (cq_name is None or self._cluster_queue(o) == cq_name)
        ]
        return sorted(waiting, key=lambda w: (-w["spec"].get("priority", 0), self._orders[w["metadata"]["uid"]]))

    def reconcile(self) -> None:
        """Admit what fits, in queue order, preempting lower priorities where the ClusterQueue allows it."""
        self.checks.mark_active()
        self.checks.collect()
        for workload in self.pending():
            if not self.checks.admissible(workload):
                continue  # deactivated, or backing off after a failed ProvisioningRequest
            cq_name = self._cluster_queue(workload)
            cq = self._get("clusterqueues", "", cq_name) if cq_name else None
            if cq is None:
                why = f"LocalQueue {workload['spec']['queueName']} doesn't exist" if not cq_name else ""
                self._pend(workload, why or f"ClusterQueue {cq_name} doesn't exist")
                continue
            fit = self._assign(cq, workload, self._usage(cq_name))
            if isinstance(fit, str):
                fit = self._preempt(cq, workload) or fit
            if isinstance(fit, str):
                self._pend(workload, fit)
                if cq["spec"].get("queueingStrategy") == "StrictFIFO":
                    break
                continue
            if not self.checks.reserve(workload, cq, fit):
                self._admit(workload, cq_name, fit)
        self._queue_status()

    def _pend(self, workload: dict, why: str) -> None:
        workload["status"]["conditions"] = [_condition("QuotaReserved", False, "Pending", why)]

    def _preempt(self, cq: dict, workload: dict) -> list[dict] | None:
        if cq["spec"].get("preemption", {}).get("withinClusterQueue", "Never") != "LowerPriority":
            return None
        cq_name = cq["metadata"]["name"]
        priority = workload["spec"].get("priority", 0)
        candidates = sorted(
            (
                o
                for _, o in self._all("workloads")
                if o.get("status", {}).get("admission", {}).get("clusterQueue") == cq_name
                and o["spec"].get("priority", 0) < priority
            ),
            key=lambda w: (w["spec"].get("priority", 0), -self._admitted[w["metadata"]["uid"]]),
        )
        victims: list[dict] = []
        for victim in candidates:
            victims.append(victim)
            used = self._usage(cq_name)
            for v in victims:
                for assignment in v["status"]["admission"]["podSetAssignments"]:
                    for resource, flavor in assignment["flavors"].items():
                        used[(flavor, resource)] -= quantity(assignment["resourceUsage"][resource])
            fit = self._assign(cq, workload, used)
            if not isinstance(fit, str):
                for v in victims:
                    uid = workload["metadata"]["uid"]
                    self.evict(v, "Preempted", f"Preempted to accommodate a workload (UID: {uid})")
                return fit
        return None

    def _admit(self, workload: dict, cq_name: str, assignments: list[dict]) -> None:
        self._admissions += 1
        self._admitted[workload["metadata"]["uid"]] = self._admissions
        workload["status"]["admission"] = {"clusterQueue": cq_name, "podSetAssignments": assignments}
        evicted = [c for c in workload["status"]["conditions"] if c["type"] == "Evicted" and c["status"] == "True"]
        workload["status"]["conditions"] = [
            _condition("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cq_name}"),
            _condition("Admitted", True, "Admitted", "The workload is admitted"),
            # An eviction's condition stays, False, its message "Previously: ..." (``SetQuotaReservation`` and
            # ``resetActiveCondition``, https://github.com/kubernetes-sigs/kueue/blob/main/pkg/workload/workload.go).
            *(_condition("Evicted", False, "QuotaReserved", f"Previously: {c['message']}") for c in evicted),
        ]
        namespace = workload["metadata"]["namespace"]
        cluster = self.kube.objects.get(("rayclusters", namespace, _owner(workload)))
        if cluster is None:
            return
        spec = cluster["spec"]
        groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
        for group, assignment in zip(groups, assignments, strict=True):
            self._with_flavors(group["template"].setdefault("spec", {}), assignment["flavors"].values())
            updates = self.checks.pod_set_annotations(workload, assignment["name"])
            if updates:
                group["template"].setdefault("metadata", {}).setdefault("annotations", {}).update(updates)
        spec["suspend"] = False
        self.kube.kuberay.reconcile(namespace, cluster)

    def evict(self, workload: dict, reason: str, message: str) -> None:
        """The workload loses its quota; its RayCluster is suspended (KubeRay deletes its pods) and it is requeued."""
        workload["status"].pop("admission", None)
        workload["status"]["conditions"] = [
            _condition("Evicted", True, reason, message),
            _condition("QuotaReserved", False, "Pending", message),
            _condition("Admitted", False, "NoReservation", "The workload has no reservation"),
        ]
        namespace, name = workload["metadata"]["namespace"], _owner(workload)
        cluster = self.kube.objects.get(("rayclusters", namespace, name))
        if cluster is not None:
            cluster["spec"]["suspend"] = True
            cluster["status"] = {**cluster.get("status", {}), "state": "suspended", "readyWorkerReplicas": 0}
            self.kube.stop_pods(namespace, name)

    def _queue_status(self) -> None:
        for _, local in self._all("localqueues"):
            mine = [
                o
                for ns, o in self._all("workloads")
                if ns == local["metadata"]["namespace"] and o["spec"]["queueName"] == local["metadata"]["name"]
            ]
            admitted = sum(1 for o in mine if o.get("status", {}).get("admission"))
            local["status"] = {"pendingWorkloads": len(mine) - admitted, "admittedWorkloads": admitted}

    # ------------------------------------------------------------------ visibility
    def pending_workloads(self, namespace: str, local_queue: str) -> dict:
        local = self._get("localqueues", namespace, local_queue)
        cq_name = (local or {}).get("spec", {}).get("clusterQueue", "")
        in_cq = self.pending(cq_name)
        items = []
        for w in in_cq:
            if w["metadata"]["namespace"] != namespace or w["spec"]["queueName"] != local_queue:
                continue
            items.append(
                {
                    "metadata": {
                        "name": w["metadata"]["name"],
                        "namespace": namespace,
                        "creationTimestamp": w["metadata"]["creationTimestamp"],
                        "ownerReferences": copy.deepcopy(w["metadata"]["ownerReferences"]),
                    },
                    "priority": w["spec"].get("priority", 0),
                    "localQueueName": local_queue,
                    "positionInClusterQueue": in_cq.index(w),
                    "positionInLocalQueue": len(items),
                }
            )
        return {
            "kind": "PendingWorkloadsSummary",
            "apiVersion": "visibility.kueue.x-k8s.io/v1beta2",
            "metadata": {},
            "items": items,
        }


def _template(template: dict) -> dict:
    template = copy.deepcopy(template)
    template.get("metadata", {}).pop("annotations", None)
    return template


def _owner(workload: dict) -> str:
    return next((r["name"] for r in workload["metadata"].get("ownerReferences", [])), "")


# ---------------------------------------------------------------------------------------------- admission checks
# Kueue's ProvisioningRequest admission check, as its docs describe it (PROVISIONING: the "Provisioning Admission Check
# Controller" page, https://kueue.sigs.k8s.io/docs/admission-check-controllers/provisioning/ and
# https://kueue.sigs.k8s.io/docs/concepts/admission_check/provisioning_request/; CHECKS: "Admission Check",
# https://kueue.sigs.k8s.io/docs/concepts/admission_check/):
# - an AdmissionCheck whose controllerName is kueue.x-k8s.io/provisioning-request is Active when its parameters name a
#   ProvisioningRequestConfig that exists (CHECKS: "if an AdmissionCheck is not found or its controller has not
#   marked it as Active, the ClusterQueue will be marked as Inactive"); a ClusterQueue runs the checks of its
#   admissionChecksStrategy whose onFlavors are empty or name a flavor the workload was given (CHECKS);
# - once a Workload holds a quota reservation, the controller creates a ProvisioningRequest for it, with the
#   Workload's PodTemplates, the config's class and parameters, the job's provreq.kueue.x-k8s.io/ annotations as
#   parameters, owned by the Workload (PROVISIONING); only pod sets that ask for one of the config's managedResources
#   ("the list of resources managed by the autoscaling"); the check is Pending meanwhile, its podSetUpdates the
#   annotations by which the pods consume the request (CHECKS' example: consume-provisioning-request);
# - Provisioned: the check is Ready, and a Workload with every check Ready is Admitted (CHECKS);
# - Failed, and BookingExpired or CapacityRevoked before the Workload is admitted ("these conditions only affect
#   non-admitted Workloads. Once admitted, they are ignored": PROVISIONING): the check is Retry, the quota reserved
#   released, and the Workload requeued after a backoff (PROVISIONING, "Retry strategy"), of backoffBaseSeconds x
#   2^(n-1) at most backoffMaxSeconds (the retryStrategy fields' descriptions in the vendored CRD; no jitter here);
#   after backoffLimitCount retries the check is Rejected and the Workload deactivated (spec.active false; CHECKS:
#   "If any of the Workload's AdmissionCheck is in the Rejected state: Workload is deactivated").
# The names of the requests and PodTemplates are this emulator's.
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
PARAMETER_PREFIX = "provreq.kueue.x-k8s.io/"
CONSUME = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS = "autoscaling.x-k8s.io/provisioning-class-name"
RETRY_DEFAULTS = {"backoffLimitCount": 3, "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800}


class ProvisioningChecks:
    """The ProvisioningRequest admission check's controller over ``kueue``'s objects (called under the kube lock)."""

    def __init__(self, kueue: Kueue) -> None:
        self.kueue, self.kube = kueue, kueue.kube
        self.requests: dict[tuple[str, str], tuple[str, str]] = {}  # (namespace, request) -> (workload uid, check)
        self.retries: dict[str, int] = {}  # workload uid -> failed requests so far
        self.retry_at: dict[str, float] = {}  # workload uid -> when it may reserve quota again (epoch s)
        self.kube.provisioner.listeners.append(self.decided)

    # -------------------------------------------------------------- the checks
    def mark_active(self) -> None:
        """Each provisioning AdmissionCheck is Active when its ProvisioningRequestConfig exists."""
        for _, check in self.kueue._all("admissionchecks"):
            if check["spec"]["controllerName"] != PROVISIONING_CONTROLLER:
                continue
            found = self._config(check) is not None
            why = "the check is ready" if found else "no ProvisioningRequestConfig named by its parameters"
            check["status"] = {
                "conditions": [{**_condition("Active", found, "Active" if found else "BadParametersRef", why)}]
            }

    def _config(self, check: dict) -> dict | None:
        params = check["spec"].get("parameters") or {}
        if params.get("kind") != "ProvisioningRequestConfig":
            return None
        return self.kueue._get("provisioningrequestconfigs", "", params.get("name", ""))

    def _checks(self, cq: dict, assignments: list[dict]) -> list[dict]:
        flavors = {f for a in assignments for f in a["flavors"].values()}
        rules = (cq["spec"].get("admissionChecksStrategy") or {}).get("admissionChecks") or []
        out = []
        for rule in rules:
            if rule.get("onFlavors") and not flavors & set(rule["onFlavors"]):
                continue
            check = self.kueue._get("admissionchecks", "", rule["name"])
            if check and check["spec"]["controllerName"] == PROVISIONING_CONTROLLER:
                out.append(check)
        return out

    def admissible(self, workload: dict) -> bool:
        uid = workload["metadata"]["uid"]
        return workload["spec"].get("active", True) and time.time() >= self.retry_at.get(uid, 0.0)

    # -------------------------------------------------------------- reservation: the requests made
    def reserve(self, workload: dict, cq: dict, assignments: list[dict]) -> bool:
        """Quota reserved for ``workload``: True when the ClusterQueue runs provisioning checks, each Pending on the
        ProvisioningRequest made for it (the workload is not admitted yet); False when it runs none."""
        self.mark_active()
        checks = [c for c in self._checks(cq, assignments) if self._manages(c, workload)]
        if not checks:
            return False
        workload["status"]["admission"] = {"clusterQueue": cq["metadata"]["name"], "podSetAssignments": assignments}
        workload["status"]["conditions"] = [
            _condition(
                "QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cq['metadata']['name']}"
            ),
            _condition("Admitted", False, "UnsatisfiedChecks", "The workload has not all checks ready"),
        ]
        states = []
        for check in checks:
            request = self._request(workload, check, assignments)
            states.append(
                {
                    "name": check["metadata"]["name"],
                    "state": "Pending",
                    "message": f"Waiting for ProvisioningRequest {request['metadata']['name']}",
                    "lastTransitionTime": _condition("", True, "", "")["lastTransitionTime"],
                    "retryCount": self.retries.get(workload["metadata"]["uid"], 0),
                    "podSetUpdates": [
                        {
                            "name": s["podTemplateRef"]["name"].rsplit("--", 1)[1],
                            "annotations": {
                                CONSUME: request["metadata"]["name"],
                                CLASS: request["spec"]["provisioningClassName"],
                            },
                        }
                        for s in request["spec"]["podSets"]
                    ],
                }
            )
        workload["status"]["admissionChecks"] = states
        errors = self.kube.crds.errors(workload)
        assert not errors, f"the emulated Kueue made an invalid Workload: {errors}"
        return True

    def _manages(self, check: dict, workload: dict) -> bool:
        """Some pod set of the workload asks for one of the check's config's managedResources (all are managed when
        it lists none); else the check is Ready at once, no request made ("If none of the workloads podsets is
        requesting at least a managed resource, the workload is considered ready": the managedResources field's
        description in the vendored ProvisioningRequestConfig CRD)."""
        managed = set(((self._config(check) or {"spec": {}})["spec"]).get("managedResources") or [])
        return not managed or any(
            {r for r, v in pod_requests(p["template"]).items() if v} & managed for p in workload["spec"]["podSets"]
        )

    def _request(self, workload: dict, check: dict, assignments: list[dict]) -> dict:
        from tests.emulators import provisioning

        namespace, uid = workload["metadata"]["namespace"], workload["metadata"]["uid"]
        config = self._config(check) or {"spec": {}}
        managed = set(config["spec"].get("managedResources") or [])
        attempt = self.retries.get(uid, 0) + 1
        name = f"{workload['metadata']['name']}-{check['metadata']['name']}-{attempt}"[:200]
        owner = [{"apiVersion": API_VERSION, "kind": "Workload", "name": workload["metadata"]["name"], "uid": uid}]
        pod_sets = []
        flavors = {a["name"]: a["flavors"] for a in assignments}
        for pod_set in workload["spec"]["podSets"]:
            asked = {r for r, v in pod_requests(pod_set["template"]).items() if v}
            if managed and not asked & managed:
                continue
            template = copy.deepcopy(pod_set["template"])
            self.kueue._with_flavors(template.setdefault("spec", {}), flavors.get(pod_set["name"], {}).values())
            template_name = f"{name}--{pod_set['name']}"
            self.kube.objects[("podtemplates", namespace, template_name)] = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": template_name, "namespace": namespace, "ownerReferences": owner},
                "template": template,
            }
            pod_sets.append({"podTemplateRef": {"name": template_name}, "count": pod_set["count"]})
        parameters = dict(config["spec"].get("parameters") or {})
        job = self.kube.objects.get(("rayclusters", namespace, _owner(workload))) or {"metadata": {}}
        for key, value in (job["metadata"].get("annotations") or {}).items():
            if key.startswith(PARAMETER_PREFIX):
                parameters[key.removeprefix(PARAMETER_PREFIX)] = value  # the annotation wins over the config
        request = {
            "apiVersion": "autoscaling.x-k8s.io/v1",
            "kind": "ProvisioningRequest",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": secrets.token_hex(8),
                "ownerReferences": owner,
            },
            "spec": {
                "provisioningClassName": config["spec"].get("provisioningClassName", ""),
                "podSets": pod_sets,
                **({"parameters": parameters} if parameters else {}),
            },
        }
        errors = provisioning.errors(request)
        assert not errors, f"the emulated Kueue made an invalid ProvisioningRequest: {errors}"
        self.kube.objects[(provisioning.PLURAL, namespace, name)] = request
        self.requests[(namespace, name)] = (uid, check["metadata"]["name"])
        self.kube.provisioner.created(namespace, request)
        return request

    def pod_set_annotations(self, workload: dict, pod_set: str) -> dict:
        """The annotations the admission checks add to the pods of ``pod_set`` when the workload is admitted."""
        out: dict = {}
        for state in (workload.get("status") or {}).get("admissionChecks") or []:
            for update in state.get("podSetUpdates") or []:
                if update["name"] == pod_set:
                    out.update(update.get("annotations") or {})
        return out

    # -------------------------------------------------------------- the request's conditions
    def decided(self, namespace: str, name: str, kind: str) -> None:
        """The ProvisioningRequest ``name`` got the condition ``kind``: the check's state follows it."""
        with self.kube.lock:
            uid, check_name = self.requests.get((namespace, name), ("", ""))
            workload = next((w for _, w in self.kueue._all("workloads") if w["metadata"]["uid"] == uid), None)
            if workload is None or workload["status"].get("admission") is None:
                return
            if any(c["type"] == "Admitted" and c["status"] == "True" for c in workload["status"]["conditions"]):
                return  # admitted: the request's later conditions are ignored (PROVISIONING)
            state = next(s for s in workload["status"]["admissionChecks"] if s["name"] == check_name)
            if kind == "Provisioned":
                state.update(state="Ready", message=f"ProvisioningRequest {name} is Provisioned")
                if all(s["state"] == "Ready" for s in workload["status"]["admissionChecks"]):
                    admission = workload["status"]["admission"]
                    self.kueue._admit(workload, admission["clusterQueue"], admission["podSetAssignments"])
                    self.kueue._queue_status()
                return
            self._retry(workload, state, name, kind)
            self.kueue.reconcile()

    def _retry(self, workload: dict, state: dict, name: str, kind: str) -> None:
        """A request that gives no capacity: the quota is released and the workload requeued after its backoff, or,
        past the config's backoffLimitCount, the check Rejected and the workload deactivated."""
        uid = workload["metadata"]["uid"]
        check = self.kueue._get("admissionchecks", "", state["name"]) or {"spec": {}}
        retry = {**RETRY_DEFAULTS, **((self._config(check) or {"spec": {}})["spec"].get("retryStrategy") or {})}
        count = self.retries[uid] = self.retries.get(uid, 0) + 1
        workload["status"].pop("admission", None)
        message = f"ProvisioningRequest {name} is {kind}"
        if count > retry["backoffLimitCount"]:
            state.update(state="Rejected", message=message)
            workload["spec"]["active"] = False
            workload["status"]["conditions"] = [
                _condition("QuotaReserved", False, "Pending", message),
                _condition("Admitted", False, "NoReservation", "The workload has no reservation"),
                _condition("Evicted", True, "Deactivated", f"The workload is deactivated: {message}"),
            ]
            return
        delay = min(retry["backoffBaseSeconds"] * 2 ** (count - 1), retry["backoffMaxSeconds"])
        state.update(state="Retry", message=message, retryCount=count, requeueAfterSeconds=int(delay))
        self.retry_at[uid] = time.time() + delay
        workload["status"]["requeueState"] = {"count": count}
        workload["status"]["conditions"] = [
            _condition("QuotaReserved", False, "Pending", f"{message}: requeued in {delay:g}s"),
            _condition("Admitted", False, "NoReservation", "The workload has no reservation"),
        ]
        timer = threading.Timer(delay, self._requeue)
        timer.daemon = True
        timer.start()

    def _requeue(self) -> None:
        with self.kube.lock:
            self.kueue.reconcile()

    def collect(self) -> None:
        """Requests and PodTemplates whose Workload is gone go with it (garbage collection of owned objects)."""
        alive = {w["metadata"]["uid"] for _, w in self.kueue._all("workloads")}
        for key, obj in list(self.kube.objects.items()):
            owners = [r.get("uid") for r in obj["metadata"].get("ownerReferences") or [] if r.get("kind") == "Workload"]
            if key[0] in ("provisioningrequests", "podtemplates") and owners and not set(owners) & alive:
                self.kube.objects.pop(key)
