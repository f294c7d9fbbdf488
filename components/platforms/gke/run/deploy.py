"""The creation handlers of deploy_raycluster: the run's Kubernetes objects (``k8s_records``) applied in order
through the stage's :class:`session.Session` (the namespace and DCN claim template get-or-create; the ServiceAccount
created by the run, then the run's bindings on the bucket that name it by its UID; the Hugging Face token Secret from
Secret Manager or $HF_TOKEN when the namespace has none; the Ray token Secret, which a KubeRay 1.5 generates itself),
then the RayCluster by server-side apply, waited on until every worker is available (``readiness``). Before any of it,
the check that the cluster's KubeRay serves every RayCluster field the run sets (``check_kuberay``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.platforms import redaction
from components.platforms.gke.cloud.control_plane import control_plane
from components.platforms.gke.plan import manifests as m
from components.platforms.gke.plan import queued
from components.platforms.gke.plan.records import Resource
from components.platforms.gke.run.session import Session
from components.platforms.store import read_json
from components.spec import InfraError, SpecError, names, ready_limits
from components.spec.images import pinned_image

if TYPE_CHECKING:
    from components.platforms.gke.cloud.kube import Kube

HF_TOKEN_ENV = "HF_TOKEN"
# How long a run queued in Kueue (gke.queue) waits for admission when run.deadline_h is unset.
QUEUE_WAIT_DEFAULT_H = 24.0
# How many times a queued RayCluster evicted before it was ready is waited for again (then the stage fails).
EVICTIONS_AT_START = 3
# The unschedulable grace of readiness, in seconds, over the capacity type's (components.spec.READY_LIMITS_S).
UNSCHEDULABLE_GRACE_ENV = "TPUPIPE_GKE_UNSCHEDULABLE_GRACE_S"
# The failed scale-up grace of readiness (how long the autoscaler's FailedScaleUp may repeat on nodes that come from
# zero), in seconds, over the capacity type's.
FAILED_SCALE_UP_GRACE_ENV = "TPUPIPE_GKE_FAILED_SCALE_UP_GRACE_S"
# The capacity types whose TPU nodes come from zero once the pods ask (Autopilot's too): their stockouts surface while
# the run waits for its RayCluster (``readiness.Stockout``), and the capacity ladder moves on from them.
FROM_ZERO = ("flex-start", "queued")
# How often readiness reads the run's TPU node pools from GKE (at most; one call per pool): their status changes on
# the autoscaler's minutes, not the pods' seconds.
POOLS_EVERY_S = 30.0


def _kube(s: Session) -> Kube:
    kube: Kube | None
    kube, cluster, _ = s.client("kube")
    if kube is None:
        raise InfraError(f"no running cluster {s.t.cluster} for run {s.ctx.run_id}: provision did not finish")
    s.cluster = cluster
    return kube


def k8s_object(s: Session, res: Resource) -> None:
    kube = _kube(s)
    if res.kind == "k8s/Namespace":
        kube.ensure_namespace()
    else:
        kube.ensure(res.body)


# Where the ledger keeps the UID of the Kubernetes ServiceAccount the run created (``service_account``), and the
# random mark it put on it before creating it (the annotation ``SERVICE_ACCOUNT_MARK``): a retried stage that never
# read the UID (its read failed, its task was preempted, its create's retry met the account its first try made)
# knows the account by the mark, which no one else could have put there.
SERVICE_ACCOUNT_UID_KEY = "service_account_uid"
SERVICE_ACCOUNT_MARK_KEY = "service_account_mark"
SERVICE_ACCOUNT_MARK = "tpupipe.dev/created-by-run"


def service_account(s: Session, res: Resource) -> None:
    """The run's Kubernetes ServiceAccount, created by this run: its UID, which the run's bucket bindings name
    (``plan.target.member``), recorded in the ledger at once. One of that name that was there already is used only
    when its UID is the one recorded (this run made it, a retried stage finds it); any other was made by someone
    else, who would get the run's bucket access through it, and is refused before any binding names it."""
    import copy
    import secrets

    kube, name = _kube(s), res.body["metadata"]["name"]
    mark = s.ledger.get(SERVICE_ACCOUNT_MARK_KEY) or secrets.token_hex(16)
    if SERVICE_ACCOUNT_MARK_KEY not in s.ledger:
        s.record_value(SERVICE_ACCOUNT_MARK_KEY, mark)  # before the create: a retry knows what its first try made
    body = copy.deepcopy(res.body)
    body["metadata"].setdefault("annotations", {})[SERVICE_ACCOUNT_MARK] = mark
    created = kube.ensure(body)
    uid, annotations = kube.service_account_uid(name)
    ours = created or annotations.get(SERVICE_ACCOUNT_MARK) == mark or s.ledger.get(SERVICE_ACCOUNT_UID_KEY) == uid
    if ours and s.ledger.get(SERVICE_ACCOUNT_UID_KEY) != uid:
        s.record_value(SERVICE_ACCOUNT_UID_KEY, uid)
    if not ours:
        raise SpecError(
            "run_id",
            f"the Kubernetes ServiceAccount {s.t.namespace}/{name} already exists and this run did not create it: "
            "the run's bucket access goes to its ServiceAccount, so whoever made that one would get it",
            ["a new run id", f"delete ServiceAccount {name} in namespace {s.t.namespace} if it is no one's"],
        )
    s.service_account_uid = uid


