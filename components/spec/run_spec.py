"""The run spec: one typed, strict, read-only description of a tpupipe run.

Layers, like MaxText's config: field defaults -> preset -> overrides (``key=value``). Every layer goes through
the same strict parser: unknown keys are rejected, values are coerced to the field's type, and cross-field
checks run once on the result. Errors are :class:`SpecError` and name the field.

This module is pure standard library: it is imported by the components (pipeline image) and by the trainers
(trainer images) alike.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.spec import models, names, presets
from components.spec.errors import SpecError

CAPACITY_TYPES = ("on-demand", "spot", "reservation", "flex-start")
WORKLOADS = ("fsdp", "maxtext")
GENERATED_DATASET = "generated"
SCRATCH_PREFIX = "scratch:"
CHAMPION = "champion"  # the registry's alias of the version in use; train.init_from=champion starts from it
# What follows NAME@ in train.init_from: a version id or an alias (the registry's rule, components.registry.REF).
MODEL_REF = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")


# How long deploy_raycluster waits for every worker host when cluster.ready_timeout_s is 0 (the default), and how long
# a worker pod may stay Unschedulable with no scale-up under way (no TriggeredScaleUp event) before the run fails, by
# how the TPU nodes come. Seconds: (deadline, unschedulable grace).
READY_LIMITS_S = {
    # Standard node pools made with their nodes at provision (fixed size): the pods schedule at once, the wait is the
    # image pull and Ray's start; a pod left unschedulable means no capacity the pool can give.
    "on-demand": (180.0, 120.0),
    "reservation": (180.0, 120.0),
    "spot": (180.0, 120.0),
    # Flex-start pools start with 0 nodes and autoscale: the pods sit Unschedulable with a TriggeredScaleUp event while
    # the nodes come (../shared/reference/platform-facts.md); a flex-start request "persists until capacity becomes
    # available" (Cloud TPU docs, "Request Cloud TPUs using Flex-start"; GKE docs, "About flex-start provisioning
    # mode"): minutes, at times far more. An hour before the run gives up; cluster.ready_timeout_s for longer.
    "flex-start": (3600.0, 120.0),
    # Autopilot makes the TPU nodes when the pods ask for them (GKE docs, "Deploy TPU workloads in GKE Autopilot"):
    # Unschedulable with TriggeredScaleUp while a slice's nodes are created, minutes. Combined with the capacity type's
    # row (the longer of each).
    "autopilot": (1800.0, 120.0),
}


@dataclass(frozen=True)
class ReadyLimits:
    """How long deploy_raycluster waits for every host, and for a pod unschedulable with no scale-up under way."""

    deadline_s: float
    unschedulable_grace_s: float
    by: str  # where the deadline comes from, for the plan and the log


@dataclass(frozen=True)
class ClusterSpec:
    """Where the run trains: the hosts of the Ray cluster."""

    accelerator: str = "cpu"  # "cpu" (emulated hosts) or a TPU family: v5e, v5p, v6e, tpu7x
    topology: str = ""  # TPU slice topology, e.g. "4x4"; empty for cpu
    num_slices: int = 1
    num_hosts: int = 2  # hosts per slice (emulated raylets on the local platform)
    cpus_per_host: int = 1  # Ray CPUs each emulated host offers (local platform)
    capacity: str = "on-demand"  # on TPU: on-demand, spot, reservation or flex-start
    reservation: str = ""  # required when capacity=reservation: NAME or projects/P/reservations/NAME
    ready_timeout_s: float = 0.0  # how long deploy_raycluster waits for every host; 0: by the capacity type
    # Pod sizes on GKE (cpus_per_host is also each TPU worker pod's CPU request):
    head_cpus: int = 4
    head_memory_gib: int = 16
    worker_memory_gib: int = 200  # each TPU worker pod (one per host)
    worker_shm_gib: int = 100  # /dev/shm (in memory) of each TPU worker pod; 0: none
    expected_hours: float = 1.0  # expected duration of the run, for the cost estimate of `tpupipe plan`
    # The slice check before training: every device's collectives and tensor-parallel parity (check_slice stage).
    slice_check: bool = True  # off: the check_slice stage skips, and the summary says so
    slice_check_timeout_s: float = 600.0  # how long the check waits for every rank
    slice_check_corrupt_rank: int = -1  # testing aid: corrupt this rank's check result (-1: none)


@dataclass(frozen=True)
class TrainSpec:
    """What the run trains, and how."""

    workload: str = "fsdp"
    model_id: str = "scratch:gemma4-tiny"  # hub name, local directory, or scratch:<config> (random init)
    # Start from a registered version's weights (over model_id's architecture): "" (model_id's own), "champion"
    # (the champion of gate.model, resolved when train starts) or NAME@VERSION (a version id or an alias).
    init_from: str = ""
    dataset: str = GENERATED_DATASET  # "generated", a local .json/.jsonl file, or a hub dataset name
    train_split: str = "train"
    eval_split: str = "heldout"
    num_train_examples: int = 1024  # size of the generated dataset's train split
    num_eval_examples: int = 128  # size of the generated dataset's held-out split
    max_length: int = 64  # tokens per example, padded
    batch_size: int = 8  # per worker
    epochs: int = 3
    learning_rate: float = 2e-5
    weight_decay: float = 0.01
    seed: int = 0
    num_workers: int = 0  # 0: one per host (cpu) or one per TPU device
    min_workers: int = 0  # elastic range (min_workers, max_workers), whole slices; 0 and 0: not elastic
    max_workers: int = 0
    num_to_keep: int = 1  # checkpoints kept, best by loss
    max_failures: int = 0  # worker-group restarts Ray Train may make
    fail_at_step: int = 0  # testing aid: raise inside training at this global step (0: never)
    fail_eval: bool = False  # testing aid: raise inside the (fsdp) evaluation job before it measures anything
    checkpoint_optimizer: bool = True  # the optimizer state in each checkpoint (a resume keeps AdamW's moments)
    timeout_s: float = 3600.0  # the train job's deadline


@dataclass(frozen=True)
class GateSpec:
    """The model registry and the gate in front of its champion: every trained model is registered as a version of
    ``model`` with its provenance, and becomes the champion only when its held-out loss beats the champion's, both
    measured in the same evaluation job, by at least ``min_improvement``."""

    register: bool = True  # off: no registration, no champion measured, no promotion
    model: str = ""  # the registered model's name; empty: derived from the preset's name
    min_improvement: float = 0.0  # relative: (champion - new) / champion must reach it; 0: any improvement


GKE_CLUSTER_MODES = ("standard", "autopilot")
MULTISLICE_NETWORKS = ("dcn_networks", "accelerator_network_profile", "none")


@dataclass(frozen=True)
class GkeSpec:
    """The gke platform: where the run's cloud resources go. Every name not set here derives from the run id."""

    project: str = ""  # GCP project id; `tpupipe plan` shows PROJECT_ID while it is empty
    zone: str = ""  # TPU zone; empty: the first zone the catalogue documents for the accelerator
    cluster_name: str = ""  # an existing GKE cluster to use; empty: the run creates (and deletes) its own
    cluster_mode: str = "standard"  # standard or autopilot
    # GKE version of a cluster the run creates (the presets pin their seed's); empty: the release channel's default.
    # Provisioning checks the version GKE reports, of a created or an existing cluster, against the hardware's floors.
    cluster_version: str = ""
    cpu_machine_type: str = "n2-standard-8"  # the CPU node pool that carries the Ray head (standard mode)
    # The nodes' identity (every node pool; Autopilot's nodes): a service account email; empty: the project's default
    # Compute Engine service account, PROJECT_NUMBER-compute@developer.gserviceaccount.com. Provisioning checks, before
    # it creates anything, that the project's IAM policy grants it what nodes need (image pulls, logs, metrics).
    node_service_account: str = ""
    multislice_network: str = "dcn_networks"  # NICs between slices: dcn_networks, accelerator_network_profile, none
    # The Pod and Service IPv4 ranges (CIDR) of a cluster the run creates; empty: GKE picks them. Either must not
    # overlap the DCN networks' subnets (checked at plan time, and against the ranges GKE reports at provision).
    pod_range: str = ""
    service_range: str = ""
    bucket: str = ""  # checkpoint bucket (kept after the run); empty: <project>-tpupipe
    namespace: str = "tpupipe"  # Kubernetes namespace of the run's objects
    artifact_repository: str = "tpupipe"  # Artifact Registry Docker repository in the zone's region
    image: str = ""  # the trainer image; empty: <region>-docker.pkg.dev/<project>/<repository>/<image>:<run id>
    # A TorchTPU base image (torch, torch_tpu, libtpu) to build the torch trainer image FROM, its torch kept; empty:
    # python:3.12-slim with torch, torch-tpu and libtpu from PyPI (images/torch/requirements.txt).
    torch_tpu_base: str = ""
    hf_secret: str = "hf-secret"  # Secret (key hf_api_token) that holds the Hugging Face token; empty: none
    # Where deploy_raycluster reads the token when the namespace has no such Secret: a Secret Manager secret,
    # projects/P/secrets/NAME[/versions/V] (latest by default); empty: $HF_TOKEN of the process that deploys.
    hf_token_secret: str = ""


