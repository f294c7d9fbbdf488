"""`tpupipe janitor` against the emulated project: runs left behind by a pipeline that never tore down (provision and
deploy ran, then nothing), found by their ledgers (in a local directory or in Cloud Storage) and by the tpupipe-run
label, deleted through the runs' own teardown; a second sweep finds nothing; a dry run lists and deletes nothing. No
Ray: the emulated cluster's RayCluster never gets ready, as after a lost driver."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta

import pytest

from components.platforms import RunContext, ledger
from components.platforms.gke.run import janitor
from components.platforms.store import GcsStore, LocalStore, write_json
from components.platforms.waiting import DeadlineExceeded
from components.spec import SpecError
from components.workload import resolve
from pipelines.cli import main as cli
from tests.emulators.project import ONE_SLICE, PROJECT
from tests.gke.test_gke_platform import platform

LEFT = ONE_SLICE + " cluster.ready_timeout_s=1"


def _left_behind(project, ctx: RunContext) -> None:
    """provision and deploy_raycluster, then the pipeline dies: no teardown."""
    gke = platform()
    gke.provision(ctx)
    with pytest.raises(DeadlineExceeded):
        gke.deploy_raycluster(ctx)
    # compute: the private nodes' subnetwork and NAT gateway (plan.network)
    assert set(project.leftovers(ctx.run_id)) == {"clusters", "node pools", "compute", "kubernetes", "bucket bindings"}


def _local(tmp_path, run_id: str) -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", LEFT), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke"
    )


def _janitor(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["janitor", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture
def hf_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test")


def test_the_janitor_deletes_everything_runs_left_behind_and_a_second_sweep_finds_nothing(
    tmp_path, project_factory, capsys, hf_token
):
    project = project_factory(polls_to_done=1)
    for run_id in ("lost-a", "lost-b"):
        _left_behind(project, _local(tmp_path, run_id))
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--older-than", "0s")
    assert code == 0, text
    assert "2 runs to clean up" in text
    for run_id in ("lost-a", "lost-b"):
        assert f"{run_id} (started 0.0 h ago, older than 0.0 h):" in text
        assert f"deleted projects/{PROJECT}/locations/us-east5-b/clusters/tpupipe-{run_id}" in text
        assert project.leftovers(run_id) == {}
        assert ledger.load(LocalStore(tmp_path / run_id))["torn_down"]
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--older-than", "0s")
    assert code == 0 and "0 runs to clean up; nothing found" in text


def test_a_run_whose_teardown_fails_is_reported_and_the_others_are_still_swept(
    tmp_path, project_factory, capsys, hf_token
):
    import grpc

    project = project_factory(polls_to_done=1)
    for run_id in ("stuck", "fine"):
        _left_behind(project, _local(tmp_path, run_id))
    project.gke.fail(
        "DeleteCluster",
        grpc.StatusCode.PERMISSION_DENIED,
        "container.clusters.delete denied",
        when=lambda request: request.name.endswith("tpupipe-stuck"),
    )
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--older-than", "0")
    assert code == 1
    assert "stuck (started" in text and "failed: teardown could not remove: cluster or pools:" in text
    assert "janitor: could not tear down stuck:" in text
    assert project.clusters("fine") == [] and project.clusters("stuck")
    assert not ledger.load(LocalStore(tmp_path / "stuck")).get("torn_down")  # the next sweep tries it again
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--older-than", "0")
    assert code == 0 and project.clusters("stuck") == []


def test_a_dry_run_lists_everything_and_deletes_nothing(tmp_path, project_factory, capsys, hf_token):
    project = project_factory(polls_to_done=1)
    _left_behind(project, _local(tmp_path, "dry"))
    before, mutations = project.leftovers("dry"), len(project.mutations())
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--older-than", "0", "--dry-run")
    assert code == 0, text
    assert text.startswith("tpupipe janitor --dry-run: 1 run to clean up")
    for needle in (
        "would delete node pool dry-s0",
        "would delete cluster tpupipe-dry",  # the CPU pool goes with it
        "would delete iam binding tpupipe-dry",
        "would delete the Kubernetes objects labelled tpupipe-run=dry",
    ):
        assert needle in text
    assert project.leftovers("dry") == before and len(project.mutations()) == mutations
    assert not ledger.load(LocalStore(tmp_path / "dry")).get("torn_down")


def test_a_run_within_its_limit_is_kept_and_a_finished_one_is_collected(tmp_path, project_factory, capsys, hf_token):
    project = project_factory(polls_to_done=1)
    _left_behind(project, _local(tmp_path, "young"))
    _left_behind(project, _local(tmp_path, "done"))
    write_json(LocalStore(tmp_path / "done"), "summary.json", {"status": "failed"})  # written, yet things remain
    code, text = _janitor(capsys, "--output-root", str(tmp_path))  # each run's own limit: hours
    assert code == 0, text
    assert "done (finished):" in text and "young: kept: running for 0.0 h, within" in text
    assert project.clusters("done") == [] and project.pools("done") == []
    assert project.clusters("young") and project.pools("young")


def test_a_ledger_naming_another_run_or_a_project_outside_the_sweep_is_kept_not_obeyed(
    tmp_path, project_factory, capsys, hf_token
):
    """The run's own pods can write its ledger, and the janitor runs as the pipeline's service account: a ledger
    edited to name another project (one the sweep was not given) or another run is reported and kept, its run's
    resources left for a person; the honest ledger beside them is collected."""
    project = project_factory(polls_to_done=1)
    for run_id in ("honest", "elsewhere", "renamed"):
        _left_behind(project, _local(tmp_path, run_id))
    elsewhere = ledger.load(LocalStore(tmp_path / "elsewhere"))
    elsewhere["spec"]["gke"]["project"] = "someone-elses-project"
    ledger.replace(LocalStore(tmp_path / "elsewhere"), elsewhere)
    renamed = ledger.load(LocalStore(tmp_path / "renamed"))
    ledger.replace(LocalStore(tmp_path / "renamed"), {**renamed, "run_id": "honest"})
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--older-than", "0s", "--project", PROJECT)
    assert code == 0, text
    assert "1 run to clean up" in text and project.clusters("honest") == [] and project.pools("honest") == []
    outside = f"elsewhere: kept: its ledger names project 'someone-elses-project', not one of this sweep's ({PROJECT})"
    assert outside in text
    assert "renamed: kept: its ledger names run 'honest', not the run it is filed under" in text
    for run_id in ("elsewhere", "renamed"):
        assert project.clusters(run_id) and project.pools(run_id)


def test_runs_whose_ledgers_are_in_cloud_storage_are_found_there(
    tmp_path, project_factory, capsys, hf_token, monkeypatch
):
    from google.cloud import storage

    from components.cloud.credentials import credentials

    project = project_factory(polls_to_done=1)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    storage.Client(project=PROJECT, credentials=credentials()).create_bucket("vertex-root", location="us-east5")
    ctx = RunContext(
        spec=resolve("local-fsdp", LEFT), run_id="in-gcs", store=GcsStore("vertex-root", "runs/in-gcs"), platform="gke"
    )
    _left_behind(project, ctx)
    code, text = _janitor(capsys, "--output-root", "gs://vertex-root/runs", "--older-than", "1s", "--dry-run")
    assert code == 0 and "in-gcs (" in text and "would delete cluster tpupipe-in-gcs" in text
    code, text = _janitor(capsys, "--output-root", "gs://vertex-root/runs", "--older-than", "0s")
    assert code == 0 and project.leftovers("in-gcs") == {}
    assert ledger.load(GcsStore("vertex-root", "runs/in-gcs"))["torn_down"]


def test_a_labelled_cluster_whose_run_left_no_ledger_is_kept_and_adopted_only_with_adopt(
    tmp_path, project_factory, capsys
):
    project = project_factory(polls_to_done=1)
    parent = f"projects/{PROJECT}/locations/us-east5-b"
    project.gke.add_cluster(
        parent,
        {"name": "tpupipe-ghost", "resourceLabels": {"tpupipe-run": "ghost"}, "createTime": "2026-01-01T00:00:00Z"},
    )
    project.gke.add_cluster(
        parent, {"name": "team", "resourceLabels": {"owner": "someone"}, "createTime": "2026-01-01T00:00:00Z"}
    )
    # Its ledger may be under another output root (a workstation run's ./runs): without --adopt it is reported, kept,
    # whatever --older-than says.
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--project", PROJECT, "--older-than", "0s")
    assert code == 0 and "nothing found" in text, text
    assert f"ghost: kept: cluster tpupipe-ghost carries its label but its run left no ledger under {tmp_path}" in text
    assert "`tpupipe janitor --adopt` collects it" in text and len(project.gke.state.clusters) == 2
    assert ledger.load(LocalStore(tmp_path / "ghost")) is None
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--project", PROJECT, "--adopt")
    assert code == 0, text
    assert "ghost (no ledger; its cluster was created" in text
    assert list(project.gke.state.clusters) == [f"{parent}/clusters/team"]  # an unlabelled cluster is not touched
    assert ledger.load(LocalStore(tmp_path / "ghost"))["adopted_by"] == "janitor"
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--project", PROJECT, "--adopt")
    assert "nothing found" in text


def test_a_run_whose_driver_beats_is_left_alone_past_older_than_and_collected_once_its_heartbeat_is_stale(
    tmp_path, project_factory, capsys, hf_token
):
    """No pipeline job to ask (a workstation run): the heartbeat its stages write says it is alive, so --older-than
    0s keeps it; once the heartbeat is older than heartbeat.STALE_S the driver is gone and the run is collected."""
    import time

    from components.platforms import heartbeat

    project = project_factory(polls_to_done=1)
    ctx = _local(tmp_path, "alive")
    _left_behind(project, ctx)
    heartbeat.beat(ctx.store, "train")
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--older-than", "0s")
    assert code == 0 and "nothing found" in text, text
    assert re.search(r"alive: kept: its driver's heartbeat is \d+ s old \(a stage of it is working\)", text), text
    assert project.clusters("alive") and project.pools("alive")
    heartbeat.beat(ctx.store, "train", now=time.time() - heartbeat.STALE_S - 1)
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--older-than", "0s")
    assert code == 0 and "alive (started 0.0 h ago, older than 0.0 h):" in text, text
    assert project.leftovers("alive") == {}


def test_a_stage_beats_while_it_works_and_a_failed_write_never_fails_it(tmp_path):
    import threading

    from components.platforms import heartbeat

    store = LocalStore(tmp_path / "run")
    seen = []
    with heartbeat.beating(store, "train", interval_s=0.05):
        first = heartbeat.age_s(store)
        threading.Event().wait(0.3)
        seen.append(json.loads((tmp_path / "run" / heartbeat.KEY).read_text())["at"])
    assert first is not None and first < 1 and seen[0] > time.time() - 0.2  # beaten again while the block ran
    assert heartbeat.fresh(store) is not None
    broken = tmp_path / "not-a-directory"
    broken.write_text("")
    with heartbeat.beating(LocalStore(broken), "train", interval_s=0.01):  # every write fails: the stage goes on
        threading.Event().wait(0.05)


def test_a_labelled_node_pool_in_a_shared_cluster_without_a_ledger_is_reported_not_guessed(
    tmp_path, project_factory, capsys
):
    project = project_factory(polls_to_done=1)
    parent = f"projects/{PROJECT}/locations/us-east5-b"
    project.gke.add_cluster(
        parent,
        {"name": "team", "nodePools": [{"name": "stray-s0", "config": {"resourceLabels": {"tpupipe-run": "stray"}}}]},
    )
    code, text = _janitor(capsys, "--output-root", str(tmp_path), "--project", PROJECT, "--older-than", "0")
    assert code == 0
    assert "stray: kept: node pools stray-s0 carry its label but it left no ledger" in text
    assert "tpupipe teardown stray --platform gke" in text and project.pools("stray")


def test_ages_and_limits():
    assert janitor.parse_age("6h") == 21600 and janitor.parse_age("90m") == 5400 and janitor.parse_age("0") == 0
    assert janitor.parse_age("2d") == 172800 and janitor.parse_age("1.5h") == 5400
    with pytest.raises(SpecError, match="--older-than"):
        janitor.parse_age("six hours")
    sets = ONE_SLICE + " train.timeout_s=3600 cluster.ready_timeout_s=600 cluster.slice_check_timeout_s=100"
    assert janitor.limit_s(resolve("local-fsdp", sets)) == 3600 + 600 + 300 + 7200
    # MaxText's compile job before the training job, within its own bound (cache_trust.compile_timeout_s)
    assert janitor.limit_s(resolve("local-maxtext", sets)) == 3600 + 600 + 300 + 7200 + 1800
    # The run's own deadline, sooner or later than its stages' sum: past it (and its teardown's time) the run's
    # stages have stopped it themselves, so a run still up has lost its driver; before it, it may still be working.
    grace = janitor.STOP_GRACE_S
    assert janitor.limit_s(resolve("local-fsdp", sets + " run.deadline_h=0.5")) == 1800 + grace
    assert janitor.limit_s(resolve("local-fsdp", sets + " run.deadline_h=100")) == 100 * 3600 + grace


def test_each_run_is_held_to_its_own_deadline(tmp_path, project_factory, hf_token):
    """No --older-than: a run allowed 48 h is kept 24 h in, while one allowed 2 h is collected once 2 h and the grace
    have passed, and kept before."""
    project = project_factory(polls_to_done=1)
    for run_id, hours in (("long", 48), ("short", 2)):
        spec = resolve("local-fsdp", f"{LEFT} run.deadline_h={hours}")
        _left_behind(project, RunContext(spec, run_id, LocalStore(tmp_path / run_id), "gke"))

    def found(after_h: float) -> tuple[list[str], list[str]]:
        sweep = janitor.Janitor(str(tmp_path), log=lambda m: None, now=lambda: time.time() + after_h * 3600).find()
        return [f.run_id for f in sweep.collected], sweep.kept

    collected, kept = found(24)
    assert collected == ["short"], (collected, kept)
    assert any(k.startswith("long: kept: running for 24.0 h, within 48.5 h") for k in kept), kept
    collected, kept = found(2.2)
    assert collected == [], (collected, kept)
    assert any(k.startswith("short: kept: running for 2.2 h, within 2.5 h") for k in kept), kept


def test_the_janitor_pipeline_sweeps_under_kfp_local(tmp_path, project_factory, hf_token):
    """The scheduled form: the janitor pipeline's one task, run by kfp.local in its own process."""
    import warnings

    from kfp import local

    from pipelines.janitor import janitor_pipeline

    project = project_factory(polls_to_done=1)
    _left_behind(project, _local(tmp_path / "runs", "swept"))
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)
    janitor_pipeline(project=PROJECT, output_root=str(tmp_path / "runs"), older_than="0s", dry_run=False)
    assert project.clusters("swept") == [] and project.pools("swept") == [] and project.leftovers("swept") == {}
    assert ledger.load(LocalStore(tmp_path / "runs" / "swept"))["torn_down"]