def secret(s: Session, res: Resource) -> None:
    import base64

    from components.platforms.gke.cloud import kube as gke_kube

    kube, t, run_id = _kube(s), s.t, s.ctx.run_id
    if kube.secret(res.name) is not None:
        return
    if res.name == names.ray_token_secret(run_id):
        if s.kuberay_generates_token:  # KubeRay 1.5 makes the token's Secret itself (check_kuberay): none of ours
            secret = gke_kube.generated_token_secret(names.raycluster(run_id))
            s.log(f"KubeRay 1.5 generates the Ray token in Secret {secret} with the RayCluster: the run reads it there")
            return
        kube.ensure(gke_kube.ray_token_secret(res.name, t.namespace, names.labels(run_id), gke_kube.new_ray_token()))
        return
    # The run's own copy: the namespace's Secret (shared by its runs, the user's) is read, never labelled with the
    # run, so no run's teardown deletes what another run's pods still mount.
    shared = s.ctx.spec.gke.hf_secret
    source = s.ctx.spec.gke.hf_token_secret
    found = kube.secret(shared)
    if found is not None and found.get(m.HF_TOKEN_KEY):
        value = found[m.HF_TOKEN_KEY].encode()
    elif source:
        from components.cloud import secrets

        value = secrets.read(source, s.client("creds"))
        redaction.register(value)
    else:
        value = os.environ.get(HF_TOKEN_ENV, "").encode()
    if not value:
        raise SpecError(
            "gke.hf_secret",
            f"no Secret {shared} (key {m.HF_TOKEN_KEY}) in namespace {t.namespace}, no gke.hf_token_secret and "
            f"${HF_TOKEN_ENV} is not set: name the token's secret in Secret Manager "
            "(gke.hf_token_secret), or gke.hf_secret= (empty) for models that need none",
        )
    kube.ensure(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": res.name, "namespace": t.namespace, "labels": names.labels(run_id)},
            "data": {m.HF_TOKEN_KEY: base64.b64encode(value).decode()},
        }
    )


