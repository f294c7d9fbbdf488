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
            ["gs://BUCKET/runs"],
        )


def note_pipeline_job(store: RunStore, run_id: str, platform: str, job_name: str, environ=None) -> None:
    """On Vertex AI, the run's pipeline job in its ledger before anything is created: its id (the job name KFP's
    ``{{$.pipeline_job_name}}`` gives) and its labels, so the janitor can ask Vertex AI whether the job still runs
    (``components.platforms.gke.janitor``)."""
    from components.platforms import ledger as ledgers

    labels = (os.environ if environ is None else environ).get(VERTEX_TASK_ENV)
    if labels is None or not job_name:
        return
    recorded = ledgers.load(store) or {"run_id": run_id, "platform": platform, "created": []}
    job = {"id": job_name, "labels": json.loads(labels or "{}")}
    if recorded.get("pipeline_job") != job:
        ledgers.save(store, {**recorded, "pipeline_job": job})
