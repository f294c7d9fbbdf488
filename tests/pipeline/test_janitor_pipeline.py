"""Assertions on the compiled janitor pipeline: one task, the sweep, in the same components image as the training
pipeline, its parameters defaulted for the target and described for the Vertex UI's schedule form."""

import pytest
import yaml

from pipelines.janitor import janitor_pipeline
from pipelines.pipeline import Target, compile_pipeline

TARGET = Target(project="my-project", region="us-east5")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    path = tmp_path_factory.mktemp("compiled") / "janitor.yaml"
    compile_pipeline(str(path), TARGET, janitor_pipeline)
    return yaml.safe_load(path.read_text())


def test_one_task_that_sweeps_in_the_components_image(compiled):
    from components.cloud.build import image_tag

    assert compiled["pipelineInfo"]["name"] == "tpupipe-janitor"
    assert set(compiled["root"]["dag"]["tasks"]) == {"janitor"}
    (executor,) = compiled["deploymentSpec"]["executors"].values()
    assert (
        executor["container"]["image"] == f"us-east5-docker.pkg.dev/my-project/tpupipe/pipeline:{image_tag('pipeline')}"
    )
    program = " ".join(executor["container"]["command"] + executor["container"].get("args", []))
    assert "components.platforms.gke.run.janitor import run_component" in program and "pip install" not in program
    task = compiled["root"]["dag"]["tasks"]["janitor"]
    assert task["cachingOptions"] == {}  # caching off: every scheduled sweep looks again
    outputs = compiled["components"]["comp-janitor"]["outputDefinitions"]["artifacts"]
    assert outputs["report"]["artifactType"]["schemaTitle"] == "system.Markdown"


def test_parameters_are_defaulted_for_the_target_and_described(compiled):
    params = compiled["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {"project", "region", "output_root", "older_than", "dry_run", "kfp_host", "kfp_namespace"}
    assert params["project"]["defaultValue"] == "my-project" and params["region"]["defaultValue"] == "us-east5"
    assert params["output_root"]["defaultValue"] == "gs://my-project-tpupipe/state"
    assert params["older_than"]["defaultValue"] == "" and params["dry_run"]["defaultValue"] is False
    for name, p in params.items():
        assert len(p.get("description", "")) > 20, name


def test_tpupipe_compile_gives_the_janitor_pipeline(tmp_path):
    from pipelines.cli import main as cli

    out = tmp_path / "janitor.yaml"
    assert cli.main(["compile", "--pipeline", "janitor", "--output", str(out), "--project", "my-project"]) == 0
    assert yaml.safe_load(out.read_text())["pipelineInfo"]["name"] == "tpupipe-janitor"


def test_publish_help_says_why_a_stop_needs_no_trigger(capsys):
    """A Stop's teardown starts from the stage its SIGTERM reaches; ``publish --help`` says so, and there is no
    ``--stop-trigger`` to give."""
    import pytest

    from pipelines.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["publish", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "needs no trigger, so there is no --stop-trigger" in shown and "Stopping a run" in shown
    assert "replaced when it runs another image" in shown
    with pytest.raises(SystemExit):
        build_parser().parse_args(["publish", "--stop-trigger"])
