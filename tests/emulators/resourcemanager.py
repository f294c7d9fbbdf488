"""An in-process Resource Manager: the ``google.cloud.resourcemanager.v3.Projects`` gRPC service's GetProject and
TestIamPermissions, served from the messages google-cloud-resource-manager ships, so ``ProjectsClient`` talks real
gRPC to it. A project is found by ``projects/<id>`` or ``projects/<number>``, as in Resource Manager; an unknown one
is PERMISSION_DENIED, which is what Resource Manager answers for a project the caller cannot see (it does not say
whether it exists). TestIamPermissions answers the subset of the permissions asked that the caller holds: all of
them, less those ``deny`` names; as in IAM, a permission that is not ``service.resource.verb`` is INVALID_ARGUMENT.
"""

from __future__ import annotations

import re

import grpc
from google.cloud import resourcemanager_v3 as rm
from google.iam.v1 import iam_policy_pb2

from tests.emulators import serve_grpc

SERVICE = "google.cloud.resourcemanager.v3.Projects"
PERMISSION = re.compile(r"[a-z][a-zA-Z0-9]*\.[a-zA-Z0-9]+\.[a-zA-Z0-9]+")


class ResourceManagerEmulator:
    def __init__(self, projects: dict[str, str]):
        self.projects = dict(projects)  # project id -> project number
        self.calls: list[str] = []
        self.denied: set[str] = set()  # permissions the caller lacks on every project
        self._server = None

    def deny(self, *permissions: str) -> None:
        self.denied.update(permissions)

    def start(self) -> str:
        self._server, address = serve_grpc({SERVICE: {
            "GetProject": (rm.GetProjectRequest.deserialize, rm.Project.serialize, self.get_project),
            "TestIamPermissions": (iam_policy_pb2.TestIamPermissionsRequest.FromString,
                                   iam_policy_pb2.TestIamPermissionsResponse.SerializeToString,
                                   self.test_iam_permissions)}})
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

    def test_iam_permissions(self, request, context):
        self.calls.append("TestIamPermissions")
        self.get_project(rm.GetProjectRequest(name=request.resource), context)
        self.calls.pop()  # the project's lookup is part of this call
        bad = [p for p in request.permissions if not PERMISSION.fullmatch(p)]
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Permission {bad[0]} is not valid.")
        return iam_policy_pb2.TestIamPermissionsResponse(
            permissions=[p for p in request.permissions if p not in self.denied])