def _stopped_on_vertex(
    project, run_id: str, job_id: str, state: str, region: str = "", named: bool = False, vertex_project: str = ""
):
    """A Vertex AI run left behind as a Stop leaves it: its first task noted its pipeline job in the ledger (with its
    full resource name when ``named``, as every task now gets it; the bare id alone, as older ledgers have it),
    provision and deploy ran, then the job ended (or still runs) with ``state`` and no teardown ran. The job ran in
    ``vertex_project`` (default: the run's gke.project) and ``region``."""
    import json

    from components.stages.claims import claim
    from components.stages.vertex_task import VERTEX_TASK_ENV
    from tests.emulators.project import REGION

    store = GcsStore(f"{PROJECT}-tpupipe", f"state/{run_id}")
    labels = {"tpupipe-preset": "local-fsdp"}
    parent = f"projects/{vertex_project or PROJECT}/locations/{region or REGION}"
    name = f"{parent}/pipelineJobs/{job_id}" if named else ""
    claim(store, run_id, "gke", job_id, first=True, environ={VERTEX_TASK_ENV: json.dumps(labels)}, resource=name)
    ctx = RunContext(spec=resolve("local-fsdp", LEFT), run_id=run_id, store=store, platform="gke")
    _left_behind(project, ctx)
    job = {"id": job_id, "labels": labels} | ({"name": name} if named else {})
    assert ledger.load(store)["pipeline_job"] == job  # provision kept it
    project.vertex.add_job(parent, job_id, state, labels)
    return ctx


