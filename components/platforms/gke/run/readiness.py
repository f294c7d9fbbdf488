"""The RayCluster's way to ready, as a small state machine stepped one observation at a time
(:class:`Readiness`), and the wait that steps it with a deadline (:func:`wait_ready`): ready when every worker is
available; failed fast, with the pod's own reason, when it will not get there (an image that cannot be pulled, a pod
that cannot start, a failed scale-up, pods unschedulable with no scale-up under way).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from components.platforms.gke.cloud.kube import Kube
from components.platforms.gke.plan import queued
from components.spec import InfraError

if TYPE_CHECKING:
    from components.platforms.store import RunStore

IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_REASONS = ("CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff")
# The cluster autoscaler's events on a pod it cannot place (kubernetes/autoscaler FAQ, "What events are emitted by
# CA?"; GKE docs, "Troubleshoot the cluster autoscaler not scaling up"): TriggeredScaleUp, it is adding nodes for the
# pod (flex-start and Autopilot start with none: the pods wait there for minutes); NotTriggerScaleUp, no node group
# it may grow would fit the pod; FailedScaleUp, it tried and the scale-up failed, the message naming why (on GKE
# "Node scale up in zones ... associated with this pod failed: GCE out of resources. ...").
SCALE_UP_TRIGGERED = "TriggeredScaleUp"
SCALE_UP_NOT_TRIGGERED = "NotTriggerScaleUp"
SCALE_UP_FAILED = "FailedScaleUp"
AUTOSCALER_REASONS = (SCALE_UP_TRIGGERED, SCALE_UP_NOT_TRIGGERED, SCALE_UP_FAILED)
# Between the retries of a failed scale-up the autoscaler holds the node group in backoff, and says so on the pod: a
# NotTriggerScaleUp whose message names the skipped reason "in backoff after failed scale-up" (kubernetes/autoscaler,
# cluster-autoscaler/core/scaleup/orchestrator/skippedreasons.go, ``BackoffReason``, at
# d610672804edab46a4931a26a9d11435cd698787; the event reads "pod didn't trigger scale-up: 1 in backoff after failed
# scale-up"). It is the failed scale-up still under way, not a pod no node group would fit.
SCALE_UP_BACKOFF = "in backoff after failed scale-up"
# The requests' conditions that end a rung before its pods landed: Failed, BookingExpired (types.go); a
# CapacityRevoked takes nodes back from a run under way and is not a stockout of the rung. A BookingExpired once the
# request's pods landed ends nothing: the booking only held the nodes until they did (types.go: "capacity reservation
# time is expired"), and Kueue acts on it only for a Workload not yet admitted (kubernetes-sigs/kueue,
# keps/1136-provisioning-request-support/README.md at cc13fff80cdc62877729419a7f5733f3a90e2f7d: "BookingExpired=true
# if a Workload is not Admitted, the controller should act the same as for Failed=true").
STOCKOUT_CONDITIONS = ("Failed", "BookingExpired")
# A node pool GKE reports as RUNNING_WITH_ERROR: "created and is partially usable. Some error state has occurred and
# some functionality may be impaired" (container v1 NodePool.Status, google/container/v1/cluster_service.proto;
# google-cloud-container's container_v1/types/cluster_service.py), its ``statusMessage`` saying what. The public
# accounts of GKE reporting a stockout that way are all of pools created with nodes ("Deploy error: Not all instances
# running in IGM ... [ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS]",
# https://github.com/hashicorp/terraform-provider-google/issues/3304; more often the CreateNodePool operation itself
# fails so, "[GCE_STOCKOUT]": https://github.com/hashicorp/terraform-provider-google/issues/6287), which provision takes
# as the rung's capacity error (cloud/cluster.py). Where nodes come from zero, GKE documents a stockout as the
# cluster autoscaler's FailedScaleUp ("Troubleshoot the cluster autoscaler not scaling up",
# https://cloud.google.com/kubernetes-engine/docs/troubleshooting/cluster-autoscaler-scale-up), read from the pods'
# events here; a pool's RUNNING_WITH_ERROR is then only reported, in the progress line and in the error at the
# deadline, whatever its message.
POOL_WITH_ERROR = "RUNNING_WITH_ERROR"


class RayClusterNotReady(InfraError):
    """The RayCluster cannot become ready: pods unschedulable, an image that cannot be pulled, a bad pod config."""


class Stockout(RayClusterNotReady):
    """The run's TPU nodes did not come where they scale from zero (flex-start, queued provisioning, Autopilot): a
    scale-up the cluster autoscaler kept failing, a ProvisioningRequest Failed or BookingExpired before its pods
    landed, or no node by the readiness deadline. The capacity ladder moves on from such a rung (``failover``).
    ``host_s``: the seconds TPU hosts of the rung were seen billing before it was left (worker pods that had
    landed, nodes a request had provisioned), for the ledger's cost of the rung."""

    def __init__(self, message: str, host_s: float = 0.0):
        super().__init__(message)
        self.host_s = host_s


