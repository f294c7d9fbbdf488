"""The Kubernetes objects a gke run applies, built as data (dicts) and serialised once by the caller.

- the run's namespace (shared by runs: get-or-create, kept) and ServiceAccount (Workload Identity);
- for multislice with DCN NICs, a ``resource.k8s.io/v1`` ResourceClaimTemplate asking managed DRANET for the
  extra NICs of each worker pod;
- two NetworkPolicies: the run's pods take traffic only from one another, and the head's port 8265 (the dashboard's
  Jobs API, which tpupipe reaches through the API server's service proxy) from anywhere in the cluster;
- the KubeRay ``RayCluster``: a head on the CPU pool (ports 6379 GCS and 8265 dashboard and Jobs API; no Ray Client
  port 10001: nothing uses it; ``num-cpus: "0"`` for TorchTPU workloads, so no work lands on it) and ONE worker
  group whose ``replicas`` are the slices and ``numOfHosts`` the hosts of each slice (the KubeRay TPU webhook
  checks numOfHosts against the topology and gives each pod TPU_WORKER_ID, TPU_WORKER_HOSTNAMES, TPU_NAME); under
  capacity=queued with the run's own requests, one worker group per slice instead, each on its slice's node pool and
  consuming that pool's ProvisioningRequest (``queued``: GKE fulfils a request within one node pool).

The train and evaluate jobs are not Kubernetes objects: the stages submit them to the RayCluster's head through
the Ray Jobs API (docs/architecture.md, "Why no RayJob").

KubeRay TPU usage: https://docs.ray.io/en/latest/cluster/kubernetes/user-guides/tpu.html; GCS FUSE
CSI ephemeral volumes: https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-volumes/cloud-storage-fuse-csi-driver;
KubeRay's own checks: ray-operator/controllers/ray/utils/validation.go (v1.7.0).
"""

from __future__ import annotations

import math
from typing import Any

from components.platforms.gke.plan import network, queued
from components.platforms.gke.plan import resources as r
from components.platforms.gke.plan.compute_resources import DCN_SUBNET_RANGES
from components.platforms.gke.plan.target import CACHE_MOUNT_PATH, Target
from components.spec import RunSpec, names
from components.workload import derive as d
from components.workload.cache import CACHE_PREFIX

