"""The service account a pipeline runs as on Vertex AI (``--service-account`` of ``tpupipe submit`` and ``tpupipe
schedule create``): refused (exit 2, before any call) when it is the project's default identity, unless
``--allow-default-identities`` (``gke.allow_default_identities``); warnings on stderr when it holds more than the
pipeline needs.

- none given: Vertex AI runs the pipeline as the project's Compute Engine default service account
  (https://cloud.google.com/vertex-ai/docs/pipelines/configure-project#service-account), which in many projects
  holds the basic Editor role (``components.platforms.gke.plan.identities``); no call is made;
- one given: it is a default account (by its form: ``NUMBER-compute@developer.gserviceaccount.com``, the legacy
  Cloud Build one or App Engine's, ``identities.is_default``), or the
  project's IAM policy (one ``getIamPolicy``, Resource Manager) grants it a basic role (Owner, Editor); a policy the
  caller may not read is said in a warning, and the submit goes on.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from components.platforms.gke.plan import identities

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

VERTEX_ACCOUNT_DOC = "https://cloud.google.com/vertex-ai/docs/pipelines/configure-project#service-account"
ADVICE = (
    'pass --service-account with a dedicated account granted only the roles docs/vertex.md, "Setup, once" lists '
    f"({VERTEX_ACCOUNT_DOC})"
)
WHO = "Vertex AI runs the pipeline's tasks (which provision, build and tear down)"


def refuse_default(account: str, allowed: bool) -> None:
    """A SpecError naming --service-account when the pipeline would run as a project's default service account (none
    given: the Compute Engine one; or a default one named) and ``allowed`` is not set."""
    from components.spec import SpecError

    if allowed or (account and not identities.is_default(account)):
        return
    raise SpecError(
        "--service-account",
        ("not given: " if not account else "")
        + identities.default_refusal(WHO, account or identities.DEFAULT_COMPUTE, ADVICE),
        ["NAME@PROJECT.iam.gserviceaccount.com", identities.ALLOW_FLAG],
    )


def risks(project: str, account: str, creds: Credentials | None = None) -> list[str]:
    """The warnings for a pipeline of ``project`` that runs as ``account`` ("" for none given)."""
    if not account:
        return [
            "--service-account not given: " + identities.default_compute_risk(WHO, identities.DEFAULT_COMPUTE, ADVICE)
        ]
    from google.api_core import exceptions as gexc

    from components.cloud import iam

    out = [identities.default_compute_risk(WHO, account, ADVICE)] if identities.is_default_compute(account) else []
    try:
        granted = iam.project_roles(project, f"serviceAccount:{account}", creds)
    except gexc.PermissionDenied as exc:
        out.append(
            f"the IAM policy of project {project} could not be read ({exc.message}; reading it takes "
            f"resourcemanager.projects.getIamPolicy): whether {account} holds roles/owner or roles/editor there "
            "was not checked"
        )
    else:
        out += identities.basic_role_risks(WHO, account, granted, project, ADVICE)
    return [f"--service-account: {line}" for line in out]


def warn(project: str, account: str) -> None:
    """Each of :func:`risks`, on stderr."""
    for line in risks(project, account):
        print(f"tpupipe: warning: {line}", file=sys.stderr, flush=True)
