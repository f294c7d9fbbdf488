"""What the gke platform creates, derived from the run spec and the TPU catalogue (architecture decision 6).

Pure functions of (spec, run id) that return data: GKE API bodies in the REST JSON form that
``google.cloud.container_v1`` parses (``NodePool.from_json``), Compute Engine REST bodies, Ray ``ScalingConfig``
arguments, and the facts the Kubernetes manifests (``components.manifests``) are built from. Nothing here talks
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

import json
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any

from components import catalogue, names
from components.spec import RunSpec

# --- Kubernetes and GKE strings ----------------------------------------------------------------------------
TPU_RESOURCE = "google.com/tpu"
NODE_LABEL_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
NODE_LABEL_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
NODE_LABEL_NODE_POOL = "cloud.google.com/gke-nodepool"
DRA_NETWORKING_LABEL = "cloud.google.com/gke-networking-dra-driver"
NETDEV_DEVICE_CLASS = "netdev.google.com"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
AUTOPILOT_CAPACITY_SELECTORS = {
    "spot": {"cloud.google.com/gke-spot": "true"},
    "flex-start": {"cloud.google.com/gke-flex-start": "true"},
}

# --- Multislice DCN networking, the tutorial's way ---------------------------------------------------------
DCN_SUBNET_RANGES = ("10.50.0.0/16", "10.60.0.0/16")  # one extra VPC network (and subnet) per range
DCN_MTU = 8896
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

# --- Minimum GKE versions (checked when gke.cluster_version is given) ---------------------------------------
# TPU7x: https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood
# v6e: https://docs.ray.io/en/latest/cluster/kubernetes/user-guides/gcp-gke-tpu-cluster.html
# managed DRANET: Standard per allocate-network-resources-dra (above); Autopilot per the multislice tutorial.
MIN_GKE_VERSION_FOR_FAMILY = {
    ("tpu7x", "standard"): "1.34.0-gke.2201000",
    ("tpu7x", "autopilot"): "1.34.1-gke.3084001",
    ("v6e", "standard"): "1.31.2-gke.1115000",
}
MIN_GKE_VERSION_FOR_DRANET = {"standard": "1.34.1-gke.1829001", "autopilot": "1.35.2-gke.1842000"}

# --- Workloads ---------------------------------------------------------------------------------------------
# The trainer image (images/<name>) and the train job's entrypoint (module, positional arguments) of each workload,
# as components.stages submits them. TorchTPU workloads (fsdp) run one Ray Train worker per TPU device and keep
# the head free of work (num-cpus 0); JAX workloads (maxtext) run one worker per host.
WORKLOAD_IMAGES = {"fsdp": "torch", "maxtext": "maxtext"}
WORKLOAD_ENTRYPOINTS = {  # workload -> mode -> python -m arguments
    "fsdp": {"train": ("trainers.fsdp",), "eval": ("trainers.evaluate",)},
    "maxtext": {"train": ("trainers.maxtext_train", "train"), "eval": ("trainers.maxtext_train", "eval")},
}
DEVICE_CENTRIC_WORKLOADS = ("fsdp",)
RAY_VERSION = "2.60.0"
MOUNT_PATH = "/data"


# ================================================================= the slice and the Ray workers


def slice_shape(spec: RunSpec) -> catalogue.SliceShape:
    """The catalogue row of the spec's slice (TPU accelerators only)."""
    return catalogue.slice_shape(spec.cluster.accelerator, spec.cluster.topology)


def is_tpu(spec: RunSpec) -> bool:
    return spec.cluster.accelerator != "cpu"


def workers_per_host(spec: RunSpec) -> int:
    """Ray Train workers on each host: one per TPU device for device-centric workloads, else one."""
    if is_tpu(spec) and spec.train.workload in DEVICE_CENTRIC_WORKLOADS:
        return slice_shape(spec).logical_devices_per_host
    return 1


def workers_per_slice(spec: RunSpec) -> int:
    return workers_per_host(spec) * spec.cluster.num_hosts


def cluster_workers(spec: RunSpec) -> int:
    """Ray Train workers the whole cluster holds."""
    return workers_per_slice(spec) * spec.cluster.num_slices


