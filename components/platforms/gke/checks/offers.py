"""Preflight's checks against what the run's location offers (``preflight`` runs them with its own): the GKE version
a cluster the run creates gets, on its release channel (``versions``); the machine types of its node pools in their
zone (Compute Engine ``machineTypes.get``: TPU machine types are offered only in some zones, Cloud TPU docs, "TPU
regions and zones", https://cloud.google.com/tpu/docs/regions-zones, and CPU machine series vary by zone, Compute
Engine docs, "Regions and zones", https://cloud.google.com/compute/docs/regions-zones#available); and the VPC network
``default`` the cluster it creates is attached to (its body names no network: "If left unspecified, the ``default``
network will be used", the ``Cluster.network`` field's comment in google-cloud-container; an organisation with the
``compute.skipDefaultNetworkCreation`` constraint has none). The same ``machineTypes.get`` says each machine's vCPUs
and memory: a pod that asks for more than a node of its pool can give (``fits``) never schedules, and its pool bills.

Each check is ``check(needs, spec, creds, report)``: read-only calls, problems and findings added to the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from components.platforms.gke.checks import versions
from components.platforms.gke.checks.findings import Problem, Report
from components.platforms.gke.plan import network
from components.platforms.gke.plan.candidates import flex_start_refusal
from components.platforms.gke.plan.needs import Needs
from components.platforms.gke.plan.resources import RELEASE_CHANNEL
from components.spec import RunSpec
from components.tpu import catalogue

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import compute_v1


def version(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """The version and release channel a cluster the run creates gets: ``gke.cluster_version`` resolved on the most
    stable channel offering it (``versions.choose``, from ClusterManager ``getServerConfig``); a pin GKE no longer
    offers is a problem naming those it does."""
    if not n.location:
        return
    from components.platforms.gke.cloud.cluster import cluster_manager

    config = cluster_manager(creds).get_server_config(name=f"projects/{n.project}/locations/{n.location}")
    resolved, channel, offer = versions.choose(n.cluster_version, config)
    if not resolved:
        report.problems.append(
            Problem(
                "gke.cluster_version",
                f"GKE {n.cluster_version or 'default'} is not offered on any release channel in {n.location} (a "
                f"pinned version retires); offered on {RELEASE_CHANNEL}: {', '.join(offer.versions) or 'none'}: pin "
                "one, or a minor (e.g. 1.35) for its newest patch",
            )
        )
        return
    report.version, report.channel = resolved, channel
    asked = f"gke.cluster_version={n.cluster_version}" if n.cluster_version else "the channel's default"
    report.checked.append(f"GKE {resolved} on the {channel} channel in {n.location} ({asked})")


def machine_types(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """Every node pool's machine type is offered in its zone; one that is not is a problem naming the field."""
    if not n.machine_types:
        return
    from google.api_core import exceptions as gexc

    from components.platforms.gke.cloud.compute import client as compute_client

    client = compute_client("MachineTypesClient", creds)
    family = spec.cluster.accelerator
    offered = []
    for zone, machine, field in n.machine_types:
        try:
            offer = client.get(project=n.project, zone=zone, machine_type=machine)
        except gexc.NotFound:
            hint = (
                "choose a machine type of a series the zone offers"
                if field == "gke.cpu_machine_type"
                else f"choose a zone that offers {spec.cluster.accelerator} ({', '.join(catalogue.zones(family))})"
            )
            report.problems.append(
                Problem(field, f"machine type {machine} is not offered in zone {zone} of project {n.project}: {hint}")
            )
            continue
        offered.append(machine)
        fits(spec, machine, offer.guest_cpus, offer.memory_mb, tpu=field == "gke.zone", report=report)
    if offered:
        report.checked.append(f"machine types offered in {n.zone}: {', '.join(offered)}")


