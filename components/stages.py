"""The pipeline's stages as plain functions over the platform interface.

Each KFP component calls :func:`run_stage` with the pipeline parameters; everything a stage needs is derived
from them (spec from preset + overrides, run id from the job name), which is what lets ``teardown`` run in
an exit handler without any other task's output. Each stage records its status and duration in
``<run dir>/stages/<stage>.json``; teardown, which always runs last, writes the run's summary.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components import spec as specs
from components.platform import RunContext, get_platform, run_id_from
from trainers import protocol

STAGES = ("provision", "build_image", "deploy_raycluster", "train", "evaluate", "teardown")


def log(message: str) -> None:
    print(message, flush=True)


class JobFailed(RuntimeError):
    """A Ray job of the run ended FAILED or STOPPED; the message carries the job's own error."""


def run_dir_for(run_id: str, job_name: str, output_root: str) -> tuple[str, Path]:
    rid = run_id_from(run_id, job_name)
    return rid, Path(output_root or "runs").expanduser().resolve() / rid


def context(preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str) -> RunContext:
    rid, run_dir = run_dir_for(run_id, job_name, output_root)
    return RunContext(spec=specs.resolve(preset, overrides), run_id=rid, run_dir=run_dir, platform=platform)


def record(run_dir: Path, stage: str, **fields: Any) -> None:
    stages_dir = run_dir / "stages"
    stages_dir.mkdir(parents=True, exist_ok=True)
    path = stages_dir / f"{stage}.json"
    current = json.loads(path.read_text()) if path.is_file() else {"stage": stage}
    current.update(fields)
    path.write_text(json.dumps(current, indent=2, sort_keys=True))


# ---------------------------------------------------------------- Ray jobs