def is_elastic(spec: RunSpec) -> bool:
    return bool(spec.train.min_workers or spec.train.max_workers)


def num_workers(spec: RunSpec) -> int | tuple[int, int]:
    """Ray Train's ``num_workers``: a count, or the elastic range (min, max)."""
    t = spec.train
    if is_elastic(spec):
        return (t.min_workers, t.max_workers)
    if not is_tpu(spec):
        return spec.num_workers
    return t.num_workers or cluster_workers(spec)


def scaling_config_args(spec: RunSpec) -> dict[str, Any]:
    """Ray ``ScalingConfig`` arguments: one worker per emulated host on cpu; on TPU one per device (TorchTPU)
    or one per host (JAX, spread one per host); Ray derives the slices from the topology and gang-reserves each."""
    c = spec.cluster
    if not is_tpu(spec):
        return {
            "num_workers": num_workers(spec),
            "resources_per_worker": {"CPU": c.cpus_per_host},
            "placement_strategy": "SPREAD",
        }
    shape = slice_shape(spec)
    args: dict[str, Any] = {
        "num_workers": num_workers(spec),
        "use_tpu": True,
        "topology": shape.topology,
        "accelerator_type": shape.family.ray_accelerator_type,
    }
    if spec.train.workload in DEVICE_CENTRIC_WORKLOADS:
        args["resources_per_worker"] = {"TPU": 1}
    else:
        args["resources_per_worker"] = {"TPU": shape.logical_devices_per_host}
        args["placement_strategy"] = "SPREAD"
    return args


def run_config_args(spec: RunSpec) -> dict[str, Any]:
    """The failure budget of Ray Train's ``RunConfig(failure_config=FailureConfig(...))``."""
    return {"failure_config": {"max_failures": spec.train.max_failures}}


def is_multislice(spec: RunSpec) -> bool:
    return is_tpu(spec) and spec.cluster.num_slices > 1


def has_dcn_nics(spec: RunSpec) -> bool:
    """Whether worker pods get the extra NICs for the DCN traffic between slices."""
    return is_multislice(spec) and spec.gke.multislice_network != "none"


def tpu_resource_per_chip(spec: RunSpec) -> int:
    """Ray TPU resources per chip: 2 on TPU7x (one per TensorCore, RAY_TPU_RESOURCE_PER_CHIP), else 1."""
    return slice_shape(spec).family.logical_devices_per_chip


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

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    @property
    def run_dir(self) -> str:
        """Where the run's jobs write (checkpoints, results): the bucket, mounted in every pod."""
        return f"{MOUNT_PATH}/{names.run_prefix(self.run_id)}"


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
    )


BUILD_STEP_IMAGE = "gcr.io/cloud-builders/docker"
BUILD_TIMEOUT_S = 3600
BUILD_MACHINE_TYPE = "E2_HIGHCPU_8"


def cloud_build(spec: RunSpec, t: Target) -> dict[str, Any]:
    """The Cloud Build that builds the workload's trainer image (``images/<name>/Dockerfile``, the repository as
    context, uploaded to the bucket) and pushes it to Artifact Registry. The torch image on TPU hosts is built
    FROM the TorchTPU base image (``gke.torch_tpu_base``)."""
    name = WORKLOAD_IMAGES[spec.train.workload]
    args = ["build", "--file", f"images/{name}/Dockerfile", "--tag", t.image]
    if name == "torch" and spec.gke.torch_tpu_base:
        args += ["--build-arg", f"TORCH_TPU_BASE={spec.gke.torch_tpu_base}"]
    return {
        "source": {"storageSource": {"bucket": t.bucket, "object": names.build_source(t.run_id)}},
        "steps": [{"name": BUILD_STEP_IMAGE, "args": [*args, "."]}],
        "images": [t.image],
        "tags": ["tpupipe", names.build_tag(t.run_id)],
        "timeout": f"{BUILD_TIMEOUT_S}s",
        "options": {"machineType": BUILD_MACHINE_TYPE, "logging": "CLOUD_LOGGING_ONLY"},
    }


