"""The run spec's own checks, across fields (no hardware knowledge): counts, the training setup, the gke section's
names, the gate and the run's limits. The checks against the TPU catalogue and MaxText's rules are
``components.workload.checks``."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path

from components.spec import datasets, gke_checks, models, names
from components.spec.errors import SpecError
from components.spec.run_spec import (
    CAPACITY_TYPES,
    CHAMPION,
    CHECKPOINT_STAGINGS,
    GUARD,
    HELDOUT_LOSS,
    MODEL_REF,
    PRECISIONS,
    SCORER,
    SCORER_REF,
    SCORERS_PACKAGE,
    SCRATCH_PREFIX,
    TASK_METRICS,
    WORKLOADS,
    RunSpec,
)

# The fewest generated examples a side-by-side review and a bootstrap interval are worth reading.
MIN_GENERATE_EXAMPLES = 16

SPOT_NOTICE_S = 15.0  # a GKE Spot VM pod's share of its preemption notice, by default


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
        "train.checkpoint_every_steps": t.checkpoint_every_steps,
        "train.min_workers": t.min_workers,
        "train.max_workers": t.max_workers,
        "cluster.worker_shm_gib": c.worker_shm_gib,
    }.items():
        if value < 0:
            raise SpecError(key, f"must be 0 or more, got {value}", ["an integer >= 0"])
    # On GKE a Spot VM's pods get 15 s of its notice (https://cloud.google.com/kubernetes-engine/docs/concepts/
    # spot-vms, "Termination and graceful shutdown of Spot VMs"); more needs a node pool setting and a GKE version
    # the run neither sets nor checks, and a drain deadline past the kill would have Ray record the node's death as
    # unexpected (a failure of the run, not a preemption). So a slice's notice is 15 s at most; emulated hosts may
    # take a longer one, up to GKE's longest Spot grace (120 s on GKE >= 1.35.0-gke.1171000, same page).
    most = 120.0 if c.accelerator == "cpu" else SPOT_NOTICE_S
    if not 0 < c.preemption_notice_s <= most:
        raise SpecError(
            "cluster.preemption_notice_s",
            f"must be more than 0 and at most {most:g} seconds here, got {c.preemption_notice_s}",
            ["15", f"a number of seconds in (0, {most:g}]"],
        )
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


def _a_rank_or_none(key: str, rank: object, spec: RunSpec) -> None:
    """A slice check's rank, or -1 (none); that it is one of the check's ranks needs the hardware
    (``components.workload.checks.check_testing_ranks``)."""
    if not isinstance(rank, int) or rank < -1:
        raise SpecError(key, f"must be -1 (none) or a rank, got {rank}", ["-1", "an integer >= 0"])


def _emulated_hosts_delay(key: str, delay: object, spec: RunSpec) -> None:
    """Seconds, 0 or more; only emulated hosts are delayed."""
    if not isinstance(delay, (int, float)) or not delay >= 0:
        raise SpecError(key, f"must be 0 or more seconds, got {delay}")
    if delay and spec.cluster.accelerator != "cpu":
        raise SpecError(key, "delays emulated hosts only: needs cluster.accelerator=cpu", ["0"])


def _emulated_hosts_drain(key: str, step: object, spec: RunSpec) -> None:
    """A global step, or 0 (never); only an emulated host is drained."""
    if not isinstance(step, int) or step < 0:
        raise SpecError(key, f"must be 0 (never) or a step, got {step}", ["0", "a step"])
    if step and spec.cluster.accelerator != "cpu":
        raise SpecError(key, "drains emulated hosts only: needs cluster.accelerator=cpu", ["0"])


def _a_step_or_never(key: str, step: object, spec: RunSpec) -> None:
    """A global step, or 0 (never)."""
    if not isinstance(step, int) or step < 0:
        raise SpecError(key, f"must be 0 or more, got {step}", ["an integer >= 0"])


def _a_switch(key: str, value: object, spec: RunSpec) -> None:
    """True or false."""
    if not isinstance(value, bool):
        raise SpecError(key, f"must be true or false, got {value!r}", ["true", "false"])


# One check per test aid (``testing``; tests/unit/test_spec.py holds them to the section's fields): each is given the
# key it names, the value and the spec.
TESTING_CHECKS: dict[str, Callable[[str, object, RunSpec], None]] = {
    "slice_check_corrupt_rank": _a_rank_or_none,
    "slice_check_slow_rank": _a_rank_or_none,
    "host_start_delay_s": _emulated_hosts_delay,
    "host_replace_delay_s": _emulated_hosts_delay,
    "drain_host_at_step": _emulated_hosts_drain,
    "fail_at_step": _a_step_or_never,
    "fail_eval": _a_switch,
}


def _check_testing(spec: RunSpec) -> None:
    """The test aids, each by its own check."""
    for f in dataclasses.fields(spec.testing):
        TESTING_CHECKS[f.name](f"testing.{f.name}", getattr(spec.testing, f.name), spec)


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
    if t.checkpoint_staging not in CHECKPOINT_STAGINGS:
        raise SpecError("train.checkpoint_staging", f"unknown staging {t.checkpoint_staging!r}", CHECKPOINT_STAGINGS)
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
    _check_revision(spec)
    _check_data(spec)


DEFAULT_REVISION = "main"  # the hub's default branch (huggingface_hub's constants.py: DEFAULT_REVISION)
# A revision as the hub's API takes it in a path segment (/api/models/REPO/revision/REVISION): a branch or tag name
# by git's rules (https://git-scm.com/docs/git-check-ref-format: no "..", no space or control character, no
# component starting with "." or ending with ".lock", no trailing "/"), "refs/pr/N" of a pull request, or a commit's
# 40 hex digits.
_REVISION = re.compile(r"^(?!.*\.\.)(?!.*//)(?!.*\.lock(/|$))[A-Za-z0-9_][A-Za-z0-9._/-]{0,254}(?<![/.])$")


def _check_revision(spec: RunSpec) -> None:
    """``train.model_revision``: a revision of a hub-named model, which only the FSDP trainer reads from the hub."""
    t = spec.train
    examples = [DEFAULT_REVISION, "a branch or tag (v1.0)", "a commit (40 hex digits)", "refs/pr/3"]
    if not _REVISION.match(t.model_revision) or "/." in t.model_revision:
        raise SpecError("train.model_revision", f"{t.model_revision!r} is not a hub revision", examples)
    if t.model_revision == DEFAULT_REVISION:
        return
    if t.workload != "fsdp":
        raise SpecError(
            "train.model_revision",
            f"the {t.workload} workload reads no hub weights (maxtext.model_name builds its model)",
            [DEFAULT_REVISION],
        )
    if t.model_id.startswith((SCRATCH_PREFIX, "/", ".", "~")) or "://" in t.model_id or t.model_id.count("/") != 1:
        raise SpecError(
            "train.model_revision",
            f"train.model_id={t.model_id} is no hub model (org/name): it has no revisions",
            [DEFAULT_REVISION],
        )


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
        datasets.date_forms(value, key)
        if key == "train.eval_dataset" and datasets.dated(value):
            # The evaluate stage compares each run with the champion on one yardstick, and refuses a set whose content
            # differs from the champion's: a set that moves with the day would be refused on every run after the first.
            raise SpecError(
                key,
                f"{value!r}: a fixed evaluation set is the same examples on every run, so it cannot move with the day "
                "(a date form)",
                ["gs://BUCKET/eval/v1.jsonl", "bq://PROJECT.DATASET.eval_v1", "DIR/eval.jsonl"],
            )
        if source == "gcs" and not _GCS.match(value):
            raise SpecError(key, f"not a Cloud Storage URI: {value!r}", ["gs://BUCKET/PREFIX/", "gs://BUCKET/*.jsonl"])
        if source == "bigquery" and not _BQ.match(value):
            raise SpecError(key, f"not a BigQuery table: {value!r}", ["bq://PROJECT.DATASET.TABLE"])
        if source == "local" and not datasets.placeholders(value) and not any(c in value for c in "*?["):
            if not Path(value).expanduser().exists():
                raise SpecError(key, f"file not found: {value}")
    asked = t.num_train_examples + t.num_eval_examples
    if t.dataset == datasets.GENERATED and asked > datasets.GENERATED_MAX_EXAMPLES:
        raise SpecError(
            "train.num_train_examples",
            f"train.num_train_examples={t.num_train_examples} + train.num_eval_examples={t.num_eval_examples} = "
            f"{asked} > {datasets.GENERATED_MAX_EXAMPLES}: the generated task gives at most "
            f"{datasets.GENERATED_MAX_EXAMPLES} examples in all",
            [f"train.num_train_examples + train.num_eval_examples <= {datasets.GENERATED_MAX_EXAMPLES}"],
        )
    if t.eval_dataset and not datasets.is_drop(t.eval_dataset):
        raise SpecError(
            "train.eval_dataset",
            f"a fixed evaluation set is snapshotted data, got {t.eval_dataset!r}",
            DATASET_SHAPES[2:],
        )
    snapshotted = datasets.snapshotted(t.dataset)
    if t.eval_dataset and not snapshotted:
        raise SpecError(
            "train.eval_dataset",
            f"needs a snapshotted train.dataset (local files, gs://, bq://, the hub), got {t.dataset!r}",
        )
    is_bq = snapshotted and datasets.kind(t.dataset) == "bigquery"
    for key, value in (
        ("train.dataset_filter", t.dataset_filter),
        ("train.dataset_time_column", t.dataset_time_column),
    ):
        if value and not is_bq:
            raise SpecError(key, f"applies to a bq:// train.dataset only, got {t.dataset!r}", [""])
    if t.dataset_time_column and not datasets.COLUMN.fullmatch(t.dataset_time_column):
        raise SpecError("train.dataset_time_column", f"not a column name: {t.dataset_time_column!r}")
    datasets.row_filter(t.dataset_filter)
    _check_drops(spec)
    if t.data_since not in datasets.SINCE:
        raise SpecError("train.data_since", f"unknown value {t.data_since!r}", ['""', "champion"])
    if snapshotted and datasets.kind(t.dataset) == "hub" and not t.eval_dataset and t.eval_split == t.train_split:
        raise SpecError(
            "train.eval_split",
            f"is train.train_split ({t.train_split!r}): the evaluation would read the training examples",
            ["train[1024:1152]", "test", "train.eval_dataset=gs://BUCKET/eval/"],
        )
    if t.data_since:
        if not datasets.is_drop(t.dataset):
            raise SpecError(
                "train.data_since", f"needs a snapshotted drop (local files, gs://, bq://), got {t.dataset!r}", [""]
            )
        if is_bq and not t.dataset_time_column:
            raise SpecError(
                "train.data_since",
                "a bq:// dataset needs train.dataset_time_column to tell the new rows",
                ["train.dataset_time_column=COLUMN"],
            )
        if not spec.gate.register:
            raise SpecError("train.data_since", "compares with the champion: needs gate.register=true", [""])
        if spec.init_from_ref != (spec.model_name, CHAMPION):
            # From any other start, the run would learn only the new data yet record all the champion saw as seen:
            # once promoted, that history is never read again.
            raise SpecError(
                "train.data_since",
                "trains only on what the champion has not seen, so it continues from the champion: it needs "
                f"train.init_from=champion (got train.init_from={t.init_from!r}); a model's first run, with no "
                "champion yet, starts from the preset's base and takes everything",
                ["train.init_from=champion", 'train.data_since="" (train on everything)'],
            )


# A drop's marker: one object or file name beside the data, not a path (https://cloud.google.com/storage/docs/objects#naming)
_READY = re.compile(r"[A-Za-z0-9_.-]{1,255}")
# A dataset name: letters, digits and underscores, at most 1,024 (https://cloud.google.com/bigquery/docs/datasets#dataset-naming)
_DATASET_NAME = re.compile(r"[A-Za-z0-9_]{1,1024}")
# A service account's email: NAME@PROJECT.iam.gserviceaccount.com, or a Google-managed account's
# (PROJECT_NUMBER-compute@developer.gserviceaccount.com, ...: https://cloud.google.com/iam/docs/service-account-types)
_SERVICE_ACCOUNT = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}@[a-z0-9][a-z0-9.-]*\.gserviceaccount\.com")


def _check_drops(spec: RunSpec) -> None:
    """``train.dataset_ready`` (a marker's name, for gs:// and local drops), ``train.bigquery_project`` (a
    project id, for bq:// datasets) and ``train.bigquery_results_dataset`` ("" or a dataset name)."""
    t = spec.train
    kinds = {datasets.kind(v) for v in (t.dataset, t.eval_dataset) if v and datasets.snapshotted(v)}
    if t.dataset_ready:
        if not datasets.snapshotted(t.dataset) or datasets.kind(t.dataset) not in ("gcs", "local"):
            raise SpecError(
                "train.dataset_ready", f"applies to a gs:// or local train.dataset, got {t.dataset!r}", [""]
            )
        if not _READY.fullmatch(t.dataset_ready) or t.dataset_ready in (".", ".."):
            raise SpecError(
                "train.dataset_ready",
                f"{t.dataset_ready!r} is not a file name beside the data",
                ["_SUCCESS", "a name of letters, digits, '_', '-' and '.'"],
            )
    if t.bigquery_project:
        if "bigquery" not in kinds:
            raise SpecError("train.bigquery_project", "applies to a bq:// train.dataset or train.eval_dataset", [""])
        if not re.fullmatch(rf"(?:[a-z0-9][a-z0-9.-]*[a-z0-9]:)?{names.PROJECT_ID_PATTERN}", t.bigquery_project):
            raise SpecError(
                "train.bigquery_project", f"{t.bigquery_project!r} is not a Google Cloud project id", ["my-project"]
            )
    if t.bigquery_results_dataset and not _DATASET_NAME.fullmatch(t.bigquery_results_dataset):
        raise SpecError(
            "train.bigquery_results_dataset",
            f"{t.bigquery_results_dataset!r} is not a BigQuery dataset name",
            ['"" (tpupipe_results_LOCATION_HASH, the run identity\'s own)', "letters, digits and _, at most 1,024"],
        )
    if t.bigquery_service_account:
        if "bigquery" not in kinds:
            raise SpecError(
                "train.bigquery_service_account", "applies to a bq:// train.dataset or train.eval_dataset", [""]
            )
        if not _SERVICE_ACCOUNT.fullmatch(t.bigquery_service_account):
            raise SpecError(
                "train.bigquery_service_account",
                f"{t.bigquery_service_account!r} is not a service account's email",
                ["NAME@PROJECT.iam.gserviceaccount.com"],
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


def _check_eval(spec: RunSpec) -> None:
    """Generation on the evaluation set and its task metrics: counts, known metric names, a scorer reference."""
    e = spec.eval
    if e.generate_examples != 0 and e.generate_examples < MIN_GENERATE_EXAMPLES:
        raise SpecError(
            "eval.generate_examples",
            f"0 (no generation) or at least {MIN_GENERATE_EXAMPLES} examples, got {e.generate_examples}",
            ["0", "64"],
        )
    if e.max_new_tokens < 1:
        raise SpecError("eval.max_new_tokens", f"must be at least 1, got {e.max_new_tokens}", ["an integer >= 1"])
    listed = [m.strip() for m in e.metrics.split(",") if m.strip()]
    for metric in listed:
        if metric not in TASK_METRICS:
            raise SpecError("eval.metrics", f"unknown task metric {metric!r}", list(TASK_METRICS))
    if len(set(listed)) != len(listed):
        raise SpecError("eval.metrics", f"a metric named twice in {e.metrics!r}", list(TASK_METRICS))
    if e.scorer and not SCORER_REF.match(e.scorer):
        raise SpecError(
            "eval.scorer",
            f"{e.scorer!r} is not {SCORERS_PACKAGE}.MODULE:FUNCTION: a scorer is a function of a module under "
            f"{SCORERS_PACKAGE.replace('.', '/')}/, the trainer image's own code (a package of the image's "
            "requirements is called from such a module)",
            ["", f"{SCORERS_PACKAGE}.prefix:prefix_credit"],
        )


def _check_gate_figures(spec: RunSpec) -> None:
    """The figure the gate decides on and its guards: the held-out loss, or task metrics the evaluation computes."""
    g, e = spec.gate, spec.eval
    # Both trainers answer (trainers.generation, trainers.maxtext_generation): with generation on, the metrics are
    # computed.
    computed = e.metric_names if e.generate_examples else ()
    if g.metric != HELDOUT_LOSS:
        if g.metric not in (*TASK_METRICS, SCORER) or g.metric == "answer_length":
            raise SpecError(
                "gate.metric",
                f"{g.metric!r} is no figure the gate can decide on",
                [HELDOUT_LOSS, *(m for m in (*TASK_METRICS, SCORER) if m != "answer_length")],
            )
        if g.metric not in computed:
            raise SpecError(
                "gate.metric",
                f"{g.metric} is not computed: it must be in eval.metrics (scorer: eval.scorer set) with "
                "eval.generate_examples > 0",
                [HELDOUT_LOSS, *computed],
            )
    for text in (t for t in g.guards.split(",") if t.strip()):
        found = GUARD.match(text)
        if not found:
            raise SpecError(
                "gate.guards", f"{text.strip()!r} is not METRIC>=BOUND or METRIC<=BOUND", ["exact_match>=-0.02"]
            )
        if found.group(1) not in computed:
            raise SpecError(
                "gate.guards",
                f"{found.group(1)} is not computed: a guard's metric must be in eval.metrics (scorer: eval.scorer set) "
                "with eval.generate_examples > 0",
                list(computed),
            )
    if g.require_significance and g.metric == HELDOUT_LOSS:
        raise SpecError(
            "gate.require_significance",
            "has an interval only on a task metric: set gate.metric to one (the held-out loss is one figure)",
            ["false", *computed],
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
    _check_testing(spec)
    _check_training(spec)
    gke_checks.check_gke_fields(spec)
    _check_gate(spec)
    _check_eval(spec)
    _check_gate_figures(spec)
    _check_limits(spec)
