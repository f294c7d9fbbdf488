"""`tpupipe submit`, `tpupipe schedule …` and `tpupipe runs …` against the emulated Vertex AI (the real
google-cloud-aiplatform SDK over REST), and the Hugging Face token from Secret Manager."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from datetime import timedelta

import pytest

from components.spec import names
from components.spec.images import IMAGE_WITH_DIGEST
from pipelines.pipeline import Target
from pipelines.publish.vertex import publish
from tests.emulators.project import LEAN, ONE_SLICE, PROJECT, PROJECT_NUMBER, REGION
from tests.emulators.secretmanager import SecretManagerEmulator
from tests.helpers import tpupipe_cmd, unique_run_id, wait_until

BASE = "gke.torch_tpu_base=us-docker.pkg.dev/tpupipe-emulated/base/tt:2"
OVERRIDES = ONE_SLICE.replace("gke.image=local/torch", BASE) + " gke.hf_secret= train.epochs=2" + LEAN
SENTINEL = "hf_SECRETMANAGER0123456789SENTINEL"
ENCODED = base64.b64encode(SENTINEL.encode()).decode()  # as a Secret's data carries it
PLACE = ["--project", PROJECT, "--region", REGION]
# The pipeline's identity: with one, the SDK creates the pipeline root's bucket without looking up the project number.
ACCOUNT = ["--service-account", f"pipelines@{PROJECT}.iam.gserviceaccount.com"]


def _published(project) -> None:
    publish(Target(project=PROJECT, region=REGION), "tpupipe-pipelines", "v1", log=lambda m: None, allow_default=True)


def _env(project) -> dict[str, str]:
    return {**os.environ, **project.env, "TPUPIPE_VERTEX_ENDPOINT": project.vertex.endpoint}


def _tpupipe(project, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([*tpupipe_cmd(), *args], env=_env(project), capture_output=True, text=True, timeout=timeout)


def _fail_at_preflight(project) -> None:
    """Every attempt of provision (it is retried once) fails in preflight, before it creates anything: GKE refuses
    the versions it offers."""
    import grpc

    project.gke.fail("GetServerConfig", grpc.StatusCode.PERMISSION_DENIED, "container.clusters.list denied", 1_000)


def _job(project, name: str):
    return project.vertex.job(name.rsplit("/", 1)[-1])


def _deleting_since(project, run_id: str) -> dict[str, float]:
    """Watch the run's cluster from now: ``at`` is set to when GKE first shows it being deleted (STOPPING) or gone,
    the instant its nodes stop being the run's to pay for."""
    import threading
    import time

    from google.cloud.container_v1 import Cluster

    seen: dict[str, float] = {}

    def watch() -> None:
        had = False
        while "at" not in seen:
            clusters = [cl for n, cl in list(project.gke.state.clusters.items()) if run_id in n]
            had = had or bool(clusters)
            if had and all(cl.status == Cluster.Status.STOPPING for cl in clusters):
                seen["at"] = time.time()
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return seen


