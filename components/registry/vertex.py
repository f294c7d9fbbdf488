"""The registry in Vertex AI Model Registry, through ``google-cloud-aiplatform``'s ``aiplatform_v1.ModelServiceClient``
over REST (with the emulators, the endpoint ``$TPUPIPE_VERTEX_ENDPOINT`` names, as for the pipelines; else the
region's ``REGION-aiplatform.googleapis.com``).

The calls (one request each, so that a retry repeats exactly one): ``UploadModel`` (a new model with ``model_id``,
or a new version with ``parent_model``; its long-running operation followed to its end), ``GetModel`` on
``models/NAME@VERSION_OR_ALIAS``, ``ListModelVersions``, ``ListModels`` and ``MergeVersionAliases``. The client is
used rather than ``aiplatform.Model.upload`` and ``aiplatform.models.ModelRegistry`` because those make calls of
their own (a GetModel after every upload), need the process-wide ``aiplatform.init``, and return versions without
their artifact URI or labels (``VersionInfo``).

A version is a Vertex model version: ``artifactUri`` the checkpoint (``gs://``), ``versionDescription`` the whole
provenance as JSON, ``labels`` the caller's and the provenance's that fit label rules, plus ``tpupipe-registry``
(which models ``models()`` lists) and ``tpupipe-registration`` (a token per ``register`` call: an upload answered
UNAVAILABLE may have happened, so before uploading again the registry looks for a version carrying the token). A
model needs a serving container to be uploaded; ``serving_image`` names it. Vertex's ``default`` alias follows
``champion``, so a deployment of the model without a version serves the champion.

Errors: UNAVAILABLE (503), RESOURCE_EXHAUSTED (429) and DEADLINE_EXCEEDED are retried after ``retry_delays_s``
(then reported, naming the call); PERMISSION_DENIED (403) is reported at once, naming the permission, the project
and the role that grants it.
"""

from __future__ import annotations

import functools
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.cloud.credentials import VERTEX_ENDPOINT_ENV, google_client
from components.registry import REGISTRY_LABEL, TOKEN_LABEL, VERTEX_DEFAULT_ALIAS, Move, Version
from components.spec import CHAMPION, InfraError, SpecError, names

if TYPE_CHECKING:
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud.aiplatform_v1 import Model, ModelServiceClient

# The vLLM server of Vertex AI Model Garden: serves a Hugging Face checkpoint directory such as the trainers write.
DEFAULT_SERVING_IMAGE = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:latest"
REGISTRY_LABEL_VALUE = "v1"  # REGISTRY_LABEL's value: the provenance's format
PERMISSIONS = {
    "UploadModel": "aiplatform.models.upload",
    "GetModel": "aiplatform.models.get",
    "ListModels": "aiplatform.models.list",
    "ListModelVersions": "aiplatform.models.list",
    "MergeVersionAliases": "aiplatform.models.update",
}
HTTP_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
UPLOAD_TIMEOUT_S = 600


def _transient() -> tuple[type[GoogleAPICallError], ...]:
    from google.api_core import exceptions

    # By HTTP status, as the REST transport raises them (gRPC's ResourceExhausted, DeadlineExceeded are subclasses).
    return exceptions.ServiceUnavailable, exceptions.TooManyRequests, exceptions.GatewayTimeout


