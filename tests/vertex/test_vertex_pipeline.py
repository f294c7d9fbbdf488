"""The pipeline on (emulated) Vertex AI (tests/emulators/vertex.py, reached by the real google-cloud-aiplatform SDK
over REST), as it runs there: compile -> publish (the components image built by Cloud
Build into Artifact Registry, the template into the KFP registry) -> ``aiplatform.PipelineJob(...).submit()`` -> every
task in its own process and empty directory, sharing nothing but the emulated cloud services: the run's state in
Cloud Storage, its cluster on the emulated GKE."""

from __future__ import annotations

import json

import pytest

from components.registry import PROVENANCE_FIELDS, open_registry
from components.spec.images import IMAGE_WITH_DIGEST
from pipelines.backends.vertex.jobs import PRESET_LABEL
from pipelines.pipeline import Target
from pipelines.publish.vertex import publish
from tests.emulators.project import ALLOW, PROJECT, REGION
from tests.helpers import unique_run_id

pytestmark = [pytest.mark.e2e]

BUCKET = f"{PROJECT}-tpupipe"
SERVICE_ACCOUNT = f"pipelines@{PROJECT}.iam.gserviceaccount.com"
# The first job is what the Vertex AI UI's run form starts with only the preset chosen: the smoke preset, every other
# parameter at the compiled default (project, bucket, output root), no overrides; its trainer image built by
# (emulated) Cloud Build, no Hugging Face token.
PRESET = "smoke"
MODEL = PRESET  # the registered model: the preset's name (gate.model is empty)
STAGES = [
    "snapshot_data",
    "provision",
    "build_image",
    "deploy_raycluster",
    "check_slice",
    "train",
    "evaluate",
    "register",
    "promote",
    "teardown",
]


def _submit(project, tmp_path, job_id: str, overrides: str | None = None) -> str:
    """Publish, and submit a job of the template publish uploaded (what the UI's "Create run" from a template
    starts) with the real SDK; its resource name. Without ``overrides``, the job sets the preset alone and no
    pipeline root, as the UI's run form does when only the preset is chosen (and the emulated project's default
    accounts allowed: ``ALLOW``)."""
    from google.cloud import aiplatform
    from google.oauth2.credentials import Credentials

    target = Target(project=PROJECT, region=REGION)
    publish(target, "tpupipe-pipelines", "v1", log=lambda m: None, allow_default=True)
    (package,) = project.kfp.packages.values()
    template = tmp_path / f"{job_id}.yaml"
    template.write_bytes(package["versions"][package["tags"]["v1"]])
    aiplatform.init(
        project=PROJECT,
        location=REGION,
        api_endpoint=project.vertex.endpoint,
        api_transport="rest",
        credentials=Credentials(token=project.token),
    )
    job = aiplatform.PipelineJob(
        display_name="tpupipe",
        template_path=str(template),
        job_id=job_id,
        # The UI's form takes the template's defaultPipelineRoot; the SDK does too when the job names none.
        pipeline_root=None if overrides is None else f"gs://{PROJECT}-pipeline-root/{job_id}",
        # The emulated project's nodes and builds run as its default accounts, which a run takes only when allowed.
        parameter_values={"preset": PRESET, "overrides": ((overrides or "") + ALLOW).strip()},
        labels={PRESET_LABEL: PRESET},  # as `tpupipe submit` labels its jobs, so `tpupipe runs` finds them
    )
    job.submit(service_account=SERVICE_ACCOUNT)
    return job.resource_name


def _tasks(resource: dict) -> dict[str, dict]:
    return {t["taskName"]: t for t in resource["jobDetail"]["taskDetails"]}


def _failure(project, name: str, tasks: dict[str, dict]) -> str:
    """Every task's state, then the whole output of each task that failed: what a failed job's assertion shows."""
    logs = project.vertex.job(name).logs
    states = "\n".join(f"{t}: {d['state']}" for t, d in tasks.items())
    failed = [t for t, d in tasks.items() if d["state"] == "FAILED" and t in logs]
    return states + "".join(f"\n----- {t}'s output\n{logs[t]}" for t in failed)


def _summary(project, run_id: str) -> dict:
    data = project.storage.data(BUCKET, f"state/{run_id}/summary.json")
    assert data is not None, "no summary in the bucket"
    return json.loads(data)


def _artifact_text(project, artifact: dict) -> str:
    bucket, _, key = artifact["uri"].removeprefix("gs://").partition("/")
    return project.storage.data(bucket, key).decode()