@pytest.mark.e2e  # runs Vertex AI jobs, each task its own process
def test_submit_list_cancel_during_train_show_and_the_token_reaches_only_the_kubernetes_secret(
    project_factory, record_property
):
    """`tpupipe submit`, `runs list` while it trains, `runs cancel` during train: the cancel reaches the train task as
    SIGTERM while its pipeline job is CANCELLING, so the task stops the Ray job and starts the deletion of the run's
    cluster at once, not waiting on it (the time from cancel to the cluster being deleted is this test's record,
    ``cancel_to_deleting_s``); as Vertex AI documents, the exit handler's teardown task is cancelled with the rest, so
    `runs cancel` tears the rest of the run down from its ledger and prints what it deleted; `runs show`.
    provision's first attempt is killed once its cluster exists (a lost machine): its retry policy runs it again and
    it resumes, one cluster, not two. The Hugging Face token goes from Secret Manager to the run's Kubernetes Secret
    and nowhere else, cancel path included; nothing of the run is left in any emulator."""
    project = project_factory(ray=True, vertex=True)
    project.vertex.backoff_scale = 0.05  # provision's 30 s backoff: 1.5 s here
    project.vertex.kill_first_attempt("provision", when=lambda: bool(project.gke.state.clusters))
    secrets = SecretManagerEmulator({PROJECT: PROJECT_NUMBER})
    project.env["TPUPIPE_SECRET_MANAGER_EMULATOR_HOST"] = secrets.start()
    project.vertex.env["TPUPIPE_SECRET_MANAGER_EMULATOR_HOST"] = project.env["TPUPIPE_SECRET_MANAGER_EMULATOR_HOST"]
    project.extras.append(secrets)
    version = secrets.add(PROJECT, "hf-token", SENTINEL.encode())
    _published(project)
    overrides = (
        OVERRIDES.replace("gke.hf_secret=", "gke.hf_secret=hf-secret").replace("train.epochs=2", "train.epochs=50")
        + f" gke.hf_token_secret=projects/{PROJECT}/secrets/hf-token cluster.slice_check=false"
    )
    run_id = unique_run_id("vx-submit")  # the Ray cluster's processes carry it: this session's own
    proc = _tpupipe(
        project, "submit", "local-fsdp", "--set", overrides, *PLACE, *ACCOUNT, "--run-id", run_id, "--label", "team=ml"
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "submitted projects/" in proc.stdout and "console.cloud.google.com/vertex-ai" in proc.stdout
    name = proc.stdout.split("submitted ", 1)[1].split()[0]
    job_id = name.rsplit("/", 1)[-1]
    wait_until(
        lambda: project.kube.job_status(f"{run_id}-train") == "RUNNING", 900, f"the train job {run_id}-train to run", 1
    )
    listed = _tpupipe(project, "runs", "list", "--preset", "local-fsdp", "--state", "running", *PLACE)
    assert job_id in listed.stdout, listed.stdout + listed.stderr
    # The run's Vertex AI labels (its billing id, the user's) on the cluster and its nodes, beside the run's own: the
    # run's cost in Vertex AI counts its TPUs.
    billing = project.vertex.job(job_id).resource["labels"]["vertex-ai-pipelines-run-billing-id"]
    (cluster,) = project.gke.state.clusters.values()
    for labels in [cluster.resource_labels, *(p.config.resource_labels for p in cluster.node_pools)]:
        assert labels["vertex-ai-pipelines-run-billing-id"] == billing and labels["team"] == "ml", labels
        assert labels[names.RUN_LABEL] == run_id
    deleting = _deleting_since(project, run_id)
    cancelled = _tpupipe(project, "runs", "cancel", job_id, *PLACE)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    # The train task took the cancel's SIGTERM: the job was CANCELLING, so it stopped the Ray job (below) and started
    # the cluster's deletion itself, seconds after the cancel, before `runs cancel` got to its own teardown.
    (sigterm,) = [at for task, at in project.vertex.terminated if task == "train"]
    train = json.loads(project.storage.data(f"{PROJECT}-tpupipe", f"state/{run_id}/stages/train.json"))
    assert train["status"] == "interrupted" and train["signal"] == "SIGTERM", train
    (released,) = train["released"]
    assert released.startswith(f"projects/{PROJECT}/locations/") and released.endswith(f"/clusters/tpupipe-{run_id}")
    record_property("cancel_to_deleting_s", round(deleting["at"] - sigterm, 2))
    print(f"cancel -> the cluster's deletion under way: {deleting['at'] - sigterm:.2f} s")
    assert deleting["at"] - sigterm < 60, deleting["at"] - sigterm
    resource = project.vertex.job(job_id).resource  # runs cancel returned once it had ended
    tasks = {t["taskName"]: t for t in resource["jobDetail"]["taskDetails"]}
    assert resource["state"] == "PIPELINE_STATE_CANCELLED"
    assert tasks["train"]["state"] == "CANCELLED" and tasks["evaluate"]["state"] == "CANCELLED"
    assert tasks["teardown"]["state"] == "CANCELLED" and "teardown" not in project.vertex.job(job_id).logs
    assert "  train                cancelled" in cancelled.stdout and f"{name}: cancelled" in cancelled.stdout
    assert f"tpupipe teardown {run_id} (gke): deleted " in cancelled.stdout
    # The cluster went with train's release (a real deletion takes minutes; the teardown then waits for it and names
    # it, which here it may find done already): nothing of the run is left either way.
    assert not project.gke.state.clusters
    # The cluster's pods end as pods do, in their grace period: their processes may outlive the call by seconds.
    wait_until(lambda: project.leftovers(run_id) == {}, 60, "the run's pods to end")
    # provision: killed once mid-way, retried per its policy (30 s backoff), resumed: one cluster created.
    assert project.vertex.job(job_id).attempts["provision"] == 2 and project.vertex.job(job_id).backoffs == {
        "provision": [30.0]
    }
    assert [t["state"] for t in tasks["provision"]["pipelineTaskStatus"]] == ["RUNNING"]  # an error being retried
    assert tasks["provision"]["state"] == "SUCCEEDED" and project.gke.state.calls.count("CreateCluster") == 1
    stops = [p for m, p, _ in project.kube.requests if m == "POST" and p.endswith(f"/api/jobs/{run_id}-train/stop")]
    assert stops, "the train job was not stopped"
    shown = _tpupipe(project, "runs", "show", name, *PLACE)
    assert "PIPELINE_STATE_CANCELLED" in shown.stdout and "teardown             cancelled" in shown.stdout
    assert "cost so far          $" in shown.stdout and "/h, list prices" in shown.stdout  # v6e on-demand is priced
    # The token: read from Secret Manager, into the run's Kubernetes Secret (deleted by teardown), nowhere else.
    assert secrets.accessed == [version.rsplit("/", 1)[0] + "/latest"]
    created = [body for method, path, body in project.kube.bodies if "/secrets" in path and ENCODED in body]
    assert len(created) == 1 and f'"{names.hf_token_secret(run_id)}"' in created[0], "the run's token Secret: not once"
    job = project.vertex.job(job_id)
    logs = "\n".join(job.logs.values())
    stored = [data for bucket in project.storage.state.buckets for data in project.storage.objects_of(bucket).values()]
    objects = b"\n".join(stored).decode(errors="replace")
    # The cluster's Ray token likewise: in its own Secret, nowhere else (the requests carry it in a header).
    ray_secret = f'"{names.ray_token_secret(run_id)}"'
    (ray_body,) = [body for method, path, body in project.kube.bodies if method == "POST" and ray_secret in body]
    (ray_encoded,) = json.loads(ray_body)["data"].values()
    ray_token = base64.b64decode(ray_encoded).decode()
    others = "\n".join(body for _, path, body in project.kube.bodies if body not in (*created, ray_body))
    plan = _tpupipe(project, "plan", "local-fsdp", "--set", overrides, "--output", "json")
    for where, text in (
        ("cli", proc.stdout + proc.stderr + listed.stdout + cancelled.stdout + shown.stdout),
        ("task logs", logs),
        ("bucket", objects),
        ("other requests", others),
        ("plan", plan.stdout),
        ("job", str(job.resource)),
    ):
        assert SENTINEL not in text and ENCODED not in text, where
        assert ray_token not in text and ray_encoded not in text, where
    assert project.rayclusters(run_id) == [] and project.clusters(run_id) == [] and project.pools(run_id) == []
    assert project.gke.state.clusters == {}


@pytest.mark.e2e  # runs Vertex AI jobs, each task its own process
def test_a_failing_stage_fails_the_job_submit_wait_names_it_and_teardown_still_runs(project_factory):
    project = project_factory(vertex=True, polls_to_done=1)  # each GKE operation done at its first poll
    # Both attempts of provision (it is retried once) find no capacity.
    project.gke.stockout(when=lambda request: request.node_pool.name.endswith("-s0"), times=2)
    _published(project)
    run_id = unique_run_id("vx-fail")
    proc = _tpupipe(project, "submit", "local-fsdp", "--set", OVERRIDES, *PLACE, *ACCOUNT, "--run-id", run_id, "--wait")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failed — provision: " in proc.stdout and "CapacityError: no capacity" in proc.stdout, proc.stdout[-3000:]
    resource = project.vertex.job(proc.stdout.split("submitted ", 1)[1].split()[0].rsplit("/", 1)[-1]).resource
    tasks = {t["taskName"]: t for t in resource["jobDetail"]["taskDetails"]}
    assert resource["state"] == "PIPELINE_STATE_FAILED"
    assert tasks["provision"]["state"] == "FAILED" and "no capacity" in tasks["provision"]["error"]["message"]
    assert tasks["teardown"]["state"] == "SUCCEEDED", resource.get("error")
    summary = json.loads(project.storage.data(f"{PROJECT}-tpupipe", f"state/{run_id}/summary.json"))
    stages = {s["name"]: s["status"] for s in summary["stages"]}
    assert summary["status"] == "failed" and (stages["snapshot_data"], stages["provision"]) == ("succeeded", "failed")
    assert project.clusters(run_id) == [] and project.pools(run_id) == [] and project.gke.state.clusters == {}
    state = project.compute.state
    assert not state.networks and not state.subnetworks and not state.resource_policies
    # The job's task details hold its DAG-level tasks too (the root, "run"), failed with provision: neither is a
    # stage of `runs show`.
    name = proc.stdout.split("submitted ", 1)[1].split()[0]
    details = {t["taskName"]: t["state"] for t in _job(project, name).resource["jobDetail"]["taskDetails"]}
    assert details[name.rsplit("/", 1)[-1]] == details["run"] == "FAILED"
    shown = _tpupipe(project, "runs", "show", name, *PLACE)
    stages = [line.split()[0] for line in shown.stdout.splitlines()[2:] if line.split()[-1] in ("failed", "succeeded")]
    # Component tasks only: the data snapshot, provision, teardown, and build_image, which runs beside provision (it
    # may have ended either way by the time provision failed); never the root or "run".
    expected = {"snapshot-data", "provision", "teardown"}
    assert expected <= set(stages) <= expected | {"build-image"}, shown.stdout
    assert "  goodput              0.0" in shown.stdout  # teardown's Metrics: no training step, no goodput


@pytest.mark.e2e  # runs a Vertex AI job, each task its own process
def test_submit_of_an_unpublished_tree_exits_2_naming_publish_and_with_publish_submits(project_factory):
    """This tree's components image is not in Artifact Registry (as after any source change since the last
    publish): refused before any Vertex AI call; ``--publish`` builds it, uploads the template, then submits."""
    project = project_factory(vertex=True)
    _fail_at_preflight(project)  # the run itself fails fast: this is about submit
    refused = _tpupipe(project, "submit", "local-fsdp", "--set", OVERRIDES, *PLACE, *ACCOUNT)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"tpupipe publish --project {PROJECT} --region {REGION}" in refused.stderr
    assert project.vertex.calls == []
    published = _tpupipe(project, "submit", "local-fsdp", "--set", OVERRIDES, *PLACE, *ACCOUNT, "--publish")
    assert published.returncode == 0, published.stdout[-3000:] + published.stderr[-3000:]
    assert "publish: template " in published.stdout and "submitted projects/" in published.stdout
    (template,) = project.kfp.packages.values()
    assert "latest" in template["tags"]
    job = project.vertex.job(published.stdout.split("submitted ", 1)[1].split()[0].rsplit("/", 1)[-1])
    images = {e["container"]["image"] for e in job.spec["deploymentSpec"]["executors"].values()}
    assert {bool(IMAGE_WITH_DIGEST.match(i)) and project.registry.has_image(i) for i in images} == {True}
    project.vertex.wait(job.resource["name"], timeout_s=300)


@pytest.mark.e2e  # runs Vertex AI jobs, each task its own process
def test_a_schedule_fires_on_the_clock_one_run_at_a_time_and_can_be_paused_resumed_deleted(project_factory):
    project = project_factory(vertex=True)
    _fail_at_preflight(project)  # every run fails fast, at provision: this is about when runs start
    _published(project)
    vertex = project.vertex
    created = _tpupipe(
        project,
        "schedule",
        "create",
        "weekly",
        "local-fsdp",
        "--set",
        OVERRIDES,
        *PLACE,
        *ACCOUNT,
        "--cron",
        "TZ=Europe/Paris 0 3 * * 1",
        "--max-concurrent",
        "1",
    )
    assert created.returncode == 0, created.stderr[-3000:]
    week = timedelta(days=7)
    first = vertex.advance(vertex.clock + week)
    assert len(first) == 1
    assert vertex.advance(vertex.clock + week) == []  # due while the first runs: skipped, never two at once
    vertex.wait(first[0], timeout_s=300)
    # Paused, the schedule fires nothing; resumed, it fires again: the second run.
    assert _tpupipe(project, "schedule", "pause", "weekly", *PLACE).returncode == 0
    assert vertex.advance(vertex.clock + week) == []
    assert _tpupipe(project, "schedule", "resume", "weekly", *PLACE).returncode == 0
    second = vertex.advance(vertex.clock + week)
    assert len(second) == 1 and second != first
    vertex.wait(second[0], timeout_s=300)
    runs = [vertex.job(n) for n in first + second]
    assert runs[0].resource["endTime"] <= runs[1].resource["startTime"]
    # Each run's id comes from its own job name (the run_id parameter stays empty): two runs, two ids.
    assert all(r.parameters["run_id"] == "" for r in runs) and first[0] != second[0]
    listed = _tpupipe(project, "schedule", "list", *PLACE)
    assert "weekly" in listed.stdout and "ACTIVE" in listed.stdout
    assert _tpupipe(project, "schedule", "delete", "weekly", *PLACE).returncode == 0
    assert "weekly" not in _tpupipe(project, "schedule", "list", *PLACE).stdout


def test_a_scheduled_run_reads_the_drop_of_its_schedules_date(project_factory):
    """`schedule create --dataset "gs://.../{date}/"`: each run's first task, snapshot_data, takes ``{date}`` from
    the time its schedule started it (KFP's schedule-time placeholder, which Vertex AI fills in), pins that day's
    objects and keeps the manifest in the run's state, before provision (here failing at preflight) creates
    anything."""
    from datetime import UTC, datetime

    from google.cloud import storage

    from components.cloud.credentials import credentials

    project = project_factory(vertex=True)
    _fail_at_preflight(project)
    _published(project)
    vertex = project.vertex
    storage.Client(project=PROJECT, credentials=credentials()).create_bucket("acme-sft")
    due = (vertex.clock + timedelta(days=1)).replace(hour=3, minute=0)
    if due - vertex.clock > timedelta(days=1):
        due -= timedelta(days=1)
    for day in (due - timedelta(days=1), due):  # yesterday's drop is not the run's
        # the same instructions whatever the date: 4 and 10 fall in the 10% held out by digest
        rows = "".join(f'{{"instruction": "Say {i}.", "response": "{i}"}}\n' for i in range(20 + day.day))
        project.storage.put("acme-sft", f"drops/{day:%Y-%m-%d}/a.jsonl", rows.encode())
    created = _tpupipe(
        project,
        *("schedule", "create", "daily", "local-fsdp", "--set", OVERRIDES, *PLACE, *ACCOUNT),
        *("--cron", "0 3 * * *", "--dataset", "gs://acme-sft/drops/{date}/", "--data-since", "champion"),
    )
    assert created.returncode == 0, created.stderr[-3000:]
    (name,) = vertex.advance(due)
    vertex.wait(name, timeout_s=300)
    job = vertex.job(name.rsplit("/", 1)[-1])
    assert job.scheduled == due.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert job.parameters["dataset"] == "gs://acme-sft/drops/{date}/"
    (manifest,) = [
        json.loads(data)
        for key, data in project.storage.objects_of(f"{PROJECT}-tpupipe", "state/").items()
        if key.endswith("/data/manifest.json")
    ]
    assert manifest["dataset"] == f"gs://acme-sft/drops/{due:%Y-%m-%d}/"
    assert datetime.fromisoformat(manifest["taken"]) == due.astimezone(UTC)
    assert manifest["num_train_examples"] + manifest["num_heldout_examples"] == 20 + due.day


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["submit", "no-such-preset", *PLACE], "preset"),
        (["submit", "local-fsdp", "--set", OVERRIDES, *PLACE, "--pipeline-root", "/tmp/root"], "--pipeline-root"),
        (["submit", "local-fsdp", "--set", OVERRIDES, "--region", REGION], "--project"),
        (["schedule", "create", "nightly", "local-fsdp", "--set", OVERRIDES, *PLACE, "--cron", "0 25 * * *"], "--cron"),
        (
            [
                "schedule",
                "create",
                "nightly",
                "local-fsdp",
                "--set",
                OVERRIDES,
                *PLACE,
                "--cron",
                "TZ=Mars/Olympus 0 3 * * *",
            ],
            "--cron",
        ),
        (
            [
                "schedule",
                "create",
                "nightly",
                "local-fsdp",
                "--set",
                OVERRIDES,
                *PLACE,
                "--cron",
                "0 3 * * *",
                "--run-id",
                "fixed",
            ],
            "run_id",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_field_before_any_call(project_factory, args, field):
    project = project_factory(vertex=True)
    env = {k: v for k, v in _env(project).items() if k != "GOOGLE_CLOUD_PROJECT"}
    proc = subprocess.run([*tpupipe_cmd(), *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {field}" in proc.stderr
    assert project.vertex.calls == []