def job_command(spec: RunSpec, mode: str, output_dir: str, run_name: str, checkpoint: str = "") -> str:
    """The Ray job entrypoint of the workload: ``mode`` train, or eval of ``checkpoint``. The spec travels
    whole, as JSON. One source for the stages' job submissions and the RayJob manifest."""
    module = WORKLOAD_ENTRYPOINTS[spec.train.workload][mode]
    words = ["python", "-m", *module]
    args = {"spec": spec.to_json(), "output_dir": output_dir}
    if mode == "train" or spec.train.workload == "maxtext":
        args["run_name"] = run_name
    if mode == "eval":
        args["checkpoint"] = checkpoint
    for key, value in args.items():
        words += [f"--{key.replace('_', '-')}", shlex.quote(value)]
    return " ".join(words)


def entrypoint(spec: RunSpec, t: Target) -> str:
    """The Ray job entrypoint of the train stage on GKE."""
    return job_command(spec, "train", t.run_dir, t.run_id)


def runtime_env_yaml() -> str:
    """The Ray job's runtime environment: JSON, which is YAML, serialised once from data."""
    return json.dumps({"env_vars": {"RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}}, sort_keys=True)


def deadline_s(seconds: float) -> int:
    return max(1, math.ceil(seconds))


# ================================================================= GKE node pools and the cluster


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
            "workloadMetadataConfig": {"mode": "GKE_METADATA"},
            "advancedMachineFeatures": {"threadsPerCore": "1"},
        }
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
                "maxNodeCount": shape.num_hosts,
                "locationPolicy": "ANY",
            }
            pool["management"] = {"autoRepair": False}
        if has_dcn_nics(spec):
            config["gvnic"] = {"enabled": True}
            if spec.gke.multislice_network == "dcn_networks":
                pool["networkConfig"] = {
                    "additionalNodeNetworkConfigs": [
                        {"network": names.dcn_network(t.run_id, i), "subnetwork": names.dcn_subnet(t.run_id, i)}
                        for i in range(len(DCN_SUBNET_RANGES))
                    ]
                }
            else:
                pool["networkConfig"] = {"acceleratorNetworkProfile": "auto"}
        pools.append(pool)
    return pools


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
            "workloadMetadataConfig": {"mode": "GKE_METADATA"},
        },
    }


def cluster(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """The ``Cluster`` REST body of a cluster the run creates: the Ray Operator add-on, the GCS FUSE CSI
    driver, Workload Identity, Dataplane V2, image streaming, multi-networking for the DCN networks, and the
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
    if t.autopilot:
        body["autopilot"] = {"enabled": True}
        return body
    body["networkConfig"] = {"datapathProvider": "ADVANCED_DATAPATH"}
    if has_dcn_nics(spec) and spec.gke.multislice_network == "dcn_networks":
        body["networkConfig"]["enableMultiNetworking"] = True
    body["ipAllocationPolicy"] = {"useIpAliases": True}
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
    """The extra VPC networks (custom subnets, jumbo MTU) and their subnets, one per DCN NIC: the tutorial's
    way. Compute Engine networks take no labels: the run id is in the description and the name."""
    if not has_dcn_nics(spec) or spec.gke.multislice_network != "dcn_networks" or t.autopilot:
        return []
    out = []
    for index, cidr in enumerate(DCN_SUBNET_RANGES):
        network = names.dcn_network(t.run_id, index)
        out.append({
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
        })
    return out


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


# ================================================================= versions


_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?$")


def parse_gke_version(text: str) -> tuple[float, ...] | None:
    """``1.35.2-gke.1842000`` -> (1, 35, 2, 1842000); ``1.35`` (its newest patch) -> (1, 35, inf, inf);
    ``latest`` -> (inf,); None if it is not a GKE version."""
    if text == "latest":
        return (math.inf,)
    m = _VERSION.match(text)
    if not m:
        return None
    major, minor, patch, build = m.groups()
    return (
        int(major),
        int(minor),
        math.inf if patch is None else int(patch),
        math.inf if build is None else int(build),
    )


def version_at_least(text: str, minimum: str) -> bool:
    parsed, floor = parse_gke_version(text), parse_gke_version(minimum)
    assert parsed is not None and floor is not None
    return parsed >= floor
