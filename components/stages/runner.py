"""How a stage runs with its record kept: :func:`run_stage`.

A KFP component calls ``components.stages.component.run_component`` with its arguments, which calls
:func:`run_stage` with the pipeline parameters; everything a stage needs is derived from them (spec from preset +
overrides, run id from the job name), which is what lets ``teardown`` run in an exit handler without any other task's
output. Each stage records its status and duration in ``stages/<stage>.json`` of the run's store (a local directory,
or Cloud Storage on Vertex AI, where every task runs on its own machine); the exit task, teardown, which always runs
last, writes the run's summary. What runs is the ``run`` of the stage's record (``components.stages.table``): the
platform's own methods, the Ray jobs of ``components.stages.ray_stages``, and register and promote, which act on the
model registry (``components.stages.registration``).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
import traceback
from typing import Any

from components.platforms import RunContext, get_platform, heartbeat, interrupts
from components.platforms.store import RunStore, open_store, read_json, write_json
from components.spec import RunSpec, SpecError, TpupipeError
from components.spec.names import run_id_from
from components.stages import claims, gate, table, vertex_task
from components.stages.jobs import log
from components.workload import resolve


def store_for(run_id: str, job_name: str, output_root: str) -> tuple[str, RunStore]:
    """The run id (given, else from the pipeline job's id: ``job_name`` may be its full resource name) and its
    store."""
    rid = run_id_from(run_id, vertex_task.job_id(job_name))
    return rid, open_store(output_root, rid)


def context(preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str) -> RunContext:
    rid, store = store_for(run_id, job_name, output_root)
    return RunContext(spec=resolve(preset, overrides), run_id=rid, store=store, platform=platform)


def record(store: RunStore, stage: str, **fields: Any) -> None:
    """Update the stage's record (``stages/<stage>.json``) with ``fields``."""
    key = f"stages/{stage}.json"
    current = read_json(store, key) or {"stage": stage}
    current.update(fields)
    write_json(store, key, current)


# ---------------------------------------------------------------- what a component calls


def run_stage(
    stage: str,
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    upstream: str = "",
    **facts: str,
) -> str:
    """Resolve the context, run one stage with its record kept, return its result as JSON. ``facts`` are what the
    pipeline knows beyond the spec that a stage takes as keyword arguments (the ``facts`` of its record: the job name,
    the source version).

    SIGINT, SIGTERM or SIGHUP ends a stage: what it started is stopped (``interrupts.on_interrupt`` where it waits),
    it is recorded ``interrupted`` and the process exits 128 + the signal's number; a stage that starts after the
    driver marked the run interrupted does not run. The exit task (teardown) ignores Ctrl-C: the driver counts the
    presses. On Vertex AI, ``job_name`` is the pipeline job's full resource name, and a SIGTERM stops what the stage
    started only when that job is being cancelled (``vertex_task.sigterm_stops``); then the stage also starts the
    deletion of what bills (``Platform.release``) first, before it stops the Ray job (without waiting for it: its
    cluster is going), as the cancel never runs an exit task that has not started; one that runs does the same, and
    writes the run's summary (its teardown interrupted) before it exits, as it does however else it ends."""
    vertex_task.watch(job_name)
    job = vertex_task.job_id(job_name)
    with interrupts.sigterm_judged_by(lambda: vertex_task.sigterm_stops(log)):
        stopping = interrupts.on_interrupt(
            lambda sig: log(f"{stage}: {interrupts.signal_name(sig)}: stopping"), log=log
        )
        if table.named(stage).exit:  # an unknown stage is a ValueError naming the stages
            # On Vertex AI a cancel reaches a running exit task too: its SIGTERM starts every delete not yet under
            # way (``_Releasing``) before the task ends; elsewhere the driver owns the exit task's signals.
            with stopping if vertex_task.watched() else contextlib.nullcontext(), interrupts.sigint_ignored():
                return _run_recorded(stage, preset, platform, overrides, run_id, job, output_root, upstream, facts)
        with stopping:
            return _run_recorded(stage, preset, platform, overrides, run_id, job, output_root, upstream, facts)


def _run_recorded(
    stage: str,
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    upstream: str,
    facts: dict[str, str],
) -> str:
    this, first = table.named(stage), stage == table.STAGES[0]
    rid, store = store_for(run_id, job_name, output_root)
    started = time.time()
    releasing = _Releasing()
    try:  # every stage checks where it runs before it acts: a task may be the first to run (a retry, build_image)
        if not this.exit:  # the exit task writes the run's summary, the refusal in it; it deletes only what was made
            vertex_task.check_on_vertex(platform, output_root, job_name=job_name)
    except SpecError as exc:  # what the run's summary shows, when its state is in Cloud Storage and this run's
        if claims.unclaimed_or_mine(store, job_name):  # another run's store gets nothing, not even this record
            record(store, stage, status="failed", seconds=0.0, run_id=rid, error=_error_text(exc))
        log(f"== {stage}: refused: {exc}")
        raise SystemExit(exc.exit_code) from exc  # bad input: the task exits 2, as the command line does
    try:  # before anything of the run is written: the run id is this run's (components.stages.claims)
        claims.claim(store, rid, platform, job_name, first=first, resource=vertex_task.watched())
    except SpecError as exc:  # another run's: nothing is written in its store, not even this stage's record
        log(f"== {stage}: refused: {exc}")
        raise SystemExit(exc.exit_code) from exc
    mark = interrupts.marked(store)
    if mark and (not this.exit or mark.get("abandoned")):
        reason = (
            "teardown was abandoned"
            if mark.get("abandoned")
            else f"the run was interrupted ({mark['signal']} during {mark['stage']})"
        )
        record(store, stage, status="skipped", run_id=rid, reason=reason)
        log(f"== {stage}: not started: {reason}")
        raise interrupts.Interrupted(getattr(signal, mark["signal"]))
    _attempt(store, stage, started=started, run_id=rid)
    log(f"== {stage} ({platform}, run {rid})")
    ctx = None
    try:
        ctx = releasing.ctx = stage_context(stage, preset, platform, overrides, run_id, job_name, output_root)
        if not this.exit:  # the credentials where it runs, as a run from the command line checks them first
            get_platform(ctx.platform).check_access(ctx)
        try:  # the id claimed beside the resources named from it too (a gke run's bucket), before any is created
            claims.claim_resources(ctx, job_name, create=not this.exit)
        except SpecError as exc:
            log(f"== {stage}: refused: {exc}")
            raise SystemExit(exc.exit_code) from exc
        with heartbeat.beating(store, stage), interrupts.released_first(releasing):  # the janitor sees it live
            if first:
                gate.check_lineage(ctx)  # a scheduled run's champion is read when it starts, before any TPU is created
            result = this.run(ctx, upstream, **facts)
    except interrupts.Interrupted as exc:
        stopped = exc.signum != signal.SIGTERM or not vertex_task.watched() or vertex_task.cancelling()
        record(
            store,
            stage,
            status="interrupted",
            seconds=time.time() - started,
            signal=exc.signal_name,
            error=f"interrupted by {exc.signal_name}" + ("" if stopped else ": left running for the task's retry"),
        )
        if ctx is not None and exc.signum == signal.SIGTERM and vertex_task.cancelling():
            # Started by the signal's handler before anything was stopped; here when the signal came between.
            record(store, stage, released=releasing.started if releasing.done else _release(ctx))
        if this.exit and ctx is not None:  # the run's summary, as any end of the exit task writes it: after the deletes
            _write_report(ctx, within_s=SIGNALLED_EXIT_S - (time.monotonic() - exc.at))  # counted from the signal
        raise
    except BaseException as exc:
        record(store, stage, status="failed", seconds=time.time() - started, error=_error_text(exc))
        if this.exit and ctx is not None:
            _write_report(ctx)
        raise
    record(store, stage, status="succeeded", seconds=time.time() - started, result=result)
    if this.exit:
        _write_report(ctx)
    return json.dumps(result)


def stage_context(
    stage: str, preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str
) -> RunContext:
    try:
        return context(preset, platform, overrides, run_id, job_name, output_root)
    except SpecError:
        if not table.named(stage).exit:
            raise
        # Teardown needs only the run id: it still cleans up after a run whose input was bad.
        rid, store = store_for(run_id, job_name, output_root)
        return RunContext(spec=RunSpec(name=preset), run_id=rid, store=store, platform=platform)


def teardown_context(run_id: str, platform: str, output_root: str, preset: str = "", overrides: str = "") -> RunContext:
    """The context ``tpupipe teardown RUN_ID`` deletes by: the spec and platform the run's ledger recorded, else the
    preset and overrides given (a gke run that left no ledger), else just the run id (local: its marker)."""
    from components.platforms import ledger as ledgers

    rid, store = store_for(run_id, "", output_root)
    recorded = ledgers.load(store) or {}
    platform = platform or recorded.get("platform") or "local"
    get_platform(platform)  # an unknown platform is a SpecError naming it
    if recorded.get("spec") and not preset:
        spec = RunSpec.from_json(json.dumps(recorded["spec"]))
    elif preset:
        spec = resolve(preset, overrides)
    elif platform == "local":
        spec = RunSpec(name="local-fsdp")
    else:
        raise SpecError(
            "run_id",
            f"run {rid} left no ledger in {store.uri}: name its preset and overrides "
            "(--preset, --set gke.project=...) to find its resources by their labels",
        )
    return RunContext(spec=spec, run_id=rid, store=store, platform=platform)


def _attempt(store: RunStore, stage: str, **fields: Any) -> None:
    """The stage's record as an attempt starts: running, without what an earlier attempt ended with (its error, the
    signal that ended it: a retried task's)."""
    key = f"stages/{stage}.json"
    current = {k: v for k, v in (read_json(store, key) or {"stage": stage}).items() if k not in _ENDED}
    write_json(store, key, {**current, "status": "running", **fields})


_ENDED = ("error", "signal", "seconds", "released")


class _Releasing:
    """What a stop of a cancelled Vertex AI run does first (``interrupts.released_first``), before it stops the
    stage's Ray job or operation: start deleting what bills (``_release``), so the deletes are out before the
    grace period's SIGKILL whatever the stop that follows takes. Any other signal releases nothing here: the
    pipeline's own teardown runs after it."""

    def __init__(self) -> None:
        self.ctx: RunContext | None = None
        self.started: list[str] = []
        self.done = False

    def __call__(self, signum: int) -> bool:
        if self.ctx is None or signum != signal.SIGTERM or not vertex_task.cancelling():
            return False
        self.started, self.done = _release(self.ctx), True
        return bool(self.started)


def _release(ctx: RunContext) -> list[str]:
    """A cancelled run's deletes started now, by the task the cancel reached, never waited on (the grace period before
    SIGKILL is short); the janitor and ``tpupipe runs cancel`` finish what they miss. What was started."""
    try:
        started = get_platform(ctx.platform).release(ctx)
    except Exception as exc:  # noqa: BLE001 - the janitor collects a cancelled run; the task still ends
        log(f"cancelled: could not start the deletion of what bills ({exc}); the janitor collects the run")
        return []
    for name in started:
        log(f"cancelled: deleting {name}")
    return started


def _error_text(exc: BaseException) -> str:
    """The failure as the stage's record keeps it, known secrets redacted (an error may quote a job's output)."""
    from components.cloud.credentials import access_error
    from components.platforms.redaction import redact

    exc = access_error(exc) or exc  # no credentials, no project, an API off, a permission denied: the fix, one line
    if isinstance(exc, TpupipeError):
        return redact(str(exc))
    return redact("".join(traceback.format_exception_only(type(exc), exc)).strip())


# When a signalled exit task stops waiting for the run's summary, counted from the signal: the deletes were started
# and recorded first, and the summary gets what is left. Vertex AI documents no grace period for a cancelled task,
# and Kubernetes gives a pod 30 s by default between SIGTERM and SIGKILL
# (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination), so the exit comes within that.
SIGNALLED_EXIT_S = 20.0


def _write_report(ctx: RunContext, within_s: float | None = None) -> None:
    """Write the run's summary; a failure is said, never raised. ``within_s``: give up waiting after that long (the
    summary is then left unwritten, said), for an exit on a signal."""
    from components.stages import report

    def write() -> None:
        try:
            report.write(ctx)
        except Exception as exc:  # noqa: BLE001 - the report must never hide the teardown's own outcome
            print(f"teardown: could not write the run summary: {exc}", file=sys.stderr)

    if within_s is None:
        write()
        return
    if within_s > 0:
        writer = threading.Thread(target=write, name="run-summary", daemon=True)
        writer.start()
        writer.join(within_s)
        if not writer.is_alive():
            return
    late = f"teardown: the run summary was not written within {SIGNALLED_EXIT_S:.0f}s of the signal: left"
    print(late, file=sys.stderr)
    sys.stderr.flush()
