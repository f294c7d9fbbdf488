"""An in-process Cloud Build: the real ``google.devtools.cloudbuild.v1.CloudBuild`` gRPC service's CreateBuild,
GetBuild, ListBuilds and CancelBuild, and ``google.longrunning.Operations.GetOperation`` for the operations
CreateBuild answers, served from the messages google-cloud-build ships (its gRPC transport names the methods; the
messages serialise themselves), so ``CloudBuildClient`` talks real gRPC to it.

A build is checked as Cloud Build checks it: a project (``project_id``, or the one in ``parent``), at least one step,
a name for every step, unique step ids that ``wait_for`` refers to, substitutions (user keys ``_[A-Z0-9_]+``; every
``$KEY`` or ``${KEY}`` in the build, ``script`` aside, a built-in or a given key, and every given key used, unless
``options.substitution_option`` is ALLOW_LOOSE), ``images`` in Artifact Registry
(``LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE[:TAG]``) or Container Registry (``[REGION.]gcr.io/PROJECT/IMAGE
[:TAG]``) once substituted, tags (``^[\\w][\\w.-]{0,127}$``), a timeout of at most 24 hours, and a
``source.storage_source`` that names a bucket and an object, which must exist in the Cloud Storage emulator given to
the service, when there is one (Cloud Build resolves the source when the build is created), and a ``service_account``,
when there is one, of the form ``projects/{PROJECT_ID}/serviceAccounts/{ACCOUNT}`` with the build's logs in a bucket it
names or in Cloud Logging only (or nowhere): a build with a user-specified service account cannot use the default logs
bucket (https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts). With an
Artifact Registry emulator given, a build whose steps succeed fails at the push when an image's repository does not
exist. A build that does not pass is INVALID_ARGUMENT, with a message that names the field.

A build is created QUEUED, with the fields Cloud Build fills in (id, name, create_time, log_url, logs_bucket, the
default timeout and queue_ttl, the resolved source's generation), and progresses as it is polled (each GetBuild of
it, and each GetOperation of its operation): WORKING (start_time, steps WORKING) at the first poll, SUCCESS at the
``polls_to_done``-th (finish_time, steps SUCCESS, ``results.images`` with a digest for each of ``images``). Its
operation (``projects/P/locations/L/operations/UUID``) carries ``BuildOperationMetadata(build=...)`` from the start,
and is done once the build is finished: with the build as its response, or with Cloud Build's error for a build that
failed or was cancelled.

Faults: ``fail`` makes the next N matching calls of a method answer a gRPC status (UNAVAILABLE, ...), before the call
takes effect; ``lose_reply`` answers one after the call took effect (a CreateBuild whose build started, its reply
lost); ``build_fails`` makes the next N builds that match end in FAILURE at a step, with the status_detail and
failure_info Cloud Build reports when a step exits non-zero.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import grpc
from google.cloud.devtools import cloudbuild_v1 as cb
from google.longrunning import operations_pb2
from google.rpc import code_pb2

from tests.emulators import GrpcEmulator, serve_grpc, take_fault

SERVICE = "google.devtools.cloudbuild.v1.CloudBuild"
OPERATIONS = "google.longrunning.Operations"
Status = cb.Build.Status
FINISHED = {Status.SUCCESS, Status.FAILURE, Status.INTERNAL_ERROR, Status.TIMEOUT, Status.CANCELLED, Status.EXPIRED}
PARENT = re.compile(r"projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)")
BUILD_NAME = re.compile(r"projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/builds/(?P<id>[^/]+)")
OPERATION_NAME = re.compile(r"projects/[^/]+/locations/[^/]+/operations/[^/]+")
_PATH = r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+"  # an image's path: components of lowercase letters and digits
_TAG = r"[\w][\w.-]{0,127}"
_PROJECT = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
IMAGE = re.compile(
    rf"(?:[a-z][a-z0-9-]*-docker\.pkg\.dev/{_PROJECT}/[a-z](?:[a-z0-9-]{{0,61}}[a-z0-9])?"
    rf"|(?:(?:us|eu|asia)\.)?gcr\.io/{_PROJECT}){_PATH}(?::{_TAG})?"
)
TAG = re.compile(_TAG)
# Build.service_account: "projects/{PROJECT_ID}/serviceAccounts/{ACCOUNT}", ACCOUNT "can be email address or uniqueId
# of the service account" (google/cloud/devtools/cloudbuild_v1/types/cloudbuild.py)
SERVICE_ACCOUNT = re.compile(
    rf"projects/{_PROJECT}/serviceAccounts/(?:[a-z0-9-]+@[a-z0-9.-]+\.gserviceaccount\.com|\d+)"
)
Logging = cb.BuildOptions.LoggingMode
DefaultLogsBucket = cb.BuildOptions.DefaultLogsBucketBehavior
SUBSTITUTION_KEY = re.compile(r"_[A-Z0-9_]+")
TEMPLATE = re.compile(r"\$(?:\$|\{(?P<braced>[A-Z_][A-Z0-9_]*)\}|(?P<bare>[A-Z_][A-Z0-9_]*))")
# built-in substitutions a build from source in Cloud Storage leaves empty (they describe a repository or a trigger);
# a build may set them itself
REPOSITORY_SUBSTITUTIONS = {
    "REPO_NAME",
    "REPO_FULL_NAME",
    "BRANCH_NAME",
    "TAG_NAME",
    "REF_NAME",
    "COMMIT_SHA",
    "SHORT_SHA",
    "REVISION_ID",
    "TRIGGER_NAME",
    "TRIGGER_BUILD_CONFIG_PATH",
}
FILTER_CLAUSE = re.compile(r'(?P<field>\w+)\s*=\s*(?:"(?P<quoted>[^"]*)"|(?P<bare>[^\s"]+))')
FILTER_FIELDS = {
    "tags": lambda b: list(b.tags),
    "status": lambda b: [Status(b.status).name],
    "build_id": lambda b: [b.id],
    "id": lambda b: [b.id],
    "images": lambda b: list(b.images),
    "trigger_id": lambda b: [b.build_trigger_id],
}
MAX_TIMEOUT = timedelta(hours=24)
DEFAULT_TIMEOUT = timedelta(minutes=10)
DEFAULT_QUEUE_TTL = timedelta(hours=1)
# a finished build's operation error: (code, message) by status
OPERATION_ERRORS = {
    Status.FAILURE: (code_pb2.UNKNOWN, "Build failed; check build logs for details"),
    Status.CANCELLED: (code_pb2.CANCELLED, "Build was cancelled"),
    Status.TIMEOUT: (code_pb2.DEADLINE_EXCEEDED, "Build timeout"),
    Status.INTERNAL_ERROR: (code_pb2.INTERNAL, "Build failed with an internal error"),
    Status.EXPIRED: (code_pb2.DEADLINE_EXCEEDED, "Build expired in the queue"),
}
DOCKER_REGISTRY = re.compile(r"[a-z0-9-]+-docker\.pkg\.dev/")
STEP_FAILURE = 'Build step {step} "{name}" failed: step exited with non-zero status: 1'


@dataclass
class Fault:
    method: str
    code: grpc.StatusCode | None  # None: a build failure (the create call succeeds, the build fails)
    message: str
    times: int = 1
    when: Callable[[object], bool] = lambda request: True
    step: int = 0  # a build failure's failing step
    lost: bool = False  # the call takes effect, then answers ``code`` (its reply lost: ``GrpcEmulator``)


@dataclass
class _Progress:
    location: str
    operation: str
    images: list[str]  # the build's images, substituted: what it pushes
    order: int  # creation order, for builds created in the same instant
    polls: int = 0
    failing_step: int | None = None


@dataclass
class State:
    builds: dict[str, cb.Build] = field(default_factory=dict)  # build id -> build
    operations: dict[str, str] = field(default_factory=dict)  # operation name -> build id
    calls: list[str] = field(default_factory=list)  # method names, in order


def _digest(*parts: str) -> str:
    return "sha256:" + hashlib.sha256("/".join(parts).encode()).hexdigest()


def _step_digest(image: str) -> str:
    """What a step's image resolves to: the digest it names (``NAME@sha256:HEX``), else whatever its tag names now."""
    return image.rsplit("@", 1)[1] if "@sha256:" in image else _digest(image)


