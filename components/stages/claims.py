"""A run id is claimed once, atomically, by the first task of the run that uses it, on every backend: the run's ledger
is *created* there with a create-only precondition, so of two runs started under one id (two racing ``--run-id X``
submits, a run started from the Kubeflow Pipelines UI with an id already used, two ``tpupipe run --run-id X`` on one
machine) exactly one creates it and the other is refused (exit 2) before it writes anything of the run.

The precondition is Cloud Storage's ``ifGenerationMatch=0``, "the request succeeds only if there are no live
objects" of that name ("Request preconditions", https://cloud.google.com/storage/docs/request-preconditions), or
on this machine the same test made under the key's lock file (``components.platforms.store.LocalStore``, held by
every writer of the ledger). The claimant, whom the ledger names in ``claim``:

- on Vertex AI the pipeline job (its id; the ledger's ``pipeline_job`` also notes its full resource name and labels,
  which the janitor reads);
- on Kubeflow Pipelines the run's Argo Workflow (what ``{{$.pipeline_job_resource_name}}`` resolves to there,
  ``components.spec.names.run_id_from``), one per run;
- under ``tpupipe run`` (kfp.local) the driver process, which claims before it starts the pipeline; its tasks inherit
  its pid (``components.platforms.interrupts.DRIVER_ENV``) and so claim as it.

Every later task (the exit handler's teardown included) goes on only while the ledger names its own claimant, so a
run refused its id never writes another run's records nor deletes what the other created. A ledger that names no
claimant (written by a release before claims) is refused, never claimed: a run id is used once
(``pipelines.run_ids``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from components.platforms import VERTEX_TASK_ENV, RunContext
from components.platforms import ledger as ledgers
from components.platforms.store import RunStore, StoreConflict, write_json
from components.spec import SpecError


def local_claimant() -> str:
    """The claimant under ``tpupipe run``: its driver (host, pid and the pid's start time: not a later process that got
    the pid), the same in the driver and in every task it starts."""
    import socket

    from components.platforms import interrupts

    driver = interrupts.driver()
    return f"tpupipe run on {socket.gethostname()} (pid {driver['pid']}, started {driver['started']})"


def claimant(job_name: str, environ: Mapping[str, str]) -> str:
    """Who claims the run in this task: the ``tpupipe run`` driver when the task is one of its own, else the pipeline
    job or workflow ``job_name`` names ('' outside any pipeline: a stage called directly claims nothing)."""
    from components.platforms import interrupts

    if environ.get(interrupts.DRIVER_ENV) and VERTEX_TASK_ENV not in environ:
        return local_claimant()
    return job_name


def holder(ledger: dict[str, Any]) -> str | None:
    """The claimant a ledger names: its ``claim``, else the pipeline job a Vertex AI task noted before claims were
    made on every backend (that job claimed it then); None when it names none."""
    return (ledger.get("claim") or {}).get("job") or (ledger.get("pipeline_job") or {}).get("id")


def unclaimed_or_mine(store: RunStore, job_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this task may write in ``store``: its ledger names this task's claimant, or there is none yet."""
    me = claimant(job_name, os.environ if environ is None else environ)
    ledger = ledgers.load(store) if me else None  # a stage called outside any pipeline claims nothing
    return ledger is None or holder(ledger) == me


def refusal(run_id: str, store: RunStore, ledger: dict[str, Any], me: str) -> SpecError:
    held = holder(ledger)
    by = f"is held by {held}" if held else "has a ledger that names no claimant (a run from before claims)"
    return SpecError(
        "run_id",
        f"run id {run_id!r} {by} (its ledger {store.uri}/{ledgers.KEY}), not this run ({me}); a run id is used once, "
        "ever: nothing of that run is touched; start this run with another run id",
    )