HEAD_PORTS = (("gcs-server", 6379), ("dashboard", 8265))
DASHBOARD_PORT = 8265
CHECKPOINT_VOLUME = "checkpoints"
CACHE_VOLUME = "compile-cache"
SHM_VOLUME = "dshm"
DCN_CLAIM = "dcn-nics"
# The labels Kueue reads on a RayCluster (https://kueue.sigs.k8s.io/docs/tasks/run/rayclusters/,
# https://kueue.sigs.k8s.io/docs/concepts/workload_priority_class/).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# The mount options of the GKE tutorial "Train an LLM such as Llama 3 70B on GKE with MaxText, Ray Train and
# multislice Trillium TPUs" (docs/tutorials.md): implicit directories, owned by uid/gid 1000. Its unlimited file
# cache is left out: without a cache volume for it (a volume named gke-gcsfuse-cache) it has no place to cache, and
# MaxText reads a checkpoint once, on restore, so a cache sized for a 70B checkpoint would buy nothing.
GCSFUSE_MOUNT_OPTIONS = "implicit-dirs,uid=1000,gid=1000"
# The GCS FUSE sidecar's CPU, memory and ephemeral-storage limits lifted ("0": no limit), as that tutorial's sample
# does for 70B checkpoints: the sidecar's defaults throttle multi-GB checkpoint writes.
# https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-volumes/cloud-storage-fuse-csi-driver-sidecar
GCSFUSE_POD_ANNOTATIONS = {
    "gke-gcsfuse/volumes": "true",
    "gke-gcsfuse/cpu-limit": "0",
    "gke-gcsfuse/memory-limit": "0",
    "gke-gcsfuse/ephemeral-storage-limit": "0",
}
HF_TOKEN_KEY = "hf_api_token"
# The Hugging Face token reaches the pods as a file of a read-only Secret volume, never as an environment variable
# (which every process and Ray job of the pod inherits and prints in its environment): huggingface_hub reads the
# token from the file $HF_TOKEN_PATH names when $HF_TOKEN is unset
# (https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables#hftokenpath).
# Secret volumes: https://kubernetes.io/docs/concepts/configuration/secret/#using-secrets-as-files-from-a-pod
HF_TOKEN_VOLUME = "hf-token"
HF_TOKEN_DIR = "/var/run/secrets/tpupipe/hf"
HF_TOKEN_FILE = "token"
# Every pod runs unprivileged, with no privilege escalation and the runtime's default seccomp profile: TPU chips need
# no privileged container on GKE 1.28 and later (https://cloud.google.com/kubernetes-engine/docs/how-to/tpus, "Run
# containers without privileged mode"). The Ray head (no TPU chips) always runs as a non-root user with every
# capability dropped, and the TPU workers too with gke.run_as_non_root (the Pod Security Standards' "restricted"
# profile: https://kubernetes.io/docs/concepts/security/pod-security-standards/). The TPU chips reach a pod as device
# files the TPU device plugin names (/dev/vfio/N, /dev/accel*); a container runtime with containerd's
# device_ownership_from_security_context hands them to the pod's runAsUser/runAsGroup
# (https://github.com/containerd/containerd/pull/5122, "Devices ownership from SecurityContext";
# https://kubernetes.io/blog/2021/11/09/non-root-containers-and-devices/), which is why both the uid and the gid are
# set here (the gid, not a supplemental group: the device files' host gid differs between node images). Neither the
# TorchTPU nor the MaxText image names a user (images/*/Dockerfile: no USER, so root), and GKE does not document that
# runtime setting for its TPU nodes (containerd's default configuration has device_ownership_from_security_context =
# false: https://github.com/containerd/containerd/blob/main/docs/cri/config.md): on nodes without it the device files
# stay root's and a non-root container cannot open the chips (the blog above), so gke.run_as_non_root is off by
# default and the TPU workers' containers run as the image's root; the head, which opens no chip, never does. The
# uid is the one GCS FUSE gives the bucket's files (GCSFUSE_MOUNT_OPTIONS). The images have no user of that uid, so
# HOME is a directory of the pod's own (an emptyDir) where the user may write (caches, ~/.ray).
RUN_AS = 1000
HOME_VOLUME = "home"
HOME_DIR = "/home/tpupipe"
# With gke.read_only_root the containers' root filesystem is read-only (readOnlyRootFilesystem, the hardening the
# Pod Security Standards page and https://cloud.google.com/kubernetes-engine/docs/how-to/hardening-your-cluster
# recommend), so everything a pod writes has a volume of its own: HOME (caches: Hugging Face, JAX, pip), /tmp
# (Ray's temp and session directory, /tmp/ray by default:
# https://docs.ray.io/en/latest/ray-observability/user-guides/configure-logging.html; libtpu's logs, /tmp/tpu_logs;
# Python's tempfile), the bucket's mount (checkpoints, outputs) and, on workers, /dev/shm.
TMP_VOLUME = "tmp"
TMP_DIR = "/tmp"


