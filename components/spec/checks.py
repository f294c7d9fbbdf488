"""The run spec's own checks, across fields (no hardware knowledge): counts, the training setup, the gke section's
names, the gate and the run's limits. The checks against the TPU catalogue and MaxText's rules are
``components.workload.checks``."""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path

from components.spec import datasets, models, names
from components.spec.errors import SpecError
from components.spec.run_spec import (
    CAPACITY_TYPES,
    CHAMPION,
    GKE_CLUSTER_MODES,
    MODEL_REF,
    MULTISLICE_NETWORKS,
    PRECISIONS,
    SCRATCH_PREFIX,
    WORKLOADS,
    RunSpec,
)


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
        "train.checkpoint_every_steps": t.checkpoint_every_steps,
        "train.min_workers": t.min_workers,
        "train.max_workers": t.max_workers,
        "cluster.worker_shm_gib": c.worker_shm_gib,
    }.items():
        if value < 0:
            raise SpecError(key, f"must be 0 or more, got {value}", ["an integer >= 0"])
    for key, rank in {
        "cluster.slice_check_corrupt_rank": c.slice_check_corrupt_rank,
        "cluster.slice_check_slow_rank": c.slice_check_slow_rank,
    }.items():
        if rank < -1:
            raise SpecError(key, f"must be -1 (none) or a rank, got {rank}", ["-1", "an integer >= 0"])
    for key, delay in {
        "cluster.host_start_delay_s": c.host_start_delay_s,
        "cluster.host_replace_delay_s": c.host_replace_delay_s,
    }.items():
        if not delay >= 0:
            raise SpecError(key, f"must be 0 or more seconds, got {delay}")
        if delay and c.accelerator != "cpu":
            raise SpecError(key, "delays emulated hosts only: needs cluster.accelerator=cpu", ["0"])
    if not c.ready_timeout_s >= 0:
        raise SpecError(
            "cluster.ready_timeout_s",
            f"must be 0 (by the capacity type) or seconds, got {c.ready_timeout_s}",
            ["0", "a number of seconds > 0"],
        )
    for key, amount in {
        "train.timeout_s": t.timeout_s,
        "cluster.expected_hours": c.expected_hours,
        "cluster.slice_check_timeout_s": c.slice_check_timeout_s,
    }.items():
        if not amount > 0:
            raise SpecError(key, f"must be positive, got {amount}")


def _check_training(spec: RunSpec) -> None:
    """The optimiser, the capacity type, the workload, the model and the data."""
    c, t = spec.cluster, spec.train
    if t.max_length < 8:
        raise SpecError("train.max_length", f"must be at least 8, got {t.max_length}")
    if not t.learning_rate >= 0:  # 0 trains nothing: a run that measures its starting model
        raise SpecError("train.learning_rate", f"must be 0 or more, got {t.learning_rate}")
    if t.weight_decay < 0:
        raise SpecError("train.weight_decay", f"must be 0 or more, got {t.weight_decay}")
    for rung in c.capacities or ("",):
        if rung not in CAPACITY_TYPES:
            raise SpecError("cluster.capacity", f"unknown capacity type {rung!r}", CAPACITY_TYPES)
    if len(set(c.capacities)) < len(c.capacities):
        raise SpecError("cluster.capacity", f"names a capacity type twice: {c.capacity!r}", CAPACITY_TYPES)
    if "reservation" in c.capacities and not c.reservation:
        raise SpecError(
            "cluster.reservation",
            "required when cluster.capacity=reservation",
            ["a reservation name", "projects/PROJECT/reservations/NAME"],
        )
    if t.workload not in WORKLOADS:
        raise SpecError("train.workload", f"unknown workload {t.workload!r}", WORKLOADS)
    if t.precision not in PRECISIONS:
        raise SpecError("train.precision", f"unknown precision {t.precision!r}", PRECISIONS)
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
    _check_data(spec)


