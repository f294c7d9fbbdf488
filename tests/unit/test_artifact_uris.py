"""Where a stage's output artifact points (``components.stages.artifacts.point``): at the run's copy or checkpoint
where the backend takes a uri outside the pipeline root (Vertex AI, kfp.local), and never on Kubeflow Pipelines, whose
launcher refuses an output artifact whose uri is outside the pipeline root (kubeflow/pipelines
backend/src/v2/component/launcher_v2.go, uploadOutputArtifacts, and backend/src/v2/objectstore/config.go, KeyFromURI,
at 2.15.0 and 2.17.0): there the location is in the metadata alone."""

from __future__ import annotations

from kfp import dsl

from components.platforms import VERTEX_TASK_ENV
from components.stages.artifacts import point

ROOT = "gs://acme-tpupipe/pipeline-root/tpupipe-123/evaluate/model"
CHECKPOINT = "gs://acme-tpupipe/runs/r1/ray_results/r1/final_00000048"


def test_on_kubeflow_pipelines_the_launchers_uri_stays_and_the_metadata_names_the_checkpoint(monkeypatch):
    monkeypatch.delenv(VERTEX_TASK_ENV, raising=False)
    model = dsl.Model(uri=ROOT)
    point(model, CHECKPOINT)
    assert model.uri == ROOT and model.metadata["location"] == CHECKPOINT


def test_on_vertex_ai_the_artifact_points_at_the_checkpoint(monkeypatch):
    monkeypatch.setenv(VERTEX_TASK_ENV, '{"vertex-ai-pipelines-run-billing-id": "1"}')
    model = dsl.Model(uri=ROOT)
    point(model, CHECKPOINT)
    assert model.uri == model.metadata["location"] == CHECKPOINT


def test_on_kfp_local_a_local_uri_points_at_the_copy_and_nothing_is_pointed_at_nowhere(monkeypatch, tmp_path):
    monkeypatch.delenv(VERTEX_TASK_ENV, raising=False)
    data = dsl.Dataset(uri=str(tmp_path / "local_outputs" / "data"))
    point(data, str(tmp_path / "runs" / "r1" / "data" / "train.jsonl"))
    assert data.uri == data.metadata["location"] == str(tmp_path / "runs" / "r1" / "data" / "train.jsonl")
    kept = dsl.Dataset(uri=ROOT)
    point(kept, "")
    assert kept.uri == ROOT and "location" not in kept.metadata
