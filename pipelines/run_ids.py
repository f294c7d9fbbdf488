"""A run id given to ``tpupipe submit --run-id`` must not be in use: every resource name derives from it, so a second
job under the same id would resume the first one's ledger, and its teardown would delete the first job's live
cluster. In use means any of: a pipeline job that carries the id in its ``tpupipe-run`` label and has not ended; the
run's ledger under the output root the job would write to, not yet torn down; a fresh heartbeat of the run's driver
there (``components.platforms.heartbeat``). Refused with exit 2 before the job is created."""

from __future__ import annotations

from pathlib import Path

from components.spec import SpecError, names

TERMINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")


def job_labels(run_id: str) -> dict[str, str]:
    """The label that finds a job by its explicit run id (run ids are DNS-1035 labels of at most 40 characters:
    valid label values)."""
    return {names.RUN_LABEL: run_id} if run_id else {}


def output_root(template: str, project: str) -> str:
    """Where the job's run state goes: the template's default ``output_root`` when it is a file here, else the
    compiled default for the project (``pipelines.pipeline.Target``)."""
    import yaml

    fallback = names.state_root(names.bucket(project))
    path = Path(template)
    if "://" in template or not path.is_file():
        return fallback
    spec = yaml.safe_load(path.read_text()) or {}
    parameters = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    return parameters.get("output_root", {}).get("defaultValue") or fallback


def check_free(run_id: str, project: str, template: str) -> None:
    """SpecError naming ``--run-id`` when the run id is in use (after ``vertex.init``)."""
    import logging

    from google.cloud import aiplatform

    from components.platforms import heartbeat
    from components.platforms import ledger as ledgers
    from components.platforms.store import open_store

    if not run_id:
        return
    where = f'labels.{names.RUN_LABEL}="{run_id}"'
    logging.getLogger("google.cloud.aiplatform.pipeline_jobs").setLevel(logging.ERROR)  # "the view is simple"
    for job in aiplatform.PipelineJob.list(filter=where, enable_simple_view=True):
        found = job.to_dict()
        if found.get("state") not in TERMINAL:
            state = found.get("state", "").removeprefix("PIPELINE_STATE_").lower()
            raise SpecError("--run-id", f"{run_id!r} is in use: pipeline job {found['name']} runs under it ({state})")
    root = output_root(template, project)
    if not root.startswith("gs://"):
        return  # a local output root: no job on Vertex AI writes there
    store = open_store(root, run_id)
    recorded = ledgers.load(store)
    beat = heartbeat.fresh(store)
    if beat is not None or (recorded is not None and not recorded.get("torn_down")):
        why = (
            f"its driver's heartbeat in {store.uri} is {beat:.0f} s old"
            if beat is not None
            else f"its ledger {store.uri}/{ledgers.KEY} records resources not torn down"
        )
        raise SpecError(
            "--run-id",
            f"{run_id!r} is in use: {why}; choose another run id, or tear that run down first "
            f"(tpupipe teardown {run_id} --platform gke --output-root {root})",
        )
