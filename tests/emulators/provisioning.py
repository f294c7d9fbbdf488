"""ProvisioningRequests (``autoscaling.x-k8s.io/v1``) in the Kubernetes emulator, and the part of GKE's cluster
autoscaler that fulfils the ``queued-provisioning.gke.io`` class (Dynamic Workload Scheduler):

- the CRD is the one vendored from kubernetes/autoscaler (``tests/contract/crds/provisioningrequest-*/``, its
  SOURCE.md), served at ``apiextensions.k8s.io/v1`` and every request validated against its schema, 422 otherwise;
- a request of the class is Accepted at once, then after ``provision_s`` either Provisioned (all the nodes of every
  pod set at once: "GKE allocates all requested resources at the same time", GKE docs, "Run a large-scale workload
  with flex-start with queued provisioning", https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest)
  or, with ``outcome="capacity_not_found"``, Failed ("it is impossible to obtain resources to fulfill this
  ProvisioningRequest": the condition types of cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1/
  types.go; the reason ``CapacityNotFound`` is this emulator's word: GKE's reason strings are not documented);
- pods that consume a request (the ``autoscaling.x-k8s.io/consume-provisioning-request`` annotation, types.go) stay
  Unschedulable until it is Provisioned, then all of them are scheduled together; while it is not, no node of the
  request's node pools exists, and no cluster autoscaler event is recorded for them (the request is the scale-up);
- a request asking for more than flex-start's seven days (``maxRunDurationSeconds``: ``MAX_RUN_S``) Fails at once;
- the PodTemplate a pod set names must exist in the request's namespace (types.go: "must be within the same
  namespace"), else the request Fails at once;
- a request is fulfilled within ONE queued provisioning node pool (``pools``: the GKE emulator's; inferred: GKE's own
  provisioning class is not open source, the rule is the open-source autoscaler's, below): every pod of it
  must fit one pool whose node labels its PodTemplate's nodeSelector selects (``selects``: every key, exactly), up
  to the pool's maximum size; else no pool is an option and the request is never Provisioned (its Provisioned
  condition False, the autoscaler trying again later), so its pods wait until the run's deadline. The cluster
  autoscaler's all-or-nothing scale-up, which the atomic provisioning class runs: each expansion option is one node
  group, and one that cannot take all the pods is dropped ("Some pods can't fit to %s, giving up due to
  all-or-nothing scale-up strategy"; kubernetes/autoscaler, cluster-autoscaler/core/scaleup/orchestrator/
  orchestrator.go, ``ScaleUp``, at 021bbf41081464628ab138ebe9f604a5d488c173, called with ``allOrNothing`` from
  cluster-autoscaler/provisioningrequest/besteffortatomic/provisioning_class.go, which then sets Provisioned False,
  "Capacity is not found, CA will try to find it later."). GKE's own class is not open source; this is the public
  behaviour nearest to it. A run's pods that consume several requests are scheduled once every one is Provisioned
  (those of a Provisioned one are PodScheduled meanwhile);
- ``expire_booking``: the request's capacity is no longer booked for it (BookingExpired, types.go: "the
  ProvisioningRequest had Provisioned condition before and capacity reservation time is expired"); pods that have
  not landed yet will not be given nodes;
- ``revoke``: the capacity is taken back (CapacityRevoked, types.go: "requested resources are not longer valid";
  Kueue's docs: "CA revokes the capacity, if a Workload is running on it, it will be evicted",
  https://kueue.sigs.k8s.io/docs/concepts/admission_check/provisioning_request/): the request's nodes go, and with
  them the pods that consume it (as a host lost mid-run: the kube emulator's ``lose_pod``);
- whoever made a request (Kueue's admission check: tests/emulators/kueue.py) hears of each condition it gets
  (``listeners``: (namespace, name, condition type)), as its controller watches the request;
- the nodes a request brings are those of a queued provisioning node pool, which GKE taints
  ``cloud.google.com/gke-queued=true:NoSchedule`` (``QUEUED_TAINT``, ``node_taints``): a pod that consumes the request
  but does not tolerate the taint is never scheduled on them (the kube emulator's scheduler, ``taints``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path

CRD_DIR = Path(__file__).resolve().parents[1] / "contract" / "crds" / "provisioningrequest-cluster-autoscaler-1.36.1"
CRD_FILE = "autoscaling.x-k8s.io_provisioningrequests.yaml"
CRD_NAME = "provisioningrequests.autoscaling.x-k8s.io"
PLURAL = "provisioningrequests"
KIND = "ProvisioningRequest"
QUEUED_CLASS = "queued-provisioning.gke.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
# Flex-start (queued provisioning is flex-start's) gives nodes "for up to seven days", and a request's
# ``maxRunDurationSeconds`` defaults to seven days (GKE, "About flex-start provisioning mode",
# https://cloud.google.com/kubernetes-engine/docs/concepts/dws): a longer one is Failed at once here (how GKE answers
# one is not documented; the reason is this emulator's word).
MAX_RUN_PARAMETER = "maxRunDurationSeconds"
MAX_RUN_S = 7 * 24 * 3600
# GKE taints the nodes of a queued provisioning node pool so that only the pods meant for them land there:
# Google's cluster-toolkit, modules/compute/gke-node-pool (at 1047080375afbb44da4b596be314634e7486af4a): variables.tf,
# enable_queued_provisioning "adds the cloud.google.com/gke-queued taint to the node pool", and main.tf, "GKE
# automatically applies the taint" (the module adds only the matching label); its TPU queued provisioning examples
# (examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-tpu-7x/README.md and gke-tpu-v6e/,
# "Tolerations (Mandatory)") give every pod the toleration key cloud.google.com/gke-queued, value "true", effect
# NoSchedule. The pools themselves: GKE docs, "Run a large-scale workload with flex-start with queued provisioning"
# (https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest).
QUEUED_TAINT = {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}
# The labels GKE itself gives every TPU node, from its pool's machine type and topology (GKE docs, "Deploy TPU
# workloads in GKE Standard", https://cloud.google.com/kubernetes-engine/docs/how-to/tpus: the pods select
# cloud.google.com/gke-tpu-accelerator and cloud.google.com/gke-tpu-topology). The emulator does not derive them from
# the pool: a selector's values for these are taken as the pool's.
TPU_NODE_LABELS = ("cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology")
WAITING_MESSAGE = "pod waits for its ProvisioningRequest {name} to be provisioned (queued provisioning)"


@functools.cache
def crd() -> dict:
    import yaml

    return yaml.safe_load((CRD_DIR / CRD_FILE).read_text())


@functools.cache
def _validator():
    from tests.contract.kuberay_schema import CrdValidator

    return CrdValidator(CRD_DIR, files={KIND: CRD_FILE})


def errors(obj: dict) -> list[str]:
    """Why the API server refuses ``obj`` (the CRD's schema); [] when it accepts it."""
    return _validator().errors(obj)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _condition(kind: str, reason: str, message: str) -> dict:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now(),
        "observedGeneration": 1,
    }


