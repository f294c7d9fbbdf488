"""An emulated Kubeflow Pipelines API server: the v2beta1 REST endpoints the official ``kfp.Client`` (kfp 2.x, through
its ``kfp_server_api`` package) calls, as the KFP API reference describes them
(https://www.kubeflow.org/docs/components/pipelines/reference/api/kubeflow-pipeline-api-spec/), every body in the
JSON of the ``kfp_server_api`` models (snake_case field names: each model's ``attribute_map``):

- pipelines: ``POST /apis/v2beta1/pipelines/upload`` (multipart ``uploadfile``, ``name``, ``description``,
  ``namespace``; the first version is created with it, named as the pipeline), ``POST .../pipelines/upload_version``
  (``name``, ``pipelineid``), ``GET .../pipelines`` (a ``filter``), ``GET .../pipelines/{id}``, ``GET
  .../pipelines/{id}/versions``;
- experiments: ``POST``/``GET .../experiments`` and ``GET .../experiments/{id}``;
- runs: ``POST .../runs`` (a ``V2beta1Run`` naming a pipeline version, or carrying the spec), ``GET .../runs`` and
  ``GET .../runs/{id}``, ``POST .../runs/{id}:terminate``;
- recurring runs: ``POST``/``GET .../recurringruns``, ``GET``/``DELETE .../recurringruns/{id}``, ``:enable`` and
  ``:disable``; a cron trigger (six fields, seconds first: "using 6 space-separated fields", the
  ``create_recurring_run`` docstring in kfp/client/client.py) fires on a test clock (``advance``), or at once
  (``fire``); its parameters reach the run as given, ``[[RunUUID]]``-style macros unsubstituted, as for a v2 pipeline
  pinned to a version (``_fire``: kubeflow/pipelines#12494); each run is named, and displayed, as its Argo Workflow;
  with ``max_concurrency`` runs active a due run is not started (the field's docs in
  ``kfp_server_api``'s V2beta1RecurringRun: "Specifies how many runs can be executed concurrently. Range [1-10]").

The server's release (``version``, "2.15.0", "2.16.0" or "2.17.0") decides what the v2 driver puts in the job-time
placeholders (``_placeholders``) and what ``healthz`` says (``tag_name``).

A filter is the JSON of KFP's ``api.Filter`` (``predicates`` of ``operation``, ``key`` and a value, ANDed:
backend/api/v2beta1/filter.proto); this emulator reads ``EQUALS`` on ``display_name``, ``name``, ``state`` and
``experiment_id`` and refuses the rest, so a filter it cannot judge fails visibly. A namespace the server does not
have is refused (403: the emulator's reading of a multi-user deployment, where a namespace a person may not use is a
permission error). Errors are the JSON of ``google.rpc.Status`` that KFP's grpc-gateway writes (``code``,
``message``, ``details``), under the HTTP status of the code.

With ``multi_user`` (the API server's MULTIUSER mode; healthz says it), every request on a namespace's resource is
authenticated (the user id header and prefix ``userid`` names: ``kubeflow-userid`` and "" as Kubeflow's multi-user
install sets them, ``SERVER_DEFAULT`` where a deployment leaves them unset; or a bearer token of
``token_for(user)`` that the Kubernetes TokenReview API accepts for the audience ``pipelines.kubeflow.org``; neither:
401) and authorized (the user must be one
``grant(user, namespace)`` named, as a SubjectAccessReview allows a profile's contributors: else 403); a run, a
recurring run or an experiment without a namespace is 400, and shared pipelines (no namespace) are read and uploaded
by anyone, and on 2.15 and 2.16 their versions deleted by anyone too (``_identity``, ``_authorize``,
``_delete_version``). Without it, a pipeline's namespace is ignored: every pipeline is shared (``_pipeline_namespace``).
A version's spec is kept as the server keeps it, through the PipelineSpec proto (``_stored_spec``).

A run executes as on the Vertex AI emulator (``tests.emulators.pipeline_runner``: each task its own process group in
its own empty directory, the image's stand-in first on PATH, its ``/gcs/`` outputs moved into the storage emulator,
as the KFP launcher uploads a task's outputs to the pipeline root); a task's image must be in the emulated Artifact
Registry, else it fails at image pull. A task's placeholders are what KFP's driver substitutes
(backend/src/v2/driver/resolve.go in kubeflow/pipelines): ``{{$.pipeline_job_name}}`` the run's display name,
``{{$.pipeline_job_resource_name}}`` "the pipeline run name in the underlying pipeline engine (e.g. an Argo Workflow
object name)" (kfp/dsl/__init__.py), here ``<pipeline name>-<5 random letters and digits>`` as a Kubernetes
``generateName`` makes (a recurring run's run: ``_workflow_name``), and ``{{$.pipeline_job_uuid}}`` the run's id;
the create and schedule times per release (``_placeholders``). A task whose output artifact points outside the
pipeline root fails after its command, as the KFP launcher fails it (``_upload_refused``). The runtime state goes
PENDING -> RUNNING -> SUCCEEDED | FAILED, or CANCELING -> CANCELED after a terminate (the V2beta1RuntimeState enum).

Terminate, on KFP's Argo backend: the API server sets the run's workflow's ``activeDeadlineSeconds`` to 0, so Argo
stops every running step (its pod is sent SIGTERM, then SIGKILL after its grace period, as Kubernetes ends a pod:
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination), and the exit handler's step is
started past the deadline and fails at once, "Step exceeded its deadline", without running its command
(https://github.com/kubeflow/pipelines/issues/6101: "on termination the exit handler fails with this error
message"). So here: the running tasks are stopped, every task not started is CANCELED except the exit handler's,
which is FAILED with that message, and its command never runs. As on Vertex AI, a stopped run's teardown is for
``tpupipe runs cancel`` and the janitor to do.
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

from tests.emulators.http import HttpEmulator, HttpError
from tests.emulators.pipeline_runner import Job, PipelineRunner, _cron_matches, _now, resolve_parameters
from tests.emulators.tokens import authorized

PREFIX = "/apis/v2beta1/"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELED")
# google.rpc.Code of an HTTP status, as grpc-gateway maps them (https://github.com/googleapis/googleapis/blob/master/
# google/rpc/code.proto: each code's HTTP mapping).
CODES = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 501: 12}
EXIT_DEADLINE = "Step exceeded its deadline"  # kubeflow/pipelines#6101, the exit handler after a terminate
FILTER_KEYS = ("display_name", "name", "state", "experiment_id")
EQUALS = (1, "EQUALS")  # api.Filter's Predicate.Operation EQUALS (kfp's _FILTER_OPERATIONS in kfp/client/client.py)
VERSIONS = ("2.15.0", "2.16.0", "2.17.0")  # the releases whose v2 driver this emulator follows (_placeholders)
CREATE_TIME, SCHEDULE_TIME = "{{$.pipeline_job_create_time_utc}}", "{{$.pipeline_job_schedule_time_utc}}"
USERID_HEADER, AUDIENCE = "kubeflow-userid", "pipelines.kubeflow.org"  # multi-user mode's identities (_identity)
# The user id header and the prefix stripped from its value, a pair the API server reads from KUBEFLOW_USERID_HEADER
# and KUBEFLOW_USERID_PREFIX: Kubeflow's multi-user install sets them to kubeflow-userid and ""
# (manifests/kustomize/base/installs/multi-user/api-service/deployment-patch.yaml at 2.15.0; at 2.17.0 the same from
# pipeline-install-config's USERID_HEADER and USERID_PREFIX, manifests/kustomize/base/installs/generic/
# pipeline-install-config.yaml, read with ``optional: true``). Where they are unset (a deployment without them, or at
# 2.17.0 a pipeline-install-config without those keys) the server's own defaults hold, Google IAP's header and prefix
# together: ``GetKubeflowUserIDHeader``/``GetKubeflowUserIDPrefix`` in backend/src/apiserver/common/config.go (lines
# 137-143 at 2.15.0, 197-203 at 2.17.0) fall back to ``GoogleIAPUserIdentityHeader``/``GoogleIAPUserIdentityPrefix``
# (common/const.go:48-49 at both). The HTTP gateway passes on to the API only the header the server names
# (``grpcCustomMatcher`` in backend/src/apiserver/main.go, lines 240-245 at 2.15.0, 265-273 at 2.17.0), so a
# ``kubeflow-userid`` sent to a server on its defaults is no identity at all.
MULTI_USER_INSTALL = (USERID_HEADER, "")
SERVER_DEFAULT = ("x-goog-authenticated-user-email", "accounts.google.com:")


class KfpError(HttpError):
    def body(self) -> dict:
        code = CODES.get(self.status, 2)
        return {"error": self.message, "code": code, "message": self.message, "details": []}


@dataclass
class Recurring:
    resource: dict  # the V2beta1RecurringRun
    spec: dict
    name: str = ""  # its ScheduledWorkflow's name (_swf_name)
    index: int = 0  # the runs it started
    runs: list[str] = field(default_factory=list)
    skipped: int = 0


def _generated() -> str:
    """The five random lowercase letters and digits a Kubernetes ``generateName`` appends."""
    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(5))


def _swf_name(display_name: str) -> str:
    """A recurring run's ScheduledWorkflow name: its display name lowercased, all but [a-z0-9-] dropped, "job-" if
    nothing is left, cut to 25 characters (toSWFCRDResourceGeneratedName in backend/src/apiserver/template/
    template.go), as its ``generateName`` (NewGenericScheduledWorkflow, .../template/v2_template.go)."""
    kept = re.sub(r"[^a-z0-9-]+", "", display_name.lower()) or "job-"
    return kept[:25] + _generated()


def _workflow_name(swf: str, index: int) -> str:
    """The Argo Workflow of a recurring run's ``index``-th run: ``<name>-<index>-<FNV-32a of that>`` (NextResourceName
    in backend/src/crd/controller/scheduledworkflow/util/scheduled_workflow.go)."""
    resource_id = f"{swf}-{index}"
    h = 0x811C9DC5
    for byte in resource_id.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{resource_id}-{h}"


class KfpEmulator(HttpEmulator, PipelineRunner):
    STATES = {"running": "RUNNING", "succeeded": "SUCCEEDED", "failed": "FAILED", "cancelled": "CANCELED"}

    def __init__(
        self,
        storage,
        registry,
        env: dict[str, str],
        python_bin: Path,
        workdir: Path,
        token: str = "",
        version: str = "2.17.0",
        multi_user: bool = False,
    ):
        super().__init__()
        self._runner_init(storage, registry, env, python_bin, workdir)
        if version not in VERSIONS:
            raise ValueError(f"emulator: KFP {version} is not one of {VERSIONS}")
        self.version = version
        self.tag_name: str | None = None  # what healthz says the release is; None: ``version``
        self.token = token
        self.namespaces = {"kubeflow"}  # the namespaces the server has ("" is its default, single-user)
        # Multi-user mode (MULTIUSER=true): every namespaced request is authenticated and authorized (``_authorize``).
        self.multi_user = multi_user
        self.contributors: dict[str, set[str]] = {}  # namespace -> the users a SubjectAccessReview allows there
        self._reviewed: dict[str, tuple[str, tuple[str, ...]]] = {}  # token -> (user, audiences): its TokenReview
        # The user id header and the prefix stripped from its value (KUBEFLOW_USERID_HEADER, KUBEFLOW_USERID_PREFIX),
        # set together: as the multi-user install sets them, or SERVER_DEFAULT (``_identity``).
        self.userid: tuple[str, str] = MULTI_USER_INSTALL
        self.identities: list[tuple[str, str | None]] = []  # (method path, its user id header) of each request
        self._request: BaseHTTPRequestHandler | None = None  # the request being answered (under the lock)
        self.pipelines: dict[str, dict] = {}
        self.versions: dict[str, dict] = {}  # version id -> V2beta1PipelineVersion, with its spec
        self.experiments: dict[str, dict] = {}
        self.recurring: dict[str, Recurring] = {}
        self.clock = datetime.now(UTC).replace(second=0, microsecond=0)  # the recurring runs' clock
        self.calls: list[str] = []

    # ------------------------------------------------------------------ the executor's hooks
    def _job_id(self, job: Job) -> str:
        return job.resource["run_id"]

    def _placeholders(self, job: Job) -> dict[str, str]:
        """What the v2 driver of this release gives a task input that is exactly a placeholder (the ``switch`` on a
        runtime value's constant in ``resolveInputParameter``, backend/src/v2/driver/resolve.go in
        kubeflow/pipelines at 2.15.0, 2.16.0 and 2.17.0): the run's display name, its Argo Workflow's name and its id
        on each (``--run_display_name``, ``--run_name`` = ``{{workflow.name}}``, ``--run_id`` = ``{{workflow.uid}}``,
        which a recurring run's controller replaces with the run's id: backend/src/v2/compiler/argocompiler/argo.go
        and ``NewWorkflow`` in backend/src/crd/controller/scheduledworkflow/util/scheduled_workflow.go). The job
        times (kubeflow/pipelines#13474):

        - 2.15: no case for either time: the placeholder stays as text (resolve.go's ``default: v = val``);
        - 2.16: cases read ``opts.PipelineJobCreateTimeUTC`` and ``opts.PipelineJobScheduleTimeUTC``, which the
          driver's main.go never sets: both empty;
        - 2.17: the create time is the Workflow's ``creationTimestamp`` (``runCreationTimeUTC``, argo.go), the
          schedule time the recurring run's ``workflowEpoch`` label, or the create time for a run no schedule
          started (``resolvePipelineJobTimes`` in backend/src/v2/cmd/driver/main.go), RFC 3339 to the second."""
        shown = {
            "{{$.pipeline_job_name}}": job.resource["display_name"],
            "{{$.pipeline_job_resource_name}}": job.resource["workflow"],
            "{{$.pipeline_job_uuid}}": job.resource["run_id"],
        }
        if self.version.startswith("2.16."):
            shown |= {CREATE_TIME: "", SCHEDULE_TIME: ""}
        elif self.version.startswith("2.17."):
            created = datetime.fromisoformat(job.resource["created_at"].replace("Z", "+00:00"))
            create_time = f"{created:%Y-%m-%dT%H:%M:%SZ}"
            shown |= {CREATE_TIME: create_time, SCHEDULE_TIME: job.scheduled or create_time}
        return shown

    def _upload_refused(self, job: Job, result: dict) -> str:
        """The launcher's rule for a task's output artifacts, after its command succeeded (``uploadOutputArtifacts``:
        https://github.com/kubeflow/pipelines/blob/2.15.0/backend/src/v2/component/launcher_v2.go#L616-L640, and
        at 2.16.0 L673-L711, at 2.17.0 L778-L823): each artifact's uri, as the executor output left it
        (``mergeRuntimeArtifacts``), that names a bucket (``LocalPathForURI``: gs://, s3://, minio://; oci:// is not
        uploaded, any other scheme is skipped with a warning) is uploaded under the pipeline root, whose key
        ``KeyFromURI`` takes: a uri not under ``PrefixedBucket()`` (the scheme, then ``path.Join`` of the root's
        bucket and path: no trailing slash, so a plain string prefix) fails the task, as does one that is the root
        itself (https://github.com/kubeflow/pipelines/blob/2.15.0/backend/src/v2/objectstore/config.go#L80-L95;
        the same at 2.17.0, L97-L112). The bucket config is the pipeline root's (``ParseBucketConfig`` of
        ``GetPipelineRoot()``: launcher_v2.go L216-L217 at 2.15.0, L256-L257 at 2.17.0)."""
        scheme, _, where = job.root.partition("://")
        bucket, _, path = where.partition("/")
        prefixed = f"{scheme}://{posixpath.normpath(posixpath.join(bucket, path))}"
        for name, listed in result["artifacts"].items():
            for artifact in listed["artifacts"]:
                uri = artifact.get("uri", "")
                if not uri.startswith(("gs://", "s3://", "minio://")):
                    continue
                if not uri.startswith(prefixed):
                    why = f"URI {json.dumps(uri)} does not have expected bucket prefix {json.dumps(prefixed)}"
                elif not uri[len(prefixed) :].lstrip("/"):
                    why = f"URI {json.dumps(uri)} has empty key given prefixed bucket {json.dumps(prefixed)}"
                else:
                    continue
                return f"failed to upload output artifact {json.dumps(name)}: {why}"
        return ""

    def _set(self, job: Job, **fields) -> None:
        with self._lock:
            if "state" in fields:
                job.resource["state"] = fields["state"]
                job.resource.setdefault("state_history", []).append({"update_time": _now(), "state": fields["state"]})
            if "endTime" in fields:
                job.resource["finished_at"] = fields["endTime"]
            if "error" in fields:
                job.resource["error"] = fields["error"]

    def _not_started(self, job: Job, shown: str, parent: str, always: bool) -> None:
        detail = self._detail(job, shown, "FAILED" if always else "CANCELLED", parent)
        if always:  # the exit handler's step, started past the workflow's deadline: its command never runs
            detail["error"] = {"code": 4, "message": EXIT_DEADLINE}

    # ------------------------------------------------------------------ inspection and test hooks
    def grant(self, user: str, namespace: str) -> None:
        """``user`` may act in ``namespace`` (made if new): a Kubeflow profile's owner or contributor, whom the
        SubjectAccessReview the server asks for allows every verb on pipelines.kubeflow.org's resources there."""
        self.namespaces.add(namespace)
        self.contributors.setdefault(namespace, set()).add(user)

    def token_for(self, user: str, audiences: tuple[str, ...] = (AUDIENCE,)) -> str:
        """A bearer token that the Kubernetes TokenReview API authenticates as ``user`` for ``audiences`` (a
        projected or ``kubectl create token --audience`` token)."""
        token = secrets.token_urlsafe(24)
        self._reviewed[token] = (user, audiences)
        return token

    def expire(self, token: str) -> None:
        """``token`` is past its expiry: the TokenReview API no longer authenticates it (a bound token's ``exp``:
        https://kubernetes.io/docs/reference/access-authn-authz/service-accounts-admin/#bound-service-account-token-volume)."""
        self._reviewed.pop(token, None)

    def run(self, run_id: str) -> Job:
        with self._lock:
            return self.jobs[run_id]

    def wait(self, run_id: str, timeout_s: float = 600) -> dict:
        """The run's resource once it has ended."""
        from tests.helpers import wait_until

        def ended() -> dict | None:
            resource = self.run(run_id).resource
            return self._shown_run(self.run(run_id)) if resource["state"] in TERMINAL else None

        return wait_until(ended, timeout_s, f"run {run_id} to end", detail=lambda: self.run(run_id).resource["state"])

    def add_run(
        self, state: str, namespace: str = "kubeflow", parameters: dict | None = None, recurring: str = ""
    ) -> str:
        """A run known to the server in ``state`` with nothing to run, as one started and ended elsewhere; of the
        recurring run ``recurring``, it is displayed as its workflow, as the server reports such a run."""
        run_id = str(uuid.uuid4())
        workflow = _workflow_name(_swf_name(recurring), 1) if recurring else f"run-{run_id[:5]}"
        resource = {
            "run_id": run_id,
            "recurring_run_id": recurring,
            "display_name": workflow if recurring else f"run-{run_id[:8]}",
            "namespace": namespace,
            "state": state,
            "created_at": _now(),
            "runtime_config": {"parameters": parameters or {}},
            "workflow": workflow,
        }
        with self._lock:
            self.jobs[run_id] = Job(resource, {}, {}, "")
        return run_id

    def advance(self, to: datetime) -> list[str]:
        """Move the recurring runs' clock to ``to``, firing every run due on the way, minute by minute."""
        started = []
        while self.clock < to:
            self.clock += timedelta(minutes=1)
            with self._lock:
                due = [r for r in self.recurring.values() if r.resource["status"] == "ENABLED" and self._due(r)]
            started += [run for run in (self._fire(r) for r in due) if run]
        return started

    def fire(self, recurring_run_id: str) -> str:
        """Start the recurring run's next run now, as its trigger would (its concurrency limit holds); its run id."""
        return self._fire(self.recurring[recurring_run_id])

    # ------------------------------------------------------------------ serving
    def _serve(self, http: BaseHTTPRequestHandler, raw: bytes) -> tuple:
        try:
            return self._route(http, raw)
        except KfpError:
            raise
        except HttpError as exc:  # raised by the shared parts in Google's shape: KFP answers in its own
            raise KfpError(exc.status, exc.message) from None

    def _route(self, http: BaseHTTPRequestHandler, raw: bytes) -> tuple:
        url = urlparse(http.path)
        path, query = url.path.removeprefix(PREFIX), {k: v[0] for k, v in parse_qs(url.query).items()}
        self.identities.append((f"{http.command} {path}", http.headers.get(self.userid[0])))
        if path == "healthz":
            # The healthz handler's JSON (newHealthzResponse in backend/src/apiserver/main.go): the release is the
            # deployment's TAG_NAME. The API's GetHealthzResponse declares multi_user alone
            # (https://github.com/kubeflow/pipelines/blob/2.15.0/backend/api/v2beta1/healthz.proto), so a server may
            # not say it: ``tag_name`` "" leaves it out, "unknown" is what a build without a TAG_NAME says.
            said = {"commit_sha": "unknown", "multi_user": self.multi_user}
            tag = self.version if self.tag_name is None else self.tag_name
            return 200, {**said, "tag_name": tag} if tag else said
        if self.token and not authorized(self.token, http.headers.get("Authorization")):
            raise KfpError(401, "Unauthenticated: the request has no valid bearer token.")
        method, parts = http.command, path.split("/")
        with self._lock:
            self._request = http
            if path == "pipelines/upload" and method == "POST":
                return 200, self._upload(query, http, raw)
            if path == "pipelines/upload_version" and method == "POST":
                return 200, self._upload_version(query, http, raw)
            if parts[0] == "pipelines" and method == "GET":
                return 200, self._get_pipelines(parts[1:], query)
            if parts[0] == "pipelines" and method == "DELETE" and len(parts) == 4 and parts[2] == "versions":
                return 200, self._delete_version(parts[1], parts[3])
            if parts[0] == "experiments":
                return 200, self._experiments(method, parts[1:], query, raw)
            if parts[0] == "runs":
                return 200, self._runs(method, parts[1:], query, raw)
            if parts[0] == "recurringruns":
                return 200, self._recurring_runs(method, parts[1:], query, raw)
        raise KfpError(404, f"Not Found: {method} {url.path}")

    def _identity(self) -> str:
        """Who the request is from, as the server's authenticators say it, first that answers (``IsAuthorized``'s
        loop over ``GetAuthenticators``: https://github.com/kubeflow/pipelines/blob/2.17.0/backend/src/apiserver/
        resource/resource_manager.go#L2308-L2341, backend/src/apiserver/auth/auth.go#L35-L45, the same at 2.15.0):
        the user id header (``KUBEFLOW_USERID_HEADER``, ``kubeflow-userid`` in the multi-user install's
        pipeline-install-config, its value after the prefix ``KUBEFLOW_USERID_PREFIX``, "" there; the pair
        ``userid``, ``SERVER_DEFAULT`` where they are unset; any other header is not passed on to the API, so it is
        as absent; a value without the prefix is "incorrectly formatted":
        ``singlePrefixedHeaderFromMetadata`` in backend/src/apiserver/auth/util.go), which Istio lets through only
        from Kubeflow's own services (manifests/kustomize/base/installs/multi-user/istio-authorization-config.yaml),
        then a bearer token the
        Kubernetes TokenReview API authenticates for the audience ``pipelines.kubeflow.org``
        (authenticator_token_review.go: ``ensureAudience``; ``DefaultTokenReviewAudience`` in common/const.go).
        Neither: 401 (``NewUnauthenticatedError``), with each authenticator's reason."""
        http, failed = self._request, []
        assert http is not None
        for header, prefix in (self.userid, ("Authorization", "Bearer ")):
            values = http.headers.get_all(header) or []
            if len(values) != 1:
                failed.append(
                    f"Request header error: unexpected number of '{header}' headers. Expect 1 got {len(values)}"
                    if values
                    else "Request header error: there is no user identity header."
                )
            elif not values[0].startswith(prefix):
                failed.append(f"Header '{header}' is incorrectly formatted. Expected prefix '{prefix}'")
            elif header == self.userid[0]:
                return values[0][len(prefix) :]
            else:
                user, audiences = self._reviewed.get(values[0][len(prefix) :], ("", ()))
                if not user:
                    failed.append("Authentication failure: Review.Status.Authenticated is false")
                elif AUDIENCE not in audiences:
                    failed.append(f"Failed to find all of '[{AUDIENCE}]' in audience: [{' '.join(audiences)}]")
                else:
                    return user
        raise KfpError(
            401,
            f"Failed to check authorization. User identity is empty in the request header: [{', '.join(failed)}]",
        )

    def _authorize(self, namespace: str, verb: str, resource: str, what: str = "") -> None:
        """In multi-user mode, a request on a namespace's resource is authorized as the server authorizes it (each
        server's ``canAccess…``, then ``IsAuthorized``: a SubjectAccessReview of the user's ``verb`` on the
        resource in the namespace): a run, a recurring run or an experiment needs a namespace (400, "… cannot have
        an empty namespace in multi-user mode": run_server.go ``createRun``, job_server.go ``createJob``,
        experiment_server.go ``canAccessExperiment`` at 2.17.0 and 2.15.0); a shared pipeline (no namespace) needs
        nothing (pipeline_server.go ``canAccessPipeline``, pipeline_upload_server.go ``canUploadVersionedPipeline``);
        a user the review does not allow is 403 (``NewPermissionDeniedError``)."""
        if not self.multi_user:
            return
        if not namespace:
            if not what:
                return
            raise KfpError(400, f"{what} cannot have an empty namespace in multi-user mode")
        user = self._identity()
        if user not in self.contributors.get(namespace, set()):
            raise KfpError(
                403,
                f"User '{user}' is not authorized with reason:  (request: &ResourceAttributes{{Namespace:{namespace},"
                f"Verb:{verb},Group:pipelines.kubeflow.org,Version:v1beta1,Resource:{resource}}})",
            )

    def _pipeline_namespace(self, namespace: str | None) -> str:
        """A pipeline's namespace: the one given on a multi-user server, else none, whatever was given
        (``ReplaceNamespace``, backend/src/apiserver/resource/resource_manager.go L2017-L2023 at 2.15.0, L2456 at
        2.17.0, which ListPipelines and the upload server apply first: pipeline_server.go ``listPipelines``,
        pipeline_upload_server.go L122 at 2.15.0, L123 at 2.17.0)."""
        return self._namespace(namespace) if self.multi_user else ""

    def _namespace(self, namespace: str | None) -> str:
        if namespace and namespace not in self.namespaces:
            raise KfpError(403, f"Failed to authorize with API: namespace {namespace!r} is not one of this server's")
        return namespace or ""

    # ------------------------------------------------------------------ pipelines and versions
    def _uploaded_spec(self, http: BaseHTTPRequestHandler, raw: bytes) -> dict:
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {http.headers.get('Content-Type')}\r\n\r\n".encode() + raw
        )
        files = [part for part in message.iter_parts() if part.get_param("name", header="content-disposition")]
        upload = next((p for p in files if p.get_param("name", header="content-disposition") == "uploadfile"), None)
        if upload is None:
            raise KfpError(400, "Failed to create a pipeline: no uploadfile in the request")
        try:
            spec = yaml.safe_load(upload.get_payload(decode=True))
        except yaml.YAMLError as exc:
            raise KfpError(400, f"Failed to create a pipeline: the package is not YAML: {exc}") from None
        if not isinstance(spec, dict) or "root" not in spec or "deploymentSpec" not in spec:
            raise KfpError(400, "Failed to create a pipeline: the package is not a compiled KFP v2 pipeline")
        return _stored_spec(spec)

    def _upload(self, query: dict, http: BaseHTTPRequestHandler, raw: bytes) -> dict:
        self.calls.append("UploadPipeline")
        namespace = self._pipeline_namespace(query.get("namespace"))
        try:
            self._authorize(namespace, "create", "pipelines")
        except KfpError:  # the upload server answers any refusal so (pipeline_upload_server.go, UploadPipeline)
            raise KfpError(400, "Failed to create a pipeline") from None
        spec = self._uploaded_spec(http, raw)
        name = query.get("name") or spec.get("pipelineInfo", {}).get("name", "")
        if any(p["display_name"] == name and p["namespace"] == namespace for p in self.pipelines.values()):
            raise KfpError(409, f"Failed to create a pipeline: the name {name!r} already exists in the namespace")
        pipeline_id = str(uuid.uuid4())
        self.pipelines[pipeline_id] = {
            "pipeline_id": pipeline_id,
            "display_name": name,
            "name": name,
            "description": query.get("description", ""),
            "namespace": namespace,
            "created_at": _now(),
        }
        self._new_version(pipeline_id, name, spec)
        return copy.deepcopy(self.pipelines[pipeline_id])

    def _upload_version(self, query: dict, http: BaseHTTPRequestHandler, raw: bytes) -> dict:
        self.calls.append("UploadPipelineVersion")
        pipeline_id, name = query.get("pipelineid", ""), query.get("name", "")
        if pipeline_id not in self.pipelines:
            raise KfpError(404, f"Failed to create a pipeline version: pipeline {pipeline_id!r} not found")
        try:
            self._authorize(self.pipelines[pipeline_id]["namespace"], "create", "pipelines")
        except KfpError:
            raise KfpError(400, "Failed to create a pipeline version") from None
        if any(v["pipeline_id"] == pipeline_id and v["display_name"] == name for v in self.versions.values()):
            raise KfpError(409, f"Failed to create a pipeline version: the name {name!r} already exists")
        return self._new_version(pipeline_id, name, self._uploaded_spec(http, raw))

    def _delete_version(self, pipeline_id: str, version_id: str) -> dict:
        """``DELETE .../pipelines/{id}/versions/{version id}`` (DeletePipelineVersion, backend/api/v2beta1/
        pipeline.proto), authorized as ``deletePipelineVersion`` then ``canAccessPipeline`` authorize it
        (backend/src/apiserver/server/pipeline_server.go): in a namespace, a user the review allows there; of a
        shared pipeline, anyone on 2.15 and 2.16 ("Skip authentication if the namespace is empty to enable shared
        pipelines in multi-user mode", L1095-L1098 at 2.15.0), and from 2.17 only a user allowed in the server's own
        namespace (``GetPodNamespace``, ``kubeflow`` here: L1290-L1300 at 2.17.0, kubeflow/pipelines#13288)."""
        self.calls.append("DeletePipelineVersion")
        version = self.versions.get(version_id)
        if version is None or version["pipeline_id"] != pipeline_id:
            raise KfpError(404, f"Pipeline version {version_id} not found")
        namespace = self.pipelines[pipeline_id]["namespace"]
        if namespace or not self.version.startswith(("2.15.", "2.16.")):
            self._authorize(namespace or "kubeflow", "delete", "pipelines")
        del self.versions[version_id]
        return {}

    def _new_version(self, pipeline_id: str, name: str, spec: dict) -> dict:
        version_id = str(uuid.uuid4())
        self.versions[version_id] = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": version_id,
            "display_name": name,
            "name": name,
            "created_at": _now(),
            "pipeline_spec": spec,
        }
        return copy.deepcopy(self.versions[version_id])

    def _get_pipelines(self, rest: list[str], query: dict) -> dict:
        if not rest:
            self.calls.append("ListPipelines")
            namespace = self._pipeline_namespace(query.get("namespace"))
            self._authorize(namespace, "list", "pipelines")
            found = [p for p in self.pipelines.values() if p["namespace"] == namespace]
            return _page("pipelines", _filtered(found, query))
        if rest[0] not in self.pipelines:
            raise KfpError(404, f"Pipeline {rest[0]} not found")
        self._authorize(self.pipelines[rest[0]]["namespace"], "get", "pipelines")
        if len(rest) == 1:
            return copy.deepcopy(self.pipelines[rest[0]])
        versions = [v for v in self.versions.values() if v["pipeline_id"] == rest[0]]
        if len(rest) == 3:
            if rest[2] not in self.versions:
                raise KfpError(404, f"Pipeline version {rest[2]} not found")
            return copy.deepcopy(self.versions[rest[2]])
        versions.sort(key=lambda v: v["created_at"], reverse=query.get("sort_by", "").endswith("desc"))
        return _page("pipeline_versions", _filtered(versions, query))

    # ------------------------------------------------------------------ experiments
    def _experiments(self, method: str, rest: list[str], query: dict, raw: bytes) -> dict:
        if method == "POST" and not rest:
            self.calls.append("CreateExperiment")
            body = json.loads(raw or b"{}")
            namespace = self._namespace(body.get("namespace"))
            self._authorize(namespace, "create", "experiments", "An experiment")
            name = body.get("display_name", "")
            if not name:
                raise KfpError(400, "Invalid input error: experiment name is empty")
            if any(e["display_name"] == name and e["namespace"] == namespace for e in self.experiments.values()):
                raise KfpError(409, f"Failed to create a new experiment: {name!r} already exists")
            experiment_id = str(uuid.uuid4())
            self.experiments[experiment_id] = {
                "experiment_id": experiment_id,
                "display_name": name,
                "description": body.get("description") or "",
                "namespace": namespace,
                "created_at": _now(),
                "storage_state": "AVAILABLE",
            }
            return copy.deepcopy(self.experiments[experiment_id])
        if method == "GET" and not rest:
            self.calls.append("ListExperiments")
            namespace = self._namespace(query.get("namespace"))
            self._authorize(namespace, "list", "experiments", "An experiment")
            found = [e for e in self.experiments.values() if e["namespace"] == namespace]
            return _page("experiments", _filtered(found, query))
        if method == "GET" and rest[0] in self.experiments:
            self._authorize(self.experiments[rest[0]]["namespace"], "get", "experiments", "An experiment")
            return copy.deepcopy(self.experiments[rest[0]])
        raise KfpError(404, f"Experiment {'/'.join(rest)} not found")

    # ------------------------------------------------------------------ runs
    def _runs(self, method: str, rest: list[str], query: dict, raw: bytes) -> dict:
        if method == "POST" and not rest:
            self.calls.append("CreateRun")
            return self._create_run(json.loads(raw or b"{}"))
        if method == "GET" and not rest:
            self.calls.append("ListRuns")
            self._authorize(_listed(query, self), "list", "runs", "A run")
            runs = [self._shown_run(j, details=False) for j in self.jobs.values() if _in(j.resource, query, self)]
            runs.sort(key=lambda r: r["created_at"], reverse=query.get("sort_by", "created_at desc").endswith("desc"))
            return _page("runs", _filtered(runs, query))
        run_id, _, verb = rest[0].partition(":")
        if run_id not in self.jobs:
            raise KfpError(404, f"Run {run_id} not found")
        job = self.jobs[run_id]
        self._authorize(job.resource["namespace"], "get" if method == "GET" else verb, "runs", "A run")
        if method == "GET" and not verb:
            self.calls.append("GetRun")
            return self._shown_run(job)
        if method == "POST" and verb == "terminate":
            self.calls.append("TerminateRun")
            self._terminate_run(job)
            return {}
        raise KfpError(404, f"Not Found: {method} runs/{rest[0]}")

    def _create_run(
        self, body: dict, recurring: str = "", scheduled: str = "", run_id: str = "", workflow: str = ""
    ) -> dict:
        spec = self._run_spec(body)
        experiment = self.experiments.get(body.get("experiment_id") or "")
        if body.get("experiment_id") and experiment is None:
            raise KfpError(404, f"Failed to create a run: experiment {body['experiment_id']} not found")
        if not recurring:  # a recurring run's runs are the controller's, authorized when the recurring run was made
            self._authorize(experiment["namespace"] if experiment else "", "create", "runs", "A run")
        runtime = body.get("runtime_config") or {}
        root = runtime.get("pipeline_root") or spec.get("defaultPipelineRoot", "")
        if not root.startswith("gs://"):  # this emulator keeps artifacts in the storage emulator alone
            raise KfpError(501, f"emulator: the pipeline root must be gs://, got {root!r}")
        parameters = _parameters(spec, runtime.get("parameters") or {})
        run_id = run_id or str(uuid.uuid4())
        name = spec.get("pipelineInfo", {}).get("name", "pipeline")
        resource = {
            "run_id": run_id,
            "display_name": body.get("display_name") or name,
            "experiment_id": experiment["experiment_id"] if experiment else "",
            "namespace": experiment["namespace"] if experiment else "",
            "pipeline_version_reference": body.get("pipeline_version_reference"),
            "runtime_config": {"parameters": runtime.get("parameters") or {}, "pipeline_root": root},
            "service_account": body.get("service_account") or "pipeline-runner",
            "created_at": _now(),
            "scheduled_at": scheduled or _now(),
            "state": "PENDING",
            "recurring_run_id": recurring,
            # the run's Argo Workflow: a generateName's five random letters and digits after the pipeline's name
            "workflow": workflow or f"{name}-{_generated()}",
        }
        self.jobs[run_id] = Job(resource, spec, parameters, root.rstrip("/"), scheduled=scheduled)
        threading.Thread(target=self._run, args=(run_id,), daemon=True).start()
        return self._shown_run(self.jobs[run_id])

    def _run_spec(self, body: dict) -> dict:
        reference = body.get("pipeline_version_reference") or {}
        if body.get("pipeline_spec"):
            return copy.deepcopy(body["pipeline_spec"])
        version = self.versions.get(reference.get("pipeline_version_id") or "")
        if version is None or version["pipeline_id"] != reference.get("pipeline_id"):
            raise KfpError(404, f"Failed to create a run: pipeline version {reference or 'none'} not found")
        return copy.deepcopy(version["pipeline_spec"])

    def _terminate_run(self, job: Job) -> None:
        if job.resource["state"] in TERMINAL:
            raise KfpError(400, f"Failed to terminate run {job.resource['run_id']}: it has ended")
        self._set(job, state="CANCELING")
        job.cancelled.set()
        job.cancels.append((job.resource["state"], list(job.running.values())))
        for proc, shown in list(job.running.items()):
            self._terminate(proc, shown)

    def _shown_run(self, job: Job, details: bool = True) -> dict:
        """The V2beta1Run: the task details in V2beta1PipelineTaskDetail's fields and V2beta1RuntimeState's states
        (a task not started after a stop is CANCELED; one whose condition did not hold SKIPPED)."""
        shown = {k: copy.deepcopy(v) for k, v in job.resource.items() if k not in ("workflow", "namespace")}
        if details:
            states = {"CANCELLED": "CANCELED", "NOT_TRIGGERED": "SKIPPED"}
            shown["run_details"] = {
                "task_details": [
                    {
                        "run_id": job.resource["run_id"],
                        "task_id": t["taskId"],
                        "display_name": t["taskName"],
                        "create_time": t["createTime"],
                        "start_time": t["startTime"],
                        "end_time": t.get("endTime"),
                        "state": states.get(t["state"], t["state"]),
                        "parent_task_id": t.get("parentTaskId"),
                        **({"error": t["error"]} if t.get("error") else {}),
                    }
                    for t in job.tasks
                ]
            }
        return shown

    # ------------------------------------------------------------------ recurring runs
    def _recurring_runs(self, method: str, rest: list[str], query: dict, raw: bytes) -> dict:
        if method == "POST" and not rest:
            self.calls.append("CreateRecurringRun")
            return self._create_recurring(json.loads(raw or b"{}"))
        if method == "GET" and not rest:
            self.calls.append("ListRecurringRuns")
            self._authorize(_listed(query, self), "list", "jobs", "Recurring run")
            found = [copy.deepcopy(r.resource) for r in self.recurring.values() if _in(r.resource, query, self)]
            return _page("recurringRuns", _filtered(found, query))
        recurring_id, _, verb = rest[0].partition(":")
        if recurring_id not in self.recurring:
            raise KfpError(404, f"Recurring run {recurring_id} not found")
        recurring = self.recurring[recurring_id]
        verb = {"GET": "get", "DELETE": "delete"}.get(method, verb)
        self._authorize(recurring.resource["namespace"], verb, "jobs", "Recurring run")
        if method == "GET":
            return copy.deepcopy(recurring.resource)
        if method == "DELETE":
            self.calls.append("DeleteRecurringRun")
            del self.recurring[recurring_id]
            return {}
        if method == "POST" and verb in ("enable", "disable"):
            self.calls.append(f"{verb.title()}RecurringRun")
            recurring.resource["status"] = "ENABLED" if verb == "enable" else "DISABLED"
            return {}
        raise KfpError(404, f"Not Found: {method} recurringruns/{rest[0]}")

    def _create_recurring(self, body: dict) -> dict:
        cron = (body.get("trigger") or {}).get("cron_schedule", {}).get("cron", "")
        fields = cron.split()
        # robfig/cron's format with seconds (the create_recurring_run docstring's link); this emulator fires on whole
        # minutes, so it takes a seconds field of 0 and the five fields after it as a 5-field cron.
        if len(fields) != 6:
            raise KfpError(400, f"Invalid input error: the cron {cron!r} does not have 6 fields")
        if fields[0] != "0" or "?" in fields:
            raise KfpError(501, f"emulator: the cron {cron!r} fires off the minute or uses '?': not emulated")
        try:
            _cron_matches(" ".join(fields[1:]), self.clock)
        except Exception:  # noqa: BLE001 - any parse failure is the server's invalid input
            raise KfpError(400, f"Invalid input error: the cron {cron!r} cannot be parsed") from None
        experiment = self.experiments.get(body.get("experiment_id") or "")
        if experiment is None:
            raise KfpError(404, f"Failed to create a recurring run: experiment {body.get('experiment_id')} not found")
        self._authorize(experiment["namespace"], "create", "jobs", "Recurring run")
        if not 1 <= int(body.get("max_concurrency") or 0) <= 10:  # "Range [1-10]", its field docs
            raise KfpError(400, f"Invalid input error: max_concurrency {body.get('max_concurrency')} is not in [1, 10]")
        spec = self._run_spec(body)
        _parameters(spec, (body.get("runtime_config") or {}).get("parameters") or {})
        recurring_id = str(uuid.uuid4())
        resource = copy.deepcopy(body) | {
            "recurring_run_id": recurring_id,
            "namespace": experiment["namespace"],
            "status": "ENABLED" if body.get("mode", "ENABLE") == "ENABLE" else "DISABLED",
            "created_at": _now(),
            "updated_at": _now(),
            "max_concurrency": str(body.get("max_concurrency") or 1),
        }
        self.recurring[recurring_id] = Recurring(resource, spec, _swf_name(body.get("display_name") or ""))
        return copy.deepcopy(resource)

    def _due(self, recurring: Recurring) -> bool:
        schedule = recurring.resource["trigger"]["cron_schedule"]
        starts, ends = (
            datetime.fromisoformat(schedule[k].replace("Z", "+00:00")) if schedule.get(k) else None
            for k in ("start_time", "end_time")
        )
        if (starts and self.clock < starts) or (ends and self.clock > ends):
            return False
        return _cron_matches(" ".join(schedule["cron"].split()[1:]), self.clock)

    def _fire(self, recurring: Recurring) -> str:
        r = recurring.resource
        with self._lock:
            active = [run for run in recurring.runs if self.jobs[run].resource["state"] not in TERMINAL]
            if len(active) >= int(r["max_concurrency"]):
                recurring.skipped += 1
                return ""
            run_id = str(uuid.uuid4())
            # A v2 pipeline pinned to a version: the recurring run embeds the compiled workflow (CreateJob in
            # backend/src/apiserver/resource/resource_manager.go), and the controller formats the macros
            # ([[RunUUID]], [[ScheduledTime]], ...) only in the workflow's spec.arguments.parameters
            # (FormatWorkflowParameters in NewWorkflow, backend/src/crd/controller/scheduledworkflow/util/
            # scheduled_workflow.go), while the pipeline's parameters travel in the root driver's runtime-config
            # input (paramRuntimeConfig, backend/src/v2/compiler/argocompiler/argo.go): they reach the tasks as
            # given, macros unsubstituted (kubeflow/pipelines#12494, open at 2.17.0).
            runtime = copy.deepcopy(r.get("runtime_config") or {})
            recurring.index += 1
            workflow = _workflow_name(recurring.name, recurring.index)
            body = {
                # A recurring run's run is named and displayed as its workflow (DisplayName and K8SName are the
                # workflow's name: ReportWorkflowResource in backend/src/apiserver/resource/resource_manager.go).
                "display_name": workflow,
                "experiment_id": r["experiment_id"],
                "pipeline_spec": recurring.spec,
                "runtime_config": runtime,
                "service_account": r.get("service_account"),
            }
            scheduled = self.clock.strftime("%Y-%m-%dT%H:%M:%SZ")
            run = self._create_run(body, r["recurring_run_id"], scheduled, run_id, workflow)
            recurring.runs.append(run["run_id"])
        return run["run_id"]