def _meta(name: str, t: Target, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespaced:
        meta["namespace"] = t.namespace
    meta["labels"] = names.labels(t.run_id)
    return meta


def namespace(t: Target) -> dict[str, Any]:
    """Shared by the runs of the cluster: created if missing, never deleted by a run (so no run label)."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": t.namespace}}


def service_account(t: Target) -> dict[str, Any]:
    """The pods' identity; the bucket binding (``target.bucket_binding``) names it as a principal."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(t.service_account, t)}


def dcn_claim_template(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """The DCN NICs of every worker pod, from managed DRANET (device class netdev.google.com): exactly the two NICs
    of the run's DCN networks (as the GKE tutorial "Train an LLM such as Llama 3 70B on GKE with MaxText, Ray Train
    and multislice Trillium TPUs" claims them), or, with the accelerator network profile, all the NICs GKE attached
    (the claim of xpk and of https://cloud.google.com/kubernetes-engine/docs/how-to/allocate-network-resources-dra,
    allocation mode All)."""
    if not d.has_dcn_nics(spec):
        return None
    if spec.gke.multislice_network == "dcn_networks":
        nics = {"allocationMode": "ExactCount", "count": len(DCN_SUBNET_RANGES)}
    else:
        nics = {"allocationMode": "All"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(names.dcn_claim_template(t.run_id), t),
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "nics",
                            "exactly": {"deviceClassName": r.NETDEV_DEVICE_CLASS, **nics},
                        }
                    ]
                }
            }
        },
    }


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def non_root(spec: RunSpec, tpu: bool) -> bool:
    """Whether a pod runs as uid/gid 1000: one without TPU chips always, a TPU worker with gke.run_as_non_root."""
    return not tpu or spec.gke.run_as_non_root


def _pod_security(spec: RunSpec, tpu: bool) -> dict[str, Any]:
    user = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS} if non_root(spec, tpu) else {}
    return {**user, "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}}


def _container_security(spec: RunSpec, tpu: bool) -> dict[str, Any]:
    dropped = {"capabilities": {"drop": ["ALL"]}} if non_root(spec, tpu) else {}
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": spec.gke.read_only_root,
        **dropped,
    }


def _scratch() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Where a pod's user writes besides the bucket: HOME and /tmp, volumes of the pod's own: (mounts, volumes)."""
    dirs = ((HOME_VOLUME, HOME_DIR), (TMP_VOLUME, TMP_DIR))
    return [{"name": n, "mountPath": p} for n, p in dirs], [{"name": n, "emptyDir": {}} for n, _ in dirs]


def _common_env(spec: RunSpec) -> list[dict[str, Any]]:
    env = [_env("HOME", HOME_DIR)]
    if d.tpu_resource_per_chip(spec) > 1:
        env.append(_env("RAY_TPU_RESOURCE_PER_CHIP", str(d.tpu_resource_per_chip(spec))))
    if spec.gke.hf_secret:
        env.append(_env("HF_TOKEN_PATH", f"{HF_TOKEN_DIR}/{HF_TOKEN_FILE}"))
    return env


def _token_mounts(spec: RunSpec, t: Target) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's Hugging Face token Secret (``names.hf_token_secret``) as a read-only file: (mounts, volumes)."""
    if not spec.gke.hf_secret:
        return [], []
    volume = {
        "name": HF_TOKEN_VOLUME,
        "secret": {
            "secretName": names.hf_token_secret(t.run_id),
            "items": [{"key": HF_TOKEN_KEY, "path": HF_TOKEN_FILE}],
            "defaultMode": 0o440,  # owner root, group RUN_AS (fsGroup): readable by the pods' user only
        },
    }
    return [{"name": HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True}], [volume]


