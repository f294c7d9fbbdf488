"""What a stage's task knows of Vertex AI Pipelines when it runs there: the variable Vertex AI gives every task, the
refusal of a run that cannot work there, and the pipeline job noted in the run's ledger for the janitor."""

from __future__ import annotations

import json
import os

from components.platforms.store import RunStore
from components.spec import SpecError

# Vertex AI Pipelines gives every task the run's labels as JSON in this variable ("Resources generated from
# user-defined components", https://cloud.google.com/vertex-ai/docs/pipelines/gcpc-label-propagation); kfp's own
# executor reads it to know it runs on Vertex AI (kfp/dsl/executor.py).
VERTEX_TASK_ENV = "VERTEX_AI_PIPELINES_RUN_LABELS"


def check_on_vertex(platform: str, output_root: str, environ=None) -> None:
    """On Vertex AI every task runs on a machine of its own: a run there is a gke run whose state is in Cloud
    Storage, else each task would keep the run's state (and a local cluster) on its own disk, lost when it ends.
    Refused (a SpecError naming the parameter) by the first task, before anything is created."""
    if VERTEX_TASK_ENV not in (os.environ if environ is None else environ):
        return
    where = "on Vertex AI every task runs on a machine of its own"
    if platform != "gke":
        raise SpecError(
            "platform", f"{platform!r} is not a run for Vertex AI: {where}; a run there is a gke run", ["gke"]
        )
    if not output_root.startswith("gs://"):
        raise SpecError(
            "output_root",
            f"{output_root!r} is not a gs:// path: {where}, so a run's state lives in Cloud Storage",
            ["gs://BUCKET/state"],
        )


def claim(store: RunStore, run_id: str, platform: str, job_name: str, first: bool, environ=None) -> None:
    """On Vertex AI, the run id is its pipeline job's, held in the run's ledger as a lease, before a task writes
    anything of the run (its stage record included):

    - the first task notes the job in the ledger (its id, the job name KFP's ``{{$.pipeline_job_name}}`` gives, and its
      labels, so the janitor can ask Vertex AI whether the job still runs: ``components.platforms.gke.run.janitor``),
      under a generation precondition (``ledger.update``), unless another job holds the run id: its ledger names
      another job and was not torn down. Two jobs started with one ``--run-id`` at once: one wins the write, the other
      reads the winner's claim and is refused;
    - every later task (teardown, the exit handler's, included) goes on only while the ledger names its own job, so a
      job refused its run id never writes another's records nor deletes what the other created.

    Refused: a SpecError naming ``run_id``."""
    from components.platforms import ledger as ledgers

    labels = (os.environ if environ is None else environ).get(VERTEX_TASK_ENV)
    if labels is None or not job_name:
        return
    job = {"id": job_name, "labels": json.loads(labels or "{}")}

    def refuse(holder: str) -> SpecError:
        return SpecError(
            "run_id",
            f"run id {run_id!r} is held by pipeline job {holder} (its ledger {store.uri}/{ledgers.KEY}), not this "
            f"job {job_name}: nothing of that run is touched; submit with another run id",
        )

    if not first:
        holder = ((ledgers.load(store) or {}).get("pipeline_job") or {}).get("id")
        if holder and holder != job_name:
            raise refuse(holder)
        return

    def note(recorded: dict) -> bool:
        holder = (recorded.get("pipeline_job") or {}).get("id")
        if holder and holder != job_name and not recorded.get("torn_down"):
            raise refuse(holder)
        if recorded.get("pipeline_job") == job:
            return False
        recorded["pipeline_job"] = job
        return True

    ledgers.update(store, note, {"run_id": run_id, "platform": platform, "created": []})
