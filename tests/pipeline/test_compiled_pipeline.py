"""Assertions on the compiled pipeline YAML: what Vertex AI Pipelines would run."""

import re
from pathlib import Path

import pytest
import yaml

from pipelines.pipeline import Target, compile_pipeline

TARGET = Target(project="my-project", region="us-east5")

STAGES = {
    "snapshot-data",
    "provision",
    "build-image",
    "deploy-raycluster",
    "check-slice",
    "train",
    "evaluate",
    "register",
    "promote",
    "teardown",
}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    path = tmp_path_factory.mktemp("compiled") / "pipeline.yaml"
    compile_pipeline(str(path), TARGET)
    return yaml.safe_load(path.read_text())


def _handler(compiled) -> dict:
    """The exit handler's tasks: the data snapshot and the condition on it."""
    return compiled["components"]["comp-exit-handler-1"]["dag"]["tasks"]


def _condition_in(compiled, tasks: dict) -> tuple[str, dict]:
    """The one conditional task among ``tasks``: (its name, its spec)."""
    (found,) = [(name, task) for name, task in tasks.items() if task.get("triggerPolicy", {}).get("condition")]
    return found


def _branch(compiled, task: dict) -> dict:
    return compiled["components"][task["componentRef"]["name"]]["dag"]["tasks"]


def _inner(compiled) -> dict:
    """The tasks under the snapshot's condition: every stage from provision to register, and the gate's condition."""
    return _branch(compiled, _condition_in(compiled, _handler(compiled))[1])


def _gate_condition(compiled) -> tuple[str, dict]:
    """The gate's conditional task, around promote: (its name, its spec)."""
    return _condition_in(compiled, _inner(compiled))


def test_ten_components(compiled):
    executors = {name.removeprefix("exec-") for name in compiled["deploymentSpec"]["executors"]}
    assert executors == STAGES


