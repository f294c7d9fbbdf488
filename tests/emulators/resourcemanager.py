"""An in-process Resource Manager: the ``google.cloud.resourcemanager.v3.Projects`` gRPC service's GetProject,
GetIamPolicy and TestIamPermissions, ``Folders``' GetFolder and GetIamPolicy, and ``Organizations``' GetIamPolicy,
served from the messages google-cloud-resource-manager ships, so its clients talk real gRPC to it; and, on the same
server, the IAM API's ``google.iam.admin.v1.IAM`` TestIamPermissions and GetIamPolicy on a service account
(``projects/-/serviceAccounts/EMAIL``) and GetRole, which ``iam_admin_v1.IAMClient`` sends. A project is found by
``projects/<id>`` or ``projects/<number>``, as in
Resource Manager; an unknown one is PERMISSION_DENIED, which is what Resource Manager answers for a project the caller
cannot see (it does not say whether it exists).

Each project's IAM policy starts as a new project's commonly is for GKE: its default Compute Engine service account
(``<number>-compute@developer.gserviceaccount.com``) holds what nodes need (``NODE_ROLES``); ``revoke`` takes a role
away, ``grant`` gives one. TestIamPermissions answers the subset of the permissions asked that the caller holds: all
of them, less those ``deny`` names; as in IAM, a permission that is not ``service.resource.verb`` is INVALID_ARGUMENT.
GetIamPolicy is PERMISSION_DENIED once ``deny`` names ``resourcemanager.projects.getIamPolicy``. On a service account
the caller holds what it holds on the project (a grant on the project is inherited by its accounts: IAM docs, "Policy
inheritance", https://cloud.google.com/iam/docs/policies#inheritance) and what ``grant_on_account`` gave it there.

The resource hierarchy (https://cloud.google.com/resource-manager/docs/cloud-platform-resource-hierarchy): a project
has no parent until ``place`` puts it under folders and an organization; GetProject then answers its ``parent``, and
GetFolder each folder's (``folders/ID`` or ``organizations/ID``: the v3 ``Project`` and ``Folder`` messages). A folder's
or organization's policy starts empty (``grant_above`` adds to it); reading it takes
``resourcemanager.folders.getIamPolicy`` or ``resourcemanager.organizations.getIamPolicy``
(https://cloud.google.com/resource-manager/reference/rest/v3/folders/getIamPolicy,
https://cloud.google.com/resource-manager/reference/rest/v3/organizations/getIamPolicy), refused once ``deny`` names it.
A custom role (``projects/P/roles/R``, ``organizations/O/roles/R``) exists once ``define_role`` gives its permissions;
GetRole answers them as ``included_permissions``, NOT_FOUND for another name, and PERMISSION_DENIED once ``deny`` names
``iam.roles.get`` (https://cloud.google.com/iam/docs/reference/rest/v1/roles/get). A predefined role (``roles/R``) is
not served: the code under test reads custom roles only.

A grant may carry an IAM condition (``grant``/``grant_above`` with ``condition={"title", "expression"}``): a binding
of its own, its ``condition`` an ``Expr`` (google/iam/v1/policy.proto, ``Binding.condition``). GetIamPolicy answers it
as the requested policy version says ("Policy versions", https://cloud.google.com/iam/docs/policies#versions;
``GetPolicyOptions.requested_policy_version``, google/iam/v1/options.proto): at 3, with its condition and the policy's
``version`` 3; at 0 or 1 (or unset), without it, the role named ``ROLE_withcond_HASH`` and the policy's version 1
(https://cloud.google.com/iam/docs/troubleshooting-withcond); another version is INVALID_ARGUMENT ("Valid values are 0,
1, and 3. Requests specifying an invalid value will be rejected"). A policy with no condition is version 1 whatever was
asked ("if you specify version 3, but the policy has no conditional role bindings, the response uses version 1").
TestIamPermissions is not affected: it answers for the caller, from ``deny``.
"""

