"""What a run means on the hardware: the slice, the Ray Train workers, and the jobs' command lines.

Pure functions of the run spec and the TPU catalogue (``components.tpu``) that return data: the slice shape, Ray
``ScalingConfig``/``RunConfig`` arguments, the trainer image of each workload, and the job command the stages
submit (the same one the plan prints). The trainers get everything derived here on their command line, so they
import from ``components`` only ``spec`` and ``tpu``. The GKE bodies built on these facts are in
``components.platforms.gke.plan.resources``.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any

from components.spec import RunSpec
from components.tpu import catalogue

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
WORKLOAD_ENTRYPOINTS: dict[str, dict[str, tuple[str, ...]]] = {  # workload -> mode -> python -m arguments
    "fsdp": {"check": ("trainers.slice_check", "torch"), "train": ("trainers.fsdp",), "eval": ("trainers.evaluate",)},
    "maxtext": {
        "check": ("trainers.slice_check", "jax"),
        "train": ("trainers.maxtext_train", "train"),
        "eval": ("trainers.maxtext_train", "eval"),
        "compile": ("trainers.maxtext_train", "compile"),  # the compile cache's trusted producer
    },
}
DEVICE_CENTRIC_WORKLOADS = ("fsdp",)
# Workloads that commit a checkpoint by renaming its directory in the run's storage: MaxText, whose Orbax checkpoints
# on a local or mounted path are written under a temporary name and renamed to their step (``trainers.committed``).
# On GKE that storage is the bucket's Cloud Storage FUSE mount, where a directory's rename is atomic only in a bucket
# with hierarchical namespace (``components.cloud.storage.without_hierarchical_namespace``). The FSDP trainer's commits
# rename one file (DCP's index, the final checkpoint's meta): one object copied, there whole or not at all.
COMMITS_BY_DIRECTORY_RENAME = ("maxtext",)
# The runtime environment of every Ray job the stages submit: every worker's line in the log, unbuffered; and Ray
# Train's preemption watcher polling the GCS's draining nodes every second, not every 5 s (its
# RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S, read where the job's controller runs: ``PreemptionCallback``,
# ray/train/v2/_internal/callbacks/preemption_callback.py, Ray 2.60): a Spot VM's pods get 15 s from SIGTERM to
# SIGKILL by default (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms, "Termination and graceful
# shutdown of Spot VMs"), and a 5 s poll would take up to a third of it before the trainers hear of it.
JOB_RUNTIME_ENV = {
    "env_vars": {"RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}
}


# Seconds Ray's own stop of a preempted node comes after the kill its notice ends in (gke). Ray 2.60's `ray start`, on
# the SIGTERM of a preemption, drains its node (reason PREEMPTION) with a deadline RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S
# away and then stops the node's processes itself (``Node._drain_node_before_shutdown``, https://github.com/
# ray-project/ray/blob/ray-2.60.0/python/ray/_private/node.py). A raylet stopped that way is recorded as an expected
# termination, and Ray Train counts the lost workers as a failure of the run's (train.max_failures), not a
# preemption: the kubelet's kill at the pod's grace must come first. A killed node is recorded as preempted when the
# GCS finds it dead after the drain's deadline (``GcsNodeManager::InferDeathInfo``, https://github.com/ray-project/
# ray/blob/ray-2.60.0/src/ray/gcs/gcs_node_manager.cc), which Ray's default health checks on GKE (a check every 3 s,
# dead after 5 failed) do well after these 2 s.
DRAIN_STOP_MARGIN_S = 2.0


def ray_drain_timeout_s(spec: RunSpec) -> float:
    """RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S of the hosts: ``cluster.preemption_notice_s`` plus
    :data:`DRAIN_STOP_MARGIN_S`, so the kill at the notice's end comes first."""
    return spec.cluster.preemption_notice_s + DRAIN_STOP_MARGIN_S


def trainer_image(spec: RunSpec) -> str:
    """The image (``images/<name>``) the workload's jobs run in."""
    return WORKLOAD_IMAGES[spec.train.workload]


# ================================================================= the slice and the Ray workers


def slice_shape(spec: RunSpec) -> catalogue.SliceShape:
    """The catalogue row of the spec's slice (TPU accelerators only)."""
    return catalogue.slice_shape(spec.cluster.accelerator, spec.cluster.topology)


def is_tpu(spec: RunSpec) -> bool:
    return spec.cluster.accelerator != "cpu"


def commits_by_directory_rename(spec: RunSpec) -> bool:
    """Whether the run's trainer commits a checkpoint by renaming a directory (:data:`COMMITS_BY_DIRECTORY_RENAME`)."""
    return spec.train.workload in COMMITS_BY_DIRECTORY_RENAME


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