def _pinned(s: Session, body: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster with its pods pulling the trainer image by the digest build_image recorded (a tag can move
    between the build and a pod's start, or a restarted pod's), or by tag, said, when the run has no digest (an image
    named by gke.image without one)."""
    import copy

    build = (read_json(s.ctx.store, "stages/build_image.json") or {}).get("result") or {}
    pinned = pinned_image(build)
    if pinned is None:
        s.log(
            f"warning: the pods pull {s.t.image} by tag, which can move: name gke.image as NAME@sha256:DIGEST to pin "
            "what they run"
        )
        return body
    body = copy.deepcopy(body)
    for container in _containers(body):
        if container["image"] == s.t.image:
            container["image"] = pinned
    s.log(f"the pods pull the trainer image by digest: {pinned}")
    return body


def _containers(raycluster: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [raycluster["spec"]["headGroupSpec"], *raycluster["spec"].get("workerGroupSpecs", [])]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def raycluster(s: Session, res: Resource) -> None:
    kube = _kube(s)
    body = _pinned(s, res.body)
    if s.kuberay_generates_token:  # KubeRay 1.5: token mode without secretName (its CRD has none to name ours in)
        body = {**body, "spec": {**body["spec"], "authOptions": {"mode": body["spec"]["authOptions"]["mode"]}}}
    kube.apply(body)
    queue_wait = _admission(s, kube, res.name) if s.t.queue else None
    ready, capacity_wait, queue_wait = _until_ready(s, kube, res.name, queue_wait)
    status = ready.get("status", {})
    s.log(
        f"RayCluster {res.name} ready: {status.get('availableWorkerReplicas')} of "
        f"{status.get('desiredWorkerReplicas')} workers available"
    )
    _verify_ray_auth(s, res.name)
    s.deploy_result = {
        "raycluster": res.name,
        "namespace": s.t.namespace,
        "endpoint": control_plane(s.cluster).host,
        "available_workers": status.get("availableWorkerReplicas"),
        "images": sorted({c["image"] for c in _containers(ready)}),  # as the API server holds the RayCluster
        "capacity_wait": capacity_wait,  # when its pods waited for nodes (the goodput ledger's "waiting for capacity")
        "queue_wait": queue_wait,  # when it waited in Kueue's queue for admission (gke.queue), also not billed
    }


def _until_ready(
    s: Session, kube: Kube, name: str, queue_wait: tuple[float, float] | None
) -> tuple[dict[str, Any], tuple[float, float] | None, tuple[float, float] | None]:
    """Wait until every worker of the RayCluster is available (``readiness``); one of a queued run evicted on its way
    is waited for in the queue again, up to EVICTIONS_AT_START times. Returns the RayCluster as ready, when its pods
    waited for nodes, and when it waited in the queue (the first admission's start to the last one's end)."""
    from components.platforms.gke.run import readiness

    spec = s.ctx.spec
    limits = ready_limits(spec)
    grace = float(os.environ.get(UNSCHEDULABLE_GRACE_ENV, limits.unschedulable_grace_s))
    failed_grace = float(os.environ.get(FAILED_SCALE_UP_GRACE_ENV, limits.failed_scale_up_grace_s))
    s.log(
        f"waiting up to {limits.deadline_s:.0f}s ({limits.by}) for RayCluster {name}; pods "
        f"unschedulable with no scale-up under way fail it after {grace:.0f}s"
        + (
            f"; a FailedScaleUp, after {failed_grace:.0f}s of retries"
            if failed_grace
            else "; a FailedScaleUp at once (a fixed pool)"
        )
    )
    for evictions in range(EVICTIONS_AT_START + 1):
        try:
            with kube.retrying.within(limits.deadline_s):  # a transient API error is retried, never past the deadline
                ready, capacity_wait = readiness.wait_ready(
                    kube,
                    name,
                    limits.deadline_s,
                    unschedulable_grace_s=grace,
                    failed_scale_up_grace_s=failed_grace,
                    requests=tuple(queued.request_names(spec, s.ctx.run_id)),
                    from_zero=spec.cluster.capacity in FROM_ZERO or s.t.autopilot,
                    poll_s=min(s.poll_s, 2.0),
                    log=s.log,
                    evicted=_eviction(kube, name) if s.t.queue else None,
                    pools=None if s.t.autopilot else _pool_states(s),
                    pools_every_s=min(POOLS_EVERY_S, s.poll_s * 10),
                )
            return ready, capacity_wait, queue_wait
        except readiness.Evicted as exc:  # preempted before it was ready: it waits in the queue again
            if evictions == EVICTIONS_AT_START:
                raise
            s.log(f"{exc}; waiting for Kueue to admit it again")
            again = _admission(s, kube, name)
            queue_wait = (queue_wait[0] if queue_wait else again[0], again[1])
    raise AssertionError("unreachable: the last eviction is raised")


def readmitted(s: Session, name: str) -> dict[str, Any]:
    """A queued RayCluster Kueue evicted while the run's jobs ran, back: admitted again (within what is left of the
    run's deadline, ``_admission``) and ready (``_until_ready``), as deploy_raycluster waited for it first. Its waits
    (``queue_wait``, ``capacity_wait``: (since, until) epoch seconds, or None) and when it was ready again."""
    import time

    kube = _kube(s)
    ready, capacity_wait, queue_wait = _until_ready(s, kube, name, _admission(s, kube, name))
    status = ready.get("status", {})
    s.log(
        f"RayCluster {name} ready again: {status.get('availableWorkerReplicas')} of "
        f"{status.get('desiredWorkerReplicas')} workers available"
    )
    waits = {"queue_wait": queue_wait, "capacity_wait": capacity_wait}
    return {**{k: list(v) if v else None for k, v in waits.items()}, "ready_at": time.time()}


def _queue_timeout(s: Session) -> tuple[float, str]:
    """What is left of the run's deadline (run.deadline_h, from its first stage's start), or QUEUE_WAIT_DEFAULT_H."""
    import time

    deadline_h = s.ctx.spec.run.deadline_h
    if deadline_h is None:
        return QUEUE_WAIT_DEFAULT_H * 3600, f"run.deadline_h is unset: {QUEUE_WAIT_DEFAULT_H:g} h"
    records = [read_json(s.ctx.store, f"stages/{stage}.json") or {} for stage in ("snapshot_data", "provision")]
    started = min((r["started"] for r in records if r.get("started") is not None), default=time.time())
    return max(0.0, started + deadline_h * 3600 - time.time()), f"run.deadline_h={deadline_h:g}"


def _pool_states(s: Session) -> Callable[[], dict[str, tuple[str, str]]]:
    """What GKE reports of the run's TPU node pools (short name -> (status, statusMessage)), for readiness to watch:
    a pool RUNNING_WITH_ERROR is reported with its message (``readiness.POOL_WITH_ERROR``); a pool gone is left out."""
    from components.platforms.gke.cloud.clients import load_ledger, run_cluster
    from components.platforms.gke.plan import paths

    cluster = run_cluster(load_ledger(s.ctx), s.t)
    pools = [names.tpu_node_pool(s.t.run_id, i) for i in range(s.ctx.spec.cluster.num_slices)]

    def states() -> dict[str, tuple[str, str]]:
        from google.api_core import exceptions as gexc

        try:
            found = {pool: s.client("gke").get_node_pool(paths.node_pool_path(cluster, pool)) for pool in pools}
        except gexc.GoogleAPICallError as exc:  # a look, not the wait itself: the pods still say how it goes
            s.log(f"  could not read the TPU node pools this time ({str(exc)[:200]}); the wait goes on")
            return {}
        return {pool: (p.status.name, p.status_message) for pool, p in found.items() if p is not None}

    return states


def _eviction(kube: Kube, name: str) -> Callable[[], str | None]:
    from components.platforms.gke.run import queueing

    return lambda: queueing.evicted(kube, name)


def _admission(s: Session, kube: Kube, name: str) -> tuple[float, float]:
    """Wait for Kueue to admit the RayCluster (``queueing``), within the run's deadline."""
    from components.platforms.gke.run import queueing

    timeout_s, by = _queue_timeout(s)
    s.log(f"RayCluster {name} queued in Kueue LocalQueue {s.t.queue}: waiting up to {timeout_s:.0f}s ({by})")
    try:
        return queueing.wait_admitted(kube, name, s.t.queue, timeout_s, poll_s=min(s.poll_s, 2.0), log=s.log)
    except queueing.QueueDeadline as exc:
        raise InfraError(str(exc)) from None


