"""What the gke platform creates in GKE and Cloud Build, derived from the run spec and the TPU catalogue
(docs/architecture.md, "The TPU catalogue is data"): where the run goes is ``target``, what it creates in Compute
Engine ``compute_resources``.

Pure functions of (spec, target) that return data: GKE API bodies in the REST JSON form that
``google.cloud.container_v1`` parses (``NodePool.from_json``), the Cloud Build that builds the trainer image, and the
facts the Kubernetes manifests (``manifests``) are built from (node selectors, the TPU workers' XLA flags). Nothing
here talks to a cloud; the unit tests pin every derivation for every accelerator family.

Sources of the GKE facts:
- TPU node pools, multi-host slices one per node pool, ``--tpu-topology`` only for multi-host slices, Spot,
  reservations: https://cloud.google.com/kubernetes-engine/docs/how-to/tpus and
  https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus
- TPU7x multi-host node pools are placed by a Compute Engine workload policy (HIGH_THROUGHPUT, with the slice
  topology) given as the node pool's placement policy, in place of the TPU topology:
  https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood
- Flex-start node pools (flex_start, autoscaling from 0 with location policy ANY, no reservation, no
  auto-repair): https://docs.cloud.google.com/kubernetes-engine/docs/concepts/dws and xpk's capacity.py
- Release channels: a cluster created without ``releaseChannel`` is enrolled in the default channel, REGULAR
  (GKE docs, "Release channels": https://cloud.google.com/kubernetes-engine/docs/concepts/release-channels); "when a
  cluster is subscribed to a release channel ... node auto-upgrade defaults to true and cannot be disabled" (the
  ``ReleaseChannel`` message's comment in google-cloud-container's ``container_v1/types/cluster_service.py``; GKE docs,
  "Node auto-upgrades"), so a node pool states ``autoUpgrade: true`` beside ``autoRepair: false`` (gcloud's
  ``--no-enable-autorepair`` leaves auto-upgrade on); GKE refuses ``autoUpgrade: false`` with 400 "Auto_upgrade cannot
  be false when release_channel REGULAR is set."
- The control plane's DNS-based endpoint takes user traffic (``controlPlaneEndpointsConfig.dnsEndpointConfig
  .allowExternalTraffic``, google-cloud-container's ``ControlPlaneEndpointsConfig.DNSEndpointConfig``: "Controls
  whether user traffic is allowed over this endpoint"), so Vertex AI tasks, outside the cluster's VPC, reach its
  Kubernetes API with IAM deciding who may: https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation
  (``control_plane``).
- Multislice (multi-host slices only): https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice
- DCN NICs through managed DRANET (``cloud.google.com/gke-networking-dra-driver=true`` node label, device class
  ``netdev.google.com``): https://docs.cloud.google.com/kubernetes-engine/docs/how-to/allocate-network-resources-dra;
  either two additional node networks (the multislice Ray Train tutorial,
  https://docs.cloud.google.com/kubernetes-engine/docs/tutorials/multi-slice-training-ray) or the node pool's
  ``accelerator_network_profile=auto`` (GKE creates the networks).
- Queued provisioning node pools (flex-start with queued provisioning on): ``queued``
- Autopilot TPU pods: node selectors for the TPU and for Spot / reservations / flex-start:
  https://cloud.google.com/kubernetes-engine/docs/how-to/tpus-autopilot
"""

from __future__ import annotations

from typing import Any

from components.cloud.credentials import CLOUD_PLATFORM_SCOPE
from components.platforms.gke.plan import network, queued
from components.platforms.gke.plan.compute_resources import DCN_SUBNET_RANGES
from components.platforms.gke.plan.target import Target
from components.spec import RunSpec, names
from components.spec.images import DOCKER_BUILDER, IMAGE_WITH_DIGEST
from components.workload import cache
from components.workload.derive import WORKLOAD_IMAGES, has_dcn_nics, job_command, slice_shape

# --- Kubernetes and GKE strings ----------------------------------------------------------------------------
TPU_RESOURCE = "google.com/tpu"
NODE_LABEL_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
NODE_LABEL_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
NODE_LABEL_NODE_POOL = "cloud.google.com/gke-nodepool"
DRA_NETWORKING_LABEL = "cloud.google.com/gke-networking-dra-driver"
NETDEV_DEVICE_CLASS = "netdev.google.com"

