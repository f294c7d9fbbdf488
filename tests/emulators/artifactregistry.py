"""An in-process Artifact Registry: the real ``google.devtools.artifactregistry.v1.ArtifactRegistry`` gRPC service's
GetRepository, CreateRepository, GetTag, CreateTag and GetIamPolicy, and ``google.longrunning.Operations.GetOperation``
for the operation CreateRepository answers, served from the messages google-cloud-artifact-registry ships, so
``ArtifactRegistryClient`` talks real gRPC to it.

CreateRepository checks what Artifact Registry checks (a parent ``projects/P/locations/L``, a repository id of
lowercase letters, digits and hyphens starting with a letter, a format) and answers an operation that is done after
``polls_to_done`` GetOperation calls, when the repository appears. An existing id is ALREADY_EXISTS, an unknown
repository NOT_FOUND. ``repository_for(image)`` tells the Cloud Build emulator whether an image's Docker repository
exists, as a push needs it to; ``refused_push(image, digest)`` why a push of it fails: a Docker repository with
immutable tags refuses to move a tag that names another image ("The repository which enabled this flag prevents all
tags from being modified, moved or deleted. This does not prevent tags from being created.": the
``DockerRepositoryConfig.immutable_tags`` field of google/devtools/artifactregistry/v1/repository.proto,
https://github.com/googleapis/googleapis).
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass, field

import grpc
from google.cloud import artifactregistry_v1 as ar
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.longrunning import operations_pb2

from tests.emulators import GrpcEmulator, serve_grpc
from tests.emulators.http import HttpEmulator, HttpError
from tests.emulators.tokens import authorized

SERVICE = "google.devtools.artifactregistry.v1.ArtifactRegistry"
OPERATIONS = "google.longrunning.Operations"
PARENT = re.compile(r"projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/locations/[a-z0-9-]+")
REPOSITORY_ID = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")
DOCKER_IMAGE = re.compile(r"(?P<location>[a-z0-9-]+)-docker\.pkg\.dev/(?P<project>[^/]+)/(?P<repo>[^/]+)/.+")


@dataclass
class State:
    repositories: dict[str, ar.Repository] = field(default_factory=dict)  # full name -> repository
    operations: dict[str, list] = field(default_factory=dict)  # name -> [polls left, repository]
    images: dict[str, str] = field(default_factory=dict)  # pushed image reference (with its tag) -> digest
    policies: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # repository -> role -> members
    calls: list[str] = field(default_factory=list)


class ArtifactRegistryEmulator(GrpcEmulator):
    def __init__(self, polls_to_done: int = 2):
        self.state = State()
        self.faults: list = []
        self.polls_to_done = polls_to_done
        self._lock = threading.RLock()
        self.address = ""

    def start(self) -> str:
        self._server, self.address = serve_grpc(
            {
                SERVICE: {
                    "GetRepository": (
                        ar.GetRepositoryRequest.deserialize,
                        ar.Repository.serialize,
                        self._wrap("GetRepository", self.get_repository),
                    ),
                    "GetTag": (ar.GetTagRequest.deserialize, ar.Tag.serialize, self._wrap("GetTag", self.get_tag)),
                    "CreateTag": (
                        ar.CreateTagRequest.deserialize,
                        ar.Tag.serialize,
                        self._wrap("CreateTag", self.create_tag),
                    ),
                    "GetIamPolicy": (
                        iam_policy_pb2.GetIamPolicyRequest.FromString,
                        policy_pb2.Policy.SerializeToString,
                        self._wrap("GetIamPolicy", self.get_iam_policy),
                    ),
                    "CreateRepository": (
                        ar.CreateRepositoryRequest.deserialize,
                        operations_pb2.Operation.SerializeToString,
                        self._wrap("CreateRepository", self.create_repository),
                    ),
                },
                OPERATIONS: {
                    "GetOperation": (
                        operations_pb2.GetOperationRequest.FromString,
                        operations_pb2.Operation.SerializeToString,
                        self._wrap("GetOperation", self.get_operation),
                    )
                },
            }
        )
        return self.address

    def repository_for(self, image: str) -> str | None:
        """The Docker repository an Artifact Registry image would be pushed to, when it exists."""
        m = DOCKER_IMAGE.fullmatch(image)
        if not m:
            return None
        name = f"projects/{m['project']}/locations/{m['location']}/repositories/{m['repo']}"
        with self._lock:
            repo = self.state.repositories.get(name)
        return name if repo is not None and repo.format_ == ar.Repository.Format.DOCKER else None

    def refused_push(self, image: str, digest: str) -> str | None:
        """Why a push of ``image`` (``...:TAG``) as ``digest`` fails, or None: its repository has immutable tags and
        the tag names another digest already (the same image again is no move)."""
        name = self.repository_for(image)
        with self._lock:
            repo = self.state.repositories.get(name or "")
            held = self.state.images.get(image)
        if repo is not None and repo.docker_config.immutable_tags and held not in (None, digest):
            return f"tag {image.rsplit(':', 1)[-1]} is immutable in {name}: it names {held} already"
        return None

    def push(self, image: str, digest: str) -> None:
        """A Docker push (the Cloud Build emulator's, after a build succeeded): ``image`` is ``...:TAG``."""
        with self._lock:
            self.state.images[image] = digest

    def has_image(self, image: str) -> bool:
        """Whether a pull of ``image`` finds it: ``NAME:TAG`` by its tag; ``NAME[:TAG]@DIGEST`` by the digest alone,
        the tag ignored, as Docker and containerd pull a reference that has both (the reference grammar:
        https://github.com/distribution/reference/blob/main/reference.go)."""
        reference, _, digest = image.partition("@")
        with self._lock:
            if not digest:
                return reference in self.state.images
            name = reference.rsplit(":", 1)[0] if ":" in reference.rsplit("/", 1)[-1] else reference
            return any(i.rsplit(":", 1)[0] == name and d == digest for i, d in self.state.images.items())

    def get_tag(self, request: ar.GetTagRequest, context) -> ar.Tag:
        """``projects/P/locations/L/repositories/R/packages/IMAGE/tags/TAG``: the tag of a pushed image."""
        parts = request.name.split("/")
        if len(parts) != 10 or parts[6] != "packages" or parts[8] != "tags":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid tag name {request.name!r}")
        image = f"{parts[3]}-docker.pkg.dev/{parts[1]}/{parts[5]}/{parts[7]}:{parts[9]}"
        with self._lock:
            digest = self.state.images.get(image)
        if digest is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {request.name}")
        return ar.Tag(name=request.name, version=f"{request.name.rsplit('/tags/', 1)[0]}/versions/{digest}")

    def create_tag(self, request: ar.CreateTagRequest, context) -> ar.Tag:
        """``parent`` (``.../packages/IMAGE``), ``tag_id`` and ``tag.version`` (``.../versions/sha256:HEX``: a version
        of that package that was pushed): CreateTagRequest, google/devtools/artifactregistry/v1/tag.proto. A tag that
        exists already is ALREADY_EXISTS, as every standard Create method answers (https://google.aip.dev/133); an
        immutable-tags repository still lets a new tag be created (DockerRepositoryConfig.immutable_tags)."""
        parts = request.parent.split("/")
        if len(parts) != 8 or parts[6] != "packages" or not request.tag_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid tag parent {request.parent!r}")
        name = f"{parts[3]}-docker.pkg.dev/{parts[1]}/{parts[5]}/{parts[7]}"
        digest = request.tag.version.rsplit("/versions/", 1)[-1]
        with self._lock:
            if f"{name}:{request.tag_id}" in self.state.images:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"tag {request.tag_id} already exists")
            if not request.tag.version.startswith(f"{request.parent}/versions/") or not any(
                i.rsplit(":", 1)[0] == name and d == digest for i, d in self.state.images.items()
            ):
                context.abort(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {request.tag.version}")
            self.state.images[f"{name}:{request.tag_id}"] = digest
        return ar.Tag(name=f"{request.parent}/tags/{request.tag_id}", version=request.tag.version)

    def get_repository(self, request: ar.GetRepositoryRequest, context) -> ar.Repository:
        repo = self.state.repositories.get(request.name)
        if repo is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {request.name}.")
        return repo

    def grant(self, repository: str, role: str, member: str) -> None:
        """``role`` to ``member`` on ``repository`` (``projects/P/locations/L/repositories/R``), as
        ``gcloud artifacts repositories add-iam-policy-binding`` does: the test's setup, not a served call."""
        with self._lock:
            self.state.policies.setdefault(repository, {}).setdefault(role, set()).add(member)

    def get_iam_policy(self, request: iam_policy_pb2.GetIamPolicyRequest, context) -> policy_pb2.Policy:
        """A repository's own IAM policy: ``rpc GetIamPolicy(google.iam.v1.GetIamPolicyRequest) returns
        (google.iam.v1.Policy)`` on ``projects/*/locations/*/repositories/*`` (ArtifactRegistry service,
        google/devtools/artifactregistry/v1/service.proto, https://github.com/googleapis/googleapis); the bindings made
        on the repository alone, not the project's it inherits (IAM, "Policy inheritance":
        https://cloud.google.com/iam/docs/resource-hierarchy-access-control); an unknown repository NOT_FOUND."""
        with self._lock:
            if request.resource not in self.state.repositories:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {request.resource}.")
            bindings = self.state.policies.get(request.resource, {})
            return policy_pb2.Policy(
                version=1,
                bindings=[policy_pb2.Binding(role=r, members=sorted(m)) for r, m in sorted(bindings.items())],
            )

    def create_repository(self, request: ar.CreateRepositoryRequest, context) -> operations_pb2.Operation:
        if not PARENT.fullmatch(request.parent):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid parent {request.parent!r}")
        if not REPOSITORY_ID.fullmatch(request.repository_id):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid repository_id {request.repository_id!r}")
        if request.repository.format_ == ar.Repository.Format.FORMAT_UNSPECIFIED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "repository.format is required")
        name = f"{request.parent}/repositories/{request.repository_id}"
        if name in self.state.repositories or any(r.name == name for _, r in self.state.operations.values()):
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"the repository already exists: {name}")
        repo = ar.Repository(request.repository)
        repo.name = name
        op_name = f"{request.parent}/operations/{uuid.uuid4()}"
        self.state.operations[op_name] = [self.polls_to_done, repo]
        return operations_pb2.Operation(name=op_name)

    def get_operation(self, request: operations_pb2.GetOperationRequest, context) -> operations_pb2.Operation:
        entry = self.state.operations.get(request.name)
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Operation {request.name!r} not found.")
        entry[0] -= 1
        op = operations_pb2.Operation(name=request.name)
        if entry[0] <= 0:
            self.state.repositories.setdefault(entry[1].name, entry[1])
            op.done = True
            op.response.Pack(ar.Repository.pb(entry[1]))
        return op


