"""Who a gke run's parts act as, against the emulated project: preflight warns, from the one read of the project's IAM
policy, when the nodes or Cloud Build run as a default account or as one that holds a basic role (the run goes on);
the build runs as gke.build_service_account when it names one, and the caller must be able to act as it."""

from __future__ import annotations

import pytest
from google.cloud.devtools import cloudbuild_v1

from components.platforms.gke.plan.needs import needs
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT, PROJECT_NUMBER
from tests.gke.test_gke_platform import BUILD, context, platform
from tests.gke.test_preflight import preflight_cli

DEFAULT = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
NODES = f"tpu-nodes@{PROJECT}.iam.gserviceaccount.com"
BUILDER = f"tpu-builder@{PROJECT}.iam.gserviceaccount.com"
DEDICATED_NODES = f"{ONE_SLICE} gke.node_service_account={NODES}"


def _nodes(project, *roles: str) -> None:
    """NODES granted ``roles``, else what nodes need (and, as BUILD's image is in this project's registry, image
    pulls and image streaming)."""
    for role in roles or (
        "roles/container.defaultNodeServiceAccount",
        "roles/artifactregistry.reader",
        "roles/serviceusage.serviceUsageConsumer",
    ):
        project.projects.grant(PROJECT, role, f"serviceAccount:{NODES}")


def warnings(text: str) -> list[str]:
    """The report's warnings but v6e's quota's (each is logged as found, and in the report that ends it)."""
    found = [line.split("warning: ", 1)[1] for line in text.splitlines() if "warning: " in line]
    return [w for w in dict.fromkeys(found) if not w.startswith("TPU quota not checked")]


def test_nodes_on_the_default_compute_account_are_a_warning_naming_the_risk_and_the_fix(project_factory, capsys):
    project_factory()
    code, text = preflight_cli(ONE_SLICE, capsys)
    assert code == 0, text  # a warning: the run goes on
    (warning,) = [w for w in warnings(text) if "the nodes" in w]
    for needle in (
        f"the nodes (and every pod without Workload Identity) act as {DEFAULT}, the project's Compute Engine "
        "default service account, which in many projects holds the basic Editor role on the whole project",
        "https://cloud.google.com/compute/docs/access/service-accounts#default_service_account",
        "name a dedicated account in gke.node_service_account, granted roles/container.defaultNodeServiceAccount",
        "roles/artifactregistry.reader",
        "https://cloud.google.com/kubernetes-engine/docs/how-to/hardening-your-cluster#use_least_privilege_sa",
    ):
        assert needle in warning


@pytest.mark.parametrize("role", ["roles/editor", "roles/owner"])
def test_a_node_account_with_a_basic_role_is_a_warning_naming_the_role(project_factory, capsys, role):
    project = project_factory()
    _nodes(project, role)  # which includes every role nodes need: no problem
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 0, text
    (warning,) = warnings(text)
    assert f"act as {NODES}, which holds {role} on project {PROJECT}" in warning
    assert "whoever compromises it can change anything in the project" in warning and f"remove {role}" in warning


def test_a_dedicated_node_account_with_the_node_role_is_no_warning_and_a_missing_role_still_a_problem(
    project_factory, capsys
):
    project = project_factory()
    project.projects.grant(PROJECT, "roles/editor", f"serviceAccount:{DEFAULT}")  # another account's: not looked at
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 2 and f"the nodes' service account {NODES} lacks roles/logging.logWriter" in text
    _nodes(project, "roles/container.defaultNodeServiceAccount")
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 0 and warnings(text) == [], text
    assert project.projects.calls.count("GetIamPolicy") == 2  # one read of the policy per preflight


def test_a_build_as_the_default_build_account_is_a_warning(project_factory, capsys):
    project = project_factory()
    _nodes(project)
    code, text = preflight_cli(f"{BUILD} gke.node_service_account={NODES}", capsys)
    assert code == 0, text
    (warning,) = warnings(text)
    assert warning.startswith(
        "gke.build_service_account is empty: Cloud Build runs the image build as the project's default build account "
        "(the legacy Cloud Build service account or, in newer projects, the Compute Engine default service account"
    )
    assert "https://cloud.google.com/build/docs/cloud-build-service-account-updates" in warning
    assert "roles/artifactregistry.writer" in warning
    code, text = preflight_cli(DEDICATED_NODES, capsys)  # gke.image names the image: no build, no warning
    assert code == 0 and warnings(text) == [], text


