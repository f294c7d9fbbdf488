"""The run's summary: ``summary.json`` for scripts, a loss plot (PNG + HTML page), and the text table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.platforms import RunContext, get_platform, interrupts
from components.platforms.store import read_json, write_text
from components.stages import gate as gate_rules
from components.stages import goodput, timeline
from components.stages.dataset import SKIP
from components.stages.loss_curve import loss_html, loss_png, metric_columns, number
from components.stages.ray_stages import bandwidth_line
from components.stages.table import STAGES

# what the summary keeps of snapshot_data's result (dataset.outcome)
DATA_FIGURES: tuple[str, ...] = ("dataset", "snapshot", "manifest", "eval_snapshot", "num_examples", "duplicates")
DATA_FIGURES += ("eval_overlap", "card")


def summarize(ctx: RunContext) -> dict[str, Any]:
    stages, results, records = [], {}, {}
    for name in STAGES:
        rec = records[name] = read_json(ctx.store, f"stages/{name}.json") or {"status": "skipped"}
        entry = {
            "name": name,
            "status": rec.get("status", "unknown"),
            "started": rec.get("started"),
            "seconds": rec.get("seconds"),
        }
        if rec.get("error"):
            entry["error"] = rec["error"]
        if rec.get("signal"):
            entry["signal"] = rec["signal"]
        if (rec.get("result") or {}).get("capacity_wait"):  # deploy_raycluster: when its pods waited for nodes
            entry["capacity_wait"] = rec["result"]["capacity_wait"]
        stages.append(entry)
        results[name] = rec.get("result") or {}
    train, ev = results["train"], results["evaluate"]
    gate = gate_summary(results["register"], results["promote"])
    for s in stages:  # promote runs only when the gate says so: not running otherwise is how it succeeds
        if s["name"] == "promote" and s["status"] == "skipped" and gate.get("decision") in ("keep", "off"):
            s["reason"] = gate["reason"]
    data = results["snapshot_data"]
    skipped = data.get("proceed") == SKIP  # nothing new since the champion: the run ended after its snapshot
    for s in stages:
        if skipped and s["status"] == "skipped":
            s["reason"] = data["reason"]
    ok = all(s["status"] == "succeeded" or s.get("reason") for s in stages)
    interrupted = _interrupted(stages, interrupts.marked(ctx.store))
    return {
        "run_id": ctx.run_id,
        "preset": ctx.spec.name,
        "platform": ctx.platform,
        "status": "interrupted" if interrupted else ("skipped" if skipped else "succeeded") if ok else "failed",
        "skipped": data["reason"] if skipped else None,
        "warning": data.get("warning"),  # a skipped run after too many (dataset.skip_streak)
        "data": {k: data.get(k) for k in DATA_FIGURES},
        "interrupted": interrupted,
        "run_dir": ctx.store.uri,
        "stages": stages,
        "train_losses": train.get("losses", []),
        "history": train.get("history", []),
        "steps": train.get("steps", []),
        "train_timeline": train.get("timeline"),
        "goodput": goodput.ledger(records, *billing(ctx)),
        "tokens_per_s": train.get("tokens_per_s"),
        "train_seconds": next(s["seconds"] for s in stages if s["name"] == "train"),
        "restarts": train.get("restarts", 0),
        "checkpoint": train.get("checkpoint"),
        "checkpoint_uri": train.get("checkpoint_uri"),
        "eval_loss_before": ev.get("eval_loss_before"),
        "eval_loss_after": ev.get("eval_loss_after"),
        "perplexity_before": ev.get("perplexity_before"),
        "perplexity_after": ev.get("perplexity_after"),
        "eval_not_held_out": gate_rules.not_held_out(ctx.spec),  # why the eval figures are no held-out ones
        "init_from": ev.get("init_from"),
        "task": ev.get("task"),  # the answers' task metrics (components.stages.answers)
        "gate": gate,
        "slice_check": slice_check(results["check_slice"], ctx),
        "before_training": before_training(ctx, read_json(ctx.store, "stages/provision.json") or {}, train),
        "deleted": results["teardown"].get("deleted", []),
        "spec": ctx.spec.to_dict(),
    }


def billing(ctx: RunContext) -> tuple[int, float | None, str]:
    """(chips, the hourly price of all the run's resources, what the chips are) for the goodput ledger: the slice's
    TPU chips (a CPU cluster's hosts) at the plan's list prices, None when its table lacks one; on the local
    platform the same count, emulated, at zero."""
    from components.workload import derive as d

    tpu = d.is_tpu(ctx.spec)
    chips = d.slice_shape(ctx.spec).num_chips * ctx.spec.cluster.num_slices if tpu else ctx.spec.total_hosts
    kind = "TPU chip" if tpu else "host"
    if ctx.platform == "local":
        kind = f"emulated {kind}"
    try:  # the price the run's budget is counted at: 0.0 where nothing bills, None where a price is unknown
        return chips, get_platform(ctx.platform).limits(ctx).usd_per_hour, kind
    except Exception:  # noqa: BLE001 - a price the summary cannot know is shown as unknown, never fails the report
        return chips, None, kind


SLICE_CHECK_FIGURES = (
    "ok",
    "device",
    "backend",
    "num_ranks",
    "num_hosts",
    "num_devices",
    "ranks_verified",
    "max_abs_diff",
    "all_reduce",
    "expected_all_reduce",
    "devices_checked",
    "bandwidth_bytes",
    "gbytes_per_s",
    "floor_gbytes_per_s",
    "floor_source",
    "seconds",
    "bad",
)


GATE_FIGURES = (
    "model",
    "version",
    "ref",
    "registry",
    "decision",
    "reason",
    "eval_loss",
    "champion_loss",
    "champion_ref",
    "improvement",
    "min_improvement",
    "held_out",
    # which figure decided, each guard with its difference from the champion and whether it held, the first that
    # failed (components.stages.task_gate.decide)
    "decided_by",
    "guards",
    "guard_failed",
)


def gate_summary(registered: dict[str, Any], promoted: dict[str, Any]) -> dict[str, Any]:
    """The register stage's figures and the gate's decision, and whether the champion moved (``promoted``: True,
    False when promote found the champion moved since evaluation, None when it did not run)."""
    if not registered:
        return {}
    out = {k: registered[k] for k in GATE_FIGURES if k in registered}
    out["promoted"] = promoted.get("promoted") if promoted else None
    if promoted and not promoted.get("promoted"):
        out["reason"] = promoted.get("reason", out.get("reason"))
    return out


def slice_check(result: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
    """The check_slice stage's figures, or why there are none."""
    if result.get("skipped") or not ctx.spec.cluster.slice_check:
        return {"skipped": True, "reason": "cluster.slice_check=false"}
    return {k: result[k] for k in SLICE_CHECK_FIGURES if k in result}


def before_training(ctx: RunContext, provision: dict[str, Any], train: dict[str, Any]) -> dict[str, Any] | None:
    """The TPU chips billed before the first training step: from provision's end (the TPU node pools exist) to the
    trainer's first step, chips x minutes (at most: flex-start and Autopilot nodes bill only once they come). None
    for cpu hosts, or when the run did not reach a step."""
    from components.workload import derive as d

    first = train.get("first_step_at")
    if not d.is_tpu(ctx.spec) or first is None or provision.get("status") != "succeeded":
        return None
    shape = d.slice_shape(ctx.spec)
    chips = shape.num_chips * ctx.spec.cluster.num_slices
    minutes = max(0.0, first - provision["started"] - provision["seconds"]) / 60
    return {"chips": chips, "minutes": round(minutes, 2), "chip_minutes": round(chips * minutes, 1)}


def _interrupted(stages: list[dict[str, Any]], mark: dict[str, Any] | None) -> dict[str, str] | None:
    """``{stage, signal}`` of the interrupt that ended the run: the stage's own record says so, or the driver's mark
    does (the signal reached the stage before it could record it)."""
    if mark:
        for s in stages:
            if s["name"] == mark["stage"] and s["status"] in ("running", "failed", "skipped"):
                s["status"] = "interrupted"
        return {"stage": mark["stage"], "signal": mark["signal"]}
    stage = next((s for s in stages if s["status"] == "interrupted"), None)
    return {"stage": stage["name"], "signal": stage.get("signal", "")} if stage else None


def write(ctx: RunContext) -> dict[str, Any]:
    summary = summarize(ctx)
    run_dir = ctx.store.local()
    checkpoint = Path(summary["checkpoint"]) if summary["checkpoint"] else None
    if run_dir and checkpoint and checkpoint.is_dir() and checkpoint.is_relative_to(run_dir):
        link = run_dir / "checkpoint"  # a stable name for the final checkpoint inside the run directory
        link.unlink(missing_ok=True)
        link.symlink_to(checkpoint.relative_to(run_dir))
        summary["final_checkpoint"] = str(link)
    summary["plots"] = {"timeline": write_text(ctx.store, "timeline.html", timeline.page(summary), "text/html")}
    if summary["train_losses"]:
        png = loss_png(summary)
        summary["plots"] |= {
            "png": ctx.store.write_bytes("loss.png", png, "image/png"),
            "html": write_text(ctx.store, "loss.html", loss_html(summary, png), "text/html"),
        }
    write_text(ctx.store, "summary.json", json.dumps(summary, indent=2), "application/json")
    return summary


def _shown(history: list[dict[str, Any]], most: int = 12) -> list[dict[str, Any]]:
    """Every row when few, else evenly spaced rows and the last."""
    if len(history) <= most:
        return history
    stride = -(-len(history) // most)
    return history[::stride] + ([history[-1]] if (len(history) - 1) % stride else [])


def gate_lines(summary: dict[str, Any]) -> list[str]:
    """Where the model went and why: the version registered, the gate's decision with both figures, and each of
    ``gate.guards`` with its difference from the champion and whether it held."""
    gate = summary.get("gate") or {}
    if not gate:
        return []
    if gate.get("decision") == "off":
        return ["", f"  gate                 off ({gate['reason']})"]
    lines = [""]
    if summary.get("init_from"):
        lines.append(f"  started from         {summary['init_from']}")
    lines += [f"  registered           {gate.get('ref')} in {gate.get('registry')}", f"  gate: {gate.get('reason')}"]
    for guard in gate.get("guards") or []:
        held = "held" if guard["held"] else "failed"
        lines.append(f"  gate guard           {guard['guard']} {held} (difference {guard['difference']:+.4f})")
    return lines


def task_lines(summary: dict[str, Any]) -> list[str]:
    """The task metrics of the answers to the evaluation prompts: before training (or the champion) and after, and
    where the side-by-side page is."""
    task = summary.get("task") or {}
    after = task.get("metrics_after") or {}
    if not after:
        return []
    before = task.get("metrics_before") or {}
    champion = (task.get("metrics_other") or {}) if task.get("against") == "champion" else {}
    start = "at start" if summary.get("init_from") else "untrained"
    lines = ["", f"  task metrics         {task.get('num_examples')} answers to the evaluation prompts"]
    for name, value in after.items():
        row = (task.get("comparison") or {}).get(name)
        interval = f"   [{row['low']:+.3f}, {row['high']:+.3f}] vs {task['against']}" if row else ""
        lines.append(
            f"  {name:<20} "
            + (f"{start} {before[name]:.3f}   " if name in before else "")
            + f"trained {value:.3f}"
            + (f"   champion {champion[name]:.3f}" if name in champion else "")
            + interval
        )
    if task.get("side_by_side"):
        lines.append(f"  side by side         {task['side_by_side']}")
    return lines


def format_table(summary: dict[str, Any]) -> str:
    lines = ["", f"tpupipe run {summary['run_id']}  preset {summary['preset']}  platform {summary['platform']}"]
    lines.append(f"  {'stage':<20} {'status':<10} {'seconds':>8}")
    for s in summary["stages"]:
        secs = "-" if s["seconds"] is None else f"{s['seconds']:.1f}"
        lines.append(f"  {s['name']:<20} {s['status']:<10} {secs:>8}")
    data = summary.get("data") or {}
    if data.get("snapshot") and not summary.get("skipped"):  # a skipped run's status line says what it found
        lines.append(
            f"\n  data                 {data['dataset']}: snapshot {data['snapshot']}"
            + (f", {data['num_examples']} examples" if data.get("num_examples") is not None else "")
        )
        if data.get("duplicates") or data.get("eval_overlap") or data.get("champion_duplicates"):
            seen = data.get("champion_duplicates")
            lines.append(
                f"  dropped              {data.get('duplicates') or 0} duplicate(s), "
                + (f"{seen} the champion already saw, " if seen else "")
                + f"{data.get('eval_overlap') or 0} also in the evaluation set"
            )
        if data.get("eval_snapshot"):
            lines.append(f"  evaluation set       snapshot {data['eval_snapshot']}")
        if data.get("card"):
            lines.append(f"  data card            {data['card']}")
    check = summary.get("slice_check") or {}
    if check.get("skipped"):
        lines.append(f"\n  slice check          off ({check['reason']})")
    elif "ranks_verified" in check:
        lines.append(
            f"\n  slice check          {check['ranks_verified']}/{check['num_ranks']} ranks verified, max abs "
            f"difference {check['max_abs_diff']:.3g}, all-reduce {check['all_reduce']:g} (expected "
            f"{check['expected_all_reduce']}), {check['seconds']:.1f}s"
        )
        if "bandwidth_bytes" in check:
            lines.append(f"  slice bandwidth      {bandwidth_line(check)}")
    before = summary.get("before_training")
    if before:
        lines.append(
            f"  before training      {before['chips']} chips x {before['minutes']:.1f} min = "
            f"{before['chip_minutes']:g} chip-minutes billed, from the TPU node pools to the first training step"
        )
    failed = [s for s in summary["stages"] if s.get("error") and s["status"] == "failed"]
    for s in failed:
        lines.append(f"\n  {s['name']} failed: {s['error']}")
    if summary["history"]:
        columns = metric_columns(summary["history"])
        lines += ["", "  " + " ".join(f"{title:>11}" for title, _key, _fmt in columns)]
        for row in _shown(summary["history"]):
            lines.append("  " + " ".join(f"{fmt.format(row.get(key, 0)):>11}" for _t, key, fmt in columns))
    if summary.get("eval_loss_before") is not None:
        before = "at start" if summary.get("init_from") else "untrained"
        champion = (summary.get("gate") or {}).get("champion_loss")
        what = "eval" if summary.get("eval_not_held_out") else "held-out"
        lines += [
            "",
            f"  {what + ' loss':<20} {before} {number(summary['eval_loss_before'])}   "
            f"trained {number(summary['eval_loss_after'])}"
            + (f"   champion {number(champion)}" if champion is not None else ""),
            f"  {what + ' perplexity':<20} {before} {number(summary['perplexity_before'], 2)}   "
            f"trained {number(summary['perplexity_after'], 2)}",
        ]
        if summary.get("eval_not_held_out"):
            lines.append(f"  not held out: {summary['eval_not_held_out']}")
    lines += task_lines(summary)
    if summary.get("tokens_per_s") and not any("tokens_per_s" in row for row in summary["history"]):
        lines.append(f"  tokens/s (last epoch) {summary['tokens_per_s']:.0f}")
    lines += gate_lines(summary) or [""]
    lines += [text for text in [goodput.line(summary.get("goodput"))] if text]
    if summary["status"] not in ("succeeded", "skipped"):
        deleted = summary.get("deleted") or []
        lines.append(f"\n  cleaned up: {', '.join(deleted) if deleted else 'nothing was left to delete'}")
    status = summary["status"]
    if summary.get("interrupted"):
        status += " during {stage} ({signal})".format(**summary["interrupted"])
    if summary.get("skipped"):
        status += f" ({summary['skipped']})"
    if summary.get("warning"):
        lines.append(summary["warning"])
    lines += ["", f"status: {status}", summary["run_dir"]]
    return "\n".join(lines)
