"""Whether the nodes' service account (``gke.node_service_account``) holds the roles nodes need on the project
(``needs.node_roles``), wherever IAM grants them:

- on the project itself: the project's policy, the one read preflight shares with the build account's warnings;
- inherited from the project's folders and organization (``cloud.iam.ancestors``), read only when the project's own
  grants leave a role missing; an ancestor's policy the caller may not read is a warning naming it;
- image pulls (roles/artifactregistry.reader) on the trainer image's repository itself (its IAM policy, read only
  when the levels above leave that role missing), where docs/gke.md grants it;
- through a custom role that holds the permissions the role is needed for (``ROLE_PERMISSIONS``; its definition read
  with IAM ``roles.get``), granted at any of those levels; one that cannot be read is a warning;
- through a Google group (``group:G`` in a binding that would grant it): whether the account is a member only Cloud
  Identity can say (https://cloud.google.com/identity/docs/reference/rest/v1/groups.memberships/checkTransitiveMembership,
  an API and a permission of its own that the run does not otherwise need), so such a role is a warning naming the
  group and the role, not a problem;
- under an IAM condition (a binding with a ``condition``, ``cloud.iam``): IAM grants it only to the requests the
  condition holds for, which preflight does not evaluate, so such a role is not counted; a warning names it and the
  condition's title, not a problem, as for a group.

A role held none of these ways is a problem: nodes without it fail late and obscurely (image pulls refused, no logs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from components.cloud import iam
from components.platforms.gke.checks.findings import Problem, Report
from components.platforms.gke.plan import identities
from components.platforms.gke.plan.needs import Needs
from components.platforms.gke.plan.target import IMAGE_PULL_ROLE

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

# What each role is needed for, as permissions a custom role must hold to stand in for it: the ones the nodes use of
# each (the full lists: https://cloud.google.com/iam/docs/roles-permissions/artifactregistry#artifactregistry.reader,
# .../logging#logging.logWriter, .../monitoring#monitoring.metricWriter,
# .../serviceusage#serviceusage.serviceUsageConsumer).
ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    # pulling an image: "artifactregistry.repositories.downloadArtifacts"
    # (https://cloud.google.com/artifact-registry/docs/access-control#permissions)
    "roles/artifactregistry.reader": ("artifactregistry.repositories.downloadArtifacts",),
    # entries.write needs it on the log's project (https://cloud.google.com/logging/docs/reference/v2/rest/v2/entries/write)
    "roles/logging.logWriter": ("logging.logEntries.create",),
    # timeSeries.create needs it (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.timeSeries/create)
    "roles/monitoring.metricWriter": ("monitoring.timeSeries.create",),
    # using a project's services for quota and billing (https://cloud.google.com/service-usage/docs/access-control)
    "roles/serviceusage.serviceUsageConsumer": ("serviceusage.services.use",),
}


def check(n: Needs, account: str, project: iam.Level, creds: Credentials, report: Report) -> None:
    """``project``: the project's own policy, read once by preflight."""
    member = f"serviceAccount:{account}"
    report.warnings += identities.node_risks(account, project.grants.get(member, set()), n.project)
    roles = _Roles(creds)
    levels = [project]
    missing = [need for need in n.node_roles if not roles.cover(need, _held(member, levels))]
    if missing:
        levels += iam.ancestors(n.project, creds)
        missing = [need for need in missing if not roles.cover(need, _held(member, levels))]
        held_above = sorted({f"{role} on {level.resource}" for level in levels[1:] for role in _held(member, [level])})
        if held_above:
            report.checked.append(f"the nodes' service account {account} inherits {', '.join(held_above)}")
    read = list(levels)  # every policy read, for the grants under a condition or to a group
    if n.image_repository and any(need[0] == IMAGE_PULL_ROLE for need in missing):
        repository = _repository_level(n.image_repository, creds)
        read.append(repository)
        # Denied the read, the caller cannot see a grant there (a warning); a repository not found holds none.
        denied = repository.unread.startswith("PermissionDenied")
        if denied:
            report.warnings.append(
                f"the IAM policy of the repository {repository.resource} could not be read ({repository.unread}): "
                f"{IMAGE_PULL_ROLE} granted to the nodes' account {account} there is not seen: if it is not granted, "
                "the nodes' image pulls fail"
            )  # a warning alone: a grant on the repository is the documented setup (docs/gke.md)
        missing = [
            m
            for m in missing
            if m[0] != IMAGE_PULL_ROLE or (not denied and not roles.cover(m, _held(member, [repository])))
        ]
    for level in levels[1:]:
        if level.unread:
            report.warnings.append(
                f"the roles {level.resource} grants (project {n.project} inherits them) could not be read "
                f"({level.unread}): a role the nodes' account {account} holds there is not seen"
            )
    for need in missing:
        role, purpose, _ = need
        conditional = sorted(
            f"{granted} on {level.resource} under the condition {title!r}"
            for level in read
            for granted, titles in level.conditional.get(member, {}).items()
            if roles.cover(need, {granted})
            for title in titles
        )
        if conditional:
            report.warnings.append(
                f"the nodes' service account {account} holds {role} ({purpose}) only under an IAM condition: "
                f"{'; '.join(conditional)}: IAM grants it only to the requests the condition holds for, which "
                "preflight does not evaluate; make sure it admits the run's requests (its cluster, its dates)"
            )
            continue
        groups = sorted(
            f"{who.removeprefix('group:')} ({granted} on {level.resource})"
            for level in levels
            for who, granted_roles in level.grants.items()
            if who.startswith("group:")
            for granted in granted_roles
            if roles.cover(need, {granted})
        )
        if groups:
            report.warnings.append(
                f"the nodes' service account {account} holds {role} ({purpose}) only if it is a member of "
                f"{'; '.join(groups)}: group membership is Cloud Identity's to say and is not checked; grant the role "
                "to the account itself to be sure"
            )
            continue
        report.problems.append(
            Problem(
                "gke.node_service_account",
                f"the nodes' service account {account} lacks {role} on {_where(role, n)}, needed for {purpose}: "
                "grant it that role (or one that includes it), or name another account",
            )
        )
    report.warnings += roles.unread
    report.checked.append(f"the nodes' service account {account}: {len(n.node_roles)} roles needed")


