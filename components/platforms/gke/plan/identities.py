"""Who a run's parts act as, and the risks of an identity with more than it needs, as warnings: preflight's for the
nodes' and Cloud Build's accounts, ``tpupipe submit``'s and ``tpupipe schedule create``'s for the pipeline's
(``pipelines.backends.vertex.service_account``). Pure text and sets: the callers read the project's IAM policy.

Sources:
- the Compute Engine default service account, ``PROJECT_NUMBER-compute@developer.gserviceaccount.com``, is
  automatically granted the basic Editor role on the project unless an organization policy turns that off:
  https://cloud.google.com/compute/docs/access/service-accounts#default_service_account
- GKE nodes should run as a dedicated account with ``roles/container.defaultNodeServiceAccount`` (and
  ``roles/artifactregistry.reader`` for image pulls from the project's registry), not the default one:
  https://cloud.google.com/kubernetes-engine/docs/how-to/hardening-your-cluster#use_least_privilege_sa
- a build that names no service account runs as the project's default build account: the legacy Cloud Build
  service account (``PROJECT_NUMBER@cloudbuild.gserviceaccount.com``) or, in newer projects, the Compute Engine
  default one: https://cloud.google.com/build/docs/cloud-build-service-account-updates
- App Engine's default service account, ``PROJECT_ID@appspot.gserviceaccount.com``, is another default account
  granted the Editor role where it is made: https://cloud.google.com/iam/docs/service-account-types#default
  (``is_default`` refuses all three)
- the basic roles Owner and Editor, which let their holder change nearly every resource of the project:
  https://cloud.google.com/iam/docs/roles-overview#basic
"""

from __future__ import annotations

from collections.abc import Iterable

from components.spec.gke_checks import DEFAULT_ACCOUNT, DEFAULT_COMPUTE_ACCOUNT

BASIC_ROLES = ("roles/owner", "roles/editor")
DEFAULT_COMPUTE = "PROJECT_NUMBER-compute@developer.gserviceaccount.com"  # as plans show it, the number not looked up
DEFAULT_ACCOUNT_DOC = "https://cloud.google.com/compute/docs/access/service-accounts#default_service_account"
NODE_ACCOUNT_DOC = (
    "https://cloud.google.com/kubernetes-engine/docs/how-to/hardening-your-cluster#use_least_privilege_sa"
)
BUILD_ACCOUNT_DOC = "https://cloud.google.com/build/docs/cloud-build-service-account-updates"
DEFAULT_ACCOUNTS_DOC = "https://cloud.google.com/iam/docs/service-account-types#default"


def is_default_compute(account: str) -> bool:
    """``account`` is a project's Compute Engine default service account (its number filled in, or not)."""
    return account == DEFAULT_COMPUTE or bool(DEFAULT_COMPUTE_ACCOUNT.match(account))


def is_default(account: str) -> bool:
    """``account`` is one of a project's default accounts (``DEFAULT_ACCOUNT``): the Compute Engine one, the legacy
    Cloud Build one or App Engine's."""
    return is_default_compute(account) or bool(DEFAULT_ACCOUNT.match(account))


def basic_roles(granted: Iterable[str]) -> list[str]:
    """The basic roles (Owner, Editor) among ``granted``."""
    return [role for role in BASIC_ROLES if role in set(granted)]


def default_compute_risk(who: str, account: str, advice: str) -> str:
    """The warning for ``who`` acting as the Compute Engine default service account ``account``."""
    return (
        f"{who} as {account}, the project's Compute Engine default service account, which in many projects holds "
        f"the basic Editor role on the whole project ({DEFAULT_ACCOUNT_DOC}): {advice}"
    )


def basic_role_risks(who: str, account: str, granted: Iterable[str], project: str, advice: str) -> list[str]:
    """One warning per basic role the project's IAM policy grants ``account``."""
    return [
        f"{who} as {account}, which holds {role} on project {project}: whoever compromises it can change anything "
        f"in the project: {advice}, and remove {role} from it"
        for role in basic_roles(granted)
    ]


