"""The emulated Vertex AI (tests/emulators/vertex.py) as the gate needs it, without a Ray cluster: the trigger
conditions ``dsl.If`` compiles to, read as Vertex reads them; a pipeline whose branch runs only when its condition
holds, inside an exit handler, executed task by task in processes of their own; and Vertex AI Model Registry's
ModelService on the same endpoint as the pipelines, where tpupipe's registry reaches it through
``$TPUPIPE_VERTEX_ENDPOINT``. (No ``from __future__ import annotations`` here: KFP reads the components' real
annotations.)"""

import secrets
import sys
from pathlib import Path

import pytest
from kfp import compiler, dsl

from components.artifact_types import VertexModel
from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV, VERTEX_ENDPOINT_ENV
from tests.emulators.artifactregistry import ArtifactRegistryEmulator
from tests.emulators.models import ModelServiceEmulator
from tests.emulators.vertex import ConditionError, VertexEmulator, condition_holds

PROJECT, REGION = "tpupipe-emulated", "us-east5"
IMAGE = "us-east5-docker.pkg.dev/tpupipe-emulated/tpupipe/pipeline:tiny"
KEY = "pipelinechannel--register-Output"


@pytest.mark.parametrize(
    ("condition", "values", "holds"),
    [
        (f"inputs.parameter_values['{KEY}'] == 'promote'", {KEY: "promote"}, True),
        (f"inputs.parameter_values['{KEY}'] == 'promote'", {KEY: "keep"}, False),
        (f"inputs.parameter_values['{KEY}'] != 'promote'", {KEY: "keep"}, True),
        (
            f"!(inputs.parameter_values['{KEY}'] == 'promote') && inputs.parameter_values['n'] > 2",
            {KEY: "k", "n": 3},
            True,
        ),
        (
            f"!(inputs.parameter_values['{KEY}'] == 'promote') && inputs.parameter_values['n'] > 2",
            {KEY: "k", "n": 2},
            False,
        ),
        ("inputs.parameter_values['a'] == 'x' || inputs.parameter_values['b'] == \"y\"", {"a": "z", "b": "y"}, True),
        ("inputs.parameter_values['n'] <= 1.5", {"n": 1}, True),
        ("inputs.parameter_values['flag'] == true", {"flag": True}, True),
    ],
)
def test_conditions_read_as_vertex_reads_them(condition, values, holds):
    assert condition_holds(condition, values) is holds


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ("inputs.parameter_values['missing'] == 'x'", "not an input of the task"),
        ("size(inputs.parameter_values['a']) > 1", "cannot read the condition"),
        ("(inputs.parameter_values['a'] == 'x'", "unbalanced parentheses|ends too soon"),
        ("inputs.parameter_values['a'] ==", "ends too soon"),
    ],
)
def test_a_condition_it_cannot_read_is_an_error_not_a_branch_skipped(condition, message):
    with pytest.raises(ConditionError, match=message):
        condition_holds(condition, {"a": "x"})


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def decide(value: str) -> str:
    return value


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def act(decision: str) -> str:
    return f"acted on {decision}"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def cleanup() -> str:
    return "cleaned up"


@dsl.pipeline(name="gated")
def gated(value: str = "keep"):
    end = cleanup()
    with dsl.ExitHandler(end, name="run"):
        decided = decide(value=value)
        with dsl.If(decided.output == "promote", name="gate-promotes"):
            act(decision=decided.output)


@pytest.fixture
def vertex(tmp_path, monkeypatch):
    """Vertex AI Pipelines with the ModelService on its endpoint, and the environment that points tpupipe there."""
    token = secrets.token_hex(12)
    registry = ArtifactRegistryEmulator()
    registry.push(IMAGE, "sha256:" + "ab" * 32)
    models = ModelServiceEmulator(token=token)
    emulator = VertexEmulator(
        None, registry, {}, python_bin=Path(sys.executable).parent, workdir=tmp_path, token=token, models=models
    )
    endpoint = emulator.start()
    for key, value in ((VERTEX_ENDPOINT_ENV, endpoint), (EMULATOR_HOST_ENV, endpoint), (EMULATOR_TOKEN_ENV, token)):
        monkeypatch.setenv(key, value)
    yield emulator
    emulator.stop()


