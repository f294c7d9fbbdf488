"""An emulated Vertex AI Pipelines: the ``google.cloud.aiplatform.v1.PipelineService`` REST surface the real
``google-cloud-aiplatform`` SDK uses with ``api_transport="rest"`` (CreatePipelineJob, GetPipelineJob, ListPipelineJobs,
CancelPipelineJob), bodies parsed into the SDK's own ``aiplatform_v1.PipelineJob`` message, and an executor of the
accepted PipelineSpec; and the ``ScheduleService`` (CreateSchedule, GetSchedule, ListSchedules, PauseSchedule,
ResumeSchedule, DeleteSchedule) whose cron schedules fire on a test clock (``advance``), honouring the time zone,
start and end, ``maxRunCount`` and ``maxConcurrentActiveRunCount`` (a run due while that many are active is skipped).

The same endpoint serves Vertex AI Model Registry's ``ModelService`` (``tests.emulators.models``), as Google's one
``REGION-aiplatform.googleapis.com`` serves both, so a task's registry calls (``$TPUPIPE_VERTEX_ENDPOINT``) reach
it.

What it validates, as Vertex does: the parent ``projects/P/locations/L``, the job id pattern, the parameters against
the spec's root inputs (names and types) and a ``gs://`` pipeline root. A task's image is not looked at when the job
is created: a task whose image is not in the emulated Artifact Registry fails when it starts, at image pull (the
wording of its error is this emulator's: Vertex documents no message for it).

How it runs a job, as Vertex does: every task in its own process group and its own empty working directory, its
container's command run with the image's stand-in first on PATH (``python_bin``: the tests give the components
image's environment, built from images/pipeline alone by ``components.platforms.local.envs``, so a package the image
lacks is missing in the task too), the run's labels in ``VERTEX_AI_PIPELINES_RUN_LABELS`` (as Vertex gives every
task, with its reserved billing-id label) and the emulated cloud services' endpoints in its environment (the
stand-ins of Google's), and nothing else a test gives it beyond ``env`` — no project, no mount (a Vertex task's
container gets the image's command and environment, the variables the job's spec names, and the run's labels:
https://cloud.google.com/vertex-ai/docs/pipelines/gcpc-label-propagation; its clients find the project from their
credentials, and the paths it writes into its Ray jobs are the pods' own, under their Cloud Storage FUSE mount, which
the emulated kubelet maps for its processes: tests/emulators/kube/kubelet.py). Output artifacts are written through the
``/gcs/`` mount path the KFP executor uses for ``gs://`` URIs (the one mount a task has: "your data is stored on
Cloud Storage, and mounted into your components using Cloud Storage FUSE",
https://cloud.google.com/vertex-ai/docs/pipelines/migrate-kfp); after the task the emulator moves them into the
storage emulator (as Vertex's Cloud Storage FUSE would have) and clears the local copy, so no later task reads
another's disk. The DAG runs in dependency order, tasks that do not depend on each other side by side (Vertex
schedules every task it can: "the pipeline will continue to run until no more tasks can be executed ... Any scheduled
tasks will continue to completion", the ``PipelineFailurePolicy`` enum's comment in google-cloud-aiplatform's
``aiplatform_v1/types/pipeline_failure_policy.py``; its default, FAIL_SLOW, is the one emulated: a failed task stops
only what depends on it); a task waits for its upstream tasks to succeed, except with
``ALL_UPSTREAM_TASKS_COMPLETED`` (the exit handler), which runs whatever happened. A task with a
``triggerPolicy.condition`` (what ``dsl.If`` compiles to: a CEL expression over the task's input parameters, such as
``inputs.parameter_values['pipelinechannel--register-decision'] == 'promote'``) runs only when it holds; when it
does not, the task is NOT_TRIGGERED and nothing inside it runs, which is no failure. Besides the component tasks, the
job's task details hold its DAG-level tasks, as Vertex's do: the root (named after the job), the exit handler's group
and each condition's group (their ``taskInfo`` names, e.g. ``run`` and ``gate-promotes``), every task with the
``parentTaskId`` of its group; a group ends succeeded, failed or cancelled with its tasks. Cancel sets the job
CANCELLING ("Vertex AI Pipelines sets the pipeline run state to CANCELLING. ... cancels all the remaining tasks in the
pipeline", https://cloud.google.com/vertex-ai/docs/pipelines/cancel-pipeline-runs), then stops each running task as
Kubernetes ends a pod, for a Vertex task is a pod: SIGTERM to its first process, SIGKILL ``grace_s`` later if it still
runs (the pod's termination grace period, 30 s unless set: "the kubelet triggers forcible shutdown" once it expires,
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination); the exit handler's task is
CANCELLED, not run; the job ends CANCELLED. What grace a cancelled task gets is not documented by Vertex AI (the
cancel page above says only that the remaining tasks are cancelled): the emulator assumes a pod's, and ``grace_s``
sets it, so a test can give the task less time than it needs. Each container task is a job of its own, a CustomJob
(``PipelineTaskExecutorDetail.CustomJobDetail``: "the name of the CustomJob", google/cloud/aiplatform_v1/types/
pipeline_job.py), which starts a while after it is created (its machine provisioned, its image pulled; how long
is not documented): with ``start_delay_s`` a task waits that long PENDING ("Specifies pending state for the task",
``PipelineTaskDetail.State``, the same file) before its process starts, and a cancel in that gap reaches no running
process: the task ends CANCELLED unstarted. A task's ``{{$.pipeline_job_resource_name}}`` is the job's full resource
name (``projects/P/locations/L/pipelineJobs/ID``: ``PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER``, kfp/dsl/__init__.py),
its ``{{$.pipeline_job_name}}`` the job's id. A task whose spec has a ``retryPolicy`` (what KFP's ``set_retry``
compiles to: "the number of attempts to rerun the task on failure and the delay between subsequent retries",
https://cloud.google.com/vertex-ai/docs/pipelines/configure-retries) is run again after a failed attempt, up to
``maxRetryCount`` times, the n-th retry after ``backoffDuration`` x ``backoffFactor`` ** (n - 1) (kfp's
``PipelineTask.set_retry`` docstring), at most ``backoffMaxDuration`` (the emulator's reading of "maximum duration"),
each wait scaled by ``backoff_scale`` (the tests' clock); each failed attempt that is retried is kept in the task's
``pipelineTaskStatus`` ("a record of task status evolving over time", its field docs in
google/cloud/aiplatform_v1/types/pipeline_job.py) as RUNNING with its error, as those docs say of an error being
retried. No task detail is SKIPPED: that state is a cache hit's, and no task is cached here. Two injectable faults:
``kill_first_attempt``: the task's first attempt is SIGKILLed, its process group with it, once a condition holds (a
task's machine lost mid-way); ``terminate_first_attempt``: SIGTERM, then SIGKILL ``grace_s`` later, as Kubernetes
ends a pod it evicts or whose node is drained for maintenance (the pod termination above; "Voluntary and involuntary
disruptions", https://kubernetes.io/docs/concepts/workloads/pods/disruptions/) while the job itself goes on running.
States: PENDING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED; task details carry the
output artifacts (uri, schema title, metadata) and the input artifacts, each the very artifact an upstream task wrote
(``taskOutputArtifact``), handed to the task's executor as KFP's executor input names them.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from google.cloud import aiplatform_v1

from tests.emulators.http import HttpEmulator, HttpError
from tests.emulators.pipeline_runner import (  # noqa: F401 - condition_holds and ConditionError are this module's too
    ConditionError,
    Job,
    PipelineRunner,
    _cron_matches,
    _now,
    condition_holds,
    resolve_parameters,
)
from tests.emulators.tokens import authorized

PARENT = re.compile(r"^projects/(?P<project>[a-z][a-z0-9-]{4,28}[a-z0-9])/locations/(?P<location>[a-z0-9-]+)$")
# "less than 128 characters, and valid characters are /[a-z][0-9]-/" (the field docs of
# CreatePipelineJobRequest.pipeline_job_id, google/cloud/aiplatform_v1/types/pipeline_service.py), starting with a
# letter (the SDK's own check, _VALID_NAME_PATTERN in google/cloud/aiplatform/constants/pipeline.py).
JOB_ID = re.compile(r"^[a-z][a-z0-9-]{0,126}$")
# The list filter's terms this emulator reads (ListPipelineJobsRequest.filter's field docs: "labels: Supports
# key-value equality and key presence", "state: Supports = and !="; the syntax of https://google.aip.dev/160, whose
# `m.key:*` is key presence), joined by AND. Any other filter is refused: a filter it cannot judge fails visibly.
FILTER_TERM = re.compile(
    r"""^(?P<field>labels\.[a-z0-9_-]+|state|display_name)\s*(?P<op>!=|=|:)\s*(?P<value>\*|"[^"]*"|[A-Za-z0-9_-]+)$"""
)
MODEL_SERVICE = re.compile(r"/models(?:$|[/:@])")  # the ModelService's paths: models, their versions and operations
BILLING_LABEL = "vertex-ai-pipelines-run-billing-id"
# What Vertex AI Pipelines gives every task: the run's labels as JSON ("Resources generated from user-defined
# components", https://cloud.google.com/vertex-ai/docs/pipelines/gcpc-label-propagation).
RUN_LABELS_ENV = "VERTEX_AI_PIPELINES_RUN_LABELS"
TERMINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")


