"""A run queued in Kueue (``gke.queue``): deploy_raycluster waits for its RayCluster's admission before it waits for the
pods, saying where it stands ("queued in team-a: position 3, 48 chips ahead"), bounded by the run's deadline.

Kueue makes a Workload for the RayCluster and unsuspends the RayCluster when the Workload is admitted: the Workload's
``Admitted`` condition turns True (https://kueue.sigs.k8s.io/docs/concepts/workload/, "Admission"; "Kueue controls
the spec.suspend field of the RayCluster": https://kueue.sigs.k8s.io/docs/tasks/run/rayclusters/). An admitted
workload may be evicted later (preempted by a higher-priority one, https://kueue.sigs.k8s.io/docs/concepts/preemption/):
its RayCluster is suspended and its pods deleted, the Ray job on them with them (``evicted``, ``lost_to_eviction``).
Kueue requeues it and admits it again when its quota allows; the stage whose job was lost waits for that
(``deploy.readmitted``) and submits its job again (``components.stages.jobs``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.platforms.gke.cloud import kueue
from components.platforms.gke.plan import queued

if TYPE_CHECKING:
    from components.platforms.gke.cloud.kube import Kube
    from components.platforms.store import RunStore

# Kueue makes a RayCluster's Workload as soon as its controller sees the RayCluster; none after this long means Kueue
# does not manage it (``ray.io/raycluster`` not among its integrations: ``cloud.kueue.frameworks``), and the suspended
# RayCluster would wait for nothing until the run's deadline.
NO_WORKLOAD_S = 120.0


class QueueDeadline(Exception):
    """The run's deadline passed while its RayCluster was still queued."""


def position(kube: Kube, queue: str, workload: dict[str, Any]) -> str:
    """Where the workload stands: its place in the LocalQueue (1 is next), and the TPU chips the workloads before it in
    that queue ask for."""
    from kubernetes.client.exceptions import ApiException

    name = workload["metadata"]["name"]
    try:
        items = kueue.pending(kube, queue)
    except ApiException as exc:  # the visibility API off (its feature gate) or not granted: no position, still waiting
        return f"queued in {queue} (no position: Kueue's visibility API answered {exc.status})"
    mine = next((i for i, w in enumerate(items) if w["metadata"]["name"] == name), None)
    if mine is None:
        return f"queued in {queue}"
    ahead = 0
    for item in items[:mine]:
        found = kube.custom.get_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, kube.namespace, "workloads", item["metadata"]["name"]
        )
        ahead += kueue.chips(found)
    where = items[mine]
    text = f"queued in {queue}: position {where['positionInLocalQueue'] + 1}, {ahead} chips ahead"
    if where.get("positionInClusterQueue", 0) != where["positionInLocalQueue"]:
        text += f" ({where['positionInClusterQueue'] + 1} in its ClusterQueue, with other teams' queues)"
    return text


def _why(workload: dict[str, Any] | None) -> str:
    reserved = kueue.condition(workload, "QuotaReserved") if workload else None
    return f": {reserved.get('message', '')}" if reserved and reserved.get("message") else ""