def _create(vertex, tmp_path, pipeline, job_id: str, parameters: dict | None = None) -> tuple[str, dict]:
    """Compile ``pipeline`` and create a job of it with the PipelineService client (the SDK's PipelineJob would first
    look the pipeline root's bucket up in Cloud Storage); (its resource name, its resource once it ends)."""
    import yaml
    from google.cloud import aiplatform_v1

    from components.cloud.credentials import credentials

    template = tmp_path / f"{job_id}.yaml"
    compiler.Compiler().compile(pipeline, str(template))
    client = aiplatform_v1.PipelineServiceClient(
        credentials=credentials(), transport="rest", client_options={"api_endpoint": vertex.endpoint}
    )
    runtime = {"gcs_output_directory": f"gs://{PROJECT}-pipeline-root/{job_id}"}
    job = aiplatform_v1.PipelineJob(
        display_name=job_id,
        pipeline_spec=yaml.safe_load(template.read_text()),
        runtime_config=runtime | ({"parameter_values": parameters} if parameters else {}),
    )
    created = client.create_pipeline_job(
        parent=f"projects/{PROJECT}/locations/{REGION}", pipeline_job=job, pipeline_job_id=job_id
    )
    return created.name, vertex.wait(created.name, timeout_s=300)


def _run(vertex, tmp_path, job_id: str, value: str) -> dict:
    """A job of ``gated``: its outcome once it ends."""
    name, resource = _create(vertex, tmp_path, gated, job_id, {"value": value})
    tasks = {t["taskName"]: t["state"] for t in resource["jobDetail"]["taskDetails"]}
    return {"state": resource["state"], "tasks": tasks, "logs": vertex.job(name).logs}


def test_a_branch_runs_only_when_its_condition_holds_and_a_false_one_is_no_failure(vertex, tmp_path):
    # The DAG-level tasks are details too, as on Vertex: the root (named after the job) and the exit handler's group.
    kept = _run(vertex, tmp_path, "gated-keep", "keep")
    assert kept["state"] == "PIPELINE_STATE_SUCCEEDED", kept
    assert kept["tasks"] == {
        "gated-keep": "SUCCEEDED",
        "run": "SUCCEEDED",
        "decide": "SUCCEEDED",
        "gate-promotes": "NOT_TRIGGERED",
        "cleanup": "SUCCEEDED",
    }
    promoted = _run(vertex, tmp_path, "gated-promote", "promote")
    assert promoted["state"] == "PIPELINE_STATE_SUCCEEDED", promoted
    assert promoted["tasks"] == {
        "gated-promote": "SUCCEEDED",
        "run": "SUCCEEDED",
        "decide": "SUCCEEDED",
        "gate-promotes": "SUCCEEDED",
        "act": "SUCCEEDED",
        "cleanup": "SUCCEEDED",
    }


def test_the_model_registry_is_served_on_the_pipelines_endpoint(vertex):
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    from components.cloud.credentials import credentials
    from components.registry import open_registry

    registry = open_registry(project=PROJECT, region=REGION, retry_delays_s=(0.01,))
    provenance = {
        key: None
        for key in (
            "preset",
            "spec_hash",
            "base_model",
            "data_snapshot",
            "trainer_image",
            "git_sha",
            "accelerator",
            "topology",
            "slices",
            "tokens_seen",
            "restarts",
            "preemptions",
            "eval_loss_before",
            "eval_loss_after",
            "pipeline_job",
            "run_id",
        )
    }
    version = registry.register("gemma-ft", f"gs://{PROJECT}-tpupipe/runs/r/checkpoint", provenance)
    registry.promote("gemma-ft", version.version)
    assert registry.champion("gemma-ft").version == "1"
    assert vertex.models.calls.count("UploadModel") == 1 and "MergeVersionAliases" in vertex.models.calls
    # The pipelines are still answered there: an unknown job is the PipelineService's 404.
    client = aiplatform_v1.PipelineServiceClient(
        credentials=credentials(), transport="rest", client_options={"api_endpoint": vertex.endpoint}
    )
    with pytest.raises(exceptions.NotFound, match="PipelineJob .*nope does not exist"):
        client.get_pipeline_job(name=f"projects/{PROJECT}/locations/{REGION}/pipelineJobs/nope")


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def slow(name: str) -> str:
    import time

    time.sleep(3)
    return name


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def join(a: str, b: str) -> str:
    return a + b


@dsl.pipeline(name="fork")
def fork():
    """tpupipe's shape in small: provision and build_image depend on nothing of each other, deploy on both."""
    join(a=slow(name="provision").output, b=slow(name="build").output)


def test_tasks_that_do_not_depend_on_each_other_run_side_by_side(vertex, tmp_path):
    name, resource = _create(vertex, tmp_path, fork, "fork")
    assert resource["state"] == "PIPELINE_STATE_SUCCEEDED", vertex.job(name).logs
    details = {t["taskName"]: t for t in resource["jobDetail"]["taskDetails"]}
    first, second, joined = details["slow"], details["slow-2"], details["join"]
    assert first["startTime"] < second["endTime"] and second["startTime"] < first["endTime"], (first, second)
    assert joined["startTime"] >= max(first["endTime"], second["endTime"])


@dsl.container_component
def reads_yaml():
    """A task that imports one package of the components image (PyYAML), as every component imports its own."""
    return dsl.ContainerSpec(image=IMAGE, command=["python3", "-c", "import yaml; print('yaml', yaml.__version__)"])


