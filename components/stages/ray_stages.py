"""The stages that are Ray jobs on the run's cluster, the same on every platform: ``check_slice`` (every device of
the slice, before training), ``train`` (the trainer) and ``evaluate`` (held-out loss before and after training, and
the champion's beside them). Each submits its job through the Jobs API and follows it (``components.stages.jobs``);
its log is ``logs/<stage>.log`` of the run's store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from components.platforms import RunContext, get_platform
from components.spec import InfraError, RunSpec
from components.stages import dataset, gate, goodput, progress
from components.stages.jobs import JobFailed, log, run_job


def entrypoint(ctx: RunContext, mode: str, checkpoint: str = "", init_from: str = "", champion: str = "") -> str:
    """The command of the run's ``mode`` (check, train or eval) job, as the stage submits it."""
    from components.platforms.store import read_json
    from components.spec.images import pinned_image
    from components.workload import cache
    from components.workload.derive import job_command

    platform = get_platform(ctx.platform)
    image = pinned_image((read_json(ctx.store, "stages/build_image.json") or {}).get("result") or {}) or ""
    compiled = cache.directory(platform.compile_cache_root(ctx), ctx.spec, image) if image else ""
    out = platform.job_output_dir(ctx)
    return job_command(ctx.spec, mode, out, ctx.run_id, checkpoint, init_from, champion, compiled)


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
        log(f"check_slice: {bandwidth_line(r)}")
    return {"job": job["submission_id"], **r}


def bandwidth_line(check: dict[str, Any]) -> str:
    """The slice check's timed all-reduce and its floor, in words."""
    figure = check.get("gbytes_per_s")
    measured = "one rank, no link to time" if figure is None else f"{figure:.3g} GB/s on the slowest rank"
    size = f"all-reduce of {check['bandwidth_bytes'] // 2**20} MiB: {measured}"
    if check.get("floor_gbytes_per_s") is None:
        return f"{size}, held to no floor ({check.get('floor_source') or 'none known'})"
    return f"{size}, floor {check['floor_gbytes_per_s']:.3g} GB/s ({check['floor_source']})"


def train(ctx: RunContext, _upstream: str = "") -> dict[str, Any]:
    """The trainer as a Ray job; ``train.init_from`` is resolved to a registered version's checkpoint now."""
    t = ctx.spec.train
    start = gate.starting_point(ctx)
    if start:
        log(f"train: starting from {start['ref']} ({start['artifact_uri']}; held-out loss {start['eval_loss']})")

    dataset.stage_files(ctx)  # the snapshot's examples where the jobs read them
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
