"""Components under kfp.local (SubprocessRunner), one at a time, with the pipeline environment."""

import json
import warnings
from typing import NamedTuple

import pytest
from kfp import dsl, local

from components import definitions as c
from components.artifact_types import VertexModel
from components.platforms.local import envs
from components.platforms.local.processes import run_processes


@pytest.fixture(autouse=True)
def kfp_local(tmp_path):
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)


def args(tmp_path, run_id, **kw):
    base = dict(
        preset="local-fsdp",
        platform="local",
        overrides="",
        run_id=run_id,
        job_name="ignored",
        output_root=str(tmp_path / "runs"),
        project="",
        bucket="",
        dataset="",
    )
    return {**base, **kw}


def test_provision_rejects_bad_input_before_starting_anything(tmp_path):
    with pytest.raises(RuntimeError):
        c.provision(**args(tmp_path, "bad-input", overrides="epochs=0"))
    record = json.loads((tmp_path / "runs" / "bad-input" / "stages" / "provision.json").read_text())
    assert record["status"] == "failed"
    assert record["error"].startswith("train.epochs: must be at least 1")
    assert not (tmp_path / "runs" / "bad-input" / "ledger.json").exists()
    assert run_processes("bad-input") == []


def test_provision_rejects_a_tpu_preset_on_the_local_platform(tmp_path):
    with pytest.raises(RuntimeError):
        c.provision(**args(tmp_path, "tpu-local", preset="gemma4-e2b-v6e-16"))
    record = json.loads((tmp_path / "runs" / "tpu-local" / "stages" / "provision.json").read_text())
    assert record["error"].startswith("cluster.accelerator: the local platform emulates CPU hosts")


def test_on_vertex_the_first_task_refuses_a_local_platform_before_anything(tmp_path, monkeypatch):
    """Vertex AI gives every task VERTEX_AI_PIPELINES_RUN_LABELS: there, a local run would keep its cluster and state
    on the first task's own machine."""
    monkeypatch.setenv("VERTEX_AI_PIPELINES_RUN_LABELS", '{"vertex-ai-pipelines-run-billing-id": "1"}')
    with pytest.raises(RuntimeError):
        c.snapshot_data(**args(tmp_path, "on-vertex"), schedule_time="", create_time="")
    record = json.loads((tmp_path / "runs" / "on-vertex" / "stages" / "snapshot_data.json").read_text())
    assert record["status"] == "failed"  # what the run's summary shows (when its state is in Cloud Storage)
    assert record["error"].startswith("platform: 'local' is not a run for Vertex AI: on Vertex AI every task runs")
    assert not (tmp_path / "runs" / "on-vertex" / "ledger.json").exists() and run_processes("on-vertex") == []


@pytest.mark.parametrize(
    ("platform", "output_root", "message"),
    [
        ("local", "gs://b/runs", "platform: 'local' is not a run for Vertex AI"),
        ("gke", "/var/runs", "output_root: '/var/runs' is not a gs:// path"),
        ("gke", "", "output_root: '' is not a gs:// path"),
    ],
)
def test_on_vertex_a_run_is_a_gke_run_with_its_state_in_cloud_storage(platform, output_root, message):
    from components.spec import SpecError
    from components.stages.vertex_task import VERTEX_TASK_ENV, check_on_vertex

    with pytest.raises(SpecError, match=message) as refused:
        check_on_vertex(platform, output_root, {VERTEX_TASK_ENV: "{}"})
    assert "every task runs on a machine of its own" in str(refused.value)
    check_on_vertex(platform, output_root, {})  # off Vertex AI, both are fine
    check_on_vertex("gke", "gs://b/runs", {VERTEX_TASK_ENV: "{}"})


@pytest.mark.trainer_env  # needs the torch trainer environment, which `make test` builds while the fast tiers run
def test_build_image_reuses_the_torch_environment_by_content_hash(tmp_path):
    envs.ensure_env("torch", log=lambda m: None)  # built by `make test` beside the fast tiers; waited on, or built
    task = c.build_image(**args(tmp_path, "build"))
    out = json.loads(task.output)
    assert out["reused"] is True
    assert out["image"] == f"local/torch@{envs.image_digest('torch')}"