class VertexBackend:
    def __init__(
        self,
        project: str,
        region: str,
        serving_image: str = DEFAULT_SERVING_IMAGE,
        retry_delays_s: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0),
    ) -> None:
        names.check_project("--project", project)
        if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+", region or ""):
            raise SpecError("--region", f"{region!r} is not a Vertex AI region (us-east5, europe-west4, ...)")
        self.project, self.region, self.serving_image = project, region, serving_image
        self.retry_delays_s = tuple(retry_delays_s)
        self.parent = f"projects/{project}/locations/{region}"
        self.where = f"Vertex AI Model Registry ({self.parent})"
        self._client: ModelServiceClient | None = None

    # ------------------------------------------------------------------ calls
    def client(self) -> ModelServiceClient:
        if self._client is None:
            from google.cloud import aiplatform_v1

            self._client = google_client(
                aiplatform_v1.ModelServiceClient,
                VERTEX_ENDPOINT_ENV,
                endpoint=f"{self.region}-aiplatform.googleapis.com",
                transport="rest",
            )
        return self._client

    def _call[T](self, method: str, what: str, fn: Callable[[], T], between: Callable[[], T | None] | None = None) -> T:
        """``fn()``, retried on transient errors after each of ``retry_delays_s`` (``between()`` before each retry:
        an answer it gives is the result); NotFound and Conflict (409) pass through for the caller to interpret."""
        from google.api_core import exceptions

        for attempt, delay in enumerate((*self.retry_delays_s, None)):
            try:
                return fn()
            except exceptions.Forbidden as exc:
                raise self._denied(method, what, exc) from None
            except _transient() as exc:
                if delay is None:
                    raise InfraError(
                        f"{self.where}: {what} failed {attempt + 1} times, the last with "
                        f"{_status(exc)}: {_said(exc)}; try again later"
                    ) from None
                time.sleep(delay)
                found = between() if between is not None else None
                if found is not None:
                    return found
            except exceptions.GoogleAPICallError as exc:
                if isinstance(exc, exceptions.NotFound | exceptions.Conflict):
                    raise
                raise InfraError(f"{self.where}: {what} failed with {_status(exc)}: {_said(exc)}") from None
        raise AssertionError("unreachable")

    def _denied(self, method: str, what: str, exc: GoogleAPICallError) -> InfraError:
        permission = (getattr(exc, "metadata", None) or {}).get("permission") or PERMISSIONS[method]
        return InfraError(
            f"{self.where}: {what}: permission {permission} denied in project {self.project}. Grant "
            f"the caller (the pipeline's service account, or you with gcloud auth application-default "
            f"login) a role that has it, such as roles/aiplatform.user. Vertex AI said: {_said(exc)}"
        )

    def _model(self, name: str) -> str:
        return f"{self.parent}/models/{name}"

    def resource(self, name: str, version: str) -> str:
        """A version's resource name, ``.../models/NAME@VERSION`` ("to retrieve a specific version of the model, also
        provide the version ID", the field docs of GetModelRequest.name, google/cloud/aiplatform_v1/types/
        model_service.py)."""
        return f"{self._model(name)}@{version}"

    # ------------------------------------------------------------------ the backend
    def upload(self, name: str, artifact_uri: str, provenance: dict[str, Any], labels: dict[str, str]) -> Version:
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        if not artifact_uri.startswith("gs://"):
            raise SpecError("artifact_uri", f"{artifact_uri!r}: Vertex AI Model Registry takes a gs:// checkpoint")
        token = uuid.uuid4().hex
        model = aiplatform_v1.Model(
            display_name=name,
            artifact_uri=artifact_uri,
            container_spec=aiplatform_v1.ModelContainerSpec(image_uri=self.serving_image),
            labels={**labels, REGISTRY_LABEL: REGISTRY_LABEL_VALUE, TOKEN_LABEL: token},
            version_description=json.dumps(provenance, sort_keys=True),
        )
        exists = self._with_tokens(name) is not None
        what = f"registering a version of model {name!r}"

        def upload() -> Version:
            request = aiplatform_v1.UploadModelRequest(
                parent=self.parent,
                model=model,
                **({"parent_model": self._model(name)} if exists else {"model_id": name}),
            )
            operation = self.client().upload_model(request=request)
            response = operation.result(timeout=UPLOAD_TIMEOUT_S)  # type: ignore[no-untyped-call]  # api_core: untyped
            return self._fetch_id(name, response.model_version_id)

        def registered() -> Version | None:  # an earlier attempt that happened although its answer was lost
            return next((v for v in self._with_tokens(name) or [] if v.labels.get(TOKEN_LABEL) == token), None)

        try:
            found = self._call("UploadModel", what, upload, between=registered)
        except exceptions.Conflict:  # the model exists now: another writer's, or an attempt whose answer was lost
            exists = True
            found = registered() or self._call("UploadModel", what, upload, between=registered)
        return _hide_token(found)

    def _fetch_id(self, name: str, version_id: str) -> Version:
        found = self.fetch(name, version_id)
        if found is None:
            raise InfraError(f"{self.where}: version {version_id} of {name!r} was uploaded but is not found")
        return found

    def fetch(self, name: str, ref: str) -> Version | None:
        from google.api_core import exceptions

        try:
            message = self._call(
                "GetModel", f"reading {name}@{ref}", lambda: self.client().get_model(name=f"{self._model(name)}@{ref}")
            )
        except exceptions.NotFound:
            return None
        return _hide_token(_version(name, message))

    def versions(self, name: str) -> list[Version] | None:
        versions = self._with_tokens(name)
        return None if versions is None else [_hide_token(v) for v in versions]

    def _with_tokens(self, name: str) -> list[Version] | None:
        """The versions with their registration tokens."""
        from google.api_core import exceptions

        try:
            messages = self._call(
                "ListModelVersions",
                f"listing the versions of {name!r}",
                lambda: list(self.client().list_model_versions(name=self._model(name))),
            )
        except exceptions.NotFound:
            return None
        versions = [_version(name, m) for m in messages]
        return sorted(versions, key=lambda v: int(v.version) if v.version.isdigit() else 0)

    def models(self) -> list[str]:
        messages = self._call(
            "ListModels", "listing the models", lambda: list(self.client().list_models(parent=self.parent))
        )
        return sorted({m.name.rsplit("/", 1)[-1].split("@")[0] for m in messages if m.labels.get(REGISTRY_LABEL)})

    def change(self, name: str, plan: Callable[[dict[str, str]], list[Move]]) -> list[Move]:
        """One MergeVersionAliases per move, in order; Vertex moves an alias added to one version off any other.
        ``default`` goes wherever ``champion`` goes."""
        aliases = {a: v.version for v in self.versions(name) or [] for a in v.aliases}
        moves = plan(aliases)

        def merge(request: dict[str, Any]) -> Any:
            return self.client().merge_version_aliases(request=request)

        for done, move in enumerate(moves):
            follows = [VERTEX_DEFAULT_ALIAS] if CHAMPION in move.add else []
            merged = [*move.add, *follows, *(f"-{a}" for a in move.remove)]
            what = f"moving aliases of {name}@{move.version} ({', '.join(merged)}; step {done + 1} of {len(moves)})"
            request = {"name": f"{self._model(name)}@{move.version}", "version_aliases": merged}
            self._call("MergeVersionAliases", what, functools.partial(merge, request))
        return moves


def _status(exc: GoogleAPICallError) -> str:
    return f"{HTTP_STATUS.get(exc.code or 0, 'error')} (HTTP {exc.code})"


def _said(exc: GoogleAPICallError) -> str:
    """What the service said, without the request line the REST transport puts before it."""
    return re.sub(r"^[A-Z]+ \S+: ", "", exc.message or "")


def _version(name: str, message: Model) -> Version:
    try:
        provenance = json.loads(message.version_description) if message.version_description else {}
    except ValueError:  # a version uploaded by another tool: its description is text
        provenance = {"description": message.version_description}
    created = message.version_create_time
    return Version(
        name=name,
        version=message.version_id,
        artifact_uri=message.artifact_uri,
        aliases=tuple(sorted(a for a in message.version_aliases if a != VERTEX_DEFAULT_ALIAS)),
        provenance=provenance,
        labels={k: v for k, v in message.labels.items() if k != REGISTRY_LABEL},
        created=created.isoformat().replace("+00:00", "Z") if created else "",
    )


def _hide_token(version: Version) -> Version:
    from dataclasses import replace

    return replace(version, labels={k: v for k, v in version.labels.items() if k != TOKEN_LABEL})
