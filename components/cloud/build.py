"""The trainer image on GKE: Cloud Build builds ``images/<name>/Dockerfile`` and pushes it to Artifact Registry,
through google-cloud-build (docs/architecture.md, "Cloud calls through the client libraries").

The build context (the image directory and the tpupipe sources the Dockerfile copies) is packed reproducibly
(sorted entries, no timestamps or owners) and uploaded to the run's prefix in the bucket. The build carries the
run's tag, so a re-run build stage finds it again: a finished build is reused, a running one re-attached to (and
a create whose reply was lost is not asked again before the tag is looked up: ``CloudBuild.create``). The
wait polls the build with its step statuses as progress and a deadline; an interrupt (SIGINT, SIGTERM) cancels
the build; a failed build is one error with Cloud Build's own detail and log URL.

The Artifact Registry Docker repository the image goes to is got or created first (kept after the run).

The build finds the sources under ``$TPUPIPE_SOURCE_ROOT`` (the components image sets it; default: this
repository). Emulators are found through ``TPUPIPE_CLOUD_BUILD_EMULATOR_HOST`` and
``TPUPIPE_ARTIFACT_REGISTRY_EMULATOR_HOST`` (host:port, plaintext gRPC).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.cloud.credentials import google_client
from components.cloud.errors import Adapter, GkeError
from components.platforms.interrupts import on_interrupt, signal_name
from components.spec import names

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import artifactregistry_v1
    from google.cloud.devtools import cloudbuild_v1

EMULATOR_HOST_ENV = "TPUPIPE_CLOUD_BUILD_EMULATOR_HOST"
REGISTRY_EMULATOR_HOST_ENV = "TPUPIPE_ARTIFACT_REGISTRY_EMULATOR_HOST"
SOURCE_ROOT_ENV = "TPUPIPE_SOURCE_ROOT"
# What every trainer Dockerfile copies besides its own directory.
CONTEXT_PATHS = ("pyproject.toml", "requirements-pip.lock", "components", "pipelines", "trainers")
RUNNING = ("PENDING", "QUEUED", "WORKING")


class BuildFailed(GkeError):
    """The image build ended without an image (failure, timeout, cancellation)."""


def source_root() -> Path:
    return Path(os.environ.get(SOURCE_ROOT_ENV) or Path(__file__).resolve().parents[2])


def build_context(image: str, root: Path | None = None) -> bytes:
    """The build context of ``images/<image>/`` as a reproducible .tar.gz: the same files give the same bytes."""
    root = root or source_root()
    if not (root / "images" / image / "Dockerfile").is_file():
        raise FileNotFoundError(f"no images/{image}/Dockerfile under {root} (set ${SOURCE_ROOT_ENV})")
    files = []
    # The components image carries every image's directory: build_image uploads the trainer images' contexts.
    for top in ("images" if image == "pipeline" else f"images/{image}", *CONTEXT_PATHS):
        path = root / top
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in found if "__pycache__" not in p.parts and p.suffix != ".pyc"]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            info = tarfile.TarInfo(str(path.relative_to(root)))
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def image_tag(image: str, root: Path | None = None) -> str:
    """A tag that names the content: the hash of the image's build context. The same tree gives the same tag, and
    any change to what the image holds gives another."""
    import hashlib

    return hashlib.sha256(build_context(image, root)).hexdigest()[:16]


def client(creds: Credentials | None = None) -> cloudbuild_v1.CloudBuildClient:
    """A ``CloudBuildClient``: to the emulator named by $TPUPIPE_CLOUD_BUILD_EMULATOR_HOST, else to Google."""
    from google.cloud.devtools import cloudbuild_v1

    return google_client(cloudbuild_v1.CloudBuildClient, EMULATOR_HOST_ENV, creds=creds)


def registry_client(creds: Credentials | None = None) -> artifactregistry_v1.ArtifactRegistryClient:
    """An ``ArtifactRegistryClient``: to the emulator named by $TPUPIPE_ARTIFACT_REGISTRY_EMULATOR_HOST, else Google."""
    from google.cloud import artifactregistry_v1

    return google_client(artifactregistry_v1.ArtifactRegistryClient, REGISTRY_EMULATOR_HOST_ENV, creds=creds)


class Registry(Adapter["artifactregistry_v1.ArtifactRegistryClient"]):
    """Artifact Registry repositories: the Docker one the images go to, the KFP one the pipeline templates go to;
    reused, or created (and kept after the run)."""

    def __init__(self, client: artifactregistry_v1.ArtifactRegistryClient, **options: Any) -> None:
        super().__init__(client, **{"operation_timeout_s": 300.0, "poll_s": 2.0, **options})

    def ensure(
        self, project: str, location: str, repository: str, fmt: str = "DOCKER", field: str = "gke.artifact_repository"
    ) -> str:
        from google.api_core import exceptions as gexc
        from google.cloud import artifactregistry_v1

        from components.spec import SpecError

        parent = f"projects/{project}/locations/{location}"
        name = f"{parent}/repositories/{repository}"
        docker = getattr(artifactregistry_v1.Repository.Format, fmt)
        try:
            found = self.call(f"get repository {name}", lambda: self.client.get_repository(name=name))
            if found.format_ != docker:
                kind = "Docker" if fmt == "DOCKER" else fmt
                raise SpecError(
                    field,
                    f"{name} is a {found.format_.name} repository, not {kind}",
                    [f"a {kind} repository", "a new name"],
                )
            self.log(f"Artifact Registry repository {name} exists: pushing there")
            if fmt == "DOCKER" and not found.docker_config.immutable_tags:
                self.log(
                    f"warning: {name} lets a pushed tag be moved to another image (no immutable tags): the pods "
                    "pull by digest, but a person pulling by tag may get what someone pushed since"
                )
            return name
        except gexc.NotFound:
            pass
        request = {
            "parent": parent,
            "repository_id": repository,
            "repository": {
                "format_": docker,
                "description": f"tpupipe {'images' if fmt == 'DOCKER' else 'pipeline templates'}",
                # Tags never move: one names one image for good (DockerRepositoryConfig.immutable_tags,
                # google/devtools/artifactregistry/v1/repository.proto). Run and content tags are pushed once.
                **({"docker_config": {"immutable_tags": True}} if fmt == "DOCKER" else {}),
            },
        }
        try:
            op = self.call(f"create repository {name}", lambda: self.client.create_repository(request=request))
        except gexc.AlreadyExists:
            return name
        self.log(f"creating Artifact Registry repository {name} (kept after the run)")
        self.poll_until(
            lambda: True if op.done() else None,  # type: ignore[no-untyped-call]  # api_core's Operation: untyped
            f"repository {name} to be created",
        )
        op.result()  # type: ignore[no-untyped-call]  # raises the operation's error, if it ended in one
        return name


def pinned_source(body: dict[str, Any], generation: int | None) -> dict[str, Any]:
    """The build ``body`` with its source object pinned to the generation uploaded (``StorageSource.generation``:
    https://cloud.google.com/build/docs/api/reference/rest/v1/projects.builds#storagesource): an object written over
    it since is not what is built."""
    if generation is None:
        return body
    source = {**body["source"]["storageSource"], "generation": str(generation)}
    return {**body, "source": {**body["source"], "storageSource": source}}


def image_tag_path(image: str) -> tuple[str, str]:
    """``(package, tag)`` of the Docker image ``REGION-docker.pkg.dev/PROJECT/REPOSITORY/NAME:TAG`` in Artifact
    Registry: ``projects/P/locations/L/repositories/R/packages/NAME`` and the tag's id (the tag's resource name is
    ``PACKAGE/tags/TAG``)."""
    host, project, repository, rest = image.split("@")[0].split("/", 3)
    name, _, tag = rest.rpartition(":")
    location = host.removesuffix("-docker.pkg.dev")
    return f"projects/{project}/locations/{location}/repositories/{repository}/packages/{name}", tag


def content_image(image: str, context: bytes) -> str:
    """``image`` (``NAME:TAG``) under the tag that names its build context: ``NAME:ctx-HASH``, the first 16 hex digits
    of the context's SHA-256. A later run whose context is the same bytes finds the image under it and builds nothing;
    any change to what the image holds gives another tag."""
    import hashlib

    name = image.split("@")[0].rsplit(":", 1)[0]
    return f"{name}:{names.CONTENT_TAG_PREFIX}{hashlib.sha256(context).hexdigest()[:16]}"


def add_tag(registry: Registry, image: str, digest: str) -> None:
    """Tag the pushed version ``digest`` as ``image`` (``NAME:TAG``), or leave it: a tag that exists already is kept
    (another run of the same context tagged its own build). Artifact Registry's CreateTag takes the package, the tag's
    id and the version it names (CreateTagRequest, google/devtools/artifactregistry/v1/tag.proto); an immutable-tags
    repository "does not prevent tags from being created" (DockerRepositoryConfig.immutable_tags, repository.proto)."""
    from google.api_core import exceptions as gexc
    from google.cloud import artifactregistry_v1 as ar

    package, tag = image_tag_path(image)
    body = ar.Tag(name=f"{package}/tags/{tag}", version=f"{package}/versions/{digest}")
    try:
        registry.call(f"tag {image}", lambda: registry.client.create_tag(parent=package, tag_id=tag, tag=body))
    except gexc.AlreadyExists:
        pass


def tag_digest(registry: Registry, image: str) -> str | None:
    """The digest (``sha256:HEX``) that ``REGION-docker.pkg.dev/PROJECT/REPOSITORY/NAME:TAG`` names in Artifact
    Registry now, or None when the tag is not there. A tag names a version (``Tag.version``:
    ``.../versions/sha256:HEX``, google/cloud/artifactregistry_v1/types/tag.py); a reference by digest cannot move."""
    from google.api_core import exceptions as gexc

    package, tag = image_tag_path(image)
    path = f"{package}/tags/{tag}"
    try:
        found = registry.call(f"get tag {path}", lambda: registry.client.get_tag(name=path))
    except gexc.NotFound:
        return None
    return found.version.rsplit("/versions/", 1)[-1]


class CloudBuild(Adapter["cloudbuild_v1.CloudBuildClient"]):
    """Get-or-create and wait for the run's image build, in ``projects/<project>/locations/<location>``."""

    def __init__(self, client: cloudbuild_v1.CloudBuildClient, project: str, location: str, **options: Any) -> None:
        super().__init__(client, **{"poll_s": 10.0, **options})
        self.project = project
        self.parent = f"projects/{project}/locations/{location}"

    def find(self, tag: str) -> cloudbuild_v1.Build | None:
        """The newest build with ``tag`` that succeeded or is still running, or None."""
        builds = self.call(
            "list builds",
            lambda: self.client.list_builds(
                request={"project_id": self.project, "parent": self.parent, "filter": f'tags="{tag}"'}
            ),
        )
        for build in builds:
            if build.status.name == "SUCCESS" or build.status.name in RUNNING:
                return build
        return None

    def ensure(
        self,
        body: dict[str, Any],
        tag: str,
        record: Callable[[str, str], None],
        timeout_s: float,
        stop: Callable[[], str | None] = lambda: None,
    ) -> cloudbuild_v1.Build:
        """The build ``body`` describes: reused when one with ``tag`` succeeded, re-attached to when it runs, else
        started (``create``); waited on until it has pushed the image."""
        build = self.find(tag)
        if build is not None and build.status.name == "SUCCESS":
            self.log(f"image build {build.id} of this run succeeded already: reusing {', '.join(build.images)}")
            return build
        if build is not None:
            self.log(f"image build {build.id} of this run is {build.status.name}: waiting for it")
        else:
            build = self.create(body, tag)
            record("build", f"{self.parent}/builds/{build.id}")
            self.log(
                f"building {', '.join(body['images'])} with Cloud Build: build {build.id}"
                + (f", log {build.log_url}" if build.log_url else "")
            )
        return self.wait(build.id, timeout_s, stop)

    def create(self, body: dict[str, Any], tag: str) -> cloudbuild_v1.Build:
        """Start the build ``body`` describes (it carries ``tag``), once. CreateBuild is not idempotent: each request
        that reaches Cloud Build starts a build, and google-cloud-build gives it no retry for that reason
        (cloudbuild_v1 ``services/cloud_build/transports/base.py`` at 3.35.0: ``create_build`` wrapped with no
        ``default_retry``). A transient error can come after the request took effect, its reply lost: gRPC answers
        ``UNAVAILABLE`` when the connection breaks once the request is sent, and ``DEADLINE_EXCEEDED`` "may be
        returned even if the operation has completed successfully" (https://grpc.io/docs/guides/status-codes). So
        before a create is asked again the build is looked up by its tag (``find``): one there is the build the lost
        reply started, followed instead of starting a second (a second would also push the run's tag again, which
        the repository's immutable tags refuse)."""
        from google.cloud.devtools import cloudbuild_v1

        request = {
            "project_id": self.project,
            "parent": self.parent,
            "build": cloudbuild_v1.Build.from_json(json.dumps(body)),
        }
        asked: list[bool] = []

        def once() -> cloudbuild_v1.Build:
            if asked and (started := self.find(tag)) is not None:
                self.log(f"  create build: the earlier request started build {started.id} (its reply was lost)")
                return started
            asked.append(True)
            created: cloudbuild_v1.Build = self.client.create_build(request=request).metadata.build
            return created

        return self.call("create build", once)

    def get(self, build_id: str) -> cloudbuild_v1.Build:
        return self.call(
            f"get build {build_id}",
            lambda: self.client.get_build(
                request={"project_id": self.project, "id": build_id, "name": f"{self.parent}/builds/{build_id}"}
            ),
        )

    def wait(
        self, build_id: str, timeout_s: float, stop: Callable[[], str | None] = lambda: None
    ) -> cloudbuild_v1.Build:
        """Until the build ends (or ``timeout_s``); when ``stop()`` gives a reason (the run it builds for failed), the
        build is cancelled and :class:`BuildFailed` names the reason."""
        started = self.clock()
        last = {"status": ""}

        def cancel(signum: int) -> None:
            self.log(f"  image build {build_id}: {signal_name(signum)}: cancelling it")
            self._cancel(build_id)

        def poll() -> cloudbuild_v1.Build | None:
            reason = stop()
            if reason:
                self.log(f"  image build {build_id}: {reason}: cancelling it")
                self._cancel(build_id)
                raise BuildFailed(f"image build {build_id} cancelled: {reason}")
            build = self.get(build_id)
            steps = ", ".join(f"step {i} {s.status.name}" for i, s in enumerate(build.steps))
            status = f"{build.status.name}" + (f" ({steps})" if steps else "")
            if status != last["status"]:
                self.log(f"  image build {build_id}: {status}")
                last["status"] = status
            return None if build.status.name in RUNNING else build

        with on_interrupt(cancel, log=self.log):
            build = self.poll_until(poll, f"image build {build_id}", every_s=60, timeout_s=timeout_s)
        if build.status.name != "SUCCESS":
            raise BuildFailed(
                f"image build {build_id} ended {build.status.name}: {build.status_detail or 'no detail'}"
                + (f"; log {build.log_url}" if build.log_url else "")
            )
        digests = ", ".join(f"{i.name}@{i.digest}" for i in build.results.images)
        self.log(f"  image build {build_id}: pushed {digests} in {self.clock() - started:.0f}s")
        return build

    def _cancel(self, build_id: str) -> None:
        self.client.cancel_build(
            request={"project_id": self.project, "id": build_id, "name": f"{self.parent}/builds/{build_id}"}
        )


__all__ = [
    "BuildFailed",
    "CloudBuild",
    "Registry",
    "build_context",
    "client",
    "pinned_source",
    "registry_client",
    "source_root",
]