def flex_start(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """``cluster.capacity=flex-start`` only in a zone that offers it for the family (``candidates.FLEX_START_ZONES``);
    no call: the zones are documented, not served by an API."""
    refusal = flex_start_refusal(spec)
    if refusal:
        report.problems.append(Problem("cluster.capacity", refusal))
    elif spec.cluster.capacity == "flex-start":
        report.checked.append(f"flex-start offered for {spec.cluster.accelerator} in {n.zone}")


def default_network(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """A cluster the run creates is attached to the project's ``default`` network: it must exist."""
    if not n.location:
        return
    from google.api_core import exceptions as gexc

    from components.platforms.gke.cloud.compute import client as compute_client

    try:
        compute_client("NetworksClient", creds).get(project=n.project, network="default")
    except gexc.NotFound:
        report.problems.append(
            Problem(
                "gke.cluster_name",
                f"project {n.project} has no VPC network 'default', which the cluster the run creates is attached "
                "to (organisations with constraints/compute.skipDefaultNetworkCreation have none): create it "
                f"(`gcloud compute networks create default --subnet-mode=auto --project {n.project}`) or name an "
                "existing cluster",
            )
        )
        return
    report.checked.append(f"VPC network default in project {n.project}")
    _way_out(n, compute_client("RoutersClient", creds), report)


def _way_out(n: Needs, routers_client: compute_v1.RoutersClient, report: Report) -> None:
    """The default network's Cloud Routers in the region: a NAT gateway there that serves every subnetwork serves the
    run's nodes too (a way to the internet for a run that needs none: a warning; the one a run that needs it uses,
    creating none); else a run that needs its own router needs room for it (``network.ROUTERS_PER_NETWORK``)."""
    from components.platforms.gke.cloud.compute import network_routers, network_wide_nat

    routers = network_routers(routers_client, n.project, n.region, network.DEFAULT_NETWORK)
    wide = network_wide_nat(routers, other_than=n.nat_router)
    if wide and not n.nat_router:
        report.warnings.append(network.network_wide_nat_risk(wide, n.region))
    elif wide:
        report.checked.append(f"Cloud NAT {wide} serves every subnetwork of the default network: the run uses it")
    elif n.nat_router:
        others = [r.name for r in routers if r.name != n.nat_router]
        if len(others) >= network.ROUTERS_PER_NETWORK:
            report.problems.append(Problem("VPC network default", network.routers_full(others, n.region)))
            return
        report.checked.append(f"routers of the default network in {n.region}: {len(others)}, room for {n.nat_router}")


# What GKE keeps of a node for itself, so pods get the rest ("allocatable"): GKE docs, "Plan GKE Standard node sizes",
# memory and CPU reservations (https://cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes): of memory,
# 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112 and 2% above 128 GiB, plus a
# 100 MiB eviction threshold; of CPU, 6% of the first core, 1% of the next, 0.5% of the next 2 and 0.25% above 4.
MEMORY_RESERVED = ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02))  # (GiB of the band, share)
CPU_RESERVED = ((1, 0.06), (1, 0.01), (2, 0.005), (float("inf"), 0.0025))  # (cores of the band, share)
EVICTION_GIB = 100 / 1024


def allocatable(total: float, bands: tuple[tuple[float, float], ...]) -> float:
    """``total`` less what GKE reserves of it, band by band."""
    left, reserved = total, 0.0
    for size, share in bands:
        taken = min(left, size)
        reserved, left = reserved + taken * share, left - taken
    return total - reserved


def fits(spec: RunSpec, machine: str, cpus: int, memory_mb: int, *, tpu: bool, report: Report) -> None:
    """A pod of the pool (a TPU worker, one per host; or the Ray head) fits on one of its nodes: its CPU and memory
    requests within the node's allocatable, else a problem naming the field (the pod stays Unschedulable while the
    pool bills); a worker's in-memory /dev/shm, which counts against its memory once written (Kubernetes docs,
    "emptyDir": https://kubernetes.io/docs/concepts/storage/volumes/#emptydir), beyond it is a warning."""
    if not cpus or not memory_mb:  # the offer says no size: nothing to compare
        return
    c = spec.cluster
    memory_gib = allocatable(memory_mb / 1024, MEMORY_RESERVED) - EVICTION_GIB
    cores = allocatable(float(cpus), CPU_RESERVED)
    prefix = "cluster.worker" if tpu else "cluster.head"
    pod_cpus, pod_memory = (c.cpus_per_host, c.worker_memory_gib) if tpu else (c.head_cpus, c.head_memory_gib)
    total_gib = memory_mb / 1024
    node = f"a {machine} node gives pods {cores:.1f} vCPUs and {memory_gib:.0f} GiB of its {cpus} and {total_gib:.0f}"
    if pod_memory > memory_gib:
        report.problems.append(
            Problem(
                f"{prefix}_memory_gib",
                f"each {'TPU worker' if tpu else 'Ray head'} pod asks for {pod_memory} GiB but {node} GiB: it would "
                f"never be scheduled; ask for at most {int(memory_gib)}",
            )
        )
    if pod_cpus > cores:
        field = "cluster.cpus_per_host" if tpu else "cluster.head_cpus"
        report.problems.append(
            Problem(field, f"each pod asks for {pod_cpus} vCPUs but {node} GiB: ask for at most {int(cores)}")
        )
    if tpu and c.worker_shm_gib and pod_memory <= memory_gib < pod_memory + c.worker_shm_gib:
        report.warnings.append(
            f"cluster.worker_shm_gib: a TPU worker's {pod_memory} GiB and its {c.worker_shm_gib} GiB /dev/shm (memory "
            f"once written) exceed the {memory_gib:.0f} GiB {machine} gives pods: a full /dev/shm gets the pod evicted"
        )