# The release channel of a cluster the run creates, stated in its body (GKE would enroll it in REGULAR anyway), and
# the channel whose offered versions preflight resolves gke.cluster_version against.
RELEASE_CHANNEL = "REGULAR"
# No node upgrade while the run trains: a node pool upgrade recreates the nodes, which takes a slice mid-step. A
# maintenance exclusion of scope NO_MINOR_OR_NODE_UPGRADES keeps GKE from upgrading the nodes (and the control plane's
# minor version) in its window (GKE docs, "Maintenance windows and exclusions":
# https://cloud.google.com/kubernetes-engine/docs/concepts/maintenance-windows-and-exclusions); ``MaintenanceWindow``'s
# ``maintenance_exclusions`` in google-cloud-container. Its window (``startTime``, ``endTime``), from provision to the
# run's deadline (else EXCLUSION_HOURS), is added when the cluster is created (``run.handlers.exclusion_window``).
RUN_EXCLUSION = {"maintenanceExclusionOptions": {"scope": "NO_MINOR_OR_NODE_UPGRADES"}}
EXCLUSION_HOURS = 72.0

# Compute Engine's regional TPU quota metrics, in chips, of each family: (on-demand, preemptible: spot and
# flex-start), by the names regions.get reports them, which google-cloud-compute's ``Quota.Metric`` enum lists
# (compute_v1/types/compute.py: TPU_LITE_PODSLICE_V5, PREEMPTIBLE_TPU_LITE_PODSLICE_V5). The enum names no metric for
# v5p, v6e or TPU7x, in its newest release (1.57.0) too: their quota is Compute Engine API quota (Cloud TPU,
# "Consumption options", https://cloud.google.com/tpu/docs/consumption-options), but no public source read names the
# metric regions.get reports for it (docs/gke.md lists what was read), so preflight does not guess one: it says so in a
# warning naming the chips the run needs, never silently.
QUOTA_METRICS = {"v5e": ("TPU_LITE_PODSLICE_V5", "PREEMPTIBLE_TPU_LITE_PODSLICE_V5")}


def quota_kind(capacity: str) -> str:
    """The TPU quota a capacity type draws on: on-demand its own; spot, flex-start and queued the preemptible one.
    Queued provisioning is flex-start's (its node pools take ``--flex-start --enable-queued-provisioning``: GKE docs,
    https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest), and flex-start draws on the
    preemptible TPU quota (Cloud TPU docs, "Request Cloud TPUs using Flex-start",
    https://cloud.google.com/tpu/docs/request-using-flex-start: "ensure you have sufficient preemptible quota")."""
    return "on-demand" if capacity == "on-demand" else "preemptible"


AUTOPILOT_CAPACITY_SELECTORS = {
    "spot": {"cloud.google.com/gke-spot": "true"},
    "flex-start": {"cloud.google.com/gke-flex-start": "true"},
}

# --- Multislice DCN NICs and the XLA flags of the TPU workers ---------------------------------------------
DCN_NIC_PREFIXES = "eth1,eth2,lo"  # the DRANET NICs, then loopback
# XLA TPU flags that overlap collectives with compute (MaxText's recommended set), then the NICs to use.
LIBTPU_COLLECTIVE_FLAGS = (
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
)
RAY_VERSION = "2.60.0"

BUILD_STEP_IMAGE = DOCKER_BUILDER  # by digest (components/spec/images.py)
# The torch image's torch: its CPU build's wheel (images/torch/torch-cpu.lock), 196,253,677 bytes as torch's index
# lists torch-2.14.1+cpu-cp312-cp312-manylinux_2_28_x86_64.whl (https://download.pytorch.org/whl/cpu/torch/).
TORCH_CPU_WHEEL_MB = 196
BUILD_TIMEOUT_S = 3600
BUILD_MACHINE_TYPE = "E2_HIGHCPU_8"


