"""The plan's records: one :class:`Resource` per thing a gke run creates or uses in Google Cloud, in creation
order, each with the call that creates (or gets) it, the path that call takes and the body it sends. ``plan.resources``
lists them (with the Kubernetes objects of ``k8s_records``); the gke platform walks them, the dry run prints them.
Pure functions of (spec, target): no credentials and no network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.platforms.gke.plan import compute_resources as cr
from components.platforms.gke.plan import features, network, paths, queued
from components.platforms.gke.plan import resources as r
from components.platforms.gke.plan.target import Target, bucket_binding, cache_binding
from components.spec import RunSpec, names
from components.workload import derive as d
from components.workload.cache import CACHE_PREFIX

# The stage that creates each kind of resource; a stage walks the plan's records of its own kinds, in plan order.
STAGE_OF_KIND = {
    "vpc-network": "provision",
    "subnetwork": "provision",
    "firewall-rule": "provision",
    "workload-policy": "provision",
    "cloud-nat": "provision",
    "gcs-bucket": "provision",
    "iam-binding": "deploy_raycluster",  # after the ServiceAccount it names by UID (``target.member``)
    "gke-cluster": "provision",
    "node-pool": "provision",
    "autopilot-tpu-nodes": "provision",
    "kueue-queue": "provision",
    "artifact-repository": "build_image",
    "build-source": "build_image",
    "container-image": "build_image",
    "k8s/Namespace": "deploy_raycluster",
    "k8s/ServiceAccount": "deploy_raycluster",
    "k8s/ResourceClaimTemplate": "deploy_raycluster",
    "k8s/NetworkPolicy": "deploy_raycluster",
    "k8s/PodTemplate": "deploy_raycluster",
    "k8s/ProvisioningRequest": "deploy_raycluster",
    "k8s/Secret": "deploy_raycluster",
    "k8s/RayCluster": "deploy_raycluster",
}


# The api of a resource created as part of another's request: the Ray head's CPU pool, in the cluster's body.
WITH_THE_CLUSTER = "container.clusters.create (in the cluster's body)"


@dataclass(frozen=True)
class Resource:
    """One resource of the plan: what the gke platform creates (or uses), in creation order.

    ``api`` is the call that creates (or gets) it and ``path`` the resource name that call takes; ``stage`` is the
    stage that walks it (``STAGE_OF_KIND``). The gke platform applies each record through its kind's handler, and
    ``tpupipe run --dry-run`` prints the same walk."""

    kind: str
    name: str
    action: str  # create | use | get-or-create
    summary: str
    api: str = ""
    path: str = ""
    body: Any = None
    labels: dict[str, str] = field(default_factory=dict)
    deleted_by_teardown: bool = True
    price: tuple[str, str, str, int] | None = None  # (category, item, capacity, quantity) in the price table

    @property
    def stage(self) -> str:
        return STAGE_OF_KIND[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "action": self.action,
            "stage": self.stage,
            "labels": self.labels,
            "deleted_by_teardown": self.deleted_by_teardown,
            "summary": self.summary,
            "api": self.api,
            "path": self.path,
            "body": self.body,
        }


def capacity_text(spec: RunSpec) -> str:
    c = spec.cluster
    if queued.direct(spec):
        return (
            "queued (one ProvisioningRequest for this pool's nodes, which GKE taints cloud.google.com/gke-queued; "
            f"{queued.family_text(spec)})"
        )
    return f"reservation {c.reservation}" if c.capacity == "reservation" else c.capacity


def compute_records(spec: RunSpec, t: Target) -> list[Resource]:
    """The DCN networks, each with its subnet and the firewall rule that lets the slices' traffic in (multislice
    ``dcn_networks``), the subnetwork of a cluster the run creates and its Cloud NAT gateway when the run needs the
    internet (``network``), then the TPU7x workload policy: Compute Engine resources the cluster and node pools
    reference, so they come first (and teardown, walking them newest first, deletes each rule before its network,
    the NAT gateway before its subnetwork). They take no labels: their names derive from the run id."""
    out = []
    for net in cr.dcn_networks(spec, t):
        n, s, f = net["network"], net["subnetwork"], net["firewall"]
        protocols = ", ".join(a["IPProtocol"] for a in f["allowed"])
        out += [
            _compute_record(
                "vpc-network",
                n,
                f"DCN network, custom subnets, MTU {n['mtu']} (run id in its description: networks take no labels)",
                t,
            ),
            _compute_record("subnetwork", s, f"{s['ipCidrRange']} in {s['region']}", t),
            _compute_record(
                "firewall-rule",
                f,
                f"allows ingress to {n['name']} from "
                f"{', '.join(f['sourceRanges'])} (the slices' DCN traffic): all ports of {protocols}",
                t,
            ),
        ]
    subnet, nat = network.node_subnet(spec, t), network.cloud_nat(spec, t)
    if subnet:
        out.append(
            _compute_record(
                "subnetwork",
                subnet,
                f"{subnet['ipCidrRange']} in the default network of {subnet['region']}: the cluster's private nodes, "
                "Private Google Access on",
                t,
            )
        )
    if nat:
        out.append(
            _compute_record(
                "cloud-nat",
                nat,
                f"Cloud Router and NAT gateway for {subnet['name'] if subnet else ''} alone: "
                + "; ".join(network.internet_needs(spec, t)),
                t,
            )
        )
    policy = cr.workload_policy(spec, t)
    if policy:
        out.append(
            _compute_record(
                "workload-policy",
                policy,
                "Compute Engine workload policy HIGH_THROUGHPUT, accelerator "
                f"topology {d.slice_shape(spec).topology} (places each TPU7x slice)",
                t,
            )
        )
    return out


def _compute_record(kind: str, body: dict[str, Any], summary: str, t: Target) -> Resource:
    """The record of a Compute Engine resource: created by its collection's ``insert`` at its path, labelled in the
    plan with the run (the resource itself takes no labels)."""
    ledger_kind = cr.COMPUTE_KINDS[kind]
    collection = paths.COMPUTE_COLLECTIONS[ledger_kind][1]
    return Resource(
        kind,
        body["name"],
        "create",
        summary,
        labels=names.labels(t.run_id),
        body=body,
        api=f"compute.{collection}.insert",
        path=cr.compute_path(ledger_kind, t, body["name"]),
    )


def storage_records(t: Target) -> list[Resource]:
    """The checkpoint bucket (shared by runs, kept)."""
    prefix = f"gs://{t.bucket}/{names.run_prefix(t.run_id)}/"
    return [
        Resource(
            "gcs-bucket",
            f"gs://{t.bucket}",
            "get-or-create",
            f"checkpoints and results under {prefix}, that directory alone mounted "
            f"at {t.run_dir} in every pod (GCS FUSE); kept after the run",
            api="storage.buckets.get",
            path=t.bucket,
            deleted_by_teardown=False,
        ),
    ]


def binding_records(t: Target) -> list[Resource]:
    """The run's Workload Identity bindings on the bucket, made once deploy_raycluster has created the run's
    Kubernetes ServiceAccount, whose UID they name (``target.member``): its own prefix read and written, the cache
    prefix only read."""
    binding, cached = bucket_binding(t), cache_binding(t)
    prefix = f"gs://{t.bucket}/{names.run_prefix(t.run_id)}/"
    return [
        Resource(
            "iam-binding",
            f"{binding['role']} on gs://{t.bucket}",
            "create",
            f"for Kubernetes ServiceAccount {t.namespace}/{t.service_account} of cluster {t.cluster}, by its UID "
            "(Workload Identity principal: no ServiceAccount of that name in another cluster, or made again, is it), "
            f"on the objects under {prefix} only (an IAM condition): never the registered checkpoints under "
            f"gs://{t.bucket}/{names.MODELS_PREFIX}/, which register copies there with the pipeline's identity",
            labels=names.labels(t.run_id),
            body=binding,
            api="storage.buckets.setIamPolicy",
            path=t.bucket,
        ),
        Resource(
            "iam-binding",
            f"{cached['role']} on gs://{t.bucket}",
            "create",
            f"for the same ServiceAccount, reading the objects under gs://{t.bucket}/{CACHE_PREFIX}/ only (an IAM "
            "condition): the cache kept across runs, which no run's pods may write",
            labels=names.labels(t.run_id),
            body=cached,
            api="storage.buckets.setIamPolicy",
            path=t.bucket,
        ),
    ]


def cluster_features(spec: RunSpec, owns_cluster: bool) -> list[str]:
    """What the cluster has: created with it, or, for a cluster the spec names, checked before anything is created
    and enabled in place or refused (``features``)."""
    return [f.name if owns_cluster else f.promise() for f in features.needed(spec)]


def cluster_records(spec: RunSpec, t: Target) -> list[Resource]:
    """The GKE cluster (created, or the existing one used), the Ray head's CPU pool, one TPU pool per slice, or the
    TPU nodes Autopilot makes."""
    shape, c, labels = d.slice_shape(spec), spec.cluster, names.labels(t.run_id)
    body = r.cluster(spec, t)
    has = cluster_features(spec, t.owns_cluster)
    mode = "autopilot" if t.autopilot else "standard"
    cluster_path = t.cluster_path
    if t.owns_cluster:
        out = [
            Resource(
                "gke-cluster",
                t.cluster,
                "create",
                f"{mode} cluster in {t.location}: "
                + ", ".join(has)
                + f"; GKE {spec.gke.cluster_version or 'of the release channel'} on the {r.RELEASE_CHANNEL} release "
                "channel (node auto-upgrade on); nodes run as "
                f"{t.node_service_account}; {network.summary(spec, t)}",
                labels=labels,
                body=body,
                api="container.clusters.create",
                path=cluster_path,
                price=("gke", "cluster", "any", 1),
            )
        ]
    else:
        out = [
            Resource(
                "gke-cluster",
                t.cluster,
                "use",
                f"existing {mode} cluster in {t.location}, checked before "
                "anything is created; it must have: " + ", ".join(has),
                api="container.clusters.get (container.clusters.update for a feature enabled in place)",
                path=cluster_path,
                deleted_by_teardown=False,
            )
        ]
    cpu_pool = r.cpu_node_pool(spec, t)
    if cpu_pool:
        with_cluster = t.owns_cluster
        out.append(
            Resource(
                "node-pool",
                cpu_pool["name"],
                "create",
                f"{spec.gke.cpu_machine_type} x 1 for the Ray head"
                + (" (created with the cluster)" if with_cluster else ""),
                labels=labels,
                body=cpu_pool,
                api=WITH_THE_CLUSTER if with_cluster else "container.nodePools.create",
                path=paths.node_pool_path(cluster_path, cpu_pool["name"]),
                price=("machine", spec.gke.cpu_machine_type, "on-demand", 1),
            )
        )
    network_text = (
        {
            "dcn_networks": "additional node networks (DRANET NICs)",
            "accelerator_network_profile": "accelerator network profile auto (DRANET NICs)",
            "none": "default network only",
        }[spec.gke.multislice_network]
        if d.is_multislice(spec)
        else ""
    )
    for index, pool in enumerate(r.tpu_node_pools(spec, t)):
        placement = pool.get("placementPolicy", {})
        where = (
            f"topology {placement['tpuTopology']}"
            if "tpuTopology" in placement
            else f"placement {placement['policyName']}"
            if placement
            else f"topology {shape.topology} (single host)"
        )
        out.append(
            Resource(
                "node-pool",
                pool["name"],
                "create",
                f"slice {index}: {shape.machine_type} x {shape.num_hosts}, {where}, "
                f"{capacity_text(spec)}" + (f", {network_text}" if network_text else ""),
                labels=labels,
                body=pool,
                api="container.nodePools.create",
                path=paths.node_pool_path(cluster_path, pool["name"]),
                price=("tpu", shape.family.name, c.capacity, shape.num_chips),
            )
        )
    if t.queue:
        priority = f", priority class {t.priority_class}" if t.priority_class else ""
        out.append(
            Resource(
                "kueue-queue",
                t.queue,
                "use",
                f"Kueue LocalQueue {t.namespace}/{t.queue} of cluster {t.cluster}{priority}: no node pool is created; "
                f"the RayCluster (labelled kueue.x-k8s.io/queue-name={t.queue}) waits there, suspended, until its "
                f"ClusterQueue's quota admits {c.num_slices} x {shape.num_hosts} {shape.machine_type} "
                f"({shape.num_chips * c.num_slices} google.com/tpu)"
                + (
                    f" and its ProvisioningRequest admission check ({queued.CHECK_CONTROLLER}, class "
                    f"{queued.CLASS_NAME}) has the slice's hosts provisioned at once (Kueue makes the request; the "
                    f"pods tolerate the nodes' cloud.google.com/gke-queued taint; {queued.family_text(spec)})"
                    if queued.through_kueue(spec)
                    else ""
                )
                + ", within run.deadline_h; checked before anything is created",
                api="kubernetes get kueue.x-k8s.io/v1beta2",
                path=f"namespaces/{t.namespace}/localqueues/{t.queue}",
                deleted_by_teardown=False,
                price=("tpu", shape.family.name, c.capacity, shape.num_chips * c.num_slices),
            )
        )
    if t.autopilot:
        out.append(
            Resource(
                "autopilot-tpu-nodes",
                names.worker_group(shape.pod_type),
                "create",
                f"{c.num_slices} x {shape.num_hosts} {shape.machine_type} nodes made by Autopilot for the worker pods "
                f"({capacity_text(spec)})",
                labels=labels,
                api="by GKE Autopilot, from the pods' node selectors",
                price=("tpu", shape.family.name, c.capacity, shape.num_chips * c.num_slices),
            )
        )
    return out


def _torch_wheels(spec: RunSpec, image: str) -> str:
    """What the torch image's torch is, and what the hosts pull for it."""
    if image != "torch":
        return ""
    if spec.gke.torch_tpu_base:
        return f"; torch, torch_tpu and libtpu from the base image {spec.gke.torch_tpu_base}"
    return (
        f"; torch's CPU build (a {r.TORCH_CPU_WHEEL_MB} MB wheel from download.pytorch.org/whl/cpu), none of PyPI's "
        "CUDA wheels (triton, nvidia-*)"
    )


