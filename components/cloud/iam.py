"""Resource Manager and IAM, read-only: a project's number and allow policy, who may act as a service account, the
policies a project inherits from its folders and organization, and what a custom role holds (docs/architecture.md,
"Cloud calls through the client libraries").

- A project's allow policy is not all that grants roles on it: "the effective policy for a resource is the union of
  the policy set at that resource and the policy inherited from its parent"
  (https://cloud.google.com/iam/docs/resource-hierarchy-access-control). The ancestry is walked with Resource
  Manager v3: ``projects.get``'s ``parent`` (``folders/ID`` or ``organizations/ID``) and each folder's
  (``folders.get``), each ancestor's policy read with ``folders.getIamPolicy`` or ``organizations.getIamPolicy``
  (https://cloud.google.com/resource-manager/reference/rest/v3/projects#Project,
  https://cloud.google.com/resource-manager/reference/rest/v3/folders/getIamPolicy,
  https://cloud.google.com/resource-manager/reference/rest/v3/organizations/getIamPolicy).
- A custom role (``projects/P/roles/R`` or ``organizations/O/roles/R``) holds the permissions its definition lists:
  IAM's ``roles.get`` answers them as ``includedPermissions``
  (https://cloud.google.com/iam/docs/reference/rest/v1/roles/get).
- A binding with a ``condition`` grants its role only to a request for which the condition's expression holds
  ("Overview of IAM Conditions", https://cloud.google.com/iam/docs/conditions-overview): over the request's resource
  (its name, type, service, tags), its time, its destination. The preflight asks whether an account holds a role on a
  resource for every request the run will make, which no one request answers, so a conditional binding is kept apart
  (``Level.conditional``, by the condition's title) and never counted as a grant: the checks name it in a warning.
  None is evaluated, not even an expiry (``request.time < timestamp(...)``): the grant may end while the run is on.

The clients go to the emulators named by $TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST and $TPUPIPE_IAM_EMULATOR_HOST
(host:port, plaintext gRPC). Cloud SDKs are imported inside functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from components.cloud.credentials import google_client

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import resourcemanager_v3
    from google.iam.v1 import policy_pb2

RESOURCE_MANAGER_EMULATOR_HOST_ENV = "TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST"
# Every policy read asks for version 3: a policy with conditional bindings read at a lower version is refused, or has
# those bindings' conditions left out ("Policy versions", https://cloud.google.com/iam/docs/policies#versions;
# GetPolicyOptions.requested_policy_version, google/iam/v1/options.proto).
IAM_POLICY_VERSION = 3


def policy_request(resource: str) -> dict[str, Any]:
    """A getIamPolicy request for ``resource`` at ``IAM_POLICY_VERSION``."""
    return {"resource": resource, "options": {"requested_policy_version": IAM_POLICY_VERSION}}


def projects_client(creds: Credentials | None = None) -> resourcemanager_v3.ProjectsClient:
    """Resource Manager's ``ProjectsClient``: to the emulator named by $TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST, else to
    Google."""
    from google.cloud import resourcemanager_v3

    return google_client(resourcemanager_v3.ProjectsClient, RESOURCE_MANAGER_EMULATOR_HOST_ENV, creds=creds)


IAM_EMULATOR_HOST_ENV = "TPUPIPE_IAM_EMULATOR_HOST"


def may_act_as(account: str, creds: Credentials | None = None) -> bool:
    """Whether the caller holds ``iam.serviceAccounts.actAs`` on the service account ``account`` itself (the IAM
    API's ``projects.serviceAccounts.testIamPermissions``, which needs no permission of its own:
    https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/testIamPermissions): a grant of
    roles/iam.serviceAccountUser on the account, which the project's testIamPermissions does not see."""
    from google.cloud import iam_admin_v1

    client = google_client(iam_admin_v1.IAMClient, IAM_EMULATOR_HOST_ENV, creds=creds)
    permission = "iam.serviceAccounts.actAs"
    answer = client.test_iam_permissions(
        request={"resource": f"projects/-/serviceAccounts/{account}", "permissions": [permission]}
    )
    return permission in answer.permissions


def account_members(account: str, role: str, creds: Credentials | None = None) -> set[str]:
    """The members the service account ``account``'s own IAM policy grants ``role`` on it (the IAM API's
    ``projects.serviceAccounts.getIamPolicy``, https://cloud.google.com/iam/docs/reference/rest/v1/
    projects.serviceAccounts/getIamPolicy): who may act as it, or use it by Workload Identity."""
    from google.cloud import iam_admin_v1

    client = google_client(iam_admin_v1.IAMClient, IAM_EMULATOR_HOST_ENV, creds=creds)
    policy = client.get_iam_policy(request=policy_request(f"projects/-/serviceAccounts/{account}"))
    return {who for binding in policy.bindings if binding.role == role for who in binding.members}


def project_number(project: str, creds: Credentials | None = None) -> str:
    """The project's number (Workload Identity principals name it, not the id)."""
    return projects_client(creds).get_project(name=f"projects/{project}").name.removeprefix("projects/")


def project_grants(project: str, creds: Credentials | None = None) -> dict[str, set[str]]:
    """Every member of the project's IAM policy and the roles it grants that member on the project itself
    unconditionally (one ``getIamPolicy``)."""
    return project_level(project, creds).grants


def project_level(project: str, creds: Credentials | None = None) -> Level:
    """The project's own IAM policy (one ``getIamPolicy``): what it grants, unconditionally and under conditions."""
    resource = f"projects/{project}"
    return policy_level_of(resource, projects_client(creds).get_iam_policy(request=policy_request(resource)))


