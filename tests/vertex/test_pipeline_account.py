"""The pipeline's service account on Vertex AI (``--service-account``): ``tpupipe submit`` and ``tpupipe schedule
create`` warn on stderr, and go on, when the pipeline runs as the Compute Engine default account (none given, or
given by name) or as one the project's IAM policy grants a basic role; against the emulated Vertex AI and Resource
Manager, with at most one getIamPolicy per submit."""

import pytest

from components.platforms.gke.storage import RESOURCE_MANAGER_EMULATOR_HOST_ENV
from pipelines import vertex
from tests.emulators.resourcemanager import ResourceManagerEmulator
from tests.emulators.storage import StorageEmulator
from tests.vertex.test_vertex_service import PROJECT, _submission, service  # noqa: F401 - the fixture

NUMBER = "123456789012"
DEDICATED = f"pipelines@{PROJECT}.iam.gserviceaccount.com"
DEFAULT = f"{NUMBER}-compute@developer.gserviceaccount.com"
VERTEX_DOC = "https://cloud.google.com/vertex-ai/docs/pipelines/configure-project#service-account"


@pytest.fixture
def projects(service, monkeypatch):  # noqa: F811 - the fixture imported above
    """The emulated Resource Manager (the project's IAM policy) and Cloud Storage (the pipeline root's bucket)."""
    storage = StorageEmulator({PROJECT: NUMBER})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.start())
    emulator = ResourceManagerEmulator({PROJECT: NUMBER})
    monkeypatch.setenv(RESOURCE_MANAGER_EMULATOR_HOST_ENV, emulator.start())
    yield emulator
    emulator.stop()
    storage.stop()


def _submit(service, capsys, account: str = "") -> list[str]:  # noqa: F811
    """The warnings a submit as ``account`` prints on stderr; the job is created all the same."""
    name = vertex.submit(_submission(service, service_account=account), log=lambda m: None)
    assert service.job(name.rsplit("/", 1)[-1]).resource.get("serviceAccount", "") == account
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpupipe: warning: ")]


def test_a_submit_without_a_service_account_warns_that_vertex_runs_it_as_the_default_one(
    service,  # noqa: F811
    projects,
    capsys,
):
    (warning,) = _submit(service, capsys)
    assert warning.startswith(
        "tpupipe: warning: --service-account not given: Vertex AI runs the pipeline's tasks (which provision, build "
        "and tear down) as PROJECT_NUMBER-compute@developer.gserviceaccount.com, the project's Compute Engine default "
        "service account, which in many projects holds the basic Editor role on the whole project"
    )
    assert VERTEX_DOC in warning and "pass --service-account with a dedicated account" in warning
    assert "GetIamPolicy" not in projects.calls  # nothing to read: the default account is the risk


def test_a_dedicated_account_with_no_basic_role_is_no_warning_after_one_policy_read(
    service,  # noqa: F811
    projects,
    capsys,
):
    assert _submit(service, capsys, DEDICATED) == []
    assert projects.calls.count("GetIamPolicy") == 1


@pytest.mark.parametrize("role", ["roles/editor", "roles/owner"])
def test_an_account_with_a_basic_role_is_a_warning_naming_the_role(service, projects, capsys, role):  # noqa: F811
    projects.grant(PROJECT, role, f"serviceAccount:{DEDICATED}")
    (warning,) = _submit(service, capsys, DEDICATED)
    assert warning.startswith("tpupipe: warning: --service-account: Vertex AI runs the pipeline's tasks")
    assert f"as {DEDICATED}, which holds {role} on project {PROJECT}: whoever compromises it can change anything" in (
        warning
    )


def test_the_default_compute_account_named_is_a_warning(service, projects, capsys):  # noqa: F811
    (warning,) = _submit(service, capsys, DEFAULT)  # the emulated project's grants it the nodes' roles, no basic one
    assert (
        f"--service-account: Vertex AI runs the pipeline's tasks (which provision, build and tear down) as {DEFAULT}"
        in (warning)
    )
    assert "the project's Compute Engine default service account" in warning


def test_a_policy_the_caller_may_not_read_is_a_warning_and_the_submit_goes_on(service, projects, capsys):  # noqa: F811
    projects.deny("resourcemanager.projects.getIamPolicy")
    (warning,) = _submit(service, capsys, DEDICATED)
    assert f"--service-account: the IAM policy of project {PROJECT} could not be read" in warning
    assert "resourcemanager.projects.getIamPolicy" in warning
    assert f"whether {DEDICATED} holds roles/owner or roles/editor there was not checked" in warning


def test_a_schedule_warns_as_a_submit_does(service, projects, capsys):  # noqa: F811
    projects.grant(PROJECT, "roles/editor", f"serviceAccount:{DEDICATED}")
    vertex.schedule_create(_submission(service, service_account=DEDICATED), "weekly", "0 3 * * 1")
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "tpupipe: warning: " in line]
    assert f"{DEDICATED}, which holds roles/editor on project {PROJECT}" in warning
    vertex.schedule_create(_submission(service), "nightly", "0 3 * * *")
    assert "--service-account not given" in capsys.readouterr().err
