"""A Stop of a Vertex AI run during train, in the fast tier: the train stage runs as its task does (``run_stage``,
its pipeline job's full resource name, the variable Vertex AI gives every task), against the emulated project, its
RayCluster's dashboard the emulated Jobs API (tests/emulators/rayjobs.py). The job is CANCELLING (as Vertex AI sets
it on a cancel) and the task gets SIGTERM: the deletion of the run's cluster reaches the emulated GKE before the stop
of the Ray job reaches the emulated dashboard, the order observed at the two emulators' wires."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from components.platforms import RunContext
from components.platforms.gke import GkePlatform
from components.platforms.store import GcsStore
from components.stages.claims import claim
from components.stages.runner import run_stage
from components.stages.vertex_task import VERTEX_TASK_ENV
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT, REGION
from tests.emulators.rayjobs import RayJobsEmulator
from tests.gke.test_janitor import hf_token, run_bucket  # noqa: F401 - fixtures
from tests.helpers import wait_until

JOB_ID = "tpupipe-local-fsdp-20261201000000-ffffff"
PARENT = f"projects/{PROJECT}/locations/{REGION}"
OVERRIDES = ONE_SLICE + " cluster.slice_check=false"


class _Dashboard(RayJobsEmulator):
    """The Jobs API, noting what the emulated GKE had been asked when a stop of a job arrived."""

    gke = None
    gke_at_stop: list[str] | None = None

    def _serve(self, http, body: bytes) -> tuple:
        if http.command == "POST" and http.path.rstrip("/").endswith("/stop") and self.gke_at_stop is None:
            with self.gke._lock:
                self.gke_at_stop = list(self.gke.state.calls)
        return super()._serve(http, body)


def test_a_stop_during_train_starts_the_deletes_before_it_stops_the_ray_job(run_bucket, hf_token, monkeypatch):  # noqa: F811
    project, run_id = run_bucket, "stopped-train"
    dashboard = _Dashboard(duration_s=3600)
    dashboard.gke = project.gke
    dashboard.start()
    project.extras.append(dashboard)
    project.kube.ready_without_ray, project.kube.jobs = True, dashboard
    labels = {"tpupipe-preset": "local-fsdp"}
    monkeypatch.setenv(VERTEX_TASK_ENV, json.dumps(labels))
    store = GcsStore(f"{PROJECT}-tpupipe", f"state/{run_id}")
    name = f"{PARENT}/pipelineJobs/{JOB_ID}"
    claim(store, run_id, "gke", JOB_ID, first=True, resource=name)
    ctx = RunContext(spec=resolve("local-fsdp", OVERRIDES), run_id=run_id, store=store, platform="gke")
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)
    gke.deploy_raycluster(ctx)
    project.vertex.add_job(PARENT, JOB_ID, "PIPELINE_STATE_CANCELLING", labels)  # a cancel under way

    def stop_when_training() -> None:
        wait_until(lambda: dashboard.jobs or None, 120, "the train job to be submitted")
        os.kill(os.getpid(), signal.SIGTERM)  # what Vertex AI sends the task's container on a cancel

    threading.Thread(target=stop_when_training, daemon=True).start()
    with pytest.raises(SystemExit) as ended:
        run_stage("train", "local-fsdp", "gke", OVERRIDES, run_id, name, f"gs://{PROJECT}-tpupipe/state")
    assert ended.value.code == 128 + signal.SIGTERM
    assert dashboard.gke_at_stop is not None, dashboard.calls  # the Ray job was stopped...
    assert "DeleteCluster" in dashboard.gke_at_stop, dashboard.gke_at_stop  # ...after the cluster's delete went out
    ((submission, job),) = dashboard.jobs.items()
    assert job["status"] == "STOPPED"
    stop = dashboard.calls.index(f"POST /api/jobs/{submission}/stop")
    assert not [c for c in dashboard.calls[stop + 1 :] if c == f"GET /api/jobs/{submission}"]  # not waited on
    record = json.loads(project.storage.data(f"{PROJECT}-tpupipe", f"state/{run_id}/stages/train.json"))
    assert record["status"] == "interrupted" and record["released"] == project.clusters(run_id), record
