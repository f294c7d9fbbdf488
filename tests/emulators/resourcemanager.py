"""An in-process Resource Manager: the ``google.cloud.resourcemanager.v3.Projects`` gRPC service's GetProject,
GetIamPolicy and TestIamPermissions, served from the messages google-cloud-resource-manager ships, so
``ProjectsClient`` talks real gRPC to it; and, on the same server, the IAM API's ``google.iam.admin.v1.IAM``
TestIamPermissions and GetIamPolicy on a service account (``projects/-/serviceAccounts/EMAIL``), which
``iam_admin_v1.IAMClient`` sends. A project is found by ``projects/<id>`` or ``projects/<number>``, as in
Resource Manager; an unknown one is PERMISSION_DENIED, which is what Resource Manager answers for a project the caller
cannot see (it does not say whether it exists).

Each project's IAM policy starts as a new project's commonly is for GKE: its default Compute Engine service account
(``<number>-compute@developer.gserviceaccount.com``) holds what nodes need (``NODE_ROLES``); ``revoke`` takes a role
away, ``grant`` gives one. TestIamPermissions answers the subset of the permissions asked that the caller holds: all
of them, less those ``deny`` names; as in IAM, a permission that is not ``service.resource.verb`` is INVALID_ARGUMENT.
GetIamPolicy is PERMISSION_DENIED once ``deny`` names ``resourcemanager.projects.getIamPolicy``. On a service account
the caller holds what it holds on the project (a grant on the project is inherited by its accounts: IAM docs, "Policy
inheritance", https://cloud.google.com/iam/docs/policies#inheritance) and what ``grant_on_account`` gave it there.
"""

from __future__ import annotations

import re

import grpc
from google.cloud import resourcemanager_v3 as rm
from google.iam.v1 import iam_policy_pb2, policy_pb2

from tests.emulators import serve_grpc

SERVICE = "google.cloud.resourcemanager.v3.Projects"
IAM_SERVICE = "google.iam.admin.v1.IAM"
ACCOUNT = re.compile(r"projects/[^/]+/serviceAccounts/(?P<email>[^/]+)")
PERMISSION = re.compile(r"[a-z][a-zA-Z0-9]*\.[a-zA-Z0-9]+\.[a-zA-Z0-9]+")
NODE_ROLES = ("roles/artifactregistry.reader", "roles/logging.logWriter", "roles/monitoring.metricWriter")
# What reading a project's IAM policy takes: "Authorization requires the Google IAM permission
# resourcemanager.projects.getIamPolicy on the project"
# (https://cloud.google.com/resource-manager/reference/rest/v1/projects/getIamPolicy).
GET_IAM_POLICY = "resourcemanager.projects.getIamPolicy"


def default_compute_account(number: str) -> str:
    return f"serviceAccount:{number}-compute@developer.gserviceaccount.com"