def image_records(spec: RunSpec, t: Target) -> list[Resource]:
    """The trainer image: named by gke.image, or built by Cloud Build into the Artifact Registry repository."""
    image = d.trainer_image(spec)
    if spec.gke.image:
        return [
            Resource(
                "container-image",
                t.image,
                "use",
                f"trainer image ({image}), named by gke.image",
                deleted_by_teardown=False,
            )
        ]
    repository = f"projects/{t.project}/locations/{t.region}/repositories/{spec.gke.artifact_repository}"
    return [
        Resource(
            "artifact-repository",
            repository,
            "get-or-create",
            "the Docker repository the trainer images go to",
            api="artifactregistry.repositories.create",
            path=repository,
            deleted_by_teardown=False,
        ),
        Resource(
            "build-source",
            f"gs://{t.bucket}/{names.build_source(t.run_id)}",
            "create",
            f"the build context (images/{image}/ and the tpupipe sources), for Cloud Build; not uploaded when the "
            "trainer image is reused",
            api="storage.objects.insert",
            path=f"{t.bucket}/{names.build_source(t.run_id)}",
            deleted_by_teardown=False,
        ),
        Resource(
            "container-image",
            t.image,
            "get-or-create",
            f"trainer image ({image}): reused when the repository holds one built from the same build context "
            f"(tagged {names.CONTENT_TAG_PREFIX}HASH, the context's hash), else built by Cloud Build and pushed to "
            f"Artifact Registry repository {spec.gke.artifact_repository} under both tags" + _torch_wheels(spec, image),
            labels=names.labels(t.run_id),
            body=r.cloud_build(spec, t),
            api="cloudbuild.builds.create",
            path=f"projects/{t.project}/locations/{t.region}",
            deleted_by_teardown=False,
        ),
    ]
