"""What a stage's task does on Vertex AI before it acts: where it runs checked by every stage, the run's labels
put on what a gke run creates."""

from __future__ import annotations

import json

import pytest

from components.platforms import VERTEX_TASK_ENV, vertex_run_labels
from components.platforms.gke.run.session import with_labels


def test_a_tasks_run_labels_go_on_every_resource_labels_and_the_runs_own_win():
    given = {"vertex-ai-pipelines-run-billing-id": "870", "team": "ml", "Bad Key": "x", "tpupipe-run": "other"}
    labels = vertex_run_labels({VERTEX_TASK_ENV: json.dumps(given)})
    assert labels == {"vertex-ai-pipelines-run-billing-id": "870", "team": "ml", "tpupipe-run": "other"}
    assert vertex_run_labels({}) == {} and vertex_run_labels({VERTEX_TASK_ENV: "not json"}) == {}
    body = {
        "name": "c",
        "resourceLabels": {"tpupipe-run": "r1"},
        "nodePools": [{"config": {"resourceLabels": {"tpupipe-run": "r1"}, "labels": {"k": "v"}}}],
    }
    labelled = with_labels(body, labels)
    expected = {"vertex-ai-pipelines-run-billing-id": "870", "team": "ml", "tpupipe-run": "r1"}
    assert labelled["resourceLabels"] == expected
    assert labelled["nodePools"][0]["config"]["resourceLabels"] == expected
    assert labelled["nodePools"][0]["config"]["labels"] == {"k": "v"}  # Kubernetes node labels: not billing's
    assert body["resourceLabels"] == {"tpupipe-run": "r1"}  # the plan's body is left as it was


@pytest.mark.parametrize(("platform", "field"), [("local", "platform"), ("gke", "output_root")])
def test_on_vertex_build_image_refuses_a_run_that_cannot_work_there_before_building_exit_2(
    tmp_path, monkeypatch, platform, field
):
    """build_image runs beside provision, so it checks where it runs itself: a local run, or a run whose state is off
    Cloud Storage, started from the Vertex AI UI exits 2 naming the parameter before it builds anything; its record
    (failed) is all it writes."""
    from components.stages.runner import run_stage

    monkeypatch.setenv(VERTEX_TASK_ENV, json.dumps({"vertex-ai-pipelines-run-billing-id": "1"}))
    root = tmp_path / "runs"
    with pytest.raises(SystemExit) as refused:
        run_stage("build_image", "local-fsdp", platform, "", "vx-refused", "", str(root))
    assert refused.value.code == 2
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert written == ["vx-refused/stages/build_image.json"]
    record = json.loads((root / written[0]).read_text())
    assert record["status"] == "failed" and record["error"].startswith(f"{field}: ")
    assert "every task runs on a machine of its own" in record["error"]


def test_the_run_id_derives_from_the_jobs_id_when_a_task_is_given_its_full_resource_name(tmp_path):
    """Every task on Vertex AI gets the job's full resource name; the run id (and so its store, what every stage and
    the artifacts a component writes read) is the one its id gives, as a local run's job name gives it."""
    from components.stages.runner import store_for

    name = "projects/p-123456/locations/us-east5/pipelineJobs/tpupipe-smoke-20261204"
    assert store_for("", name, str(tmp_path))[0] == store_for("", "tpupipe-smoke-20261204", str(tmp_path))[0]
    assert store_for("", name, str(tmp_path))[0] == "tpupipe-smoke-20261204"
    assert store_for("given", name, str(tmp_path))[0] == "given"


def test_every_stage_checks_its_credentials_before_it_acts(tmp_path, monkeypatch):
    """A gke stage's task with no Google Cloud credentials where it runs (no GOOGLE_APPLICATION_CREDENTIALS, no gcloud
    login, no metadata server) is refused before it acts: one line naming the fix, exit 2, its record failed."""
    from components.cloud.credentials import LOGIN, AccessError
    from components.stages.runner import run_stage

    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "TPUPIPE_GKE_EMULATOR_TOKEN", "TPUPIPE_GKE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # google-auth told there is no metadata server
    root = tmp_path / "runs"
    with pytest.raises(AccessError, match="no Google Cloud credentials") as refused:
        run_stage("build_image", "smoke", "gke", "gke.project=tpupipe-emulated", "no-creds", "", str(root))
    assert refused.value.exit_code == 2 and LOGIN in str(refused.value)
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert written == ["no-creds/stages/build_image.json"]  # no heartbeat: the stage never started its work
    record = json.loads((root / "no-creds" / "stages" / "build_image.json").read_text())
    assert record["status"] == "failed" and "no Google Cloud credentials" in record["error"]
