"""A stage of the gke platform as a walk of the plan: the stage's records (``plan.resources``, in creation order)
applied through one handler per kind (``HANDLERS``: ``handlers`` for provision and build_image, ``deploy`` for
deploy_raycluster), after the stage's checks of what is there (``BEFORE``); every handler records what it creates in
the run's ledger before it waits on it. A walk that finds no capacity or quota ends with one message naming what,
where and what to try (``capacity_message``).
"""

from __future__ import annotations

from components.platforms import RunContext
from components.platforms.gke.cloud.clients import Clients
from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import paths
from components.platforms.gke.plan.compute_resources import COMPUTE_KINDS
from components.platforms.gke.plan.records import Resource
from components.platforms.gke.plan.target import Target
from components.platforms.gke.run import deploy, handlers
from components.platforms.gke.run.session import Session
from components.spec import RunSpec
from components.workload import derive as d

# The checks a stage makes of what is there before it walks its records.
BEFORE = {"deploy_raycluster": deploy.check_kuberay}  # provision's checks are its preflight

# Plan kind -> the handler that creates (or gets) it: one per kind the plan can list (a test holds them equal).
HANDLERS = {
    "vpc-network": handlers.compute_resource,
    "subnetwork": handlers.compute_resource,
    "firewall-rule": handlers.compute_resource,
    "workload-policy": handlers.compute_resource,
    "cloud-nat": handlers.cloud_nat,
    "gcs-bucket": handlers.bucket,
    "iam-binding": handlers.binding,
    "gke-cluster": handlers.cluster,
    "node-pool": handlers.node_pool,
    "autopilot-tpu-nodes": handlers.autopilot_nodes,
    "kueue-queue": handlers.kueue_queue,
    "artifact-repository": handlers.repository,
    "build-source": handlers.build_source,
    "container-image": handlers.image,
    "k8s/Namespace": deploy.k8s_object,
    "k8s/ServiceAccount": deploy.service_account,
    "k8s/ResourceClaimTemplate": deploy.k8s_object,
    "k8s/NetworkPolicy": deploy.k8s_object,
    "k8s/PodTemplate": deploy.k8s_object,
    "k8s/ProvisioningRequest": deploy.k8s_object,
    "k8s/Secret": deploy.secret,
    "k8s/RayCluster": deploy.raycluster,
}


def stage_records(ctx: RunContext, stage: str) -> list[Resource]:
    """The plan's records that ``stage`` creates, in plan order: what the stage applies and the dry run prints."""
    return [res for res in plan.resources(ctx.spec, ctx.run_id) if res.stage == stage]


def walk(ctx: RunContext, stage: str, clients: Clients) -> Session:
    """Apply the stage's records in order through each kind's handler, after the stage's checks of what is there
    (``BEFORE``); every handler records what it creates in the ledger before it waits on it. A CapacityError names
    the record that had no capacity or quota (``resource``)."""
    from components.platforms.gke.cloud.cluster import CapacityError

    session = Session(ctx, clients)
    if stage in BEFORE:
        BEFORE[stage](session)
    for res in stage_records(ctx, stage):
        try:
            HANDLERS[res.kind](session, res)
        except CapacityError as exc:
            exc.resource = res  # the message names what had no capacity or quota
            raise
    return session


def capacity_message(spec: RunSpec, t: Target, exc: Exception, res: Resource | None) -> str:
    """One error naming what had no capacity or quota, where, and what to try; nothing the run created is left."""
    shape = d.slice_shape(spec)
    if res is not None and res.kind in COMPUTE_KINDS:
        kind = COMPUTE_KINDS[res.kind]
        where = "" if paths.COMPUTE_COLLECTIONS[kind][0] == "global" else f" in {t.region}"
        return (
            f"no quota for the {kind.replace('_', ' ')} {res.name}{where} of project {t.project}: {exc}. "
            "Nothing this run created is left. Raise the quota"
            + (
                ", or use gke.multislice_network=accelerator_network_profile (no extra networks)."
                if res.kind != "workload-policy"
                else "."
            )
        )
    return (
        f"no capacity for {spec.cluster.num_slices} x {shape.num_chips} {shape.family.name} chips "
        f"({spec.cluster.num_slices * shape.num_hosts} x {shape.machine_type}, topology {shape.topology}, "
        f"{spec.cluster.capacity}) in zone {t.zone}: {exc}. Nothing this run created is left. Try another zone "
        f"(gke.zone, or several in gke.zones), another capacity type (cluster.capacity=spot, reservation, "
        "flex-start or queued, or a ladder of them) or later."
    )
