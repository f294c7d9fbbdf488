"""What the gke platform creates, derived from the run spec and the TPU catalogue (docs/architecture.md).

Pure functions of (spec, run id) that return data: GKE API bodies in the REST JSON form that
``google.cloud.container_v1`` parses (``NodePool.from_json``), Compute Engine REST bodies, and the facts the
Kubernetes manifests (``manifests``) are built from. Nothing here talks
to a cloud; the unit tests pin every derivation for every accelerator family.

Sources of the GKE facts:
- TPU node pools, multi-host slices one per node pool, ``--tpu-topology`` only for multi-host slices, Spot,
  reservations: https://cloud.google.com/kubernetes-engine/docs/how-to/tpus and
  https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus
- TPU7x multi-host node pools are placed by a Compute Engine workload policy (HIGH_THROUGHPUT, with the slice
  topology) given as the node pool's placement policy, in place of the TPU topology:
  https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood
- Flex-start node pools (flex_start, autoscaling from 0 with location policy ANY, no reservation, no
  auto-repair): https://docs.cloud.google.com/kubernetes-engine/docs/concepts/dws and xpk's capacity.py
- Multislice (multi-host slices only): https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice
- DCN NICs through managed DRANET (``cloud.google.com/gke-networking-dra-driver=true`` node label, device class
  ``netdev.google.com``): https://docs.cloud.google.com/kubernetes-engine/docs/how-to/allocate-network-resources-dra;
  either two additional node networks (the multislice Ray Train tutorial,
  https://docs.cloud.google.com/kubernetes-engine/docs/tutorials/multi-slice-training-ray) or the node pool's
  ``accelerator_network_profile=auto`` (GKE creates the networks).
- Autopilot TPU pods: node selectors for the TPU and for Spot / reservations / flex-start:
  https://cloud.google.com/kubernetes-engine/docs/how-to/tpus-autopilot
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from components.platforms.credentials import CLOUD_PLATFORM_SCOPE
from components.spec import RunSpec, SpecError, names
from components.tpu import catalogue
from components.workload.derive import (
    WORKLOAD_IMAGES,
    has_dcn_nics,
    job_command,
    slice_shape,
)

# --- Kubernetes and GKE strings ----------------------------------------------------------------------------
TPU_RESOURCE = "google.com/tpu"
NODE_LABEL_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
NODE_LABEL_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
NODE_LABEL_NODE_POOL = "cloud.google.com/gke-nodepool"
DRA_NETWORKING_LABEL = "cloud.google.com/gke-networking-dra-driver"
NETDEV_DEVICE_CLASS = "netdev.google.com"

AUTOPILOT_CAPACITY_SELECTORS = {
    "spot": {"cloud.google.com/gke-spot": "true"},
    "flex-start": {"cloud.google.com/gke-flex-start": "true"},
}

# --- Multislice DCN networking, the tutorial's way ---------------------------------------------------------
DCN_SUBNET_RANGES = ("10.50.0.0/16", "10.60.0.0/16")  # one extra VPC network (and subnet) per range
DCN_MTU = 8896
# A new VPC network denies all ingress: each DCN network gets a rule that allows what comes from its own subnet (the
# other slices' NICs), every port of TCP, UDP and ICMP, as the established multislice tooling (xpk) does for each
# extra network (../shared/reference/platform-facts.md, "GKE / multislice details").
DCN_FIREWALL_PROTOCOLS = ("tcp", "udp", "icmp")
DCN_NIC_PREFIXES = "eth1,eth2,lo"  # the DRANET NICs, then loopback
MEGASCALE_PORT = 9915
# XLA TPU flags that overlap collectives with compute (MaxText's recommended set), then the NICs to use.
LIBTPU_COLLECTIVE_FLAGS = (
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
)
RAY_VERSION = "2.60.0"

# --- The nodes' identity ------------------------------------------------------------------------------------------
# Unless gke.node_service_account names another, nodes run as the project's default Compute Engine service account.
DEFAULT_NODE_SERVICE_ACCOUNT = "PROJECT_NUMBER-compute@developer.gserviceaccount.com"
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
MOUNT_PATH = "/data"


# ================================================================= where the run goes


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

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    @property
    def run_dir(self) -> str:
        """Where the run's jobs write (checkpoints, results): the bucket, mounted in every pod."""
        return f"{MOUNT_PATH}/{names.run_prefix(self.run_id)}"