@dataclass(frozen=True)
class MaxTextSpec:
    """The MaxText pretraining workload (train.workload=maxtext): MaxText's own overrides, one field each.
    Parallelism axes follow MaxText: ICI axes multiply to the devices of a slice, DCN axes to the slices;
    -1 fills in what is left (MaxText's defaults are ici_fsdp -1 and dcn_data -1)."""

    model_name: str = "llama3-8b"  # a MaxText model config, or a tpupipe scratch model (tiny-llama)
    dataset_type: str = "synthetic"
    per_device_batch_size: float = 4.0
    max_target_length: int = 4096
    steps: int = 100
    ici_data_parallelism: int = 1
    ici_fsdp_parallelism: int = -1
    ici_tensor_parallelism: int = 1
    dcn_data_parallelism: int = -1
    dcn_fsdp_parallelism: int = 1
    remat_policy: str = ""  # empty: MaxText's default
    learning_rate: float = 0.0  # 0: MaxText's default
    checkpoint_period: int = 0  # steps between checkpoints; 0: MaxText's default
    eval_steps: int = 4  # batches of MaxText's eval loop in the evaluate stage
    cpu_devices_per_host: int = 2  # JAX devices of each emulated CPU host (XLA's host device count)


@dataclass(frozen=True)
class RunSpec:
    name: str = "custom"
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    gke: GkeSpec = field(default_factory=GkeSpec)
    maxtext: MaxTextSpec = field(default_factory=MaxTextSpec)
    gate: GateSpec = field(default_factory=GateSpec)

    # ---- derived facts (one place each) ----
    @property
    def total_hosts(self) -> int:
        return self.cluster.num_hosts * self.cluster.num_slices

    @property
    def model_name(self) -> str:
        """The registered model this run's versions belong to: ``gate.model``, else derived from the preset."""
        return self.gate.model or names.model_name(self.name)

    @property
    def init_from_ref(self) -> tuple[str, str] | None:
        """``train.init_from`` as (model, version or alias); None when training starts from ``train.model_id``."""
        ref = self.train.init_from
        if not ref:
            return None
        if ref == CHAMPION:
            return self.model_name, CHAMPION
        name, _, version = ref.partition("@")
        return name, version

    @property
    def num_workers(self) -> int:
        if self.train.num_workers:
            return self.train.num_workers
        return self.total_hosts

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return from_dict(json.loads(text))