class CloudBuildEmulator(GrpcEmulator):
    """The service; ``start()`` serves it on 127.0.0.1 (plaintext) and returns ``127.0.0.1:PORT``."""

    def __init__(self, storage=None, polls_to_done: int = 2, registry=None):
        self.registry = registry  # tests.emulators.artifactregistry: pushes need the image's repository
        # The project's Cloud Storage (tests.emulators.storage), when there is one: a build's source object must exist
        # there, and its project numbers are those of the projects it knows.
        self.storage = storage
        self.polls_to_done = polls_to_done
        self.state = State()
        self.faults: list[Fault] = []
        self._progress: dict[str, _Progress] = {}  # build id -> how it progresses
        self._lock = threading.RLock()
        self._order = itertools.count()
        self._server = None
        self.address = ""

    # ------------------------------------------------------------------ faults and inspection
    def fail(
        self,
        method: str,
        code: grpc.StatusCode,
        message: str = "",
        times: int = 1,
        when: Callable[[object], bool] = lambda request: True,
    ) -> None:
        """The next ``times`` calls of ``method`` ("CreateBuild", "GetBuild", "ListBuilds", "CancelBuild",
        "GetOperation") whose request matches ``when`` answer ``code``."""
        self.faults.append(Fault(method, code, message or f"injected {code.name}", times, when))

    def lose_reply(
        self,
        method: str,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        times: int = 1,
        when: Callable[[object], bool] = lambda request: True,
    ) -> None:
        """The next ``times`` calls of ``method`` whose request matches ``when`` take effect (a CreateBuild starts its
        build), and the client gets ``code`` instead of the answer: the reply lost on the way (``GrpcEmulator``)."""
        self.faults.append(Fault(method, code, f"injected {code.name}: the reply was lost", times, when, lost=True))

    def build_fails(self, when: Callable[[cb.Build], bool] = lambda build: True, times: int = 1, step: int = 0) -> None:
        """The next ``times`` builds created that match ``when`` (given the new build) end in FAILURE at ``step``
        (the last step when there are fewer)."""
        self.faults.append(Fault("build", None, STEP_FAILURE, times, when, step))

    def builds_tagged(self, tag: str) -> list[str]:
        with self._lock:
            return [build_id for build_id, build in self.state.builds.items() if tag in build.tags]

    # ------------------------------------------------------------------ serving
    def start(self) -> str:
        handlers = {
            "CreateBuild": (
                cb.CreateBuildRequest.deserialize,
                operations_pb2.Operation.SerializeToString,
                self.create_build,
            ),
            "GetBuild": (cb.GetBuildRequest.deserialize, cb.Build.serialize, self.get_build),
            "ListBuilds": (cb.ListBuildsRequest.deserialize, cb.ListBuildsResponse.serialize, self.list_builds),
            "CancelBuild": (cb.CancelBuildRequest.deserialize, cb.Build.serialize, self.cancel_build),
        }
        operations = {
            "GetOperation": (
                operations_pb2.GetOperationRequest.FromString,
                operations_pb2.Operation.SerializeToString,
                self.get_operation,
            )
        }
        self._server, self.address = serve_grpc(
            {
                SERVICE: {name: (de, ser, self._wrap(name, fn)) for name, (de, ser, fn) in handlers.items()},
                OPERATIONS: {name: (de, ser, self._wrap(name, fn)) for name, (de, ser, fn) in operations.items()},
            }
        )
        return self.address

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _invalid(context, message: str):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    def _project_location(self, parent: str, project_id: str, context) -> tuple[str, str]:
        """The project and location a request is for: ``parent``'s, else ``project_id`` in "global"."""
        if parent:
            m = PARENT.fullmatch(parent)
            if not m:
                self._invalid(
                    context, f"invalid value for 'parent': {parent!r} is not projects/PROJECT/locations/LOCATION"
                )
            if project_id and project_id != m["project"]:
                self._invalid(
                    context, f"invalid value for 'project_id': {project_id!r} is not the project of parent {parent!r}"
                )
            return m["project"], m["location"]
        if not project_id:
            self._invalid(context, "invalid value for 'project_id': a project is required (project_id or parent)")
        return project_id, "global"

    def _substitutions(self, build: cb.Build, project: str, location: str, context) -> dict[str, str]:
        """The values of the build's substitutions (built-in and given), once checked as Cloud Build checks them."""
        given = dict(build.substitutions)
        for key in given:
            if not SUBSTITUTION_KEY.fullmatch(key) and key not in REPOSITORY_SUBSTITUTIONS:
                self._invalid(
                    context,
                    f"invalid value for 'build.substitutions': key {key!r} must begin with an "
                    "underscore and have only uppercase letters, digits and underscores "
                    "(^_[A-Z0-9_]+$), or be an overridable built-in substitution",
                )
        number = (getattr(self.storage, "projects", None) or {}).get(project, "")
        values = {
            **dict.fromkeys(REPOSITORY_SUBSTITUTIONS, ""),
            "PROJECT_ID": project,
            "PROJECT_NUMBER": number,
            "BUILD_ID": build.id,
            "LOCATION": location,
            **given,
        }
        loose = build.options.substitution_option == cb.BuildOptions.SubstitutionOption.ALLOW_LOOSE
        template = cb.Build(build)
        del template.substitutions
        for step in template.steps:  # a script is not substituted (options.automap_substitutions aside)
            del step.script
        used = set()
        for m in TEMPLATE.finditer(cb.Build.to_json(template)):
            key = m["braced"] or m["bare"]
            if key is None:  # "$$": a literal "$"
                continue
            used.add(key)
            if key not in values and not loose:
                self._invalid(
                    context,
                    f"invalid value for 'build.substitutions': key in the template \"{key}\" is "
                    + (
                        "not matched in the substitution data"
                        if key.startswith("_")
                        else "not a valid built-in substitution"
                    ),
                )
        unused = sorted(set(given) - used)
        if unused and not loose:
            self._invalid(
                context,
                f"invalid value for 'build.substitutions': key \"{unused[0]}\" in the substitution "
                "data is not matched in the template",
            )
        return values

    def _check_service_account(self, build: cb.Build, context) -> None:
        """A build that names its service account names it as ``projects/{PROJECT_ID}/serviceAccounts/{ACCOUNT}``
        (``Build.service_account``'s field docs, google/cloud/devtools/cloudbuild_v1/types/cloudbuild.py), and, as
        one with "your own service account" must store its logs "either in Cloud Logging or in a user-created Cloud
        Storage bucket" (https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts),
        it names ``logs_bucket``, a regional user-owned logs bucket, or logging CLOUD_LOGGING_ONLY or NONE."""
        if not build.service_account:
            return
        if not SERVICE_ACCOUNT.fullmatch(build.service_account):
            self._invalid(
                context,
                f"invalid value for 'build.service_account': {build.service_account!r} is not "
                "projects/{PROJECT_ID}/serviceAccounts/{ACCOUNT}",
            )
        options = build.options
        if not (
            build.logs_bucket
            or options.default_logs_bucket_behavior == DefaultLogsBucket.REGIONAL_USER_OWNED_BUCKET
            or options.logging in (Logging.CLOUD_LOGGING_ONLY, Logging.NONE)
        ):
            self._invalid(
                context,
                "if 'build.service_account' is specified, the build must either (a) specify 'build.logs_bucket', "
                "(b) use the REGIONAL_USER_OWNED_BUCKET build.options.default_logs_bucket_behavior option, or (c) "
                "use either CLOUD_LOGGING_ONLY / NONE logging options",
            )

    def _check(self, build: cb.Build, project: str, location: str, context) -> list[str]:
        """Checks a build as Cloud Build does; its images, substituted."""
        if not build.steps:
            self._invalid(context, "invalid value for 'build.steps': a build must have at least one step")
        ids = set()
        for i, step in enumerate(build.steps):
            if not step.name:
                self._invalid(context, f"invalid value for 'build.steps[{i}].name': a step must name the image it runs")
            if step.id and step.id in ids:
                self._invalid(context, f"invalid value for 'build.steps[{i}].id': duplicate step id {step.id!r}")
            for waited in step.wait_for:
                if waited != "-" and waited not in ids:
                    self._invalid(
                        context, f"invalid value for 'build.steps[{i}].wait_for': no earlier step has id {waited!r}"
                    )
            if step.id:
                ids.add(step.id)
        self._check_service_account(build, context)
        values = self._substitutions(build, project, location, context)
        images = [
            TEMPLATE.sub(lambda m: values.get(m["braced"] or m["bare"], "") if m[0] != "$$" else "$", image)
            for image in build.images
        ]
        for i, image in enumerate(images):
            if not IMAGE.fullmatch(image):
                self._invalid(
                    context,
                    f"invalid value for 'build.images[{i}]': invalid image name {image!r}: not "
                    "LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE[:TAG] or "
                    "[REGION.]gcr.io/PROJECT/IMAGE[:TAG]",
                )
        for tag in build.tags:
            if not TAG.fullmatch(tag):
                self._invalid(
                    context,
                    f"invalid value for 'build.tags': invalid build tag {tag!r}: must match format "
                    r'"^[\w][\w.-]{0,127}$"',
                )
        if build.timeout < timedelta(0) or build.timeout > MAX_TIMEOUT:
            self._invalid(
                context,
                f"invalid value for 'build.timeout': {build.timeout.total_seconds():.0f}s is not "
                f"between 0s and {MAX_TIMEOUT.total_seconds():.0f}s",
            )
        if "storage_source" in build.source:
            source = build.source.storage_source
            if not source.bucket or not source.object_:
                self._invalid(
                    context, "invalid value for 'build.source.storage_source': a bucket and an object are required"
                )
            if self.storage is not None:
                stored = self.storage.object(source.bucket, source.object_)
                if stored is None or source.generation and str(source.generation) != stored["generation"]:
                    self._invalid(
                        context,
                        "could not resolve source: googleapi: Error 404: No such object: "
                        f"{source.bucket}/{source.object_}, notFound",
                    )
                build.source_provenance.resolved_storage_source = cb.StorageSource(
                    bucket=source.bucket, object_=source.object_, generation=int(stored["generation"])
                )
        return images

    # ------------------------------------------------------------------ builds
    def _operation(self, build_id: str) -> operations_pb2.Operation:
        """The build's operation as it stands: its metadata the build; done with the build, or Cloud Build's error,
        once the build is finished."""
        build, progress = self.state.builds[build_id], self._progress[build_id]
        op = operations_pb2.Operation(name=progress.operation)
        op.metadata.Pack(cb.BuildOperationMetadata.pb(cb.BuildOperationMetadata(build=build)))
        if build.status in FINISHED:
            op.done = True
            if build.status == Status.SUCCESS:
                op.response.Pack(cb.Build.pb(build))
            else:
                op.error.code, op.error.message = OPERATION_ERRORS[Status(build.status)]
        return op

    def create_build(self, request: cb.CreateBuildRequest, context) -> operations_pb2.Operation:
        project, location = self._project_location(request.parent, request.project_id, context)
        build = cb.Build(request.build)
        for output in (
            "name",
            "status",
            "status_detail",
            "results",
            "start_time",
            "finish_time",
            "log_url",
            "source_provenance",
            "timing",
            "warnings",
            "failure_info",
            "approval",
        ):
            delattr(build, output)
        for step in build.steps:
            for output in ("status", "timing", "pull_timing", "exit_code"):
                delattr(step, output)
        build.id = str(uuid.uuid4())
        images = self._check(build, project, location, context)
        now = datetime.now(UTC)
        number = (getattr(self.storage, "projects", None) or {}).get(project) or project
        build.project_id = project
        build.name = f"projects/{project}/locations/{location}/builds/{build.id}"
        build.status = Status.QUEUED
        build.create_time = now
        build.timeout = build.timeout or DEFAULT_TIMEOUT
        build.queue_ttl = build.queue_ttl or DEFAULT_QUEUE_TTL
        build.log_url = (
            f"https://console.cloud.google.com/cloud-build/builds;region={location}/{build.id}?project={number}"
        )
        if not build.service_account:  # a user-specified service account's logs never go to the default bucket
            build.logs_bucket = build.logs_bucket or f"gs://{number}.cloudbuild-logs.googleusercontent.com"
        for step in build.steps:
            step.status = Status.QUEUED
        operation = f"projects/{project}/locations/{location}/operations/{uuid.uuid4()}"
        failure = take_fault(self.faults, self._lock, "build", build)
        self.state.builds[build.id] = build
        self.state.operations[operation] = build.id
        self._progress[build.id] = _Progress(
            location,
            operation,
            images,
            next(self._order),
            failing_step=min(failure.step, len(build.steps) - 1) if failure else None,
        )
        return self._operation(build.id)

    def _find(self, name: str, project_id: str, build_id: str, context) -> cb.Build:
        """The build ``name`` (projects/P/locations/L/builds/ID) or ``project_id`` and ``build_id`` (a global one)
        names."""
        if name:
            m = BUILD_NAME.fullmatch(name)
            if not m:
                self._invalid(
                    context, f"invalid value for 'name': {name!r} is not projects/PROJECT/locations/LOCATION/builds/ID"
                )
            project_id, location, build_id = m["project"], m["location"], m["id"]
        else:
            if not project_id or not build_id:
                self._invalid(context, "invalid value for 'id': a build is named by name, or by project_id and id")
            location = "global"
        build = self.state.builds.get(build_id)
        if build is None or build.project_id != project_id or self._progress[build_id].location != location:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"Requested entity was not found: build {build_id} in project {project_id} ({location}).",
            )
        return build

    def _refused_push(self, build, images) -> str | None:
        """Why the registry refuses to take one of the build's images (an immutable tag moved), or None."""
        if self.registry is None:
            return None
        return next((why for i in images if (why := self.registry.refused_push(i, _digest(build.id, i)))), None)

    def _poll(self, build: cb.Build) -> None:
        """One poll of the build: it starts at the first, and finishes at the ``polls_to_done``-th."""
        if build.status in FINISHED:
            return
        progress = self._progress[build.id]
        progress.polls += 1
        now = datetime.now(UTC)
        if build.status == Status.QUEUED:
            build.status = Status.WORKING
            build.start_time = now
            for step in build.steps:
                step.status = Status.WORKING
                step.timing = cb.TimeSpan(start_time=now)
        if progress.polls < self.polls_to_done:
            return
        failing = progress.failing_step
        for i, step in enumerate(build.steps):
            if failing is None or i < failing:
                step.status = Status.SUCCESS
            elif i == failing:
                step.status, step.exit_code = Status.FAILURE, 1
            else:
                step.status = Status.CANCELLED
            step.timing.end_time = now
        unpushable = [
            image
            for image in progress.images
            if self.registry is not None
            and DOCKER_REGISTRY.match(image)
            and self.registry.repository_for(image) is None
        ]
        if failing is None and unpushable:  # every step ran; the push needs the Artifact Registry repository
            build.status = Status.FAILURE
            build.status_detail = f"failed to push {unpushable[0]}: name unknown: the repository does not exist"
            build.failure_info = cb.Build.FailureInfo(
                type_=cb.Build.FailureInfo.FailureType.PUSH_FAILED, detail=build.status_detail
            )
        elif failing is None and (refused := self._refused_push(build, progress.images)):
            build.status = Status.FAILURE
            build.status_detail = f"failed to push: {refused}"
            build.failure_info = cb.Build.FailureInfo(
                type_=cb.Build.FailureInfo.FailureType.PUSH_FAILED, detail=build.status_detail
            )
        elif failing is None:
            build.status = Status.SUCCESS
            for image in progress.images if self.registry is not None else ():
                self.registry.push(image, _digest(build.id, image))
            build.results = cb.Results(
                images=[
                    cb.BuiltImage(
                        name=image,
                        digest=_digest(build.id, image),
                        push_timing=cb.TimeSpan(start_time=now, end_time=now),
                    )
                    for image in progress.images
                ],
                # The digest each step's image resolved to (Results.build_step_images, google/devtools/cloudbuild/v1/
                # cloudbuild.proto): a step named by digest ran exactly that image.
                build_step_images=[_step_digest(step.name) for step in build.steps],
                build_step_outputs=[b"" for _ in build.steps],
            )
        else:
            build.status = Status.FAILURE
            build.status_detail = STEP_FAILURE.format(step=failing, name=build.steps[failing].name)
            build.failure_info = cb.Build.FailureInfo(
                type_=cb.Build.FailureInfo.FailureType.USER_BUILD_STEP, detail=build.status_detail
            )
        build.finish_time = now
        build.timing["BUILD"] = cb.TimeSpan(start_time=build.start_time, end_time=now)

    def get_build(self, request: cb.GetBuildRequest, context) -> cb.Build:
        build = self._find(request.name, request.project_id, request.id, context)
        self._poll(build)
        return cb.Build(build)

    def list_builds(self, request: cb.ListBuildsRequest, context) -> cb.ListBuildsResponse:
        project, location = self._project_location(request.parent, request.project_id, context)
        clauses = []
        text = request.filter.strip()
        for clause in re.split(r"\s+AND\s+", text) if text else []:
            m = FILTER_CLAUSE.fullmatch(clause.strip())
            value = m and (m["quoted"] if m["quoted"] is not None else m["bare"])
            if not m or m["field"] not in FILTER_FIELDS or m["field"] == "status" and value not in Status.__members__:
                self._invalid(
                    context,
                    f"invalid value for 'filter': {request.filter!r}: the emulator filters by "
                    f'{", ".join(sorted(FILTER_FIELDS))} (FIELD="VALUE", joined by AND), with a '
                    "status one of Cloud Build's",
                )
            clauses.append((FILTER_FIELDS[m["field"]], value))
        builds = [
            build
            for build_id, build in self.state.builds.items()
            if build.project_id == project
            and self._progress[build_id].location == location
            and all(value in get(build) for get, value in clauses)
        ]
        builds.sort(key=lambda b: (b.create_time, self._progress[b.id].order), reverse=True)  # newest first
        start = int(request.page_token) if request.page_token.isdigit() else 0
        if request.page_token and not request.page_token.isdigit():
            self._invalid(context, f"invalid value for 'page_token': {request.page_token!r}")
        end = start + request.page_size if request.page_size > 0 else len(builds)
        return cb.ListBuildsResponse(
            builds=[cb.Build(b) for b in builds[start:end]], next_page_token=str(end) if end < len(builds) else ""
        )

    def cancel_build(self, request: cb.CancelBuildRequest, context) -> cb.Build:
        build = self._find(request.name, request.project_id, request.id, context)
        if build.status not in FINISHED:
            now = datetime.now(UTC)
            for step in build.steps:
                if step.status in (Status.QUEUED, Status.WORKING):
                    step.status = Status.CANCELLED
                    if "timing" in step:
                        step.timing.end_time = now
            build.status = Status.CANCELLED
            build.finish_time = now
        return cb.Build(build)

    # ------------------------------------------------------------------ operations
    def get_operation(self, request: operations_pb2.GetOperationRequest, context) -> operations_pb2.Operation:
        build_id = self.state.operations.get(request.name)
        if build_id is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND
                if OPERATION_NAME.fullmatch(request.name)
                else grpc.StatusCode.INVALID_ARGUMENT,
                f"Operation {request.name!r} not found.",
            )
        self._poll(self.state.builds[build_id])
        return self._operation(build_id)