class Evicted(InfraError):
    """Kueue evicted the RayCluster's Workload while it was on its way to ready (``evicted``: Kueue's reason)."""


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when ``pod`` is Unschedulable (PodScheduled False), else None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return str(cond.get("message", ""))
    return None


def _scheduled(pod: dict[str, Any]) -> bool:
    """The scheduler placed ``pod`` (PodScheduled True)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any((c.get("type"), c.get("status")) == ("PodScheduled", "True") for c in conditions)


def backoff(event: dict[str, Any]) -> bool:
    """``event`` is the autoscaler's NotTriggerScaleUp for a node group in backoff after a failed scale-up
    (``SCALE_UP_BACKOFF``): the failed scale-up, to be retried."""
    return event.get("reason") == SCALE_UP_NOT_TRIGGERED and SCALE_UP_BACKOFF in (event.get("message") or "")


def scale_up_events(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod name -> the cluster autoscaler's latest event about it (``AUTOSCALER_REASONS``), latest by its last time
    (seconds); in one second the failure wins (``AUTOSCALER_REASONS``' order)."""

    def when(event: dict[str, Any]) -> tuple[str, int]:
        return (
            event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "",
            AUTOSCALER_REASONS.index(event["reason"]),
        )

    latest: dict[str, dict[str, Any]] = {}
    for event in sorted((e for e in events if e.get("reason") in AUTOSCALER_REASONS), key=when):
        latest[(event.get("involvedObject") or {}).get("name", "")] = event
    return latest


