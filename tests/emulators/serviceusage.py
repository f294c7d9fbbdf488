"""An in-process Service Usage: the ``google.api.serviceusage.v1.ServiceUsage`` gRPC service's GetService and
BatchGetServices, served from the messages google-cloud-service-usage ships, so ``ServiceUsageClient`` talks real
gRPC to it. Every service of a known project is ENABLED unless ``disable`` named it; as in Service Usage, names are
``projects/<id or number>/services/<service>``, a batch is at most 30 names of one parent, and an unknown project is
PERMISSION_DENIED.
"""

from __future__ import annotations

import re
import threading

import grpc
from google.cloud import service_usage_v1 as su

from tests.emulators import serve_grpc

SERVICE = "google.api.serviceusage.v1.ServiceUsage"
NAME = re.compile(r"projects/(?P<project>[^/]+)/services/(?P<service>[a-z0-9.-]+\.googleapis\.com)")
BATCH_MAX = 30


class ServiceUsageEmulator:
    def __init__(self, projects: dict[str, str]):
        self.projects = dict(projects)  # project id -> project number
        self.disabled: set[str] = set()  # services not enabled in any project, e.g. "compute.googleapis.com"
        self.calls: list[str] = []
        self._lock = threading.Lock()
        self._server = None

    def disable(self, *services: str) -> None:
        self.disabled.update(services)

    def start(self) -> str:
        self._server, address = serve_grpc(
            {
                SERVICE: {
                    "GetService": (su.GetServiceRequest.deserialize, su.Service.serialize, self.get_service),
                    "BatchGetServices": (
                        su.BatchGetServicesRequest.deserialize,
                        su.BatchGetServicesResponse.serialize,
                        self.batch_get_services,
                    ),
                }
            }
        )
        return address

    def stop(self) -> None:
        if self._server:
            self._server.stop(grace=None)

    def _service(self, name: str, context) -> su.Service:
        m = NAME.fullmatch(name)
        if not m:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid service name {name!r}.")
        number = self.projects.get(m["project"]) or (m["project"] if m["project"] in self.projects.values() else "")
        if not number:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"Permission denied on resource project {m['project']} (or it may not exist).",
            )
        state = su.State.DISABLED if m["service"] in self.disabled else su.State.ENABLED
        return su.Service(name=f"projects/{number}/services/{m['service']}", parent=f"projects/{number}", state=state)

    def get_service(self, request: su.GetServiceRequest, context) -> su.Service:
        with self._lock:
            self.calls.append("GetService")
        return self._service(request.name, context)

    def batch_get_services(self, request: su.BatchGetServicesRequest, context) -> su.BatchGetServicesResponse:
        with self._lock:
            self.calls.append("BatchGetServices")
        if len(request.names) > BATCH_MAX:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"At most {BATCH_MAX} services per batch.")
        if any(not n.startswith(request.parent + "/services/") for n in request.names):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Every name must be under {request.parent}.")
        return su.BatchGetServicesResponse(services=[self._service(n, context) for n in request.names])