from __future__ import annotations

import hashlib
import re

import grpc
from google.cloud import iam_admin_v1
from google.cloud import resourcemanager_v3 as rm
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.type import expr_pb2

from tests.emulators import serve_grpc

SERVICE = "google.cloud.resourcemanager.v3.Projects"
FOLDERS_SERVICE = "google.cloud.resourcemanager.v3.Folders"
ORGANIZATIONS_SERVICE = "google.cloud.resourcemanager.v3.Organizations"
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
        # Permissions the caller lacks on one project alone: testIamPermissions answers for the resource it names
        # ("Returns permissions that a caller has on the specified project":
        # https://cloud.google.com/resource-manager/reference/rest/v3/projects/testIamPermissions).
        self.denied_on: dict[str, set[str]] = {}  # project id -> permissions
        self.on_accounts: dict[str, set[str]] = {}  # service account email -> permissions granted on it alone
        self.parents: dict[str, str] = {}  # projects/ID or folders/ID -> its parent (folders/ID, organizations/ID)
        self.above: dict[str, dict[str, set[str]]] = {}  # folders/ID, organizations/ID -> role -> members
        self.roles: dict[str, set[str]] = {}  # custom role name -> the permissions it holds
        self.account_policies: dict[str, dict[str, set[str]]] = {}  # service account email -> role -> members
        # The policy version each getIamPolicy asked for (GetPolicyOptions.requested_policy_version, 0 when unset):
        # a policy with conditional bindings read below version 3 loses them ("Policy versions",
        # https://cloud.google.com/iam/docs/policies#versions), so a reader that can meet one asks for 3.
        self.policy_versions: list[int] = []
        # projects/ID, folders/ID, organizations/ID -> (role, member, condition) of each conditional grant
        self.conditional: dict[str, list[tuple[str, str, dict[str, str]]]] = {}
        self._server = None

    def add_project(self, project_id: str, number: str) -> None:
        """Another project the caller can see (a data project beside the run's), with an empty policy."""
        self.projects[project_id] = number
        self.policies.setdefault(project_id, {})

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
                FOLDERS_SERVICE: {
                    "GetFolder": (rm.GetFolderRequest.deserialize, rm.Folder.serialize, self.get_folder),
                    "GetIamPolicy": (
                        iam_policy_pb2.GetIamPolicyRequest.FromString,
                        policy_pb2.Policy.SerializeToString,
                        self.get_policy_above,
                    ),
                },
                ORGANIZATIONS_SERVICE: {
                    "GetIamPolicy": (
                        iam_policy_pb2.GetIamPolicyRequest.FromString,
                        policy_pb2.Policy.SerializeToString,
                        self.get_policy_above,
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
                    "GetRole": (iam_admin_v1.GetRoleRequest.deserialize, iam_admin_v1.Role.serialize, self.get_role),
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

    def place(self, project_id: str, *ancestry: str) -> None:
        """Put the project under ``ancestry``, nearest first: ``place(P, "folders/1", "organizations/2")``."""
        child = f"projects/{project_id}"
        for parent in ancestry:
            self.parents[child] = parent
            self.above.setdefault(parent, {})
            child = parent

    def grant_above(self, resource: str, role: str, member: str, condition: dict[str, str] | None = None) -> None:
        """``member`` granted ``role`` on a folder or organization ``place`` named (under ``condition`` if given)."""
        if condition:
            self.conditional.setdefault(resource, []).append((role, member, condition))
        else:
            self.above[resource].setdefault(role, set()).add(member)

    def define_role(self, name: str, *permissions: str) -> None:
        self.roles[name] = set(permissions)

    def get_folder(self, request: rm.GetFolderRequest, context) -> rm.Folder:
        self.calls.append("folders.GetFolder")
        if request.name not in self.above:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"Permission denied on resource '{request.name}'.")
        return rm.Folder(name=request.name, parent=self.parents.get(request.name, ""), state=rm.Folder.State.ACTIVE)

    def get_policy_above(self, request: iam_policy_pb2.GetIamPolicyRequest, context) -> policy_pb2.Policy:
        kind = request.resource.split("/", 1)[0]
        self.calls.append(f"{kind}.GetIamPolicy")
        self.policy_versions.append(request.options.requested_policy_version)
        permission = f"resourcemanager.{kind}.getIamPolicy"
        if request.resource not in self.above or permission in self.denied:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"The caller does not have permission {permission}")
        return self._policy(request, self.above[request.resource], context)

    def get_role(self, request: iam_admin_v1.GetRoleRequest, context) -> iam_admin_v1.Role:
        self.calls.append("roles.GetRole")
        if "iam.roles.get" in self.denied:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"Permission 'iam.roles.get' denied on {request.name}")
        if request.name not in self.roles:
            context.abort(grpc.StatusCode.NOT_FOUND, f"The role named {request.name} was not found.")
        return iam_admin_v1.Role(name=request.name, included_permissions=sorted(self.roles[request.name]))

    def grant(self, project_id: str, role: str, member: str, condition: dict[str, str] | None = None) -> None:
        """``member`` granted ``role`` on the project (under ``condition``, ``{"title", "expression"}``, if given)."""
        if condition:
            self.conditional.setdefault(f"projects/{project_id}", []).append((role, member, condition))
        else:
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
            name=f"projects/{number}",
            project_id=project_id,
            state=rm.Project.State.ACTIVE,
            display_name=project_id,
            parent=self.parents.get(f"projects/{project_id}", ""),
        )

    def get_iam_policy(self, request: iam_policy_pb2.GetIamPolicyRequest, context) -> policy_pb2.Policy:
        self.calls.append("GetIamPolicy")
        self.policy_versions.append(request.options.requested_policy_version)
        project_id, _ = self._project(request.resource, context)
        if GET_IAM_POLICY in self.denied:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "The caller does not have permission")
        return self._policy(request, self.policies[project_id], context, f"projects/{project_id}")

    def test_iam_permissions(self, request, context):
        self.calls.append("TestIamPermissions")
        self._project(request.resource, context)
        bad = [p for p in request.permissions if not PERMISSION.fullmatch(p)]
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Permission {bad[0]} is not valid.")
        there = self.denied_on.get(request.resource.removeprefix("projects/"), set())
        return iam_policy_pb2.TestIamPermissionsResponse(
            permissions=[p for p in request.permissions if p not in self.denied and p not in there]
        )

    def _policy(self, request, roles: dict[str, set[str]], context, resource: str = "") -> policy_pb2.Policy:
        """The policy of ``roles`` and the resource's conditional grants, as the requested version shows them."""
        version = request.options.requested_policy_version
        if version not in (0, 1, 3):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Invalid requested policy version {version}: valid values are 0, 1 and 3.",
            )
        bindings = [
            policy_pb2.Binding(role=role, members=sorted(members)) for role, members in sorted(roles.items()) if members
        ]
        conditional: dict[tuple[str, str, str], set[str]] = {}
        for role, member, condition in self.conditional.get(resource or request.resource, []):
            conditional.setdefault((role, condition["title"], condition["expression"]), set()).add(member)
        for (role, title, expression), members in sorted(conditional.items()):
            if version == 3:
                bindings.append(
                    policy_pb2.Binding(
                        role=role, members=sorted(members), condition=expr_pb2.Expr(title=title, expression=expression)
                    )
                )
            else:
                mark = hashlib.sha256(f"{title}\n{expression}".encode()).hexdigest()[:20]
                bindings.append(policy_pb2.Binding(role=f"{role}_withcond_{mark}", members=sorted(members)))
        return policy_pb2.Policy(version=3 if conditional and version == 3 else 1, bindings=bindings, etag=b"BwYq")
