"""A run id is used once, ever: every resource name, the run's bucket prefix (``runs/<id>/``, which may hold a
registered version's checkpoint) and its checkpoints (``ray_results/<id>``) derive from it, so a second run under the
same id would resume the first one's ledger or checkpoints, get write access to its outputs, and its teardown would
delete the first one's live cluster. Refused with exit 2 before anything is created, on every backend (``tpupipe run
--run-id``, ``tpupipe submit --run-id`` to Vertex AI or with ``--kfp-host``): a run id that has had a ledger under the
output root the run would write to (torn down or not), a fresh heartbeat of a driver there
(``components.platforms.heartbeat``), or, on Vertex AI, a pipeline job that carries it in its ``tpupipe-run`` label
and has not ended. Two submits racing for one id both pass this check, and a run started from the Kubeflow Pipelines
UI skips it: the run's first task claims the id atomically, wherever the run started (``components.stages.claims``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from components.spec import SpecError, names

if TYPE_CHECKING:
    from components.platforms.store import RunStore

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

    if not run_id:
        return
    where = f'labels.{names.RUN_LABEL}="{run_id}"'
    logging.getLogger("google.cloud.aiplatform.pipeline_jobs").setLevel(logging.ERROR)  # "the view is simple"
    for job in aiplatform.PipelineJob.list(filter=where, enable_simple_view=True):
        found = job.to_dict()
        if found.get("state") not in TERMINAL:
            state = found.get("state", "").removeprefix("PIPELINE_STATE_").lower()
            raise SpecError("--run-id", f"{run_id!r} is in use: pipeline job {found['name']} runs under it ({state})")
    check_unused(run_id, output_root(template, project))


def check_unused(run_id: str, root: str) -> None:
    """SpecError naming ``--run-id`` when ``run_id`` has had a ledger under the output root ``root`` (torn down or
    not), or its driver's heartbeat there is fresh: a run id is used once. A local root of a remote backend holds no
    run of it: nothing to check."""
    from components.platforms import heartbeat
    from components.platforms import ledger as ledgers
    from components.platforms.store import open_store

    if not run_id or not root.startswith("gs://"):
        return
    store = open_store(root, run_id)
    refuse_reused(run_id, store, heartbeat.fresh(store), ledgers.load(store) is not None)


def refuse_reused(run_id: str, store: RunStore, beat: float | None, had_ledger: bool) -> None:
    """The refusal of a run id the store shows used: a fresh heartbeat, or a ledger (the run provisioned)."""
    from components.platforms import ledger as ledgers

    if beat is None and not had_ledger:
        return
    why = (
        f"is in use: its driver's heartbeat in {store.uri} is {beat:.0f} s old"
        if beat is not None
        else f"was used already: a run under it has a ledger ({store.uri}/{ledgers.KEY}), torn down or not"
    )
    raise SpecError(
        "--run-id",
        f"{run_id!r} {why}; a run id is used once (its prefix may hold a registered model's checkpoint, its "
        "checkpoints would be resumed): choose another run id",
    )