class ResourceManagerEmulator:
    def __init__(self, projects: dict[str, str]):
        self.projects = dict(projects)  # project id -> project number
        self.policies = {
            project_id: {role: {default_compute_account(number)} for role in NODE_ROLES}
            for project_id, number in self.projects.items()
        }  # project id -> role -> members
        self.calls: list[str] = []
        self.denied: set[str] = set()  # permissions the caller lacks on every project
        self.on_accounts: dict[str, set[str]] = {}  # service account email -> permissions granted on it alone
        self.account_policies: dict[str, dict[str, set[str]]] = {}  # service account email -> role -> members
        self._server = None

    def deny(self, *permissions: str) -> None:
        self.denied.update(permissions)

    def start(self) -> str:
        self._server, address = serve_grpc(
            {
                SERVICE: {
                    "GetProject": (rm.GetProjectRequest.deserialize, rm.Project.serialize, self.get_project),
                    "GetIamPolicy": (
                        iam_policy_pb2.GetIamPolicyRequest.FromString,
                        policy_pb2.Policy.SerializeToString,
                        self.get_iam_policy,
                    ),
                    "TestIamPermissions": (
                        iam_policy_pb2.TestIamPermissionsRequest.FromString,
                        iam_policy_pb2.TestIamPermissionsResponse.SerializeToString,
                        self.test_iam_permissions,
                    ),
                },
                IAM_SERVICE: {
                    "GetIamPolicy": (
                        iam_policy_pb2.GetIamPolicyRequest.FromString,
                        policy_pb2.Policy.SerializeToString,
                        self.get_account_policy,
                    ),
                    "TestIamPermissions": (
                        iam_policy_pb2.TestIamPermissionsRequest.FromString,
                        iam_policy_pb2.TestIamPermissionsResponse.SerializeToString,
                        self.test_account_permissions,
                    ),
                },
            }
        )
        return address

    def stop(self) -> None:
        if self._server:
            self._server.stop(grace=None)

    def grant_on_account(self, email: str, *permissions: str) -> None:
        """The caller holds ``permissions`` on the service account ``email`` (a role granted on the account)."""
        self.on_accounts.setdefault(email, set()).update(permissions)

    def bind_on_account(self, email: str, role: str, member: str) -> None:
        """The service account ``email``'s own IAM policy grants ``member`` the ``role`` on it (a Workload Identity
        binding is ``roles/iam.workloadIdentityUser`` for ``serviceAccount:PROJECT.svc.id.goog[NS/KSA]``)."""
        self.account_policies.setdefault(email, {}).setdefault(role, set()).add(member)

    def get_account_policy(self, request, context) -> policy_pb2.Policy:
        """The IAM API's serviceAccounts.getIamPolicy: the account's own bindings
        (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/getIamPolicy)."""
        self.calls.append("serviceAccounts.GetIamPolicy")
        account = ACCOUNT.fullmatch(request.resource)
        if not account:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid service account name {request.resource}.")
        roles = self.account_policies.get(account["email"], {})
        return policy_pb2.Policy(
            bindings=[policy_pb2.Binding(role=role, members=sorted(members)) for role, members in sorted(roles.items())]
        )

    def test_account_permissions(self, request, context):
        self.calls.append("serviceAccounts.TestIamPermissions")
        account = ACCOUNT.fullmatch(request.resource)
        if not account:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid service account name {request.resource}.")
        granted = self.on_accounts.get(account["email"], set())
        return iam_policy_pb2.TestIamPermissionsResponse(
            permissions=[p for p in request.permissions if p not in self.denied or p in granted]
        )

    def grant(self, project_id: str, role: str, member: str) -> None:
        self.policies[project_id].setdefault(role, set()).add(member)

    def revoke(self, project_id: str, role: str, member: str) -> None:
        self.policies[project_id].get(role, set()).discard(member)

    def _project(self, name: str, context) -> tuple[str, str]:
        key = name.removeprefix("projects/")
        for project_id, number in self.projects.items():
            if key in (project_id, number):
                return project_id, number
        context.abort(
            grpc.StatusCode.PERMISSION_DENIED, f"Permission denied on resource '{name}' (or it may not exist)."
        )

    def get_project(self, request: rm.GetProjectRequest, context) -> rm.Project:
        self.calls.append("GetProject")
        project_id, number = self._project(request.name, context)
        return rm.Project(
            name=f"projects/{number}", project_id=project_id, state=rm.Project.State.ACTIVE, display_name=project_id
        )

    def get_iam_policy(self, request: iam_policy_pb2.GetIamPolicyRequest, context) -> policy_pb2.Policy:
        self.calls.append("GetIamPolicy")
        project_id, _ = self._project(request.resource, context)
        if GET_IAM_POLICY in self.denied:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "The caller does not have permission")
        bindings = [
            policy_pb2.Binding(role=role, members=sorted(members))
            for role, members in sorted(self.policies[project_id].items())
            if members
        ]
        return policy_pb2.Policy(version=1, bindings=bindings, etag=b"BwYq")

    def test_iam_permissions(self, request, context):
        self.calls.append("TestIamPermissions")
        self._project(request.resource, context)
        bad = [p for p in request.permissions if not PERMISSION.fullmatch(p)]
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Permission {bad[0]} is not valid.")
        return iam_policy_pb2.TestIamPermissionsResponse(
            permissions=[p for p in request.permissions if p not in self.denied]
        )