@dataclass
class Readiness:
    """The RayCluster's way to ready, one observation at a time: ``step(raycluster, pods, now, events)`` returns True
    when every worker is available, None while it is on its way, and raises :class:`RayClusterNotReady` with the pod's
    own reason when it will not get there: an image that cannot be pulled, a pod that cannot start, a scale-up the
    cluster autoscaler reports failed (FailedScaleUp, or the NotTriggerScaleUp of the backoff after one: at once for a
    fixed pool; for flex-start and Autopilot, whose stockouts the autoscaler retries, only once it repeated for
    ``failed_scale_up_grace_s``), pods unschedulable for
    ``unschedulable_grace_s`` with no scale-up under way (a fixed-size pool does not grow; NotTriggerScaleUp names
    why). A pod unschedulable with a TriggeredScaleUp event is waiting for its nodes (flex-start, Autopilot: they
    start with none): only the deadline of :func:`wait_ready` bounds that wait. While it waits, ``last`` names each
    pod that is not running and why, and ``capacity_wait`` is the (first, last) time a pod of the RayCluster was
    waiting for a node: from the first observation of a pod Unschedulable to the first after it at which none is (the
    goodput ledger's "waiting for capacity", components/stages/goodput.py)."""

    unschedulable_grace_s: float = 60.0
    # 0: a FailedScaleUp is final (a fixed pool); else the autoscaler retries, and FailedScaleUp ends the wait only
    # when it repeats for this long (flex-start, Autopilot: components.spec.READY_LIMITS_S)
    failed_scale_up_grace_s: float = 0.0
    unschedulable_since: float | None = None
    last: str = "no status yet"
    failed_since: dict[str, float] = field(default_factory=dict)  # pod -> when its first FailedScaleUp was seen
    failures: dict[str, set[tuple[str, int]]] = field(
        default_factory=dict
    )  # pod -> its FailedScaleUp events seen (name, count)
    capacity_wait: tuple[float, float | None] | None = None  # (since, until; None while still waiting)
    # capacity=queued: the names of the run's ProvisioningRequests (one per slice's pool), whose states ``step`` is
    # given with the rest
    request_names: tuple[str, ...] = ()
    # the nodes come from zero (flex-start, queued, Autopilot): a stockout seen here is a ``Stockout``, which the
    # capacity ladder moves on from; a fixed pool's nodes are there from provision, and its failures are not
    from_zero: bool = False
    landed: dict[str, float] = field(default_factory=dict)  # worker pod -> when it was first seen scheduled
    provisioned: dict[str, tuple[float, int]] = field(
        default_factory=dict
    )  # request -> (first seen Provisioned, hosts)
    expired: dict[str, float] = field(default_factory=dict)  # request -> when its booking was first seen expired
    landed_on: set[str] = field(default_factory=set)  # the requests a landed worker pod consumes
    pool_errors: dict[str, tuple[float, str]] = field(default_factory=dict)  # pool -> (first seen, statusMessage)

    def step(
        self,
        raycluster: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        now: float,
        events: Sequence[dict[str, Any]] = (),
        requests: dict[str, dict[str, Any] | None] | None = None,
        pools: dict[str, tuple[str, str]] | None = None,
    ) -> bool | None:
        """``pools``: the run's TPU node pools as GKE last reported them (name -> (status, statusMessage)), None when
        not read at this step (they are read less often than the pods)."""
        if raycluster is None:
            raise RayClusterNotReady("the RayCluster is gone (deleted while the run waited for it)")
        self._land(pods, now)
        awaited = self._requests(requests or {}, now)
        if pools is not None:
            self._pools(pools, now)
        status = raycluster.get("status") or {}
        desired = status.get("desiredWorkerReplicas")
        available = status.get("availableWorkerReplicas", 0)
        self.last = (
            f"state {status.get('state') or '(none)'}, {available}/{desired if desired is not None else '?'} "
            f"workers available, {len(pods)} pods"
        ) + self.pool_story()
        self._capacity(now, any(unschedulable(p) is not None for p in pods))
        if status.get("state") == "ready" and desired is not None and available >= desired:
            self._capacity(now, False)
            return True
        for pod in pods:
            _check_containers(pod)
        scale_ups = scale_up_events(list(events))
        failed = scale_up_events([e for e in events if e.get("reason") == SCALE_UP_FAILED])  # the latest failure's
        waiting: list[Any] = []
        stuck: list[Any] = []  # (pod, scheduler's message, the autoscaler's latest event or None)
        retried = 0
        for pod in pods:
            name, message = pod["metadata"]["name"], unschedulable(pod)
            if message is None:
                self.failed_since.pop(name, None)
                self.failures.pop(name, None)
                continue
            event = scale_ups.get(name)
            reason = (event or {}).get("reason")
            if event is not None and (reason == SCALE_UP_FAILED or backoff(event)):
                self._failed_scale_up(name, event, failed.get(name, event), now)
                retried += 1
                reason = SCALE_UP_TRIGGERED  # the autoscaler retries it after its backoff
            (waiting if reason == SCALE_UP_TRIGGERED or awaited else stuck).append((name, message, event))
        if waiting and awaited:
            self.last += f", {len(waiting)} waiting for ProvisioningRequest {', '.join(awaited)} (queued provisioning)"
        elif waiting:
            self.last += f", {len(waiting)} waiting for new nodes ({SCALE_UP_TRIGGERED})"
        if retried:
            self.last += f", {retried} after a {SCALE_UP_FAILED} the autoscaler retries"
        self.last += _pod_reasons(pods)
        if not stuck:
            self.unschedulable_since = None
            return None
        if self.unschedulable_since is None:
            self.unschedulable_since = now
        if now - self.unschedulable_since >= self.unschedulable_grace_s:
            name, message, event = stuck[0]
            why = f"{event['reason']}: {event.get('message', '')}" if event else f"Unschedulable: {message}"
            raise RayClusterNotReady(
                f"{len(stuck)} pod(s) of the RayCluster cannot be scheduled for "
                f"{now - self.unschedulable_since:.0f}s with no scale-up under way; pod {name}: "
                f"{why}"
            )
        self.last += f", {len(stuck)} unschedulable"
        return None

    def _requests(self, requests: dict[str, dict[str, Any] | None], now: float) -> list[str]:
        """capacity=queued: the run's ProvisioningRequests not yet Provisioned (their pods wait for all their nodes
        at once, with no scale-up event of their own; the run starts when none is left); raises once one will give
        no nodes (Failed: capacity not found before its deadline; BookingExpired before its pods landed;
        CapacityRevoked) or is gone. [] without requests."""
        waiting = []
        for name in self.request_names:
            request = requests.get(name)
            if request is None:
                raise RayClusterNotReady(f"the ProvisioningRequest {name} is gone (deleted while it waited)")
            if queued.condition(request, queued.PROVISIONED) is not None:
                hosts = sum(int(s.get("count", 0)) for s in (request.get("spec") or {}).get("podSets") or [])
                self.provisioned.setdefault(name, (now, hosts))
            why = queued.ended(request)
            if why and self._booking_used(name, request):
                why = None  # its pods landed before the booking lapsed: the nodes are theirs
            if why:
                if queued.condition(request, "BookingExpired") is not None:
                    self.expired.setdefault(name, now)
                told = story(name, request) or why
                if any(queued.condition(request, kind) for kind in STOCKOUT_CONDITIONS):
                    raise Stockout(told, self.host_s(now))
                raise RayClusterNotReady(told)
            if queued.condition(request, queued.PROVISIONED) is None:
                waiting.append(name)
        return waiting

    def _pools(self, pools: dict[str, tuple[str, str]], now: float) -> None:
        """Keep ``pool_errors`` (``POOL_WITH_ERROR``: when each pool was first seen so, and its message; a pool back to
        RUNNING is dropped), to be reported: not a stockout by itself (``POOL_WITH_ERROR``)."""
        for name, (status, message) in pools.items():
            if status != POOL_WITH_ERROR:
                self.pool_errors.pop(name, None)
                continue
            since = self.pool_errors.get(name, (now, ""))[0]
            self.pool_errors[name] = (since, message)

    def pool_story(self) -> str:
        """The node pools GKE reports RUNNING_WITH_ERROR, with their statusMessage, for the progress line and the
        error at the deadline; "" when none is."""
        return "".join(
            f", node pool {name} {POOL_WITH_ERROR}: {message or '(no statusMessage)'}"
            for name, (_, message) in sorted(self.pool_errors.items())
        )

    def _booking_used(self, name: str, request: dict[str, Any]) -> bool:
        """The request's only ending is BookingExpired, and a pod consuming it had landed (``STOCKOUT_CONDITIONS``)."""
        others = [kind for kind in queued.ENDED if kind != "BookingExpired" and queued.condition(request, kind)]
        expired = queued.condition(request, "BookingExpired") is not None
        return expired and not others and name in self.landed_on

    def _land(self, pods: list[dict[str, Any]], now: float) -> None:
        """Note when each worker pod was first seen scheduled: from then its host bills (``host_s``)."""
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            if labels.get("ray.io/node-type") == "worker" and unschedulable(pod) is None and _scheduled(pod):
                self.landed.setdefault(pod["metadata"]["name"], now)
                consumed = (pod["metadata"].get("annotations") or {}).get(queued.CONSUME_ANNOTATION)
                if consumed:
                    self.landed_on.add(consumed)

    def host_s(self, now: float) -> float:
        """The host-seconds the rung was seen billing by ``now``: each worker pod from when it landed, and the hosts
        of each Provisioned request from when it was (to its booking's expiry) for pods that have not landed."""
        pods = sum(now - since for since in self.landed.values())
        booked = sum(
            max(0, hosts - len(self.landed)) * (self.expired.get(name, now) - since)
            for name, (since, hosts) in self.provisioned.items()
        )
        return pods + booked

    def _capacity(self, now: float, waiting: bool) -> None:
        """Keep ``capacity_wait``: opened at the first observation of a pod waiting for a node, closed at the first
        at which none waits (a later wait, rare, extends it to its own end)."""
        if waiting:
            self.capacity_wait = (self.capacity_wait[0] if self.capacity_wait else now, None)
        elif self.capacity_wait and self.capacity_wait[1] is None:
            self.capacity_wait = (self.capacity_wait[0], now)

    def _failed_scale_up(self, name: str, event: dict[str, Any], told: dict[str, Any], now: float) -> None:
        """A FailedScaleUp about pod ``name``, or the backoff after one (``backoff``): final for a fixed pool (no
        grace), else final only once such events repeated (two or more) for ``failed_scale_up_grace_s``. ``told``:
        the latest FailedScaleUp (its message names the cause: "GCE out of resources"), else ``event``."""
        why = f"{told['reason']}: {told.get('message', '')}"
        if self.failed_scale_up_grace_s <= 0:
            raise (Stockout if self.from_zero else RayClusterNotReady)(
                f"pod {name} cannot be scheduled and the cluster autoscaler's scale-up failed: {why}"
            )
        since = self.failed_since.setdefault(name, now)
        seen = self.failures.setdefault(name, set())
        seen.add(((event.get("metadata") or {}).get("name", ""), event.get("count", 1)))  # a repeat: a new count
        if len(seen) >= 2 and now - since >= self.failed_scale_up_grace_s:
            message = (
                f"pod {name} cannot be scheduled: the cluster autoscaler's scale-up failed {len(seen)} times over "
                f"{now - since:.0f}s (past the {self.failed_scale_up_grace_s:.0f}s it is given to retry): {why}"
            )
            raise Stockout(message, self.host_s(now)) if self.from_zero else RayClusterNotReady(message)