@dataclass
class Schedule:
    resource: dict
    checked: datetime  # the test clock up to which its cron was evaluated
    jobs: list[str] = field(default_factory=list)  # the jobs it started
    skipped: int = 0  # runs due while maxConcurrentActiveRunCount were active


class VertexEmulator(HttpEmulator, PipelineRunner):
    STATES = {
        "running": "PIPELINE_STATE_RUNNING",
        "succeeded": "PIPELINE_STATE_SUCCEEDED",
        "failed": "PIPELINE_STATE_FAILED",
        "cancelled": "PIPELINE_STATE_CANCELLED",
    }

    def __init__(
        self,
        storage,
        registry,
        env: dict[str, str],
        python_bin: Path,
        workdir: Path,
        token: str = "",
        models=None,
    ):
        """``python_bin``: the bin directory of the environment the tasks run in (the image's stand-in)."""
        super().__init__()
        self._runner_init(storage, registry, env, python_bin, workdir)  # Vertex AI documents no other grace period
        self.models = models  # the ModelService emulator (tests.emulators.models) served on this endpoint
        self.token = token
        self.schedules: dict[str, Schedule] = {}
        self.clock = datetime.now(UTC).replace(second=0, microsecond=0)  # the schedules' clock, moved by advance()
        self.calls: list[str] = []
        self.list_queries: list[dict] = []  # each ListPipelineJobs call's query parameters

    # ------------------------------------------------------------------ the executor's hooks
    def _placeholders(self, job: Job) -> dict[str, str]:
        return {
            "{{$.pipeline_job_name}}": self._job_id(job),
            "{{$.pipeline_job_resource_name}}": job.resource["name"],
            "{{$.pipeline_job_schedule_time_utc}}": job.scheduled,
            # "the time that a pipeline job was created" (PIPELINE_JOB_CREATE_TIME_UTC_PLACEHOLDER's docs,
            # kfp/dsl/__init__.py): the PipelineJob's create_time ("Output only. Pipeline creation time.",
            # google/cloud/aiplatform/v1/pipeline_job.proto)
            "{{$.pipeline_job_create_time_utc}}": job.resource["createTime"],
        }

    def _task_env(self, job: Job) -> dict[str, str]:
        return {RUN_LABELS_ENV: json.dumps(job.resource.get("labels", {}), sort_keys=True)}

    def _tasks_changed(self, job: Job) -> None:
        job.resource["jobDetail"] = {"taskDetails": job.tasks}

    # ------------------------------------------------------------------ inspection
    def job(self, name_or_id: str) -> Job:
        with self._lock:
            return next(j for n, j in self.jobs.items() if n == name_or_id or n.endswith("/" + name_or_id))

    def wait(self, name_or_id: str, timeout_s: float = 600) -> dict:
        """The job's resource once it has ended."""
        from tests.helpers import wait_until

        def ended() -> dict | None:
            resource = self.job(name_or_id).resource
            return resource if resource["state"] in TERMINAL else None

        return wait_until(
            ended, timeout_s, f"job {name_or_id} to end", detail=lambda: self.job(name_or_id).resource["state"]
        )

    def add_job(self, parent: str, job_id: str, state: str, labels: dict | None = None) -> str:
        """A job known to the service in ``state`` (``PIPELINE_STATE_...``) with nothing to run, as one started by
        another client (the UI, a schedule) and stopped there."""
        name = f"{parent}/pipelineJobs/{job_id}"
        resource = {"name": name, "state": state, "labels": labels or {}, "createTime": _now(), "updateTime": _now()}
        if state in TERMINAL:
            resource["endTime"] = _now()
        with self._lock:
            self.jobs[name] = Job(resource, {}, {}, "")
        return name

    # ------------------------------------------------------------------ serving
    def _serve(self, http: BaseHTTPRequestHandler, raw: bytes) -> tuple:
        if self.token and not authorized(self.token, http.headers.get("Authorization")):
            raise HttpError(401, "Request is missing required authentication credential.")
        url = urlparse(http.path)
        path, query = url.path.removeprefix("/v1/"), parse_qs(url.query)
        if self.models is not None and MODEL_SERVICE.search(path):
            return self.models._serve(http, raw)
        if "/schedules" in path:
            return self._schedule_call(http.command, path, raw)
        if http.command == "POST" and path.endswith("/pipelineJobs"):
            self.calls.append("CreatePipelineJob")
            return 200, self._create(path.removesuffix("/pipelineJobs"), (query.get("pipelineJobId") or [""])[0], raw)
        if http.command == "POST" and path.endswith(":cancel"):
            self.calls.append("CancelPipelineJob")
            self._cancel(path.removesuffix(":cancel"))
            return 200, {}
        if http.command == "GET" and path.endswith("/pipelineJobs"):
            self.calls.append("ListPipelineJobs")
            self.list_queries.append(query)
            return 200, {"pipelineJobs": self._list(path.removesuffix("/pipelineJobs"), query)}
        if http.command == "GET" and "/pipelineJobs/" in path:
            self.calls.append("GetPipelineJob")
            with self._lock:
                if path not in self.jobs:
                    raise HttpError(404, f"The PipelineJob {path} does not exist.")
                return 200, copy.deepcopy(self.jobs[path].resource)
        raise HttpError(404, f"unknown method {http.command} {url.path}")

    def _list(self, parent: str, query: dict) -> list[dict]:
        """ListPipelineJobs: the jobs matching ``filter``, newest first ("if order_by is not specified, it will order
        by default order is create time in descending order", ListPipelineJobsRequest.order_by's field docs), each
        cut to ``readMask`` when given (what the SDK's ``enable_simple_view`` sends)."""
        terms = [t.strip() for t in (query.get("filter") or [""])[0].split(" AND ") if t.strip()]
        parsed = [FILTER_TERM.match(t) for t in terms]
        if not all(parsed):
            raise HttpError(400, f"emulator: cannot read the filter term {terms[parsed.index(None)]!r}")
        if (query.get("orderBy") or [""])[0] not in ("", "create_time desc"):
            raise HttpError(400, f"emulator: cannot order by {query['orderBy'][0]!r}")
        with self._lock:
            jobs = [copy.deepcopy(j.resource) for n, j in self.jobs.items() if n.startswith(parent + "/")]
        jobs = [j for j in jobs if all(_matches(j, m) for m in parsed)]
        jobs.sort(key=lambda j: j["createTime"], reverse=True)
        mask = [p for text in query.get("readMask", []) for p in text.split(",") if p]
        return [_masked(j, mask) for j in jobs] if mask else jobs

    def _create(self, parent: str, job_id: str, raw: bytes, scheduled: str = "") -> dict:
        if not PARENT.match(parent):
            raise HttpError(400, f"Invalid parent {parent!r}: expected projects/PROJECT/locations/LOCATION.")
        message = _parse(aiplatform_v1.PipelineJob, raw)
        job_id = job_id or f"{message.display_name or 'pipeline'}-{int(time.time())}"
        if not JOB_ID.match(job_id):
            raise HttpError(400, f"Invalid pipeline job id {job_id!r}: it must match {JOB_ID.pattern}.")
        resource = json.loads(aiplatform_v1.PipelineJob.to_json(message))
        spec = resource.get("pipelineSpec") or {}
        root = resource.get("runtimeConfig", {}).get("gcsOutputDirectory", "")
        if not root.startswith("gs://"):
            raise HttpError(400, f"The pipeline root must be a gs:// path, got {root!r}.")
        parameters = self._parameters(spec, resource.get("runtimeConfig", {}).get("parameterValues", {}))
        name = f"{parent}/pipelineJobs/{job_id}"
        with self._lock:
            if name in self.jobs:
                raise HttpError(409, f"PipelineJob {name} already exists.")
            # "some reserved label key for Vertex AI Pipelines. - vertex-ai-pipelines-run-billing-id, user set value
            # will get overrided" (PipelineJob.labels' field docs, google/cloud/aiplatform_v1/types/pipeline_job.py)
            labels = {**resource.get("labels", {}), BILLING_LABEL: str(8_700_000_000_000_000_000 + len(self.jobs))}
            resource.update(
                name=name,
                labels=labels,
                state="PIPELINE_STATE_PENDING",
                createTime=_now(),
                updateTime=_now(),
                jobDetail={"taskDetails": []},
            )
            self.jobs[name] = Job(resource, spec, parameters, root.rstrip("/"), scheduled=scheduled)
        threading.Thread(target=self._run, args=(name,), daemon=True).start()
        return copy.deepcopy(resource)

    @staticmethod
    def _parameters(spec: dict, given: dict) -> dict:
        def refuse(why: str, key: str, kind: str) -> HttpError:
            return HttpError(
                400,
                f"The pipeline parameter {key} "
                + {
                    "unknown": "is not found in the pipeline job input definitions.",
                    "type": f"must be of type {kind}, got {given.get(key)!r}.",
                    "required": "is required.",
                }[why],
            )

        return resolve_parameters(spec, given, refuse)

    def _cancel(self, name: str) -> None:
        with self._lock:
            if name not in self.jobs:
                raise HttpError(404, f"The PipelineJob {name} does not exist.")
            job = self.jobs[name]
            if job.resource["state"] in TERMINAL:
                raise HttpError(400, f"The PipelineJob {name} is already in a final state.")
            job.resource["state"] = "PIPELINE_STATE_CANCELLING"
            job.cancelled.set()
            job.cancels.append((job.resource["state"], list(job.running.values())))
            for proc, shown in list(job.running.items()):
                self._terminate(proc, shown)

    # ------------------------------------------------------------------ running a job
    def _schedule_call(self, command: str, path: str, raw: bytes) -> tuple:
        if command == "POST" and path.endswith("/schedules"):
            self.calls.append("CreateSchedule")
            return 200, self._create_schedule(path.removesuffix("/schedules"), raw)
        if command == "GET" and path.endswith("/schedules"):
            self.calls.append("ListSchedules")
            with self._lock:
                return 200, {
                    "schedules": [
                        copy.deepcopy(s.resource)
                        for n, s in self.schedules.items()
                        if n.startswith(path[: -len("/schedules")] + "/")
                    ]
                }
        name, _, verb = path.partition(":")
        with self._lock:
            if name not in self.schedules:
                raise HttpError(404, f"The Schedule {name} does not exist.")
            schedule = self.schedules[name]
            if command == "GET":
                self.calls.append("GetSchedule")
                return 200, copy.deepcopy(schedule.resource)
            if command == "DELETE":
                self.calls.append("DeleteSchedule")
                del self.schedules[name]
                return 200, {
                    "name": f"{name}/operations/delete",
                    "done": True,
                    "response": {"@type": "type.googleapis.com/google.protobuf.Empty"},
                }
            if command == "POST" and verb in ("pause", "resume"):
                self.calls.append(f"{verb.title()}Schedule")
                schedule.resource["state"] = "PAUSED" if verb == "pause" else "ACTIVE"
                if verb == "resume":  # runs due while paused are not caught up (Vertex's default)
                    schedule.checked = self.clock
                return 200, {}
        raise HttpError(404, f"unknown method {command} {path}")

    def _create_schedule(self, parent: str, raw: bytes) -> dict:
        if not PARENT.match(parent):
            raise HttpError(400, f"Invalid parent {parent!r}: expected projects/PROJECT/locations/LOCATION.")
        resource = json.loads(aiplatform_v1.Schedule.to_json(_parse(aiplatform_v1.Schedule, raw)))
        cron = resource.get("cron", "")
        try:
            _cron_matches(cron, self.clock)
        except Exception:  # noqa: BLE001 - any parse failure is the service's INVALID_ARGUMENT
            raise HttpError(400, f"Invalid cron {cron!r}.") from None
        if resource.get("allowQueueing"):  # a limit of this emulator, not of Vertex AI: it never queues a run
            raise HttpError(501, "emulator: allow_queueing is not emulated (held-back runs are skipped)")
        job = resource.get("createPipelineJobRequest", {}).get("pipelineJob", {})
        self._parameters(job.get("pipelineSpec", {}), job.get("runtimeConfig", {}).get("parameterValues", {}))
        name = f"{parent}/schedules/{len(self.schedules) + 1}"
        resource.update(name=name, state="ACTIVE", createTime=_now(), startedRunCount="0")
        with self._lock:
            self.schedules[name] = Schedule(resource, self.clock)
        return copy.deepcopy(resource)

    def advance(self, to: datetime) -> list[str]:
        """Move the schedules' clock to ``to``, firing every run due on the way, minute by minute; the jobs started."""
        started = []
        while self.clock < to:
            self.clock += timedelta(minutes=1)
            with self._lock:
                due = [
                    s
                    for s in self.schedules.values()
                    if s.resource["state"] == "ACTIVE" and _cron_matches(s.resource["cron"], self.clock)
                ]
            started += [job for job in (self._fire(s) for s in due) if job]
        return started

    def _fire(self, schedule: Schedule) -> str:
        r = schedule.resource
        starts, ends = (
            datetime.fromisoformat(r[k].replace("Z", "+00:00")) if r.get(k) else None for k in ("startTime", "endTime")
        )
        if (starts and self.clock < starts) or (ends and self.clock > ends):
            return ""
        # The field docs of google.cloud.aiplatform_v1.types.Schedule: max_concurrent_active_run_count limits "the
        # number of runs that can be in a non-terminal state at the same time"; max_concurrent_run_count is "the limit
        # for starting the scheduled requests and not the execution of the operations/jobs created by the requests".
        # Here a start (CreatePipelineJob) completes before the next is due, so only the active limit holds a run
        # back: without it, runs overlap. With allow_queueing unset (its default, false) a held-back run is skipped.
        with self._lock:
            active = [j for j in schedule.jobs if self.jobs[j].resource["state"] not in TERMINAL]
            limit = int(r.get("maxConcurrentActiveRunCount") or 0)
            if limit and len(active) >= limit:
                schedule.skipped += 1
                return ""
        request = r["createPipelineJobRequest"]
        job_id = re.sub(r"[^a-z0-9-]+", "-", r["displayName"].lower()).strip("-")[:100] + self.clock.strftime(
            "-%Y%m%d%H%M%S"
        )
        resource = self._create(
            request.get("parent", r["name"].rsplit("/schedules/", 1)[0]),
            job_id,
            json.dumps(request["pipelineJob"]).encode(),
            scheduled=self.clock.strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        with self._lock:
            schedule.jobs.append(resource["name"])
            r["startedRunCount"] = str(len(schedule.jobs))
            if int(r.get("maxRunCount") or 0) and len(schedule.jobs) >= int(r["maxRunCount"]):
                r["state"] = "COMPLETED"
        return resource["name"]


def _matches(job: dict, term: re.Match) -> bool:
    field, op, value = term["field"], term["op"], term["value"].strip('"')
    if field.startswith("labels."):
        labels = job.get("labels", {})
        key = field.removeprefix("labels.")
        if op == ":":
            return key in labels if value == "*" else value in labels.get(key, "")
        actual = labels.get(key)
    else:
        actual = job.get({"state": "state", "display_name": "displayName"}[field])
    if op == ":":
        raise HttpError(400, f"emulator: cannot read {term.string!r} (':' on {field})")
    return (actual == value) == (op == "=")


def _camel(path: str) -> str:
    return ".".join(re.sub(r"_([a-z])", lambda m: m[1].upper(), part) for part in path.split("."))


def _masked(resource: dict, paths: list[str]) -> dict:
    """``resource`` with only the fields of ``paths`` (a FieldMask, snake_case or camelCase, dotted)."""
    out: dict = {}
    for path in paths:
        parts = _camel(path).split(".")
        source, target = resource, out
        for part in parts[:-1]:
            if part not in source:
                break
            source, target = source[part], target.setdefault(part, {})
        else:
            if parts[-1] in source:
                target[parts[-1]] = copy.deepcopy(source[parts[-1]])
    return out


def _parse(message_type, raw: bytes):
    """The body as the SDK's own message type: unknown fields and wrong types are refused, as the service does."""
    try:
        return message_type.from_json(raw.decode(), ignore_unknown_fields=False)
    except Exception as exc:  # noqa: BLE001 - the parse error is the answer
        raise HttpError(400, f"Invalid JSON payload: {exc}") from None
