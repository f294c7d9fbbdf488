"""Failover after provisioning. Flex-start, queued provisioning and Autopilot give a run its TPU nodes only once its
pods ask, so their stockouts surface while deploy_raycluster waits for the RayCluster, not at provision
(``readiness.Stockout``: a scale-up the cluster autoscaler kept failing, a ProvisioningRequest Failed or
BookingExpired before its pods landed, slices that could not start together, no node within the readiness bound).
Then the run leaves the rung as provision leaves one that had no capacity, and takes the next rung of its ladder
(``candidates``):

1. the deletes of the rung's TPU node pools are started first (their nodes bill), then the run's Kubernetes objects
   made for it are deleted (RayCluster, ProvisioningRequests: the next rung's pods differ), and whatever happens
   meanwhile the pools are waited on until gone (the next rung's pools take the same names); where the next candidate
   is in another zone, everything the run created is deleted instead (a zonal cluster is in one zone);
2. the ledger's ``tried`` records the rung: its zone and capacity type, why it was left and at which stage, and its
   cost, the TPU chip-seconds it was seen billing (``chip_s``: hosts whose pods had landed, or a Provisioned
   request's nodes, times the chips of a host);
3. the next candidate that preflight passes is provisioned (the ledger's ``candidate`` then names it, and every
   later stage runs there), and the RayCluster deployed again.

Each step runs only within ``run.deadline_h`` (from the run's start); past it, or with no rung left, the stockout
ends the stage as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from components.platforms import RunContext
from components.platforms import ledger as ledgers
from components.platforms.gke.cloud.clients import load_ledger, run_cluster
from components.platforms.gke.plan import candidates, ownership, paths, queued
from components.platforms.gke.plan.target import target
from components.platforms.gke.run import teardown as teardowns
from components.spec import names
from components.workload import derive as d

if TYPE_CHECKING:
    from components.platforms.gke.checks.findings import Report
    from components.platforms.gke.cloud.clients import Clients
    from components.platforms.gke.cloud.cluster import Gke
    from components.platforms.gke.run.readiness import Stockout
    from components.platforms.gke.run.session import Session


class Rungs(Protocol):
    """What the ladder uses of ``components.platforms.gke.run.platform.GkePlatform`` (which imports this module)."""

    clients: Clients
    log: Callable[[str], None]
    poll_s: float

    def _walk(self, ctx: RunContext, stage: str) -> Session: ...
    def _placed(self, ctx: RunContext) -> RunContext: ...
    def _ranked(self, ctx: RunContext) -> list[tuple[RunContext, Report]]: ...
    def _provision_on(
        self, ctx: RunContext, report: Report | None, recorded: dict[str, Any], first: bool = True
    ) -> dict[str, Any]: ...
    @staticmethod
    def _key(ctx: RunContext) -> dict[str, str]: ...


# How long the rung's RayCluster may take to go once deleted (KubeRay deletes its pods first).
RAYCLUSTER_GONE_S = 300.0
# How long the rung's TPU node pools may take to go once their deletes started (a multi-host pool's nodes are deleted
# together; GKE's own bound on a node pool operation is not documented).
POOLS_GONE_S = 1800.0


def deploy(platform: Rungs, ctx: RunContext) -> dict[str, Any]:
    """deploy_raycluster on the rung provision took, moving down the ladder on each ``readiness.Stockout``."""
    from components.platforms.gke.run import readiness

    while True:
        try:
            result: dict[str, Any] = platform._walk(ctx, "deploy_raycluster").deploy_result
            return result
        except readiness.Stockout as exc:
            if not move_on(platform, ctx, exc):
                raise


def past_deadline(ctx: RunContext) -> bool:
    """The run's deadline (``run.deadline_h``, from the ledger's start) is past."""
    deadline_h = ctx.spec.run.deadline_h
    started = (ledgers.load(ctx.store) or {}).get("started", time.time())
    return deadline_h is not None and time.time() - started >= deadline_h * 3600


def move_on(platform: Rungs, ctx: RunContext, exc: Stockout) -> bool:
    """Leave the rung the run is on (``exc``: its stockout) for the next one preflight passes, provisioned; False
    (nothing done) when no rung is left or the deadline is past."""
    from components.platforms.gke.checks.findings import PreflightFailed
    from components.platforms.gke.cloud import cluster as gke_cluster

    placed = platform._placed(ctx)
    here = platform._key(placed)
    order = candidates.order(ctx.spec)
    later = order[order.index(here) + 1 :] if here in order else []
    if not later or past_deadline(ctx):
        platform.log(
            f"deploy_raycluster: {here['capacity']} in {here['zone']} has no capacity, and "
            + ("the run's deadline is past" if later else "no rung of cluster.capacity is left")
        )
        return False
    try:
        tries = [(p, report) for p, report in platform._ranked(ctx) if platform._key(p) in later]
    except PreflightFailed as refused:
        platform.log(f"deploy_raycluster: no later rung passes preflight: {refused}")
        return False
    if not tries:
        platform.log("deploy_raycluster: no later rung passes preflight")
        return False
    chip_s = round(exc.host_s * _chips_per_host(placed), 1)
    nxt = platform._key(tries[0][0])
    platform.log(
        f"deploy_raycluster: {here['capacity']} in {here['zone']} has no capacity ({str(exc)[:300]}); deleting its "
        f"TPU node pools, then trying the next rung, {nxt['capacity']} in {nxt['zone']}"
    )
    leave(platform, placed, nxt["zone"])
    tried(ctx, here, str(exc), "deploy_raycluster", chip_s)
    for index, (place, report) in enumerate(tries):
        try:
            platform._provision_on(place, report, load_ledger(ctx), first=False)
            return True
        except gke_cluster.CapacityError as err:  # rolled back by provision, as a first rung's would be
            if index == len(tries) - 1 or past_deadline(ctx):
                raise
            tried(ctx, platform._key(place), str(err), "provision", 0.0)
    return False


def leave(platform: Rungs, placed: RunContext, next_zone: str) -> list[str]:
    """Delete what bills of the rung ``placed``: its TPU node pools' deletes started first, then the run's Kubernetes
    objects made for them, then the pools waited on until gone; with the next rung in another zone, everything the
    run created (its cluster with them). What was deleted."""
    from components.platforms.gke.cloud import cluster as gke_cluster

    clients, t = platform.clients, target(placed.spec, placed.run_id)
    gke = clients.gke(gke_cluster.credentials())
    ledger = ownership.owned(placed, load_ledger(placed), platform.log)
    if next_zone != t.zone:
        return teardowns.delete_created(clients, gke, None, ledger, t)
    cluster = run_cluster(ledger, t)
    pools = [
        paths.node_pool_path(cluster, names.tpu_node_pool(t.run_id, i)) for i in range(placed.spec.cluster.num_slices)
    ]
    started = [pool for pool in pools if gke.delete_node_pool(pool, wait=False)]  # their nodes stop billing first
    try:
        _delete_run_objects(platform, placed)
    finally:
        _wait_pools_gone(platform, gke, pools)
    return started


def _wait_pools_gone(platform: Rungs, gke: Gke, pools: list[str]) -> None:
    """Wait until every pool of ``pools`` is gone (the next rung's take their names), deleting again one whose delete
    GKE refused meanwhile (one operation on the cluster at a time: the refusal is logged by ``delete_node_pool``)."""
    from google.cloud import container_v1

    from components.platforms.waiting import wait_for

    def gone() -> bool | None:
        left = [(pool, gke.get_node_pool(pool)) for pool in pools]
        for pool, found in left:
            if found is not None and found.status != container_v1.NodePool.Status.STOPPING:
                gke.delete_node_pool(pool, wait=False)
        return all(found is None for _, found in left) or None

    wait_for(gone, timeout_s=POOLS_GONE_S, interval_s=min(platform.poll_s, 5.0), what="the rung's TPU node pools to go")


def _delete_run_objects(platform: Rungs, placed: RunContext) -> None:
    """The run's Kubernetes objects (by its label), its ProvisioningRequests kept first for the post-mortem; waits
    until its RayCluster is gone, so no pod of it is left to land on the next rung's pools."""
    from components.platforms.gke.run import readiness
    from components.platforms.waiting import wait_for

    kube, _, _ = platform.clients.kube(placed)
    if kube is None:
        return
    if queued.direct(placed.spec):
        readiness.keep_request(placed.store, kube, queued.request_names(placed.spec, placed.run_id))
    kube.delete_labelled(f"{names.RUN_LABEL}={placed.run_id}", queued=queued.enabled(placed.spec))
    raycluster = names.raycluster(placed.run_id)
    wait_for(
        lambda: kube.get("RayCluster", raycluster) is None or None,
        timeout_s=RAYCLUSTER_GONE_S,
        interval_s=min(platform.poll_s, 2.0),
        what=f"RayCluster {raycluster} to be deleted",
    )


def _chips_per_host(placed: RunContext) -> int:
    shape = d.slice_shape(placed.spec)
    return shape.num_chips // shape.num_hosts


def tried(ctx: RunContext, key: dict[str, str], why: str, stage: str, chip_s: float) -> None:
    """Record a rung the run left in the ledger's ``tried``: where, why, at which stage, and its chip-seconds."""

    def add(ledger: dict[str, Any]) -> None:
        ledger.setdefault("tried", []).append({**key, "error": why[:500], "left_at": stage, "chip_s": chip_s})

    ledgers.update(ctx.store, add)
