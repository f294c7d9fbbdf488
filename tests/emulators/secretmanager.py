"""An in-process Secret Manager: the ``google.cloud.secretmanager.v1.SecretManagerService`` gRPC service's
AccessSecretVersion, served from the messages google-cloud-secret-manager ships, so ``SecretManagerServiceClient``
talks real gRPC to it. ``projects/P/secrets/NAME/versions/V`` (a number, or ``latest``); a project named by its id or
number; an unknown secret or version is NOT_FOUND. Every access is recorded (``accessed``), as Cloud Audit Logs would.
"""

from __future__ import annotations

import re
import threading

import google_crc32c
import grpc
from google.cloud import secretmanager_v1 as sm

from tests.emulators import serve_grpc

SERVICE = "google.cloud.secretmanager.v1.SecretManagerService"
VERSION = re.compile(r"^projects/(?P<project>[^/]+)/secrets/(?P<secret>[^/]+)/versions/(?P<version>[^/]+)$")


class SecretManagerEmulator:
    def __init__(self, projects: dict[str, str]):
        self.projects = dict(projects)  # project id -> number
        self.secrets: dict[tuple[str, str], list[bytes]] = {}  # (project id, secret) -> versions, oldest first
        self.accessed: list[str] = []
        self._lock = threading.Lock()
        self._server = None

    def add(self, project: str, secret: str, value: bytes) -> str:
        with self._lock:
            versions = self.secrets.setdefault((project, secret), [])
            versions.append(value)
            return f"projects/{project}/secrets/{secret}/versions/{len(versions)}"

    def start(self) -> str:
        self._server, address = serve_grpc(
            {
                SERVICE: {
                    "AccessSecretVersion": (
                        sm.AccessSecretVersionRequest.deserialize,
                        sm.AccessSecretVersionResponse.serialize,
                        self.access,
                    )
                }
            }
        )
        return address

    def stop(self) -> None:
        if self._server:
            self._server.stop(grace=None)

    def access(self, request: sm.AccessSecretVersionRequest, context) -> sm.AccessSecretVersionResponse:
        m = VERSION.match(request.name)
        if not m:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"Invalid resource field value in the request: {request.name!r}"
            )
        project = next((p for p, n in self.projects.items() if m["project"] in (p, n)), None)
        with self._lock:
            self.accessed.append(request.name)
            versions = self.secrets.get((project, m["secret"]), [])
        index = len(versions) if m["version"] == "latest" else int(m["version"]) if m["version"].isdigit() else 0
        if not versions or not 1 <= index <= len(versions):
            context.abort(grpc.StatusCode.NOT_FOUND, f"Secret [{request.name}] not found or has no versions.")
        data = versions[index - 1]
        number = self.projects[project]
        return sm.AccessSecretVersionResponse(
            name=f"projects/{number}/secrets/{m['secret']}/versions/{index}",
            payload=sm.SecretPayload(data=data, data_crc32c=google_crc32c.value(data)),
        )
