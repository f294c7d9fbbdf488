"""The run spec's fields: one typed, strict, read-only description of a tpupipe run, section by section.

Layers, like MaxText's config: field defaults -> preset -> overrides (``key=value``). Every layer goes through
the same strict parser (``parsing``): unknown keys are rejected, values are coerced to the field's type, and the
cross-field checks (``checks``) run once on the result. Errors are :class:`SpecError` and name the field.

This module is pure standard library: it is imported by the components (pipeline image) and by the trainers
(trainer images) alike.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from components.spec import names

CAPACITY_TYPES = ("on-demand", "spot", "reservation", "flex-start", "queued")
WORKLOADS = ("fsdp", "maxtext")
# The FSDP trainer's precision on TPU: "mixed", float32 master weights and optimizer state with bfloat16 compute
# (FSDP2's MixedPrecisionPolicy: params cast to bfloat16 for the forward and backward, gradients reduced in float32);
# "bf16", the weights themselves in bfloat16, as the TorchTPU tutorial runs. On CPU both compute in float32.
PRECISIONS = ("mixed", "bf16")
# How the FSDP trainer writes a sharded checkpoint: "async", the state copied to host memory and written by DCP in the
# background while training goes on (dcp.async_save); "sync", written before training goes on (dcp.save), the
# fallback; "auto", async where that path has run (the weights on the CPU) and sync on an accelerator (DCP's
# asynchronous staging of TPU tensors has never run on a TPU).
CHECKPOINT_STAGINGS = ("auto", "async", "sync")
GENERATED_DATASET = "generated"
SCRATCH_PREFIX = "scratch:"
CHAMPION = "champion"  # the registry's alias of the version in use; train.init_from=champion starts from it
# The task metrics the evaluation computes on the answers it generates (eval.metrics; trainers/metrics.py): each an
# example's score in [0, 1] but answer_length (the answer's words), averaged over the examples.
TASK_METRICS = ("exact_match", "normalized_exact_match", "rouge_l", "json_valid", "answer_length")
SCORER = "scorer"  # the name eval.scorer's figure goes by (gate.metric, gate.guards)
# The package every team scorer lives in: the trainer image's own code (trainers/scorers/), so eval.scorer picks a
# function the image ships, never any importable callable (docs/registry.md, "Where a scorer lives").
SCORERS_PACKAGE = "trainers.scorers"
SCORER_REF = re.compile(r"^" + re.escape(SCORERS_PACKAGE) + r"(\.[A-Za-z_][A-Za-z0-9_]*)+:[A-Za-z_][A-Za-z0-9_]*$")
HELDOUT_LOSS = "eval_loss"  # gate.metric's default: the held-out loss, lower is better
# A guard of gate.guards: METRIC>=BOUND or METRIC<=BOUND on (candidate - champion) of the metric.
GUARD = re.compile(r"^\s*([a-z_]+)\s*(>=|<=)\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*$")
# What follows NAME@ in train.init_from: a version id or an alias (the registry's rule, components.registry.REF).
MODEL_REF = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")


@dataclass(frozen=True)
class ClusterSpec:
    """Where the run trains: the hosts of the Ray cluster."""

    accelerator: str = "cpu"  # "cpu" (emulated hosts) or a TPU family: v5e, v5p, v6e, tpu7x
    topology: str = ""  # TPU slice topology, e.g. "4x4"; empty for cpu
    num_slices: int = 1  # slices of the topology (more than one: multislice over the data-center network)
    num_hosts: int = 2  # hosts per slice (emulated raylets on the local platform)
    cpus_per_host: int = 1  # Ray CPUs each emulated host offers (local platform)
    # On TPU: on-demand, spot, reservation, flex-start or queued; or a ladder of them in order, comma-separated (e.g.
    # "reservation,on-demand,spot"): provision takes the first that preflight finds available, and the next when one
    # has no capacity (``capacities``; components/platforms/gke/plan/candidates.py).
    capacity: str = "on-demand"
    reservation: str = ""  # required when capacity=reservation: NAME or projects/P/reservations/NAME
    ready_timeout_s: float = 0.0  # how long deploy_raycluster waits for every host; 0: by the capacity type
    # Pod sizes on GKE (cpus_per_host is also each TPU worker pod's CPU request):
    head_cpus: int = 4
    head_memory_gib: int = 16  # the Ray head pod's memory (GiB); head_cpus: its CPUs
    worker_memory_gib: int = 200  # each TPU worker pod (one per host)
    worker_shm_gib: int = 100  # /dev/shm (in memory) of each TPU worker pod; 0: none
    expected_hours: float = 1.0  # expected duration of the run, for the cost estimate of `tpupipe plan`

    # The slice check before training: every device's collectives and tensor-parallel parity (check_slice stage).
    @property
    def capacities(self) -> tuple[str, ...]:
        """``capacity`` as its rungs, in order (one for a single capacity type)."""
        return tuple(rung.strip() for rung in self.capacity.split(",") if rung.strip())

    slice_check: bool = True  # off: the check_slice stage skips, and the summary says so
    slice_check_timeout_s: float = 600.0  # how long the check waits for every rank
    # The notice a preempted host gets, from the drain of its Ray node (reason PREEMPTION, which Ray Train's preemption
    # watcher announces to the training) to its kill. On GKE the worker pods' terminationGracePeriodSeconds (Ray
    # 2.60's `ray start` drains its node on the pod's SIGTERM); locally the keeper's (testing.drain_host_at_step).
    # 15: GKE's default grace of a Spot VM's pods, and the most a slice takes (a longer one needs a node pool setting
    # the run does not make); emulated hosts take up to 120.
    preemption_notice_s: float = 15.0


@dataclass(frozen=True)
class TrainSpec:
    """What the run trains, and how."""

    workload: str = "fsdp"  # the trainer: fsdp (PyTorch FSDP2 through TorchTrainer) or maxtext (MaxText, JaxTrainer)
    model_id: str = "scratch:gemma4-tiny"  # hub name, local directory, or scratch:<config> (random init)
    # The hub revision of a hub-named model_id: a branch, a tag or a commit (what it resolves to is recorded).
    model_revision: str = "main"
    # Start from a registered version's weights (over model_id's architecture): "" (model_id's own), "champion"
    # (the champion of gate.model, resolved when train starts) or NAME@VERSION (a version id or an alias).
    init_from: str = ""
    # "generated", a hub dataset name, local files (a file, DIR/, a glob), gs://BUCKET/PREFIX/ (or a glob, or one
    # object) or bq://PROJECT.DATASET.TABLE; "{date}" in it is the schedule's date, "{date-1}" the day before,
    # "{date:%Y%m%d}" in a format of date directives (components/spec/datasets.py, date_forms)
    dataset: str = GENERATED_DATASET
    # a fixed evaluation set, any snapshotted shape without a date form; "": the examples held out of the new data
    eval_dataset: str = ""
    # bq:// only: COLUMN=VALUE[,COLUMN=VALUE...], the values the rows' columns must have (quoted literals, not SQL)
    dataset_filter: str = ""
    # bq:// only: the rows' ingestion time, which train.data_since=champion compares where it cannot read by commit
    # time (components/data/bigquery.py)
    dataset_time_column: str = ""
    # gs:// or local train.dataset: the marker a drop's writer puts beside the data when it is complete ("_SUCCESS",
    # as Spark and Hadoop write it); the drop is read only once it is there. Empty: read what is there.
    dataset_ready: str = ""
    # bq:// only: the project BigQuery's read session and jobs are created in and bill (bigquery.readsessions.create,
    # bigquery.jobs.create there); empty: gke.project, else the table's own (components/data/bigquery.py)
    bigquery_project: str = ""
    # bq:// only, train.data_since=champion: the dataset, in the jobs' project (train.bigquery_project, else
    # gke.project, else the table's), that the query of the rows committed since the champion (APPENDS) writes its
    # result to, a table a read, deleted once read (else expiring 6 hours on): a team's, made in advance; "": the run
    # identity's own, tpupipe_results_<the table's location>_<8 hex digits of the SHA-256 of its e-mail>, created in
    # the table's location when absent (bigquery.datasets.create) with that identity its one owner; refused in
    # another location, without a default table expiration or open to the project's viewers or editors or to
    # everyone (components/data/bigquery.py)
    bigquery_results_dataset: str = ""
    # bq:// only: the service account the run's data snapshot reads BigQuery as (Vertex AI's pipeline service account,
    # the KFP runner's Google service account), an email; preflight checks as its caller, and with this also reads the
    # IAM policies for the account's roles, warning when none lets it open the read session, run the jobs or read the
    # table. Empty: not read.
    bigquery_service_account: str = ""
    data_since: str = ""  # "champion": only the objects (rows) the champion's data snapshot did not have
    train_split: str = "train"  # the dataset's split to train on
    eval_split: str = "heldout"  # the split held out for the evaluation (and the gate's figure)
    num_train_examples: int = 1024  # size of the generated dataset's train split (at most 20000 with the held-out one)
    num_eval_examples: int = 128  # size of the generated dataset's held-out split
    max_length: int = 64  # tokens per example, padded
    batch_size: int = 8  # per worker
    epochs: int = 3  # passes over the train split (the fsdp workload; maxtext counts maxtext.steps)
    learning_rate: float = 2e-5  # AdamW's learning rate (the fsdp workload; maxtext: maxtext.learning_rate)
    weight_decay: float = 0.01  # AdamW's weight decay (the fsdp workload)
    seed: int = 0  # the generated data's, the scratch model's initial weights' and the fsdp shuffling's seed
    precision: str = "mixed"  # the FSDP trainer on TPU: "mixed" (float32 master weights, bfloat16 compute) or "bf16"
    num_workers: int = 0  # 0: one per host (cpu) or one per TPU device
    min_workers: int = 0  # elastic range (min_workers, max_workers), whole slices; 0 and 0: not elastic
    max_workers: int = 0  # the elastic range's top (see min_workers); 0: not elastic
    num_to_keep: int = 1  # checkpoints kept, the latest (resume points; the final one holds the trained model)
    max_failures: int = 0  # worker-group restarts Ray Train may make
    checkpoint_optimizer: bool = True  # the optimizer state in each checkpoint (a resume keeps AdamW's moments)
    checkpoint_every_steps: int = 0  # (fsdp) a sharded checkpoint every N global steps too; 0: once an epoch only
    # (fsdp) how a sharded checkpoint is written: auto (async on the CPU, sync on an accelerator), async (in the
    # background while training goes on), or sync (before training goes on)
    checkpoint_staging: str = "auto"
    # (fsdp, TPU) TorchTPU's persistent (tier-3) cache of compiled executables, kept in the run's cache directory: off
    # until a TPU run shows it hits (none has; a failed cache directory may kill the worker); true turns it on
    torch_tpu_compile_cache: bool = False
    timeout_s: float = 3600.0  # the train job's deadline


@dataclass(frozen=True)
class EvalSpec:
    """Generation on the evaluation set (both workloads: ``trainers.generation``, ``trainers.maxtext_generation``;
    maxtext with ``maxtext.dataset_type=hf``, whose tokenizer reads the prompts): after training, the trained
    model and the model it is compared with answer the first evaluation prompts by greedy decoding, and the answers
    are scored against the references by task metrics (``runs/<id>/eval/answers.jsonl``, ``eval/side_by_side.md``)."""

    # Evaluation prompts answered by each model (the split's first ones); 0: no generation. Off unless a preset or
    # the run turns it on (local-fsdp does). The stages read and keep the answers through the run's store on gke as
    # on this machine, but no TPU preset turns it on: that the decode compiles once on a TPU (one padded prompt
    # shape, a static cache) is not yet shown, and a decode compiled again at each step would hold the slice.
    generate_examples: int = 0
    max_new_tokens: int = 32  # the most tokens of an answer (greedy decoding stops at the end-of-sequence token)
    # The task metrics, comma-separated: exact_match, normalized_exact_match (lowercase, no punctuation, articles or
    # extra spaces), rouge_l (F-measure, rouge-score), json_valid (the answer parses as JSON), answer_length (words)
    metrics: str = "exact_match,normalized_exact_match,rouge_l,answer_length"
    # A team's own scorer, trainers.scorers.MODULE:FUNCTION: a function of a module under trainers/scorers/, the
    # trainer image's own code (a package of the image's requirements is called from such a module):
    # (prompt, reference, answer) -> a float in [0, 1], its figure named "scorer"; empty: none
    scorer: str = ""

    @property
    def metric_names(self) -> tuple[str, ...]:
        """``metrics`` as its names, then ``scorer`` when a scorer is set: every figure the evaluation computes."""
        listed = tuple(m.strip() for m in self.metrics.split(",") if m.strip())
        return listed + ((SCORER,) if self.scorer else ())


@dataclass(frozen=True)
class GateSpec:
    """The model registry and the gate in front of its champion: every trained model is registered as a version of
    ``model`` with its provenance, and becomes the champion only when its held-out loss beats the champion's, both
    measured in the same evaluation job, by at least ``min_improvement``."""

    register: bool = True  # off: no registration, no champion measured, no promotion
    model: str = ""  # the registered model's name; empty: derived from the preset's name
    # The figure the gate decides on: eval_loss (the held-out loss, lower is better), or a task metric of
    # eval.metrics (or scorer), higher is better, measured on the same generated examples
    metric: str = HELDOUT_LOSS
    # eval_loss: relative, (champion - new) / champion must reach it; a task metric: new - champion must reach it
    # (absolute); 0: any improvement
    min_improvement: float = 0.0
    # Task metrics that must not regress beyond a bound, comma-separated METRIC>=BOUND or METRIC<=BOUND on (new -
    # champion), e.g. exact_match>=-0.02: a guard that fails keeps the champion; empty: none
    guards: str = ""
    # On: a task-metric improvement whose bootstrap confidence interval (95%) reaches 0 keeps the champion
    require_significance: bool = False

    @property
    def guard_list(self) -> tuple[tuple[str, str, float], ...]:
        """``guards`` as (metric, ">=" or "<=", bound) each, in order (the spec's checks refuse a malformed one)."""
        found = (GUARD.match(g) for g in self.guards.split(",") if g.strip())
        return tuple((m.group(1), m.group(2), float(m.group(3))) for m in found if m)

    # gke: a temporary hold on every object of a registered checkpoint's copy (models/<model>/<run id>/): it cannot
    # be deleted or replaced until the hold is released (https://cloud.google.com/storage/docs/object-holds)
    hold_registered: bool = False


@dataclass(frozen=True)
class RunLimitsSpec:
    """What the whole run may spend and how long it may take. Past either, the Ray job the run is waiting on is
    stopped, its stage fails with ``stopped: budget`` or ``stopped: deadline`` and the figures, and teardown runs
    (``components.workload.budget``). Empty (None): the platform's default, none on the local platform, one derived
    from the plan on gke (`tpupipe plan` shows the limits in effect and what set them)."""

    # USD at the plan's list prices: the run's hourly price from provision's end (its chips billing) on; preflight
    # refuses a plan whose expected cost (cluster.expected_hours) exceeds it.
    max_cost_usd: float | None = None
    deadline_h: float | None = None  # hours from the start of the run's first stage


GKE_CLUSTER_MODES = ("standard", "autopilot")
MULTISLICE_NETWORKS = ("dcn_networks", "accelerator_network_profile", "none")


@dataclass(frozen=True)
class GkeSpec:
    """The gke platform: where the run's cloud resources go. Every name not set here derives from the run id."""

    project: str = ""  # GCP project id; `tpupipe plan` shows PROJECT_ID while it is empty
    zone: str = ""  # TPU zone; empty: the first zone the catalogue documents for the accelerator
    # The zones the run may take, in order, comma-separated, all of one region (the image repository, the bucket and the
    # DCN subnets are the region's): a stockout in one moves the run to the next; empty: gke.zone alone.
    zones: str = ""
    cluster_name: str = ""  # an existing GKE cluster to use; empty: the run creates (and deletes) its own
    # A Kueue LocalQueue in gke.namespace of the existing cluster (gke.cluster_name): the run creates no node pools, its
    # RayCluster waits in that queue until the team's quota admits it. Empty: no Kueue, the run's own node pools.
    queue: str = ""
    priority_class: str = ""  # with gke.queue: a Kueue WorkloadPriorityClass for the run's workload; empty: none
    cluster_mode: str = "standard"  # standard or autopilot
    # GKE version of a cluster the run creates (the presets pin their tutorial's); empty: the release channel's default.
    # Provisioning checks the version GKE reports, of a created or an existing cluster, against the hardware's floors.
    cluster_version: str = ""
    cpu_machine_type: str = "n2-standard-8"  # the CPU node pool that carries the Ray head (standard mode)
    # The nodes' identity (every node pool; Autopilot's nodes): a service account email; empty: the project's default
    # Compute Engine service account, PROJECT_NUMBER-compute@developer.gserviceaccount.com. Provisioning checks, before
    # it creates anything, that the project's IAM policy grants it what nodes need (image pulls, logs, metrics).
    node_service_account: str = ""
    # Who Cloud Build runs the trainer image's build as: a service account email (the caller needs
    # iam.serviceAccounts.actAs on it); empty: the project's default Cloud Build account.
    build_service_account: str = ""
    # Let the run act as the project's default identities: the nodes as the Compute Engine default service account,
    # Cloud Build as the default build account (and, on Vertex AI, the pipeline as the Compute Engine default one).
    # false: each of them is refused (exit 2) before anything is created, naming its field and the dedicated account
    # to name instead; what `--allow-default-identities` sets.
    allow_default_identities: bool = False
    multislice_network: str = "dcn_networks"  # NICs between slices: dcn_networks, accelerator_network_profile, none
    # The Pod and Service IPv4 ranges (CIDR) of a cluster the run creates; empty: GKE picks them. Either must not
    # overlap the DCN networks' subnets (checked at plan time, and against the ranges GKE reports at provision).
    pod_range: str = ""
    service_range: str = ""  # the Service IPv4 range (CIDR); see pod_range
    bucket: str = ""  # checkpoint bucket (kept after the run); empty: <project>-tpupipe
    namespace: str = "tpupipe"  # Kubernetes namespace of the run's objects
    artifact_repository: str = "tpupipe"  # Artifact Registry Docker repository in the zone's region
    image: str = ""  # the trainer image; empty: <region>-docker.pkg.dev/<project>/<repository>/<image>:<run id>
    # A TorchTPU base image (torch, torch_tpu, libtpu) to build the torch trainer image FROM, its torch kept; empty:
    # python:3.12-slim with torch, torch-tpu and libtpu from PyPI (images/torch/requirements.txt).
    torch_tpu_base: str = ""
    # The Ray containers' root filesystem read-only: what Ray and the trainers write goes to HOME and /tmp (volumes of
    # the pod's own) and the bucket's mount; false: writable, for an image that writes elsewhere.
    read_only_root: bool = True
    # The TPU workers' Ray containers as uid/gid 1000, non-root, every capability dropped (the Pod Security Standards'
    # "restricted" profile), the TPU device files handed to that uid by the container runtime (containerd's
    # device_ownership_from_security_context, off by default and not documented for GKE's TPU nodes); false, the
    # default until a TPU node is shown to hand them over: as the image's user (root), as both tutorials run them.
    # The Ray head, which opens no TPU chip, runs so either way.
    run_as_non_root: bool = False
    hf_secret: str = "hf-secret"  # Secret (key hf_api_token) that holds the Hugging Face token; empty: none
    # Where deploy_raycluster reads the token when the namespace has no such Secret: a Secret Manager secret,
    # projects/P/secrets/NAME[/versions/V] (latest by default); empty: $HF_TOKEN of the process that deploys.
    hf_token_secret: str = ""

    @property
    def zone_choices(self) -> tuple[str, ...]:
        """The zones the run may take, in order: ``zones``, else ``zone`` alone; empty when neither is set."""
        listed = tuple(zone.strip() for zone in self.zones.split(",") if zone.strip())
        return listed or ((self.zone,) if self.zone else ())


@dataclass(frozen=True)
class MaxTextSpec:
    """The MaxText pretraining workload (train.workload=maxtext): MaxText's own overrides, one field each.
    Parallelism axes follow MaxText: ICI axes multiply to the devices of a slice, DCN axes to the slices;
    -1 fills in what is left (MaxText's defaults are ici_fsdp -1 and dcn_data -1)."""

    model_name: str = "llama3-8b"  # a MaxText model config, or a tpupipe scratch model (tiny-llama)
    dataset_type: str = "synthetic"  # synthetic (generated tokens) or hf (train.dataset's examples)
    per_device_batch_size: float = 4.0  # examples per device per step (MaxText's; a fraction is allowed)
    max_target_length: int = 4096  # tokens per example (MaxText's sequence length)
    steps: int = 100  # training steps
    ici_data_parallelism: int = 1  # data parallelism inside a slice
    ici_fsdp_parallelism: int = -1  # FSDP inside a slice; -1: the devices left
    ici_tensor_parallelism: int = 1  # tensor parallelism inside a slice
    dcn_data_parallelism: int = -1  # data parallelism across slices; -1: the slices left
    dcn_fsdp_parallelism: int = 1  # FSDP across slices
    remat_policy: str = ""  # empty: MaxText's default
    learning_rate: float = 0.0  # 0: MaxText's default
    # A preemption (a lost host, a Spot reclaim) repeats at most max_lost_steps steps: MaxText checkpoints every that
    # many steps (its own default, 10000, would save only step 0 of a 100-step run). checkpoint_period > 0 sets the
    # period itself, at most max_lost_steps.
    max_lost_steps: int = 20
    checkpoint_period: int = 0  # steps between checkpoints; 0: derived from max_lost_steps
    eval_steps: int = 4  # batches of MaxText's eval loop in the evaluate stage
    cpu_devices_per_host: int = 2  # JAX devices of each emulated CPU host (XLA's host device count)


@dataclass(frozen=True)
class TestingSpec:
    """Test aids: faults and delays a test or a bench injects into a run to exercise a failure or recovery path
    (docs/testing.md). A real run leaves them at their defaults, which inject nothing; the emulated hosts' aids are
    refused on a TPU slice. Each has one check (``components.spec.checks.TESTING_CHECKS``)."""

    __test__ = False  # a spec section, not a test class, to pytest (which collects classes named Test*)

    # The slice check's rank whose device computes with corrupted weights (5% off), so the check fails naming that
    # rank alone, its host and its device (-1: none).
    slice_check_corrupt_rank: int = -1
    # The slice check's rank whose timed transfers are held below the bandwidth floor, so the check fails naming its
    # host by its link (-1: none).
    slice_check_slow_rank: int = -1
    # Emulated (cpu) hosts only: each host joins this many seconds after it starts, as a node still pulling its image
    # does (0: at once).
    host_start_delay_s: float = 0.0
    # Emulated (cpu) hosts only: the keeper starts a lost host's replacement this many seconds after it saw the host
    # gone, as a preempted Spot VM's replacement comes minutes later or never (0: at once).
    host_replace_delay_s: float = 0.0
    # Emulated (cpu) hosts only: once the training's workers have logged this global step, the keeper drains the last
    # host's Ray node (reason PREEMPTION, cluster.preemption_notice_s to its deadline) and kills the host just after
    # the deadline, as GKE preempts a Spot VM (0: never).
    drain_host_at_step: int = 0
    # The (fsdp) trainer raises inside training at this global step, on a fresh start, not after a resume: with
    # train.max_failures >= 1 Ray Train restarts the workers, which resume from the last checkpoint (0: never).
    fail_at_step: int = 0
    # The (fsdp) evaluation job's workers raise before they measure anything, so the run fails at evaluate (the train
    # job then leaves every figure to that job).
    fail_eval: bool = False


@dataclass(frozen=True)
class RunSpec:
    name: str = "custom"
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    gke: GkeSpec = field(default_factory=GkeSpec)
    maxtext: MaxTextSpec = field(default_factory=MaxTextSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    gate: GateSpec = field(default_factory=GateSpec)
    run: RunLimitsSpec = field(default_factory=RunLimitsSpec)
    testing: TestingSpec = field(default_factory=TestingSpec)

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
        from components.spec import from_dict  # the parser (``parsing``) builds on these fields

        return from_dict(json.loads(text))


SECTIONS: dict[str, type] = {
    "cluster": ClusterSpec,
    "train": TrainSpec,
    "gke": GkeSpec,
    "maxtext": MaxTextSpec,
    "eval": EvalSpec,
    "gate": GateSpec,
    "run": RunLimitsSpec,
    "testing": TestingSpec,
}
