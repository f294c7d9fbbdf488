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
- the PodTemplate a pod set names must exist in the request's namespace (types.go: "must be within the same
  namespace"), else the request Fails at once;
- ``expire_booking``: the request's capacity is no longer booked for it (BookingExpired, types.go: "the
  ProvisioningRequest had Provisioned condition before and capacity reservation time is expired"); pods that have
  not landed yet will not be given nodes;
- ``revoke``: the capacity is taken back (CapacityRevoked, types.go: "requested resources are not longer valid";
  Kueue's docs: "CA revokes the capacity, if a Workload is running on it, it will be evicted",
  https://kueue.sigs.k8s.io/docs/concepts/admission_check/provisioning_request/): the request's nodes go, and with
  them the pods that consume it (as a host lost mid-run: the kube emulator's ``lose_pod``);
- whoever made a request (Kueue's admission check: tests/emulators/kueue.py) hears of each condition it gets
  (``listeners``: (namespace, name, condition type)), as its controller watches the request.
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
        self.waiting: dict[tuple[str, str], list[Callable[[], None]]] = {}  # request -> what runs once provisioned
        self.crd_served = True  # False: a cluster without the ProvisioningRequest API
        self.decided: list[tuple[str, str, str]] = []  # (namespace, name, condition) in order
        self.decided_at: dict[tuple[str, str], float] = {}  # (namespace, name) -> when it was decided (epoch s)
        self.listeners: list[Callable[[str, str, str], None]] = []  # told (namespace, name, condition) of each
        self.lose_pod: Callable[[str, str], None] | None = None  # the kube emulator's host lost mid-run
        # A test's hand on the clock: when set, a decision also waits for this event (e.g. until the run has been
        # seen waiting), so an assertion about the wait cannot race a loaded machine's scheduling.
        self.hold: threading.Event | None = None

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
        timer = threading.Timer(self.provision_s, self._decide_outcome, args=(namespace, name))
        timer.daemon = True
        timer.start()

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

    def holds(self, namespace: str, pods: list[dict], schedule: Callable[[], None]) -> bool:
        """True when some of ``pods`` consume a request not yet provisioned: those stay Unschedulable and
        ``schedule`` runs once it is (the rest, a head on its CPU pool, are scheduled at once)."""
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
        for name in pending:
            self.waiting.setdefault((namespace, name), []).append(schedule)
        return True


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