def run_job(ctx: RunContext, kind: str, entrypoint: str, timeout_s: float,
            on_record: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
    """Submit (or re-attach to) the run's ``kind`` job, stream its log to ours and to logs/<kind>.log,
    wait for a terminal state, and return its ``TPUPIPE result`` record. SIGTERM stops the job."""
    from ray.job_submission import JobStatus

    platform = get_platform(ctx.platform)
    client = platform.job_client(ctx)
    submission_id = f"{ctx.run_id}-{kind}"
    try:
        info = client.get_job_info(submission_id)
        log(f"{kind}: re-attaching to job {submission_id} ({info.status})")
    except Exception:
        client.submit_job(
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}},
            metadata={"tpupipe-run": ctx.run_id, "kind": kind},
        )
        log(f"{kind}: submitted Ray job {submission_id}")

    def stop(signum, _frame):
        log(f"{kind}: signal {signum}: stopping job {submission_id}")
        client.stop_job(submission_id)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop) if _main_thread() else None
    ctx.logs_dir.mkdir(parents=True, exist_ok=True)
    log_path = ctx.logs_dir / f"{kind}.log"
    seen = 0
    records: list[tuple[str, dict]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            status = client.get_job_status(submission_id)
            text = client.get_job_logs(submission_id)
            new = text[seen:]
            if new:
                seen = len(text)
                log_path.write_text(text)
                lines = new.splitlines()
                for line in lines:
                    print(f"  [{kind}] {line}", flush=True)
                for rec in protocol.parse(lines):
                    records.append(rec)
                    if on_record:
                        on_record(*rec)
            if status.is_terminal():
                break
            if time.monotonic() > deadline:
                client.stop_job(submission_id)
                raise JobFailed(f"{kind}: job {submission_id} ran past its deadline of {timeout_s:.0f}s; stopped")
            time.sleep(1.0)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    info = client.get_job_info(submission_id)
    if info.status != JobStatus.SUCCEEDED:
        tail = "\n".join(text.splitlines()[-25:])
        raise JobFailed(f"{kind}: Ray job {submission_id} {info.status}: {info.message}\n"
                        f"--- last lines of {log_path} ---\n{tail}")
    result = next((p for k, p in reversed(records) if k == "result"), None)
    if result is None:
        raise JobFailed(f"{kind}: job {submission_id} succeeded but printed no result record")
    return {"submission_id": submission_id, "records": records, "result": result}


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ---------------------------------------------------------------- the stages


def provision(ctx: RunContext) -> dict[str, Any]:
    return get_platform(ctx.platform).provision(ctx)


def build_image(ctx: RunContext) -> dict[str, Any]:
    return get_platform(ctx.platform).build_image(ctx)


def deploy_raycluster(ctx: RunContext) -> dict[str, Any]:
    return get_platform(ctx.platform).deploy_raycluster(ctx)


def _entrypoint(ctx: RunContext, mode: str, checkpoint: str = "") -> str:
    from components.derivations import job_command

    out = get_platform(ctx.platform).job_output_dir(ctx)
    return job_command(ctx.spec, mode, out, ctx.run_id, checkpoint)


def history(records: list[tuple[str, dict]]) -> list[dict]:
    """Per-epoch (FSDP) or per-step (MaxText) metric records in order; after a restart, the figures of a
    re-run epoch or step replace the earlier ones."""
    latest: dict[int, dict] = {}
    for kind, payload in records:
        if kind == "metric":
            latest[payload.get("epoch", payload.get("step"))] = payload
    return [latest[k] for k in sorted(latest)]


def train(ctx: RunContext) -> dict[str, Any]:
    t = ctx.spec.train
    total = ctx.spec.maxtext.steps if t.workload == "maxtext" else t.epochs

    shown: set[tuple] = set()  # Ray may forward a worker's line twice; a re-run step after a restart differs

    def progress(kind: str, p: dict) -> None:
        unit, index = ("step", p["step"] + 1) if "step" in p else ("epoch", p.get("epoch"))
        if kind != "metric" or (unit, index, p["loss"]) in shown:
            return
        shown.add((unit, index, p["loss"]))
        seconds = p.get("epoch_s", p.get("step_s", 0.0))
        log(f"train: {unit} {index}/{total}  loss {p['loss']:.4f}  {p['tokens_per_s']:.0f} tokens/s  ({seconds:.2f}s)")

    job = run_job(ctx, "train", _entrypoint(ctx, "train"), t.timeout_s, progress)
    rows = history(job["records"])
    return {
        "job": job["submission_id"],
        "checkpoint": job["result"]["checkpoint"],
        "history": rows,
        "losses": [r["loss"] for r in rows],
        "tokens_per_s": rows[-1]["tokens_per_s"] if rows else None,
        "device": job["result"]["device"],
        "backend": job["result"]["backend"],
        "num_workers": job["result"]["num_workers"],
    }


def evaluate(ctx: RunContext, train_result: dict[str, Any]) -> dict[str, Any]:
    if not train_result.get("checkpoint"):
        raise RuntimeError("evaluate: the train stage reported no checkpoint")
    entrypoint = _entrypoint(ctx, "eval", checkpoint=train_result["checkpoint"])
    job = run_job(ctx, "evaluate", entrypoint, ctx.spec.train.timeout_s)
    result = job["result"]
    log(f"evaluate: held-out loss {result['eval_loss_before']:.4f} -> {result['eval_loss_after']:.4f}  "
        f"perplexity {result['perplexity_before']:.2f} -> {result['perplexity_after']:.2f}")
    return {"job": job["submission_id"], **result}


def teardown(ctx: RunContext) -> dict[str, Any]:
    return get_platform(ctx.platform).teardown(ctx)


# ---------------------------------------------------------------- what a component calls


def run_stage(stage: str, preset: str, platform: str, overrides: str, run_id: str, job_name: str,
              output_root: str, upstream: str = "") -> str:
    """Resolve the context, run one stage with its record kept, return its result as JSON."""
    if stage not in STAGES:
        raise ValueError(f"stage: unknown stage {stage!r} (valid: {', '.join(STAGES)})")
    rid, run_dir = run_dir_for(run_id, job_name, output_root)
    started = time.time()
    record(run_dir, stage, status="running", started=started, run_id=rid)
    log(f"== {stage} ({platform}, run {rid})")
    ctx = None
    try:
        try:
            ctx = context(preset, platform, overrides, run_id, job_name, output_root)
        except specs.SpecError:
            if stage != "teardown":
                raise
            # Teardown needs only the run id: it still cleans up after a run whose input was bad.
            ctx = RunContext(spec=specs.RunSpec(name=preset), run_id=rid, run_dir=run_dir, platform=platform)
        if stage == "evaluate":
            result = evaluate(ctx, json.loads(upstream))
        else:
            result = globals()[stage](ctx)
    except BaseException as exc:
        record(run_dir, stage, status="failed", seconds=time.time() - started, error=_error_text(exc))
        if stage == "teardown" and ctx is not None:
            _write_report(ctx)
        raise
    record(run_dir, stage, status="succeeded", seconds=time.time() - started, result=result)
    if stage == "teardown":
        _write_report(ctx)
    return json.dumps(result)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, JobFailed | specs.SpecError):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _write_report(ctx: RunContext) -> None:
    from components import report

    try:
        report.write(ctx)
    except Exception as exc:  # the report must never hide the teardown's own outcome
        print(f"teardown: could not write the run summary: {exc}", file=sys.stderr)
