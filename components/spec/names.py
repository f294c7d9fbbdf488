"""Every name of every resource a run creates, derived from the run id alone (see docs/architecture.md, "Names").

A retried task, the teardown exit task and an out-of-band janitor all find a run's resources from its run id:
nothing here depends on another task's output or on the clock. Every created resource that takes labels also
carries ``RUN_LABEL: <run id>``; the few that take none (VPC networks and subnets) carry it in their
description and are found by name.

Limits: GKE cluster and node pool names are at most 40 characters; Compute Engine resources (networks,
subnets, resource policies) and Kubernetes labels at most 63; a RayCluster name at most 53 (KubeRay appends
suffixes; MaxRayClusterNameLength in ray-operator/controllers/ray/utils/constant.go). A run id is a DNS-1035 label
of at most 40 characters (:func:`run_id_from`); a name that would be too long is cut and given a hash of the whole.
"""

from __future__ import annotations

import hashlib
import re

from components.spec.errors import SpecError

RUN_LABEL = "tpupipe-run"
SLICE_LABEL = "tpupipe-slice"

GKE_NAME_MAX = 40
COMPUTE_NAME_MAX = 63
LABEL_VALUE_MAX = 63
RAYCLUSTER_NAME_MAX = 53
PLACEHOLDER_PROJECT = "PROJECT_ID"  # what a plan's names show while gke.project is empty: no valid id, on purpose
# Where the command line points when told nothing (its --project and --region: pipelines/cli/common.py, add_place).
# The region of Vertex AI, its Model Registry and the components image's registry; it has v6e and v5p zones (the
# catalogue's, components.tpu).
DEFAULT_REGION = "us-east5"
# The project of the examples, and --project's default without $GOOGLE_CLOUD_PROJECT: a valid id, so that an offline
# compile gives a pipeline Vertex AI would parse; every command that calls Google Cloud refuses it before any call.
EXAMPLE_PROJECT = "my-project"
RUN_ID_MAX = 40
# A KFP scheduler macro ([[RunUUID]], [[ScheduledTime]], ...) or a pipeline placeholder ({{$.pipeline_job_uuid}}) as
# text: what a task gets where its runner substituted nothing.
UNRESOLVED = re.compile(r"\[\[[A-Za-z]+\]\]|\{\{\$\.[a-z_]+\}\}")
# A Google Cloud project id: 6 to 30 lowercase letters, digits and hyphens, starting with a letter and not ending
# with a hyphen (https://cloud.google.com/resource-manager/docs/creating-managing-projects). PROJECT_ID_PATTERN is
# the same rule inside longer names (projects/PROJECT/..., NAME@PROJECT.iam.gserviceaccount.com).
PROJECT_ID_PATTERN = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
PROJECT_ID = re.compile(PROJECT_ID_PATTERN)
PROJECT_ID_RULE = "6 to 30 lowercase letters, digits and hyphens, starting with a letter, not ending with a hyphen"
# A registered model's name: a Vertex AI model id (lowercase), the same rule in the local registry.
MODEL_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
MODEL_NAME_MAX = 63


def fit(name: str, limit: int) -> str:
    """``name`` if it fits in ``limit`` characters, else its head and a 6-character hash of the whole."""
    if len(name) <= limit:
        return name
    return name[: limit - 7].rstrip("-") + "-" + _digest(name)


