"""What a task needs on Kubeflow Pipelines to call Google Cloud, checked before a recurring run (or a run) is created:
the Workload Identity binding of the KFP runner to the Google service account (that account's own IAM policy, read
from the emulated IAM API) and the roles every run needs on the project."""

from __future__ import annotations

from tests.emulators.project import PROJECT
from tests.kfp.test_kfp_backend import OVERRIDES

ACCOUNT = f"tpupipe-pipeline@{PROJECT}.iam.gserviceaccount.com"
MEMBER = f"serviceAccount:{PROJECT}.svc.id.goog[kubeflow/pipeline-runner]"


def _create(kfp, tpupipe, *extra: str):
    args = ["schedule", "create", "nightly", "local-fsdp", "--set", OVERRIDES, "--cron", "0 3 * * *"]
    return tpupipe(*args, "--kfp-host", kfp.host, "--kfp-service-account", ACCOUNT, *extra)


def test_the_runner_binding_and_the_roles_are_checked_before_anything_is_created(kfp, tpupipe):
    iam = kfp.project.projects
    code, out, err = _create(kfp, tpupipe)
    assert code == 2 and "--kfp-service-account" in err and MEMBER in err and "roles/iam.workloadIdentityUser" in err
    assert kfp.server.calls == [] and "serviceAccounts.GetIamPolicy" in iam.calls
    # Bound to another runner (a profile namespace's): still not this one.
    iam.bind_on_account(ACCOUNT, "roles/iam.workloadIdentityUser", MEMBER.replace("kubeflow/", "team-a/"))
    assert _create(kfp, tpupipe)[0] == 2
    iam.bind_on_account(ACCOUNT, "roles/iam.workloadIdentityUser", MEMBER)
    code, out, err = _create(kfp, tpupipe)
    assert code == 2 and "lacks roles/container.admin" in err, err
    iam.grant(PROJECT, "roles/container.admin", f"serviceAccount:{ACCOUNT}")
    iam.grant(PROJECT, "roles/aiplatform.user", f"serviceAccount:{ACCOUNT}")
    code, out, err = _create(kfp, tpupipe)
    assert code == 0 and "warning" not in err, out + err
    assert len(kfp.server.recurring) == 1
    # The runner of a profile namespace is named with --kfp-runner; a basic role is a warning, not a refusal.
    iam.bind_on_account(
        ACCOUNT, "roles/iam.workloadIdentityUser", MEMBER.replace("kubeflow/pipeline-runner", "kubeflow/default-editor")
    )
    iam.grant(PROJECT, "roles/editor", f"serviceAccount:{ACCOUNT}")
    code, out, err = _create(kfp, tpupipe, "--kfp-runner", "default-editor")
    assert code == 0 and "holds roles/editor" in err, out + err


def test_a_role_the_runners_account_holds_only_under_an_iam_condition_is_said_naming_it_and_the_run_goes_on(
    kfp, tpupipe
):
    """A binding with a condition grants only to the requests it admits, which this check does not evaluate: said,
    naming the condition, and left to the provision stage's preflight (IAM's testIamPermissions evaluates it); a role
    held by no binding at all is refused before anything is created."""
    iam = kfp.project.projects
    iam.bind_on_account(ACCOUNT, "roles/iam.workloadIdentityUser", MEMBER)
    until = {"title": "until-2030", "expression": 'request.time < timestamp("2030-01-01T00:00:00Z")'}
    iam.grant(PROJECT, "roles/container.admin", f"serviceAccount:{ACCOUNT}", condition=until)
    code, out, err = _create(kfp, tpupipe)
    assert code == 2 and kfp.server.calls == [], out + err
    assert f"lacks roles/aiplatform.user on project {PROJECT}" in err, err
    iam.grant(PROJECT, "roles/aiplatform.user", f"serviceAccount:{ACCOUNT}")
    code, out, err = _create(kfp, tpupipe)
    assert code == 0, out + err
    assert (
        f"{ACCOUNT} holds roles/container.admin on project {PROJECT} (creating and deleting the run's cluster, node "
        "pools and Kubernetes objects) only as roles/container.admin (under the condition 'until-2030')"
    ) in err, err