SECTIONS: dict[str, type] = {
    "cluster": ClusterSpec,
    "train": TrainSpec,
    "gke": GkeSpec,
    "maxtext": MaxTextSpec,
    "gate": GateSpec,
}


def _field_types(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def all_keys() -> list[str]:
    """Every settable dotted key, in declaration order."""
    keys = ["name"]
    for section, cls in SECTIONS.items():
        keys += [f"{section}.{name}" for name in _field_types(cls)]
    return keys


def _canonical_key(key: str) -> str:
    """Accept a dotted key, or a leaf name that is unique across sections (``epochs`` -> ``train.epochs``)."""
    keys = all_keys()
    if key in keys:
        return key
    matches = [k for k in keys if k.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise SpecError(key, "ambiguous key; use the full name", matches)
    raise SpecError(key, "unknown key", keys)


def _coerce(key: str, value: Any, typ: type) -> Any:
    if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
        return value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            if typ is bool:
                lowered = text.lower()
                if lowered in ("true", "1", "yes", "on"):
                    return True
                if lowered in ("false", "0", "no", "off"):
                    return False
                raise ValueError(text)
            if typ is int:
                return int(text)
            if typ is float:
                return float(text)
            if typ is str:
                return value
        except ValueError:
            pass
    raise SpecError(key, f"expected {typ.__name__}, got {value!r}")


def from_dict(data: dict[str, Any]) -> RunSpec:
    """Build a validated spec from a nested dict (the JSON form). Unknown keys are errors."""
    if not isinstance(data, dict):
        raise SpecError("spec", f"expected an object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"name", *SECTIONS})
    if unknown:
        raise SpecError(unknown[0], "unknown key", ["name", *SECTIONS])
    sections = {}
    for section, cls in SECTIONS.items():
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            raise SpecError(section, f"expected an object, got {type(raw).__name__}")
        types = _field_types(cls)
        for key in raw:
            if key not in types:
                raise SpecError(f"{section}.{key}", "unknown key", [f"{section}.{k}" for k in types])
        sections[section] = cls(**{k: _coerce(f"{section}.{k}", v, types[k]) for k, v in raw.items()})
    name = _coerce("name", data.get("name", "custom"), str)
    spec = RunSpec(name=name, **sections)
    validate(spec)
    return spec


def parse_overrides(text: str | typing.Iterable[str]) -> dict[str, str]:
    """``"epochs=2 cluster.num_hosts=3"`` (or a list of ``key=value``) -> {canonical key: raw value}."""
    items = shlex.split(text) if isinstance(text, str) else list(text)
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(item, "an override must look like key=value")
        out[_canonical_key(key.strip())] = value
    return out


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Layer dotted-key overrides onto a nested spec dict (a copy)."""
    merged = json.loads(json.dumps(base))
    for key, value in overrides.items():
        key = _canonical_key(key)
        if "." in key:
            section, leaf = key.split(".", 1)
            merged.setdefault(section, {})[leaf] = value
        else:
            merged[key] = value
    return merged


def _is_local_file(dataset: str) -> bool:
    return dataset.endswith((".json", ".jsonl")) or dataset.startswith(("/", "./", "../", "~"))


def _check_counts(spec: RunSpec) -> None:
    """Counts and durations: positive where zero means nothing, non-negative where zero means "off"."""
    c, t = spec.cluster, spec.train
    positive = {
        "cluster.num_slices": c.num_slices,
        "cluster.num_hosts": c.num_hosts,
        "cluster.cpus_per_host": c.cpus_per_host,
        "cluster.head_cpus": c.head_cpus,
        "cluster.head_memory_gib": c.head_memory_gib,
        "cluster.worker_memory_gib": c.worker_memory_gib,
        "train.epochs": t.epochs,
        "train.batch_size": t.batch_size,
        "train.num_to_keep": t.num_to_keep,
        "train.num_train_examples": t.num_train_examples,
        "train.num_eval_examples": t.num_eval_examples,
    }
    for key, value in positive.items():
        if value < 1:
            raise SpecError(key, f"must be at least 1, got {value}", ["an integer >= 1"])
    for key, value in {
        "train.num_workers": t.num_workers,
        "train.max_failures": t.max_failures,
        "train.fail_at_step": t.fail_at_step,
        "train.min_workers": t.min_workers,
        "train.max_workers": t.max_workers,
        "cluster.worker_shm_gib": c.worker_shm_gib,
    }.items():
        if value < 0:
            raise SpecError(key, f"must be 0 or more, got {value}", ["an integer >= 0"])
    if c.slice_check_corrupt_rank < -1:
        raise SpecError(
            "cluster.slice_check_corrupt_rank",
            f"must be -1 (none) or a rank, got {c.slice_check_corrupt_rank}",
            ["-1", "an integer >= 0"],
        )
    if not c.ready_timeout_s >= 0:
        raise SpecError(
            "cluster.ready_timeout_s",
            f"must be 0 (by the capacity type) or seconds, got {c.ready_timeout_s}",
            ["0", "a number of seconds > 0"],
        )
    for key, value in {
        "train.timeout_s": t.timeout_s,
        "cluster.expected_hours": c.expected_hours,
        "cluster.slice_check_timeout_s": c.slice_check_timeout_s,
    }.items():
        if not value > 0:
            raise SpecError(key, f"must be positive, got {value}")


def _check_training(spec: RunSpec) -> None:
    """The optimiser, the capacity type, the workload, the model and the data."""
    c, t = spec.cluster, spec.train
    if t.max_length < 8:
        raise SpecError("train.max_length", f"must be at least 8, got {t.max_length}")
    if not t.learning_rate >= 0:  # 0 trains nothing: a run that measures its starting model
        raise SpecError("train.learning_rate", f"must be 0 or more, got {t.learning_rate}")
    if t.weight_decay < 0:
        raise SpecError("train.weight_decay", f"must be 0 or more, got {t.weight_decay}")
    if c.capacity not in CAPACITY_TYPES:
        raise SpecError("cluster.capacity", f"unknown capacity type {c.capacity!r}", CAPACITY_TYPES)
    if c.capacity == "reservation" and not c.reservation:
        raise SpecError(
            "cluster.reservation",
            "required when cluster.capacity=reservation",
            ["a reservation name", "projects/PROJECT/reservations/NAME"],
        )
    if t.workload not in WORKLOADS:
        raise SpecError("train.workload", f"unknown workload {t.workload!r}", WORKLOADS)
    if not t.model_id:
        raise SpecError("train.model_id", "must not be empty")
    if t.model_id.startswith(SCRATCH_PREFIX):
        config = t.model_id.removeprefix(SCRATCH_PREFIX)
        if config not in models.SCRATCH_CONFIGS:
            raise SpecError(
                "train.model_id",
                f"unknown scratch config {config!r}",
                [SCRATCH_PREFIX + n for n in models.SCRATCH_CONFIGS],
            )
    if t.dataset != GENERATED_DATASET and _is_local_file(t.dataset):
        if not Path(t.dataset).expanduser().is_file():
            raise SpecError("train.dataset", f"file not found: {t.dataset}")


_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IMAGE_REF = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?"
    r"(@sha256:[0-9a-f]{64})?$"
)
SECRET_VERSION = re.compile(r"^projects/[a-z0-9-]{1,30}/secrets/[A-Za-z0-9_-]{1,255}(/versions/(latest|[1-9][0-9]*))?$")
SERVICE_ACCOUNT = re.compile(
    r"^([a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\.iam"
    r"|[0-9]+-compute@developer)\.gserviceaccount\.com$"
)
GKE_VERSION = re.compile(r"^(latest|\d+\.\d+(\.\d+(-gke\.\d+)?)?)$")


def _check_gke_fields(spec: RunSpec) -> None:
    """The gke section's own fields: names Google Cloud and Kubernetes accept. (The version floors of the
    hardware are checked with the TPU catalogue, in ``components.workload.checks``.)"""
    g = spec.gke
    if g.cluster_mode not in GKE_CLUSTER_MODES:
        raise SpecError("gke.cluster_mode", f"unknown cluster mode {g.cluster_mode!r}", GKE_CLUSTER_MODES)
    if g.multislice_network not in MULTISLICE_NETWORKS:
        raise SpecError("gke.multislice_network", f"unknown network mode {g.multislice_network!r}", MULTISLICE_NETWORKS)
    checks = [
        (
            "gke.project",
            g.project,
            re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$"),
            "6 to 30 lowercase letters, digits and hyphens, starting with a letter",
        ),
        ("gke.zone", g.zone, re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$"), "a zone such as us-east5-b"),
        (
            "gke.cluster_name",
            g.cluster_name,
            re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"),
            "1 to 40 lowercase letters, digits and hyphens, starting with a letter",
        ),
        ("gke.namespace", g.namespace, _DNS_LABEL, "a DNS label of at most 63 characters"),
        (
            "gke.bucket",
            g.bucket,
            re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$"),
            "3 to 63 lowercase letters, digits, '-', '_' and '.'",
        ),
        ("gke.artifact_repository", g.artifact_repository, _DNS_LABEL, "lowercase letters, digits and hyphens"),
        (
            "gke.cpu_machine_type",
            g.cpu_machine_type,
            re.compile(r"^[a-z][a-z0-9]*-[a-z0-9-]+$"),
            "a Compute Engine machine type such as n2-standard-8",
        ),
        ("gke.hf_secret", g.hf_secret, _DNS_LABEL, "a Secret name, or empty for none"),
    ]
    if g.node_service_account and not SERVICE_ACCOUNT.match(g.node_service_account):
        raise SpecError(
            "gke.node_service_account",
            f"{g.node_service_account!r} is not a service account email",
            [
                "NAME@PROJECT.iam.gserviceaccount.com",
                "PROJECT_NUMBER-compute@developer.gserviceaccount.com",
                "empty: the project's default Compute Engine service account",
            ],
        )
    if g.hf_token_secret and not SECRET_VERSION.match(g.hf_token_secret):
        raise SpecError(
            "gke.hf_token_secret",
            f"{g.hf_token_secret!r} is not a Secret Manager secret",
            ["projects/PROJECT/secrets/NAME", "projects/PROJECT/secrets/NAME/versions/VERSION"],
        )
    if g.hf_token_secret and not g.hf_secret:
        raise SpecError(
            "gke.hf_token_secret",
            "the token goes into the Secret gke.hf_secret names, which is empty",
            ["", "gke.hf_secret=hf-secret"],
        )
    for key, value in (("gke.image", g.image), ("gke.torch_tpu_base", g.torch_tpu_base)):
        if value and not _IMAGE_REF.match(value):
            raise SpecError(key, f"{value!r} is not an image reference", ["REGISTRY/PATH/NAME:TAG"])
    for key, value, pattern, what in checks:
        if value and (len(value) > 63 or not pattern.match(value)):
            raise SpecError(key, f"{value!r} is not valid", [what])
    for key, value in (
        ("gke.namespace", g.namespace),
        ("gke.artifact_repository", g.artifact_repository),
        ("gke.cpu_machine_type", g.cpu_machine_type),
    ):
        if not value:
            raise SpecError(key, "must not be empty")
    for key, value in (("gke.pod_range", g.pod_range), ("gke.service_range", g.service_range)):
        if not value:
            continue
        if g.cluster_name:
            raise SpecError(
                key, f"applies to a cluster the run creates; gke.cluster_name={g.cluster_name} is an existing one", [""]
            )
        try:
            ipaddress.IPv4Network(value)
        except ValueError:
            raise SpecError(key, f"{value!r} is not an IPv4 range", ["10.4.0.0/14", "empty: GKE picks one"]) from None
    if g.cluster_version:  # with gke.cluster_name not applied: the existing cluster's own version is checked
        if not GKE_VERSION.match(g.cluster_version):
            raise SpecError(
                "gke.cluster_version",
                f"{g.cluster_version!r} is not a GKE version",
                ["latest", "1.35", "1.35.2-gke.1842000"],
            )


def _check_gate(spec: RunSpec) -> None:
    """The registered model's name, the gate's threshold, and where training starts from."""
    g, t = spec.gate, spec.train
    if g.model and not names.MODEL_NAME.match(g.model):
        raise SpecError(
            "gate.model",
            f"{g.model!r} is not a model name",
            ["a lowercase letter, then up to 62 lowercase letters, digits, '_' or '-'"],
        )
    if not 0 <= g.min_improvement < 1:
        raise SpecError(
            "gate.min_improvement",
            f"a relative improvement from 0 (any) to below 1, got {g.min_improvement}",
            ["0.0", "0.01 (1% lower held-out loss)"],
        )
    if not t.init_from:
        return
    name, at, version = t.init_from.partition("@")
    if t.init_from != CHAMPION and not (at and names.MODEL_NAME.match(name) and MODEL_REF.match(version)):
        raise SpecError(
            "train.init_from",
            f"{t.init_from!r} names no registered version",
            ["", CHAMPION, "NAME@VERSION (gemma-ft@3)", "NAME@ALIAS (gemma-ft@champion)"],
        )
    if t.workload != "fsdp":
        raise SpecError(
            "train.init_from",
            f"the {t.workload} workload starts from its own model; only the fsdp "
            "workload starts from a registered version",
            [""],
        )


def validate(spec: RunSpec) -> None:
    """The spec's own checks (no hardware knowledge): raises SpecError naming the first bad field. The checks
    against the TPU catalogue and MaxText's rules run in ``components.workload.resolve``."""
    _check_counts(spec)
    _check_training(spec)
    _check_gke_fields(spec)
    _check_gate(spec)


def ready_limits(spec: RunSpec) -> ReadyLimits:
    """The readiness deadline and unschedulable grace of ``spec``: ``READY_LIMITS_S`` by cluster.capacity (and
    Autopilot), the deadline overridden by cluster.ready_timeout_s when it is set."""
    c = spec.cluster
    rows = [c.capacity] + (["autopilot"] if spec.gke.cluster_mode == "autopilot" else [])
    deadline = max(READY_LIMITS_S[row][0] for row in rows)
    grace = max(READY_LIMITS_S[row][1] for row in rows)
    if c.ready_timeout_s:
        return ReadyLimits(c.ready_timeout_s, grace, "cluster.ready_timeout_s")
    return ReadyLimits(
        deadline,
        grace,
        f"cluster.capacity={c.capacity}" + (", gke.cluster_mode=autopilot" if "autopilot" in rows else ""),
    )


def layered(preset: str, overrides: str | typing.Iterable[str] | dict[str, Any] = "") -> RunSpec:
    """preset name + overrides -> a RunSpec that passed the spec's own checks. Callers that run anything use
    ``components.workload.resolve``, which adds the hardware checks."""
    if preset not in presets.PRESETS:
        raise SpecError("preset", f"unknown preset {preset!r}", sorted(presets.PRESETS))
    parsed = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    base = {"name": preset, **presets.PRESETS[preset]}
    return from_dict(apply_overrides(base, parsed))
