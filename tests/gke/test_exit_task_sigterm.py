"""A Stop of a Vertex AI run that reaches its exit task mid-teardown, in a process of its own as Vertex AI runs it: the
teardown component's entry (``run_component``, the pipeline job's full resource name, the variable Vertex AI gives
every task) against the emulated project. The job is CANCELLING (as Vertex AI sets it on a cancel) and the task gets
SIGTERM while it waits on the delete of the run's cluster. What its handler promises (components/stages/runner.py):
the deletes of what bills are under way before the task ends (the cluster's goes on, never cancelled), the stage is
recorded interrupted with what it released, the run's summary is written, the ledger still lists what is left for
the janitor, and the process exits 128 + SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from components.platforms import RunContext
from components.platforms import ledger as ledgers
from components.platforms.gke import GkePlatform
from components.platforms.store import GcsStore
from components.stages.claims import claim
from components.stages.vertex_task import VERTEX_TASK_ENV
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT, REGION
from tests.gke.test_janitor import run_bucket  # noqa: F401 - fixture
from tests.helpers import wait_until

JOB_ID = "tpupipe-local-fsdp-20261202000000-eeeeee"
PARENT = f"projects/{PROJECT}/locations/{REGION}"
ROOT = f"gs://{PROJECT}-tpupipe/state"
# The exit task's entry, as the teardown component calls it (components/definitions.py): its artifacts are written
# only after the stage returns, which a SIGTERM'd one never does.
ENTRY = """
import sys
from components.stages.component import run_component
args = dict(preset="local-fsdp", platform="gke", overrides=sys.argv[1], run_id=sys.argv[2], job_name=sys.argv[3],
            output_root=sys.argv[4], project="", bucket="", dataset="", deleted=None, goodput=None, timeline=None)
run_component("teardown", args)
"""


def test_a_sigterm_mid_teardown_leaves_the_deletes_under_way_the_record_and_the_summary(run_bucket):  # noqa: F811
    project, run_id = run_bucket, "stopped-exit"
    labels = {"tpupipe-preset": "local-fsdp"}
    store = GcsStore(f"{PROJECT}-tpupipe", f"state/{run_id}")
    name = f"{PARENT}/pipelineJobs/{JOB_ID}"
    claim(store, run_id, "gke", JOB_ID, first=True, resource=name)
    ctx = RunContext(spec=resolve("local-fsdp", ONE_SLICE), run_id=run_id, store=store, platform="gke")
    GkePlatform(log=lambda m: None, poll_s=0.05).provision(ctx)
    (cluster,) = project.clusters(run_id)
    project.vertex.add_job(PARENT, JOB_ID, "PIPELINE_STATE_CANCELLING", labels)  # a cancel under way
    project.gke.polls_to_done = 10_000  # the cluster's delete runs on while the task waits on it
    env = {**os.environ, VERTEX_TASK_ENV: json.dumps(labels), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-c", ENTRY, ONE_SLICE, run_id, name, ROOT]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        waiting = lambda: "DeleteCluster" in project.gke.state.calls and proc.poll() is None or None  # noqa: E731
        wait_until(waiting, 180, "the exit task to wait on the cluster's delete", interval_s=0.05)
        wait_until(lambda: project.gke.state.calls[-1] == "GetOperation" or None, 60, "its first poll")
        proc.send_signal(signal.SIGTERM)  # what Vertex AI sends the task's container on a cancel
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out[-4000:]
    assert "CancelOperation" not in project.gke.state.calls  # a delete is what a stop wants: it goes on
    assert project.gke.state.clusters[cluster].status.name == "STOPPING", out[-4000:]  # under way, not done
    record = json.loads(project.storage.data(f"{PROJECT}-tpupipe", f"state/{run_id}/stages/teardown.json"))
    assert (record["status"], record["signal"]) == ("interrupted", "SIGTERM"), record
    assert record["released"] == [cluster], (record, out[-4000:])
    summary = json.loads(project.storage.data(f"{PROJECT}-tpupipe", f"state/{run_id}/summary.json"))
    teardown = next(s for s in summary["stages"] if s["name"] == "teardown")
    assert teardown["status"] == "interrupted", summary["stages"]
    assert not ledgers.load(store).get("torn_down")  # unfinished: the janitor still finds what is left
    # The delete GKE took goes on without the task: the cluster goes.
    for entry in project.gke.state.operations.values():
        entry.polls_left = 1
    GkePlatform(log=lambda m: None, poll_s=0.05).teardown(ctx)  # what the janitor runs for the run
    assert project.leftovers(run_id) == {}