def test_teardown_is_the_exit_task_around_every_other_stage(compiled):
    root = compiled["root"]["dag"]["tasks"]
    assert set(root) == {"exit-handler-1", "teardown"}
    assert root["teardown"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert root["teardown"]["dependentTasks"] == ["exit-handler-1"]
    new_data, _ = _condition_in(compiled, _handler(compiled))
    assert set(_handler(compiled)) == {"snapshot-data", new_data}
    condition, _ = _gate_condition(compiled)
    assert set(_inner(compiled)) == STAGES - {"snapshot-data", "teardown", "promote"} | {condition}


def test_the_data_snapshot_gates_every_stage_but_teardown_and_reads_the_schedules_time(compiled):
    """A run with nothing new (snapshot_data's output ``skip``) creates nothing: every stage but teardown is under the
    condition on its output; the schedule's time reaches it as KFP's placeholder, which Vertex AI fills in."""
    from tests.emulators.vertex import condition_holds

    name, task = _condition_in(compiled, _handler(compiled))
    assert task["taskInfo"]["name"] == "new-data"
    (key,) = [
        k
        for k, b in task["inputs"]["parameters"].items()
        if b.get("taskOutputParameter") == {"producerTask": "snapshot-data", "outputParameterKey": "Output"}
    ]
    condition = task["triggerPolicy"]["condition"]
    assert condition_holds(condition, {key: "train"}) and not condition_holds(condition, {key: "skip"})
    snapshot = _handler(compiled)["snapshot-data"]
    assert snapshot["inputs"]["parameters"]["schedule_time"]["runtimeValue"]["constant"] == (
        "{{$.pipeline_job_schedule_time_utc}}"
    )


def test_stages_run_in_order(compiled):
    inner = _inner(compiled)
    condition, _ = _gate_condition(compiled)
    order = ["build-image", "deploy-raycluster", "check-slice", "train", "evaluate", "register", condition]
    for before, after in zip(order, order[1:], strict=False):
        assert before in inner[after].get("dependentTasks", []), (before, after)
    assert "provision" in inner["deploy-raycluster"]["dependentTasks"]


def test_the_image_builds_beside_provision(compiled):
    # Nothing of build_image waits for provision: no dependency, no input from it; deploy waits for both.
    inner = _inner(compiled)
    build = inner["build-image"]
    assert build.get("dependentTasks", []) == []
    assert not any(
        binding.get("taskOutputParameter", {}).get("producerTask") == "provision"
        for binding in build.get("inputs", {}).get("parameters", {}).values()
    )
    assert set(inner["deploy-raycluster"]["dependentTasks"]) == {"provision", "build-image"}


def test_promote_runs_only_when_the_gate_says_promote(compiled):
    from tests.emulators.vertex import condition_holds

    name, task = _gate_condition(compiled)
    assert task["taskInfo"]["name"] == "gate-promotes"
    branch = compiled["components"][task["componentRef"]["name"]]["dag"]["tasks"]
    assert set(branch) == {"promote"}  # the only task under the condition: nothing else depends on the decision
    bindings = task["inputs"]["parameters"]
    # The condition reads register's one output, "Output": kfp.local resolves a condition's task output only in
    # that form (pipelinechannel--<task>-Output); a named output would read as a missing parent input there, and the
    # branch would never run.
    (decision,) = [
        key
        for key, b in bindings.items()
        if b.get("taskOutputParameter") == {"producerTask": "register", "outputParameterKey": "Output"}
    ]
    assert decision == "pipelinechannel--register-Output"
    condition = task["triggerPolicy"]["condition"]
    assert condition == f"inputs.parameter_values['{decision}'] == 'promote'"
    assert condition_holds(condition, {decision: "promote"})
    for other in ("keep", "off", "", "Promote"):
        assert not condition_holds(condition, {decision: other}), other
    assert branch["promote"]["inputs"]["parameters"]["decision"] == {"componentInputParameter": decision}


def test_register_takes_the_evaluation_and_outputs_the_decision(compiled):
    register = _inner(compiled)["register"]
    assert register["inputs"]["parameters"]["eval_result"]["taskOutputParameter"] == {
        "producerTask": "evaluate",
        "outputParameterKey": "Output",
    }
    assert register["inputs"]["parameters"]["source_version"] == {
        "componentInputParameter": "pipelinechannel--source_version"
    }
    outputs = compiled["components"]["comp-register"]["outputDefinitions"]
    assert {name: p["parameterType"] for name, p in outputs["parameters"].items()} == {"Output": "STRING"}
    # Lineage: the Model artifact evaluate wrote is register's input; the version registered its google.VertexModel.
    assert register["inputs"]["artifacts"]["model"]["taskOutputArtifact"] == {
        "producerTask": "evaluate",
        "outputArtifactKey": "model",
    }
    assert outputs["artifacts"]["registered"]["artifactType"]["schemaTitle"] == "google.VertexModel"
    inputs = compiled["components"]["comp-register"]["inputDefinitions"]
    assert inputs["artifacts"]["model"]["artifactType"]["schemaTitle"] == "system.Model"


def test_every_pipeline_parameter_is_typed_described_and_defaulted_for_a_gke_run(compiled):
    params = compiled["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {
        "preset",
        "platform",
        "overrides",
        "run_id",
        "output_root",
        "project",
        "bucket",
        "source_version",
        "dataset",
    }
    for name, p in params.items():
        assert p["parameterType"] == "STRING", name
        assert "defaultValue" in p, name
        assert len(p.get("description", "")) > 20, name  # shown in the Vertex UI's run form
    assert params["preset"]["defaultValue"] == "gemma4-e2b-v6e-16"
    assert params["platform"]["defaultValue"] == "gke"
    assert params["project"]["defaultValue"] == "my-project"
    assert params["output_root"]["defaultValue"] == "gs://my-project-tpupipe/state"


def test_compiling_twice_gives_the_same_bytes(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    compile_pipeline(str(a), TARGET)
    compile_pipeline(str(b), TARGET)
    assert a.read_bytes() == b.read_bytes()


def test_a_run_that_names_only_the_preset_loads_offline_into_a_vertex_pipeline_job(tmp_path, compiled):
    """What the Vertex UI's run form sends when only the preset is chosen: the root the compiled spec defaults to
    (``defaultPipelineRoot``, the SDK's fallback too) and the parameters' defaults for a gke run."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    assert compiled["defaultPipelineRoot"] == "gs://my-project-tpupipe/pipeline-root"
    path = tmp_path / "pipeline.yaml"
    compile_pipeline(str(path), TARGET)
    job = aiplatform.PipelineJob(
        display_name="offline",
        template_path=str(path),
        project="my-project",
        location="us-east5",
        parameter_values={"preset": "llama3-8b-v6e-16x2"},
        credentials=AnonymousCredentials(),
    )
    resource = job.to_dict()
    assert resource["runtimeConfig"]["parameterValues"] == {"preset": "llama3-8b-v6e-16x2"}
    assert resource["runtimeConfig"]["gcsOutputDirectory"] == "gs://my-project-tpupipe/pipeline-root"
    defaults = resource["pipelineSpec"]["root"]["inputDefinitions"]["parameters"]
    assert defaults["platform"]["defaultValue"] == "gke" and defaults["project"]["defaultValue"] == "my-project"


def _job_names(compiled: dict) -> list[str]:
    name, condition = _gate_condition(compiled)
    branch = compiled["components"][condition["componentRef"]["name"]]["dag"]["tasks"]
    tasks = [t for n, t in _inner(compiled).items() if n != name] + list(branch.values())
    tasks.append(_handler(compiled)["snapshot-data"])
    assert len(tasks) == len(STAGES) - 1
    return [task["inputs"]["parameters"]["job_name"]["runtimeValue"]["constant"] for task in tasks]


def test_run_scoped_names_come_from_the_job_and_a_task_knows_where_its_job_is(compiled, tmp_path):
    """On Vertex AI every task gets the job's full resource name (the run id derives from its id; the job's state is
    asked where the job is); a local run's tasks get its name, which kfp.local fills in."""
    assert set(_job_names(compiled)) == {"{{$.pipeline_job_resource_name}}"}
    local = yaml.safe_load(Path(compile_pipeline(str(tmp_path / "local.yaml"), retries=False)).read_text())
    assert set(_job_names(local)) == {"{{$.pipeline_job_name}}"}


def test_every_parameter_description_is_one_line(compiled):
    """The Vertex AI run form shows each description beside its field: no docstring line breaks in them."""
    described = [
        p["description"]
        for component in [compiled["root"], *compiled["components"].values()]
        for p in component.get("inputDefinitions", {}).get("parameters", {}).values()
        if "description" in p
    ]
    assert described and all("\n" not in d and "  " not in d for d in described)


def test_every_task_runs_in_the_content_addressed_components_image_in_the_registry(compiled):
    from components.cloud.build import image_tag

    images = {executor["container"]["image"] for executor in compiled["deploymentSpec"]["executors"].values()}
    assert images == {f"us-east5-docker.pkg.dev/my-project/tpupipe/pipeline:{image_tag('pipeline')}"}
    assert re.fullmatch(r"[0-9a-f]{16}", image_tag("pipeline"))
    for name, executor in compiled["deploymentSpec"]["executors"].items():
        assert "pip install" not in " ".join(executor["container"]["command"]), name


def test_compile_names_the_image_by_tag_alone_offline_and_pins_it_to_a_digest_given(tmp_path, capsys):
    """Offline, no registry to ask: the tag, said to be unpinned; with --image-digest, every task's image is pinned
    (``NAME:TAG@sha256:HEX``), the janitor's too; a digest that is not one is refused naming the flag, nothing
    written."""
    from components.cloud.build import image_tag
    from pipelines.cli.main import main

    image = f"us-east5-docker.pkg.dev/my-project/tpupipe/pipeline:{image_tag('pipeline')}"
    assert main(["compile", "--output", str(tmp_path / "tag.yaml"), "--project", "my-project"]) == 0
    assert f"tasks run in {image}, by tag alone: not pinned" in capsys.readouterr().out
    digest = "sha256:" + "5e" * 32
    for pipeline in ("tpupipe", "janitor"):
        out = tmp_path / f"{pipeline}.yaml"
        argv = ["compile", "--output", str(out), "--project", "my-project", "--pipeline", pipeline]
        assert main([*argv, "--image-digest", digest]) == 0
        assert f"tasks run in {image}@{digest};" in capsys.readouterr().out
        executors = yaml.safe_load(out.read_text())["deploymentSpec"]["executors"].values()
        assert {e["container"]["image"] for e in executors} == {f"{image}@{digest}"}
    assert main(["compile", "--output", str(tmp_path / "bad.yaml"), "--image-digest", "latest"]) == 2
    assert capsys.readouterr().err.startswith("tpupipe: error: --image-digest: 'latest' is not an image digest")
    assert not (tmp_path / "bad.yaml").exists()


def test_the_image_tag_changes_with_what_the_image_holds(tmp_path):
    import shutil

    from components.cloud.build import CONTEXT_PATHS, image_tag, source_root

    root = tmp_path / "tree"
    for top in ("images", *CONTEXT_PATHS):
        src = source_root() / top
        (shutil.copytree if src.is_dir() else shutil.copy)(src, root / top)
    assert image_tag("pipeline", root) == image_tag("pipeline")
    (root / "trainers" / "data.py").write_text("# changed\n")
    assert image_tag("pipeline", root) != image_tag("pipeline")


def test_snapshot_train_evaluate_register_and_teardown_output_typed_artifacts(compiled):
    def artifacts(component):
        outputs = compiled["components"][component]["outputDefinitions"].get("artifacts", {})
        return {name: a["artifactType"]["schemaTitle"] for name, a in outputs.items()}

    assert artifacts("comp-snapshot-data") == {"data": "system.Dataset", "card": "system.Markdown"}
    assert artifacts("comp-train") == {"metrics": "system.Metrics", "loss_curve": "system.HTML"}
    assert artifacts("comp-evaluate") == {
        "metrics": "system.Metrics",
        "summary": "system.Markdown",
        "model": "system.Model",
    }
    assert artifacts("comp-register") == {
        "metrics": "system.Metrics",
        "gate": "system.Markdown",
        "registered": "google.VertexModel",
    }
    assert artifacts("comp-teardown") == {
        "deleted": "system.Markdown",
        "goodput": "system.Metrics",
        "timeline": "system.HTML",
    }


@pytest.mark.parametrize("pipeline", ["tpupipe", "janitor"])
def test_both_compiled_pipelines_pass_the_check_vertex_reads_them_by(tmp_path, pipeline):
    from pipelines.check import problems
    from pipelines.janitor import janitor_pipeline

    path = tmp_path / "pipeline.yaml"
    compile_pipeline(str(path), TARGET, janitor_pipeline if pipeline == "janitor" else None)
    assert problems(str(path), "my-project", "us-east5") == []


def _undescribed(spec):
    spec["root"]["inputDefinitions"]["parameters"]["bucket"].pop("description")


def _untyped(spec):
    spec["root"]["inputDefinitions"]["parameters"]["run_id"]["parameterType"] = "TEXT"


def _wrong_default(spec):
    spec["root"]["inputDefinitions"]["parameters"]["preset"]["defaultValue"] = 3


def _no_default(spec):
    spec["root"]["inputDefinitions"]["parameters"]["overrides"].pop("defaultValue")


def _local_root(spec):
    spec["defaultPipelineRoot"] = "/tmp/root"


def _bad_name(spec):
    spec["pipelineInfo"]["name"] = "2024 pipeline"


@pytest.mark.parametrize(
    ("break_it", "problem"),
    [
        (_undescribed, "parameter bucket: no description"),
        (_untyped, "not a PipelineSpec: "),
        (_wrong_default, "parameter preset: default 3 is not a STRING"),
        (_no_default, "parameter overrides: no default: a run given only the preset would lack it"),
        (_local_root, "defaultPipelineRoot: '/tmp/root' is not a gs:// path"),
        (_bad_name, "the Vertex AI SDK refuses it: Generated job ID: 2024-pipeline-"),
    ],
)
def test_check_pipeline_exits_2_naming_what_vertex_would_refuse(tmp_path, compiled, capsys, break_it, problem):
    """What `make compile-pipeline` (tpupipe compile, then this check of its output) and `tpupipe check-pipeline`
    refuse: a spec Vertex AI would reject, or whose run form would lack something."""
    import copy

    from pipelines.cli.main import main

    spec = copy.deepcopy(compiled)
    break_it(spec)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["check-pipeline", str(path), "--project", "my-project", "--region", "us-east5"]) == 2
    err = capsys.readouterr().err
    assert "Vertex AI would not run it as compiled" in err and problem in err, err