# What befell a ProvisioningRequest that gives the run no nodes, by its condition (types.go's comments: Failed, "it
# is impossible to obtain resources to fulfill this ProvisioningRequest"; BookingExpired, it "had Provisioned condition
# before and capacity reservation time is expired"; CapacityRevoked, "requested resources are not longer valid").
STORIES = {
    "Failed": "will give the run no TPU nodes: the capacity could not be had. Nothing of the slices was billed while "
    "it was queued",
    "BookingExpired": "was Provisioned, but its booking expired before the worker pods landed on the nodes: they are "
    "no longer held for the run (and are scaled down)",
    "CapacityRevoked": "had its capacity revoked: its nodes were taken back, and the pods on them lost as preempted "
    "hosts' are (their logs and events kept in logs/lost_pods.json)",
}
AGAIN = "; run again (a new request), or choose another cluster.capacity (flex-start, spot, on-demand, reservation)"


def story(name: str, request: dict[str, Any] | None) -> str | None:
    """One line on what befell the run's ProvisioningRequest when it gives no more nodes (Failed, BookingExpired,
    CapacityRevoked, with its reason and message), None while it is queued or Provisioned."""
    for kind, told in STORIES.items():
        cond = queued.condition(request, kind)
        if cond is not None:
            said = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
            return f"the ProvisioningRequest {name} {told} ({kind}: {said}){AGAIN}"
    return None


