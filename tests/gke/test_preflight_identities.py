"""Who a gke run's parts act as, against the emulated project: the nodes or Cloud Build as a default account are
refused (exit 2, the field and the fix named, nothing created) unless gke.allow_default_identities
(``--allow-default-identities``), which ONE_SLICE sets; with it, preflight warns, from the one read of the project's
IAM policy, when they run as a default account or as one that holds a basic role (the run goes on); the build runs as
gke.build_service_account when it names one, and the caller must be able to act as it."""

from __future__ import annotations

import grpc
import pytest
from google.cloud.devtools import cloudbuild_v1

from components.platforms.gke.plan.needs import needs
from components.workload import resolve
from pipelines.cli.main import main as cli_main
from tests.emulators.project import ALLOW, ONE_SLICE, PROJECT, PROJECT_NUMBER
from tests.gke.test_gke_platform import BUILD, context, platform
from tests.gke.test_preflight import preflight_cli, refused

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


def test_default_identities_are_refused_naming_each_field_and_the_fix_unless_allowed(project_factory, capsys, tmp_path):
    """Nodes as the Compute Engine default account (none named, or it named) and a build as the project's default
    build account: exit 2, one problem each, before anything is created; --allow-default-identities accepts them."""
    project = project_factory()
    strict = BUILD.replace(ALLOW, "")
    assert "allow_default_identities" not in strict
    code, text = preflight_cli(strict, capsys)
    assert code == 2, text
    node_problem = (
        f"gke.node_service_account: the nodes (and every pod without Workload Identity) would act as {DEFAULT}, a "
        "default account of the project"
    )
    needles = (
        node_problem,
        "name a dedicated account in gke.node_service_account, granted only the roles `tpupipe plan` lists for it",
        "gke.build_service_account: Cloud Build would build the trainer image as the project's default build account",
        "name a dedicated account in gke.build_service_account",
        "or pass --allow-default-identities (gke.allow_default_identities=true) to accept it",
    )
    refused(project, tmp_path, strict, text, needles, problems=2)
    code, text = preflight_cli(f"{strict} gke.node_service_account={DEFAULT}", capsys)  # named: the same account
    assert code == 2 and node_problem in text, text
    code = cli_main(["preflight", "local-fsdp", "--set", strict, "--run-id", "pre", "--allow-default-identities"])
    assert code == 0, capsys.readouterr()


@pytest.mark.parametrize(
    "account",
    # the legacy Cloud Build service account, and App Engine's default one
    [f"{PROJECT_NUMBER}@cloudbuild.gserviceaccount.com", f"{PROJECT}@appspot.gserviceaccount.com"],
)
def test_the_other_default_accounts_are_refused_as_the_nodes_the_build_and_the_pipeline(
    project_factory, capsys, account
):
    from components.spec import SpecError
    from pipelines.backends.vertex import service_account

    project = project_factory()
    _nodes(project)
    strict = f"{BUILD} gke.node_service_account={account} gke.build_service_account={account}".replace(ALLOW, "")
    code, text = preflight_cli(strict, capsys)
    assert code == 2, text
    nodes = "gke.node_service_account: the nodes (and every pod without Workload Identity) would act as"
    assert f"{nodes} {account}" in text
    assert f"gke.build_service_account: Cloud Build would build the trainer image as {account}" in text
    with pytest.raises(SpecError, match=f"--service-account.*{account}"):
        service_account.refuse_default(account, allowed=False)
    service_account.refuse_default(account, allowed=True)  # --allow-default-identities


def test_dedicated_node_and_build_accounts_need_no_flag(project_factory, capsys):
    project = project_factory()
    _nodes(project)
    strict = f"{BUILD} gke.node_service_account={NODES} gke.build_service_account={BUILDER}".replace(ALLOW, "")
    code, text = preflight_cli(strict, capsys)
    assert code == 0 and warnings(text) == [], text


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