_GCS = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$")
# PROJECT.DATASET.TABLE: a project id (a domain-scoped one has "domain:"), a dataset id of letters, digits and
# underscores, a table id of up to 1,024 characters (https://cloud.google.com/bigquery/docs/datasets#dataset-naming,
# https://cloud.google.com/bigquery/docs/tables#table_naming).
# The parts are checked against those rules when the run's first stage reads the table (components/data/bigquery.py).
_BQ = re.compile(r"^bq://[^.\s]+(\.[^.\s]+)*\.[^.]+\.[^.]+$")
DATASET_SHAPES = ["generated", "a hub dataset name", "a local file, DIR/ or glob", "gs://BUCKET/PREFIX/", "bq://P.D.T"]


def _check_data(spec: RunSpec) -> None:
    """Where the examples come from: each dataset's shape and placeholders (no file opened but a local one named
    without a placeholder, no call made); the fields that go with a kind; ``train.data_since``."""
    t = spec.train
    for key, value in (("train.dataset", t.dataset), ("train.eval_dataset", t.eval_dataset)):
        if not value:
            continue
        try:
            source = datasets.kind(value)
        except ValueError as exc:
            raise SpecError(key, str(exc), DATASET_SHAPES) from None
        unknown = [p for p in datasets.placeholders(value) if p not in datasets.PLACEHOLDERS]
        if unknown:
            raise SpecError(key, f"unknown placeholder {{{unknown[0]}}} in {value!r}", ["{date}"])
        if source == "gcs" and not _GCS.match(value):
            raise SpecError(key, f"not a Cloud Storage URI: {value!r}", ["gs://BUCKET/PREFIX/", "gs://BUCKET/*.jsonl"])
        if source == "bigquery" and not _BQ.match(value):
            raise SpecError(key, f"not a BigQuery table: {value!r}", ["bq://PROJECT.DATASET.TABLE"])
        if source == "local" and not datasets.placeholders(value) and not any(c in value for c in "*?["):
            if not Path(value).expanduser().exists():
                raise SpecError(key, f"file not found: {value}")
    if t.eval_dataset and not datasets.snapshotted(t.eval_dataset):
        raise SpecError(
            "train.eval_dataset",
            f"a fixed evaluation set is snapshotted data, got {t.eval_dataset!r}",
            DATASET_SHAPES[2:],
        )
    snapshotted = datasets.snapshotted(t.dataset)
    if t.eval_dataset and not snapshotted:
        raise SpecError(
            "train.eval_dataset", f"needs a snapshotted train.dataset (local files, gs://, bq://), got {t.dataset!r}"
        )
    is_bq = snapshotted and datasets.kind(t.dataset) == "bigquery"
    for key, value in (
        ("train.dataset_filter", t.dataset_filter),
        ("train.dataset_time_column", t.dataset_time_column),
    ):
        if value and not is_bq:
            raise SpecError(key, f"applies to a bq:// train.dataset only, got {t.dataset!r}", [""])
    if t.dataset_time_column and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,299}", t.dataset_time_column):
        raise SpecError("train.dataset_time_column", f"not a column name: {t.dataset_time_column!r}")
    if t.data_since not in datasets.SINCE:
        raise SpecError("train.data_since", f"unknown value {t.data_since!r}", ['""', "champion"])
    if t.data_since:
        if not snapshotted:
            raise SpecError("train.data_since", f"needs a snapshotted train.dataset, got {t.dataset!r}", [""])
        if is_bq and not t.dataset_time_column:
            raise SpecError(
                "train.data_since",
                "a bq:// dataset needs train.dataset_time_column to tell the new rows",
                ["train.dataset_time_column=COLUMN"],
            )
        if not spec.gate.register:
            raise SpecError("train.data_since", "compares with the champion: needs gate.register=true", [""])


