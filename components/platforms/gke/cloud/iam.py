"""What IAM grants beyond a project's own policy, read-only: the policies a project inherits from its folders and
organization, and what a custom role holds (docs/architecture.md, "Cloud calls through the client libraries").

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

The clients go to the emulators named by $TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST and $TPUPIPE_IAM_EMULATOR_HOST, as the
project's (``storage``) do. Cloud SDKs are imported inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.cloud.credentials import google_client
from components.cloud.storage import (
    IAM_EMULATOR_HOST_ENV,
    RESOURCE_MANAGER_EMULATOR_HOST_ENV,
    policy_grants,
)

CUSTOM_ROLE_PREFIXES = ("projects/", "organizations/")  # a custom role's name; a predefined one is roles/NAME


@dataclass(frozen=True)
class Level:
    """One policy that grants roles on a project: the project's own or an ancestor's, and whether it could be read."""

    resource: str  # projects/P, folders/ID, organizations/ID
    grants: dict[str, set[str]]  # member -> the roles this policy grants it
    unread: str = ""  # why the policy could not be read ('' when it was)


def ancestors(project: str, creds=None) -> list[Level]:
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
    folders = organizations = None
    found: list[Level] = []
    while parent:
        if parent.startswith("folders/"):
            folders = folders or google_client(rm.FoldersClient, RESOURCE_MANAGER_EMULATOR_HOST_ENV, creds=creds)
            found.append(_level(parent, folders.get_iam_policy))
            try:
                parent = folders.get_folder(name=parent).parent
            except exceptions.GoogleAPICallError as exc:
                found.append(Level(f"the parent of {parent}", {}, f"{type(exc).__name__}: {exc.message}"))
                break
        elif parent.startswith("organizations/"):
            organizations = organizations or google_client(
                rm.OrganizationsClient, RESOURCE_MANAGER_EMULATOR_HOST_ENV, creds=creds
            )
            found.append(_level(parent, organizations.get_iam_policy))
            break
        else:
            break
    return found


def _level(resource: str, get_iam_policy) -> Level:
    from google.api_core import exceptions

    try:
        return Level(resource, policy_grants(get_iam_policy(request={"resource": resource})))
    except exceptions.GoogleAPICallError as exc:
        return Level(resource, {}, f"{type(exc).__name__}: {exc.message}")


def role_permissions(role: str, creds=None) -> tuple[frozenset[str], str]:
    """The permissions a custom role holds (IAM ``roles.get``), and ''; or nothing and why it cannot be read."""
    from google.api_core import exceptions
    from google.cloud import iam_admin_v1

    client = google_client(iam_admin_v1.IAMClient, IAM_EMULATOR_HOST_ENV, creds=creds)
    try:
        found = client.get_role(request={"name": role})
    except exceptions.GoogleAPICallError as exc:
        return frozenset(), f"{type(exc).__name__}: {exc.message}"
    return frozenset(found.included_permissions), ""