def keep_request(store: RunStore, kube: Kube, names: list[str]) -> str | None:
    """For the post-mortem: the run's ProvisioningRequest that gave no nodes (else its first) as it was last (its
    conditions: why it waited, failed, expired or was revoked) as ``logs/provisioning_request.json``, with ``story``'s
    line; the line, None when the requests are gone or gave their nodes."""
    import json

    from components.platforms.store import write_text

    found = [(name, request) for name in names if (request := kube.get("ProvisioningRequest", name)) is not None]
    if not found:
        return None
    name, request = next(((n, r) for n, r in found if story(n, r)), found[0])
    told = story(name, request)
    kept = {"name": name, "conditions": (request.get("status") or {}).get("conditions", []), "story": told}
    write_text(store, "logs/provisioning_request.json", json.dumps(kept, indent=1), "application/json")
    return told


def _pod_reasons(pods: list[dict[str, Any]]) -> str:
    """Why each pod is not running yet, as the API server says: unschedulable (the scheduler's message), a
    container waiting (its reason: ContainerCreating while the image is pulled), or its phase."""
    out = []
    for pod in pods:
        status = pod.get("status") or {}
        waiting = [
            (cs.get("state") or {}).get("waiting", {}).get("reason")
            for cs in status.get("containerStatuses") or []
            if (cs.get("state") or {}).get("waiting")
        ]
        message = unschedulable(pod)
        if message is not None:
            out.append(f"{pod['metadata']['name']} Unschedulable: {message}")
        elif waiting:
            out.append(f"{pod['metadata']['name']} {', '.join(w or 'waiting' for w in waiting)}")
        elif status.get("phase", "Pending") != "Running":
            out.append(f"{pod['metadata']['name']} {status.get('phase', 'Pending')}")
    return "; pods not running: " + "; ".join(out) if out else ""


