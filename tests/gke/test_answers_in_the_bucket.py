"""A gke run's answers to the evaluation prompts, as a Vertex AI run's tasks meet them: the train job's pods write
them under the run's prefix in the bucket (``runs/<id>/eval/``, the pods' Cloud Storage FUSE mount), and each stage
runs with nothing on its own disk (the run's state in ``gs://BUCKET/state/<id>/``, a fresh context per task). The
evaluate stage reads them through the run's store, keeps each set it compares in the run's state, and the version
registered in the emulated Vertex AI Model Registry names the kept copy; the gate decides on a task metric
(``gate.metric=exact_match``), keeping the champion when the trained model answers worse and promoting it when better;
a later run reads the champion's answers from the copy its version names, never from the champion run's pods' prefix
(which those pods could rewrite), and starts no evaluation job for them."""

from __future__ import annotations

import json

import pytest

from components.platforms import RunContext
from components.platforms.store import GcsStore
from components.stages import gate, ray_stages, registration, runner
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT
from tests.unit.test_answers_reuse import GENERATION, answered

BUCKET = f"{PROJECT}-tpupipe"
SPEC = (
    ONE_SLICE
    + " gke.hf_secret= gate.metric=exact_match eval.generate_examples=20 eval.metrics=exact_match,answer_length"
)
EVAL_KEY = "sha256:" + "e1" * 32
BUILD = {"image": "us-east5-docker.pkg.dev/p/tpupipe/torch:run", "built": True, "digest": "sha256:" + "ab" * 32}


@pytest.fixture
def bucket(project_factory, monkeypatch):
    """The emulated project and the runs' bucket (uniform access, as a run's bucket has it)."""
    from google.cloud import storage

    from components.cloud.credentials import credentials

    project = project_factory(polls_to_done=1)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    client = storage.Client(project=PROJECT, credentials=credentials())
    made = client.bucket(BUCKET)
    made.iam_configuration.uniform_bucket_level_access_enabled = True
    client.create_bucket(made, location="us-east5")
    return project


def task(run_id: str) -> RunContext:
    """One task's context: the run's state in the bucket, nothing of an earlier task on this disk."""
    return RunContext(
        spec=resolve("local-fsdp", SPEC), run_id=run_id, store=GcsStore(BUCKET, f"state/{run_id}"), platform="gke"
    )


def pods_wrote(project, run_id: str, which: str, right: int) -> dict:
    """What a train job's pods wrote under the run's prefix (20 prompts, ``right`` answered exactly) and the
    ``answers`` event it printed: the file as the pods see it (``/data/runs/<id>/...``)."""
    name = f"runs/{run_id}/eval/answers-{which}.jsonl"
    project.storage.put(BUCKET, name, answered(right).encode())
    means = {"exact_match": right / 20, "answer_length": 1.0}
    return {"which": which, "path": f"/data/{name}", "means": means, "generation_key": GENERATION, "num_examples": 20}


def trained(project, run_id: str, right: int, loss: float, before: int | None = None) -> dict:
    """The train stage's result as the run records it: its checkpoint and answers in the bucket, the job's figures."""
    project.storage.put(
        BUCKET, f"runs/{run_id}/train/checkpoint_000003/model.safetensors", b"weights " + run_id.encode()
    )
    figures = {"eval_loss_before": 4.6, "eval_loss_after": loss, "eval_key": EVAL_KEY, "num_eval_examples": 128}
    answered = {"after": pods_wrote(project, run_id, "after", right)}
    if before is not None:  # the model as built answered too
        answered["before"] = pods_wrote(project, run_id, "before", before)
    ctx = task(run_id)
    result = {
        "checkpoint": f"/data/runs/{run_id}/train/checkpoint_000003",
        "checkpoint_uri": f"gs://{BUCKET}/runs/{run_id}/train/checkpoint_000003",
        "device": "tpu",
        "num_workers": 1,
        "history": [{"epoch": 1, "loss": 2.0, "tokens_seen": 16384}],
        "restarts": 0,
        "heldout": figures,
        "answers": answered,
    }
    runner.record(ctx.store, "build_image", status="succeeded", result=BUILD)
    runner.record(ctx.store, "train", status="succeeded", result=result)
    return result


