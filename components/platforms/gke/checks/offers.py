"""Preflight's checks against what the run's location offers (``preflight`` runs them with its own): the GKE version
a cluster the run creates gets, on its release channel (``versions``); the machine types of its node pools in their
zone (Compute Engine ``machineTypes.get``: TPU machine types are offered only in some zones, Cloud TPU docs, "TPU
regions and zones", https://cloud.google.com/tpu/docs/regions-zones, and CPU machine series vary by zone, Compute
Engine docs, "Regions and zones", https://cloud.google.com/compute/docs/regions-zones#available); and the VPC network
``default`` the cluster it creates is attached to (its body names no network: "If left unspecified, the ``default``
network will be used", the ``Cluster.network`` field's comment in google-cloud-container; an organisation with the
``compute.skipDefaultNetworkCreation`` constraint has none).

Each check is ``check(needs, spec, creds, report)``: read-only calls, problems and findings added to the report.
"""

from __future__ import annotations

from components.platforms.gke.checks import versions
from components.platforms.gke.checks.findings import Problem, Report
from components.platforms.gke.plan.needs import Needs
from components.platforms.gke.plan.resources import RELEASE_CHANNEL
from components.spec import RunSpec
from components.tpu import catalogue


def version(n: Needs, spec: RunSpec, creds, report: Report) -> None:
    """The version a cluster the run creates gets: ``gke.cluster_version`` resolved against the channel's offered
    versions (ClusterManager ``getServerConfig``); a pin GKE no longer offers is a problem naming those it does."""
    if not n.location:
        return
    from components.platforms.gke.cloud.cluster import cluster_manager

    config = cluster_manager(creds).get_server_config(name=f"projects/{n.project}/locations/{n.location}")
    offer = versions.offered(config, RELEASE_CHANNEL)
    resolved = versions.resolve(n.cluster_version, offer)
    if resolved is None:
        report.problems.append(
            Problem(
                "gke.cluster_version",
                f"GKE {n.cluster_version or 'default'} is not offered on the {RELEASE_CHANNEL} release channel in "
                f"{n.location} (a pinned version retires); offered: {', '.join(offer.versions) or 'none'}: pin one, "
                "or a minor (e.g. 1.35) for its newest patch",
            )
        )
        return
    report.version = resolved
    asked = f"gke.cluster_version={n.cluster_version}" if n.cluster_version else "the channel's default"
    report.checked.append(f"GKE {resolved} on the {RELEASE_CHANNEL} channel in {n.location} ({asked})")


def machine_types(n: Needs, spec: RunSpec, creds, report: Report) -> None:
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
            client.get(project=n.project, zone=zone, machine_type=machine)
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
    if offered:
        report.checked.append(f"machine types offered in {n.zone}: {', '.join(offered)}")


def default_network(n: Needs, spec: RunSpec, creds, report: Report) -> None:
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
