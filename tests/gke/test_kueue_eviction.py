"""A queued run (gke.queue) whose RayCluster Kueue evicts while its train job runs: the stage says so with Kueue's
reason, waits for the RayCluster's re-admission within the run's deadline and submits the job again as a new attempt,
at most ``jobs.EVICTIONS`` times. The fast tier's cases, over the emulators without Ray (the RayCluster's dashboard is
the emulated Jobs API, tests/emulators/rayjobs.py, behind the API server's service proxy); the end-to-end case, a real
trainer resuming from its checkpoint, is below them (e2e)."""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from pathlib import Path

import pytest

from components.platforms.gke import GkePlatform
from components.spec import InfraError
from components.stages import goodput, jobs
from components.stages.runner import record, run_stage
from tests.emulators.project import LEAN, ONE_SLICE
from tests.emulators.rayjobs import RayJobsEmulator
from tests.gke.test_kueue import QUEUED, _left, _team_cluster, _workloads, context, setup
from tests.gke.test_tokens_and_retries import _played
from tests.helpers import unique_run_id, wait_until

ENTRYPOINT = "python -m trainers.fsdp"


def _queued(tmp_path, project_factory, monkeypatch, run_id: str, overrides: str = ""):
    """(project, kueue, gke, ctx): a run of team-a on the shared cluster, its RayCluster admitted and ready, its
    dashboard the emulated Jobs API whose jobs run for ten minutes unless a test shortens them."""
    project = project_factory()
    project.kube.ready_without_ray = True
    project.kube.jobs = RayJobsEmulator(duration_s=600, log=_played)
    project.kube.jobs.start()
    project.extras.append(project.kube.jobs)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project)
    kueue = setup(project, priority=True)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = context(tmp_path, run_id, f"{QUEUED} gke.queue=team-a {overrides}")
    gke.provision(ctx)
    record(ctx.store, "provision", status="succeeded", started=time.time(), seconds=0.0)
    gke.deploy_raycluster(ctx)
    return project, kueue, gke, ctx


def _submitted(project, submission_id: str) -> None:
    wait_until(lambda: submission_id in project.kube.jobs.jobs, 60, f"job {submission_id} to be submitted")


def _evictions(run_dir: Path) -> int:
    """The evictions the run's train stage has recorded so far."""
    kept = run_dir / "jobs" / "train.json"
    return len(json.loads(kept.read_text())["evictions"]) if kept.is_file() else 0


def _evict(project, kueue, run_id: str) -> None:
    """Kueue evicts the run's Workload (preempted), its RayCluster suspended and its pods deleted."""
    with project.kube.lock:
        workload = kueue.workload_of("tpupipe", run_id)
        kueue.evict(workload, "Preempted", "Preempted to accommodate a workload (UID: 0123456789abcdef)")


def test_an_eviction_past_the_budget_fails_the_stage_with_kueues_reason(tmp_path, project_factory, monkeypatch):
    project, kueue, gke, ctx = _queued(tmp_path, project_factory, monkeypatch, "evicted", "run.deadline_h=0.05")

    def kueue_plays() -> None:
        """Each attempt evicted once it runs; re-admitted once the stage has recorded the eviction."""
        for attempt in range(1, jobs.EVICTIONS + 2):
            _submitted(project, jobs.attempt_id(ctx.run_id, "train", attempt))
            _evict(project, kueue, ctx.run_id)
            if attempt <= jobs.EVICTIONS:
                wait_until(lambda n=attempt: _evictions(ctx.store.local()) == n, 60, f"eviction {attempt} recorded")
                with project.kube.lock:
                    kueue.reconcile()  # the quota is free: admitted again

    player = threading.Thread(target=kueue_plays, daemon=True)
    player.start()
    with pytest.raises(jobs.JobFailed) as failed:
        jobs.run_job(ctx, "train", ENTRYPOINT, 600)
    player.join(10)
    error = str(failed.value)
    assert error.startswith(
        f"train: job {ctx.run_id}-train-4 lost to an eviction again (Preempted: Preempted to accommodate a workload "
        "(UID: 0123456789abcdef)): 4 evictions, past the 3 after which a job is submitted again"
    ), error
    assert list(project.kube.jobs.jobs) == [jobs.attempt_id(ctx.run_id, "train", n) for n in (1, 2, 3, 4)]
    kept = json.loads((ctx.store.local() / "jobs" / "train.json").read_text())["evictions"]
    assert [e["reason"].split(":")[0] for e in kept] == ["Preempted"] * 4
    assert all(e["queue_wait"] and e["ready_at"] for e in kept[:3]) and "ready_at" not in kept[3]
    workload = json.loads((ctx.store.local() / "logs" / "kueue_workload.json").read_text())  # kept as evicted
    assert [(c["status"], c["reason"]) for c in workload["conditions"] if c["type"] == "Evicted"] == [
        ("True", "Preempted")
    ], workload
    gke.teardown(ctx)
    assert _left(project, ctx.run_id) == {} and _workloads(project) == []