@pytest.fixture
def run_bucket(project_factory, monkeypatch):
    from google.cloud import storage

    from components.cloud.credentials import credentials

    project = project_factory(polls_to_done=1, vertex=True)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    client = storage.Client(project=PROJECT, credentials=credentials())
    bucket = client.bucket(f"{PROJECT}-tpupipe")
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True  # as a run's bucket must have it
    client.create_bucket(bucket, location="us-east5")
    return project


def test_a_run_whose_pipeline_job_was_stopped_is_collected_at_once_and_a_running_one_is_left_alone(
    run_bucket, capsys, hf_token
):
    """No --older-than: the stopped run is minutes old, far within its own limit, yet its job has ended (a Stop in
    the UI cancels the exit handler's teardown too), so nothing else will tear it down. A run whose job still runs is
    kept, whatever its age."""
    project = run_bucket
    _stopped_on_vertex(project, "stopped", "tpupipe-local-fsdp-20261201000000-aaaaaa", "PIPELINE_STATE_CANCELLED")
    _stopped_on_vertex(project, "busy", "tpupipe-local-fsdp-20261201000000-bbbbbb", "PIPELINE_STATE_RUNNING")
    # A run whose job ran in another region: its ledger's full resource name finds the job there.
    elsewhere = "tpupipe-local-fsdp-20261201000000-dddddd"
    _stopped_on_vertex(project, "elsewhere", elsewhere, "PIPELINE_STATE_CANCELLED", "europe-west4", named=True)
    # A run whose job ran in another project than its cluster (Vertex AI Pipelines in one project, the TPUs in
    # gke.project): its job is asked for where it ran (asked in gke.project, it is not found there, its state unknown,
    # and the run, minutes old, would be kept within its age limit).
    hosted = "tpupipe-local-fsdp-20261201000000-eeeeee"
    _stopped_on_vertex(project, "hosted", hosted, "PIPELINE_STATE_FAILED", named=True, vertex_project="pipelines-host")
    root = f"gs://{PROJECT}-tpupipe/state"
    code, text = _janitor(capsys, "--output-root", root, "--older-than", "0s", "--dry-run")
    assert "busy: kept: its pipeline job tpupipe-local-fsdp-20261201000000-bbbbbb is running" in text, text
    code, text = _janitor(capsys, "--output-root", root)
    assert code == 0, text
    assert "stopped (its pipeline job tpupipe-local-fsdp-20261201000000-aaaaaa is cancelled):" in text, text
    assert f"elsewhere (its pipeline job {elsewhere} is cancelled):" in text, text
    assert f"hosted (its pipeline job {hosted} is failed):" in text, text
    assert project.clusters("hosted") == []
    assert "deleted projects/tpupipe-emulated/locations/us-east5-b/clusters/tpupipe-stopped" in text
    left = project.leftovers("stopped")  # its "clusters": every cluster in the project, busy's among them
    assert project.clusters("stopped") == [] and set(left) == {"clusters"}, left
    assert project.clusters("elsewhere") == []
    assert project.clusters("busy") and project.pools("busy")
    assert "GetPipelineJob" in project.vertex.calls
    # Without the region the janitor asks Vertex AI nothing, and the age limit holds.
    calls = len(project.vertex.calls)
    code, text = _janitor(capsys, "--output-root", root, "--region", "")
    assert "busy: kept: running for 0.0 h, within" in text and len(project.vertex.calls) == calls