def test_teardown_without_a_cluster_succeeds_and_writes_a_summary(tmp_path):
    task = c.teardown(**args(tmp_path, "nothing-here"))
    assert json.loads(task.outputs["Output"])["stopped_groups"] == 0
    assert "Nothing was left to delete" in open(task.outputs["deleted"].path).read()  # the Markdown artifact
    summary = json.loads((tmp_path / "runs" / "nothing-here" / "summary.json").read_text())
    assert summary["status"] == "failed"  # nothing else ran
    assert [s["name"] for s in summary["stages"]][-1] == "teardown"
    assert summary["stages"][-1]["status"] == "succeeded"
    # The run's account as teardown's artifacts: no stage before it billed a chip, so no goodput figure, and a
    # timeline page of its one lane.
    assert summary["goodput"]["billed_chip_s"] == 0 and summary["goodput"]["goodput"] is None
    assert "<svg" in open(task.outputs["timeline"].path).read()


def test_snapshot_data_outputs_the_runs_copy_as_a_dataset_and_its_data_card(tmp_path):
    """The Dataset is the run's own copy of its training examples with that copy's content digest; the Markdown is
    the data card the stage wrote beside its manifest."""
    rows = [{"instruction": f"Repeat w{i}.", "response": f"w{i} w{i}"} for i in range(40)]
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + rows[:2]))
    task = c.snapshot_data(
        **args(tmp_path, "snap", overrides=f"train.dataset={tmp_path}/sft/"), schedule_time="", create_time=""
    )
    assert task.outputs["Output"] == "train"
    manifest = json.loads((tmp_path / "runs" / "snap" / "data" / "manifest.json").read_text())
    data = task.outputs["data"]
    assert data.uri == data.metadata["location"] == manifest["copies"]["train"]["uri"]
    assert data.uri == f"{tmp_path}/runs/snap/data/train.jsonl"
    assert data.metadata["digest"] == manifest["copies"]["train"]["digest"]
    assert (data.metadata["snapshot"], data.metadata["duplicates"]) == (manifest["digest"], 2)
    card = open(task.outputs["card"].path).read()
    assert card == (tmp_path / "runs" / "snap" / "data" / "card.md").read_text()
    assert f"# Data card: `{tmp_path}/sft/`" in card and "| duplicates dropped | 2 |" in card


def test_run_id_defaults_to_the_pipeline_job_name(tmp_path):
    task = c.teardown(**args(tmp_path, "", job_name="Tpupipe-2026-11-29-10-04-42"))
    assert task.outputs["Output"]
    assert (tmp_path / "runs" / "tpupipe-2026-11-29-10-04-42" / "summary.json").is_file()


def _trained_run(tmp_path, run_id: str) -> str:
    """The records a run that trained leaves for register: its checkpoint, train's and build_image's results."""
    from components.platforms.store import LocalStore
    from components.stages.runner import record

    store = LocalStore(tmp_path / "runs" / run_id)
    checkpoint = tmp_path / "runs" / run_id / "train" / "checkpoint_000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights of " + run_id.encode())
    record(
        store, "build_image", status="succeeded", result={"image": "local/torch@0123456789ab", "digest": "0123456789ab"}
    )
    record(
        store,
        "train",
        status="succeeded",
        result={
            "checkpoint": str(checkpoint),
            "checkpoint_uri": str(checkpoint),
            "restarts": 0,
            "data_snapshot": "sha256:" + "d4" * 32,
            "history": [{"epoch": 1, "loss": 2.0, "tokens_seen": 16384}],
        },
    )
    return str(checkpoint)


def _measured(checkpoint: str) -> dict:
    """What the evaluate stage records of the checkpoint it measured (``ray_stages.pin_checkpoint``)."""
    from components.platforms.local.platform import LocalPlatform
    from components.stages import ray_stages

    return {ray_stages.MEASURED: {"uri": checkpoint, "versions": LocalPlatform().checkpoint_versions(None, checkpoint)}}


