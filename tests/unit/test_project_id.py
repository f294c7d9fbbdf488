"""The Google Cloud project id rule (components.spec.names.PROJECT_ID): 6 to 30 lowercase letters, digits and
hyphens, starting with a letter, not ending with a hyphen
(https://cloud.google.com/resource-manager/docs/creating-managing-projects); every field and flag that takes a
project id applies this one rule."""

import pytest

from components.registry.vertex import VertexBackend
from components.spec import SpecError, layered, names
from components.workload import resolve
from pipelines.backends.vertex import jobs as vertex
from pipelines.cli.main import main

GOOD = ["my-project", "abcdef", "a" * 30, "p-123456", "a1b2c3-d4"]
BAD = ["abcde", "a" * 31, "1project", "my-project-", "My-Project", "my_project", "my.project", "-myproject"]


@pytest.mark.parametrize("project", GOOD)
def test_a_project_id_passes_everywhere(project):
    names.check_project("--project", project)
    layered("local-fsdp", f"gke.project={project} gke.hf_token_secret=projects/{project}/secrets/hf")
    account = f"gke.node_service_account=tpu-nodes@{project}.iam.gserviceaccount.com"
    layered("local-fsdp", account)
    reservation = f"cluster.capacity=reservation cluster.reservation=projects/{project}/reservations/r"
    resolve("gemma4-e2b-v6e-16", reservation)
    VertexBackend(project, "us-east5")
    vertex.check_place(project)


@pytest.mark.parametrize("project", BAD)
def test_a_bad_project_id_is_refused_everywhere_naming_the_field(project):
    cases = [
        ("gke.project", lambda: layered("local-fsdp", f"gke.project={project}")),
        ("gke.hf_token_secret", lambda: layered("local-fsdp", f"gke.hf_token_secret=projects/{project}/secrets/hf")),
        (
            "gke.node_service_account",
            lambda: layered("local-fsdp", f"gke.node_service_account=tpu-nodes@{project}.iam.gserviceaccount.com"),
        ),
        (
            "cluster.reservation",
            lambda: resolve(
                "gemma4-e2b-v6e-16",
                f"cluster.capacity=reservation cluster.reservation=projects/{project}/reservations/r",
            ),
        ),
        ("--project", lambda: VertexBackend(project, "us-east5")),
        ("--project", lambda: vertex.check_place(project)),
    ]
    for field, call in cases:
        with pytest.raises(SpecError) as caught:
            call()
        assert caught.value.field == field


def test_the_compile_flag_takes_the_same_rule(capsys, tmp_path):
    assert main(["compile", "--project", "my-project-", "--output", str(tmp_path / "p.yaml")]) == 2
    assert capsys.readouterr().err.startswith("tpupipe: error: --project: 'my-project-' is not a Google Cloud project")