def wait_admitted(
    kube: Kube,
    raycluster: str,
    queue: str,
    timeout_s: float,
    *,
    poll_s: float = 2.0,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, float]:
    """Wait until Kueue admits the RayCluster's Workload; the (since, until) of the wait in epoch seconds. Raises
    QueueDeadline, with the queue position and Kueue's reason, when ``timeout_s`` passes first."""
    start, epoch = clock(), time.time() - clock()
    said = ""
    last_said = start - 60.0
    workload = None
    while True:
        workload = kueue.workload_of(kube, raycluster)
        if workload is not None and kueue.is_true(workload, "Admitted"):
            if said:
                log(f"  RayCluster {raycluster}: admitted by Kueue after {clock() - start:.0f}s in {queue}")
            return start + epoch, clock() + epoch
        now = clock()
        where = position(kube, queue, workload) if workload is not None else f"queued in {queue} (no Workload yet)"
        checks = queued.admission_checks(workload)  # capacity=queued: the ProvisioningRequest admission check
        where += f" ({checks})" if checks else ""
        rejected = queued.rejected(workload)
        if rejected:
            raise QueueDeadline(
                f"RayCluster {raycluster} will not be admitted by Kueue: {rejected} (the ProvisioningRequests Kueue "
                "made for it gave no capacity, and it stopped retrying). Nothing of the slices was billed; run again "
                "later, or choose another queue or cluster.capacity"
            )
        if where != said or now - last_said >= 30:
            log(f"  RayCluster {raycluster}: {where}{_why(workload)} ({now - start:.0f}s)")
            said, last_said = where, now
        if workload is None and now - start >= min(NO_WORKLOAD_S, timeout_s):
            raise QueueDeadline(
                f"Kueue made no Workload for RayCluster {raycluster} in {now - start:.0f}s: Kueue does not manage "
                f"RayClusters in this cluster ({kueue.RAY_INTEGRATION} is not in the integrations.frameworks of its "
                f"configuration, ConfigMap {kueue.CONFIG_NAMESPACE}/{kueue.CONFIG_MAP}), so the RayCluster would stay "
                "suspended; ask the platform team to enable it, or leave gke.queue empty"
            )
        if now - start >= timeout_s:
            raise QueueDeadline(
                f"RayCluster {raycluster} was not admitted by Kueue within {timeout_s:.0f}s (run.deadline_h): "
                f"{where}{_why(workload)}; it is withdrawn from the queue by teardown. Run again later, ask the "
                f"platform team for quota in the ClusterQueue behind {queue}, or set a higher gke.priority_class"
            )
        sleep(poll_s)


WORKLOAD_LOG = "logs/kueue_workload.json"


def keep_workload(store: RunStore, kube: Kube, raycluster: str) -> str | None:
    """For the post-mortem: the RayCluster's Workload as Kueue last described it (its queue, priority, conditions:
    why it waited, whether it was evicted and why; its admission), as ``logs/kueue_workload.json``; its key, None when
    Kueue made none. Kept when the Workload is evicted and again at teardown: the conditions Kueue has replaced since
    the last keep (an eviction's, once the Workload is admitted again) stay, oldest first, under ``earlier``."""
    import json

    from components.platforms.store import read_json, write_text

    workload = kueue.workload_of(kube, raycluster)
    if workload is None:
        return None
    status = workload.get("status") or {}
    conditions = status.get("conditions", [])
    before = read_json(store, WORKLOAD_LOG) or {}
    earlier = before.get("earlier", [])
    earlier += [c for c in before.get("conditions", []) if c not in conditions and c not in earlier]
    kept = {
        "name": workload["metadata"]["name"],
        "queue": workload["spec"].get("queueName"),
        "priority": workload["spec"].get("priority"),
        "conditions": conditions,
        "earlier": earlier,
        "admission": status.get("admission"),
        "requeueState": status.get("requeueState"),
    }
    return write_text(store, WORKLOAD_LOG, json.dumps(kept, indent=1), "application/json")


def lost_to_eviction(kube: Kube, raycluster: str) -> Callable[[], str | None]:
    """For the Ray Jobs API's retries: why they are pointless once Kueue has evicted the RayCluster (its pods, the
    head's among them, deleted with its jobs); None while it is not evicted."""

    def why() -> str | None:
        reason = evicted(kube, raycluster)
        if reason is None:
            return None
        return f"RayCluster {raycluster} was evicted by Kueue ({reason}): its pods and the Ray job on them are gone"

    return why


def evicted(kube: Kube, raycluster: str) -> str | None:
    """Kueue's reason when the RayCluster's Workload was evicted (preempted, say) and not admitted again yet; None
    while it is admitted (or has no Workload)."""
    workload = kueue.workload_of(kube, raycluster)
    if workload is None or kueue.is_true(workload, "Admitted"):
        return None
    found = kueue.condition(workload, "Evicted")
    if found and found["status"] == "True":
        return f"{found.get('reason', 'Evicted')}: {found.get('message', '')}"
    return None