@dsl.component(install_kfp_package=False)
def evaluated_model(uri: str, model: dsl.Output[dsl.Model]):
    """The Model artifact evaluate hands register: the checkpoint."""
    model.uri = uri


class Registered(NamedTuple):
    Output: str
    metrics: dsl.Metrics
    gate: dsl.Markdown
    registered: VertexModel


def _register(given: dict, checkpoint: str):
    """register as the pipeline runs it, evaluate's Model artifact its input (kfp.local hands a task an input
    artifact only inside a pipeline); its outputs."""

    @dsl.pipeline(name="registering")
    def registering() -> Registered:
        model = evaluated_model(uri=checkpoint).outputs["model"]
        task = c.register(**given, model=model)
        outputs = task.outputs
        return Registered(outputs["Output"], outputs["metrics"], outputs["gate"], outputs["registered"])

    return registering()


def test_register_outputs_the_gate_decision_and_promote_moves_the_champion(tmp_path):
    from components.registry import open_registry

    checkpoint = _trained_run(tmp_path, "gate-1")
    first = {"eval_loss_before": 4.6, "eval_loss_after": 1.5, "eval_split": "heldout", **_measured(checkpoint)}
    given = dict(args(tmp_path, "gate-1"), source_version="3f2a9c1e", eval_result=json.dumps(first))
    task = _register(given, checkpoint)
    assert task.outputs["Output"] == "promote"
    # The version registered (a google.VertexModel in the compiled spec: tests/pipeline/test_compiled_pipeline.py;
    # kfp.local hands a pipeline's artifact outputs back untyped): a local registry is no Vertex AI resource, so its
    # uri is the checkpoint registration kept, out of every run's directory, and it has no resourceName
    # (tests/vertex/test_vertex_pipeline.py has the Model Registry's).
    kept = str(tmp_path / "runs" / "_models" / "local-fsdp" / "gate-1")
    registered = task.outputs["registered"]
    assert registered.metadata["ref"] == "local-fsdp@1"
    assert registered.uri == kept and "resourceName" not in registered.metadata
    assert task.outputs["metrics"].metadata["promote"] == 1.0 and task.outputs["metrics"].metadata["eval_loss"] == 1.5
    table = open(task.outputs["gate"].path).read()
    assert "**Gate: promote** — promoted local-fsdp@1 to champion: there was no champion yet" in table
    assert f"| data_snapshot | `sha256:{'d4' * 32}` |" in table and "| git_sha | `3f2a9c1e` |" in table
    registry = open_registry(tmp_path / "runs")
    assert registry.champion("local-fsdp") is None  # registered; not yet promoted
    c.promote(**args(tmp_path, "gate-1"), decision="promote")
    champion = registry.champion("local-fsdp")
    assert champion.version == "1" and champion.artifact_uri == kept

    second = _trained_run(tmp_path, "gate-2")
    worse = {
        "eval_loss_before": 4.6,
        "eval_loss_after": 4.6,
        "eval_split": "heldout",
        "champion_loss": 1.5,
        "champion": {"ref": "local-fsdp@1", "version": "1"},
        **_measured(second),
    }
    given = args(tmp_path, "gate-2", overrides="train.learning_rate=0")
    task = _register(dict(given, source_version="", eval_result=json.dumps(worse)), second)
    assert task.outputs["Output"] == "keep"
    metrics = task.outputs["metrics"].metadata
    assert (metrics["eval_loss"], metrics["champion_loss"], metrics["promote"]) == (4.6, 1.5, 0.0)
    table = open(task.outputs["gate"].path).read()
    assert "| new: `local-fsdp@2` | 4.6000 |" in table and "| champion: `local-fsdp@1` | 1.5000 |" in table
    assert "kept champion local-fsdp@1" in table
    assert [v.version for v in registry.versions("local-fsdp")] == ["1", "2"]
    assert registry.champion("local-fsdp").version == "1"