def account_risks(who: str, account: str, granted: Iterable[str], project: str, advice: str) -> list[str]:
    """The warnings for ``who`` acting as ``account``: the Compute Engine default one, a basic role on the project."""
    out = [default_compute_risk(who, account, advice)] if is_default_compute(account) else []
    return out + basic_role_risks(who, account, granted, project, advice)


ALLOW_FLAG = "--allow-default-identities"


def default_doc(account: str) -> str:
    """The page that says what the default ``account`` is granted: the Compute Engine one's, the legacy Cloud Build
    one's, or IAM's list of default service accounts (App Engine's)."""
    if account.endswith("@cloudbuild.gserviceaccount.com"):
        return BUILD_ACCOUNT_DOC
    if account.endswith("@appspot.gserviceaccount.com"):
        return DEFAULT_ACCOUNTS_DOC
    return DEFAULT_ACCOUNT_DOC


def default_refusal(who: str, account: str, fix: str) -> str:
    """The refusal of ``who`` acting as a project's default identity ``account``: the risk, the fix, the way round."""
    return (
        f"{who} as {account}, a default account of the project, often granted broad roles on all of it "
        f"({default_doc(account)}): {fix}; or pass {ALLOW_FLAG} (gke.allow_default_identities=true) to accept it"
    )


def node_refusal(account: str) -> str:
    """Why the nodes may not run as the Compute Engine default account (``gke.node_service_account`` empty or it)."""
    return default_refusal(
        "the nodes (and every pod without Workload Identity) would act",
        account,
        "name a dedicated account in gke.node_service_account, granted only the roles `tpupipe plan` lists for it "
        f"({NODE_ACCOUNT_DOC})",
    )


def build_refusal(account: str) -> str:
    """Why Cloud Build may not build as the project's default build account (``gke.build_service_account``)."""
    return default_refusal(
        "Cloud Build would build the trainer image",
        account or "the project's default build account (the legacy Cloud Build account or the Compute Engine one)",
        "name a dedicated account in gke.build_service_account, granted only the roles `tpupipe plan` lists for it "
        f"({BUILD_ACCOUNT_DOC})",
    )


def node_risks(account: str, granted: Iterable[str], project: str) -> list[str]:
    """What preflight warns of the nodes' account (``gke.node_service_account``)."""
    who = "the nodes (and every pod without Workload Identity) act"
    advice = (
        "name a dedicated account in gke.node_service_account, granted roles/container.defaultNodeServiceAccount "
        f"(and roles/artifactregistry.reader when the nodes pull from this project's Artifact Registry): "
        f"{NODE_ACCOUNT_DOC}"
    )
    return account_risks(who, account, granted, project, advice)


def build_risks(account: str, granted: Iterable[str], project: str) -> list[str]:
    """What preflight warns of Cloud Build's account (``gke.build_service_account``); empty: the default's risk."""
    advice = (
        "name a dedicated account in gke.build_service_account, granted roles/logging.logWriter, read access to the "
        'build context\'s bucket and roles/artifactregistry.writer on the repository (docs/gke.md, "IAM roles")'
    )
    if not account:
        return [
            "gke.build_service_account is empty: Cloud Build runs the image build as the project's default build "
            "account (the legacy Cloud Build service account or, in newer projects, the Compute Engine default "
            f"service account, often with broad roles on the project: {BUILD_ACCOUNT_DOC}): {advice}"
        ]
    return account_risks("Cloud Build runs the image build", account, granted, project, advice)


__all__ = [
    "ALLOW_FLAG",
    "BASIC_ROLES",
    "build_refusal",
    "default_refusal",
    "node_refusal",
    "DEFAULT_COMPUTE",
    "account_risks",
    "basic_role_risks",
    "basic_roles",
    "build_risks",
    "default_compute_risk",
    "is_default",
    "is_default_compute",
    "node_risks",
]
