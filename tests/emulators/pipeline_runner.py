"""What the emulated pipeline services share: an executor of a compiled KFP PipelineSpec (the IR that both Vertex AI
Pipelines and Kubeflow Pipelines run), each task its own process group in its own empty directory, as
``tests/emulators/vertex.py`` describes for Vertex AI (its module docstring states each rule and its source), and
the 5-field cron both services' schedules are read with. A service's emulator subclasses :class:`PipelineRunner`
and says what differs: the names of a run's states, what a task's placeholders stand for, the environment a task
gets, what becomes of a task a stop leaves unstarted, and where the task details are shown."""

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
from datetime import UTC, datetime
from pathlib import Path

GCS_MOUNT = Path("/gcs")
# A root input's parameterType (pipeline_spec.proto's ParameterType) and the JSON values it takes.
PARAMETER_TYPES = {
    "STRING": str,
    "NUMBER_INTEGER": (int, float),
    "NUMBER_DOUBLE": (int, float),
    "BOOLEAN": bool,
    "LIST": list,
    "STRUCT": dict,
}


def resolve_parameters(spec: dict, given: dict, refuse) -> dict:
    """The run's parameters against the spec's root inputs: no unknown name, each of its declared type, each missing
    one defaulted, a missing one without a default refused: ``refuse(why, key, kind)`` (``why``: unknown, type or
    required) gives the exception each service answers with."""
    declared = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    values = {}
    for key, value in given.items():
        if key not in declared:
            raise refuse("unknown", key, "")
        kind = declared[key]["parameterType"]
        if not isinstance(value, PARAMETER_TYPES[kind]):
            raise refuse("type", key, kind)
        values[key] = value
    for key, definition in declared.items():
        if key not in values:
            if "defaultValue" not in definition:
                raise refuse("required", key, "")
            values[key] = definition["defaultValue"]
    return values


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


class PipelineRunner:
    """The executor: ``run_job(name)`` runs ``self.jobs[name]`` to its end. A subclass sets ``STATES`` and may
    override the hooks below."""

    # The run's states: running, and how it ended.
    STATES = {"running": "RUNNING", "succeeded": "SUCCEEDED", "failed": "FAILED", "cancelled": "CANCELLED"}

    def _runner_init(self, storage, registry, env: dict[str, str], python_bin: Path, workdir: Path) -> None:
        self.storage, self.registry = storage, registry  # the storage and Artifact Registry emulators
        self.env, self.python_bin, self.workdir = env, python_bin, workdir
        self.jobs: dict[str, Job] = {}
        self.backoff_scale = 1.0  # a retry's wait, as the spec gives it, times this
        self.kills: dict[str, object] = {}  # task name -> the condition that kills its first attempt
        self.terms: dict[str, object] = {}  # task name -> the condition that terminates its first attempt
        # A pod's terminationGracePeriodSeconds: 30 unless set (the Pod spec's field docs,
        # https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#lifecycle).
        self.grace_s = 30.0
        # How long a container task waits, PENDING, between its creation and its process's start (``_container``):
        # 0 unless a test sets it (tests/emulators/vertex.py says what it stands for on Vertex AI).
        self.start_delay_s = 0.0
        self.terminated: list[tuple[str, float]] = []  # (task name, when) each SIGTERM was sent
        self.forced: list[str] = []  # the tasks whose processes were SIGKILLed at the end of their grace period
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ hooks
    def _job_id(self, job: Job) -> str:
        """The run's id, the folder of its tasks' artifacts under the pipeline root."""
        return job.resource["name"].rsplit("/", 1)[-1]

    def _placeholders(self, job: Job) -> dict[str, str]:
        """What each ``{{$...}}`` placeholder of a task's constant inputs stands for."""
        return {}

    def _task_env(self, job: Job) -> dict[str, str]:
        """What the service adds to a task's environment."""
        return {}

    def _tasks_changed(self, job: Job) -> None:
        """A task detail was added (``job.tasks``)."""

    def _upload_refused(self, job: Job, result: dict) -> str:
        """Why the service refuses a task's output artifacts once its command has succeeded ("": it takes them)."""
        return ""

    def _not_started(self, job: Job, shown: str, parent: str, always: bool) -> None:
        """A task a stop left unstarted (``always``: it runs whatever happens upstream, the exit handler)."""
        self._detail(job, shown, "CANCELLED", parent)

    def kill_first_attempt(self, task: str, when=lambda: True) -> None:
        """The fault: the first attempt of ``task`` (its name in the task details) is SIGKILLed, its process group with
        it, as soon as ``when()`` holds while it runs; a retry, if the spec asks for one, is not touched."""
        self.kills[task] = when

    def terminate_first_attempt(self, task: str, when=lambda: True) -> None:
        """The fault: the first attempt of ``task`` is sent SIGTERM (its first process), then SIGKILL ``grace_s``
        later unless it ended, as soon as ``when()`` holds while it runs: an evicted pod, the job going on."""
        self.terms[task] = when

    def _set(self, job: Job, **fields) -> None:
        with self._lock:
            job.resource.update(fields, updateTime=_now())

    def _run(self, name: str) -> None:
        job = self.jobs[name]
        self._set(job, state=self.STATES["running"], startTime=_now())
        root = self._detail(job, self._job_id(job), "RUNNING")  # the root DAG's task, named after the job
        try:
            ok = self._dag(job, job.spec["root"], dict(job.parameters), root["taskId"])
        except Exception as exc:  # noqa: BLE001 - the emulator's own failure ends the job, visibly
            ok = False
            self._set(job, error={"code": 13, "message": f"emulator: {exc}"})
        self._end(job, root, ok)
        state = "cancelled" if job.cancelled.is_set() else "succeeded" if ok else "failed"
        self._set(job, state=self.STATES[state], endTime=_now())

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
                            self._not_started(job, shown, parent, always)
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
        placeholders = self._placeholders(job)
        values = {}
        for key, binding in bindings.items():
            if "componentInputParameter" in binding:
                values[key] = inputs[binding["componentInputParameter"]]
            elif "taskOutputParameter" in binding:
                ref = binding["taskOutputParameter"]
                values[key] = outputs[ref["producerTask"]]["parameters"][ref["outputParameterKey"]]
            elif "runtimeValue" in binding:
                constant = binding["runtimeValue"]["constant"]
                for placeholder, value in placeholders.items() if isinstance(constant, str) else ():
                    constant = constant.replace(placeholder, value)
                values[key] = constant
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
        if self.start_delay_s:  # the task is created, its process not started yet: a cancel now ends it unstarted
            with self._lock:
                detail["state"] = "PENDING"
            if job.cancelled.wait(self.start_delay_s):
                with self._lock:
                    detail.update(state="CANCELLED", endTime=_now())
                return False, {"parameters": {}, "artifacts": {}}
            with self._lock:
                detail.update(state="RUNNING", startTime=_now())
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
        prefix = f"{job.root}/{self._job_id(job)}/{task}"
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
            **self._task_env(job),
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
                if job.cancelled.is_set():  # stopped while it was being started: stopped as the others were
                    self._terminate(proc, shown)
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
        refused = self._upload_refused(job, result) if code == 0 else ""
        if refused:
            job.logs[task] += refused
            return False, result, {"code": 9, "message": f"The task {task} failed: {refused}"}
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
            self._tasks_changed(job)
        return detail

    # ------------------------------------------------------------------ schedules


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