def test_make_compile_pipeline_compiles_then_checks(tmp_path, capsys):
    """`make compile-pipeline` is `tpupipe compile`, which checks what it compiled; a pipeline with a parameter left
    undescribed fails that check."""
    from kfp import dsl

    from pipelines.check import problems
    from pipelines.cli.main import main

    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    recipe = makefile.split("\ncompile-pipeline:", 1)[1].split("\n\n", 1)[0]
    assert "tpupipe compile --output $(PIPELINE_YAML)" in recipe
    assert main(["compile", "--output", str(tmp_path / "ok.yaml"), "--project", "my-project"]) == 0
    assert "checked as Vertex AI will read it" in capsys.readouterr().out

    @dsl.pipeline(name="undescribed")
    def undescribed(preset: str = "x"):
        from components import definitions as c

        c.teardown(
            preset=preset,
            platform="gke",
            overrides="",
            run_id="",
            job_name="j",
            output_root="",
            project="",
            bucket="",
            dataset="",
        )

    path = tmp_path / "undescribed.yaml"
    compile_pipeline(str(path), TARGET, undescribed)
    assert problems(str(path), "my-project", "us-east5") == [
        "parameter preset: no description (the Vertex AI run form shows it beside the field)"
    ]


def test_every_stage_that_resumes_asks_vertex_to_retry_it_and_a_local_run_retries_none(compiled, tmp_path):
    """Each stage says why it resumes safely (its record's ``resumes``, ``components.stages.table``); each such task's
    spec carries the ``retryPolicy`` KFP's ``set_retry`` compiles to, which Vertex AI honours. The file a local run
    compiles has none: kfp.local would retry a stage the driver stopped on Ctrl-C."""
    from components.stages.table import TABLE

    assert all(stage.resumes for stage in TABLE)
    tasks = {
        name: task
        for component in [compiled["root"], *compiled["components"].values()]
        for name, task in component.get("dag", {}).get("tasks", {}).items()
        if not name.startswith(("exit-handler", "condition"))
    }
    assert set(tasks) == STAGES
    for name, task in tasks.items():
        assert task["retryPolicy"] == {
            "maxRetryCount": 1,
            "backoffDuration": "30s",
            "backoffFactor": 2.0,
            "backoffMaxDuration": "600s",
        }, name
    local = tmp_path / "local.yaml"
    compile_pipeline(str(local), retries=False)
    assert "retryPolicy" not in local.read_text() and "triggerPolicy" in local.read_text()
