"""Assertions on the compiled pipeline YAML: what Vertex AI Pipelines would run."""

import pytest
import yaml

from pipelines.pipeline import compile_pipeline

STAGES = {"provision", "build-image", "deploy-raycluster", "check-slice", "train", "evaluate", "teardown"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    path = tmp_path_factory.mktemp("compiled") / "pipeline.yaml"
    compile_pipeline(str(path))
    return yaml.safe_load(path.read_text())


def test_seven_components(compiled):
    executors = {name.removeprefix("exec-") for name in compiled["deploymentSpec"]["executors"]}
    assert executors == STAGES


def test_teardown_is_the_exit_task_around_every_other_stage(compiled):
    root = compiled["root"]["dag"]["tasks"]
    assert set(root) == {"exit-handler-1", "teardown"}
    assert root["teardown"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert root["teardown"]["dependentTasks"] == ["exit-handler-1"]
    inner = compiled["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert set(inner) == STAGES - {"teardown"}


def test_stages_run_in_order(compiled):
    inner = compiled["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    order = ["provision", "build-image", "deploy-raycluster", "check-slice", "train", "evaluate"]
    for before, after in zip(order, order[1:], strict=False):
        assert before in inner[after].get("dependentTasks", []), (before, after)


def test_every_pipeline_parameter_is_typed_with_a_default(compiled):
    params = compiled["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {"preset", "platform", "overrides", "run_id", "output_root"}
    for name, p in params.items():
        assert p["parameterType"] == "STRING", name
        assert "defaultValue" in p, name
    assert params["preset"]["defaultValue"] == "local-fsdp"
    assert params["platform"]["defaultValue"] == "local"


def test_run_scoped_names_come_from_the_job_name(compiled):
    for task in compiled["components"]["comp-exit-handler-1"]["dag"]["tasks"].values():
        job_name = task["inputs"]["parameters"]["job_name"]["runtimeValue"]["constant"]
        assert job_name == "{{$.pipeline_job_name}}"


def test_components_run_in_the_pipeline_image_without_installing_kfp(compiled):
    for name, executor in compiled["deploymentSpec"]["executors"].items():
        container = executor["container"]
        assert container["image"].startswith("tpupipe/pipeline"), name
        assert "pip install" not in " ".join(container["command"]), name