@dsl.pipeline(name="image-env")
def image_env():
    reads_yaml()


def test_a_task_runs_in_the_environment_of_its_image_alone_so_a_package_the_image_lacks_fails_the_run(
    vertex, tmp_path, monkeypatch
):
    """The tasks run in an environment built from the image's directory alone (``components.platforms.local.envs``,
    by content hash, as ``tpupipe env`` builds every image): a test copy of images/pipeline keeping one of its
    requirements, PyYAML, then the same copy with that line removed. The task that imports it succeeds in the first
    and fails the run in the second, although this test's own environment has PyYAML."""
    from components.platforms.local import envs

    monkeypatch.setenv("TPUPIPE_ENVS_DIR", str(tmp_path / "envs"))
    # PyYAML's block of the image's lock (its pin and the hashes of its files; it depends on nothing).
    lock = (envs.IMAGES_DIR / "pipeline" / envs.LOCK_FILE).read_text().split("\n")
    start = next(i for i, line in enumerate(lock) if line.lower().startswith("pyyaml=="))
    end = next(i for i in range(start + 1, len(lock)) if lock[i][:1].isalnum())
    pyyaml = "\n".join(lock[start:end])

    def image(name: str, requirements: list[str]) -> Path:
        copy = tmp_path / name / "pipeline"
        copy.mkdir(parents=True)
        (copy / "Dockerfile").write_text((envs.IMAGES_DIR / "pipeline" / "Dockerfile").read_text())
        (copy / envs.LOCK_FILE).write_text("\n".join(requirements) + "\n")
        return envs.ensure_env("pipeline", log=lambda m: None, images=copy.parent).bin

    vertex.python_bin = image("with", [pyyaml])
    # Byte-compiled, as the image's `pip install` compiles: no process of a run compiles the package again.
    assert list(vertex.python_bin.parent.glob("lib/python3.*/site-packages/yaml/__pycache__/__init__.*.pyc"))
    _, ran = _create(vertex, tmp_path, image_env, "with-pyyaml")
    assert ran["state"] == "PIPELINE_STATE_SUCCEEDED", (ran.get("error"), ran["jobDetail"])
    assert "yaml 6." in vertex.job("with-pyyaml").logs["reads-yaml"]

    vertex.python_bin = image("without", [])
    _, failed = _create(vertex, tmp_path, image_env, "without-pyyaml")
    assert failed["state"] == "PIPELINE_STATE_FAILED"
    (task,) = [t for t in failed["jobDetail"]["taskDetails"] if t["taskName"] == "reads-yaml"]
    assert task["state"] == "FAILED" and "No module named 'yaml'" in task["error"]["message"]


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluates(model: dsl.Output[dsl.Model]):
    model.uri = "gs://bucket/runs/r/checkpoint"
    model.metadata["run_id"] = "r"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def registers(model: dsl.Input[dsl.Model], registered: dsl.Output[VertexModel]):
    """Reads the artifact evaluates wrote, and names the version it became, as tpupipe's register does."""
    assert model.uri == "gs://bucket/runs/r/checkpoint" and model.metadata["run_id"] == "r", (model.uri, model.metadata)
    resource = "projects/tpupipe-emulated/locations/us-east5/models/m@1"
    registered.uri = f"https://us-east5-aiplatform.googleapis.com/v1/{resource}"
    registered.metadata["resourceName"] = resource


@dsl.pipeline(name="lineage")
def lineage():
    registers(model=evaluates().outputs["model"])


def test_an_artifact_goes_from_its_producer_to_its_consumer_and_the_vertex_model_names_the_version(vertex, tmp_path):
    """Lineage as Vertex records it: register's input is the very Model artifact evaluate wrote (its uri and
    metadata, in the consumer's executor input and in its task detail's inputs), and its output a google.VertexModel
    whose resourceName is the registered version (the custom type imported in the task, as KFP writes it)."""
    _, ran = _create(vertex, tmp_path, lineage, "lineage")
    assert ran["state"] == "PIPELINE_STATE_SUCCEEDED", (ran.get("error"), vertex.job("lineage").logs)
    tasks = {t["taskName"]: t for t in ran["jobDetail"]["taskDetails"]}
    (made,) = tasks["evaluates"]["outputs"]["model"]["artifacts"]
    (used,) = tasks["registers"]["inputs"]["model"]["artifacts"]
    assert used == made and made["schemaTitle"] == "system.Model" and made["uri"] == "gs://bucket/runs/r/checkpoint"
    (version,) = tasks["registers"]["outputs"]["registered"]["artifacts"]
    assert version["schemaTitle"] == "google.VertexModel"
    assert version["metadata"]["resourceName"] == f"projects/{PROJECT}/locations/{REGION}/models/m@1"
    assert version["uri"] == f"https://{REGION}-aiplatform.googleapis.com/v1/" + version["metadata"]["resourceName"]