# A role read at policy version 1 from a policy with conditions: "ROLE_withcond_HASH", its condition not shown
# (https://cloud.google.com/iam/docs/troubleshooting-withcond). Asked at version 3, IAM answers the conditions; a
# service that answers version 1 anyway still marks the binding conditional this way.
WITHCOND = "_withcond_"
UNSHOWN = "a condition not shown at policy version 1"


def policy_grants(policy: policy_pb2.Policy) -> dict[str, set[str]]:
    """An IAM policy's members and the roles it grants each unconditionally (a conditional binding grants only where
    its condition holds: ``policy_conditional``)."""
    grants: dict[str, set[str]] = {}
    for binding in policy.bindings:
        if not binding.HasField("condition") and WITHCOND not in binding.role:
            for who in binding.members:
                grants.setdefault(who, set()).add(binding.role)
    return grants


def policy_conditional(policy: policy_pb2.Policy) -> dict[str, dict[str, set[str]]]:
    """An IAM policy's members and the roles it grants each only under a condition, with the titles of those
    conditions (the expression where a condition has no title)."""
    found: dict[str, dict[str, set[str]]] = {}
    for binding in policy.bindings:
        if binding.HasField("condition"):
            role, title = binding.role, binding.condition.title or binding.condition.expression
        elif WITHCOND in binding.role:
            role, title = binding.role.split(WITHCOND, 1)[0], UNSHOWN
        else:
            continue
        for who in binding.members:
            found.setdefault(who, {}).setdefault(role, set()).add(title)
    return found


def under_conditions(conditional: dict[str, set[str]], roles: Iterable[str]) -> list[str]:
    """Each of ``roles`` that ``conditional`` (a member's: role -> condition titles) grants, as ``ROLE (under the
    condition 'TITLE')``."""
    return [
        f"{role} (under the condition {', '.join(repr(t) for t in sorted(conditional[role]))})"
        for role in sorted(set(roles) & set(conditional))
    ]


def project_roles(project: str, member: str, creds: Credentials | None = None) -> set[str]:
    """The roles the project's IAM policy grants ``member`` (``serviceAccount:EMAIL``) on the project itself."""
    return project_grants(project, creds).get(member, set())


CUSTOM_ROLE_PREFIXES = ("projects/", "organizations/")  # a custom role's name; a predefined one is roles/NAME


@dataclass(frozen=True)
class Level:
    """One policy that grants roles on a project: the project's own, an ancestor's, or one of its resources' (an
    Artifact Registry repository's), and whether it could be read."""

    resource: str  # projects/P, folders/ID, organizations/ID
    grants: dict[str, set[str]]  # member -> the roles this policy grants it unconditionally
    unread: str = ""  # why the policy could not be read ('' when it was)
    # member -> role -> the titles of the conditions it is granted under (not grants: see the module's docstring)
    conditional: dict[str, dict[str, set[str]]] = field(default_factory=dict)


def ancestors(project: str, creds: Credentials | None = None) -> list[Level]:
    """The project's folders, nearest first, then its organization, each with the policy it sets (inherited by the
    project); a policy or parent that cannot be read is a Level saying why, and the walk stops at a parent it
    cannot read. Empty for a project with no parent."""
    from google.api_core import exceptions
    from google.cloud import resourcemanager_v3 as rm

    projects = google_client(rm.ProjectsClient, RESOURCE_MANAGER_EMULATOR_HOST_ENV, creds=creds)
    try:
        parent = projects.get_project(name=f"projects/{project}").parent
    except exceptions.GoogleAPICallError as exc:
        return [Level(f"the parent of projects/{project}", {}, f"{type(exc).__name__}: {exc.message}")]
    folders: rm.FoldersClient | None = None
    organizations: rm.OrganizationsClient | None = None
    found: list[Level] = []
    while parent:
        if parent.startswith("folders/"):
            folders = folders or google_client(rm.FoldersClient, RESOURCE_MANAGER_EMULATOR_HOST_ENV, creds=creds)
            found.append(policy_level(parent, folders.get_iam_policy))
            try:
                parent = folders.get_folder(name=parent).parent
            except exceptions.GoogleAPICallError as exc:
                found.append(Level(f"the parent of {parent}", {}, f"{type(exc).__name__}: {exc.message}"))
                break
        elif parent.startswith("organizations/"):
            organizations = organizations or google_client(
                rm.OrganizationsClient, RESOURCE_MANAGER_EMULATOR_HOST_ENV, creds=creds
            )
            found.append(policy_level(parent, organizations.get_iam_policy))
            break
        else:
            break
    return found


def policy_level(resource: str, get_iam_policy: Callable[..., policy_pb2.Policy]) -> Level:
    """The policy ``get_iam_policy`` (a client's, as Resource Manager's and Artifact Registry's take a
    ``GetIamPolicyRequest``) reads of ``resource``, or a Level saying why it cannot be read."""
    from google.api_core import exceptions

    try:
        return policy_level_of(resource, get_iam_policy(request=policy_request(resource)))
    except exceptions.GoogleAPICallError as exc:
        return Level(resource, {}, f"{type(exc).__name__}: {exc.message}")


def policy_level_of(resource: str, policy: policy_pb2.Policy) -> Level:
    return Level(resource, policy_grants(policy), conditional=policy_conditional(policy))


def role_permissions(role: str, creds: Credentials | None = None) -> tuple[frozenset[str], str]:
    """The permissions a custom role holds (IAM ``roles.get``), and ''; or nothing and why it cannot be read."""
    from google.api_core import exceptions
    from google.cloud import iam_admin_v1

    client = google_client(iam_admin_v1.IAMClient, IAM_EMULATOR_HOST_ENV, creds=creds)
    try:
        found = client.get_role(request={"name": role})
    except exceptions.GoogleAPICallError as exc:
        return frozenset(), f"{type(exc).__name__}: {exc.message}"
    return frozenset(found.included_permissions), ""
