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
the emulated KubeRay maps for its processes: tests/emulators/kube.py). Output artifacts are written through the
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
CANCELLED, not run; the job ends CANCELLED. A task's ``{{$.pipeline_job_resource_name}}`` is the job's full resource
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

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from google.cloud import aiplatform_v1

from tests.emulators.http import HttpEmulator, HttpError
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
GCS_MOUNT = Path("/gcs")
BILLING_LABEL = "vertex-ai-pipelines-run-billing-id"
# What Vertex AI Pipelines gives every task: the run's labels as JSON ("Resources generated from user-defined
# components", https://cloud.google.com/vertex-ai/docs/pipelines/gcpc-label-propagation).
RUN_LABELS_ENV = "VERTEX_AI_PIPELINES_RUN_LABELS"
TERMINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")
PARAMETER_TYPES = {
    "STRING": str,
    "NUMBER_INTEGER": (int, float),
    "NUMBER_DOUBLE": (int, float),
    "BOOLEAN": bool,
    "LIST": list,
    "STRUCT": dict,
}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Job:
    resource: dict  # the PipelineJob as JSON (camelCase), what Get answers
    spec: dict
    parameters: dict
    root: str  # the pipeline root, gs://...
    cancelled: threading.Event = field(default_factory=threading.Event)
    running: dict[subprocess.Popen, str] = field(default_factory=dict)  # the tasks' processes that run now: names
    tasks: list[dict] = field(default_factory=list)  # PipelineTaskDetail JSON, in start order
    logs: dict[str, str] = field(default_factory=dict)  # task name -> its output (its last attempt's)
    attempts: dict[str, int] = field(default_factory=dict)  # task name -> attempts started
    backoffs: dict[str, list[float]] = field(default_factory=dict)  # task name -> the unscaled waits before retries
    # The task names each cancel's SIGTERM reached, and the job's state then (``_cancel``).
    cancels: list[tuple[str, list[str]]] = field(default_factory=list)
    # The time a schedule started the job for (RFC 3339, UTC), what KFP's schedule-time placeholder stands for: "the
    # time for which a pipeline job is scheduled" (kfp/dsl/__init__.py, PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER).
    # A job no schedule started has none; what Vertex AI puts there for one is not documented, and "" is this
    # emulator's choice (docs/recurring.md says so).
    scheduled: str = ""


@dataclass
class Schedule:
    resource: dict
    checked: datetime  # the test clock up to which its cron was evaluated
    jobs: list[str] = field(default_factory=list)  # the jobs it started
    skipped: int = 0  # runs due while maxConcurrentActiveRunCount were active


def _cron_matches(cron: str, when: datetime) -> bool:
    """Whether the 5-field cron (with an optional ``TZ=``/``CRON_TZ=`` zone) fires at minute ``when`` (UTC)."""
    from zoneinfo import ZoneInfo

    zone, _, fields = cron.partition(" ") if cron.startswith(("TZ=", "CRON_TZ=")) else ("", "", cron)
    local = when.astimezone(ZoneInfo(zone.split("=", 1)[1])) if zone else when
    values = (local.minute, local.hour, local.day, local.month, (local.weekday() + 1) % 7)
    for text, value, (low, high) in zip(
        fields.split(), values, ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7)), strict=True
    ):
        allowed = set()
        for part in text.split(","):
            rng, _, step = part.partition("/")
            first, last = (low, high) if rng == "*" else (int(rng.split("-")[0]), int(rng.split("-")[-1]))
            allowed |= set(range(first, last + 1, int(step or 1)))
        if value not in allowed and not (value == 0 and 7 in allowed and text != "*"):
            return False
    return True


class ConditionError(ValueError):
    """A trigger condition outside the CEL this emulator reads."""


_CEL_TOKEN = re.compile(
    r"""\s*(?:(?P<param>inputs\.parameter_values\[(?P<q>['"])(?P<key>[^'"]+)(?P=q)\])"""
    r"""|(?P<string>'[^']*'|"[^"]*")|(?P<number>-?\d+(?:\.\d+)?)|(?P<word>true|false)"""
    r"""|(?P<op>==|!=|<=|>=|<|>|&&|\|\||!|\(|\)))"""
)


