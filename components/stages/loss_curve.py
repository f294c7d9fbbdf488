"""The loss curve: a PNG of the training loss (per epoch or per step, restarts marked) with the held-out losses, the
self-contained HTML page around it (the train stage's HTML artifact, ``loss.html`` of the run), and the columns of
the metric table the page and the run's text table show."""

from __future__ import annotations

import html
from typing import Any


def loss_png(summary: dict[str, Any]) -> bytes:
    """The loss curve (PNG): training loss per epoch or step, and the held-out losses when known."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s for s in summary.get("steps") or [] if s.get("loss") is not None]
    unit = "step" if steps else history_unit(summary["history"])
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if steps:  # one point per step; where a worker group took over after a restart, a line
        xs = [s["step"] for s in steps]
        ax.plot(xs, [s["loss"] for s in steps], marker="o" if len(xs) < 30 else None, label="train loss")
        for n, s in enumerate(r for r, prev in zip(steps[1:], steps, strict=False) if r["group"] != prev["group"]):
            ax.axvline(s["step"] - 0.5, color="red", linestyle="-.", label="restart" if n == 0 else None)
    else:
        xs = [row[unit] for row in summary["history"]]
        label = "train loss (epoch mean)" if unit == "epoch" else "train loss"
        ax.plot(xs, summary["train_losses"], marker="o" if len(xs) < 30 else None, label=label)
    for key, style, text in (
        ("eval_loss_before", ":", "held-out, untrained"),
        ("eval_loss_after", "--", "held-out, trained"),
    ):
        if summary.get(key) is not None:
            ax.axhline(summary[key], linestyle=style, color="gray" if "before" in key else "green", label=text)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(unit)
    ax.set_ylabel("loss")
    if unit == "epoch":
        ax.set_xticks(xs)
    ax.set_title(f"{summary['preset']} — {summary['run_id']}")
    ax.legend()
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def loss_html(summary: dict[str, Any], png: bytes) -> str:
    """One self-contained page (the PNG inline): what the Vertex UI shows for the HTML artifact."""
    import base64

    columns = metric_columns(summary["history"])
    head = "".join(f"<th>{html.escape(title)}</th>" for title, _key, _fmt in columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{fmt.format(row.get(key, 0))}</td>" for _t, key, fmt in columns) + "</tr>"
        for row in summary["history"]
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>tpupipe "
        f"{html.escape(summary['run_id'])}</title></head><body>"
        f"<h1>{html.escape(summary['preset'])} — {html.escape(summary['run_id'])}</h1>"
        f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}' alt='loss curve'>"
        f"<table border='1'><tr>{head}</tr>{rows}</table>"
        f"<p>{'eval loss (not held out)' if summary.get('eval_not_held_out') else 'held-out loss'}: "
        f"{number(summary.get('eval_loss_before'))} untrained, {number(summary.get('eval_loss_after'))} trained</p>"
        "</body></html>"
    )


def history_unit(history: list[dict[str, Any]]) -> str:
    return "epoch" if history and "epoch" in history[0] else "step"


def metric_columns(history: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(title, key, format) of the metric table: per epoch for FSDP, per step (MaxText's figures) for MaxText."""
    if history_unit(history) == "epoch":
        return [
            ("epoch", "epoch", "{}"),
            ("loss", "loss", "{:.4f}"),
            ("seconds", "epoch_s", "{:.1f}"),
            ("tokens/s", "tokens_per_s", "{:.0f}"),
        ]
    return [
        ("step", "step", "{}"),
        ("loss", "loss", "{:.4f}"),
        ("seconds", "step_s", "{:.3f}"),
        ("tokens/s", "tokens_per_s", "{:.0f}"),
        ("tok/s/dev", "tokens_per_s_per_device", "{:.1f}"),
        ("TFLOP/s/dev", "tflops_per_s_per_device", "{:.4f}"),
    ]


def number(value: float | None, digits: int = 4) -> str:
    """A loss or perplexity to ``digits`` places, or "-" when unknown."""
    return "-" if value is None else f"{value:.{digits}f}"
