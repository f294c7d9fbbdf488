"""A Stop between two tasks on (emulated) Vertex AI, each task a job of its own that starts a while after it is
created (the emulator's ``start_delay_s``): the published pipeline runs until provision is done and the next task,
deploy_raycluster, waits to start; the run is cancelled then. No task is running to hear it, the exit handler's
teardown is cancelled with the rest, and the run's cluster bills; the janitor schedule ``tpupipe publish`` makes by
default collects it on its next sweep, and nothing of the run is left billing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from components.spec.names import run_id_from
from tests.emulators.project import PROJECT, REGION
from tests.helpers import unique_run_id, wait_until
from tests.vertex.test_vertex_pipeline import SERVICE_ACCOUNT, _failure, _submit, _tasks

pytestmark = [pytest.mark.e2e]


def test_a_stop_between_two_tasks_is_torn_down_by_the_janitors_next_sweep(tmp_path, project_factory, monkeypatch):
    from google.cloud import aiplatform

    from pipelines.backends.vertex import stopping

    project = project_factory(vertex=True, polls_to_done=1)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    project.vertex.start_delay_s = 60.0  # longer than the test waits between provision's end and the cancel
    job_id = unique_run_id("vx-gap")
    run_id = run_id_from("", job_id)
    name = _submit(project, tmp_path, job_id)
    stopping.janitor_schedule(PROJECT, REGION, SERVICE_ACCOUNT, log=lambda m: None)  # what publish does by default

    def in_the_gap() -> bool:
        tasks = _tasks(project.vertex.job(name).resource)
        if any(t["state"] == "FAILED" for t in tasks.values()):
            raise AssertionError(_failure(project, name, tasks))
        return tasks.get("deploy-raycluster", {}).get("state") == "PENDING" or None

    wait_until(in_the_gap, 900, "deploy_raycluster to be created and not yet started")
    assert project.clusters(run_id) and project.pools(run_id)  # provision done: the slice bills
    aiplatform.PipelineJob.get(name).cancel()
    resource = project.vertex.wait(name, timeout_s=120)
    tasks = _tasks(resource)
    assert resource["state"] == "PIPELINE_STATE_CANCELLED"
    assert tasks["deploy-raycluster"]["state"] == "CANCELLED" and tasks["teardown"]["state"] == "CANCELLED", tasks
    assert "deploy-raycluster" not in [t for t, _ in project.vertex.terminated]  # no process heard the Stop
    assert project.pools(run_id), "nothing should have deleted the run yet"

    (sweep,) = project.vertex.advance(project.vertex.clock + timedelta(minutes=15))
    swept = project.vertex.wait(sweep, timeout_s=300)
    assert swept["state"] == "PIPELINE_STATE_SUCCEEDED", project.vertex.job(sweep).logs
    assert f"(its pipeline job {job_id} is cancelled)" in project.vertex.job(sweep).logs["janitor"]
    assert project.clusters(run_id) == [] and project.pools(run_id) == [] and project.gke.state.clusters == {}