class Provisioner:
    """The cluster autoscaler's queued provisioning over the emulator's objects (``objects``: (plural, namespace,
    name) -> object, guarded by ``lock``)."""

    def __init__(self, objects: dict, lock) -> None:
        self.objects = objects
        self.lock = lock
        self.outcome = "provisioned"  # or "capacity_not_found": the request Fails
        self.provision_s = 2.0  # how long Dynamic Workload Scheduler takes to decide
        self.provision_s_of: dict[str, float] = {}  # a request's own time to decide, by name (a test's hand)
        self.waiting: dict[tuple[str, str], list[Callable[[], None]]] = {}  # request -> what runs once provisioned
        self.crd_served = True  # False: a cluster without the ProvisioningRequest API
        self.decided: list[tuple[str, str, str]] = []  # (namespace, name, condition) in order
        self.decided_at: dict[tuple[str, str], float] = {}  # (namespace, name) -> when it was decided (epoch s)
        self.listeners: list[Callable[[str, str, str], None]] = []  # told (namespace, name, condition) of each
        self.lose_pod: Callable[[str, str], None] | None = None  # the kube emulator's host lost mid-run
        # A test's hand on the clock: when set, a decision also waits for this event (e.g. until the run has been
        # seen waiting), so an assertion about the wait cannot race a loaded machine's scheduling.
        self.hold: threading.Event | None = None
        # The queued provisioning node pools (the GKE emulator's ``queued_pools``): name, node labels, max nodes;
        # None: no GKE behind this API server, and a request is not checked against them.
        self.pools: Callable[[], list[dict]] | None = None

    def serves(self, crd_name: str) -> bool:
        return self.crd_served and crd_name == CRD_NAME

    def created(self, namespace: str, obj: dict) -> None:
        """A new request: Accepted when it is of the queued class, decided after ``provision_s``."""
        if obj["spec"]["provisioningClassName"] != QUEUED_CLASS:
            return  # another class: nothing in this cluster fulfils it
        name = obj["metadata"]["name"]
        obj["status"] = {"conditions": [_condition("Accepted", "Accepted", "the request is queued")]}
        missing = [
            s["podTemplateRef"]["name"]
            for s in obj["spec"]["podSets"]
            if ("podtemplates", namespace, s["podTemplateRef"]["name"]) not in self.objects
        ]
        if missing:
            return self._decide(namespace, name, "Failed", "PodTemplateNotFound", f"no PodTemplate {missing[0]}")
        longest = int((obj["spec"].get("parameters") or {}).get(MAX_RUN_PARAMETER, MAX_RUN_S))
        if longest > MAX_RUN_S:
            return self._decide(
                namespace, name, "Failed", "InvalidMaxRunDuration", f"{MAX_RUN_PARAMETER} {longest} > {MAX_RUN_S}"
            )
        unfit = self._no_pool_fits(namespace, obj)
        if unfit:  # no option: never decided, as the autoscaler keeps trying
            obj["status"]["conditions"].append(
                {**_condition("Provisioned", "NotProvisioned", unfit), "status": "False"}
            )
            return
        delay = self.provision_s_of.get(name, self.provision_s)
        timer = threading.Timer(delay, self._decide_outcome, args=(namespace, name))
        timer.daemon = True
        timer.start()

    def _no_pool_fits(self, namespace: str, obj: dict) -> str:
        """Why no single queued provisioning pool can take every pod of the request (the module docstring's rule),
        "" when one can (or no pools are known)."""
        if self.pools is None:
            return ""
        pools = self.pools()
        for pod_set in obj["spec"]["podSets"]:
            template = self.objects[("podtemplates", namespace, pod_set["podTemplateRef"]["name"])]
            selector = (template.get("template", {}).get("spec") or {}).get("nodeSelector") or {}
            fits = [p for p in pools if selects(selector, p["labels"]) and pod_set["count"] <= p["max_nodes"]]
            if not fits:
                return (
                    f"Capacity is not found, CA will try to find it later: no node group can take all "
                    f"{pod_set['count']} pods (all-or-nothing scale-up)"
                )
        return ""

    def _decide_outcome(self, namespace: str, name: str) -> None:
        if self.hold is not None:
            self.hold.wait(120)
        if self.outcome == "capacity_not_found":
            return self._decide(
                namespace, name, "Failed", "CapacityNotFound", "the requested TPU capacity could not be found"
            )
        self._decide(namespace, name, "Provisioned", "Provisioned", "all the requested nodes are provisioned")

    def _decide(self, namespace: str, name: str, kind: str, reason: str, message: str) -> None:
        with self.lock:
            obj = self.objects.get((PLURAL, namespace, name))
            if obj is None:  # deleted while it was queued
                return
            obj.setdefault("status", {}).setdefault("conditions", []).append(_condition(kind, reason, message))
            self.decided.append((namespace, name, kind))
            self.decided_at[(namespace, name)] = time.time()
            then = self.waiting.pop((namespace, name), []) if kind == "Provisioned" else []
        for schedule in then:
            schedule()
        for listener in list(self.listeners):
            listener(namespace, name, kind)

    def expire_booking(self, namespace: str, name: str) -> None:
        """BookingExpired: the capacity booked for the request is no longer held for pods that have not landed."""
        self._decide(namespace, name, "BookingExpired", "BookingExpired", "the capacity booking expired")

    def revoke(self, namespace: str, name: str) -> None:
        """CapacityRevoked: the request's nodes are taken back; the pods consuming it go with them."""
        self._decide(namespace, name, "CapacityRevoked", "CapacityRevoked", "the requested capacity was revoked")
        with self.lock:
            consumers = [
                k
                for k, o in self.objects.items()
                if k[0] == "pods"
                and k[1] == namespace
                and (o["metadata"].get("annotations") or {}).get(CONSUME_ANNOTATION) == name
            ]
        for _, _, pod in consumers:
            if self.lose_pod is not None:
                self.lose_pod(namespace, pod)  # as a host lost mid-run: terminated, then gone
            else:
                with self.lock:
                    self.objects.pop(("pods", namespace, pod), None)

    def provisioned(self, namespace: str, name: str) -> bool:
        conditions = ((self.objects.get((PLURAL, namespace, name)) or {}).get("status") or {}).get("conditions", [])
        return any(c["type"] == "Provisioned" and c["status"] == "True" for c in conditions)

    def holds(self, namespace: str, pods: list[dict], schedule: Callable[[], None] | None = None) -> bool:
        """True when some of ``pods`` consume a request not yet provisioned: those stay Unschedulable and
        ``schedule`` (when given) runs once each such request is (the rest, a head on its CPU pool and the pods of
        the requests provisioned, are scheduled at once)."""
        consumed = {(p["metadata"].get("annotations") or {}).get(CONSUME_ANNOTATION) for p in pods} - {None}
        pending = [name for name in consumed if not self.provisioned(namespace, name)]
        if not pending:
            return False
        for pod in pods:
            name = (pod["metadata"].get("annotations") or {}).get(CONSUME_ANNOTATION)
            if name in pending:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": WAITING_MESSAGE.format(name=name),
                    }
                ]
            else:
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        for name in pending if schedule is not None else []:
            self.waiting.setdefault((namespace, name), []).append(schedule)
        return True


