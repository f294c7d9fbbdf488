"""What a task needs on Kubeflow Pipelines to call Google Cloud, checked before a run is created: it runs as the
pipeline runner's Kubernetes service account, which gets a Google service account's credentials by Workload
Identity Federation for GKE only when that Google account's IAM policy grants ``roles/iam.workloadIdentityUser`` to
``serviceAccount:PROJECT.svc.id.goog[NAMESPACE/KSA]``
(https://cloud.google.com/kubernetes-engine/docs/how-to/workload-identity); and that Google account holds the roles
every run needs on the project. Each permission a stage needs is checked again at run time, as that identity, by the
provision stage's preflight (``components.platforms.gke.checks.preflight``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from components.spec import SpecError
from components.spec.gke_checks import SERVICE_ACCOUNT

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

WORKLOAD_IDENTITY_USER = "roles/iam.workloadIdentityUser"
# The roles every run needs of the identity its tasks run as: the cluster and its node pools (docs/gke.md, "IAM
# roles") and the model registry in Vertex AI Model Registry (docs/vertex.md, "Setup, once").
RUN_ROLES = (
    ("roles/container.admin", "creating and deleting the run's cluster, node pools and Kubernetes objects"),
    ("roles/aiplatform.user", "registering the run's model in Vertex AI Model Registry"),
)
# The KFP runner's Kubernetes service account on KFP standalone (its manifests' pipeline-runner in kubeflow:
# DefaultPipelineRunnerServiceAccount, backend/src/apiserver/common/const.go in kubeflow/pipelines at 2.17.0), and on a
# multi-user server, where a run's pods run in its profile's namespace as that profile's default-editor
# (DEFAULTPIPELINERUNNERSERVICEACCOUNT, manifests/kustomize/base/installs/multi-user/api-service/params.env, applied
# by setDefaultServiceAccount in backend/src/apiserver/template/template.go; the profile controller makes
# default-editor in every profile's namespace: https://www.kubeflow.org/docs/components/central-dash/profiles/).
DEFAULT_RUNNER = "pipeline-runner"
MULTI_USER_RUNNER = "default-editor"
# A service account's name is a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 characters
# (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-subdomain-names).
KSA_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def runner(service_account: str, runner: str) -> str:
    """The Kubernetes service account the run's pods run as, as the flags name it: ``--service-account`` (what
    ``kfp.Client`` sends as the run's ``service_account``), else ``--kfp-runner``; "" for the server's default
    (``DEFAULT_RUNNER``, ``MULTI_USER_RUNNER``). A SpecError for a name that is not a Kubernetes service account's (a
    Google service account's e-mail, say) or for the two flags naming different ones."""
    for flag, name in (("--service-account", service_account), ("--kfp-runner", runner)):
        if name and not KSA_NAME.match(name):
            raise SpecError(
                flag,
                f"{name!r} is not a Kubernetes service account name: with --kfp-host the run's pods run as a "
                "Kubernetes service account of --kfp-namespace; the Google service account it acts as is "
                "--kfp-service-account",
                [MULTI_USER_RUNNER, DEFAULT_RUNNER],
            )
    if service_account and runner and service_account != runner:
        raise SpecError("--kfp-runner", f"{runner} is not the run's --service-account {service_account}")
    return service_account or runner


def check(
    project: str,
    account: str,
    namespace: str,
    runner: str,
    log: Callable[[str], None] = print,
    creds: Credentials | None = None,
) -> None:
    """SpecError naming ``--kfp-service-account`` when the Workload Identity binding or a role is missing; the risks
    of basic roles as warnings."""
    from components.cloud import iam
    from components.cloud.credentials import credentials
    from components.platforms.gke.plan import identities

    if not SERVICE_ACCOUNT.match(account):
        raise SpecError("--kfp-service-account", f"{account!r} is not a service account email")
    creds = creds or credentials()
    member = f"serviceAccount:{project}.svc.id.goog[{namespace}/{runner}]"
    if member not in iam.account_members(account, WORKLOAD_IDENTITY_USER, creds):
        raise SpecError(
            "--kfp-service-account",
            f"{account} does not let the KFP runner {namespace}/{runner} act as it: grant {WORKLOAD_IDENTITY_USER} "
            f"to {member} on it, and annotate the Kubernetes service account with iam.gke.io/gcp-service-account="
            f'{account} (docs/kubeflow.md, "Setup, once")',
        )
    policy = iam.project_level(project, creds)
    granted = policy.grants.get(f"serviceAccount:{account}", set())
    for role, purpose in RUN_ROLES:
        if role not in granted and not identities.basic_roles(granted):
            # A grant under an IAM condition holds only for the requests it admits: not counted (cloud.iam).
            # Conditions narrow real grants (a cluster's name, an expiry, Privileged Access Manager's grants are
            # conditional bindings), so a conditional one is said, not refused: the provision stage's preflight asks
            # IAM itself (projects.testIamPermissions), which evaluates the condition, before anything is created.
            under = iam.under_conditions(policy.conditional.get(f"serviceAccount:{account}", {}), [role])
            if under:
                log(
                    f"warning: --kfp-service-account: {account} holds {role} on project {project} ({purpose}) only "
                    f"as {under[0]}: IAM grants it only to the requests the condition admits, which this check does "
                    f"not evaluate; make sure it admits the run's (its cluster, its dates)"
                )
                continue
            raise SpecError(
                "--kfp-service-account", f"{account} lacks {role} on project {project}, needed for {purpose}"
            )
    advice = "give the KFP runner a dedicated account with the roles docs/kubeflow.md lists"
    for warning in identities.account_risks("the pipeline's tasks run on KFP", account, granted, project, advice):
        log(warning)