def _nothing_left(project, run_id: str) -> None:
    """No cluster, node pool, RayCluster, Compute resource or bucket binding of the run in any emulator."""
    assert project.clusters(run_id) == [] and project.pools(run_id) == [] and project.rayclusters(run_id) == []
    assert project.gke.state.clusters == {}
    state = project.compute.state
    assert not state.networks and not state.subnetworks and not state.resource_policies
    assert project.storage.members(BUCKET, "roles/storage.objectUser") == []


def test_published_pipeline_runs_on_vertex_alone_shows_its_artifacts_and_gates_the_next_model(
    tmp_path, project_factory
):
    """The pipeline on Vertex AI, then the gate: the first job, shaped as the UI starts one (the preset set, and the
    override that allows the emulated project's default accounts),
    succeeds and its model becomes the champion in Vertex AI Model Registry (the emulated ModelService), the run
    linked to the version by register's google.VertexModel artifact; a second job that continues from the champion
    and learns nothing is registered and not promoted."""
    project = project_factory(ray=True, vertex=True)
    ok, keep_id = unique_run_id("vx-ok"), unique_run_id("vx-keep")
    name = _submit(project, tmp_path, ok)
    # Published: the components image (every task names it by the digest its build pushed) and the template with its
    # tags.
    images = {e["container"]["image"] for e in project.vertex.job(name).spec["deploymentSpec"]["executors"].values()}
    assert len(images) == 1 and IMAGE_WITH_DIGEST.match(image := images.pop()) and project.registry.has_image(image)
    (template,) = project.kfp.packages.values()
    assert {"v1", "latest"} <= set(template["tags"])
    resource = project.vertex.wait(name, timeout_s=1500)
    tasks = _tasks(resource)
    assert resource["state"] == "PIPELINE_STATE_SUCCEEDED", _failure(project, name, tasks)
    assert resource["runtimeConfig"]["gcsOutputDirectory"] == f"gs://{BUCKET}/pipeline-root"  # the compiled default
    declared = project.vertex.job(name).spec["root"]["inputDefinitions"]["parameters"]
    given = resource["runtimeConfig"].get("parameterValues", {})
    assert given.get("preset") == PRESET
    assert given.get("overrides") == ALLOW.strip()  # the emulated project's default accounts allowed, no more
    assert all(given[k] == declared[k]["defaultValue"] for k in given if k not in ("preset", "overrides")), given
    # build_image does not wait for provision: the two tasks ran side by side (their times overlap).
    provision, build = tasks["provision"], tasks["build-image"]
    assert provision["startTime"] < build["endTime"] and build["startTime"] < provision["endTime"]
    # The run's state lives in the bucket; the summary written by teardown (its own task) saw every stage.
    summary = _summary(project, ok)
    assert [(s["name"], s["status"]) for s in summary["stages"]] == [(s, "succeeded") for s in STAGES]
    assert summary["run_dir"] == f"gs://{BUCKET}/state/{ok}"  # the run state: out of the pods' reach
    assert summary["eval_loss_after"] < summary["eval_loss_before"]
    # Typed artifacts in the task details, with the summary's figures.
    train, evaluate, teardown = tasks["train"]["outputs"], tasks["evaluate"]["outputs"], tasks["teardown"]["outputs"]
    metrics = train["metrics"]["artifacts"][0]
    assert metrics["schemaTitle"] == "system.Metrics"
    assert metrics["metadata"]["final_loss"] == pytest.approx(summary["train_losses"][-1])
    assert metrics["metadata"]["tokens_per_s"] == pytest.approx(summary["tokens_per_s"])
    assert metrics["metadata"]["seconds"] == pytest.approx(summary["train_seconds"])
    assert metrics["metadata"]["restarts"] == 0
    html = train["loss_curve"]["artifacts"][0]
    assert html["schemaTitle"] == "system.HTML"
    bucket, _, key = html["uri"].removeprefix("gs://").partition("/")
    assert b"data:image/png;base64," in project.storage.data(bucket, key)  # moved to the bucket, self-contained
    ev = evaluate["metrics"]["artifacts"][0]["metadata"]
    for key in ("eval_loss_before", "eval_loss_after", "perplexity_before", "perplexity_after"):
        assert ev[key] == pytest.approx(summary[key]), key
    assert evaluate["summary"]["artifacts"][0]["schemaTitle"] == "system.Markdown"
    model = evaluate["model"]["artifacts"][0]
    assert model["schemaTitle"] == "system.Model"
    assert model["uri"] == summary["checkpoint_uri"] and model["uri"].startswith(f"gs://{BUCKET}/runs/{ok}/")
    provenance = model["metadata"]
    assert provenance["preset"] == PRESET and provenance["accelerator"] == "v6e"
    assert provenance["topology"] == "1x1" and provenance["slices"] == 1
    assert provenance["trainer_image"].endswith(f"/torch:{ok}") and provenance["trainer_image_digest"]
    assert provenance["eval_loss_after"] == pytest.approx(summary["eval_loss_after"])
    assert teardown["deleted"]["artifacts"][0]["schemaTitle"] == "system.Markdown"
    # The whole run's account, from teardown's task: goodput as Metrics, the timeline as a self-contained page.
    goodput = teardown["goodput"]["artifacts"][0]
    assert goodput["schemaTitle"] == "system.Metrics"
    assert (
        goodput["metadata"]["goodput"] == pytest.approx(summary["goodput"]["goodput"])
        and 0 < summary["goodput"]["goodput"] < 1
    )
    assert goodput["metadata"]["usd"] == pytest.approx(summary["goodput"]["usd"]) and summary["goodput"]["usd"] > 0
    assert goodput["metadata"]["chip_s: productive steps"] > 0
    page = _artifact_text(project, teardown["timeline"]["artifacts"][0])
    assert teardown["timeline"]["artifacts"][0]["schemaTitle"] == "system.HTML" and "<svg" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "") and "class='restart'" not in page
    _nothing_left(project, ok)

    # The gate, in Vertex AI Model Registry (the emulated ModelService, reached by every task through
    # $TPUPIPE_VERTEX_ENDPOINT): the first model became the champion, with its provenance.
    registry = open_registry(project=PROJECT, region=REGION)
    assert tasks["register"]["state"] == tasks["promote"]["state"] == "SUCCEEDED"
    assert tasks["register"]["outputs"]["metrics"]["artifacts"][0]["metadata"]["promote"] == 1.0
    champion = registry.champion(MODEL)
    # The version names register's copy of the run's checkpoint, out of every run's reach (models/<model>/<run id>/).
    kept = f"gs://{BUCKET}/models/{MODEL}/{ok}"
    assert champion.version == "1" and champion.artifact_uri == kept
    trained = summary["checkpoint_uri"].removeprefix(f"gs://{BUCKET}/").rstrip("/")
    copied = project.storage.objects_of(BUCKET, f"models/{MODEL}/{ok}/")
    assert copied and copied == {
        name.replace(trained, f"models/{MODEL}/{ok}", 1): data
        for name, data in project.storage.objects_of(BUCKET, trained + "/").items()
    }
    first = champion.provenance
    assert set(PROVENANCE_FIELDS) <= set(first)
    assert (first["run_id"], first["pipeline_job"], first["accelerator"], first["topology"]) == (
        ok,
        name,  # the job's full resource name: the project and region it ran in
        "v6e",
        "1x1",
    )
    assert first["trainer_image"].startswith(f"{REGION}-docker.pkg.dev/{PROJECT}/tpupipe/torch:{ok}@sha256:")
    assert first["git_sha"] and first["eval_loss_after"] == pytest.approx(summary["eval_loss_after"])
    assert summary["gate"]["decision"] == "promote" and summary["gate"]["promoted"] is True
    # Lineage: register consumed the very Model artifact evaluate wrote, and its google.VertexModel names the version
    # registered, which is what links the run to it in the Model Registry's UI.
    assert tasks["register"]["inputs"]["model"]["artifacts"] == evaluate["model"]["artifacts"]
    (linked,) = tasks["register"]["outputs"]["registered"]["artifacts"]
    resource = f"projects/{PROJECT}/locations/{REGION}/models/{MODEL}@1"
    assert linked["schemaTitle"] == "google.VertexModel" and linked["metadata"]["resourceName"] == resource
    assert linked["uri"] == f"https://{REGION}-aiplatform.googleapis.com/v1/{resource}"
    assert registry.get(MODEL, "1").artifact_uri == kept  # the copy of the checkpoint evaluate's Model names

    # A second job continues from the champion (``train.init_from=champion``, resolved by its train task from the
    # Model Registry) but learns nothing (learning rate 0), so its "before" held-out loss is the champion's "after" and
    # so is its "after": registered, its promote task not triggered; its gate Markdown and summary say why with both
    # held-out figures, the champion measured again in its own evaluation job on the same examples. (A later version
    # promoted over a champion is the local gate's second run, tests/e2e/test_local_gate.py; Vertex AI's default alias
    # following it, tests/unit/test_registry.py.)
    # Its trainer also fails once at step 40, in its second epoch (32 steps each), and resumes from the first's
    # checkpoint: the restart its timeline marks.
    # And its train task's pod is evicted while the Ray job trains (SIGTERM, the job going on): the task reads that
    # its pipeline job is running, leaves the Ray job training and ends; its retry re-attaches to the same job.
    keep = "train.epochs=2 cluster.slice_check=false train.init_from=champion train.learning_rate=0"
    keep += " gate.min_improvement=0.01 testing.fail_at_step=40 train.max_failures=1"
    project.vertex.backoff_scale = 0.05  # train's 30 s backoff: 1.5 s here
    train_job = f"{keep_id}-train"
    project.vertex.terminate_first_attempt("train", when=lambda: project.kube.job_status(train_job) == "RUNNING")
    second = project.vertex.wait(_submit(project, tmp_path, keep_id, keep), timeout_s=1500)
    tasks = _tasks(second)
    assert second["state"] == "PIPELINE_STATE_SUCCEEDED", {t: (d["state"], d.get("error")) for t, d in tasks.items()}
    # The eviction: one SIGTERM, the Ray job neither stopped nor submitted again, the retry re-attached to it.
    assert [t for t, _ in project.vertex.terminated] == ["train"] and project.vertex.job(keep_id).attempts["train"] == 2
    (evicted,) = tasks["train"]["pipelineTaskStatus"]
    assert evicted["state"] == "RUNNING" and "exited with code" in evicted["error"]["message"]
    assert "re-attaching to job" in project.vertex.job(keep_id).logs["train"]
    train_calls = [(m, p) for m, p, _ in project.kube.requests if train_job in p]
    assert not [c for c in train_calls if c[1].endswith("/stop")], "the evicted task stopped the training"
    submits = [
        b
        for m, path, b in project.kube.bodies
        if m == "POST" and path.rstrip("/").endswith("/api/jobs") and train_job in b
    ]
    assert len(submits) == 1, submits
    assert tasks["register"]["state"] == "SUCCEEDED"
    assert tasks["gate-promotes"]["state"] == "NOT_TRIGGERED" and "promote" not in tasks
    assert registry.champion(MODEL).version == "1"
    assert [v.version for v in registry.versions(MODEL)] == ["1", "2"]
    summary = _summary(project, keep_id)
    assert summary["init_from"] == f"{MODEL}@1"
    assert summary["eval_loss_before"] == pytest.approx(first["eval_loss_after"], rel=1e-5)
    assert summary["eval_loss_after"] == pytest.approx(summary["eval_loss_before"], rel=1e-6)
    gate = summary["gate"]
    assert (gate["ref"], gate["decision"], gate["champion_ref"]) == (f"{MODEL}@2", "keep", f"{MODEL}@1")
    assert gate["champion_loss"] == pytest.approx(first["eval_loss_after"], rel=1e-5)
    assert gate["eval_loss"] > gate["champion_loss"] * 0.99  # short of gate.min_improvement, whatever the rounding
    assert gate["reason"].startswith(f"kept champion {MODEL}@1: {MODEL}@2 held-out {gate['eval_loss']:.4f}")
    second_version = registry.versions(MODEL)[-1]
    assert second_version.provenance["base_model"] == f"{MODEL}@1" and second_version.provenance["run_id"] == keep_id
    metrics = tasks["register"]["outputs"]["metrics"]["artifacts"][0]["metadata"]
    assert (metrics["promote"], metrics["eval_loss"], metrics["champion_loss"]) == pytest.approx(
        (0.0, gate["eval_loss"], gate["champion_loss"])
    )
    table = _artifact_text(project, tasks["register"]["outputs"]["gate"]["artifacts"][0])
    assert f"| new: `{MODEL}@2` | {gate['eval_loss']:.4f} |" in table
    assert f"| champion: `{MODEL}@1` | {gate['champion_loss']:.4f} |" in table
    assert f"kept champion {MODEL}@1" in table and gate["reason"] in table
    promote = next(s for s in summary["stages"] if s["name"] == "promote")
    assert promote["status"] == "skipped" and promote["reason"] == gate["reason"] and summary["status"] == "succeeded"
    # Its steps intact: every step of both epochs trained once, then the failure's repeated ones (the eviction
    # repeated none).
    steps = [s["step"] for s in summary["steps"]]
    assert steps == list(range(steps[0], steps[0] + 64)) and all(s["loss"] is not None for s in summary["steps"])
    assert summary["restarts"] == 1  # the trainer's own failure at step 40, and no other
    # The restart: its repeated steps and the new worker group lost to failures, marked on the timeline.
    lost = next(c for c in summary["goodput"]["categories"] if c["name"] == "lost to failures")
    assert lost["chip_s"] > 0 and len(summary["train_timeline"]["groups"]) == 2
    page = _artifact_text(project, tasks["teardown"]["outputs"]["timeline"]["artifacts"][0])
    assert page.count("class='restart'") == 1 and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    # Vertex AI's default version follows the champion: a deployment of the model serves version 1.
    assert project.models.aliases(f"projects/{PROJECT}/locations/{REGION}/models/{MODEL}")["default"] == "1"
    _nothing_left(project, keep_id)