def claim(
    store: RunStore,
    run_id: str,
    platform: str,
    job_name: str,
    first: bool,
    environ: Mapping[str, str] | None = None,
    resource: str = "",
) -> None:
    """The first task creates the run's ledger naming its claimant, on the condition that there is none; when there is
    one, it goes on only when the ledger names this run (a retry of the first task). A later task goes on only while
    the ledger names this run, or names nobody because the first task never ran. Refused: a SpecError naming
    ``run_id``. On Vertex AI the ledger also notes the pipeline job (``resource``: its full resource name) for the
    janitor."""
    env = os.environ if environ is None else environ
    me = claimant(job_name, env)
    if not me:
        return
    labels = env.get(VERTEX_TASK_ENV)
    job = None if labels is None else {"id": job_name, **({"name": resource} if resource else {})}
    if job is not None:
        job["labels"] = json.loads(labels or "{}")
    if first:
        record = {"run_id": run_id, "platform": platform, "created": [], "claim": {"job": me, "at": time.time()}}
        try:
            write_json(store, ledgers.KEY, record | ({"pipeline_job": job} if job else {}), if_generation=0)
            return
        except StoreConflict:
            pass  # a ledger exists: this run's own (a retried first task), or another run's
    ledger = ledgers.load(store)
    if ledger is None:
        return  # a later task of a run whose first task never ran: nothing of it to touch, nothing to refuse
    if holder(ledger) != me:
        raise refusal(run_id, store, ledger, me)
    if first and job and ledger.get("pipeline_job") != job:  # a retried first task: the job as it is known now

        def note(recorded: dict[str, Any]) -> bool:
            if holder(recorded) != me:
                raise refusal(run_id, store, recorded, me)
            recorded["pipeline_job"] = job
            return True

        ledgers.update(store, note)


# Where a gke run's id is claimed beside its resources (``Platform.claims_store``): a run's cluster, service accounts
# and objects (``runs/<id>/``, ``models/<model>/<id>/``) are named from the run id within the project and bucket, not
# from ``output_root``, so a claim in the ledger alone lets a run of the same id under another ``output_root`` share
# them. No run's pods may write ``state/`` (their binding names ``runs/<run id>/`` alone).
def claim_resources(ctx: RunContext, job_name: str, create: bool, environ: Mapping[str, str] | None = None) -> None:
    """On the gke platform, the run id claimed also at ``gs://<gke.bucket>/state/_claims/<run id>.json``, created
    with ``ifGenerationMatch=0`` (as the ledger, :func:`claim`) naming the same claimant: this claimant's tasks (a
    retried one included) go on, another claimant is refused (a SpecError naming ``run_id``, the id and the holder)
    before it creates anything. Every task that may create (``create``) makes the claim when there is none: the
    first task finds no bucket when the run is the project's first (provision makes it), and then the next task
    claims; the exit task only checks. Elsewhere nothing to do: a local run's resources are under its run
    directory, which its ledger claims."""
    from components.platforms import get_platform

    store = get_platform(ctx.platform).claims_store(ctx)
    if store is None:
        return
    me = claimant(job_name, os.environ if environ is None else environ)
    if not me:
        return
    from google.api_core.exceptions import NotFound

    bucket, key = store.bucket_name, f"{ctx.run_id}.json"
    if create:
        record = {"run_id": ctx.run_id, "output_root": ctx.store.uri, "claim": {"job": me, "at": time.time()}}
        try:
            write_json(store, key, record, if_generation=0)
            return
        except StoreConflict:
            pass  # a claim exists: this run's own (a retried or later task), or another run's
        except NotFound:
            return  # no bucket yet: nothing is named from the id in it; a later task claims once provision made it
    text = store.read_text(key)
    held = holder(json.loads(text)) if text else me
    if held != me:
        raise SpecError(
            "run_id",
            f"run id {ctx.run_id!r} is held by {held} (its claim {store.uri}/{key}, beside the resources named from "
            f"it in gs://{bucket}), not this run ({me}): a run id is used once per bucket, whatever its output_root; "
            "nothing of that run is touched; start this run with another run id",
        )
