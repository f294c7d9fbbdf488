"""Runs on Vertex AI Pipelines, through the real ``google-cloud-aiplatform`` SDK: what ``tpupipe submit`` and
``tpupipe runs`` do; ``tpupipe schedule`` is ``pipelines.backends.vertex.schedules``, over the same jobs.

Every job is a PipelineJob of the compiled template (compiled now for the target, or a file or registry URL given)
with an explicit pipeline root (without one the SDK makes a bucket with a random name on every call). The spec is
resolved before any call, so bad input exits 2 having called nothing. A scheduled run gets its own run id from its
job name: a fixed ``run_id`` on a schedule is refused (two runs would share every resource name). The pipeline's
service account is warned of, not refused, when it is the Compute Engine default or holds a basic role
(``service_account``).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.cloud.credentials import VERTEX_ENDPOINT_ENV
from components.spec import RunSpec, SpecError, names
from pipelines import run_ids
from pipelines.backends.base import Submission as Submission  # the interface's, named here as before
from pipelines.backends.vertex import service_account

if TYPE_CHECKING:
    from google.cloud import aiplatform

TERMINAL = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED"}
STATES = {
    "succeeded": "PIPELINE_STATE_SUCCEEDED",
    "failed": "PIPELINE_STATE_FAILED",
    "cancelled": "PIPELINE_STATE_CANCELLED",
    "running": "PIPELINE_STATE_RUNNING",
    "pending": "PIPELINE_STATE_PENDING",
}
LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
PRESET_LABEL = "tpupipe-preset"  # on every job tpupipe submits or schedules: what `runs list` lists by
# A pipeline job id: "less than 128 characters, and valid characters are /[a-z][0-9]-/" (the field docs of
# CreatePipelineJobRequest.pipeline_job_id, google/cloud/aiplatform_v1/types/pipeline_service.py), starting with a
# letter (the SDK's _VALID_NAME_PATTERN, google/cloud/aiplatform/constants/pipeline.py).
VERTEX_JOB_ID = re.compile(r"^[a-z][a-z0-9-]{0,126}$")
# Ours: the SDK's default ("<pipeline name>-<timestamp>", to the second) with the preset and a random suffix, so two
# submits in the same second do not collide.
JOB_ID = re.compile(r"^tpupipe-(?P<preset>[a-z0-9-]+)-(?P<time>\d{14})-(?P<suffix>[0-9a-f]{6})$")


def check_place(project: str) -> None:
    if not project:
        raise SpecError("--project", "required (or $GOOGLE_CLOUD_PROJECT)", ["a Google Cloud project id"])
    names.check_project("--project", project)


def check(sub: Submission, scheduled: bool = False) -> RunSpec:
    """Every input, before any API call: the spec resolves, the root is gs://, labels are labels; a schedule takes
    no fixed run id. The spec."""
    from components.workload import resolve

    check_place(sub.project)
    if not sub.pipeline_root.startswith("gs://") or len(sub.pipeline_root) <= 5:
        raise SpecError("--pipeline-root", f"{sub.pipeline_root!r} is not a gs:// path", ["gs://BUCKET/PATH"])
    for key, value in sub.labels.items():
        if not LABEL.match(key) or not re.fullmatch(r"[a-z0-9_-]{0,63}", value):
            raise SpecError("--label", f"{key}={value!r}: keys and values are lowercase letters, digits, '_', '-'")
    spec = resolve(sub.preset, sub.resolved_overrides)
    if scheduled and sub.run_id:
        raise SpecError(
            "run_id",
            "a schedule starts many runs: each gets its own run id from its job name; a fixed "
            "run id would make every run share (and delete) the same resources",
            [""],
        )
    if spec.cluster.accelerator == "cpu":
        raise SpecError(
            "preset",
            f"{sub.preset} emulates cpu hosts on the local platform; Vertex AI runs the gke platform's TPU presets",
        )
    return spec


def init(project: str, region: str) -> None:
    from components.cloud.credentials import credentials, emulator_credentials
    from components.cloud.iam import RESOURCE_MANAGER_EMULATOR_HOST_ENV, project_number

    found = credentials()  # before the SDK's seconds of import: a caller without credentials is told at once
    from google.cloud import aiplatform

    endpoint = os.environ.get(VERTEX_ENDPOINT_ENV)
    extra = {"api_endpoint": endpoint, "api_transport": "rest"} if endpoint else {}
    # an emulated endpoint is plain HTTP: it gets the emulator's own credentials, never a Google one
    sent = emulator_credentials(found) if endpoint else found
    aiplatform.init(project=project, location=region, credentials=sent, **extra)
    if os.environ.get(RESOURCE_MANAGER_EMULATOR_HOST_ENV):
        # Before a job is created, the SDK checks that the pipeline root's bucket belongs to the project, through a
        # Resource Manager client of its own that takes no endpoint (gcs_utils._verify_bucket_ownership calls
        # resource_manager_utils.get_project_number): against emulators, it asks the emulated Resource Manager, as
        # every other call does, rather than retrying Google's for a minute.
        from google.cloud.aiplatform.utils import resource_manager_utils

        resource_manager_utils.get_project_number = lambda project_id, credentials=None: project_number(project_id)


def _template(sub: Submission) -> str:
    if sub.template:
        return sub.template
    from pipelines.pipeline import Target, compile_pipeline

    path = Path(tempfile.mkdtemp(prefix="tpupipe-")) / "tpupipe.yaml"
    return compile_pipeline(str(path), Target(project=sub.project, region=sub.region))


def new_job_id(preset: str) -> str:
    """A job id of its own for one submit: ``tpupipe-PRESET-YYYYMMDDHHMMSS-XXXXXX`` (UTC, 6 random hex digits)."""
    import secrets
    from datetime import UTC, datetime

    job_id = f"tpupipe-{preset}-{datetime.now(UTC):%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
    if not VERTEX_JOB_ID.match(job_id):
        raise SpecError("preset", f"{preset!r} makes the job id {job_id!r}, which Vertex AI refuses")
    return job_id


def published_template(sub: Submission, publish_first: bool = False, log: Callable[[str], None] = print) -> str:
    """The job's template, its images in Artifact Registry and pinned to their digests: with ``publish_first``,
    ``tpupipe publish`` of this tree first (as ``gke.build_service_account``); else a missing image is refused (exit
    2) with the command that publishes it."""
    from pipelines.pipeline import Target
    from pipelines.publish.vertex import pin_images, publish

    if publish_first and sub.template:
        raise SpecError("--publish", "publishes this source tree's image: not with --template", ["no --template"])
    if publish_first:  # built as the run's Cloud Build account, refused as the default one unless allowed
        from components.workload import resolve

        g = resolve(sub.preset, sub.resolved_overrides).gke
        target = Target(project=sub.project, region=sub.region)
        publish(
            target,
            "tpupipe-pipelines",
            "",
            log=log,
            build_account=g.build_service_account,
            allow_default=g.allow_default_identities,
        )
    template = _template(sub)
    template, missing = pin_images(template)
    if missing:
        raise SpecError(
            "image",
            f"{missing[0]} is not in Artifact Registry: every task would fail at image pull. Publish this source "
            f"tree first: tpupipe publish --project {sub.project} --region {sub.region} (or add --publish)",
        )
    return template


def pipeline_job(sub: Submission, job_id: str = "", template: str = "") -> aiplatform.PipelineJob:
    from google.cloud import aiplatform

    parameters = {"preset": sub.preset, "overrides": sub.overrides}
    if sub.run_id:
        parameters["run_id"] = sub.run_id
    if sub.dataset:
        parameters["dataset"] = sub.dataset
    return aiplatform.PipelineJob(
        display_name=f"tpupipe-{sub.preset}",
        template_path=template or _template(sub),
        job_id=job_id or None,
        pipeline_root=sub.pipeline_root,
        parameter_values=parameters,
        labels={PRESET_LABEL: sub.preset, **run_ids.job_labels(sub.run_id), **sub.labels},
    )


def console_url(name: str) -> str:
    _, project, _, location, _, job = name.split("/")
    return f"https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/runs/{job}?project={project}"


def submit(sub: Submission, job_id: str = "", publish_first: bool = False, log: Callable[[str], None] = print) -> str:
    """Submit one job (its image published, or refused); its resource name. The pipeline's service account is
    refused before any call when it is the project's default one (``service_account.refuse_default``)."""
    spec = check(sub)
    service_account.refuse_default(sub.service_account, spec.gke.allow_default_identities)
    template = published_template(sub, publish_first, log)
    init(sub.project, sub.region)
    run_ids.check_free(sub.run_id, sub.project, template)  # exit 2 for a run id another job or run holds
    service_account.warn(sub.project, sub.service_account)
    job = pipeline_job(sub, job_id or new_job_id(sub.preset), template)
    job.submit(service_account=sub.service_account or None, network=sub.network or None)
    return job.resource_name