def node_roles(t: Target) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The roles the nodes' account needs (``NODE_SERVICE_ACCOUNT_ROLES``): image pulls only when the trainer image is
    in this project's Artifact Registry (an image elsewhere is that registry's to grant)."""
    pulls_here = f"-docker.pkg.dev/{t.project}/" in t.image
    return {
        role: needs
        for role, needs in NODE_SERVICE_ACCOUNT_ROLES.items()
        if pulls_here or role != "roles/artifactregistry.reader"
    }


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def target(spec: RunSpec, run_id: str) -> Target:
    g = spec.gke
    project = g.project or names.PLACEHOLDER_PROJECT
    zone = g.zone or catalogue.zones(spec.cluster.accelerator)[0]
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
    )


BUILD_STEP_IMAGE = "gcr.io/cloud-builders/docker"
BUILD_TIMEOUT_S = 3600
BUILD_MACHINE_TYPE = "E2_HIGHCPU_8"


def cloud_build(spec: RunSpec, t: Target) -> dict[str, Any]:
    """The Cloud Build that builds the workload's trainer image (``images/<name>/Dockerfile``, the repository as
    context, uploaded to the bucket) and pushes it to Artifact Registry. The torch image gets torch-tpu and libtpu from
    PyPI; built FROM a TorchTPU base image (``gke.torch_tpu_base``), it keeps the base's torch, torch_tpu and libtpu
    (``TORCH_FROM_BASE=1``: the requirements' pins of those three are not installed over them)."""
    name = WORKLOAD_IMAGES[spec.train.workload]
    args = ["build", "--file", f"images/{name}/Dockerfile", "--tag", t.image]
    if name == "torch" and spec.gke.torch_tpu_base:
        args += ["--build-arg", f"TORCH_TPU_BASE={spec.gke.torch_tpu_base}", "--build-arg", "TORCH_FROM_BASE=1"]
    return {
        "source": {"storageSource": {"bucket": t.bucket, "object": names.build_source(t.run_id)}},
        "steps": [{"name": BUILD_STEP_IMAGE, "args": [*args, "."]}],
        "images": [t.image],
        "tags": ["tpupipe", names.build_tag(t.run_id)],
        "timeout": f"{BUILD_TIMEOUT_S}s",
        "options": {"machineType": BUILD_MACHINE_TYPE, "logging": "CLOUD_LOGGING_ONLY"},
    }


def entrypoint(spec: RunSpec, t: Target) -> str:
    """The Ray job entrypoint of the train stage on GKE."""
    return job_command(spec, "train", t.run_dir, t.run_id)


def _reservation_affinity(reservation: str) -> dict[str, Any]:
    return {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": [reservation],
    }


def tpu_node_pools(spec: RunSpec, t: Target) -> list[dict[str, Any]]:
    """One node pool per slice (``NodePool`` REST bodies); none in autopilot mode (GKE makes the nodes)."""
    if t.autopilot:
        return []
    c = spec.cluster
    shape = slice_shape(spec)
    pools = []
    for index in range(c.num_slices):
        node_labels = names.labels(t.run_id, **{names.SLICE_LABEL: str(index)})
        if has_dcn_nics(spec):
            node_labels[DRA_NETWORKING_LABEL] = "true"
        config: dict[str, Any] = {
            "machineType": shape.machine_type,
            "labels": node_labels,
            "resourceLabels": names.labels(t.run_id),
            "oauthScopes": [CLOUD_PLATFORM_SCOPE],
            "serviceAccount": t.node_service_account,
            "workloadMetadataConfig": {"mode": "GKE_METADATA"},
        }
        if shape.family.threads_per_core is not None:
            config["advancedMachineFeatures"] = {"threadsPerCore": str(shape.family.threads_per_core)}
        pool: dict[str, Any] = {
            "name": names.tpu_node_pool(t.run_id, index),
            "initialNodeCount": shape.num_hosts,
            "locations": [t.zone],
            "config": config,
        }
        if shape.multi_host:
            if shape.family.name == "tpu7x":
                pool["placementPolicy"] = {"policyName": names.workload_policy(t.run_id)}
            else:
                pool["placementPolicy"] = {"tpuTopology": shape.topology}
        _set_capacity(pool, spec)
        if has_dcn_nics(spec):
            _set_dcn_nics(pool, spec, t)
        pools.append(pool)
    return pools


def _set_capacity(pool: dict[str, Any], spec: RunSpec) -> None:
    """Spot, a reservation, or flex-start (autoscaling from 0 with location policy ANY, no auto-repair)."""
    c, config = spec.cluster, pool["config"]
    if c.capacity == "spot":
        config["spot"] = True
    elif c.capacity == "reservation":
        config["reservationAffinity"] = _reservation_affinity(c.reservation)
    elif c.capacity == "flex-start":
        config["flexStart"] = True
        config["reservationAffinity"] = {"consumeReservationType": "NO_RESERVATION"}
        pool["initialNodeCount"] = 0
        pool["autoscaling"] = {
            "enabled": True,
            "minNodeCount": 0,
            "maxNodeCount": slice_shape(spec).num_hosts,
            "locationPolicy": "ANY",
        }
        pool["management"] = {"autoRepair": False}


def _set_dcn_nics(pool: dict[str, Any], spec: RunSpec, t: Target) -> None:
    """gVNIC and the extra NICs for the DCN traffic between slices: the run's networks, or the accelerator profile."""
    pool["config"]["gvnic"] = {"enabled": True}
    if spec.gke.multislice_network == "dcn_networks":
        pool["networkConfig"] = {
            "additionalNodeNetworkConfigs": [
                {"network": names.dcn_network(t.run_id, i), "subnetwork": names.dcn_subnet(t.run_id, i)}
                for i in range(len(DCN_SUBNET_RANGES))
            ]
        }
    else:
        pool["networkConfig"] = {"acceleratorNetworkProfile": "auto"}


def cpu_node_pool(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """The CPU node pool that carries the Ray head (standard mode)."""
    if t.autopilot:
        return None
    return {
        "name": names.cpu_node_pool(t.run_id),
        "initialNodeCount": 1,
        "locations": [t.zone],
        "config": {
            "machineType": spec.gke.cpu_machine_type,
            "labels": names.labels(t.run_id),
            "resourceLabels": names.labels(t.run_id),
            "oauthScopes": [CLOUD_PLATFORM_SCOPE],
            "serviceAccount": t.node_service_account,
            "workloadMetadataConfig": {"mode": "GKE_METADATA"},
        },
    }


def cluster(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """The ``Cluster`` REST body of a cluster the run creates: the Ray Operator add-on, the GCS FUSE CSI
    driver, Workload Identity, Dataplane V2, image streaming, multi-networking for the DCN NICs, and the
    CPU pool. None when the run uses an existing cluster."""
    if not t.owns_cluster:
        return None
    body: dict[str, Any] = {
        "name": t.cluster,
        "resourceLabels": names.labels(t.run_id),
        "addonsConfig": {
            "rayOperatorConfig": {"enabled": True},
            "gcsFuseCsiDriverConfig": {"enabled": True},
        },
        "workloadIdentityConfig": {"workloadPool": f"{t.project}.svc.id.goog"},
    }
    if spec.gke.cluster_version:
        body["initialClusterVersion"] = spec.gke.cluster_version
    if t.autopilot:  # the nodes Autopilot makes run as the nodes' account too
        body["autopilot"] = {"enabled": True}
        body["autoscaling"] = {
            "autoprovisioningNodePoolDefaults": {
                "serviceAccount": t.node_service_account,
                "oauthScopes": [CLOUD_PLATFORM_SCOPE],
            }
        }
        return body
    body["networkConfig"] = {"datapathProvider": "ADVANCED_DATAPATH"}
    if has_dcn_nics(spec):  # both ways of giving the pods DCN NICs need it (xpk enables it with the profile too)
        body["networkConfig"]["enableMultiNetworking"] = True
    body["ipAllocationPolicy"] = {"useIpAliases": True}
    if spec.gke.pod_range:
        body["ipAllocationPolicy"]["clusterIpv4CidrBlock"] = spec.gke.pod_range
    if spec.gke.service_range:
        body["ipAllocationPolicy"]["servicesIpv4CidrBlock"] = spec.gke.service_range
    body["nodePoolDefaults"] = {"nodeConfigDefaults": {"gcfsConfig": {"enabled": True}}}
    body["nodePools"] = [cpu_node_pool(spec, t)]
    return body


def workload_policy(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """The Compute Engine ``ResourcePolicy`` that places TPU7x multi-host slices (standard mode)."""
    shape = slice_shape(spec)
    if t.autopilot or shape.family.name != "tpu7x" or not shape.multi_host:
        return None
    return {
        "name": names.workload_policy(t.run_id),
        "region": t.region,
        "description": f"{names.RUN_LABEL}={t.run_id}",
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": shape.topology},
    }


def dcn_networks(spec: RunSpec, t: Target) -> list[dict[str, Any]]:
    """The extra VPC networks (custom subnets, jumbo MTU), their subnets and the firewall rules that let the slices'
    traffic in, one network per DCN NIC: the tutorial's way. Compute Engine networks and firewall rules take no
    labels: the run id is in the description and the name."""
    if not has_dcn_nics(spec) or spec.gke.multislice_network != "dcn_networks" or t.autopilot:
        return []
    out = []
    for index, cidr in enumerate(DCN_SUBNET_RANGES):
        network = names.dcn_network(t.run_id, index)
        out.append(
            {
                "network": {
                    "name": network,
                    "autoCreateSubnetworks": False,
                    "mtu": DCN_MTU,
                    "description": f"{names.RUN_LABEL}={t.run_id}",
                },
                "subnetwork": {
                    "name": names.dcn_subnet(t.run_id, index),
                    "network": f"projects/{t.project}/global/networks/{network}",
                    "region": t.region,
                    "ipCidrRange": cidr,
                    "description": f"{names.RUN_LABEL}={t.run_id}",
                },
                "firewall": {
                    "name": names.dcn_firewall(t.run_id, index),
                    "network": f"projects/{t.project}/global/networks/{network}",
                    "direction": "INGRESS",
                    "priority": 1000,
                    "sourceRanges": [cidr],
                    "allowed": [{"IPProtocol": protocol} for protocol in DCN_FIREWALL_PROTOCOLS],
                    "description": f"{names.RUN_LABEL}={t.run_id}",
                },
            }
        )
    return out


def dcn_range_overlap(spec: RunSpec, t: Target, ranges: dict[str, str]) -> tuple[str, str, str] | None:
    """The first of the cluster's ``ranges`` (field -> CIDR, e.g. its Pod and Service ranges) that overlaps a DCN
    subnet of the run, as (field, range, DCN range); None when none does (or the run makes no DCN networks)."""
    dcn = [net["subnetwork"]["ipCidrRange"] for net in dcn_networks(spec, t)]
    for key, value in ranges.items():
        for cidr in dcn if value else ():
            if ipaddress.ip_network(value, strict=False).overlaps(ipaddress.ip_network(cidr)):
                return key, value, cidr
    return None


def check_ranges(spec: RunSpec, t: Target) -> None:
    """The Pod and Service ranges the spec pins must not overlap the DCN subnets: a SpecError naming the field."""
    overlap = dcn_range_overlap(
        spec, t, {"gke.pod_range": spec.gke.pod_range, "gke.service_range": spec.gke.service_range}
    )
    if overlap:
        key, value, cidr = overlap
        raise SpecError(
            key,
            f"{value} overlaps the DCN subnet {cidr} (gke.multislice_network=dcn_networks makes "
            f"{', '.join(DCN_SUBNET_RANGES)})",
            ["a range that overlaps none of them"],
        )


def bucket_binding(t: Target) -> dict[str, Any]:
    """The IAM binding that lets the run's Kubernetes ServiceAccount read and write the bucket (Workload
    Identity Federation principal; the project number is looked up when the run provisions)."""
    return {
        "bucket": t.bucket,
        "role": "roles/storage.objectUser",
        "member": (
            "principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/workloadIdentityPools/"
            f"{t.project}.svc.id.goog/subject/ns/{t.namespace}/sa/{t.service_account}"
        ),
    }


def worker_node_selector(spec: RunSpec, t: Target) -> dict[str, str]:
    """Where the TPU worker pods go: the slice shape, and the run's own node pools (standard) or the capacity
    type (autopilot, where the selectors make GKE create matching nodes)."""
    shape = slice_shape(spec)
    selector = {NODE_LABEL_ACCELERATOR: shape.family.gke_accelerator, NODE_LABEL_TOPOLOGY: shape.topology}
    if not t.autopilot:
        selector[names.RUN_LABEL] = t.run_id
        return selector
    c = spec.cluster
    selector.update(AUTOPILOT_CAPACITY_SELECTORS.get(c.capacity, {}))
    if c.capacity == "reservation":
        project, _, name = c.reservation.rpartition("/reservations/")
        selector["cloud.google.com/reservation-name"] = name
        selector["cloud.google.com/reservation-affinity"] = "specific"
        if project:  # a shared reservation of another project: projects/P/reservations/NAME
            selector["cloud.google.com/reservation-project"] = project.removeprefix("projects/")
    return selector


def head_node_selector(spec: RunSpec, t: Target) -> dict[str, str]:
    if t.autopilot:
        return {}
    return {NODE_LABEL_NODE_POOL: names.cpu_node_pool(t.run_id)}


def libtpu_init_args(spec: RunSpec) -> str:
    flags = list(LIBTPU_COLLECTIVE_FLAGS)
    if has_dcn_nics(spec):
        flags.append(f"--megascale_grpc_interface_prefixes={DCN_NIC_PREFIXES}")
    return " ".join(flags)


# Compute Engine resources by the ledger's kind: where their REST collection lives (global or in the region).
COMPUTE_COLLECTIONS = {
    "network": ("global", "networks"),
    "subnetwork": ("regional", "subnetworks"),
    "resource_policy": ("regional", "resourcePolicies"),
    "firewall": ("global", "firewalls"),
}


def compute_path(kind: str, t: Target, name: str) -> str:
    """``projects/P/global/networks/N`` or ``projects/P/regions/R/<collection>/N``: the name Compute Engine's API and
    the run's ledger use."""
    scope, collection = COMPUTE_COLLECTIONS[kind]
    where = "global" if scope == "global" else f"regions/{t.region}"
    return f"projects/{t.project}/{where}/{collection}/{name}"