def condition_holds(expression: str, parameters: dict) -> bool:
    """Whether a task's ``triggerPolicy.condition`` holds for its input parameters: the CEL that KFP writes for
    ``dsl.If``/``Elif``/``Else`` (``inputs.parameter_values['NAME']`` compared with ``==``, ``!=``, ``<``, ``<=``,
    ``>``, ``>=`` to a string, number or boolean; ``&&``, ``||``, ``!`` and parentheses). Anything else is refused,
    so a pipeline this emulator cannot judge fails visibly instead of running the wrong branch."""
    tokens, at = [], 0
    expression = expression.strip()
    while at < len(expression):
        match = _CEL_TOKEN.match(expression, at)
        if not match or match.end() == at:
            raise ConditionError(f"cannot read the condition {expression!r} at {expression[at:]!r}")
        at = match.end()
        if match["param"]:
            if match["key"] not in parameters:
                raise ConditionError(f"the condition reads {match['key']!r}, not an input of the task")
            tokens.append(("value", parameters[match["key"]]))
        elif match["string"]:
            tokens.append(("value", match["string"][1:-1]))
        elif match["number"]:
            tokens.append(("value", float(match["number"])))
        elif match["word"]:
            tokens.append(("value", match["word"] == "true"))
        else:
            tokens.append(("op", match["op"]))
    position = 0

    def peek() -> tuple[str, object] | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> tuple[str, object]:
        nonlocal position
        if position >= len(tokens):
            raise ConditionError(f"the condition {expression!r} ends too soon")
        position += 1
        return tokens[position - 1]

    def disjunction() -> bool:
        value = conjunction()
        while peek() == ("op", "||"):
            take()
            value = conjunction() or value
        return value

    def conjunction() -> bool:
        value = negation()
        while peek() == ("op", "&&"):
            take()
            value = negation() and value
        return value

    def negation():
        if peek() == ("op", "!"):
            take()
            return not negation()
        return comparison()

    def comparison():
        left = operand()
        if peek() and peek()[0] == "op" and peek()[1] in COMPARISONS:
            op = take()[1]
            right = operand()
            if isinstance(left, float) or isinstance(right, float):
                left, right = float(left), float(right)
            return COMPARISONS[op](left, right)
        return left

    def operand():
        kind, value = take()
        if (kind, value) == ("op", "("):
            inner = disjunction()
            if take() != ("op", ")"):
                raise ConditionError(f"unbalanced parentheses in {expression!r}")
            return inner
        if kind != "value":
            raise ConditionError(f"unexpected {value!r} in {expression!r}")
        return value

    result = disjunction()
    if position != len(tokens):
        raise ConditionError(f"cannot read the condition {expression!r} after token {position}")
    return bool(result)


COMPARISONS = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


