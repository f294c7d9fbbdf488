"""What a gke run needs of its project, derived from its plan (``plan.resources``) with no call made: the APIs its
calls go to, the IAM permissions they take (to create, and to delete at teardown), the TPU quota or the reservation
its slices use, the existing cluster it names, the roles its nodes' service account must hold, and the service
accounts the caller must act as (the nodes', Cloud Build's). ``preflight`` checks each against the project; the dry
run prints the reads that check makes (``reads``).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.platforms.gke.plan import document as plans
from components.platforms.gke.plan import features, k8s_actions, network
from components.platforms.gke.plan.resources import QUOTA_METRICS, RELEASE_CHANNEL
from components.platforms.gke.plan.target import IMAGE_STREAMING_API, Target, node_roles, pulls_here, target
from components.spec import RunSpec, names
from components.workload import derive as d

# The IAM permissions each call of the plan needs (what creates a resource, and what deletes it at teardown), keyed
# by the plan record's api (its first word); the service a call goes to is the key's first part (SERVICES).
PERMISSIONS = {
    "compute.networks.insert": ("compute.networks.create", "compute.networks.delete"),
    "compute.subnetworks.insert": ("compute.subnetworks.create", "compute.subnetworks.delete"),
    "compute.resourcePolicies.insert": ("compute.resourcePolicies.create", "compute.resourcePolicies.delete"),
    "compute.firewalls.insert": ("compute.firewalls.create", "compute.firewalls.delete"),
    # A Cloud Router with a NAT gateway: routers.insert, and the subnetwork it serves used
    # (https://cloud.google.com/nat/docs/set-up-manage-network-address-translation#required-permissions).
    "compute.routers.insert": ("compute.routers.create", "compute.routers.delete", "compute.subnetworks.use"),
    "storage.buckets.get": ("storage.buckets.get", "storage.buckets.create"),
    "storage.buckets.setIamPolicy": (
        "storage.buckets.getIamPolicy",
        "storage.buckets.setIamPolicy",
        "resourcemanager.projects.get",
    ),
    "container.clusters.create": (
        "container.clusters.create",
        "container.clusters.delete",
        "container.operations.get",
        "iam.serviceAccounts.actAs",
    ),
    "container.clusters.get": ("container.clusters.get",),
    # Nodes that run as a service account need the caller to act as it (IAM "Service account permissions":
    # https://cloud.google.com/iam/docs/service-account-permissions#user-role; GKE docs, "Use least privilege IAM
    # service accounts": roles/iam.serviceAccountUser on the nodes' account).
    "container.nodePools.create": (
        "container.clusters.update",
        "container.operations.get",
        "iam.serviceAccounts.actAs",
    ),
    "artifactregistry.repositories.create": (
        "artifactregistry.repositories.get",
        "artifactregistry.repositories.create",
    ),
    "storage.objects.insert": ("storage.objects.create",),
    # The trainer image: an image of the same sources found by its tag and reused, else built and tagged so
    # (Artifact Registry's permissions: https://cloud.google.com/artifact-registry/docs/access-control#permissions).
    "cloudbuild.builds.create": (
        "cloudbuild.builds.create",
        "cloudbuild.builds.get",
        "artifactregistry.tags.get",
        "artifactregistry.tags.create",
    ),
    "kubernetes": ("container.clusters.get",),
}
ACT_AS = "iam.serviceAccounts.actAs"
# Calls the plan does not list as records, by what the spec asks for.
EXTRA_PERMISSIONS = {
    # register also copies the trained checkpoint to models/ (objects.rewrite: get the source, create the copy;
    # https://cloud.google.com/storage/docs/access-control/iam-json), claims what a retried copy finds already there
    # (objects.patch: update), takes back what a failed copy wrote (objects.delete) and, asked to, holds it
    # (objects.patch)
    "gate.register": (
        "aiplatform.models.upload",
        "aiplatform.models.get",
        "aiplatform.models.update",
        "storage.objects.get",
        "storage.objects.list",
        "storage.objects.create",
        "storage.objects.update",
        "storage.objects.delete",
    ),
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


@dataclass(frozen=True)
class Reservation:
    """The reservation (or one block of it) a run's slices consume: ``cluster.reservation`` is ``NAME``,
    ``NAME/reservationBlocks/BLOCK``, ``NAME/reservationBlocks/BLOCK/reservationSubBlocks/SUB_BLOCK`` or any of them
    under ``projects/P/reservations/`` (a shared one of another project); GKE takes a block or a sub-block by that
    path (GKE docs, "Consume reserved zonal resources":
    https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations), and Compute Engine reads a
    sub-block with ``reservationSubBlocks.get`` under its parent ``reservations/NAME/reservationBlocks/BLOCK``
    (https://cloud.google.com/compute/docs/reference/rest/v1/reservationSubBlocks/get)."""

    project: str
    zone: str
    name: str  # the reservation's name, a block's parent
    block: str  # "" for the whole reservation
    machine_type: str
    hosts: int  # VMs of machine_type the slices take
    chips: int  # their TPU chips (an aggregate reservation counts chips, not VMs)
    sub_block: str = ""  # a sub-block of ``block`` (``.../reservationBlocks/B/reservationSubBlocks/S``), "" for none

    @property
    def path(self) -> str:
        where = f"projects/{self.project}/zones/{self.zone}/reservations/{self.name}"
        where += f"/reservationBlocks/{self.block}" if self.block else ""
        return where + (f"/reservationSubBlocks/{self.sub_block}" if self.sub_block else "")

    @property
    def reads(self) -> list[str]:
        """The permissions of preflight's reads of it (``checks.reservations``): the reservation, its block, its
        sub-block."""
        out = ["compute.reservations.get"]
        if self.block:
            out.append("compute.reservationBlocks.get")
        if self.sub_block:
            out.append("compute.reservationSubBlocks.get")
        return out


@dataclass(frozen=True)
class Needs:
    """What the run needs of the project, derived from its plan: no call made."""

    project: str
    region: str
    zone: str
    services: tuple[str, ...]
    permissions: tuple[str, ...]
    quota: tuple[str, int] | None  # (metric, chips); metric "" when Compute Engine has none for the family
    reservation: Reservation | None
    cluster: str  # the path of the existing cluster the spec names, or ""
    node_account: str  # the nodes' service account; the default's PROJECT_NUMBER is looked up
    node_roles: tuple[tuple[str, str, tuple[str, ...]], ...]  # (role, what for, the roles that include it)
    location: str = ""  # where the run creates its cluster (a zone or region), "" when it uses an existing one
    cluster_version: str = ""  # gke.cluster_version of a cluster the run creates, resolved at preflight
    machine_types: tuple[tuple[str, str, str], ...] = ()  # (zone, machine type, the field that names it) of its pools
    k8s_kinds: tuple[str, ...] = ()  # the plan's Kubernetes kinds (``k8s/Secret``...): what it does in the cluster
    namespace: str = ""  # the run's Kubernetes namespace
    # The accounts the caller must act as (iam.serviceAccounts.actAs), with the field that names each.
    act_as: tuple[tuple[str, str], ...] = ()
    builds: bool = False  # the run builds its trainer image with Cloud Build
    build_account: str = ""  # the account Cloud Build runs that build as; empty: the project's default
    bucket: str = ""  # the run's bucket (gke.bucket): an existing one must have uniform bucket-level access
    # The permissions of preflight's reads of a shared reservation, held on its owner project (not the run's): a
    # shared reservation is listed and read in the project that owns it (Compute Engine, "Create a shared
    # reservation", https://cloud.google.com/compute/docs/instances/reservations-shared: "shared reservations are only
    # listed under the owner project").
    owner_permissions: tuple[str, ...] = ()
    # The Artifact Registry repository of the trainer image (``projects/P/locations/L/repositories/R``) when it is in
    # this project's registry: image pulls may be granted there (``node_account``); "" otherwise.
    image_repository: str = ""
    # An existing bucket must have hierarchical namespace too: the trainer commits its checkpoints by renaming a
    # directory on the bucket's FUSE mount (``derive.commits_by_directory_rename``).
    bucket_hierarchical: bool = False
    # The Cloud Router the run creates for its NAT gateway (``network.cloud_nat``), "" when it needs none: preflight
    # reads the default network's routers in the region (``network.ROUTERS_PER_NETWORK``, a network-wide gateway).
    nat_router: str = ""


def needs(spec: RunSpec, run_id: str) -> Needs:
    t = target(spec, run_id)
    calls = [res.api.split(" ")[0] for res in plans.resources(spec, run_id) if res.api.split(" ")[0] in PERMISSIONS]
    permissions = [p for call in calls for p in PERMISSIONS[call]]
    permissions += [p for key, extra in EXTRA_PERMISSIONS.items() for p in extra if _asks(spec, key)]
    shape, c = d.slice_shape(spec), spec.cluster
    quota = reservation = None
    owner_permissions: tuple[str, ...] = ()
    if c.capacity == "reservation":
        owner, _, name = c.reservation.rpartition("/reservations/")
        name, _, block = name.partition("/reservationBlocks/")
        block, _, sub_block = block.partition("/reservationSubBlocks/")
        reservation = Reservation(
            owner.removeprefix("projects/") or t.project,
            t.zone,
            name,
            block,
            shape.machine_type,
            c.num_slices * shape.num_hosts,
            c.num_slices * shape.num_chips,
            sub_block,
        )
        if reservation.project == t.project:
            permissions += reservation.reads  # preflight's own reads, and the node pools consume it
        else:
            owner_permissions = tuple(reservation.reads)  # held on the owner project (``Needs.owner_permissions``)
    else:
        metric = QUOTA_METRICS.get(shape.family.name, ("", ""))[0 if c.capacity == "on-demand" else 1]
        quota = (metric, c.num_slices * shape.num_chips)  # "": no metric to read, a warning
        if metric:
            permissions.append("compute.regions.get")  # preflight's own read
    act_as = _act_as(calls, t)
    if act_as:
        permissions.append(ACT_AS)
    permissions.append("resourcemanager.projects.getIamPolicy")  # preflight's own read of the accounts' roles
    machine_types = _machine_types(spec, run_id)
    if machine_types:
        permissions.append("compute.machineTypes.get")  # preflight's own read
    if t.owns_cluster:
        permissions.append("compute.networks.get")  # preflight's read of the default network the cluster uses
        permissions.append("compute.routers.list")  # its routers in the region: a NAT gateway already there
    nat = network.cloud_nat(spec, t)
    kinds = tuple(
        dict.fromkeys(
            r.kind for r in plans.resources(spec, run_id) if r.kind.startswith("k8s/") or r.kind == "kueue-queue"
        )
    )
    if t.owns_cluster:  # a new cluster has no RBAC binding for the caller: IAM alone decides what it may do there
        permissions += k8s_actions.iam_permissions(kinds)
    # actAs is checked on the project, where GKE's calls need it: no API of its own to enable.
    services = [SERVICES[p.split(".")[0]] for p in [*calls, *permissions] if not p.startswith("iam.")]
    if t.owns_cluster:  # the cluster the run creates streams images (``target.IMAGE_STREAMING_API``)
        services.append(IMAGE_STREAMING_API)
    return Needs(
        t.project,
        t.region,
        t.zone,
        tuple(dict.fromkeys(services)),
        tuple(dict.fromkeys(permissions)),
        quota,
        reservation,
        "" if t.owns_cluster else t.cluster_path,
        t.node_service_account,
        tuple((role, *needed) for role, needed in node_roles(t).items()),
        t.location if t.owns_cluster else "",
        spec.gke.cluster_version if t.owns_cluster else "",
        machine_types,
        kinds,
        t.namespace,
        act_as,
        "cloudbuild.builds.create" in calls,
        t.build_service_account,
        t.bucket,
        owner_permissions,
        image_repository=image_repository(t),
        bucket_hierarchical=d.commits_by_directory_rename(spec),
        nat_router=nat["name"] if nat else "",
    )


def image_repository(t: Target) -> str:
    """The Artifact Registry repository (``projects/P/locations/L/repositories/R``) of the trainer image when it is in
    this project's registry, else ""."""
    if not pulls_here(t):
        return ""
    from components.cloud.build import image_tag_path

    return image_tag_path(t.image)[0].split("/packages/")[0]


def _act_as(calls: list[str], t: Target) -> tuple[tuple[str, str], ...]:
    """The service accounts the plan's calls make the caller act as: the nodes' (a cluster or node pool the run
    creates), Cloud Build's when gke.build_service_account names one (a build that runs as a user-specified service
    account needs actAs on it: https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts)."""
    out = []
    if any(ACT_AS in PERMISSIONS[call] for call in calls if call.startswith("container.")):
        out.append(("gke.node_service_account", t.node_service_account))
    if "cloudbuild.builds.create" in calls and t.build_service_account:
        out.append(("gke.build_service_account", t.build_service_account))
    return tuple(out)


def _machine_types(spec: RunSpec, run_id: str) -> tuple[tuple[str, str, str], ...]:
    """(zone, machine type, field) of every node pool the run creates: the Ray head's CPU pool (gke.cpu_machine_type)
    and the TPU pools (their machine type follows from the slice; the zone is gke.zone)."""
    out = []
    for res in plans.resources(spec, run_id):
        if res.kind != "node-pool" or not res.body:
            continue
        tpu = names.SLICE_LABEL in res.body["config"].get("labels", {})
        out.append(
            (res.body["locations"][0], res.body["config"]["machineType"], "gke.zone" if tpu else "gke.cpu_machine_type")
        )
    return tuple(dict.fromkeys(out))


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
            f"the nodes' service account holds {', '.join(role for role, _, _ in n.node_roles)}; a basic role "
            + ("(Owner, Editor) on it or on Cloud Build's" if n.builds else "(Owner, Editor) on it")
            + " is a warning",
        ),
    ]
    if n.quota and n.quota[0]:
        out.append(
            (
                "compute.regions.get",
                f"projects/{n.project}/regions/{n.region}",
                f"quota {n.quota[0]}: {n.quota[1]} chips free",
            )
        )
    if n.reservation:
        r = n.reservation
        whole = f"projects/{r.project}/zones/{r.zone}/reservations/{r.name}"
        free = f"{r.hosts} {r.machine_type} VMs (or, aggregate, {r.chips} chips) free"
        out.append(("compute.reservations.get", whole, free))
        if r.block:
            part = "sub-block" if r.sub_block else "block"
            read = "compute.reservationSubBlocks.get" if r.sub_block else "compute.reservationBlocks.get"
            out.append((read, r.path, f"{r.hosts} VMs free in the {part}"))
    if n.cluster:
        out.append(("container.clusters.get", n.cluster, "its features"))
        out.append(
            (
                "kubernetes.selfsubjectaccessreviews.create",
                f"{n.cluster} namespace {n.namespace}",
                "the caller may do what the run does there",
            )
        )
        if "kueue-queue" in n.k8s_kinds:  # checks.kueue
            out.append(
                (
                    "kubernetes get kueue.x-k8s.io/v1beta2",
                    f"{n.cluster} namespace {n.namespace}",
                    "Kueue installed and managing RayClusters, the LocalQueue, its ClusterQueue's flavors and quota "
                    "(quota met only by borrowing within its cohort: a warning, not a refusal), the priority class",
                )
            )
    out += [
        ("compute.machineTypes.get", f"projects/{n.project}/zones/{zone}/machineTypes/{machine}", "offered in the zone")
        for zone, machine, _ in n.machine_types
    ]
    if n.bucket:
        wanted = "uniform bucket-level access" + (", hierarchical namespace" if n.bucket_hierarchical else "")
        out.append(("storage.buckets.get", f"b/{n.bucket}", f"if it exists: {wanted}"))
    if n.location:
        out.append(("compute.networks.get", f"projects/{n.project}/global/networks/default", "the cluster's network"))
        out.append(
            (
                "compute.routers.list",
                f"projects/{n.project}/regions/{n.region}/routers",
                "a Cloud NAT gateway already serving the default network"
                + (f"; room for the router {n.nat_router}" if n.nat_router else ""),
            )
        )
        out.append(
            (
                "container.projects.locations.getServerConfig",
                f"projects/{n.project}/locations/{n.location}",
                f"GKE {n.cluster_version or 'default'} offered on the {RELEASE_CHANNEL} channel",
            )
        )
    return out


def _asks(spec: RunSpec, key: str) -> bool:
    if key == "features":
        return bool(spec.gke.cluster_name) and any(f.in_place for f in features.needed(spec))
    section, _, name = key.partition(".")
    return bool(getattr(getattr(spec, section), name))