def test_the_scheduled_janitor_collects_a_stopped_run_on_its_next_sweep(run_bucket, hf_token):
    """``tpupipe publish --janitor-schedule``'s schedule: every 15 minutes the janitor pipeline runs on Vertex AI (its
    one task in its own process) and tears down a run whose job was cancelled by the service alone, no CLI."""
    from components.cloud.build import image_tag
    from pipelines.backends.vertex import stopping
    from pipelines.pipeline import Target
    from tests.emulators.project import REGION

    project = run_bucket
    project.registry.push(Target(PROJECT, REGION).image(image_tag("pipeline")), "sha256:" + "cd" * 32)
    _stopped_on_vertex(project, "ui-stop", "tpupipe-local-fsdp-20261201000000-cccccc", "PIPELINE_STATE_CANCELLED")
    account = f"pipelines@{PROJECT}.iam.gserviceaccount.com"
    name = stopping.janitor_schedule(PROJECT, REGION, account, log=lambda m: None)
    assert stopping.janitor_schedule(PROJECT, REGION, account, log=lambda m: None) == name  # created once
    (schedule,) = project.vertex.schedules.values()
    assert schedule.resource["cron"] == "*/15 * * * *" and schedule.resource["maxConcurrentActiveRunCount"] == "1"
    assert project.leftovers("ui-stop")
    (job,) = project.vertex.advance(project.vertex.clock + timedelta(minutes=15))
    resource = project.vertex.wait(job, timeout_s=120)
    assert resource["state"] == "PIPELINE_STATE_SUCCEEDED", project.vertex.job(job).logs
    executors = project.vertex.job(job).spec["deploymentSpec"]["executors"].values()  # its image by digest
    assert {e["container"]["image"].rsplit("@", 1)[-1] for e in executors} == {"sha256:" + "cd" * 32}
    assert (
        "ui-stop (its pipeline job tpupipe-local-fsdp-20261201000000-cccccc is cancelled):"
        in (project.vertex.job(job).logs["janitor"])
    )
    assert project.leftovers("ui-stop") == {}
    # A new components image published: the schedule is replaced by one on it, not left on the digest it had.
    project.registry.push(Target(PROJECT, REGION).image(image_tag("pipeline")), "sha256:" + "ef" * 32)
    replaced = stopping.janitor_schedule(PROJECT, REGION, account, log=lambda m: None)
    (schedule,) = project.vertex.schedules.values()
    assert schedule.resource["name"] == replaced and schedule.resource["cron"] == "*/15 * * * *"
    spec = schedule.resource["createPipelineJobRequest"]["pipelineJob"]["pipelineSpec"]
    assert {e["container"]["image"].rsplit("@", 1)[-1] for e in spec["deploymentSpec"]["executors"].values()} == {
        "sha256:" + "ef" * 32
    }