def cloud_build(spec: RunSpec, t: Target) -> dict[str, Any]:
    """The Cloud Build that builds the workload's trainer image (``images/<name>/Dockerfile``, the repository as
    context, uploaded to the bucket) and pushes it to Artifact Registry, as ``gke.build_service_account`` when it
    names one (else as the project's default build account). The torch image gets torch-tpu and libtpu from
    PyPI and torch's CPU build from torch's own index (``TORCH_WHEELS=cpu``: a TPU host runs no CUDA, and PyPI's
    Linux torch is the CUDA build with gigabytes of nvidia-* wheels); built FROM a TorchTPU base image
    (``gke.torch_tpu_base``), it keeps the base's torch, torch_tpu and libtpu (``TORCH_FROM_BASE=1``: the
    requirements' pins of those three are not installed over them)."""
    name = WORKLOAD_IMAGES[spec.train.workload]
    args = ["build", "--file", f"images/{name}/Dockerfile", "--tag", t.image]
    if name == "torch" and spec.gke.torch_tpu_base:
        args += ["--build-arg", f"TORCH_TPU_BASE={spec.gke.torch_tpu_base}", "--build-arg", "TORCH_FROM_BASE=1"]
    elif name == "torch":  # torch's CPU build, none of the CUDA wheels (images/torch/Dockerfile, torch-cpu.lock)
        args += ["--build-arg", "TORCH_WHEELS=cpu"]
    body = {
        "source": {"storageSource": {"bucket": t.bucket, "object": names.build_source(t.run_id)}},
        "steps": [{"name": BUILD_STEP_IMAGE, "args": [*args, "."]}],
        "images": [t.image],
        "tags": ["tpupipe", names.build_tag(t.run_id)],
        "timeout": f"{BUILD_TIMEOUT_S}s",
        # Logs in Cloud Logging only: no logs bucket to grant, and what a build with a user-specified service
        # account must choose when it names no logs bucket
        # (https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts).
        "options": {"machineType": BUILD_MACHINE_TYPE, "logging": "CLOUD_LOGGING_ONLY"},
    }
    if t.build_service_account:  # Build.service_account: projects/{PROJECT_ID}/serviceAccounts/{ACCOUNT}
        body["serviceAccount"] = f"projects/{t.project}/serviceAccounts/{t.build_service_account}"
    return body


def entrypoint(spec: RunSpec, t: Target) -> str:
    """The Ray job entrypoint of the train stage on GKE, its compile cache under the trainer image's digest: the
    digest of ``gke.image`` when it names one, else a stand-in (the run's build gives the digest: ``components.stages.
    ray_stages.entrypoint``)."""
    return job_command(spec, "train", t.run_dir, t.run_id, compile_cache=compile_cache(spec, t))


def compile_cache(spec: RunSpec, t: Target) -> str:
    """The train job's compile cache as its pods see it: the run's own copy under its prefix, which the train stage
    fills with the verified entries of the bucket's ``cache/`` (``components.workload.cache_trust``)."""
    from components.workload.cache_trust import RUN_CACHE_DIR

    root = f"{t.run_dir}/{RUN_CACHE_DIR}"
    return cache.directory(root, spec, t.image if IMAGE_WITH_DIGEST.match(t.image) else "")


def compile_job(spec: RunSpec, t: Target) -> dict[str, Any]:
    """The run's compile job (``components.stages.compile_cache``): its submission id, its entrypoint and where its
    pods write (the run's own ``compiled/`` prefix, which the train stage records from)."""
    from components.workload.cache_trust import COMPILE_DIR, compile_timeout_s

    image = t.image if IMAGE_WITH_DIGEST.match(t.image) else ""
    # NONCE: the attempt's random directory, made by the train stage at submit (cache_trust.new_nonce)
    where = cache.directory(f"{t.run_dir}/{COMPILE_DIR}/NONCE", spec, image)
    return {
        "submission_id": names.job_submission_id(t.run_id, "compile"),
        "entrypoint": job_command(spec, "compile", f"{t.run_dir}/compile", f"{t.run_id}-compile", compile_cache=where),
        "path": where,
        "timeout_s": compile_timeout_s(spec),
    }


def _reservation_affinity(reservation: str) -> dict[str, Any]:
    return {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": [reservation],
    }


# Shielded nodes with secure boot and integrity monitoring on every pool the run creates: NodeConfig's
# shielded_instance_config (ShieldedInstanceConfig.enable_secure_boot, .enable_integrity_monitoring:
# google/cloud/container_v1/types/cluster_service.py; https://cloud.google.com/kubernetes-engine/docs/how-to/shielded-gke-nodes).
SHIELDED = {"enableSecureBoot": True, "enableIntegrityMonitoring": True}