def _digest(text: str) -> str:
    """The 6-character hash that keeps a shortened name unique."""
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def run_id_from(explicit: str, job_name: str) -> str:
    """The run id: the explicit one if given, else derived from the pipeline job's name as the task's runner resolved
    it. A DNS-1035 label (lowercase letters, digits, '-'; starts with a letter; at most 40 characters) so every
    resource name derived from it is valid everywhere; the same job name always gives the same run id, so every task
    of a run, its exit handler's teardown included, finds the same resources.

    What a runner resolves ``dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER`` to: on Vertex AI the job's resource name,
    whose id the caller takes (``vertex_task.job_id``); on Kubeflow Pipelines the run's Argo Workflow's name (the v2
    driver gives ``{{$.pipeline_job_resource_name}}`` its ``--run_name``, which the compiler sets to
    ``{{workflow.name}}``: backend/src/v2/driver/resolve.go and backend/src/v2/compiler/argocompiler/argo.go,
    ``runResourceName``, in kubeflow/pipelines at 2.15.0 to 2.17.0), for a recurring run's run
    ``<ScheduledWorkflow name>-<index>-<FNV-32 hash>`` (``NextResourceName`` in
    backend/src/crd/controller/scheduledworkflow/util/scheduled_workflow.go); under kfp.local the job's name.
    A placeholder or a scheduler macro that reached the task unresolved is refused by name, never made into an id."""
    for given, field in ((explicit, "run_id"), (job_name, "job_name")):
        if UNRESOLVED.search(given or ""):
            raise SpecError(
                field,
                f"{given!r} reached the task unresolved: "
                + (
                    "Kubeflow Pipelines does not substitute [[...]] macros into a v2 pipeline's parameters "
                    "(kubeflow/pipelines#12494)"
                    if "[[" in given
                    else "the runner did not fill this placeholder"
                ),
                ["leave run_id empty: each run derives its own from its pipeline job"],
            )
    raw = explicit or job_name
    rid = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    if not rid:
        raise SpecError("run_id", "empty: give a run id or run inside a pipeline job")
    if not rid[0].isalpha():
        rid = "r-" + rid
    if len(rid) > RUN_ID_MAX:
        rid = rid[: RUN_ID_MAX - 7].rstrip("-") + "-" + _digest(raw)  # the hash of the whole job name
    if explicit and rid != explicit:
        raise SpecError(
            "run_id", f"{explicit!r} is not a DNS-1035 label of at most {RUN_ID_MAX} characters; for example {rid!r}"
        )
    return rid


def check_project(key: str, project: str) -> None:
    """A SpecError naming ``key`` unless ``project`` is a Google Cloud project id (``PROJECT_ID``)."""
    if not PROJECT_ID.fullmatch(project or ""):
        raise SpecError(key, f"{project!r} is not a Google Cloud project id", [PROJECT_ID_RULE])


def model_name(preset: str) -> str:
    """The registered model of a preset when ``gate.model`` is empty: the preset's name as a model name
    (lowercase letters, digits, '_' and '-', starting with a letter, at most 63 characters)."""
    name = re.sub(r"[^a-z0-9_-]+", "-", preset.lower()).strip("-_") or "model"
    if not name[0].isalpha():
        name = "m-" + name
    return fit(name, MODEL_NAME_MAX)


def labels(run_id: str, **extra: str) -> dict[str, str]:
    """The labels of every resource of the run."""
    return {RUN_LABEL: run_id, **extra}


def gke_cluster(run_id: str) -> str:
    """A GKE cluster the run creates itself (gke.cluster_name empty)."""
    return fit(f"tpupipe-{run_id}", GKE_NAME_MAX)


def tpu_node_pool(run_id: str, slice_index: int) -> str:
    """The node pool of slice ``slice_index``: one multi-host slice per node pool."""
    suffix = f"-s{slice_index}"
    return fit(run_id, GKE_NAME_MAX - len(suffix)) + suffix


def cpu_node_pool(run_id: str) -> str:
    """The CPU node pool that carries the Ray head."""
    return fit(run_id, GKE_NAME_MAX - 4) + "-cpu"


def workload_policy(run_id: str) -> str:
    """The Compute Engine workload policy (TPU7x multi-host slices)."""
    return fit(f"{run_id}-placement", COMPUTE_NAME_MAX)


def dcn_network(run_id: str, index: int) -> str:
    """The ``index``-th extra VPC network for the DCN traffic between slices (dcn_networks)."""
    return fit(run_id, COMPUTE_NAME_MAX - 5) + f"-dcn{index}"


def dcn_subnet(run_id: str, index: int) -> str:
    return dcn_network(run_id, index) + "-subnet"


def dcn_firewall(run_id: str, index: int) -> str:
    """The firewall rule that lets the slices' traffic into the ``index``-th DCN network (new networks deny it)."""
    return dcn_network(run_id, index) + "-allow-internal"


def node_subnet(run_id: str) -> str:
    """The subnetwork of the default network that the nodes of a cluster the run creates get their addresses from
    (Private Google Access on; the run's Cloud NAT, when it has one, serves it alone)."""
    return fit(run_id, COMPUTE_NAME_MAX - 6) + "-nodes"