class VertexEmulator(HttpEmulator):
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
        self.storage, self.registry = storage, registry  # the storage and Artifact Registry emulators
        self.models = models  # the ModelService emulator (tests.emulators.models) served on this endpoint
        self.env, self.python_bin, self.workdir, self.token = env, python_bin, workdir, token
        self.jobs: dict[str, Job] = {}
        self.schedules: dict[str, Schedule] = {}
        self.clock = datetime.now(UTC).replace(second=0, microsecond=0)  # the schedules' clock, moved by advance()
        self.calls: list[str] = []
        self.list_queries: list[dict] = []  # each ListPipelineJobs call's query parameters
        self.backoff_scale = 1.0  # a retry's wait, as the spec gives it, times this
        self.kills: dict[str, object] = {}  # task name -> the condition that kills its first attempt
        self.terms: dict[str, object] = {}  # task name -> the condition that terminates its first attempt
        # A pod's terminationGracePeriodSeconds: 30 unless set (the Pod spec's field docs,
        # https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#lifecycle); Vertex AI
        # documents no other for its tasks.
        self.grace_s = 30.0
        self.terminated: list[tuple[str, float]] = []  # (task name, when) each SIGTERM was sent
        self.forced: list[str] = []  # the tasks whose processes were SIGKILLed at the end of their grace period
        self._lock = threading.RLock()

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

    def kill_first_attempt(self, task: str, when=lambda: True) -> None:
        """The fault: the first attempt of ``task`` (its name in the task details) is SIGKILLed, its process group with
        it, as soon as ``when()`` holds while it runs; a retry, if the spec asks for one, is not touched."""
        self.kills[task] = when

    def terminate_first_attempt(self, task: str, when=lambda: True) -> None:
        """The fault: the first attempt of ``task`` is sent SIGTERM (its process group), then SIGKILL ``grace_s``
        later unless it ended, as soon as ``when()`` holds while it runs: an evicted pod, the job going on."""
        self.terms[task] = when

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
        declared = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
        values = {}
        for key, value in given.items():
            if key not in declared:
                raise HttpError(
                    400, f"The pipeline parameter {key} is not found in the pipeline job input definitions."
                )
            kind = declared[key]["parameterType"]
            if not isinstance(value, PARAMETER_TYPES[kind]):
                raise HttpError(400, f"The pipeline parameter {key} must be of type {kind}, got {value!r}.")
            values[key] = value
        for key, definition in declared.items():
            if key not in values:
                if "defaultValue" not in definition:
                    raise HttpError(400, f"The pipeline parameter {key} is required.")
                values[key] = definition["defaultValue"]
        return values

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
    def _set(self, job: Job, **fields) -> None:
        with self._lock:
            job.resource.update(fields, updateTime=_now())

    def _run(self, name: str) -> None:
        job = self.jobs[name]
        self._set(job, state="PIPELINE_STATE_RUNNING", startTime=_now())
        root = self._detail(job, name.rsplit("/", 1)[-1], "RUNNING")  # the root DAG's task, named after the job
        try:
            ok = self._dag(job, job.spec["root"], dict(job.parameters), root["taskId"])
        except Exception as exc:  # noqa: BLE001 - the emulator's own failure ends the job, visibly
            ok = False
            self._set(job, error={"code": 13, "message": f"emulator: {exc}"})
        self._end(job, root, ok)
        state = (
            "PIPELINE_STATE_CANCELLED"
            if job.cancelled.is_set()
            else "PIPELINE_STATE_SUCCEEDED"
            if ok
            else "PIPELINE_STATE_FAILED"
        )
        self._set(job, state=state, endTime=_now())

    def _end(self, job: Job, detail: dict, ok: bool) -> None:
        """A DAG task's end: succeeded when all its tasks did, else cancelled or failed with them (the emulator's
        reading: Vertex documents the DAG tasks' states, not how they follow their children's)."""
        with self._lock:
            detail.update(state="SUCCEEDED" if ok else "CANCELLED" if job.cancelled.is_set() else "FAILED")
            detail["endTime"] = _now()

    def _dag(self, job: Job, component: dict, inputs: dict, parent: str) -> bool:
        """Run a DAG's tasks in dependency order, each task's detail under the DAG's task ``parent``; True when
        every task that ran succeeded."""
        tasks = component["dag"]["tasks"]
        outcome: dict[str, bool | None] = {}  # task -> succeeded (None: skipped)
        outputs: dict[str, dict] = {}
        started: dict[str, threading.Thread] = {}
        errors: list[Exception] = []  # the emulator's own failures (a condition it cannot read): they end the job
        ended = threading.Condition()

        def run(task: str, spec: dict, args: dict) -> None:
            done = False
            try:
                done = self._task(job, task, spec, args, parent, outputs)
            except Exception as exc:  # noqa: BLE001 - raised again below, in the job's own thread
                errors.append(exc)
            with ended:
                outcome[task] = done
                ended.notify_all()

        with ended:
            while len(outcome) < len(tasks):
                ready = [
                    t
                    for t, spec in tasks.items()
                    if t not in started
                    and t not in outcome
                    and all(d in outcome for d in spec.get("dependentTasks", []))
                ]
                for task in sorted(ready):
                    spec = tasks[task]
                    shown = spec.get("taskInfo", {}).get("name", task)  # the task's name in its details, as in the UI
                    upstream = [outcome[d] for d in spec.get("dependentTasks", [])]
                    always = spec.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"
                    # Cancelling "cancels all the remaining tasks in the pipeline", the exit handler's too
                    # (https://cloud.google.com/vertex-ai/docs/pipelines/cancel-pipeline-runs).
                    if job.cancelled.is_set() or (not always and not all(upstream)):
                        outcome[task] = None
                        # SKIPPED "specifies task was skipped due to cache hit" (PipelineTaskDetail.State's docs,
                        # google/cloud/aiplatform_v1/types/pipeline_job.py), and caching is this emulator's to refuse:
                        # a task not started because an upstream task failed gets no detail (no state is documented
                        # for it).
                        if job.cancelled.is_set():
                            self._detail(job, shown, "CANCELLED", parent)
                        continue
                    args = self._resolve(job, spec.get("inputs", {}).get("parameters", {}), inputs, outputs)
                    started[task] = threading.Thread(target=run, args=(task, spec, args), daemon=True)
                    started[task].start()
                if len(outcome) < len(tasks) and not ready:
                    ended.wait()
        if errors:
            raise errors[0]
        return all(v is not False for v in outcome.values()) and not any(
            v is None and not job.cancelled.is_set() for v in outcome.values()
        )

    def _task(self, job: Job, task: str, spec: dict, args: dict, parent: str, outputs: dict) -> bool:
        """One task of a DAG whose upstream tasks allow it to run: not triggered when its condition does not hold
        (done, and no failure), a group's DAG (an exit handler's or a condition's, a task of its own as on Vertex),
        or a container, attempt after attempt as its ``retryPolicy`` allows."""
        shown = spec.get("taskInfo", {}).get("name", task)
        condition = spec.get("triggerPolicy", {}).get("condition")
        if condition and not condition_holds(condition, args):
            self._detail(job, shown, "NOT_TRIGGERED", parent)
            return True
        child = job.spec["components"][spec["componentRef"]["name"]]
        if "dag" in child:
            group = self._detail(job, shown, "RUNNING", parent)
            ok = self._dag(job, child, args, group["taskId"])
            self._end(job, group, ok)
            return ok
        artifacts = self._input_artifacts(job, spec.get("inputs", {}).get("artifacts", {}), outputs)
        retry = spec.get("retryPolicy") or {}
        ok, outputs[task] = self._container(job, task, child, args, shown, parent, retry, artifacts)
        return ok

    @staticmethod
    def _input_artifacts(job: Job, bindings: dict, outputs: dict) -> dict:
        """A task's input artifacts: each an output artifact of a task upstream (``taskOutputArtifact``), as it
        was written (uri, schema title, metadata), so an artifact is one node between its producer and its
        consumers, Vertex's lineage. Any other binding is refused: the emulator does not guess."""
        resolved = {}
        for key, binding in bindings.items():
            ref = binding.get("taskOutputArtifact")
            if not ref:
                raise ValueError(f"emulator: cannot resolve the input artifact {key!r}: {binding}")
            resolved[key] = copy.deepcopy(outputs[ref["producerTask"]]["artifacts"][ref["outputArtifactKey"]])
        return resolved

    def _resolve(self, job: Job, bindings: dict, inputs: dict, outputs: dict) -> dict:
        job_id = job.resource["name"].rsplit("/", 1)[-1]
        values = {}
        for key, binding in bindings.items():
            if "componentInputParameter" in binding:
                values[key] = inputs[binding["componentInputParameter"]]
            elif "taskOutputParameter" in binding:
                ref = binding["taskOutputParameter"]
                values[key] = outputs[ref["producerTask"]]["parameters"][ref["outputParameterKey"]]
            elif "runtimeValue" in binding:
                constant = binding["runtimeValue"]["constant"]
                values[key] = (
                    constant.replace("{{$.pipeline_job_name}}", job_id)
                    .replace("{{$.pipeline_job_resource_name}}", job.resource["name"])
                    .replace("{{$.pipeline_job_schedule_time_utc}}", job.scheduled)
                    if isinstance(constant, str)
                    else constant
                )
        return values

    def _container(
        self,
        job: Job,
        task: str,
        component: dict,
        args: dict,
        shown: str,
        parent: str,
        retry: dict,
        artifacts: dict | None = None,
    ) -> tuple[bool, dict]:
        """One task, attempt after attempt as its ``retryPolicy`` allows: each in its own directory and process group,
        its artifacts moved to the storage emulator after it."""
        executor = job.spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
        detail = self._detail(job, shown, "RUNNING", parent)
        artifacts = artifacts or {}
        if artifacts:
            with self._lock:
                detail["inputs"] = {name: {"artifacts": _shown(name, a)} for name, a in artifacts.items()}
        if not self.registry.has_image(executor["image"]):  # created without a look at it; the pull fails
            with self._lock:
                detail.update(state="FAILED", endTime=_now())
                detail["error"] = {
                    "code": 5,
                    "message": f"emulator: failed to pull image {executor['image']}: not found",
                }
            job.logs[task] = detail["error"]["message"]
            return False, {"parameters": {}, "artifacts": {}}
        retries = int(retry.get("maxRetryCount") or 0)
        while True:
            job.attempts[shown] = job.attempts.get(shown, 0) + 1
            ok, result, error = self._attempt(job, task, component, executor, args, shown, artifacts)
            if ok or job.cancelled.is_set() or job.attempts[shown] > retries:
                break
            wait = _backoff(retry, job.attempts[shown])
            job.backoffs.setdefault(shown, []).append(wait)
            # A PipelineTaskStatus's error in a non-final state "indicates a system-error being retried"; in FAILED
            # it "is final and not going to be retried" (its field docs, google/cloud/aiplatform_v1/types/
            # pipeline_job.py): an attempt that is retried is recorded RUNNING, with its error.
            with self._lock:
                detail.setdefault("pipelineTaskStatus", []).append(
                    {"updateTime": _now(), "state": "RUNNING", "error": error}
                )
            if job.cancelled.wait(wait * self.backoff_scale):
                break
        state = "SUCCEEDED" if ok else ("CANCELLED" if job.cancelled.is_set() else "FAILED")
        with self._lock:
            detail.update(
                state=state,
                endTime=_now(),
                outputs={name: {"artifacts": _shown(name, spec)} for name, spec in result["artifacts"].items()},
            )
            if not ok:
                detail["error"] = error
        return ok, result

    def _attempt(
        self, job: Job, task: str, component: dict, executor: dict, args: dict, shown: str, inputs: dict
    ) -> tuple[bool, dict, dict]:
        """One attempt of a task: (succeeded, its outputs, its error)."""
        task_dir = Path(tempfile.mkdtemp(prefix=f"{task.replace('.', '-')}-", dir=self.workdir))
        job_id = job.resource["name"].rsplit("/", 1)[-1]
        prefix = f"{job.root}/{job_id}/{task}"
        artifacts = {
            name: {
                "artifacts": [
                    {
                        "name": name,
                        "type": {"schemaTitle": a["artifactType"]["schemaTitle"]},
                        "uri": f"{prefix}/{name}",
                        "metadata": {},
                    }
                ]
            }
            for name, a in component.get("outputDefinitions", {}).get("artifacts", {}).items()
        }
        executor_input = {
            "inputs": {"parameterValues": args, "artifacts": inputs},
            "outputs": {
                "parameters": {
                    name: {"outputFile": str(task_dir / "outputs" / name)}
                    for name in component.get("outputDefinitions", {}).get("parameters", {})
                },
                "artifacts": artifacts,
                "outputFile": str(task_dir / "outputs" / "executor_output.json"),
            },
        }
        words = executor.get("args", [])  # a container component may have none
        argv = [*executor["command"], *[json.dumps(executor_input) if a == "{{$}}" else a for a in words]]
        env = {
            **self.env,
            "PATH": f"{self.python_bin}{os.pathsep}/usr/bin:/bin",
            "HOME": str(task_dir),
            "PYTHONUNBUFFERED": "1",
            RUN_LABELS_ENV: json.dumps(job.resource.get("labels", {}), sort_keys=True),
        }
        with open(task_dir / "task.log", "wb") as log:
            with self._lock:
                proc = subprocess.Popen(
                    argv,
                    cwd=task_dir,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                job.running[proc] = shown
            if job.attempts[shown] == 1 and shown in self.kills:
                self._kill_when(proc, self.kills[shown])
            if job.attempts[shown] == 1 and shown in self.terms:
                self._kill_when(proc, self.terms[shown], lambda: self._terminate(proc, shown))
            code = proc.wait()
            with self._lock:
                job.running.pop(proc, None)
        job.logs[task] = (task_dir / "task.log").read_text(errors="replace")
        result = self._collect(task_dir, artifacts, prefix)
        shutil.rmtree(task_dir, ignore_errors=True)
        error = {"code": 9, "message": f"The task {task} exited with code {code}: " + job.logs[task][-2000:]}
        return code == 0, result, error

    @staticmethod
    def _kill_when(process: subprocess.Popen, when, kill=None) -> None:
        """SIGKILL the process's group (or ``kill()``) once ``when()`` holds, unless it ended first."""

        def watch() -> None:
            while process.poll() is None:
                if when():
                    if kill is None:
                        os.killpg(process.pid, signal.SIGKILL)
                    else:
                        kill()
                    return
                time.sleep(0.2)

        threading.Thread(target=watch, daemon=True).start()

    def _terminate(self, process: subprocess.Popen, shown: str) -> None:
        """End a task as Kubernetes ends a pod: SIGTERM to the container's first process alone ("the kubelet triggers
        the container runtime to send a TERM signal to process 1 inside each container",
        https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination), and SIGKILL to every
        process of the container ``grace_s`` later if it still runs ("the kubelet triggers forcible shutdown", the same
        page), or as soon as that first process ends: the processes of a PID namespace are killed when its init ends
        (pid_namespaces(7)). The task's process group stands for the container, its first process for process 1."""
        if process.poll() is not None:
            return
        self.terminated.append((shown, time.time()))
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)

        def force() -> None:
            deadline = time.monotonic() + self.grace_s
            while time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.1)
            if process.poll() is None:
                self.forced.append(shown)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

        threading.Thread(target=force, daemon=True).start()

    def _collect(self, task_dir: Path, artifacts: dict, prefix: str) -> dict:
        """The task's output parameters and artifacts (with their metadata from the executor output); the files it
        wrote under /gcs/ go to the storage emulator and leave this machine."""
        out = task_dir / "outputs" / "executor_output.json"
        written = json.loads(out.read_text()) if out.is_file() else {}
        parameters = dict(written.get("parameterValues", {}))
        for path in (task_dir / "outputs").glob("*"):
            if path.name != "executor_output.json" and path.name not in parameters:
                parameters[path.name] = path.read_text()
        merged = copy.deepcopy(artifacts)
        for name, spec in written.get("artifacts", {}).items():
            if name in merged:  # the executor's answer carries uri and metadata; the type is the declared one
                declared = merged[name]["artifacts"][0]["type"]
                merged[name]["artifacts"] = [{"type": declared, **a} for a in spec["artifacts"]]
        bucket, _, key = prefix.removeprefix("gs://").partition("/")
        local = GCS_MOUNT / bucket / key
        if local.exists():
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                self.storage.put(bucket, f"{key}/{path.relative_to(local)}", path.read_bytes())
            shutil.rmtree(local, ignore_errors=True)
        return {"parameters": parameters, "artifacts": merged}

    def _detail(self, job: Job, task: str, state: str, parent: str = "") -> dict:
        """A PipelineTaskDetail: ``parentTaskId`` is "the id of the parent task if the task is within a component
        scope. Empty if the task is at the root level" (its field docs, google/cloud/aiplatform_v1/types/
        pipeline_job.py); the root level is the job's own task, named after the job (the SDK finds the root's
        outputs that way: google/cloud/aiplatform/model_evaluation/model_evaluation_job.py)."""
        detail = {"taskName": task, "state": state, "createTime": _now(), "startTime": _now()}
        if parent:
            detail["parentTaskId"] = parent
        with self._lock:  # tasks that run side by side start at once: one id each
            detail["taskId"] = str(len(job.tasks) + 1)
            job.tasks.append(detail)
            job.resource["jobDetail"] = {"taskDetails": job.tasks}
        return detail

    # ------------------------------------------------------------------ schedules
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


def _shown(name: str, artifacts: dict) -> list[dict]:
    """An ArtifactList as a task detail shows it: each artifact's uri, schema title and metadata."""
    shown = []
    for a in artifacts["artifacts"]:
        shown.append(
            {"uri": a["uri"], "schemaTitle": a["type"]["schemaTitle"], "metadata": a.get("metadata", {})}
            | {"displayName": name}
        )
    return shown


def _seconds(duration: str | None) -> float:
    """A protobuf Duration in its JSON form ("60s", "1.5s") as seconds."""
    return float(duration.removesuffix("s")) if duration else 0.0


def _backoff(retry: dict, attempt: int) -> float:
    """The wait before the retry that follows failed attempt ``attempt`` (1-based): ``backoffDuration`` x
    ``backoffFactor`` ** (attempt - 1), at most ``backoffMaxDuration``. The defaults are kfp's ``set_retry``
    docstring's: no wait ("0s"), a factor of 2, at most 3600s."""
    wait = _seconds(retry.get("backoffDuration")) * float(retry.get("backoffFactor") or 2.0) ** (attempt - 1)
    return min(wait, _seconds(retry.get("backoffMaxDuration") or "3600s"))


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