def test_the_node_account_granted_as_docs_gke_md_sets_it_up_passes_preflight(project_factory, capsys):
    """docs/gke.md's setup block: the repository made, image pulls granted on it alone, the other roles the plan
    lists on the project; preflight reads the repository's own policy and counts the grant there."""
    import re

    from google.cloud import artifactregistry_v1 as ar

    block = re.search(r"```\n(gcloud iam service-accounts create tpu-nodes.*?)```", _docs(), re.S)[1]
    project = project_factory()
    overrides = f"{BUILD} gke.node_service_account={NODES} gke.build_service_account={BUILDER}"
    repository = needs(resolve("local-fsdp", overrides), "pre").image_repository
    assert repository == f"projects/{PROJECT}/locations/us-east5/repositories/tpupipe"
    for role in re.search(r"for role in (.*?); do", block)[1].split():  # the project's grants
        project.projects.grant(PROJECT, role, f"serviceAccount:{NODES}")
    code, text = preflight_cli(overrides, capsys)  # no repository yet: its policy cannot be read, the role missing
    assert code == 2 and f"lacks roles/artifactregistry.reader on repository {repository}" in text, text
    assert "gcloud artifacts repositories create tpupipe --repository-format docker" in block
    docker = ar.Repository.Format.DOCKER
    project.registry.state.repositories[repository] = ar.Repository(name=repository, format_=docker)
    role = re.search(r"repositories add-iam-policy-binding tpupipe .*?--role (\S+)", block)[1]
    project.registry.grant(repository, role, f"serviceAccount:{NODES}")
    code, text = preflight_cli(overrides, capsys)
    assert code == 0 and warnings(text) == [], text
    assert project.registry.state.calls.count("GetIamPolicy") == 2  # read only where the project grants no pulls
    # A caller who may not read the repository's policy (artifactregistry.repositories.getIamPolicy) is told the grant
    # there is not seen, and the run goes on: the grant on the repository is the documented setup.
    from tests.emulators.cloudbuild import Fault

    project.registry.faults.append(
        Fault("GetIamPolicy", grpc.StatusCode.PERMISSION_DENIED, "permission denied", 1, lambda request: True)
    )
    code, text = preflight_cli(overrides, capsys)
    assert code == 0 and "lacks roles/artifactregistry.reader" not in text, text
    assert any(f"the IAM policy of the repository {repository} could not be read" in w for w in warnings(text)), text


def _docs() -> str:
    from pathlib import Path

    return (Path(__file__).parents[2] / "docs" / "gke.md").read_text()


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


def test_node_roles_inherited_from_a_folder_and_the_organization_are_held(project_factory, capsys):
    """IAM's effective policy is the project's and its ancestors' together: the node role granted on the
    organization and the log writer's on a folder between are enough. The ancestry is read only when the project's
    own policy leaves a role missing; an ancestor's policy the caller may not read is a warning naming it."""
    project = project_factory()
    project.projects.place(PROJECT, "folders/111", "folders/222", "organizations/333")
    project.projects.grant_above("folders/111", "roles/logging.logWriter", f"serviceAccount:{NODES}")
    project.projects.grant_above("organizations/333", "roles/monitoring.metricWriter", f"serviceAccount:{NODES}")
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 0 and warnings(text) == [], text
    assert (
        f"the nodes' service account {NODES} inherits roles/logging.logWriter on folders/111, "
        "roles/monitoring.metricWriter on organizations/333"
    ) in text
    assert {"folders.GetIamPolicy", "organizations.GetIamPolicy"} <= set(project.projects.calls)
    project.projects.deny("resourcemanager.organizations.getIamPolicy")
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 2 and f"{NODES} lacks roles/monitoring.metricWriter on project {PROJECT}" in text, text
    (warning,) = warnings(text)
    assert warning.startswith(f"the roles organizations/333 grants (project {PROJECT} inherits them) could not be read")
    # Granted on the project itself: no ancestor is read.
    _nodes(project, "roles/container.defaultNodeServiceAccount")
    calls = len(project.projects.calls)
    assert preflight_cli(DEDICATED_NODES, capsys)[0] == 0
    assert not {"folders.GetIamPolicy", "organizations.GetIamPolicy"} & set(project.projects.calls[calls:])