def _verify_ray_auth(s: Session, raycluster: str) -> None:
    """Fail closed unless the Ray cluster refuses a request without its token: a Ray too old for token
    authentication, or an image that turns it off, would otherwise run every job unauthenticated without a word."""
    from components.platforms.gke.cloud import ray_jobs

    kube, cluster, token = s.client("kube")
    status = ray_jobs.unauthenticated_status(
        control_plane(cluster), s.ctx.run_dir / "gke", kube.namespace, raycluster, token
    )
    if status not in (401, 403):
        raise InfraError(
            f"RayCluster {raycluster} answered a request without its Ray token with HTTP {status}, not 401: its "
            "token authentication is off (a Ray older than token authentication in the image, or RAY_AUTH_MODE "
            "set in it); no job is sent to it. Use an image with the Ray of the plan "
            "(components.platforms.gke.plan.resources.RAY_VERSION)"
        )
    s.log(f"RayCluster {raycluster}: a request without the Ray token is refused ({status}): token authentication on")


# How long provision waits for the RayCluster CRD to be served after it created the cluster or enabled the Ray
# Operator add-on (GKE installs KubeRay with the add-on; its docs give no time): a bound, then a clear error.
KUBERAY_CRD_WAIT_S = 300.0


def check_kuberay(s: Session, wait_s: float = 0.0) -> None:
    """The cluster's KubeRay serves every RayCluster field the run sets: checked by provision as soon as the cluster
    exists (before any TPU node pool; ``wait_s`` for a CRD not served yet, on a cluster just made or given the add-on)
    and again by deploy_raycluster before it applies anything (the cluster may have changed). A KubeRay 1.5 generates
    the Ray token itself (``kube.generates_ray_token``): deploy then makes no token Secret of its own and names none in
    the RayCluster."""
    from components.platforms.gke.cloud import kube as gke_kube
    from components.platforms.waiting import DeadlineExceeded, wait_for

    kube = _kube(s)
    crd = kube.crd(gke_kube.RAYCLUSTER_CRD)
    if crd is None and wait_s:
        s.log(f"waiting up to {wait_s:.0f}s for cluster {s.t.cluster} to serve KubeRay's RayCluster")
        try:
            crd = wait_for(
                lambda: kube.crd(gke_kube.RAYCLUSTER_CRD),
                timeout_s=wait_s,
                interval_s=min(s.poll_s * 10, 5.0),
                what="KubeRay",
            )
        except DeadlineExceeded:
            crd = None
    refusal = gke_kube.kuberay_refusal(crd, s.t.cluster, s.t.owns_cluster)
    if refusal is not None:
        raise refusal
    s.kuberay_generates_token = crd is not None and gke_kube.generates_ray_token(crd)  # no CRD: refused above