# No MEGASCALE_* on the worker pods: libtpu's multislice settings belong to each worker group, not to the cluster.
# With MEGASCALE_NUM_SLICES in a pod's spec the KubeRay TPU webhook adds MEGASCALE_SLICE_ID (the pod's replica),
# MEGASCALE_COORDINATOR_ADDRESS and MEGASCALE_PORT, and without it none (``mutatePod``,
# https://github.com/ai-on-gke/kuberay-tpu-webhook/blob/main/main.go); Ray Train sets all of them on every worker of
# a group that spans several slices, from the slices of that group, and leaves them alone on a group of one (ray
# 2.60.0, ``ray/train/v2/jax/config.py``: ``_JaxBackend.on_start`` when ``num_slices > 1``;
# ``ray/train/torch/config.py``: ``_setup_tpu_multislice``). A static count would stay on the workers of an elastic
# group shrunk to one slice, and libtpu would wait at start-up for a slice that is gone (the comment on
# ``_JAX_MULTISLICE_OVERRIDE_KEYS`` there). The port is Ray's default then (8081, the webhook's too).
def _worker_env(spec: RunSpec) -> list[dict[str, Any]]:
    env = _common_env(spec)
    # The deadline of the drain Ray 2.60's `ray start` (the worker container's main process) makes of the SIGTERM a
    # preemption sends the pod: Ray Train's preemption watcher announces it, and the trainer saves before it. The
    # pod's terminationGracePeriodSeconds (``_worker_group``) ends first: the kubelet's kill, not Ray's own stop
    # of the node, must end it for Ray to record a preemption (``derive.ray_drain_timeout_s``).
    env.append(_env("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", f"{d.ray_drain_timeout_s(spec):g}"))
    if d.is_multislice(spec):
        env += [
            _env("JAX_PLATFORMS", "tpu,cpu"),
            _env("ENABLE_PJRT_COMPATIBILITY", "true"),
            _env("LIBTPU_INIT_ARGS", r.libtpu_init_args(spec)),
        ]
    return env


def _checkpoint_volume(t: Target) -> dict[str, Any]:
    """The bucket as the run's pods mount it: its ``runs/<run id>/`` directory alone (GCS FUSE's ``only-dir``,
    https://cloud.google.com/storage/docs/cloud-storage-fuse/cli-options), at the same path under the mount
    (``Target.run_dir``), so nothing else of the bucket is in reach of a pod's files, as the run's IAM binding allows
    (``target.bucket_binding``)."""
    options = f"{GCSFUSE_MOUNT_OPTIONS},only-dir={names.run_prefix(t.run_id)}"
    return {
        "name": CHECKPOINT_VOLUME,
        "csi": {"driver": GCSFUSE_DRIVER, "volumeAttributes": {"bucketName": t.bucket, "mountOptions": options}},
    }


def _cache_volume(t: Target) -> dict[str, Any]:
    """The bucket's cache prefix alone (``only-dir``, as ``_checkpoint_volume``), what outlives a run (the base
    weights; ``components.workload.cache``), at ``CACHE_MOUNT_PATH``, read-only: the pipeline's side alone writes it
    (``components.workload.cache_trust``), and the pods' identity may only read it (``target.cache_binding``). A CSI
    ephemeral volume's ``readOnly`` (Kubernetes' CSIVolumeSource, https://kubernetes.io/docs/reference/kubernetes-api/
    config-and-storage-resources/volume/#CSIVolumeSource; the GKE page's examples set it:
    https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-ephemeral) and the mount's."""
    options = f"{GCSFUSE_MOUNT_OPTIONS},only-dir={CACHE_PREFIX}"
    return {
        "name": CACHE_VOLUME,
        "csi": {
            "driver": GCSFUSE_DRIVER,
            "readOnly": True,
            "volumeAttributes": {"bucketName": t.bucket, "mountOptions": options},
        },
    }


def _pod_metadata(t: Target) -> dict[str, Any]:
    return {"labels": names.labels(t.run_id), "annotations": dict(GCSFUSE_POD_ANNOTATIONS)}


def _resources(cpu: int, memory_gib: int, **extra: str) -> dict[str, Any]:
    amounts = {"cpu": str(cpu), "memory": f"{memory_gib}Gi", **extra}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _head_group(spec: RunSpec, t: Target) -> dict[str, Any]:
    c = spec.cluster
    container: dict[str, Any] = {
        "name": "ray-head",
        "image": t.image,
        "ports": [{"name": name, "containerPort": port} for name, port in HEAD_PORTS],
        "resources": _resources(c.head_cpus, c.head_memory_gib),
        "securityContext": _container_security(spec, tpu=False),
    }
    env = _common_env(spec)
    if env:
        container["env"] = env
    token_mounts, token_volumes = _token_mounts(spec, t)
    scratch_mounts, scratch_volumes = _scratch()
    container["volumeMounts"] = [{"name": CHECKPOINT_VOLUME, "mountPath": t.run_dir}, *scratch_mounts, *token_mounts]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": t.service_account,
        "securityContext": _pod_security(spec, tpu=False),
        "containers": [container],
        "volumes": [_checkpoint_volume(t), *scratch_volumes, *token_volumes],
    }
    selector = r.head_node_selector(spec, t)
    if selector:
        pod_spec["nodeSelector"] = selector
    start_params = {"num-cpus": "0"} if spec.train.workload in d.DEVICE_CENTRIC_WORKLOADS else {}
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": start_params,
        "template": {"metadata": _pod_metadata(t), "spec": pod_spec},
    }


