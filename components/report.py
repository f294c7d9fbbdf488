"""The run's summary: ``summary.json`` for scripts, a loss plot (PNG + HTML page), and the text table."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from components.platform import RunContext

STAGE_ORDER = ("provision", "build_image", "deploy_raycluster", "train", "evaluate", "teardown")


def summarize(ctx: RunContext) -> dict[str, Any]:
    stages, results = [], {}
    for name in STAGE_ORDER:
        path = ctx.stages_dir / f"{name}.json"
        rec = json.loads(path.read_text()) if path.is_file() else {"status": "skipped"}
        entry = {"name": name, "status": rec.get("status", "unknown"), "seconds": rec.get("seconds")}
        if rec.get("error"):
            entry["error"] = rec["error"]
        stages.append(entry)
        results[name] = rec.get("result") or {}
    train, ev = results["train"], results["evaluate"]
    ok = all(s["status"] == "succeeded" for s in stages)
    return {
        "run_id": ctx.run_id,
        "preset": ctx.spec.name,
        "platform": ctx.platform,
        "status": "succeeded" if ok else "failed",
        "run_dir": str(ctx.run_dir),
        "stages": stages,
        "train_losses": train.get("losses", []),
        "epochs": train.get("epochs", []),
        "tokens_per_s": train.get("tokens_per_s"),
        "checkpoint": train.get("checkpoint"),
        "eval_loss_before": ev.get("eval_loss_before"),
        "eval_loss_after": ev.get("eval_loss_after"),
        "perplexity_before": ev.get("perplexity_before"),
        "perplexity_after": ev.get("perplexity_after"),
        "spec": ctx.spec.to_dict(),
    }


def write(ctx: RunContext) -> dict[str, Any]:
    summary = summarize(ctx)
    checkpoint = Path(summary["checkpoint"]) if summary["checkpoint"] else None
    if checkpoint and checkpoint.is_dir() and checkpoint.is_relative_to(ctx.run_dir):
        link = ctx.run_dir / "checkpoint"  # a stable name for the final checkpoint inside the run directory
        link.unlink(missing_ok=True)
        link.symlink_to(checkpoint.relative_to(ctx.run_dir))
        summary["final_checkpoint"] = str(link)
    if summary["train_losses"]:
        summary["plots"] = _plot(summary, ctx.run_dir)
    (ctx.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _plot(summary: dict[str, Any], run_dir: Path) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [e["epoch"] for e in summary["epochs"]]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(epochs, summary["train_losses"], marker="o", label="train loss (epoch mean)")
    for key, style, label in (("eval_loss_before", ":", "held-out, untrained"),
                              ("eval_loss_after", "--", "held-out, fine-tuned")):
        if summary.get(key) is not None:
            ax.axhline(summary[key], linestyle=style, color="gray" if "before" in key else "green", label=label)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_xticks(epochs)
    ax.set_title(f"{summary['preset']} — {summary['run_id']}")
    ax.legend()
    fig.tight_layout()
    png = run_dir / "loss.png"
    fig.savefig(png)
    plt.close(fig)
    rows = "".join(
        f"<tr><td>{e['epoch']}</td><td>{e['loss']:.4f}</td><td>{e['epoch_s']:.1f}</td>"
        f"<td>{e['tokens_per_s']:.0f}</td></tr>" for e in summary["epochs"]
    )
    page = run_dir / "loss.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>tpupipe "
        f"{html.escape(summary['run_id'])}</title></head><body>"
        f"<h1>{html.escape(summary['preset'])} — {html.escape(summary['run_id'])}</h1>"
        "<img src='loss.png' alt='loss per epoch'>"
        "<table border='1'><tr><th>epoch</th><th>loss</th><th>seconds</th><th>tokens/s</th></tr>"
        f"{rows}</table>"
        f"<p>held-out loss: {_fmt(summary.get('eval_loss_before'))} untrained, "
        f"{_fmt(summary.get('eval_loss_after'))} fine-tuned</p></body></html>"
    )
    return {"png": str(png), "html": str(page)}


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(summary: dict[str, Any]) -> str:
    lines = ["", f"tpupipe run {summary['run_id']}  preset {summary['preset']}  platform {summary['platform']}", ""]
    lines.append(f"  {'stage':<20} {'status':<10} {'seconds':>8}")
    for s in summary["stages"]:
        secs = "-" if s["seconds"] is None else f"{s['seconds']:.1f}"
        lines.append(f"  {s['name']:<20} {s['status']:<10} {secs:>8}")
    failed = [s for s in summary["stages"] if s.get("error")]
    for s in failed:
        lines.append(f"\n  {s['name']} failed: {s['error']}")
    if summary["epochs"]:
        lines += ["", f"  {'epoch':<6} {'loss':>8} {'seconds':>8} {'tokens/s':>10}"]
        for e in summary["epochs"]:
            lines.append(f"  {e['epoch']:<6} {e['loss']:>8.4f} {e['epoch_s']:>8.1f} {e['tokens_per_s']:>10.0f}")
    if summary.get("eval_loss_before") is not None:
        lines += [
            "",
            f"  held-out loss        untrained {_fmt(summary['eval_loss_before'])}   "
            f"fine-tuned {_fmt(summary['eval_loss_after'])}",
            f"  held-out perplexity  untrained {_fmt(summary['perplexity_before'], 2)}   "
            f"fine-tuned {_fmt(summary['perplexity_after'], 2)}",
        ]
    if summary.get("tokens_per_s"):
        lines.append(f"  tokens/s (last epoch) {summary['tokens_per_s']:.0f}")
    lines += ["", f"status: {summary['status']}", summary["run_dir"]]
    return "\n".join(lines)