def _check_containers(pod: dict[str, Any]) -> None:
    """Raise when a container of ``pod`` waits on something that will not come: its image, or its config."""
    name = pod["metadata"]["name"]
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            image = pod["spec"]["containers"][0].get("image", "")
            raise RayClusterNotReady(
                f"pod {name} cannot pull its image {image}: {waiting['reason']}: {waiting.get('message', '')}"
            )
        if waiting.get("reason") in CONFIG_REASONS:
            raise RayClusterNotReady(f"pod {name} cannot start: {waiting['reason']}: {waiting.get('message', '')}")


def wait_ready(
    kube: Kube,
    name: str,
    timeout_s: float,
    *,
    unschedulable_grace_s: float,
    failed_scale_up_grace_s: float = 0.0,
    requests: tuple[str, ...] = (),
    from_zero: bool = False,
    poll_s: float = 2.0,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    evicted: Callable[[], str | None] | None = None,
    pools: Callable[[], dict[str, tuple[str, str]]] | None = None,
    pools_every_s: float = 30.0,
) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """Step :class:`Readiness` every ``poll_s`` until ready or ``timeout_s``; the pods' events are read only while
    one of them is unschedulable. The ready RayCluster, and when its pods waited for nodes (``capacity_wait``, as
    epoch seconds; None if none ever did). ``requests``: the run's ProvisioningRequests (capacity=queued, one per
    slice's pool), read with the rest at every step. ``evicted`` (a run queued in Kueue): Kueue's reason once it
    evicted the RayCluster, raised as :class:`Evicted`. ``from_zero``: the TPU nodes come from zero (flex-start,
    queued, Autopilot), and a stockout seen here, pods still waiting for nodes at the deadline among them, is raised
    as :class:`Stockout`. ``pools``: the run's TPU node pools as GKE reports them (name -> (status, statusMessage)),
    read every ``pools_every_s`` (one GKE call per pool; a RUNNING_WITH_ERROR pool is reported:
    ``POOL_WITH_ERROR``)."""
    from components.platforms.waiting import DeadlineExceeded, wait_for

    machine = Readiness(
        unschedulable_grace_s=unschedulable_grace_s,
        failed_scale_up_grace_s=failed_scale_up_grace_s,
        request_names=tuple(requests),
        from_zero=from_zero,
    )
    selector = f"ray.io/cluster={name}"
    pools_read: list[float] = []  # when the pools were last read

    def poll() -> bool | None:
        why = evicted() if evicted is not None else None
        if why:
            raise Evicted(f"RayCluster {name} was evicted by Kueue: {why}")
        raycluster, pods = kube.get("RayCluster", name), kube.pods(selector)
        events = kube.pod_events() if any(unschedulable(p) is not None for p in pods) else []
        provisioning = {r: kube.get("ProvisioningRequest", r) for r in requests}
        now = clock()
        seen = None
        if pools is not None and (not pools_read or now - pools_read[-1] >= pools_every_s):
            seen, pools_read[:] = pools(), [now]
        return machine.step(raycluster, pods, now, events, provisioning, seen) or None

    def progress(elapsed: float) -> None:
        if int(elapsed) % 10 < poll_s:
            log(f"  RayCluster {name}: {machine.last} ({elapsed:.0f}s)")

    try:
        wait_for(
            poll,
            timeout_s=timeout_s,
            interval_s=poll_s,
            what=f"RayCluster {name} to be ready",
            progress=progress,
            clock=clock,
            sleep=sleep,
        )
    except DeadlineExceeded as exc:
        if from_zero and machine.capacity_wait and machine.capacity_wait[1] is None:  # no node came within the bound
            never = f"{exc}: its TPU nodes never came; last seen: {machine.last}"
            raise Stockout(never, machine.host_s(clock())) from None
        raise DeadlineExceeded(f"{exc}; last seen: {machine.last}") from None
    epoch = time.time() - clock()  # the clock's instants as epoch seconds, as the stage records keep time
    wait = machine.capacity_wait
    ready = kube.get("RayCluster", name)
    if ready is None:
        raise InfraError(f"RayCluster {name} was deleted as it became ready")
    return ready, (wait[0] + epoch, wait[1] + epoch) if wait and wait[1] is not None else None