def stages(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's component tasks (the stages) among its task details, which also hold its DAG-level tasks: the root
    (named after the job), the exit handler's group and the condition's (``PipelineTaskDetail.parent_task_id``'s
    field docs; the SDK's model_evaluation_job.py reads the root task by the job's name). A component task is one
    whose component in the job's spec runs a container (``executorLabel``), not a DAG."""
    spec = job.get("pipelineSpec", {})
    names: set[str] = set()

    def walk(component: dict[str, Any]) -> None:
        for key, task in component.get("dag", {}).get("tasks", {}).items():
            child = spec.get("components", {}).get(task["componentRef"]["name"], {})
            if "dag" in child:
                walk(child)
            else:
                names.add(task.get("taskInfo", {}).get("name", key))

    walk(spec.get("root", {}))
    return [t for t in job.get("jobDetail", {}).get("taskDetails", []) if t["taskName"] in names]


def log_stage_changes(job: dict[str, Any], seen: dict[str, str], log: Callable[[str], None]) -> None:
    """A line for each stage of ``job`` (:func:`stages`) whose state is not the one ``seen`` holds (task name ->
    state, brought up to date): how a followed run (this module's :func:`follow`, Kubeflow Pipelines'
    ``pipelines.backends.kfp.jobs.follow``) shows its progress."""
    for task in stages(job):
        if seen.get(task["taskName"]) != task["state"]:
            seen[task["taskName"]] = task["state"]
            log(f"  {task['taskName']:<20} {task['state'].lower()}")


def follow(
    name: str, log: Callable[[str], None] = print, poll_s: float = 5.0, timeout_s: float | None = None
) -> dict[str, Any]:
    """Print each task's state as it changes until the job ends; the final job as a dict. Past ``timeout_s``, an
    InfraError saying the job's state."""
    from google.cloud import aiplatform

    from components.spec import InfraError

    seen: dict[str, str] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        job = aiplatform.PipelineJob.get(name).to_dict()
        log_stage_changes(job, seen, log)
        if job.get("state") in TERMINAL:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            state = job.get("state", "").removeprefix("PIPELINE_STATE_").lower()
            raise InfraError(f"{name} is still {state} after {timeout_s:.0f}s")
        time.sleep(poll_s)


def failing_stage(job: dict[str, Any]) -> str:
    """The first stage that failed, with its error, or ''."""
    for task in stages(job):
        if task["state"] == "FAILED":
            lines = [ln.strip() for ln in task.get("error", {}).get("message", "").splitlines() if ln.strip()]
            errors = [ln for ln in lines if "Error:" in ln]  # the exception that ended the task, when shown
            return f"{task['taskName']}: {(errors or lines or ['failed'])[-1]}"
    return ""


# ---------------------------------------------------------------- runs


def list_filter(preset: str = "", state: str = "") -> str:
    """The ListPipelineJobs filter of tpupipe's jobs (its label), of one preset, in one state: "labels: Supports
    key-value equality and key presence", "state: Supports = and !=" (the field docs of
    ListPipelineJobsRequest.filter, google/cloud/aiplatform_v1/types/pipeline_service.py; syntax
    https://google.aip.dev/160)."""
    if state and state not in STATES:
        raise SpecError("--state", f"unknown state {state!r}", list(STATES))
    terms = [f'labels.{PRESET_LABEL}="{preset}"' if preset else f"labels.{PRESET_LABEL}:*"]
    terms += [f'state="{STATES[state]}"'] if state else []
    return " AND ".join(terms)


def runs(preset: str = "", state: str = "") -> list[dict[str, Any]]:
    """tpupipe's jobs, newest first, in the list's simple view (``enable_simple_view``: state, names, times, labels;
    no spec, no task details)."""
    import logging

    from google.cloud import aiplatform

    where = list_filter(preset, state)
    # The SDK's logger warns on every call that the view is simple: what is asked for here.
    logging.getLogger("google.cloud.aiplatform.pipeline_jobs").setLevel(logging.ERROR)
    jobs = aiplatform.PipelineJob.list(filter=where, order_by="create_time desc", enable_simple_view=True)
    return [j.to_dict() for j in jobs]


def job_name(job: str, project: str, region: str) -> str:
    return job if job.startswith("projects/") else f"projects/{project}/locations/{region}/pipelineJobs/{job}"


def show(name: str) -> dict[str, Any]:
    """A job's stages, figures (its Metrics artifacts) and console URL."""
    from google.cloud import aiplatform

    job = aiplatform.PipelineJob.get(name).to_dict()
    tasks = stages(job)
    metrics = {}
    for task in tasks:
        for output in task.get("outputs", {}).values():
            for artifact in output.get("artifacts", []):
                if artifact.get("schemaTitle") == "system.Metrics":
                    metrics.update(artifact.get("metadata", {}))
    return {
        "name": job["name"],
        "state": job.get("state"),
        "preset": job.get("labels", {}).get(PRESET_LABEL),
        "stages": [(t["taskName"], t["state"]) for t in tasks],
        "metrics": metrics,
        "cost": cost_so_far(job),
        "console": console_url(job["name"]),
    }


def cost_so_far(job: dict[str, Any]) -> dict[str, Any]:
    """The run's list-price cost from its start to now (or its end): the plan's hourly price of its spec. Unknown
    (``usd`` None) when a price is missing from the table, as in ``tpupipe plan``."""
    from datetime import UTC, datetime

    from components.platforms.gke.plan import document as plan
    from components.workload import budget, resolve

    values = job.get("runtimeConfig", {}).get("parameterValues", {})
    defaults = job.get("pipelineSpec", {}).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    value = {k: values.get(k, d.get("defaultValue", "")) for k, d in defaults.items()}
    try:
        spec = resolve(value.get("preset", ""), value.get("overrides", ""))
        hourly = plan.cost(spec, "cost")["usd_per_hour"]
    except (SpecError, ValueError):
        return {"usd_per_hour": None, "hours": None, "usd": None}

    def when(key: str) -> datetime | None:
        text = job.get(key)
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None

    start, end = when("startTime"), when("endTime") or datetime.now(UTC)
    since, now = (start or end).timestamp(), end.timestamp()
    hours = budget.hours(since, now)
    return {"usd_per_hour": hourly, "hours": hours, "usd": None if hourly is None else budget.spent(hourly, since, now)}