_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IMAGE_REF = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?"
    r"(@sha256:[0-9a-f]{64})?$"
)
SECRET_VERSION = re.compile(
    rf"^projects/{names.PROJECT_ID_PATTERN}/secrets/[A-Za-z0-9_-]{{1,255}}(/versions/(latest|[1-9][0-9]*))?$"
)
# A project's Compute Engine default service account: PROJECT_NUMBER-compute@developer.gserviceaccount.com
# (https://cloud.google.com/compute/docs/access/service-accounts#default_service_account).
DEFAULT_COMPUTE_ACCOUNT = re.compile(r"^[0-9]+-compute@developer\.gserviceaccount\.com$")
SERVICE_ACCOUNT = re.compile(  # an account id of 6 to 30 characters @ the project, or a default Compute Engine account
    rf"^[a-z][a-z0-9-]{{4,28}}[a-z0-9]@{names.PROJECT_ID_PATTERN}\.iam\.gserviceaccount\.com$"
    rf"|{DEFAULT_COMPUTE_ACCOUNT.pattern}"
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
    if g.project:
        names.check_project("gke.project", g.project)
    _check_zones(spec)
    checks = [
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
    for key, value, default in (
        ("gke.node_service_account", g.node_service_account, "the project's default Compute Engine service account"),
        ("gke.build_service_account", g.build_service_account, "the project's default Cloud Build service account"),
    ):
        if value and not SERVICE_ACCOUNT.match(value):
            raise SpecError(
                key,
                f"{value!r} is not a service account email",
                [
                    "NAME@PROJECT.iam.gserviceaccount.com",
                    "PROJECT_NUMBER-compute@developer.gserviceaccount.com",
                    f"empty: {default}",
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


def _check_limits(spec: RunSpec) -> None:
    """The run's budget and deadline: unset, or a positive, finite figure."""
    r = spec.run
    for key, value, unit in (
        ("run.max_cost_usd", r.max_cost_usd, "US dollars"),
        ("run.deadline_h", r.deadline_h, "hours"),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise SpecError(
                key,
                f"must be a positive number of {unit}, got {value}",
                ["a number > 0", "empty: the platform's default"],
            )


def validate(spec: RunSpec) -> None:
    """The spec's own checks (no hardware knowledge): raises SpecError naming the first bad field. The checks
    against the TPU catalogue and MaxText's rules run in ``components.workload.resolve``."""
    _check_counts(spec)
    _check_training(spec)
    _check_gke_fields(spec)
    _check_gate(spec)
    _check_limits(spec)


_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$")


def _check_zones(spec: RunSpec) -> None:
    """gke.zones: zones of one region, each once, gke.zone (when set) the first; one zone alone with an existing
    cluster (its zone) or Autopilot (GKE places the nodes in the region)."""
    g = spec.gke
    if not g.zones:
        return
    zones = g.zone_choices
    bad = next((z for z in zones if not _ZONE.match(z)), None)
    if bad is not None:
        raise SpecError("gke.zones", f"{bad!r} is not a zone", ["zones such as us-east5-b,us-east5-a"])
    if len(set(zones)) < len(zones):
        raise SpecError("gke.zones", f"names a zone twice: {g.zones!r}")
    regions = sorted({z.rsplit("-", 1)[0] for z in zones})
    if len(regions) > 1:
        raise SpecError(
            "gke.zones",
            f"zones of {len(regions)} regions ({', '.join(regions)}): the run's image repository, bucket and DCN "
            "subnets are in one region",
            [f"zones of {zones[0].rsplit('-', 1)[0]}"],
        )
    if g.zone and g.zone != zones[0]:
        raise SpecError("gke.zones", f"starts with {zones[0]}, but gke.zone={g.zone}", [f"{g.zone},...", "gke.zone="])
    if len(zones) > 1 and (g.cluster_name or g.cluster_mode == "autopilot"):
        why = f"gke.cluster_name={g.cluster_name} is in one zone" if g.cluster_name else "Autopilot places the nodes"
        raise SpecError("gke.zones", f"{why}: only one zone", [zones[0]])