def _stored_spec(spec: dict) -> dict:
    """A pipeline spec as the server keeps and returns it: parsed into the PipelineSpec proto and written back with
    protojson (``NewV2SpecTemplate`` and ``V2Spec.Bytes``, backend/src/apiserver/template/v2_template.go at 2.15.0
    and 2.17.0), then read into a ``google.protobuf.Struct`` (``YamlStringToPipelineSpecStruct``,
    backend/src/apiserver/server/api_util.go): fields at their default value are left out, and a whole number in a
    Struct is written without a fraction, as Go's protojson writes a double."""
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    try:
        message = json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    except json_format.ParseError as exc:
        raise KfpError(400, f"Failed to create a pipeline: invalid pipeline spec: {exc}") from None

    def whole(value):
        if isinstance(value, dict):
            return {k: whole(v) for k, v in value.items()}
        if isinstance(value, list):
            return [whole(v) for v in value]
        return int(value) if isinstance(value, float) and value.is_integer() else value

    return whole(json_format.MessageToDict(message))


def _parameters(spec: dict, given: dict) -> dict:
    """The run's parameters against the spec's root inputs (``pipeline_runner.resolve_parameters``)."""

    def refuse(why: str, key: str, kind: str) -> KfpError:
        return KfpError(
            400,
            f"Invalid input error: parameter {key!r} "
            + {
                "unknown": "is not an input of the pipeline",
                "type": f"is not a {kind}",
                "required": "is required",
            }[why],
        )

    return resolve_parameters(spec, given, refuse)