def _worker_group(spec: RunSpec, t: Target, slice_index: int | None = None) -> dict[str, Any]:
    """The worker group of every slice, or (``slice_index``: capacity=queued) of that slice alone, on its pool."""
    c = spec.cluster
    shape = d.slice_shape(spec)
    resources = _resources(c.cpus_per_host, c.worker_memory_gib, **{r.TPU_RESOURCE: str(shape.chips_per_host)})
    mounts = [
        {"name": CHECKPOINT_VOLUME, "mountPath": t.run_dir},
        {"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT_PATH, "readOnly": True},
    ]
    volumes = [_checkpoint_volume(t), _cache_volume(t)]
    if c.worker_shm_gib:
        mounts.insert(0, {"name": SHM_VOLUME, "mountPath": "/dev/shm"})
        volumes.insert(0, {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{c.worker_shm_gib}Gi"}})
    container: dict[str, Any] = {
        "name": "ray-worker",
        "image": t.image,
        "resources": resources,
        "securityContext": _container_security(spec, tpu=True),
    }
    env = _worker_env(spec)
    if env:
        container["env"] = env
    token_mounts, token_volumes = _token_mounts(spec, t)
    scratch_mounts, scratch_volumes = _scratch()
    container["volumeMounts"] = [*mounts, *scratch_mounts, *token_mounts]
    volumes += [*scratch_volumes, *token_volumes]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": t.service_account,
        "securityContext": _pod_security(spec, tpu=True),
        # The notice a preempted worker gets, SIGTERM to SIGKILL: a Spot VM's pods get 15 s of its 30 s notice by
        # default (up to 120 s on GKE >= 1.35.0-gke.1171000; https://cloud.google.com/kubernetes-engine/docs/
        # concepts/spot-vms, "Termination and graceful shutdown of Spot VMs"), the kubelet never more than the pod's
        # own terminationGracePeriodSeconds (30 s by default, Kubernetes'); the drain Ray announces ends then too.
        "terminationGracePeriodSeconds": math.ceil(c.preemption_notice_s),
        "nodeSelector": r.worker_node_selector(spec, t),
        "containers": [container],
        "volumes": volumes,
    }
    tolerations = queued.worker_tolerations(spec)  # capacity=queued: GKE's taint on the queued nodes
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if d.has_dcn_nics(spec):
        resources["claims"] = [{"name": DCN_CLAIM}]
        pod_spec["resourceClaims"] = [
            {"name": DCN_CLAIM, "resourceClaimTemplateName": names.dcn_claim_template(t.run_id)}
        ]
    min_slices = spec.train.min_workers // d.workers_per_slice(spec) if d.is_elastic(spec) else c.num_slices
    group: dict[str, Any] = {
        "groupName": names.worker_group(shape.pod_type),
        "replicas": c.num_slices,
        "minReplicas": min_slices,
        "maxReplicas": c.num_slices,
        "numOfHosts": shape.num_hosts,
        "rayStartParams": {},
    }
    metadata = _pod_metadata(t)
    if slice_index is not None:  # one slice's group: its pool, its request (capacity=queued)
        group["groupName"] += f"-{slice_index}" if c.num_slices > 1 else ""
        group.update(replicas=1, minReplicas=1 if slice_index < min_slices else 0, maxReplicas=1)
        pod_spec["nodeSelector"][r.NODE_LABEL_NODE_POOL] = names.tpu_node_pool(t.run_id, slice_index)
        metadata["annotations"].update(queued.worker_annotations(spec, t, slice_index))
    if d.tpu_resource_per_chip(spec) > 1:
        group["resources"] = {"TPU": str(shape.logical_devices_per_host)}
    group["template"] = {"metadata": metadata, "spec": pod_spec}
    return group


def raycluster(spec: RunSpec, t: Target) -> dict[str, Any]:
    meta = _meta(names.raycluster(t.run_id), t)
    body: dict[str, Any] = {
        "rayVersion": r.RAY_VERSION,
        "authOptions": {"mode": "token", "secretName": names.ray_token_secret(t.run_id)},
        "enableInTreeAutoscaling": False,
        "headGroupSpec": _head_group(spec, t),
        # capacity=queued with the run's own requests: a group per slice, consuming its pool's request (``queued``)
        "workerGroupSpecs": [_worker_group(spec, t, i) for i in range(spec.cluster.num_slices)]
        if queued.direct(spec)
        else [_worker_group(spec, t)],
    }
    if t.queue:
        # Queued in Kueue: its LocalQueue and priority class are labels of the RayCluster, and it is created suspended,
        # Kueue unsuspending it when the quota admits it ("Kueue controls the spec.suspend field of the RayCluster",
        # https://kueue.sigs.k8s.io/docs/tasks/run/rayclusters/; the priority label:
        # https://kueue.sigs.k8s.io/docs/concepts/workload_priority_class/).
        meta["labels"][KUEUE_QUEUE_LABEL] = t.queue
        if t.priority_class:
            meta["labels"][KUEUE_PRIORITY_LABEL] = t.priority_class
        body["suspend"] = True
        annotations = queued.raycluster_annotations(spec)  # capacity=queued: passed on to Kueue's request
        if annotations:
            meta.setdefault("annotations", {}).update(annotations)
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta, "spec": body}


def network_policies(t: Target) -> list[dict[str, Any]]:
    """Default deny for the run's pods (they take traffic only from the run's own pods: Ray's GCS, raylets, object
    transfers and collectives), the head's Jobs API port open to the cluster (the API server's service proxy,
    through which tpupipe submits and follows the jobs), and what the pods may send (``network.egress_policy``: one
    another, DNS, the metadata server, HTTPS out). Policies add up: a pod any policy selects takes only what one
    of them admits, and traffic from its own node (the kubelet's probes) is always allowed
    (https://kubernetes.io/docs/concepts/services-networking/network-policies/). GKE enforces them with Dataplane V2,
    which provision enables and preflight checks (https://cloud.google.com/kubernetes-engine/docs/how-to/dataplane-v2)."""
    run = names.labels(t.run_id)
    isolate = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(names.network_policy(t.run_id, "isolate"), t),
        "spec": {
            "podSelector": {"matchLabels": dict(run)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": dict(run)}}]}],
        },
    }
    job_api = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(names.network_policy(t.run_id, "job-api"), t),
        "spec": {
            # KubeRay labels the head pod ray.io/node-type=head (ray-operator/controllers/ray/utils/constant.go).
            "podSelector": {"matchLabels": {**run, "ray.io/node-type": "head"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]}],
        },
    }
    egress = network.egress_policy(t, _meta(names.network_policy(t.run_id, "egress"), t))
    return [isolate, job_api, egress]


def all_objects(spec: RunSpec, t: Target) -> list[dict[str, Any]]:
    """Every object, in the order to apply them (the NetworkPolicies before any pod)."""
    objects = [namespace(t), service_account(t), *network_policies(t)]
    claim = dcn_claim_template(spec, t)
    if claim:
        objects.append(claim)
    ray = raycluster(spec, t)  # capacity=queued: each slice's PodTemplate and request before it
    objects += queued.objects(spec, t, [g["template"] for g in ray["spec"]["workerGroupSpecs"]])
    return objects + [ray]