def evaluated_and_registered(run_id: str, train: dict) -> tuple[dict, dict]:
    """The evaluate, register and (when decided) promote tasks, each in a context of its own."""
    evaluation = ray_stages.evaluate(task(run_id), json.dumps(train))
    runner.record(task(run_id).store, "evaluate", status="succeeded", result=evaluation)
    registered = registration.register(task(run_id), json.dumps(evaluation))
    runner.record(task(run_id).store, "register", status="succeeded", result=registered)
    if registered["decision"] == gate.PROMOTE:
        registration.promote(task(run_id), gate.PROMOTE)
    return evaluation, registered


def kept(project, run_id: str, name: str) -> str:
    return (project.storage.data(BUCKET, f"state/{run_id}/eval/{name}") or b"").decode()


def test_a_gke_run_gates_on_the_answers_in_the_bucket_and_the_next_run_reuses_the_champions(bucket):
    project = bucket
    # The first version: its answers beside the model as built, read from the bucket; promoted (no champion).
    evaluation, registered = evaluated_and_registered("run-1", trained(project, "run-1", 12, 1.5, before=0))
    first = evaluation["task"]
    assert first["against"] == "before training" and "comparison_missing" not in first
    assert first["comparison"]["exact_match"]["difference"] == pytest.approx(0.6)
    assert registered["decision"] == gate.PROMOTE
    assert kept(project, "run-1", "answers-after.jsonl").count("\n") == 20
    assert "Gate: promoted local-fsdp@1 to champion" in kept(project, "run-1", "side_by_side.md")
    version = gate.registry(task("run-1")).get("local-fsdp", "1")
    assert version.provenance["answers_uri"] == f"gs://{BUCKET}/state/run-1/eval/answers-after.jsonl"
    assert version.provenance["answers_key"] == ray_stages.answers_key(task("run-1"), GENERATION)

    # The first run's pods' prefix changed afterwards: what a later run reads is the copy the pipeline kept.
    project.storage.put(BUCKET, "runs/run-1/eval/answers-after.jsonl", b"")

    # A lower held-out loss but worse answers: exact match decides, the champion stays.
    evaluation, registered = evaluated_and_registered("run-2", trained(project, "run-2", 10, 1.2))
    second = evaluation["task"]
    assert "job" not in evaluation  # the champion's figure and answers are both its record's
    assert second["against"] == "champion" and second["champion_answers"] == "recorded by local-fsdp@1"
    assert second["comparison"]["exact_match"]["difference"] == pytest.approx(-0.1)
    assert (registered["decision"], registered["decided_by"]) == (gate.KEEP, "exact_match")
    assert registered["reason"].startswith("kept champion local-fsdp@1: local-fsdp@2 exact_match 0.5000 vs champion")
    assert "Gate: kept champion local-fsdp@1" in kept(project, "run-2", "side_by_side.md")

    # Better answers: promoted on exact match, against the same recorded answers of the champion.
    evaluation, registered = evaluated_and_registered("run-3", trained(project, "run-3", 15, 1.3))
    third = evaluation["task"]
    assert "job" not in evaluation and third["champion_answers"] == "recorded by local-fsdp@1"
    assert third["comparison"]["exact_match"]["difference"] == pytest.approx(0.15)
    assert (registered["decision"], registered["decided_by"]) == (gate.PROMOTE, "exact_match")
    assert gate.registry(task("run-3")).champion("local-fsdp").version == "3"
    merged = [json.loads(line) for line in kept(project, "run-3", "answers.jsonl").splitlines()]
    assert merged[11]["answer"] == "11w" and merged[11]["champion"]["answer"] == "11w"
    assert merged[12]["answer"] == "12w" and merged[12]["champion"]["answer"] == "x"