def node_labels(pool) -> dict[str, str]:
    """The labels of a node of ``pool`` (a container_v1 ``NodePool``): its ``config.labels`` ("the map of Kubernetes
    labels ... to be applied to each node", container_v1 types/cluster_service.py, ``NodeConfig.labels``) and GKE's
    ``cloud.google.com/gke-nodepool``, nothing more. Queued provisioning adds no label: cluster-toolkit puts
    ``cloud.google.com/gke-queued`` on its queued pools' nodes itself, in the pool's labels, while "GKE automatically
    applies the taint" (modules/compute/gke-node-pool/main.tf at 1047080375afbb44da4b596be314634e7486af4a)."""
    return {**dict(pool.config.labels), "cloud.google.com/gke-nodepool": pool.name}


def selects(selector: dict, labels: dict) -> bool:
    """A pod with nodeSelector ``selector`` may land on a node labelled ``labels``: the node has each of the
    selector's labels with its value ("Kubernetes only schedules the Pod onto nodes that have each of the labels you
    specify", https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodeselector), GKE's TPU
    labels (``TPU_NODE_LABELS``) taken as the pool's."""
    return all(key in TPU_NODE_LABELS or labels.get(key) == value for key, value in selector.items())


def node_taints(pod: dict) -> list[dict]:
    """The taints of the nodes ``pod`` would land on: a queued provisioning pool's (``QUEUED_TAINT``) for a pod that
    consumes a ProvisioningRequest (only a request brings those pools nodes: ``NodePool.queued_provisioning``), none
    for any other (the emulated CPU and TPU pools carry no taint of their own)."""
    consumes = (pod["metadata"].get("annotations") or {}).get(CONSUME_ANNOTATION)
    return [dict(QUEUED_TAINT)] if consumes else []


def node_pool_refusal(pool) -> str | None:
    """Why GKE refuses a node pool (a container_v1 ``NodePool``) made for queued provisioning, else None: GKE's guide
    makes it with autoscaling from 0 nodes, no reservation and no auto-repair
    (https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest: ``--enable-queued-provisioning``
    with ``--enable-autoscaling --num-nodes=0 --reservation-affinity=none --no-enable-autorepair``). The words are
    this emulator's: GKE's own messages are not documented."""
    if not pool.queued_provisioning.enabled:
        return None
    from google.cloud import container_v1 as c

    none = c.ReservationAffinity.Type.NO_RESERVATION
    if not pool.autoscaling.enabled or pool.initial_node_count:
        return "a queued provisioning node pool autoscales from 0 nodes"
    if pool.config.reservation_affinity.consume_reservation_type != none:
        return "a queued provisioning node pool consumes no reservation"
    if pool.management.auto_repair:
        return "a queued provisioning node pool has auto-repair off"
    return None
