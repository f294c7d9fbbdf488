"""The gate on (emulated) Vertex AI: two jobs of the published pipeline register their models in Vertex AI Model
Registry (the emulated ModelService, on the same endpoint as the pipelines, reached by every task through
``$TPUPIPE_VERTEX_ENDPOINT``). The first job's model becomes the champion; the second (learning rate 0: its model is
the untrained one) is registered but not promoted, its promote task not triggered, and its gate Markdown and
summary say why with both held-out figures, the champion measured again in its own evaluation job."""

from __future__ import annotations

import pytest

from components.registry import PROVENANCE_FIELDS, open_registry
from tests.gke.conftest import PROJECT, REGION
from tests.vertex.test_vertex_pipeline import BUCKET, OVERRIDES, _nothing_left, _submit, _summary, _tasks

pytestmark = [pytest.mark.e2e]

MODEL = "local-fsdp"  # the preset's name: gate.model is empty
SMALL = OVERRIDES.replace("train.epochs=2", "train.epochs=1") + " cluster.slice_check=false"


def _artifact_text(project, artifact: dict) -> str:
    bucket, _, key = artifact["uri"].removeprefix("gs://").partition("/")
    return project.storage.data(bucket, key).decode()


def test_the_first_job_sets_the_champion_and_a_worse_one_is_registered_not_promoted(tmp_path, project_factory):
    project = project_factory(ray=True, vertex=True)
    registry = open_registry(project=PROJECT, region=REGION)  # Vertex AI Model Registry, the emulated one

    first = project.vertex.wait(_submit(project, tmp_path, "vx-gate-1", SMALL), timeout_s=1500)
    tasks = _tasks(first)
    assert first["state"] == "PIPELINE_STATE_SUCCEEDED", {t: (d["state"], d.get("error")) for t, d in tasks.items()}
    assert tasks["register"]["state"] == tasks["promote"]["state"] == "SUCCEEDED"
    metrics = tasks["register"]["outputs"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics["promote"] == 1.0 and "champion_loss" not in metrics
    champion = registry.champion(MODEL)
    summary = _summary(project, "vx-gate-1")
    assert champion.version == "1" and champion.artifact_uri == summary["checkpoint_uri"]
    assert champion.artifact_uri.startswith(f"gs://{BUCKET}/runs/vx-gate-1/")
    provenance = champion.provenance
    assert set(PROVENANCE_FIELDS) <= set(provenance)
    assert (provenance["run_id"], provenance["pipeline_job"], provenance["accelerator"], provenance["topology"]) == (
        "vx-gate-1", "vx-gate-1", "v6e", "2x2")
    assert provenance["trainer_image"].startswith(f"{REGION}-docker.pkg.dev/{PROJECT}/tpupipe/torch:vx-gate-1@sha256:")
    assert provenance["git_sha"] and provenance["eval_loss_after"] == pytest.approx(summary["eval_loss_after"])
    assert summary["gate"]["decision"] == "promote" and summary["gate"]["promoted"] is True

    second = project.vertex.wait(_submit(project, tmp_path, "vx-gate-2", SMALL + " train.learning_rate=0"),
                                 timeout_s=1500)
    tasks = _tasks(second)
    assert second["state"] == "PIPELINE_STATE_SUCCEEDED", {t: (d["state"], d.get("error")) for t, d in tasks.items()}
    assert tasks["register"]["state"] == "SUCCEEDED"
    assert tasks["gate-promotes"]["state"] == "NOT_TRIGGERED" and "promote" not in tasks
    assert registry.champion(MODEL).version == "1"
    assert [v.version for v in registry.versions(MODEL)] == ["1", "2"]
    summary = _summary(project, "vx-gate-2")
    gate = summary["gate"]
    assert (gate["ref"], gate["decision"], gate["champion_ref"]) == (f"{MODEL}@2", "keep", f"{MODEL}@1")
    # The champion measured again, in this job's evaluation, on the same held-out examples: its registered figure.
    assert gate["champion_loss"] == pytest.approx(provenance["eval_loss_after"], rel=1e-5)
    assert gate["eval_loss"] > gate["champion_loss"]
    metrics = tasks["register"]["outputs"]["metrics"]["artifacts"][0]["metadata"]
    assert (metrics["promote"], metrics["eval_loss"], metrics["champion_loss"]) == pytest.approx(
        (0.0, gate["eval_loss"], gate["champion_loss"]))
    table = _artifact_text(project, tasks["register"]["outputs"]["gate"]["artifacts"][0])
    assert f"| new: `{MODEL}@2` | {gate['eval_loss']:.4f} |" in table
    assert f"| champion: `{MODEL}@1` | {gate['champion_loss']:.4f} |" in table
    assert f"kept champion {MODEL}@1" in table and gate["reason"] in table
    promote = next(s for s in summary["stages"] if s["name"] == "promote")
    assert promote["status"] == "skipped" and promote["reason"] == gate["reason"] and summary["status"] == "succeeded"
    # Vertex AI's default version follows the champion: a deployment of the model serves version 1.
    assert project.models.aliases(f"projects/{PROJECT}/locations/{REGION}/models/{MODEL}")["default"] == "1"
    for run_id in ("vx-gate-1", "vx-gate-2"):
        _nothing_left(project, run_id)
