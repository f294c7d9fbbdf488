"""What keeps a stopped Vertex AI run from leaving TPUs billing.

Vertex AI documents that cancelling a pipeline run "cancels all the remaining tasks in the pipeline"
(https://cloud.google.com/vertex-ai/docs/pipelines/cancel-pipeline-runs): the exit handler's teardown task is one of
them, so after a Stop (in the UI, or a cancel call) the pipeline's own teardown never runs. What does:

- the stage the Stop reaches: its task gets SIGTERM while its pipeline job is CANCELLING, stops what it started and
  starts the deletion of the run's cluster (``components.stages.runner``, ``components.stages.vertex_task``);

- ``tpupipe runs cancel JOB`` (:func:`cancel`): cancels the job, waits for it to end (with a deadline, printing each
  task's state), then runs the teardown ``tpupipe teardown RUN_ID --platform gke`` runs, from the run's ledger in Cloud
  Storage, and prints what it deleted;
- the janitor on a schedule (:func:`janitor_schedule`, ``tpupipe publish --janitor-schedule``): every 15 minutes it
  asks Vertex AI for the state of each run's pipeline job and tears down at once every run whose job has ended
  (``components.platforms.gke.run.janitor``), so a Stop between two tasks costs at most one sweep's interval of
  slices. Publishing a new image replaces a schedule on an older one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.spec import InfraError, SpecError
from pipelines.backends.vertex import jobs as vertex
from pipelines.backends.vertex import schedules

JANITOR_SCHEDULE = "tpupipe-janitor"
JANITOR_CRON = "*/15 * * * *"  # every 15 minutes: the longest a stopped run's slices stay up
CANCEL_TIMEOUT_S = 1800.0


def run_of(job: dict[str, Any]) -> dict[str, str]:
    """The run a pipeline job ran: its run id (the ``run_id`` parameter, else derived from the job's id, as every task
    derives it), its output root, preset and overrides (the compiled defaults where the job set none)."""
    from components.spec.names import run_id_from

    given = job.get("runtimeConfig", {}).get("parameterValues", {})
    declared = job.get("pipelineSpec", {}).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    value = {k: given.get(k, d.get("defaultValue", "")) for k, d in declared.items()} | given
    return {
        "run_id": run_id_from(value.get("run_id", ""), job["name"].rsplit("/", 1)[-1]),
        "output_root": value.get("output_root", ""),
        "preset": value.get("preset", ""),
        "overrides": value.get("overrides", ""),
        "project": value.get("project", ""),
        "bucket": value.get("bucket", ""),
    }


def cancel(name: str, timeout_s: float = CANCEL_TIMEOUT_S, log: Callable[[str], None] = print) -> int:
    """Cancel the job (unless it has ended), wait for it to end, then tear its run down from the run's ledger; 0 when
    the job ended and nothing of the run is left."""
    from google.cloud import aiplatform

    job = aiplatform.PipelineJob.get(name).to_dict()
    if job.get("state") not in vertex.TERMINAL:
        if job.get("state") != "PIPELINE_STATE_CANCELLING":  # cancelled already (the UI's Stop): just wait
            aiplatform.PipelineJob.get(name).cancel()
        log(f"{name}: cancel requested; waiting at most {timeout_s:.0f}s for Vertex AI to stop its tasks")
        try:
            job = vertex.follow(name, log, poll_s=2.0, timeout_s=timeout_s)
        except InfraError as exc:
            raise InfraError(f"{exc}: its tasks may still be stopping; run `tpupipe runs cancel` again") from None
    state = job["state"].removeprefix("PIPELINE_STATE_").lower()
    log(f"{name}: {state}; its exit handler's teardown does not run after a cancel: tearing the run down here")
    return teardown_after(job, job["state"] == "PIPELINE_STATE_CANCELLED", name, log)


def teardown_after(job: dict[str, Any], cancelled: bool, name: str, log: Callable[[str], None] = print) -> int:
    """Tear down the run a stopped pipeline job ran (a Vertex AI job, or a KFP run in its shape), from its ledger;
    0 when the job ended ``cancelled`` and nothing of the run is left."""
    from components.platforms import ledger as ledgers
    from components.platforms.store import open_store
    from components.stages.component import with_target
    from pipelines.backends.local import run as local_run

    run = run_of(job)
    if not run["output_root"].startswith("gs://"):
        log(f"{name}: its output root {run['output_root']!r} is not in Cloud Storage: its first task refused it")
        return 0 if cancelled else 1
    recorded = ledgers.load(open_store(run["output_root"], run["run_id"])) is not None
    # With no ledger the run recorded nothing yet: its preset finds what may carry its label.
    preset = "" if recorded else run["preset"]
    overrides = "" if recorded else with_target(run["overrides"], run["project"], run["bucket"])
    code = local_run.teardown(run["run_id"], "gke", run["output_root"], preset, overrides)
    return max(code, 0 if cancelled else 1)


def janitor_schedule(project: str, region: str, service_account: str = "", log: Callable[[str], None] = print) -> str:
    """The schedule of the janitor pipeline every 15 minutes, one sweep at a time: created when missing, replaced
    when it runs another image than this source tree's (as published), left as it is otherwise; its resource name.
    Replaced, not updated: UpdateSchedule changes a schedule's timing, not the pipeline job it creates (the fields
    ``PipelineJobSchedule.update`` takes in google-cloud-aiplatform: display name, cron, run counts, queueing)."""
    import yaml
    from google.cloud import aiplatform

    from pipelines.janitor import janitor_pipeline
    from pipelines.pipeline import Target, compile_pipeline
    from pipelines.publish.vertex import pin_images

    target = Target(project=project, region=region)
    vertex.init(project, region)
    existing = schedules.find(JANITOR_SCHEDULE)
    with tempfile.TemporaryDirectory() as tmp:
        path, missing = pin_images(compile_pipeline(str(Path(tmp) / "janitor.yaml"), target, janitor_pipeline))
        if missing:
            raise SpecError("image", f"{missing[0]} is not in Artifact Registry: tpupipe publish builds it")
        image = _images(yaml.safe_load(Path(path).read_text()))
        if existing is not None:
            running = _images(existing.to_dict().get("createPipelineJobRequest", {}).get("pipelineJob", {}))
            if running == image:
                log(f"publish: the janitor schedule {JANITOR_SCHEDULE} exists already ({existing.resource_name})")
                return existing.resource_name
            log(
                f"publish: the janitor schedule {JANITOR_SCHEDULE} runs {', '.join(sorted(running)) or 'another image'}"
                f": replacing it with one on {', '.join(sorted(image))}"
            )
            existing.delete()
        job = aiplatform.PipelineJob(
            display_name=JANITOR_SCHEDULE, template_path=path, pipeline_root=target.pipeline_root
        )
    schedule = aiplatform.PipelineJobSchedule(pipeline_job=job, display_name=JANITOR_SCHEDULE)
    schedule.create(
        cron=JANITOR_CRON,
        max_concurrent_run_count=1,
        max_concurrent_active_run_count=1,
        service_account=service_account or None,
    )
    log(f"publish: the janitor sweeps every 15 minutes: schedule {JANITOR_SCHEDULE} ({schedule.resource_name})")
    return schedule.resource_name


def _images(job: dict[str, Any]) -> set[str]:
    """The images a compiled pipeline's (or a pipeline job's ``pipelineSpec``'s) tasks run in."""
    spec = job.get("pipelineSpec", job)
    return {e["container"]["image"] for e in spec.get("deploymentSpec", {}).get("executors", {}).values()}