def test_an_eviction_whose_readmission_outlasts_the_deadline_fails_naming_it(tmp_path, project_factory, monkeypatch):
    """A higher-priority run preempts it and keeps the quota past the run's deadline (0.004 h: 14 s from its
    provision)."""
    project, kueue, gke, ctx = _queued(tmp_path, project_factory, monkeypatch, "low", "run.deadline_h=0.004")
    high = context(tmp_path, "high", f"{QUEUED} gke.queue=team-b gke.priority_class=high")
    gke.provision(high)

    def preempt() -> None:
        _submitted(project, f"{ctx.run_id}-train")
        gke.deploy_raycluster(high)

    player = threading.Thread(target=preempt, daemon=True)
    player.start()
    with pytest.raises(InfraError) as failed:
        jobs.run_job(ctx, "train", ENTRYPOINT, 600)
    player.join(30)
    assert f"RayCluster {ctx.run_id} was not admitted by Kueue within " in str(
        failed.value
    ) and "s (run.deadline_h): queued in team-a: position 1, 0 chips ahead" in str(failed.value), str(failed.value)
    kept = json.loads((ctx.store.local() / "jobs" / "train.json").read_text())["evictions"]
    assert [e["reason"].split(":")[0] for e in kept] == ["Preempted"] and "ready_at" not in kept[0]
    for run in (ctx, high):
        gke.teardown(run)
    assert _left(project, ctx.run_id) == {} and _left(project, "high") == {} and _workloads(project) == []


def test_a_job_evicted_once_is_submitted_again_and_its_wait_is_not_billed(tmp_path, project_factory, monkeypatch):
    project, kueue, gke, ctx = _queued(tmp_path, project_factory, monkeypatch, "again", "run.deadline_h=0.05")

    def kueue_plays() -> None:
        _submitted(project, f"{ctx.run_id}-train")
        _evict(project, kueue, ctx.run_id)
        wait_until(lambda: _evictions(ctx.store.local()) == 1, 60, "the eviction to be recorded")
        time.sleep(1.0)  # the quota stays taken a moment
        project.kube.jobs.duration_s = 0.0  # the next attempt ends at once
        with project.kube.lock:
            kueue.reconcile()

    player = threading.Thread(target=kueue_plays, daemon=True)
    player.start()
    started = time.time()
    job = jobs.run_job(ctx, "train", ENTRYPOINT, 600)
    player.join(10)
    assert job["submission_id"] == f"{ctx.run_id}-train-2" and job["result"] == {"final_loss": 1.25, "steps": 3}
    (eviction,) = job["evictions"]
    assert eviction["submission_id"] == f"{ctx.run_id}-train" and eviction["reason"].startswith("Preempted: ")
    since, until = eviction["queue_wait"]
    assert started < eviction["evicted_at"] <= since < until <= eviction["ready_at"] and until - since >= 0.5
    log = (ctx.store.local() / "logs" / "train.log").read_text()
    assert f"--- train: job {ctx.run_id}-train lost: Preempted: " in log
    # A retried task re-attaches to the second attempt, with the first's eviction and records.
    again = jobs.run_job(ctx, "train", ENTRYPOINT, 600)
    assert again["submission_id"] == job["submission_id"] and again["evictions"] == job["evictions"]
    # The ledger: the wait for re-admission is waiting for capacity, billing nothing.
    records = {
        "provision": {"started": started - 10, "seconds": 10.0, "status": "succeeded"},
        "train": {"started": started, "seconds": time.time() - started, "status": "succeeded", "result": job},
    }
    ledger = {c["name"]: c for c in goodput.ledger(records, chips=4, usd_per_hour=10.0)["categories"]}
    assert ledger["waiting for capacity"]["seconds"] >= until - since - 0.01
    assert ledger["waiting for capacity"]["chip_s"] == 0 and ledger["waiting for capacity"]["usd"] == 0
    gke.teardown(ctx)
    # The post-mortem keeps the Workload's eviction (kept as it was evicted) beside its state at teardown, admitted
    # again, its Evicted condition False ("Previously: ...").
    workload = json.loads((ctx.store.local() / "logs" / "kueue_workload.json").read_text())
    evicted = [(c["status"], c["message"].split(":")[0]) for c in workload["conditions"] if c["type"] == "Evicted"]
    assert evicted == [("False", "Previously")], workload
    assert [(c["status"], c["reason"]) for c in workload["earlier"] if c["type"] == "Evicted"] == [
        ("True", "Preempted")
    ], workload
    assert _left(project, ctx.run_id) == {} and _workloads(project) == []


# ---------------------------------------------------------------- end to end: a real trainer evicted mid-train

# The smallest slice (v6e 1x1: one host, one chip, one Ray Train worker) on the team's shared cluster, whose
# ClusterQueue holds that one chip; 64 steps (512 examples, 16 a step: LEAN, 2 epochs), a sharded checkpoint every 4.
CHECKPOINT_EVERY = 4
EVICTED = (
    ONE_SLICE.replace("cluster.topology=2x2", "cluster.topology=1x1")
    + " gke.cluster_name=team gke.queue=team-a cluster.slice_check=false train.epochs=2"
    + LEAN
    + f" train.checkpoint_every_steps={CHECKPOINT_EVERY}"
    # The emulated pods' Ray starts twice on this machine, the second time as the first one's processes end: on a
    # loaded machine that has taken minutes.
    + " cluster.ready_timeout_s=900"
)


