"""An in-process Resource Manager: the ``google.cloud.resourcemanager.v3.Projects`` gRPC service's GetProject, served
from the messages google-cloud-resource-manager ships, so ``ProjectsClient`` talks real gRPC to it. A project is
found by ``projects/<id>`` or ``projects/<number>``, as in Resource Manager; an unknown one is PERMISSION_DENIED,
which is what Resource Manager answers for a project the caller cannot see (it does not say whether it exists).
"""

from __future__ import annotations

import grpc
from google.cloud import resourcemanager_v3 as rm

from tests.emulators import serve_grpc

SERVICE = "google.cloud.resourcemanager.v3.Projects"


class ResourceManagerEmulator:
    def __init__(self, projects: dict[str, str]):
        self.projects = dict(projects)  # project id -> project number
        self.calls: list[str] = []
        self._server = None

    def start(self) -> str:
        self._server, address = serve_grpc({SERVICE: {"GetProject": (
            rm.GetProjectRequest.deserialize, rm.Project.serialize, self.get_project)}})
        return address

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
