"""Where a gke run goes and who it runs as, resolved once from the run spec: the project, zone, region and cluster
(:class:`Target`, every name not set in the spec derived from the run id), the bucket mounted in every pod, the
nodes' service account and the roles it needs, Cloud Build's account, and the Workload Identity binding of the pods'
account on the bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.platforms.gke.plan import paths
from components.platforms.gke.plan.identities import DEFAULT_COMPUTE
from components.spec import RunSpec, names
from components.tpu import catalogue
from components.workload.cache import CACHE_PREFIX
from components.workload.derive import WORKLOAD_IMAGES

# Unless gke.node_service_account names another, nodes run as the project's default Compute Engine service account.
DEFAULT_NODE_SERVICE_ACCOUNT = DEFAULT_COMPUTE
# What the nodes' account must be granted on the project: role -> (what for, the roles that include it). Logs and
# metrics: https://cloud.google.com/kubernetes-engine/docs/how-to/hardening-your-cluster#use_least_privilege_sa
# (roles/container.defaultNodeServiceAccount holds both); image pulls from Artifact Registry:
# https://cloud.google.com/artifact-registry/docs/access-control#gke (checked when the image is in this project's
# Artifact Registry). The basic roles Editor and Owner include all three.
NODE_SERVICE_ACCOUNT_ROLES = {
    "roles/artifactregistry.reader": (
        "pulling the trainer image from Artifact Registry",
        (
            "roles/artifactregistry.reader",
            "roles/artifactregistry.writer",
            "roles/artifactregistry.repoAdmin",
            "roles/artifactregistry.admin",
            "roles/editor",
            "roles/owner",
        ),
    ),
    "roles/logging.logWriter": (
        "writing the nodes' and pods' logs",
        (
            "roles/logging.logWriter",
            "roles/logging.admin",
            "roles/container.defaultNodeServiceAccount",
            "roles/editor",
            "roles/owner",
        ),
    ),
    "roles/monitoring.metricWriter": (
        "writing the nodes' metrics",
        (
            "roles/monitoring.metricWriter",
            "roles/monitoring.editor",
            "roles/monitoring.admin",
            "roles/container.defaultNodeServiceAccount",
            "roles/editor",
            "roles/owner",
        ),
    ),
}
# Image streaming (on in the clusters the run creates: ``resources``' gcfsConfig) streams from the image's project,
# and a node account other than the default needs roles/serviceusage.serviceUsageConsumer there (GKE docs, "Use Image
# streaming to pull container images", Requirements:
# https://cloud.google.com/kubernetes-engine/docs/how-to/image-streaming#requirements). Editor and Owner hold
# serviceusage.services.use too (https://cloud.google.com/service-usage/docs/access-control).
IMAGE_PULL_ROLE = "roles/artifactregistry.reader"  # on the image's repository (``accounts``), or the project
IMAGE_STREAMING_ROLE = {
    "roles/serviceusage.serviceUsageConsumer": (
        "image streaming, on in the cluster the run creates (pods do not start without it)",
        (
            "roles/serviceusage.serviceUsageConsumer",
            "roles/serviceusage.serviceUsageAdmin",
            "roles/editor",
            "roles/owner",
        ),
    ),
}
IMAGE_STREAMING_API = "containerfilesystem.googleapis.com"  # the same page's first requirement: its API enabled
MOUNT_PATH = "/data"
# Where the worker pods mount the bucket's cache prefix (``components.workload.cache.CACHE_PREFIX``): what outlives a
# run, the compiled programs of every run with the same trainer image, slice and model (``manifests``).
CACHE_MOUNT_PATH = "/cache"
BUCKET_RESOURCE_TYPE = "storage.googleapis.com/Bucket"  # resource.type of a bucket in an IAM condition


def prefix_condition(bucket: str, prefix: str) -> str:
    """An IAM condition's expression admitting the objects under ``prefix`` and, in a bucket with hierarchical
    namespace, its folders: a folder is a resource of its own, ``projects/{project}/buckets/{bucket}/folders/{folder}``
    (google/storage/control/v2/storage_control.proto, ``Folder``), which Cloud Storage FUSE gets, creates, renames and
    deletes by that name with ``_`` for the project (GoogleCloudPlatform/gcsfuse, internal/storage/bucket_handle.go) —
    a directory made or renamed on the mount (an Orbax step's commit) is such a call, which a condition on the objects'
    names alone refuses. The folder permissions are the role's: ``roles/storage.objectUser`` holds
    ``storage.folders.create`` and ``rename`` (https://cloud.google.com/storage/docs/rename-hns-folders)."""
    return " || ".join(
        f'resource.name.startsWith("projects/_/buckets/{bucket}/{kind}/{prefix}/")' for kind in ("objects", "folders")
    )


@dataclass(frozen=True)
class Target:
    """The resolved places and names of a run on GKE."""

    run_id: str
    project: str  # PROJECT_ID when the spec has none (plans only)
    zone: str
    region: str
    cluster: str
    owns_cluster: bool  # the run creates (and its teardown deletes) the cluster
    autopilot: bool
    location: str  # the cluster's location: the zone (standard) or the region (autopilot)
    namespace: str
    bucket: str
    image: str
    service_account: str
    node_service_account: str  # the nodes' identity; the default names PROJECT_NUMBER, filled in at provision
    build_service_account: str = ""  # who Cloud Build builds the trainer image as; empty: the project's default
    queue: str = ""  # the Kueue LocalQueue the run's RayCluster waits in (gke.queue); empty: the run's own node pools
    priority_class: str = ""  # the Kueue WorkloadPriorityClass of its workload (gke.priority_class)

    @property
    def parent(self) -> str:
        """``projects/P/locations/L``: the cluster's location."""
        return paths.location_path(self.project, self.location)

    @property
    def cluster_path(self) -> str:
        """``projects/P/locations/L/clusters/N``: the cluster the run creates or uses."""
        return paths.cluster_path(self.parent, self.cluster)

    @property
    def run_dir(self) -> str:
        """Where the run's jobs write (checkpoints, results): the bucket, mounted in every pod."""
        return f"{MOUNT_PATH}/{names.run_prefix(self.run_id)}"


def pulls_here(t: Target) -> bool:
    """Whether the nodes pull the trainer image from this project's Artifact Registry."""
    return f"-docker.pkg.dev/{t.project}/" in t.image


def node_roles(t: Target) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The roles the nodes' account needs (``NODE_SERVICE_ACCOUNT_ROLES``): image pulls only when the trainer image is
    in this project's Artifact Registry (an image elsewhere is that registry's to grant); image streaming's role too
    for a named account in a cluster the run creates (``IMAGE_STREAMING_ROLE``)."""
    here = pulls_here(t)
    roles = {role: needs for role, needs in NODE_SERVICE_ACCOUNT_ROLES.items() if here or role != IMAGE_PULL_ROLE}
    if here and t.owns_cluster and t.node_service_account != DEFAULT_NODE_SERVICE_ACCOUNT:
        roles.update(IMAGE_STREAMING_ROLE)
    return roles


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def target(spec: RunSpec, run_id: str) -> Target:
    g = spec.gke
    project = g.project or names.PLACEHOLDER_PROJECT
    zone = (g.zone_choices or tuple(catalogue.zones(spec.cluster.accelerator)))[0]  # a placed spec has one
    region = region_of(zone)
    autopilot = g.cluster_mode == "autopilot"
    image = g.image or (
        f"{region}-docker.pkg.dev/{project}/{g.artifact_repository}/"
        f"{WORKLOAD_IMAGES[spec.train.workload]}:{names.image_tag(run_id)}"
    )
    return Target(
        run_id=run_id,
        project=project,
        zone=zone,
        region=region,
        cluster=g.cluster_name or names.gke_cluster(run_id),
        owns_cluster=not g.cluster_name,
        autopilot=autopilot,
        location=region if autopilot else zone,
        namespace=g.namespace,
        bucket=g.bucket or names.bucket(g.project),
        image=image,
        service_account=names.service_account(run_id),
        node_service_account=g.node_service_account or DEFAULT_NODE_SERVICE_ACCOUNT,
        build_service_account=g.build_service_account,
        queue=g.queue,
        priority_class=g.priority_class,
    )


# What the plan shows in place of the run's Kubernetes ServiceAccount's UID, which its cluster's API server assigns when
# deploy_raycluster creates it ("Populated by the system. Read-only":
# https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/#ObjectMeta, ``uid``).
SERVICE_ACCOUNT_UID = "SERVICEACCOUNT_UID"


def member(t: Target, uid: str = SERVICE_ACCOUNT_UID) -> str:
    """The run's Kubernetes ServiceAccount as a Workload Identity Federation principal, by its UID: "All GKE Pods that
    use a specific Kubernetes service account", by service account ID
    (``principal://.../workloadIdentityPools/PROJECT_ID.svc.id.goog/kubernetes.serviceaccount.uid/SERVICEACCOUNT_ID``:
    https://cloud.google.com/iam/docs/principal-identifiers, and GKE's "Authenticate to Google Cloud APIs from GKE
    workloads": https://cloud.google.com/kubernetes-engine/docs/how-to/workload-identity, whose principal identifiers
    are those of https://cloud.google.com/kubernetes-engine/docs/concepts/workload-identity#principal-id-examples).
    A UID is the object's alone: "Every object created over the whole lifetime of a Kubernetes cluster has a distinct
    UID" (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#uids), so neither a ServiceAccount
    of the same namespace and name in another cluster of the project's workload identity pool, nor one made again
    under that name in the run's cluster, is this principal, where ``subject/ns/NAMESPACE/sa/NAME`` is all of them
    ("Identity sameness", same page). The project number and the UID are filled in when deploy_raycluster has created
    the ServiceAccount (``components.cloud.storage.member``)."""
    return (
        "principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/workloadIdentityPools/"
        f"{t.project}.svc.id.goog/kubernetes.serviceaccount.uid/{uid}"
    )


def binding_titles(t: Target) -> tuple[str, str]:
    """The titles of the conditions of the run's two bindings on the bucket (``bucket_binding``, ``cache_binding``):
    what teardown finds them by in the bucket's policy, which only the pipeline's identity writes."""
    return f"tpupipe run {t.run_id}", f"tpupipe run {t.run_id}: cache"


def bucket_binding(t: Target) -> dict[str, Any]:
    """The IAM binding that lets the run's Kubernetes ServiceAccount read and write the objects under the run's own
    prefix (``runs/<run id>/``) and nothing else: an IAM condition on the object's name
    (https://cloud.google.com/storage/docs/access-control/iam#conditions; Cloud Storage names an object
    ``projects/_/buckets/BUCKET/objects/NAME``: https://cloud.google.com/iam/docs/conditions-resource-attributes).
    Listing is a permission on the bucket itself, which GCS FUSE needs, so the condition also holds for the bucket
    resource: the pods can list the bucket's object names, not read or write another run's objects or the control
    state (``state/``, ``builds/``, the pipeline root). In a bucket with hierarchical namespace the run's folders are
    admitted too (``prefix_condition``). The cache prefix they may only read (``cache_binding``)."""
    return {
        "bucket": t.bucket,
        "role": "roles/storage.objectUser",
        "member": member(t),
        "condition": {
            "title": binding_titles(t)[0],
            "description": f"the objects under {names.run_prefix(t.run_id)}/ only, and listing the bucket",
            "expression": (
                f'{prefix_condition(t.bucket, names.run_prefix(t.run_id))} || resource.type == "{BUCKET_RESOURCE_TYPE}"'
            ),
        },
    }


def cache_binding(t: Target) -> dict[str, Any]:
    """The IAM binding that lets the run's pods read the cache prefix (``cache/``: the base weights, the compiled
    programs) and not write it: ``roles/storage.objectViewer`` holds ``storage.objects.get`` and ``list``, no
    ``create`` or ``delete`` (https://cloud.google.com/storage/docs/access-control/iam-roles), on the objects under
    ``cache/`` only (an IAM condition, as ``bucket_binding``). JAX runs what its compilation cache holds ("The
    compilation cache is considered trusted", https://docs.jax.dev/en/latest/persistent_compilation_cache.html), so
    no run's pod may write what another run loads: the pipeline's identity alone promotes entries into it, with their
    hashes in ``state/`` (``components.workload.cache_trust``)."""
    return {
        "bucket": t.bucket,
        "role": "roles/storage.objectViewer",
        "member": member(t),
        "condition": {
            "title": binding_titles(t)[1],
            "description": f"reading the objects under {CACHE_PREFIX}/ only",
            "expression": prefix_condition(t.bucket, CACHE_PREFIX),
        },
    }
