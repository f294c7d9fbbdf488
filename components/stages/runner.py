"""The pipeline's stages as plain functions over the platform interface, and :func:`run_stage`, which runs one with its
record kept.

A KFP component calls ``components.stages.component.run_component`` with its arguments, which calls
:func:`run_stage` with the pipeline parameters; everything a stage needs is derived from them (spec from preset +
overrides, run id from the job name), which is what lets ``teardown`` run in an exit handler without any other task's
output. Each stage records its status and duration in ``stages/<stage>.json`` of the run's store (a local directory,
or Cloud Storage on Vertex AI, where every task runs on its own machine); teardown, which always runs last, writes the
run's summary. The stages that run on the platform are its own methods; check_slice, train and evaluate are Ray jobs
(``components.stages.jobs``); register and promote act on the model registry (``components.stages.registration``).
"""

from __future__ import annotations

import json
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from components.platforms import RunContext, get_platform, heartbeat, interrupts
from components.platforms.store import RunStore, open_store, read_json, write_json
from components.spec import InfraError, RunSpec, SpecError, TpupipeError
from components.spec.names import run_id_from
from components.stages import STAGES, gate, goodput, progress, vertex_task
from components.stages.jobs import JobFailed, log, run_job
from components.stages.registration import promote, register
from components.workload import resolve


def store_for(run_id: str, job_name: str, output_root: str) -> tuple[str, RunStore]:
    rid = run_id_from(run_id, job_name)
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


# ---------------------------------------------------------------- the stages


def _on_platform(stage: str) -> Callable[[RunContext, str], dict[str, Any]]:
    """A stage that is the platform's own method of the same name (provision, build_image, ...)."""

    def run(ctx: RunContext, _upstream: str) -> dict[str, Any]:
        return getattr(get_platform(ctx.platform), stage)(ctx)

    run.__name__ = stage
    return run


def entrypoint(ctx: RunContext, mode: str, checkpoint: str = "", init_from: str = "", champion: str = "") -> str:
    """The command of the run's ``mode`` (check, train or eval) job, as the stage submits it."""
    from components.workload.derive import job_command

    out = get_platform(ctx.platform).job_output_dir(ctx)
    return job_command(ctx.spec, mode, out, ctx.run_id, checkpoint, init_from, champion)


def history(records: list[tuple[str, dict]]) -> list[dict]:
    """Per-epoch (FSDP) or per-step (MaxText) metric records in order; after a restart, the figures of a
    re-run epoch or step replace the earlier ones."""
    latest: dict[int, dict] = {}
    for kind, payload in records:
        if kind == "metric":
            latest[payload.get("epoch", payload.get("step"))] = payload
    return [latest[k] for k in sorted(latest)]


class SliceCheckFailed(InfraError):
    """The slice check found bad ranks: the message names each rank and its host. Training does not start."""


def check_slice(ctx: RunContext, _upstream: str = "") -> dict[str, Any]:
    """Every device's collectives and tensor-parallel parity, as a Ray job on the training hosts, before training
    (``trainers.slice_check``); ``cluster.slice_check=false`` skips it."""
    c = ctx.spec.cluster
    if not c.slice_check:
        log("check_slice: skipped (cluster.slice_check=false)")
        return {"skipped": True, "reason": "cluster.slice_check=false"}
    seen: dict[str, Any] = {}

    def keep(kind: str, payload: dict) -> None:
        if kind == "result":
            seen.update(payload)

    # Its own waits (the slice's reservation, the actors, the checks) are each bounded by the timeout.
    try:
        job = run_job(ctx, "check_slice", entrypoint(ctx, "check"), 3 * c.slice_check_timeout_s, keep)
    except JobFailed:
        if seen.get("ok") is False:
            raise SliceCheckFailed(f"check_slice: {seen['failure']}") from None
        raise
    r = job["result"]
    log(
        f"check_slice: {r['ranks_verified']}/{r['num_ranks']} ranks verified on {r['num_hosts']} hosts "
        f"({r['device']}, {r['backend']}): max abs difference {r['max_abs_diff']:.3g}, all-reduce {r['all_reduce']:g} "
        f"(expected {r['expected_all_reduce']}), {r['seconds']:.1f}s"
    )
    if "bandwidth_bytes" in r:
        from components.stages.report import bandwidth_line

        log(f"check_slice: {bandwidth_line(r)}")
    return {"job": job["submission_id"], **r}