class KfpRegistryEmulator(HttpEmulator):
    """Artifact Registry's KFP endpoint (``https://REGION-kfp.pkg.dev/PROJECT/REPOSITORY``), enough for
    ``kfp.registry.RegistryClient.upload_pipeline``: a multipart POST of ``content`` (the template) and ``tags``
    (comma-separated) to ``/PROJECT/REPOSITORY``, answered ``PACKAGE/sha256:DIGEST``; the package is the template's
    pipeline name. The repository must exist in ``registry`` as a KFP repository."""

    def __init__(self, registry: ArtifactRegistryEmulator, location: str, token: str = ""):
        super().__init__()
        self.registry, self.location, self.token = registry, location, token
        self.packages: dict[str, dict] = {}  # "project/repository/package" -> {"versions": {v: bytes}, "tags": {}}

    def _serve(self, http, raw: bytes) -> tuple:
        import hashlib
        from email.parser import BytesParser
        from email.policy import HTTP

        import yaml

        if self.token and not authorized(self.token, http.headers.get("Authorization")):
            raise HttpError(401, "Request is missing required authentication credential.")
        parts = http.path.strip("/").split("/")
        if http.command != "POST" or len(parts) != 2:
            raise HttpError(404, f"unknown method {http.command} {http.path}")
        project, repository = parts
        name = f"projects/{project}/locations/{self.location}/repositories/{repository}"
        with self.registry._lock:
            repo = self.registry.state.repositories.get(name)
        if repo is None or repo.format_ != ar.Repository.Format.KFP:
            raise HttpError(404, f"KFP repository {name} not found")
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {http.headers['Content-Type']}\r\n\r\n".encode() + raw
        )
        fields = {
            p.get_param("name", header="content-disposition"): p.get_payload(decode=True) for p in message.iter_parts()
        }
        content = fields.get("content")
        if not content:
            raise HttpError(400, "no template in the upload (field 'content')")
        package = yaml.safe_load(content)["pipelineInfo"]["name"]
        version = "sha256:" + hashlib.sha256(content).hexdigest()
        entry = self.packages.setdefault(f"{project}/{repository}/{package}", {"versions": {}, "tags": {}})
        entry["versions"][version] = content
        for tag in filter(None, (fields.get("tags") or b"").decode().split(",")):
            entry["tags"][tag] = version
        return 200, f"{package}/{version}".encode()
