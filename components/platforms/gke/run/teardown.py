"""Teardown of a gke run: what it created deleted newest first, found by its label, its ledger and the names derived
from its run id: its Kubernetes objects (by the run label), its node pools or its cluster (by label and by the
ledger), its binding on the bucket, its Compute Engine resources (by the ledger and by the derived names). Not found
is success, so it is safe to run again; what is shared (the namespace, the bucket, the image repository, a cluster the
spec names) is kept. Each step runs even when one before it failed; the failures are reported together.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from components.platforms import RunContext, postmortem
from components.platforms import ledger as ledgers
from components.platforms.gke.cloud.clients import Clients, load_ledger, run_cluster
from components.platforms.gke.cloud.cluster import START_TIMEOUT_S
from components.platforms.gke.cloud.control_plane import control_plane
from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import ownership, paths, queued
from components.platforms.gke.plan.compute_resources import COMPUTE_KINDS
from components.platforms.gke.plan.target import Target, target
from components.spec import InfraError, names

if TYPE_CHECKING:
    from google.cloud.container_v1 import Cluster

    from components.cloud.credentials import AccessToken
    from components.platforms.gke.cloud.cluster import Gke
    from components.platforms.gke.cloud.compute import Compute
    from components.platforms.gke.cloud.kube import Kube


def teardown(ctx: RunContext, clients: Clients) -> dict[str, Any]:
    """Delete what the run created (its spec passed the platform's checks); the deleted, and the cluster kept (one
    the spec names) or None."""
    ledger = load_ledger(ctx)
    t = target(ctx.spec, ctx.run_id)
    owns = t.owns_cluster  # the spec's word, not the ledger's
    ledger = ownership.owned(ctx, ledger, clients.log)
    deleted: list[str] = []
    failures: list[str] = []
    for step in (_delete_kubernetes, _delete_cluster_or_pools, _delete_binding, _delete_compute):
        try:
            deleted += step(clients, ctx, ledger)
        except Exception as exc:  # noqa: BLE001 - teardown goes on with the next step, then reports
            failures.append(f"{step.__name__.removeprefix('_delete_').replace('_', ' ')}: {exc}")
    clients.log(
        f"teardown: deleted {len(deleted)} resources of {ctx.run_id}"
        + (": " + ", ".join(x.rsplit("/", 1)[-1] for x in deleted) if deleted else "")
    )
    if failures:
        raise InfraError("teardown could not remove: " + "; ".join(failures))
    if ledgers.load(ctx.store) is not None:
        ledgers.update(ctx.store, lambda recorded: recorded.update(torn_down=time.time()))
    return {"deleted": deleted, "kept_cluster": None if owns else run_cluster(ledger, t)}


def start_deletes(ctx: RunContext, clients: Clients) -> list[str]:
    """What bills of a cancelled run: the node pools it created in a cluster it does not own, else its cluster (its
    node pools go with it), as its ledger records them; each delete started, none waited on, so a task with seconds
    left before its SIGKILL issues them all. A GKE operation runs on once started: it is the cluster's, not the
    caller's ("Operation" resource, https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.operations).
    The rest (Kubernetes objects, Compute Engine resources, the bucket binding) bills nothing by the hour and is left
    to the janitor or ``tpupipe teardown``, which also finish what these deletes miss."""
    ledger = ledgers.load(ctx.store) or {}
    if ledger.get("torn_down"):
        return []
    created = ledger.get("created", [])
    clusters = [e["name"] for e in created if e["kind"] == "cluster"]
    pools = [e["name"] for e in created if e["kind"] == "node_pool"]
    gke = clients.gke()
    deleting = clusters or pools  # a cluster's node pools go with it
    delete = gke.delete_cluster if clusters else gke.delete_node_pool
    # GKE runs one node-pool operation at a time on a cluster: a pool's delete may wait for the one before it, and
    # all of them share one instant past which what is not started is left to the janitor.
    start_by = gke.clock() + START_TIMEOUT_S
    started = []
    for name in reversed(deleting):  # one refused delete never keeps the others from being asked
        try:
            if delete(name, wait=False, start_by=start_by):
                started.append(name)
        except Exception as exc:  # noqa: BLE001 - whatever it was, the janitor or tpupipe teardown finishes it
            clients.log(f"teardown: delete of {name.rsplit('/', 1)[-1]} not started ({exc}); left to the janitor")
    return started


def remaining(ctx: RunContext) -> list[str]:
    """What the run may still have, as its ledger says (read here, no call made); nothing once a teardown
    finished."""
    ledger = ledgers.load(ctx.store)
    if not ledger or ledger.get("torn_down") or not ledger.get("created"):
        return []
    return [
        f"{e['kind'].replace('_', ' ')} {_shown(ctx, e['kind'], e['name'])}" for e in reversed(ledger["created"])
    ] + [f"the Kubernetes objects labelled {names.RUN_LABEL}={ctx.run_id}"]


def _shown(ctx: RunContext, kind: str, name: str) -> str:
    """How ``remaining`` names a ledger entry: by its last path segment; a bucket binding by the run's Kubernetes
    ServiceAccount, whose UID its principal ends with (``plan.target.member``)."""
    last = name.rsplit("/", 1)[-1]
    return f"{names.service_account(ctx.run_id)} (UID {last})" if kind == "iam_binding" else last


def delete_created(clients: Clients, gke: Gke, compute: Compute | None, ledger: dict[str, Any], t: Target) -> list[str]:
    """Delete what the ledger says this run created, newest first (node pools go with their cluster): what a
    provision that found no capacity leaves behind."""
    deleted = []
    has_cluster = any(e["kind"] == "cluster" for e in ledger["created"])
    for entry in reversed(ledger["created"]):
        kind, name = entry["kind"], entry["name"]
        if kind == "node_pool" and not has_cluster:
            gone = gke.delete_node_pool(name)
        elif kind == "cluster":
            gone = gke.delete_cluster(name)
        elif kind in COMPUTE_KINDS.values():
            gone = (compute or clients.compute()).delete(kind, name)
        elif kind == "iam_binding":
            deleted += [d for d in clients.revoke_bucket(t) if d not in deleted]
            continue
        else:
            continue
        if gone:
            deleted.append(name)
    return deleted


def _delete_kubernetes(clients: Clients, ctx: RunContext, ledger: dict[str, Any]) -> list[str]:
    """The run's Kubernetes objects, found by the run label (the namespace is shared and kept)."""
    cluster = clients.gke().get_cluster(run_cluster(ledger, target(ctx.spec, ctx.run_id)))
    if cluster is None or not control_plane(cluster).host:
        return []
    kube, _, token = clients.kube(ctx)
    if kube is None or token is None:  # all three None, or none of them
        return []
    selector = f"{names.RUN_LABEL}={ctx.run_id}"
    _keep_postmortem(ctx, kube, cluster, token, selector)
    return kube.delete_labelled(selector, queued=queued.enabled(ctx.spec))