def test_a_custom_role_holding_the_permissions_a_node_role_is_needed_for_stands_in_for_it(project_factory, capsys):
    """A custom role, on the project or the organization, is read (IAM roles.get) and accepted for each node role
    whose permissions it holds; one lacking them is still a problem naming the predefined role; one that cannot be
    read is a warning too."""
    project = project_factory()
    project.projects.place(PROJECT, "organizations/333")
    writes_logs = f"projects/{PROJECT}/roles/tpuNodeLogs"
    writes_metrics = "organizations/333/roles/tpuNodeMetrics"
    project.projects.define_role(writes_logs, "logging.logEntries.create", "logging.logEntries.route")
    project.projects.define_role(writes_metrics, "monitoring.metricDescriptors.list")  # not what metrics need
    project.projects.grant(PROJECT, writes_logs, f"serviceAccount:{NODES}")
    project.projects.grant_above("organizations/333", writes_metrics, f"serviceAccount:{NODES}")
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 2 and "1 problem;" in text, text
    assert f"{NODES} lacks roles/monitoring.metricWriter on project {PROJECT}, needed for writing" in text
    project.projects.define_role(writes_metrics, "monitoring.timeSeries.create", "monitoring.metricDescriptors.list")
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 0 and warnings(text) == [], text
    assert project.projects.calls.count("roles.GetRole") == 4  # each custom role once per preflight
    project.projects.deny("iam.roles.get")
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 2 and "2 problems" in text, text
    assert f"the custom role {writes_logs} could not be read (PermissionDenied: " in text


def test_a_node_role_granted_only_to_a_group_is_a_warning_naming_the_group(project_factory, capsys):
    """Whether the account is in the group only Cloud Identity can say: a binding that would grant the role through a
    group turns the refusal into a warning naming the group and where it is granted."""
    project = project_factory()
    project.projects.place(PROJECT, "folders/111")
    project.projects.grant(PROJECT, "roles/container.defaultNodeServiceAccount", "group:tpu-nodes@example.com")
    project.projects.grant_above("folders/111", "roles/logging.logWriter", "group:ml-infra@example.com")
    project.projects.grant(PROJECT, "roles/logging.logWriter", "user:someone@example.com")  # not a group: no
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 0, text
    assert warnings(text) == [
        f"the nodes' service account {NODES} holds roles/logging.logWriter (writing the nodes' and pods' logs) only "
        f"if it is a member of ml-infra@example.com (roles/logging.logWriter on folders/111); tpu-nodes@example.com "
        f"(roles/container.defaultNodeServiceAccount on projects/{PROJECT}): group membership is Cloud Identity's to "
        "say and is not checked; grant the role to the account itself to be sure",
        f"the nodes' service account {NODES} holds roles/monitoring.metricWriter (writing the nodes' metrics) only "
        f"if it is a member of tpu-nodes@example.com (roles/container.defaultNodeServiceAccount on projects/{PROJECT})"
        ": group membership is Cloud Identity's to say and is not checked; grant the role to the account itself to be "
        "sure",
    ], text


def test_a_node_role_granted_only_under_an_iam_condition_is_not_counted_and_the_warning_names_the_condition(
    project_factory, capsys
):
    """A binding with a condition grants only to the requests it holds for, which preflight does not evaluate: the
    role is not counted as held, and a warning names it, where it is granted and the condition's title; the same
    role granted without a condition passes with no warning. The policy is read at version 3, where IAM shows the
    condition."""
    project = project_factory()
    until = {"title": "until-2030", "expression": 'request.time < timestamp("2030-01-01T00:00:00Z")'}
    _nodes(project, "roles/artifactregistry.reader", "roles/serviceusage.serviceUsageConsumer")
    for role in ("roles/logging.logWriter", "roles/monitoring.metricWriter"):
        project.projects.grant(PROJECT, role, f"serviceAccount:{NODES}", condition=until)
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 0, text
    assert warnings(text) == [
        f"the nodes' service account {NODES} holds {role} ({purpose}) only under an IAM condition: {role} on "
        f"projects/{PROJECT} under the condition 'until-2030': IAM grants it only to the requests the condition holds "
        "for, which preflight does not evaluate; make sure it admits the run's requests (its cluster, its dates)"
        for role, purpose in (
            ("roles/logging.logWriter", "writing the nodes' and pods' logs"),
            ("roles/monitoring.metricWriter", "writing the nodes' metrics"),
        )
    ], text
    assert set(project.projects.policy_versions) == {3}
    _nodes(project, "roles/logging.logWriter", "roles/monitoring.metricWriter")  # and now without a condition
    code, text = preflight_cli(DEDICATED_NODES, capsys)
    assert code == 0 and warnings(text) == [], text


def test_every_role_nodes_need_says_what_permissions_a_custom_role_needs_to_stand_in_for_it():
    from components.platforms.gke.checks.node_account import ROLE_PERMISSIONS
    from components.platforms.gke.plan.target import IMAGE_STREAMING_ROLE, NODE_SERVICE_ACCOUNT_ROLES

    assert set(ROLE_PERMISSIONS) == set(NODE_SERVICE_ACCOUNT_ROLES) | set(IMAGE_STREAMING_ROLE)
