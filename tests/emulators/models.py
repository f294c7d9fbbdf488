"""An emulated Vertex AI Model Registry: the ``google.cloud.aiplatform.v1.ModelService`` REST surface that the real
``google-cloud-aiplatform`` SDK uses with ``api_transport="rest"``: UploadModel (with its long-running operation,
done at once, and GetOperation), GetModel (``models/ID``, ``models/ID@VERSION``, ``models/ID@ALIAS``), ListModels,
ListModelVersions and MergeVersionAliases. Bodies are parsed into the SDK's own ``aiplatform_v1`` messages with
unknown fields refused.

What it validates, as Vertex does: the parent ``projects/P/locations/L``; the model id (``[a-z0-9_-]``, at most
63, not starting with a digit or '-'); a display name; labels (at most 64, lowercase keys and values); a ``gs://``
artifact URI, and with it a serving container; an upload with ``model_id`` of an existing model is 409, one with a
``parent_model`` that does not exist 404; an unknown model, version or alias is 404. Aliases: each matches
``[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]`` and is not a number; an alias names at most one version of a model (adding it
to one version removes it from the one that held it); ``default`` is on the first version and always on exactly one
(it moves when added elsewhere, and cannot be removed). Version ids are "1", "2", ... per model. ListModels answers
each model once, as its default version.

Faults are injected per method ("UploadModel", "GetModel", "ListModels", "ListModelVersions",
"MergeVersionAliases", "GetOperation"): the next N matching calls answer an HTTP status in Google's error shape
(503 UNAVAILABLE; 403 PERMISSION_DENIED names the method's IAM permission and the resource, as Vertex does), or,
with ``lost=True``, the call takes effect and then its answer is that error (an answer lost on the way back). An
UploadModel fault with ``status=None`` accepts the upload and ends its operation with an INTERNAL error, creating
nothing.

Pointing the SDK here: ``ModelServiceClient(transport="rest", client_options={"api_endpoint": endpoint})``, or
``aiplatform.init(api_endpoint=endpoint, api_transport="rest")``; ``$TPUPIPE_VERTEX_ENDPOINT`` for tpupipe.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlparse

from google.cloud import aiplatform_v1
from google.protobuf import json_format

from tests.emulators import take_fault
from tests.emulators.http import STATUS, Fault, HttpEmulator, HttpError
from tests.emulators.tokens import authorized

PARENT = re.compile(r"^projects/(?P<project>[a-z][a-z0-9-]{4,28}[a-z0-9])/locations/(?P<location>[a-z0-9-]+)$")
MODEL = re.compile(r"^(?P<parent>projects/[^/]+/locations/[^/]+)/models/(?P<id>[^/@:]+)(?:@(?P<ref>[^/@:]+))?$")
OPERATION = re.compile(r"^projects/[^/]+/locations/[^/]+(?:/models/[^/]+)?/operations/[^/]+$")
MODEL_ID = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")
ALIAS = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
DEFAULT = "default"
PERMISSIONS = {
    "UploadModel": "aiplatform.models.upload",
    "GetModel": "aiplatform.models.get",
    "ListModels": "aiplatform.models.list",
    "ListModelVersions": "aiplatform.models.list",
    "MergeVersionAliases": "aiplatform.models.update",
    "GetOperation": "aiplatform.operations.list",
}
TYPE = "type.googleapis.com/"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class RpcError(HttpError):
    """An error in the shape of Google's newer REST APIs (``google.rpc.Status``: code, message, status, details), so
    the SDK raises the ``google.api_core.exceptions`` class of the status, with the ErrorInfo's reason and
    metadata."""

    def __init__(self, status: int, message: str, info: dict | None = None):
        super().__init__(status, message)
        self.info = info

    def body(self) -> dict:
        error = {"code": self.status, "message": self.message, "status": STATUS.get(self.status, "UNKNOWN")}
        if self.info:
            error["details"] = [{"@type": TYPE + "google.rpc.ErrorInfo", **self.info}]
        return {"error": error}


@dataclass
class ModelFault(Fault):
    lost: bool = False  # the call takes effect; the error replaces its answer


@dataclass
class Entry:
    """One model: its versions (id -> the Model as JSON, camelCase), in upload order."""

    versions: dict[str, dict] = field(default_factory=dict)
    next_id: int = 1


class ModelServiceEmulator(HttpEmulator):
    def __init__(self, token: str = ""):
        super().__init__()
        self.token = token  # when set, requests must carry "Authorization: Bearer <token>"
        self.models: dict[str, Entry] = {}  # "projects/P/locations/L/models/ID" -> Entry
        self.operations: dict[str, dict] = {}
        self.calls: list[str] = []
        self.faults: list[ModelFault] = []
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ faults and inspection
    def fail(
        self,
        method: str,
        status: int | None,
        times: int = 1,
        message: str = "",
        lost: bool = False,
        when: Callable[[dict], bool] = lambda request: True,
    ) -> None:
        """The next ``times`` calls of ``method`` matching ``when`` (given the request body, or {"name": ...}) answer
        HTTP ``status``; with ``lost`` after taking effect. UploadModel with ``status=None``: its operation fails."""
        self.faults.append(ModelFault(method, status, STATUS.get(status or 500, ""), message, times, when, lost))

    def upload(self, parent: str, request: dict) -> dict:
        """What another client's UploadModel does (``request``: an UploadModelRequest as JSON), done in-process: for a
        test that needs a model that is not its own, or another writer's upload at a chosen moment."""
        with self._lock:
            return self._upload(parent, json.dumps(request).encode(), failed=False)

    def aliases(self, model: str) -> dict[str, str]:
        """{alias: version id} of ``model`` (a resource name), ``default`` included."""
        with self._lock:
            entry = self.models[model]
            return {a: v for v, m in entry.versions.items() for a in m.get("versionAliases", [])}

    # ------------------------------------------------------------------ serving
    def _serve(self, http: BaseHTTPRequestHandler, raw: bytes) -> tuple:
        # The answer's headers and body go out in two writes: without this, Nagle's algorithm holds the second until
        # the client's delayed ACK (~40 ms a call).
        http.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.token and not authorized(self.token, http.headers.get("Authorization")):
            raise RpcError(401, "Request is missing required authentication credential.")
        path = unquote(urlparse(http.path).path).removeprefix("/v1/")
        method, target = self._route(http.command, path)
        with self._lock:
            self.calls.append(method)
        request = self._body(raw) if http.command == "POST" else {"name": target}
        fault = take_fault(self.faults, self._lock, method, request)
        if fault is not None and fault.status is not None and not fault.lost:
            raise self._fault_error(method, target, fault)
        with self._lock:
            answer = self._handle(method, target, raw, fault)
        if fault is not None and fault.lost:
            raise self._fault_error(method, target, fault)
        return 200, answer

    def _route(self, command: str, path: str) -> tuple[str, str]:
        if command == "POST" and path.endswith("/models:upload"):
            return "UploadModel", path.removesuffix("/models:upload")
        if command == "POST" and path.endswith(":mergeVersionAliases"):
            return "MergeVersionAliases", path.removesuffix(":mergeVersionAliases")
        if command == "GET" and path.endswith(":listVersions"):
            return "ListModelVersions", path.removesuffix(":listVersions")
        if command == "GET" and path.endswith("/models"):
            return "ListModels", path.removesuffix("/models")
        if command == "GET" and OPERATION.match(path):
            return "GetOperation", path
        if command == "GET" and "/models/" in path:
            return "GetModel", path
        raise RpcError(404, f"unknown method {command} /v1/{path}")

    @staticmethod
    def _body(raw: bytes) -> dict:
        try:
            return json.loads(raw or b"{}")
        except ValueError as exc:
            raise RpcError(400, f"Invalid JSON payload received. {exc}") from None

    def _fault_error(self, method: str, target: str, fault: Fault) -> RpcError:
        status = fault.status or 500
        if status == 403:
            permission = PERMISSIONS[method]
            resource = target.split("@")[0]
            return RpcError(
                403,
                fault.message
                or f"Permission '{permission}' denied on resource "
                f"'//aiplatform.googleapis.com/{resource}' (or it may not exist).",
                {
                    "reason": "IAM_PERMISSION_DENIED",
                    "domain": "aiplatform.googleapis.com",
                    "metadata": {"permission": permission, "resource": resource},
                },
            )
        if status == 503:
            return RpcError(503, fault.message or "The service is currently unavailable.")
        return RpcError(status, fault.message or f"Injected HTTP {status} for {method}.")

    def _handle(self, method: str, target: str, raw: bytes, fault: Fault | None) -> dict:
        if method == "UploadModel":
            return self._upload(target, raw, failed=fault is not None and fault.status is None)
        if method == "GetOperation":
            if target not in self.operations:
                raise RpcError(404, f"Operation {target} does not exist.")
            return copy.deepcopy(self.operations[target])
        if method == "ListModels":
            self._parent(target)
            return {
                "models": [
                    copy.deepcopy(self._resolve(name, entry, DEFAULT))
                    for name, entry in sorted(self.models.items())
                    if name.startswith(target + "/models/")
                ]
            }
        match = MODEL.match(target)
        if not match:
            raise RpcError(
                400,
                f"Invalid resource name {target!r}: expected "
                "projects/PROJECT/locations/LOCATION/models/MODEL[@VERSION].",
            )
        name = target.split("@")[0]
        entry = self.models.get(name)
        if entry is None:
            raise RpcError(404, f"Model {name} does not exist.")
        if method == "ListModelVersions":
            if match["ref"]:
                raise RpcError(400, f"ListModelVersions takes a model, not a version: {target}.")
            return {"models": [copy.deepcopy(m) for m in entry.versions.values()]}
        version = self._resolve(name, entry, match["ref"] or DEFAULT)
        if method == "GetModel":
            return copy.deepcopy(version)
        if not match["ref"]:
            raise RpcError(400, f"MergeVersionAliases needs a version: {name}@VERSION.")
        return self._merge(entry, version, raw)

    # ------------------------------------------------------------------ the methods
    @staticmethod
    def _parent(parent: str) -> None:
        if not PARENT.match(parent):
            raise RpcError(400, f"Invalid parent {parent!r}: expected projects/PROJECT/locations/LOCATION.")

    def _resolve(self, name: str, entry: Entry, ref: str) -> dict:
        if ref.isdigit():
            if ref in entry.versions:
                return entry.versions[ref]
            raise RpcError(404, f"Model {name}@{ref} does not exist: the model has no version {ref}.")
        for version in entry.versions.values():
            if ref in version.get("versionAliases", []):
                return version
        raise RpcError(404, f"Model {name}@{ref} does not exist: no version has the alias {ref!r}.")

    def _upload(self, parent: str, raw: bytes, failed: bool) -> dict:
        self._parent(parent)
        request = _parse(aiplatform_v1.UploadModelRequest, raw)
        model = json_format.MessageToDict(aiplatform_v1.Model.pb(request.model))
        if not request.model.display_name:
            raise RpcError(400, "Model.display_name is required.")
        _check_labels(model.get("labels", {}))
        uri = model.get("artifactUri", "")
        if uri and not uri.startswith("gs://"):
            raise RpcError(400, f"Model.artifact_uri must be a Cloud Storage path (gs://...), got {uri!r}.")
        if uri and not model.get("containerSpec", {}).get("imageUri"):
            raise RpcError(400, "Model.container_spec.image_uri is required for a model with an artifact_uri.")
        aliases = model.get("versionAliases", [])
        for alias in aliases:
            _check_alias(alias)
        if len(set(aliases)) != len(aliases):
            raise RpcError(400, f"Model.version_aliases has an alias twice: {aliases}.")
        if request.parent_model:
            name = request.parent_model
            if not MODEL.match(name) or not name.startswith(parent + "/"):
                raise RpcError(400, f"Invalid parent_model {name!r}: a model of {parent}.")
            if name not in self.models:
                raise RpcError(404, f"The parent model {name} does not exist.")
        else:
            if not MODEL_ID.match(request.model_id or ""):
                raise RpcError(
                    400,
                    f"Invalid model_id {request.model_id!r}: up to 63 of [a-z0-9_-], not starting with a digit or '-'.",
                )
            name = f"{parent}/models/{request.model_id}"
            if name in self.models:
                raise RpcError(409, f"Model {name} already exists.")
        operation = f"{name}/operations/{len(self.operations) + 1}"
        metadata = {
            "@type": TYPE + "google.cloud.aiplatform.v1.UploadModelOperationMetadata",
            "genericMetadata": {"createTime": _now(), "updateTime": _now()},
        }
        if failed:
            self.operations[operation] = {
                "name": operation,
                "metadata": metadata,
                "done": True,
                "error": {"code": 13, "message": "Internal error encountered."},
            }
            return copy.deepcopy(self.operations[operation])
        entry = self.models.setdefault(name, Entry())
        version_id = str(entry.next_id)
        entry.next_id += 1
        if not entry.versions and DEFAULT not in aliases:
            aliases = [*aliases, DEFAULT]  # a model's first version is its default
        for version in entry.versions.values():  # an alias names one version: taken off the others
            version["versionAliases"] = [a for a in version.get("versionAliases", []) if a not in aliases]
        now = _now()
        entry.versions[version_id] = {
            **model,
            "name": name,
            "versionId": version_id,
            "versionAliases": aliases,
            "createTime": now,
            "updateTime": now,
            "versionCreateTime": now,
            "versionUpdateTime": now,
        }
        self.operations[operation] = {
            "name": operation,
            "metadata": metadata,
            "done": True,
            "response": {
                "@type": TYPE + "google.cloud.aiplatform.v1.UploadModelResponse",
                "model": name,
                "modelVersionId": version_id,
            },
        }
        return copy.deepcopy(self.operations[operation])

    def _merge(self, entry: Entry, version: dict, raw: bytes) -> dict:
        request = _parse(aiplatform_v1.MergeVersionAliasesRequest, raw)
        changes = list(request.version_aliases)
        if not changes:
            raise RpcError(400, "MergeVersionAliasesRequest.version_aliases is required.")
        add = [c for c in changes if not c.startswith("-")]
        remove = [c[1:] for c in changes if c.startswith("-")]
        for alias in add + remove:
            _check_alias(alias)
        if DEFAULT in remove and DEFAULT not in add:
            raise RpcError(400, "The default alias cannot be removed: add it to another version instead.")
        add, remove = [a for a in add if a not in remove], [r for r in remove if r not in add]  # both: cancelled
        for other in entry.versions.values():
            if other is not version:
                other["versionAliases"] = [a for a in other.get("versionAliases", []) if a not in add]
                if add:
                    other["versionUpdateTime"] = _now()
        held = [a for a in version.get("versionAliases", []) if a not in remove]
        version["versionAliases"] = held + [a for a in add if a not in held]
        version["versionUpdateTime"] = _now()
        return copy.deepcopy(version)


def _check_alias(alias: str) -> None:
    if not ALIAS.match(alias) or alias.isdigit():
        raise RpcError(
            400,
            f"Invalid version alias {alias!r}: it must match [a-z][a-zA-Z0-9-]{{0,126}}[a-z0-9] and not be a number.",
        )


def _check_labels(labels: dict) -> None:
    if len(labels) > 64:
        raise RpcError(400, f"A model has at most 64 labels, got {len(labels)}.")
    for key, value in labels.items():
        if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            raise RpcError(
                400,
                f"Invalid label {key}={value!r}: keys and values are lowercase letters, digits, '_' "
                "and '-', at most 63 characters, and keys start with a letter.",
            )


def _parse(message_type, raw: bytes):
    """The body as the SDK's own message type: unknown fields and wrong types are refused, as the service does."""
    try:
        return message_type.from_json(raw.decode() or "{}", ignore_unknown_fields=False)
    except Exception as exc:  # noqa: BLE001 - the parse error is the answer
        raise RpcError(400, f"Invalid JSON payload: {exc}") from None