def _keep_postmortem(ctx: RunContext, kube: Kube, cluster: Cluster, token: AccessToken, selector: str) -> None:
    """What the cluster knew, kept in the run's store before it goes (components/platforms/postmortem.py); each
    part on its own, and none of them stops the teardown itself."""
    from components.platforms.gke.cloud import kube as gke_kube
    from components.platforms.gke.cloud import ray_jobs

    raycluster = names.raycluster(ctx.run_id)

    def ray() -> None:
        ray_token = gke_kube.ray_token(kube, ctx.run_id)
        get = ray_jobs.dashboard_get(
            control_plane(cluster), ctx.run_dir / "gke", kube.namespace, raycluster, token, ray_token
        )
        postmortem.ray_state(ctx.store, get)

    parts = {
        "the pods' statuses and events": lambda: postmortem.kubernetes(ctx.store, kube, selector, raycluster),
        "the pods' logs": lambda: postmortem.pod_logs(ctx.store, kube, kube.pods(selector)),
        "the node pools' state": lambda: postmortem.node_pools(ctx.store, _pools(ctx, cluster)),
        "Ray's state and logs": ray,
    }
    if ctx.spec.gke.queue:  # why it waited in Kueue's queue, or was evicted
        from components.platforms.gke.run import queueing

        parts["Kueue's Workload"] = lambda: queueing.keep_workload(ctx.store, kube, raycluster)
    if queued.direct(ctx.spec):  # what befell its ProvisioningRequest: failed, expired, revoked mid-run

        def request() -> None:
            from components.platforms.gke.run import readiness

            told = readiness.keep_request(ctx.store, kube, queued.request_names(ctx.spec, ctx.run_id))
            if told:
                print(f"teardown: {told}", flush=True)

        parts["the ProvisioningRequests"] = request
    for what, keep in parts.items():
        try:
            keep()
        except Exception as exc:  # noqa: BLE001 - a post-mortem never stops the teardown itself
            print(f"teardown: could not keep {what}: {str(exc)[:300]}", flush=True)