def nat_router(run_id: str) -> str:
    """The Cloud Router, and its Cloud NAT gateway, that give the run's private nodes a way out to the internet (the
    Hugging Face hub, a registry outside Google), when the run needs one."""
    return fit(run_id, COMPUTE_NAME_MAX - 4) + "-nat"


def raycluster(run_id: str) -> str:
    return fit(run_id, RAYCLUSTER_NAME_MAX)


def job_submission_id(run_id: str, kind: str) -> str:
    """The Ray job submission id of the run's ``kind`` job (train, evaluate): the stages submit under it and a
    retried stage re-attaches to it."""
    return f"{run_id}-{kind}"


def ray_token_secret(run_id: str) -> str:
    """The Secret holding the run's Ray cluster token (Ray's token authentication stays on)."""
    return fit(f"{run_id}-ray-token", COMPUTE_NAME_MAX)


def hf_token_secret(run_id: str) -> str:
    """The run's own Secret holding the Hugging Face token, copied from the namespace's ``gke.hf_secret`` or made
    from Secret Manager or $HF_TOKEN: the run's teardown deletes it, never the Secret another run reads."""
    return fit(f"{run_id}-hf-token", COMPUTE_NAME_MAX)


def network_policy(run_id: str, what: str) -> str:
    """The run's NetworkPolicy ``what`` (``isolate``: its pods admit only one another; ``job-api``: the head's port)."""
    return fit(f"{run_id}-{what}", COMPUTE_NAME_MAX)


def service_account(run_id: str) -> str:
    """The Kubernetes ServiceAccount of the run's pods (Workload Identity)."""
    return fit(f"tpupipe-{run_id}", COMPUTE_NAME_MAX)


def dcn_claim_template(run_id: str) -> str:
    """The ResourceClaimTemplate that gives each worker pod the extra NICs."""
    return fit(f"{run_id}-dcn-nics", COMPUTE_NAME_MAX)


def worker_group(pod_type: str) -> str:
    """The RayCluster worker group: one for the whole run, named after the slice (``tpu-v6e-16``)."""
    return f"tpu-{pod_type}"


def bucket(project: str) -> str:
    """The checkpoint bucket when gke.bucket is empty: shared by runs of the project, kept after them."""
    return f"{project or PLACEHOLDER_PROJECT}-tpupipe"


RUNS_PREFIX = "runs"  # the runs' pods' prefixes in the bucket: runs/<run id>/


def run_prefix(run_id: str) -> str:
    """Where the run's pods write (checkpoints, outputs, the inputs copied in for them), inside the bucket and under
    its mount path: the one prefix the run's pods may read and write."""
    return f"{RUNS_PREFIX}/{run_id}"


# Where registration keeps the registered checkpoints, in the bucket: beside the pods' prefixes, never under one, so no
# run's pods can write them (their bucket binding names runs/<run id>/ alone), and a run id, used once, names each copy.
MODELS_PREFIX = "models"


def model_prefix(model: str, run_id: str) -> str:
    """Where the checkpoint run ``run_id`` registered as a version of ``model`` is kept, out of every run's reach."""
    return f"{MODELS_PREFIX}/{model}/{run_id}"


# Where a gke run's state goes on Vertex AI (its ledger, stage records, logs, summary), inside the bucket: beside the
# pods' prefixes, never under one, so no run's pods can write it.
STATE_PREFIX = "state"


def state_root(bucket_name: str) -> str:
    """The output root of gke runs on Vertex AI: ``gs://BUCKET/state``, each run's state under ``state/<run id>/``."""
    return f"gs://{bucket_name}/{STATE_PREFIX}"


def image_tag(run_id: str) -> str:
    """The tag the build stage pushes the run's trainer image under."""
    return run_id


# The tag a trainer image also carries that names its build context (its hash): a later run of the same sources
# finds the image under it and builds nothing (components/cloud/build.py, content_image).
CONTENT_TAG_PREFIX = "ctx-"


def build_tag(run_id: str) -> str:
    """The Cloud Build tag that finds the run's image build again (a re-run build stage re-attaches to it)."""
    return f"tpupipe-run-{run_id}"


def build_source(run_id: str) -> str:
    """The object, in the bucket, that holds the image build's context: outside the pods' prefix, so no pod can change
    what the next build of this run builds."""
    return f"builds/{run_id}/context.tar.gz"


MAINTENANCE_EXCLUSION = "tpupipe-run"  # the maintenance exclusion a cluster the run creates carries while it trains
