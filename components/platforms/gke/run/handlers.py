"""The creation handlers of provision and build_image: one per kind of the plan's records (``records``), each
applying its record get-or-create through the stage's :class:`session.Session`, recording what it creates in the
run's ledger before it waits on it. Provision's: the Compute Engine resources (DCN networks, subnets, firewall rules,
the TPU7x workload policy), the checkpoint bucket, the GKE cluster (created, or the existing one named, what it lacks
that GKE enables in place enabled first: ``features``) and its node pools; build_image's: the Artifact Registry
repository, the build context and the Cloud Build of the trainer image; deploy_raycluster's: the bindings of the run's
Kubernetes ServiceAccount on the bucket.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from components.platforms.gke.plan import features, paths
from components.platforms.gke.plan import resources as r
from components.platforms.gke.plan.compute_resources import COMPUTE_KINDS, dcn_range_overlap
from components.platforms.gke.plan.records import WITH_THE_CLUSTER, Resource
from components.platforms.gke.run import deploy
from components.platforms.gke.run.session import Session
from components.spec import SpecError, names
from components.workload import derive as d


def compute_resource(s: Session, res: Resource) -> None:
    s.client("compute").ensure(COMPUTE_KINDS[res.kind], res.path, res.body, s.record)


def cloud_nat(s: Session, res: Resource) -> None:
    """The run's Cloud Router and NAT gateway, unless the network already has a gateway in the region that serves
    every subnetwork: that one serves the run's subnetwork too, and Compute takes no other gateway beside it
    (``compute.NETWORK_WIDE``), so it is used and nothing is created (teardown then deletes nothing of it)."""
    from components.platforms.gke.cloud import compute
    from components.platforms.gke.plan import network

    adapter = s.client("compute")
    listed = adapter.call(
        f"list routers in {s.t.region}",
        lambda: compute.network_routers(adapter.client.routers, s.t.project, s.t.region, network.DEFAULT_NETWORK),
    )
    wide = compute.network_wide_nat(listed, other_than=res.name)
    if wide:
        s.log(f"{res.name}: not created: Cloud NAT {wide} already serves every subnetwork of the default network")
        return
    compute_resource(s, res)


def bucket(s: Session, res: Resource) -> None:
    s.client("storage").ensure_bucket(s.t.bucket, s.t.region, d.commits_by_directory_rename(s.ctx.spec))


def binding(s: Session, res: Resource) -> None:
    """The run's binding the record's body names (its own prefix, or the cache prefix read-only: ``plan.target``), for
    the Kubernetes ServiceAccount the walk created just before, by its UID (``deploy.service_account``)."""
    if not s.service_account_uid:
        raise AssertionError("the run's bindings name its ServiceAccount, which the plan creates before them")
    _, who = s.clients.bucket_member(s.t, s.service_account_uid, s.client("creds"))
    s.record("iam_binding", who)
    s.client("storage").add_binding(s.t.bucket, res.body["role"], who, res.body["condition"])


def exclusion_window(body: dict[str, Any], deadline_h: float | None) -> None:
    """The plan's maintenance exclusion (``resources.RUN_EXCLUSION``) from now to the run's deadline."""
    from datetime import UTC, datetime, timedelta

    from components.platforms.gke.plan.resources import EXCLUSION_HOURS

    now = datetime.now(UTC).replace(microsecond=0)
    end = now + timedelta(hours=deadline_h or EXCLUSION_HOURS)
    for window in body.get("maintenancePolicy", {}).get("window", {}).get("maintenanceExclusions", {}).values():
        window["startTime"], window["endTime"] = (t.isoformat().replace("+00:00", "Z") for t in (now, end))


def cluster(s: Session, res: Resource) -> None:
    gke = s.client("gke")
    enable: list[Any] = []
    if res.action == "create":
        body = s.node_body(res.body)
        if s.ledger.get("cluster_version"):  # gke.cluster_version as preflight resolved it (a minor: its newest patch)
            body["initialClusterVersion"] = s.ledger["cluster_version"]
        if s.ledger.get("release_channel"):  # on the most stable channel that offers it
            body["releaseChannel"] = {"channel": s.ledger["release_channel"]}
        exclusion_window(body, s.ctx.spec.run.deadline_h)
        s.cluster = gke.ensure_cluster(s.t.parent, body, s.record)
    else:
        s.cluster = gke.get_cluster(res.path)
        if s.cluster is None:
            raise SpecError("gke.cluster_name", f"no cluster {s.t.cluster} in {s.t.location} of project {s.t.project}")
        refused = features.refusals(s.ctx.spec, s.cluster, s.t.project)
        if refused:  # preflight refuses these first; the cluster may have changed since
            raise SpecError("gke.cluster_name", f"cluster {s.t.cluster} in {s.t.location} lacks " + "; ".join(refused))
        enable = features.to_enable(s.ctx.spec, s.cluster, s.t.project)
        if enable:
            gke.enable(res.path, enable, s.t.project)
            s.cluster = gke.get_cluster(res.path)
    _check_cluster_as_reported(s)
    # KubeRay's version, as soon as the cluster exists: before any TPU node pool is created (deploy checks again).
    # A cluster just made, or just given the Ray Operator add-on, may take a while to serve its CRD.
    just_installed = res.action == "create" or "Ray Operator add-on" in [f.name for f in enable]
    deploy.check_kuberay(s, wait_s=deploy.KUBERAY_CRD_WAIT_S if just_installed else 0.0)


def _check_cluster_as_reported(s: Session) -> None:
    """Before any node pool: the version GKE reports for the cluster reaches the floors of the slice's family and of
    managed DRANET, and the Pod and Service ranges it reports overlap no DCN subnet. A SpecError names the field to
    change: gke.cluster_version (or gke.pod_range, gke.service_range) for a cluster the run made, gke.cluster_name
    for an existing one."""
    from components.workload import checks

    spec, cluster, owns = s.ctx.spec, s.cluster, s.t.owns_cluster
    version = cluster.current_master_version
    missed = checks.floor_missed(spec, version) if version else None
    if missed:
        floor, feature = missed
        raise SpecError(
            "gke.cluster_version" if owns else "gke.cluster_name",
            f"cluster {s.t.cluster} runs GKE {version}, older than {floor}, the first "
            f"{spec.gke.cluster_mode} version with {feature}",
            [f">= {floor}"] if owns else [f"a cluster at GKE >= {floor}", "empty: the run creates one"],
        )
    overlap = dcn_range_overlap(spec, s.t, {"Pod": cluster.cluster_ipv4_cidr, "Service": cluster.services_ipv4_cidr})
    if overlap:
        which, value, cidr = overlap
        field = f"gke.{which.lower()}_range" if owns else "gke.cluster_name"
        raise SpecError(
            field,
            f"cluster {s.t.cluster}'s {which} range {value} overlaps the DCN subnet {cidr}",
            [f"a {which} range that overlaps no DCN subnet"]
            if owns
            else ["a cluster whose ranges overlap no DCN subnet", "empty: the run creates one"],
        )


def node_pool(s: Session, res: Resource) -> None:
    if res.api == WITH_THE_CLUSTER:
        return  # the cluster's body carries it
    slice_pool = names.SLICE_LABEL in res.body["config"].get("labels", {})
    s.client("gke").ensure_node_pool(paths.node_pool_cluster(res.path), s.node_body(res.body), s.record, slice_pool)
    if slice_pool:
        s.tpu_pools.append(res.name)


def autopilot_nodes(s: Session, res: Resource) -> None:
    s.log(f"{res.name}: Autopilot makes the TPU nodes when the worker pods ask for them")


def kueue_queue(s: Session, res: Resource) -> None:
    s.log(f"{res.name}: the run's RayCluster waits in this Kueue LocalQueue (preflight checked it and its quota)")


def repository(s: Session, res: Resource) -> None:
    s.client("registry").ensure(s.t.project, s.t.region, s.ctx.spec.gke.artifact_repository)


def build_source(s: Session, res: Resource) -> None:
    """The build context, uploaded to the run's bucket, got or created first: build_image runs beside provision, which
    gets or creates the same bucket (the one of the two that comes second finds it). An image built before from the
    same context (its content tag in the repository: ``build.content_image``) is reused, and nothing is uploaded."""
    from components.cloud import build as gke_build

    context = gke_build.build_context(d.trainer_image(s.ctx.spec))
    s.content_image = gke_build.content_image(s.t.image, context)
    s.reused_digest = gke_build.tag_digest(s.client("registry"), s.content_image)
    if s.reused_digest:
        return
    s.client("storage").ensure_bucket(s.t.bucket, s.t.region, d.commits_by_directory_rename(s.ctx.spec))
    s.build_source_generation = s.client("storage").upload(
        s.t.bucket, names.build_source(s.ctx.run_id), context, content_type="application/gzip"
    )


def image(s: Session, res: Resource) -> None:
    if res.action == "use":
        s.log(f"trainer image: {res.name} (gke.image)")
        s.image_result = {"image": res.name, "built": False}
        return
    if s.reused_digest:  # the same programs, so the same compile cache key (components/workload/cache.py)
        s.log(f"trainer image: {s.content_image}@{s.reused_digest}, built before from the same sources: reused")
        s.image_result = {"image": s.content_image, "built": False, "reused": True, "digest": s.reused_digest}
        return
    from components.cloud import build as gke_build

    builder = gke_build.CloudBuild(
        gke_build.client(s.client("creds")),
        s.t.project,
        s.t.region,
        log=s.log,
        poll_s=min(s.poll_s, 10.0),
    )
    # The build is not written to the ledger: teardown deletes no build, and a retried stage finds it by its tag.
    build = builder.ensure(
        gke_build.pinned_source(res.body, s.build_source_generation),
        names.build_tag(s.ctx.run_id),
        _unrecorded,
        timeout_s=r.BUILD_TIMEOUT_S + 600,
        stop=_provision_ended_badly(s, time.time()),
    )
    digest = build.results.images[0].digest if build.results.images else ""
    if digest:  # later runs of the same sources find it by this tag
        gke_build.add_tag(s.client("registry"), s.content_image, digest)
    s.image_result = {"image": res.name, "built": True, "build": build.id, "digest": digest}


def _unrecorded(kind: str, name: str) -> None:
    """What build_image records in the ledger: nothing (see ``image``)."""


# How long before build_image's own start a provision record may have started and still be this run's: the two
# tasks start together (on Vertex AI within moments of each other); an older record is a previous attempt's.
SAME_RUN_S = 600.0


def _provision_ended_badly(s: Session, started: float) -> Callable[[], str | None]:
    """``stop`` for the image build: why to cancel it, once provision (which runs beside it) failed or was
    interrupted; then nothing will deploy the image, and the exit handler's teardown waits for this task to end."""
    from components.platforms.store import read_json

    def stop() -> str | None:
        rec = read_json(s.ctx.store, "stages/provision.json") or {}
        if rec.get("status") in ("failed", "interrupted") and rec.get("started", 0) >= started - SAME_RUN_S:
            return f"provision {rec['status']} ({rec.get('error', '')[:300]})"
        return None

    return stop