def _pools(ctx: RunContext, cluster: Cluster) -> list[dict[str, Any]]:
    """The run's node pools in ``cluster`` (all of a cluster the run owns; its labelled ones in another), as GKE
    describes them: status, message, conditions, autoscaling, size, the nodes' machine and provisioning."""
    owned = target(ctx.spec, ctx.run_id).owns_cluster
    pools = []
    for pool in cluster.node_pools:
        if not owned and pool.config.resource_labels.get(names.RUN_LABEL) != ctx.run_id:
            continue
        doc = type(pool).to_dict(pool)
        config = doc.get("config") or {}
        pools.append(
            {k: doc.get(k) for k in ("name", "status", "status_message", "conditions", "autoscaling")}
            | {k: doc.get(k) for k in ("initial_node_count", "placement_policy", "queued_provisioning")}
            | {k: config.get(k) for k in ("machine_type", "spot", "reservation_affinity")}
        )
    return pools


def _delete_cluster_or_pools(clients: Clients, ctx: RunContext, ledger: dict[str, Any]) -> list[str]:
    """The cluster the run created (by label, and as recorded); in a cluster the spec names, the run's pools."""
    t, gke, deleted = target(ctx.spec, ctx.run_id), clients.gke(), []
    parent = paths.cluster_parent(run_cluster(ledger, t))
    cluster_name = run_cluster(ledger, t)
    if not t.owns_cluster:
        if gke.get_cluster(cluster_name) is not None:
            deleted += [
                p for p in gke.pools_with_label(cluster_name, names.RUN_LABEL, ctx.run_id) if gke.delete_node_pool(p)
            ]
        return deleted
    deleted += [c for c in gke.clusters_with_label(parent, names.RUN_LABEL, ctx.run_id) if gke.delete_cluster(c)]
    # Recorded but not (yet) labelled, or in another location: the ledger finds it.
    recorded = [e["name"] for e in ledger.get("created", []) if e["kind"] == "cluster"]
    return deleted + [c for c in recorded if c not in deleted and gke.delete_cluster(c)]


def _delete_binding(clients: Clients, ctx: RunContext, ledger: dict[str, Any]) -> list[str]:
    """The run's binding on the bucket; the bucket itself is kept: it holds every run's checkpoints."""
    return clients.revoke_bucket(target(ctx.spec, ctx.run_id))


def _delete_compute(clients: Clients, ctx: RunContext, ledger: dict[str, Any]) -> list[str]:
    """The DCN networks, subnets, firewall rules and workload policy, newest first. They take no labels: the ledger
    has them, and their names derive from the run id."""
    planned = [
        (COMPUTE_KINDS[res.kind], res.path) for res in plan.resources(ctx.spec, ctx.run_id) if res.kind in COMPUTE_KINDS
    ]
    recorded = [(e["kind"], e["name"]) for e in ledger.get("created", []) if e["kind"] in COMPUTE_KINDS.values()]
    found = list(dict.fromkeys(recorded + planned))
    if not found:
        return []
    compute = clients.compute()
    return [path for kind, path in reversed(found) if compute.delete(kind, path)]