def test_a_named_build_account_is_acted_as_and_a_basic_role_on_it_is_a_warning(project_factory, capsys):
    project = project_factory()
    _nodes(project)
    overrides = f"{BUILD} gke.node_service_account={NODES} gke.build_service_account={BUILDER}"
    assert "iam.serviceAccounts.actAs" in needs(resolve("local-fsdp", overrides), "pre").permissions
    code, text = preflight_cli(overrides, capsys)
    assert code == 0 and warnings(text) == [], text
    project.projects.grant(PROJECT, "roles/owner", f"serviceAccount:{BUILDER}")
    code, text = preflight_cli(overrides, capsys)
    (warning,) = warnings(text)
    assert f"Cloud Build runs the image build as {BUILDER}, which holds roles/owner on project {PROJECT}" in warning
    project.projects.deny("iam.serviceAccounts.actAs")
    code, text = preflight_cli(overrides, capsys)
    assert code == 2 and "2 problems" in text, text
    assert (
        f"gke.build_service_account: the caller lacks iam.serviceAccounts.actAs on project {PROJECT} and on "
        f"{BUILDER}: Cloud Build runs the image build as it, and Cloud Build starts no build for a caller that cannot "
        "act as it"
    ) in text
    assert f"gke.node_service_account: the caller lacks iam.serviceAccounts.actAs on project {PROJECT}" in text
    # Least privilege: roles/iam.serviceAccountUser granted on each account alone, not on the project, is enough
    # (what docs/gke.md asks for); seen with the IAM API's testIamPermissions on the account.
    project.projects.grant_on_account(BUILDER, "iam.serviceAccounts.actAs")
    project.projects.grant_on_account(NODES, "iam.serviceAccounts.actAs")
    code, text = preflight_cli(overrides, capsys)
    assert code == 0, text
    assert f"iam.serviceAccounts.actAs on {BUILDER} (gke.build_service_account), granted on the account" in text
    assert project.projects.calls.count("serviceAccounts.TestIamPermissions") >= 2


def test_image_streaming_needs_its_api_and_a_named_node_account_its_role_in_the_images_project(project_factory, capsys):
    """GKE's "Use Image streaming to pull container images" requirements, for the cluster the run creates: the
    Container File System API enabled, and a node account other than the default granted Service Usage Consumer in
    the project that holds the image (here: BUILD's image is in this project's registry)."""
    project = project_factory()
    _nodes(project, "roles/container.defaultNodeServiceAccount", "roles/artifactregistry.reader")
    project.services.disable("containerfilesystem.googleapis.com")
    overrides = f"{BUILD} gke.node_service_account={NODES} gke.build_service_account={BUILDER}"
    code, text = preflight_cli(overrides, capsys)
    assert code == 2 and "2 problems" in text, text
    assert f"apis: not enabled in project {PROJECT}: containerfilesystem.googleapis.com" in text
    assert (
        f"gke.node_service_account: the nodes' service account {NODES} lacks roles/serviceusage.serviceUsageConsumer "
        f"on project {PROJECT}, needed for image streaming"
    ) in text
    # On an existing cluster the run turns nothing on: neither is asked.
    existing = needs(resolve("local-fsdp", overrides + " gke.cluster_name=shared"), "pre")
    assert "containerfilesystem.googleapis.com" not in existing.services
    assert "roles/serviceusage.serviceUsageConsumer" not in [role for role, _, _ in existing.node_roles]


def test_a_build_account_that_is_not_an_email_is_refused_naming_the_field():
    from components.spec import SpecError

    with pytest.raises(SpecError, match="gke.build_service_account: 'builder' is not a service account email"):
        resolve("local-fsdp", f"{BUILD} gke.build_service_account=builder")


def test_the_build_runs_as_the_named_account_with_its_logs_in_cloud_logging_only(tmp_path, project_factory):
    project = project_factory()
    ctx = context(tmp_path, "builder", f"{BUILD} gke.build_service_account={BUILDER}")
    result = platform().build_image(ctx)
    (build,) = project.cloudbuild.state.builds.values()
    assert result["built"] and build.status.name == "SUCCESS"
    assert build.service_account == f"projects/{PROJECT}/serviceAccounts/{BUILDER}"
    assert build.options.logging == cloudbuild_v1.BuildOptions.LoggingMode.CLOUD_LOGGING_ONLY
    # No account named: the field is left to Cloud Build (the image of these sources gone, so it is built again).
    images = project.registry.state.images
    for reused in [i for i in images if ":ctx-" in i]:
        del images[reused]
    platform().build_image(context(tmp_path, "nobuilder", BUILD))
    assert [b.service_account for b in project.cloudbuild.state.builds.values()][1] == ""