def _filtered(items: list[dict], query: dict) -> list[dict]:
    """``items`` matching the query's ``filter`` (api.Filter JSON: EQUALS predicates on FILTER_KEYS, ANDed)."""
    if not query.get("filter"):
        return items
    predicates = json.loads(query["filter"]).get("predicates", [])
    for p in predicates:
        if p.get("operation") not in EQUALS or p.get("key") not in FILTER_KEYS:
            raise KfpError(501, f"emulator: cannot read the filter predicate {p}")
    value = lambda p: p.get("string_value", p.get("stringValue"))  # noqa: E731 - the predicate's string, either case
    return [i for i in items if all(i.get(p["key"]) == value(p) for p in predicates)]


def _listed(query: dict, server: KfpEmulator) -> str:
    """The namespace a list of runs or recurring runs is of: its experiment's, else the one it names."""
    experiment = server.experiments.get(query.get("experiment_id") or "")
    return experiment["namespace"] if experiment else server._namespace(query.get("namespace"))


def _in(resource: dict, query: dict, server: KfpEmulator) -> bool:
    """Whether a run or recurring run is among those a list asks for: of its experiment (``experiment_id``), else of
    its namespace (``namespace``, when given)."""
    if query.get("experiment_id"):
        return resource.get("experiment_id") == query["experiment_id"]
    return "namespace" not in query or resource.get("namespace", "") == server._namespace(query["namespace"])


def _page(key: str, items: list[dict]) -> dict:
    return {key: items, "total_size": len(items)} if items else {"total_size": 0}