def tpu_node_pools(spec: RunSpec, t: Target) -> list[dict[str, Any]]:
    """One node pool per slice (``NodePool`` REST bodies); none in autopilot mode (GKE makes the nodes), none for a run
    queued in Kueue (the shared cluster's nodes are its platform team's)."""
    if t.autopilot or t.queue:
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
            "shieldedInstanceConfig": dict(SHIELDED),
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
    """Spot, a reservation, or flex-start (autoscaling from 0 with location policy ANY, no auto-repair; auto-upgrade
    stays on, as the release channel requires), with queued provisioning on for capacity=queued (``queued``)."""
    c, config = spec.cluster, pool["config"]
    if c.capacity == "spot":
        config["spot"] = True
    elif c.capacity == "reservation":
        config["reservationAffinity"] = _reservation_affinity(c.reservation)
    elif c.capacity == "flex-start" or queued.enabled(spec):  # queued provisioning is flex-start's, queued
        config["flexStart"] = True
        config["reservationAffinity"] = {"consumeReservationType": "NO_RESERVATION"}
        pool["initialNodeCount"] = 0
        pool["autoscaling"] = {
            "enabled": True,
            "minNodeCount": 0,
            "maxNodeCount": slice_shape(spec).num_hosts,
            "locationPolicy": "ANY",
        }
        pool["management"] = {"autoRepair": False, "autoUpgrade": True}
        if queued.enabled(spec):
            pool["queuedProvisioning"] = {"enabled": True}


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
    """The CPU node pool that carries the Ray head (standard mode, not queued in Kueue)."""
    if t.autopilot or t.queue:
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
            "shieldedInstanceConfig": dict(SHIELDED),
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
        "releaseChannel": {"channel": RELEASE_CHANNEL},
        "controlPlaneEndpointsConfig": {"dnsEndpointConfig": {"allowExternalTraffic": True}},
    }
    if spec.gke.cluster_version:
        body["initialClusterVersion"] = spec.gke.cluster_version
    body["maintenancePolicy"] = {"window": {"maintenanceExclusions": {names.MAINTENANCE_EXCLUSION: {**RUN_EXCLUSION}}}}
    if t.autopilot:  # the nodes Autopilot makes run as the nodes' account too
        body["autopilot"] = {"enabled": True}
        body["autoscaling"] = {
            "autoprovisioningNodePoolDefaults": {
                "serviceAccount": t.node_service_account,
                "oauthScopes": [CLOUD_PLATFORM_SCOPE],
            }
        }
        network.private_nodes(body, t)
        return body
    # Shielded GKE Nodes on the cluster (Cluster.shielded_nodes, google/cloud/container_v1/types/cluster_service.py;
    # https://cloud.google.com/kubernetes-engine/docs/how-to/shielded-gke-nodes): nodes prove their identity to the
    # control plane before joining. Autopilot's nodes always are.
    body["shieldedNodes"] = {"enabled": True}
    body["networkConfig"] = {"datapathProvider": "ADVANCED_DATAPATH"}
    if has_dcn_nics(spec):  # both ways of giving the pods DCN NICs need it (xpk enables it with the profile too)
        body["networkConfig"]["enableMultiNetworking"] = True
    network.private_nodes(body, t)  # private nodes on the run's own subnetwork (``network``)
    body["ipAllocationPolicy"] = {"useIpAliases": True}
    if spec.gke.pod_range:
        body["ipAllocationPolicy"]["clusterIpv4CidrBlock"] = spec.gke.pod_range
    if spec.gke.service_range:
        body["ipAllocationPolicy"]["servicesIpv4CidrBlock"] = spec.gke.service_range
    body["nodePoolDefaults"] = {"nodeConfigDefaults": {"gcfsConfig": {"enabled": True}}}
    body["nodePools"] = [cpu_node_pool(spec, t)]
    return body


def worker_node_selector(spec: RunSpec, t: Target) -> dict[str, str]:
    """Where the TPU worker pods go: the slice shape, and the run's own node pools (standard) or the capacity
    type (autopilot, where the selectors make GKE create matching nodes)."""
    shape = slice_shape(spec)
    selector = {NODE_LABEL_ACCELERATOR: shape.family.gke_accelerator, NODE_LABEL_TOPOLOGY: shape.topology}
    if t.queue:  # the slice shape only: Kueue adds its ResourceFlavor's node labels when it admits the run
        return selector
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
    if t.autopilot or t.queue:
        return {}
    return {NODE_LABEL_NODE_POOL: names.cpu_node_pool(t.run_id)}


def libtpu_init_args(spec: RunSpec) -> str:
    flags = list(LIBTPU_COLLECTIVE_FLAGS)
    if has_dcn_nics(spec):
        flags.append(f"--megascale_grpc_interface_prefixes={DCN_NIC_PREFIXES}")
    return " ".join(flags)