def compile_workers(spec: RunSpec) -> int:
    """The compile job's workers: the training job's full size (an elastic range's maximum), never a range, so it
    compiles the programs a full-size training job loads (``components.stages.compile_cache``)."""
    n = num_workers(spec)
    return n[1] if isinstance(n, tuple) else n


def compile_devices(spec: RunSpec) -> int:
    """The devices the compile job compiles for: its workers, each a host's JAX runtime with its devices."""
    return compile_workers(spec) * check_devices_per_host(spec)


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


def check_devices_per_host(spec: RunSpec) -> int:
    """The devices of each host that the slice check runs on: the TPU devices (logical: 2 per TPU7x chip); on
    emulated hosts one CPU device for torch (a worker per host, as training) or MaxText's CPU device count for JAX."""
    if is_tpu(spec):
        return slice_shape(spec).logical_devices_per_host
    return spec.maxtext.cpu_devices_per_host if spec.train.workload == "maxtext" else 1


def check_ranks(spec: RunSpec) -> int:
    """The slice check's ranks: one per device for TorchTPU workloads (a process per device), one per host for JAX
    (a runtime per host, which owns its devices)."""
    if spec.train.workload in DEVICE_CENTRIC_WORKLOADS:
        return spec.total_hosts * check_devices_per_host(spec)
    return spec.total_hosts


def job_command(
    spec: RunSpec,
    mode: str,
    output_dir: str,
    run_name: str,
    checkpoint: str = "",
    init_from: str = "",
    champion: str = "",
    compile_cache: str = "",
    measure: tuple[str, ...] = (),
    generate: tuple[str, ...] = (),
) -> str:
    """The Ray job entrypoint of the workload: ``mode`` check (the slice check), train, eval of ``checkpoint``, or
    compile (MaxText's compile job: ``maxtext.compile_args``, on synthetic inputs).
    The spec travels whole, as JSON, with what is derived from it: Ray Train's ScalingConfig, the slice check's
    devices per host and, for MaxText, the exact ``key=value`` arguments MaxText receives. What the registry
    resolved when the stage ran comes as paths the cluster sees: ``init_from``, the checkpoint training starts from
    (train) and the evaluation's "before" model (eval); ``champion``, the champion's checkpoint, measured in the
    same evaluation; ``compile_cache``, the job's own directory of compiled programs, filled with the verified
    entries of the cache kept across runs (``components.workload.cache.directory``,
    ``components.stages.compile_cache``; the FSDP trainer's is per run, its tokenised training split there too);
    ``measure``, which of before, after and champion the evaluation measures (empty: all); ``generate``, which of
    them also answer the evaluation prompts (the FSDP trainer: ``trainers.generation``); for MaxText's answers, the
    shape its engine decodes in (``decode``: ``maxtext.decode_shape``). One source for the stages' job submissions
    and the plan."""
    from components.workload import maxtext

    module = WORKLOAD_ENTRYPOINTS[spec.train.workload][mode]
    words = ["python", "-m", *module]
    args = {"spec": spec.to_json(), "output_dir": output_dir}
    if mode in ("train", "eval", "check", "compile"):  # the jobs that run on the training workers
        args["run_name"] = run_name
        scaling = scaling_config_args(spec)
        if mode == "compile":  # fixed at the training size: a smaller group's programs are not a full job's
            scaling["num_workers"] = compile_workers(spec)
        args["scaling_config"] = json.dumps(scaling, sort_keys=True)
    if mode == "check":
        args["devices_per_host"] = str(check_devices_per_host(spec))
    if mode == "eval":
        args["checkpoint"] = checkpoint
    if mode in ("train", "eval") and init_from:
        args["init_from"] = init_from
    if mode == "eval" and champion:
        args["champion"] = champion
    if mode == "train" and compile_cache and spec.train.workload == "fsdp":
        args["compile_cache"] = compile_cache
    if mode == "eval" and measure:
        args["measure"] = ",".join(measure)
    if mode == "eval" and generate:
        args["generate"] = ",".join(generate)
    decode = maxtext.decode_shape(spec) if spec.train.workload == "maxtext" and mode in ("train", "eval") else None
    if decode:
        args["decode"] = json.dumps(decode, sort_keys=True)
    for key, value in args.items():
        words += [f"--{key.replace('_', '-')}", shlex.quote(value)]
    if spec.train.workload == "maxtext" and mode != "check":
        made = maxtext.compile_args if mode == "compile" else maxtext.train_args
        words += ["--", *(shlex.quote(a) for a in made(spec, output_dir, run_name, compile_cache))]
    return " ".join(words)


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
