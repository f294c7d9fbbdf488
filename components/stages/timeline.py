"""The run's timeline as one self-contained HTML page (inline SVG, no script, nothing fetched): one lane per stage,
the trainer's steps, checkpoints and worker-group restarts in the train lane, failed stages in red, and the goodput
ledger's table beneath. Written beside ``summary.json`` and as the teardown task's HTML artifact in the Vertex AI UI.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

WIDTH, LANE, LEFT = 900, 28, 140
COLOURS = {"succeeded": "#4c8bf5", "failed": "#d93025", "interrupted": "#f29900", "running": "#9aa0a6"}


def page(summary: dict[str, Any]) -> str:
    stages = [s for s in summary["stages"] if s.get("started") is not None and s.get("seconds") is not None]
    title = f"tpupipe {summary['run_id']}: timeline"
    if not stages:
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
            "<p>No stage recorded its times.</p></body></html>"
        )
    lo: float = min(s["started"] for s in stages)
    hi: float = max(s["started"] + s["seconds"] for s in stages)
    scale = (WIDTH - LEFT - 10) / max(hi - lo, 1e-9)

    def x(t: float) -> float:
        return LEFT + (t - lo) * scale

    parts = []
    for i, s in enumerate(stages):
        y = 20 + i * LANE
        colour = COLOURS.get(s["status"], "#9aa0a6")
        parts.append(f"<text x='4' y='{y + 15}' font-size='12'>{html.escape(s['name'])}</text>")
        parts.append(
            f"<rect x='{x(s['started']):.1f}' y='{y}' width='{max(s['seconds'] * scale, 1):.1f}' height='{LANE - 8}' "
            f"fill='{colour}' opacity='0.35'><title>{html.escape(s['name'])}: {s['status']}, "
            f"{s['seconds']:.1f}s</title></rect>"
        )
        if s["name"] == "train":
            parts += _train_marks(summary.get("train_timeline") or {}, x, y)
    height = 40 + len(stages) * LANE
    axis = f"<text x='{LEFT}' y='{height - 4}' font-size='11'>0 s</text>"
    axis += f"<text x='{WIDTH - 60}' y='{height - 4}' font-size='11'>{hi - lo:.0f} s</text>"
    svg = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' "
        f"font-family='sans-serif'>{''.join(parts)}{axis}</svg>"
    )
    legend = (
        "<p>Train lane: thin ticks are training steps (grey: repeated after a restart, not kept), green diamonds "
        "checkpoint saves, red lines a worker group starting again after a failure.</p>"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(summary['preset'])} — {html.escape(summary['run_id'])}</h1>{svg}{legend}"
        f"{_ledger_table(summary.get('goodput'))}</body></html>"
    )


def _train_marks(timeline: dict[str, Any], x: Callable[[float], float], y: int) -> list[str]:
    """Steps (ticks; a step a later worker group ran again in grey), checkpoints (diamonds), restarts (red lines)."""
    marks = []
    steps = timeline.get("steps") or []
    last_time = {}
    for s in steps:
        last_time[s["step"]] = s["time"]
    for s in steps:
        colour = "#202124" if last_time[s["step"]] == s["time"] else "#bdc1c6"
        marks.append(
            f"<line x1='{x(s['time']):.1f}' x2='{x(s['time']):.1f}' y1='{y + 4}' y2='{y + LANE - 12}' "
            f"stroke='{colour}' stroke-width='1'><title>step {s['step']}</title></line>"
        )
    for c in timeline.get("checkpoints") or []:
        cx, cy = x(c["time"]), y + LANE - 10
        marks.append(
            f"<polygon points='{cx:.1f},{cy - 5} {cx + 4:.1f},{cy} {cx:.1f},{cy + 5} {cx - 4:.1f},{cy}' "
            f"fill='#188038'><title>checkpoint (step {c.get('step')}, {c['seconds']:.2f}s)</title></polygon>"
        )
    for g in (timeline.get("groups") or [])[1:]:
        marks.append(
            f"<line class='restart' x1='{x(g):.1f}' x2='{x(g):.1f}' y1='{y - 2}' y2='{y + LANE - 4}' "
            "stroke='#d93025' stroke-width='2'><title>restart: a new worker group</title></line>"
        )
    return marks


def _ledger_table(g: dict[str, Any] | None) -> str:
    if not g:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(c['name'])}</td><td>{c['seconds']:.1f}</td><td>{c['chip_s']:.0f}</td>"
        f"<td>{'-' if c['usd'] is None else f'{c["usd"]:.2f}'}</td><td>{html.escape(c['what'])}</td></tr>"
        for c in g["categories"]
    )
    share = "-" if g["goodput"] is None else f"{g['goodput']:.1%}"
    return (
        f"<h2>Goodput {share}</h2><table border='1'><tr><th>category</th><th>seconds</th>"
        f"<th>chip-seconds billed</th><th>USD</th><th>what</th></tr>{rows}</table>"
    )
