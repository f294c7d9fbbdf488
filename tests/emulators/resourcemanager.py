"""An in-process Resource Manager: the ``google.cloud.resourcemanager.v3.Projects`` gRPC service's GetProject, served
from the messages google-cloud-resource-manager ships, so ``ProjectsClient`` talks real gRPC to it. A project is
found by ``projects/<id>`` or ``projects/<number>``, as in Resource Manager; an unknown one is PERMISSION_DENIED,
which is what Resource Manager answers for a project the caller cannot see (it does not say whether it exists).
"""

from __future__ import annotations

from concurrent import futures

import grpc
from google.cloud import resourcemanager_v3 as rm

SERVICE = "google.cloud.resourcemanager.v3.Projects"


class ResourceManagerEmulator:
    def __init__(self, projects: dict[str, str]):
        self.projects = dict(projects)  # project id -> project number
        self.calls: list[str] = []
        self._server = None

    def start(self) -> str:
        handler = grpc.unary_unary_rpc_method_handler(
            self.get_project, request_deserializer=rm.GetProjectRequest.deserialize,
            response_serializer=rm.Project.serialize)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"GetProject": handler}),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self._server:
            self._server.stop(grace=None)

    def get_project(self, request: rm.GetProjectRequest, context) -> rm.Project:
        self.calls.append("GetProject")
        key = request.name.removeprefix("projects/")
        for project_id, number in self.projects.items():
            if key in (project_id, number):
                return rm.Project(name=f"projects/{number}", project_id=project_id, state=rm.Project.State.ACTIVE,
                                  display_name=project_id)
        context.abort(grpc.StatusCode.PERMISSION_DENIED,
                      f"Permission denied on resource '{request.name}' (or it may not exist).")