def _where(role: str, n: Needs) -> str:
    """Where ``role`` is granted: image pulls on the image's repository (or the project), the others on the project."""
    if role == IMAGE_PULL_ROLE and n.image_repository:
        return f"repository {n.image_repository} (or project {n.project})"
    return f"project {n.project}"


def _repository_level(repository: str, creds: Credentials) -> iam.Level:
    """The trainer image's repository's own IAM policy (Artifact Registry ``GetIamPolicy``): image pulls may be
    granted there alone, the least the nodes need (https://cloud.google.com/artifact-registry/docs/access-control#gke);
    read only when the project and its ancestors do not grant them."""
    from components.cloud.build import registry_client

    return iam.policy_level(repository, registry_client(creds).get_iam_policy)


def _held(member: str, levels: list[iam.Level]) -> set[str]:
    return {role for level in levels for role in level.grants.get(member, set())}


class _Roles:
    """Whether roles cover a need: a predefined role known to include it, or a custom role whose definition (read
    once per preflight) holds the need's permissions."""

    def __init__(self, creds: Credentials):
        self.creds = creds
        self.read: dict[str, frozenset[str]] = {}
        self.unread: list[str] = []

    def cover(self, need: tuple[str, str, tuple[str, ...]], roles: set[str]) -> bool:
        role, _, granted_by = need
        if roles & set(granted_by):
            return True
        wanted = set(ROLE_PERMISSIONS[role])
        return any(wanted <= self._permissions(r) for r in sorted(roles) if r.startswith(iam.CUSTOM_ROLE_PREFIXES))

    def _permissions(self, role: str) -> frozenset[str]:
        if role not in self.read:
            self.read[role], why = iam.role_permissions(role, self.creds)
            if why:
                self.unread.append(f"the custom role {role} could not be read ({why}): what it holds is not seen")
        return self.read[role]
