"""The service accounts a gke run acts as and exactly the roles each needs, where each is granted: the plan's
``identities`` (``tpupipe plan``), what the dedicated accounts are created with (docs/gke.md, "IAM roles") and what
preflight checks of them. A default account (the Compute Engine default one for the nodes, the project's default
build account for Cloud Build) is marked ``default``: refused unless ``gke.allow_default_identities``.

Sources: the nodes' roles are ``target.node_roles`` (GKE docs, "Use least privilege IAM service accounts":
https://cloud.google.com/kubernetes-engine/docs/how-to/hardening-your-cluster#use_least_privilege_sa), image pulls on
the image's repository alone (https://cloud.google.com/artifact-registry/docs/access-control#gke); Cloud Build's
are what a build with a user-specified account needs: its logs (roles/logging.logWriter,
https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts), the build context in
the bucket (roles/storage.objectViewer) and the push (roles/artifactregistry.writer on the repository,
https://cloud.google.com/artifact-registry/docs/access-control).
"""

from __future__ import annotations

from typing import Any

from components.platforms.gke.plan import identities
from components.platforms.gke.plan.target import IMAGE_PULL_ROLE, Target, node_roles
from components.spec import RunSpec


def _role(role: str, on: str, purpose: str) -> dict[str, str]:
    return {"role": role, "on": on, "for": purpose}


def plan_identities(spec: RunSpec, t: Target) -> list[dict[str, Any]]:
    """The nodes' account (when the run makes nodes) and Cloud Build's (when it builds its image), with their roles."""
    out = []
    repository = t.image.rsplit("/", 1)[0]
    if not t.queue:
        out.append(
            {
                "who": "the nodes",
                "field": "gke.node_service_account",
                "account": t.node_service_account,
                "default": identities.is_default(t.node_service_account),
                "roles": [
                    _role(role, f"repository {repository}" if role == IMAGE_PULL_ROLE else f"project {t.project}", why)
                    for role, (why, _) in node_roles(t).items()
                ],
            }
        )
    if not spec.gke.image:
        account = t.build_service_account
        out.append(
            {
                "who": "Cloud Build",
                "field": "gke.build_service_account",
                "account": account or "the project's default build account",
                "default": not account or identities.is_default(account),
                "roles": [
                    _role("roles/logging.logWriter", f"project {t.project}", "the build's logs"),
                    _role("roles/storage.objectViewer", f"bucket gs://{t.bucket}", "the build context"),
                    _role("roles/artifactregistry.writer", f"repository {repository}", "pushing the trainer image"),
                ],
            }
        )
    return out


def render(plan: dict[str, Any]) -> list[str]:
    """The plan's text lines of its identities."""
    out = [
        f"identities (dedicated accounts, granted only these; a default one is refused unless {identities.ALLOW_FLAG})"
    ]
    for who in plan["identities"]:
        mark = "  [a default account: refused]" if who["default"] else ""
        out.append(f"  {who['who']} ({who['field']}): {who['account']}{mark}")
        out += [f"    {r['role']} on {r['on']}: {r['for']}" for r in who["roles"]]
    return out
