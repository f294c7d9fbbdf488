"""Preflight: before a gke run spends anything, every reason it would fail for lack of quota, capacity, access or
set-up, found with read-only calls and reported together.

What is checked derives from the run's plan (``plan.resources``), the one source of what the run does:
- the APIs the plan's calls go to are enabled in the project (Service Usage ``BatchGetServices``);
- the caller holds the IAM permissions those calls need (Resource Manager ``projects.testIamPermissions``);
- the region's TPU quota (Compute Engine ``regions.get``) has room for the chips of every slice, for on-demand, spot
  and flex-start capacity (spot and flex-start use the preemptible quota);
- with ``cluster.capacity=reservation``: the reservation exists in the zone (``reservations.get``), is for the slice's
  machine type and has a VM free for every host;
- the nodes' service account (``gke.node_service_account``) holds the roles nodes need on the project
  (``resources.node_roles``: logs, metrics, image pulls from this project's Artifact Registry), read from the project's
  IAM policy (Resource Manager ``projects.getIamPolicy``);
- with ``gke.cluster_name``: the cluster exists and lacks no feature that GKE cannot enable in place (``features``);
  the ones it can enable, provision enables before it creates any node pool.

:func:`check` raises :class:`PreflightFailed` listing every problem (exit 2); nothing has been created then.
``provision`` calls it first; ``tpupipe preflight PRESET`` calls it alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from components.platforms.gke import features
from components.platforms.gke import plan as plans
from components.platforms.gke import resources as r
from components.spec import RunSpec, TpupipeError
from components.workload import derive as d

SERVICE_USAGE_EMULATOR_HOST_ENV = "TPUPIPE_SERVICE_USAGE_EMULATOR_HOST"

# Compute Engine's regional TPU quota metric of each family: (on-demand, preemptible: spot and flex-start), in chips.
# A metric the region does not list is reported as not checked, never as a problem.
QUOTA_METRICS = {
    "v5e": ("TPU_LITE_PODSLICE_V5", "PREEMPTIBLE_TPU_LITE_PODSLICE_V5"),
    "v5p": ("TPU_V5P_PODSLICE", "PREEMPTIBLE_TPU_V5P_PODSLICE"),
    "v6e": ("TPU_V6E_PODSLICE", "PREEMPTIBLE_TPU_V6E_PODSLICE"),
    "tpu7x": ("TPU_V7X_PODSLICE", "PREEMPTIBLE_TPU_V7X_PODSLICE"),
}

# The IAM permissions each call of the plan needs (what creates a resource, and what deletes it at teardown), keyed
# by the plan record's api (its first word); the service a call goes to is the key's first part (SERVICES).
PERMISSIONS = {
    "compute.networks.insert": ("compute.networks.create", "compute.networks.delete"),
    "compute.subnetworks.insert": ("compute.subnetworks.create", "compute.subnetworks.delete"),
    "compute.resourcePolicies.insert": ("compute.resourcePolicies.create", "compute.resourcePolicies.delete"),
    "storage.buckets.get": ("storage.buckets.get", "storage.buckets.create"),
    "storage.buckets.setIamPolicy": (
        "storage.buckets.getIamPolicy",
        "storage.buckets.setIamPolicy",
        "resourcemanager.projects.get",
    ),
    "container.clusters.create": ("container.clusters.create", "container.clusters.delete", "container.operations.get"),
    "container.clusters.get": ("container.clusters.get",),
    "container.nodePools.create": ("container.clusters.update", "container.operations.get"),
    "artifactregistry.repositories.create": (
        "artifactregistry.repositories.get",
        "artifactregistry.repositories.create",
    ),
    "storage.objects.insert": ("storage.objects.create",),
    "cloudbuild.builds.create": ("cloudbuild.builds.create", "cloudbuild.builds.get"),
    "kubernetes": ("container.clusters.get",),
}
# Calls the plan does not list as records, by what the spec asks for.
EXTRA_PERMISSIONS = {
    "gate.register": ("aiplatform.models.upload", "aiplatform.models.get", "aiplatform.models.update"),
    "gke.hf_token_secret": ("secretmanager.versions.access",),
    "features": ("container.clusters.update",),  # a feature of an existing cluster enabled in place
}
SERVICES = {
    "compute": "compute.googleapis.com",
    "storage": "storage.googleapis.com",
    "container": "container.googleapis.com",
    "kubernetes": "container.googleapis.com",
    "artifactregistry": "artifactregistry.googleapis.com",
    "cloudbuild": "cloudbuild.googleapis.com",
    "resourcemanager": "cloudresourcemanager.googleapis.com",
    "aiplatform": "aiplatform.googleapis.com",
    "secretmanager": "secretmanager.googleapis.com",
}


class PreflightFailed(TpupipeError):
    """Every problem preflight found, in one message; nothing was created. Exit 2, as for bad input."""

    exit_code = 2

    def __init__(self, title: str, problems: list[Problem]):
        self.problems = problems
        super().__init__(
            f"{title}: {len(problems)} problem{'s' if len(problems) != 1 else ''}; nothing was "
            "created\n" + "\n".join(f"  - {p}" for p in problems)
        )


@dataclass(frozen=True)
class Problem:
    field: str  # the spec field (or the project's set-up) to change
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class Needs:
    """What the run needs of the project, derived from its plan: no call made."""

    project: str
    region: str
    zone: str
    services: tuple[str, ...]
    permissions: tuple[str, ...]
    quota: tuple[str, int] | None  # (metric, chips)
    reservation: tuple[str, str, str, str, int] | None  # (project, zone, name, machine type, hosts)
    cluster: str  # the path of the existing cluster the spec names, or ""
    node_account: str  # the nodes' service account; the default's PROJECT_NUMBER is looked up
    node_roles: tuple[tuple[str, str, tuple[str, ...]], ...]  # (role, what for, the roles that include it)


def needs(spec: RunSpec, run_id: str) -> Needs:
    t = r.target(spec, run_id)
    calls = [res.api.split(" ")[0] for res in plans.resources(spec, run_id) if res.api.split(" ")[0] in PERMISSIONS]
    permissions = [p for call in calls for p in PERMISSIONS[call]]
    permissions += [p for key, extra in EXTRA_PERMISSIONS.items() for p in extra if _asks(spec, key)]
    shape, c = d.slice_shape(spec), spec.cluster
    quota = reservation = None
    if c.capacity == "reservation":
        owner, _, name = c.reservation.rpartition("/reservations/")
        reservation = (
            owner.removeprefix("projects/") or t.project,
            t.zone,
            name,
            shape.machine_type,
            c.num_slices * shape.num_hosts,
        )
        permissions.append("compute.reservations.get")  # preflight's own read, and the node pools consume it
    else:
        metric = QUOTA_METRICS[shape.family.name][0 if c.capacity == "on-demand" else 1]
        quota = (metric, c.num_slices * shape.num_chips)
        permissions.append("compute.regions.get")  # preflight's own read
    permissions.append("resourcemanager.projects.getIamPolicy")  # preflight's own read of the nodes' roles
    services = [SERVICES[p.split(".")[0]] for p in [*calls, *permissions]]
    return Needs(
        t.project,
        t.region,
        t.zone,
        tuple(dict.fromkeys(services)),
        tuple(dict.fromkeys(permissions)),
        quota,
        reservation,
        "" if t.owns_cluster else f"{t.parent}/clusters/{t.cluster}",
        t.node_service_account,
        tuple((role, *needed) for role, needed in r.node_roles(t).items()),
    )


def reads(n: Needs) -> list[tuple[str, str, str]]:
    """The read-only calls preflight makes, in order: (api, resource path, what it checks). The dry run prints them."""
    out = [
        ("serviceusage.services.batchGet", f"projects/{n.project}", f"{len(n.services)} APIs enabled"),
        (
            "resourcemanager.projects.testIamPermissions",
            f"projects/{n.project}",
            f"{len(n.permissions)} permissions held",
        ),
        (
            "resourcemanager.projects.getIamPolicy",
            f"projects/{n.project}",
            f"the nodes' service account holds {', '.join(role for role, _, _ in n.node_roles)}",
        ),
    ]
    if n.quota:
        out.append(
            (
                "compute.regions.get",
                f"projects/{n.project}/regions/{n.region}",
                f"quota {n.quota[0]}: {n.quota[1]} chips free",
            )
        )
    if n.reservation:
        project, zone, name, machine_type, hosts = n.reservation
        out.append(
            (
                "compute.reservations.get",
                f"projects/{project}/zones/{zone}/reservations/{name}",
                f"{hosts} {machine_type} VMs free",
            )
        )
    if n.cluster:
        out.append(("container.clusters.get", n.cluster, "its features"))
    return out


def _asks(spec: RunSpec, key: str) -> bool:
    if key == "features":
        return bool(spec.gke.cluster_name) and any(f.in_place for f in features.needed(spec))
    section, _, name = key.partition(".")
    return bool(getattr(getattr(spec, section), name))


# ---------------------------------------------------------------- the checks


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # what was found in order, for the person reading
    enable: list[str] = field(default_factory=list)  # features of the existing cluster provision will enable


def check(spec: RunSpec, run_id: str, log: Callable[[str], None] = print, creds=None) -> Report:
    """Run every check; raise :class:`PreflightFailed` with all the problems, else the report of what was found."""
    n = needs(spec, run_id)
    if creds is None:
        from components.platforms.credentials import credentials

        creds = credentials()
    report = Report()
    for step in (_apis, _permissions, _node_identity, _quota, _reservation, _cluster):
        try:
            step(n, spec, creds, report)
        except Exception as exc:  # a check that cannot be made is itself a problem, reported with all
            from google.api_core import exceptions as gexc

            if not isinstance(exc, gexc.GoogleAPICallError):
                raise
            report.problems.append(Problem(step.__name__.strip("_"), f"could not be checked: {exc.message}"))
    for line in report.checked:
        log(f"preflight: {line}")
    if report.problems:
        raise PreflightFailed(f"preflight of run {run_id} in project {n.project}", report.problems)
    return report


def _apis(n: Needs, spec: RunSpec, creds, report: Report) -> None:
    from google.cloud import service_usage_v1

    response = service_usage_client(creds).batch_get_services(
        request={"parent": f"projects/{n.project}", "names": [f"projects/{n.project}/services/{s}" for s in n.services]}
    )
    disabled = [s.name.rsplit("/", 1)[-1] for s in response.services if s.state != service_usage_v1.State.ENABLED]
    if disabled:
        report.problems.append(
            Problem(
                "apis",
                f"not enabled in project {n.project}: {', '.join(disabled)} (enable "
                "them in the console's API Library, then run again)",
            )
        )
    report.checked.append(f"{len(n.services) - len(disabled)} of {len(n.services)} APIs enabled")


def _permissions(n: Needs, spec: RunSpec, creds, report: Report) -> None:
    from components.platforms.gke import storage

    held = set(
        storage.projects_client(creds)
        .test_iam_permissions(request={"resource": f"projects/{n.project}", "permissions": list(n.permissions)})
        .permissions
    )
    lacking = [p for p in n.permissions if p not in held]
    if lacking:
        report.problems.append(
            Problem(
                "permissions",
                f"the caller lacks on project {n.project}: {', '.join(lacking)} "
                "(grant a role that has them, e.g. roles/container.admin, "
                "roles/compute.networkAdmin, roles/storage.admin)",
            )
        )
    report.checked.append(f"{len(held)} of {len(n.permissions)} permissions held")


def _node_identity(n: Needs, spec: RunSpec, creds, report: Report) -> None:
    """Nodes whose service account lacks these fail late and obscurely: image pulls refused, no logs."""
    from components.platforms.gke import storage

    account = n.node_account
    if account == r.DEFAULT_NODE_SERVICE_ACCOUNT:
        account = account.replace("PROJECT_NUMBER", storage.project_number(n.project, creds))
    granted = storage.project_roles(n.project, f"serviceAccount:{account}", creds)
    for role, purpose, granted_by in n.node_roles:
        if not granted & set(granted_by):
            report.problems.append(
                Problem(
                    "gke.node_service_account",
                    f"the nodes' service account {account} lacks "
                    f"{role} on project {n.project}, needed for {purpose}: grant it that role "
                    "(or one that includes it), or name another account",
                )
            )
    report.checked.append(f"the nodes' service account {account}: {len(n.node_roles)} roles needed")


def _quota(n: Needs, spec: RunSpec, creds, report: Report) -> None:
    if n.quota is None:
        return
    metric, chips = n.quota
    region = compute_client("RegionsClient", creds).get(project=n.project, region=n.region)
    found = {q.metric: q for q in region.quotas}
    if metric not in found:
        report.checked.append(f"quota {metric}: not listed in {n.region}, not checked")
        return
    free = int(found[metric].limit - found[metric].usage)
    if free < chips:
        report.problems.append(
            Problem(
                "cluster.capacity",
                f"TPU quota {metric} in {n.region} of project {n.project}: "
                f"the run needs {chips} chips, {free} of {found[metric].limit:g} are free "
                f"({spec.cluster.capacity}); request more quota, use fewer slices "
                "(cluster.num_slices), or another capacity type (cluster.capacity)",
            )
        )
    report.checked.append(f"quota {metric} in {n.region}: {free} chips free, {chips} needed")


def _reservation(n: Needs, spec: RunSpec, creds, report: Report) -> None:
    if n.reservation is None:
        return
    from google.api_core import exceptions as gexc

    project, zone, name, machine_type, hosts = n.reservation
    try:
        found = compute_client("ReservationsClient", creds).get(project=project, zone=zone, reservation=name)
    except gexc.NotFound:
        report.problems.append(
            Problem(
                "cluster.reservation", f"no reservation {name} in zone {zone} of project {project} (gke.zone is {zone})"
            )
        )
        return
    specific = found.specific_reservation
    reserved = specific.instance_properties.machine_type.rsplit("/", 1)[-1]
    free = specific.count - specific.in_use_count
    if reserved != machine_type:
        report.problems.append(
            Problem("cluster.reservation", f"reservation {name} is for {reserved} VMs; the slice needs {machine_type}")
        )
    elif free < hosts:
        report.problems.append(
            Problem(
                "cluster.reservation",
                f"reservation {name} in {zone} has room for {free} of "
                f"the {hosts} {machine_type} VMs the run needs ({specific.in_use_count} of "
                f"{specific.count} in use)",
            )
        )
    report.checked.append(f"reservation {name} in {zone}: {free} of {specific.count} {reserved} free, {hosts} needed")


def _cluster(n: Needs, spec: RunSpec, creds, report: Report) -> None:
    if not n.cluster:
        return
    from components.platforms.gke.cluster import Gke, cluster_manager

    cluster = Gke(cluster_manager(creds), log=lambda m: None).get_cluster(n.cluster)
    short = n.cluster.rsplit("/", 1)[-1]
    if cluster is None:
        report.problems.append(
            Problem("gke.cluster_name", f"no cluster {short} in {n.cluster.split('/')[3]} of project {n.project}")
        )
        return
    report.enable += [f.name for f in features.to_enable(spec, cluster, n.project)]
    report.problems += [
        Problem("gke.cluster_name", f"cluster {short} lacks {reason}")
        for reason in features.refusals(spec, cluster, n.project)
    ]
    lacking = features.missing(spec, cluster, n.project)
    has = [f.name for f in features.needed(spec) if f not in lacking]
    report.checked.append(
        f"cluster {short}: has "
        + (", ".join(has) or "none of the features")
        + (f"; provision enables {', '.join(report.enable)}" if report.enable else "")
    )


# ---------------------------------------------------------------- clients


def service_usage_client(creds):
    """Service Usage's client: to the emulator named by $TPUPIPE_SERVICE_USAGE_EMULATOR_HOST, else to Google."""
    from google.cloud import service_usage_v1

    host = os.environ.get(SERVICE_USAGE_EMULATOR_HOST_ENV)
    if host:
        import grpc
        from google.cloud.service_usage_v1.services.service_usage.transports import ServiceUsageGrpcTransport

        return service_usage_v1.ServiceUsageClient(
            transport=ServiceUsageGrpcTransport(channel=grpc.insecure_channel(host))
        )
    return service_usage_v1.ServiceUsageClient(credentials=creds)


def compute_client(name: str, creds):
    """A compute_v1 client (``RegionsClient``, ``ReservationsClient``) at the endpoint the Compute adapter uses."""
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1

    from components.platforms.gke.compute import EMULATOR_HOST_ENV

    host = os.environ.get(EMULATOR_HOST_ENV)
    options = ClientOptions(api_endpoint=host) if host else None
    return getattr(compute_v1, name)(credentials=creds, client_options=options)


def render(spec: RunSpec, run_id: str, report: Report) -> str:
    """The report of a preflight that passed."""
    lines = [f"preflight {spec.name} (run {run_id}): no problem found; nothing was created"]
    lines += [f"  {line}" for line in report.checked]
    return "\n".join(lines) + "\n"