def _preemptor(project, run_id: str) -> dict:
    """Another team's RayCluster of the run's shape at a higher priority (``gke.priority_class``'s label), in
    team-b's queue: no tpupipe run's. Its pods never start (it is its Workload that matters here)."""
    with project.kube.lock:
        body = copy.deepcopy(project.kube.objects[("rayclusters", "tpupipe", run_id)])
    body["metadata"] = {
        "name": "preemptor",
        "labels": {"kueue.x-k8s.io/queue-name": "team-b", "kueue.x-k8s.io/priority-class": "high"},
    }
    body["spec"].pop("suspend", None)
    body.pop("status", None)
    return body


@pytest.mark.e2e
def test_a_run_evicted_mid_train_is_admitted_again_and_resumes_from_its_checkpoint(
    tmp_path, project_factory, monkeypatch
):
    """Once the train job has written a checkpoint, a higher-priority workload takes the ClusterQueue's one slice:
    Kueue evicts the run's RayCluster (its pods and the job gone). When the preemptor finishes, the run is admitted
    again, its job submitted again resumes from the checkpoint, the run succeeds and nothing of it is left; the
    ledger counts the wait unbilled."""
    project = project_factory(ray=True)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project)
    kueue = setup(project, quota_chips=1, topology="1x1", priority=True)
    root, run_id = tmp_path / "runs", unique_run_id("evicted")
    run_dir = root / run_id
    played: dict = {}

    def stage(name: str) -> None:
        run_stage(name, "local-fsdp", "gke", EVICTED, run_id, "", str(root))

    def kueue_plays() -> None:
        train_log = run_dir / "logs" / "train.log"
        written = '"event": "checkpoint_written"'
        wait_until(lambda: train_log.is_file() and written in train_log.read_text(), 600, "a checkpoint", 0.5)
        preemptor = _preemptor(project, run_id)
        project.kube.fault = "never_starts"
        project.kube.create("rayclusters", "tpupipe", preemptor)
        project.kube.fault = ""
        played["evicted"] = _workload_reason(kueue, run_id)
        wait_until(lambda: _evictions(run_dir) == 1, 120, "the eviction recorded")
        time.sleep(2.0)  # the preemptor runs a while
        project.kube.delete("rayclusters", "tpupipe", "preemptor")  # and finishes: its quota is free

    for name in ("snapshot_data", "provision", "build_image", "deploy_raycluster"):
        stage(name)
    player = threading.Thread(target=kueue_plays, daemon=True)
    player.start()
    try:
        stage("train")
    finally:
        player.join(60)
        stage("teardown")
    assert played["evicted"] == "Preempted", played
    train = json.loads((run_dir / "stages" / "train.json").read_text())["result"]
    (eviction,) = train["evictions"]
    assert eviction["submission_id"] == f"{run_id}-train" and eviction["reason"].startswith("Preempted: ")
    assert train["job"] == f"{run_id}-train-2"
    log = (run_dir / "logs" / "train.log").read_text()
    resumed = re.search(r"resumed from checkpoint of epoch (\d+) \(step (\d+)\)", log)
    assert resumed, log[-4000:]
    step = int(resumed.group(2))
    # The steps the stage saw the first job end (its log is read every second: the last ones before the eviction may
    # never have reached it); the job resumed at a checkpoint, at most a period before the last step it saw.
    before = max(s["step"] for s in train["timeline"]["steps"] if s["time"] < eviction["evicted_at"])
    assert step > 0 and step % CHECKPOINT_EVERY == 0 and before - step <= CHECKPOINT_EVERY, (step, before)
    kept = [s["step"] for s in train["steps"]]  # each once, the last run of it
    assert kept == sorted(set(kept)) and kept[-1] == 64 and set(range(step + 1, 65)) <= set(kept), kept
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"  # the stages this test leaves out (evaluate, register) did not run
    assert {s["name"]: s["status"] for s in summary["stages"]}["train"] == "succeeded"
    waited = {c["name"]: c for c in summary["goodput"]["categories"]}["waiting for capacity"]
    since, until = eviction["queue_wait"]
    assert waited["seconds"] >= until - since >= 2.0 and waited["chip_s"] == 0, waited
    wait_until(
        lambda: _left(project, run_id) == {},
        60,
        f"run {run_id} to leave nothing",
        interval_s=1,
        detail=lambda: _left(project, run_id),
    )
    assert _workloads(project) == []


def _workload_reason(kueue, run_id: str) -> str:
    """The Evicted condition's reason of the run's Workload, once Kueue has evicted it."""
    with kueue.kube.lock:
        workload = kueue.workload_of("tpupipe", run_id)
        found = [c for c in workload["status"]["conditions"] if c["type"] == "Evicted" and c["status"] == "True"]
    return found[0]["reason"] if found else ""