def train(ctx: RunContext, _upstream: str = "") -> dict[str, Any]:
    """The trainer as a Ray job; ``train.init_from`` is resolved to a registered version's checkpoint now."""
    t = ctx.spec.train
    start = gate.starting_point(ctx)
    if start:
        log(f"train: starting from {start['ref']} ({start['artifact_uri']}; held-out loss {start['eval_loss']})")

    command = entrypoint(ctx, "train", init_from=start["path"] if start else "")
    job = run_job(ctx, "train", command, t.timeout_s, _train_progress(ctx.spec))
    rows = history(job["records"])
    events = [p for kind, p in job["records"] if kind == "event"]
    data = next((p for p in reversed(events) if p.get("event") == "data"), {})
    timeline = goodput.timeline(job["records"])
    return {
        "job": job["submission_id"],
        "init_from": start,
        "data_snapshot": data.get("data_snapshot"),
        "num_train_examples": data.get("num_examples"),
        "restarts": restarts(events),
        "first_step_at": first_step_at(job["records"]),
        "checkpoint": job["result"]["checkpoint"],
        "checkpoint_uri": get_platform(ctx.platform).checkpoint_uri(ctx, job["result"]["checkpoint"] or ""),
        "history": rows,
        "losses": [r["loss"] for r in rows],
        "steps": goodput.step_records(job["records"], timeline),
        "timeline": timeline,
        "tokens_per_s": rows[-1]["tokens_per_s"] if rows else None,
        "device": job["result"]["device"],
        "backend": job["result"]["backend"],
        "num_workers": job["result"]["num_workers"],
    }


def _train_progress(spec: RunSpec) -> Callable[[str, dict], None]:
    """What the train job's records show while it runs: a progress bar of its steps (FSDP's ``step`` events carry
    their total and tokens, its losses come once an epoch; MaxText's per-step metrics carry the loss and tokens/s,
    ``maxtext.steps`` in all) and, for FSDP, a line per epoch."""
    seen: set[tuple] = set()  # Ray may forward a worker's line twice; a re-run step after a restart differs
    bar = progress.Bar("train", spec.maxtext.steps, "steps", log)  # FSDP's records give its total
    last: dict[str, float] = {}  # the last loss known

    def on_record(kind: str, p: dict) -> None:
        key = (kind, p.get("event"), p.get("step"), p.get("epoch"), p.get("time"), p.get("loss"))
        if key in seen:
            return
        seen.add(key)
        if kind == "event" and p.get("event") == "step_losses" and p.get("losses"):
            last["loss"] = p["losses"][-1]
        elif kind == "event" and p.get("event") == "step" and p.get("total"):
            bar.update(p["step"], p.get("time"), last.get("loss"), tokens=p.get("tokens", 0.0), total=p["total"])
        elif kind == "metric" and "step" in p:  # MaxText: its step counts from 0
            last["loss"] = p["loss"]
            bar.update(p["step"] + 1, p.get("time"), p["loss"], rate=p.get("tokens_per_s"))
        elif kind == "metric" and "epoch" in p:
            log(
                f"train: epoch {p['epoch']}/{spec.train.epochs}  loss {p['loss']:.4f}  "
                f"{p['tokens_per_s']:.0f} tokens/s  ({p['epoch_s']:.2f}s)"
            )

    return on_record


def first_step_at(records: list[tuple[str, dict]]) -> float | None:
    """When the trainer's first step ended (epoch seconds): its first ``step`` event (FSDP), or its first step's
    metric (MaxText); None when it stamped none."""
    times = [p["time"] for kind, p in records if "time" in p and (p.get("event") == "step" or kind == "metric")]
    return min(times) if times else None


def restarts(events: list[dict]) -> int:
    """How many times the trainer's worker group started again. Each start is stamped with its time: a line Ray
    forwarded twice is one start, not a restart."""
    return max(0, len({p.get("time") for p in events if p.get("event") == "worker_group_started"}) - 1)


def evaluate(ctx: RunContext, upstream: str) -> dict[str, Any]:
    """Held-out loss before and after training, of the checkpoint the train stage (``upstream``) reported, and of
    the registered model's champion beside them, in the same job on the same examples (``gate.champion_to_measure``,
    read from the registry now): the figures the gate compares."""
    train_result = json.loads(upstream) if upstream else {}
    if not train_result.get("checkpoint"):
        raise JobFailed("evaluate: the train stage reported no checkpoint")
    start = train_result.get("init_from") or {}
    champion = gate.champion_to_measure(ctx)
    if champion and champion.get("not_compared"):
        log(f"evaluate: not measuring {champion['ref']}: {champion['not_compared']}")
    elif champion:
        log(f"evaluate: measuring {gate.CHAMPION} {champion['ref']} beside the new model")
    command = entrypoint(
        ctx,
        "eval",
        checkpoint=train_result["checkpoint"],
        init_from=start.get("path", ""),
        champion=(champion or {}).get("path", ""),
    )
    bar = progress.Bar("evaluate", 0, "batches", log)

    def on_record(kind: str, p: dict) -> None:  # the evaluation's progress: its batches, model after model
        if kind == "event" and p.get("event") == "eval_model":
            bar.update(p["done"], p.get("time"), total=p["total"])

    job = run_job(ctx, "evaluate", command, ctx.spec.train.timeout_s, on_record)
    result = job["result"]
    measured = (champion or {}).get("path")
    not_held_out = gate.not_held_out(ctx.spec)
    if not_held_out:
        log(f"evaluate: not held out: {not_held_out}; the gate does not promote on it")
    log(
        f"evaluate: {'eval' if not_held_out else 'held-out'} loss {result['eval_loss_before']:.4f} -> "
        f"{result['eval_loss_after']:.4f}  "
        f"perplexity {result['perplexity_before']:.2f} -> {result['perplexity_after']:.2f}"
        + (f"  ({gate.CHAMPION} {champion['ref']}: {result['champion_loss']:.4f})" if measured else "")
    )
    out = {"job": job["submission_id"], **result}
    if champion:
        out["champion"] = {k: v for k, v in champion.items() if k != "path"}
    if start:
        out["init_from"] = start["ref"]
    return out


RUNNERS: dict[str, Callable[[RunContext, str], dict[str, Any]]] = {
    "provision": _on_platform("provision"),
    "build_image": _on_platform("build_image"),
    "deploy_raycluster": _on_platform("deploy_raycluster"),
    "check_slice": check_slice,
    "train": train,
    "evaluate": evaluate,
    "register": register,
    "promote": promote,
    "teardown": _on_platform("teardown"),
}
assert tuple(RUNNERS) == STAGES


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
    pipeline knows beyond the spec that a stage takes as keyword arguments (``component.FACTS``: the job name, the
    source version).

    SIGINT, SIGTERM or SIGHUP ends a stage: what it started is stopped (``interrupts.on_interrupt`` where it waits),
    it is recorded ``interrupted`` and the process exits 128 + the signal's number; a stage that starts after the
    driver marked the run interrupted does not run. Teardown ignores Ctrl-C: the driver counts the presses."""
    if stage not in RUNNERS:
        raise ValueError(f"stage: unknown stage {stage!r} (valid: {', '.join(STAGES)})")
    if stage == "teardown":
        with interrupts.sigint_ignored():
            return _run_recorded(stage, preset, platform, overrides, run_id, job_name, output_root, upstream, facts)
    with interrupts.on_interrupt(lambda signum: log(f"{stage}: {interrupts.signal_name(signum)}: stopping"), log=log):
        return _run_recorded(stage, preset, platform, overrides, run_id, job_name, output_root, upstream, facts)


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
    rid, store = store_for(run_id, job_name, output_root)
    started = time.time()
    if stage == STAGES[0]:
        try:
            vertex_task.check_on_vertex(platform, output_root)
        except SpecError as exc:  # what the run's summary shows, when its state is in Cloud Storage
            record(store, stage, status="failed", seconds=0.0, run_id=rid, error=_error_text(exc))
            raise
    vertex_task.claim(store, rid, platform, job_name, first=stage == STAGES[0])  # before anything is written
    mark = interrupts.marked(store)
    if mark and (stage != "teardown" or mark.get("abandoned")):
        reason = (
            "teardown was abandoned"
            if mark.get("abandoned")
            else f"the run was interrupted ({mark['signal']} during {mark['stage']})"
        )
        record(store, stage, status="skipped", run_id=rid, reason=reason)
        log(f"== {stage}: not started: {reason}")
        raise interrupts.Interrupted(getattr(signal, mark["signal"]))
    record(store, stage, status="running", started=started, run_id=rid)
    log(f"== {stage} ({platform}, run {rid})")
    ctx = None
    try:
        ctx = stage_context(stage, preset, platform, overrides, run_id, job_name, output_root)
        with heartbeat.beating(store, stage):  # the janitor and a submit of this run id see it live
            if stage == STAGES[0]:
                gate.check_lineage(ctx)  # a scheduled run's champion is read when it starts, before any TPU is created
            result = RUNNERS[stage](ctx, upstream, **facts)
    except interrupts.Interrupted as exc:
        record(
            store,
            stage,
            status="interrupted",
            seconds=time.time() - started,
            signal=exc.signal_name,
            error=f"interrupted by {exc.signal_name}",
        )
        raise
    except BaseException as exc:
        record(store, stage, status="failed", seconds=time.time() - started, error=_error_text(exc))
        if stage == "teardown" and ctx is not None:
            _write_report(ctx)
        raise
    record(store, stage, status="succeeded", seconds=time.time() - started, result=result)
    if stage == "teardown":
        _write_report(ctx)
    return json.dumps(result)


def stage_context(
    stage: str, preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str
) -> RunContext:
    try:
        return context(preset, platform, overrides, run_id, job_name, output_root)
    except SpecError:
        if stage != "teardown":
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


def _error_text(exc: BaseException) -> str:
    from components.platforms.credentials import access_error

    exc = access_error(exc) or exc  # no credentials, no project, an API off, a permission denied: the fix, one line
    if isinstance(exc, TpupipeError):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _write_report(ctx: RunContext) -> None:
    from components.stages import report

    try:
        report.write(ctx)
    except Exception as exc:  # noqa: BLE001 - the report must never hide the teardown's own outcome
        print(f"teardown: could not write the run summary: {exc}", file=sys.stderr)
