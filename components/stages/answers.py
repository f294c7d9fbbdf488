"""The answers to the evaluation prompts as the gate and a reviewer read them: the trained model's (the candidate) and
its champion's (or, without one, the model training started from), each scored by the task metrics in the trainer
(``trainers.generation``), compared here example by example.

A metric's difference is the mean of (candidate - other) over the examples both answered, with a paired bootstrap
interval: the example indices resampled with replacement, the same indices for both models, ``BOOTSTRAP_SAMPLES`` times
with a fixed seed, and the difference's quantiles (Efron and Tibshirani, "An Introduction to the Bootstrap", ch. 13;
numpy's ``Generator.integers``, https://numpy.org/doc/stable/reference/random/generated/numpy.random.Generator.integers
.html). The run keeps ``eval/answers.jsonl`` (each prompt, its reference, the candidate's and the other model's answers
and scores) and ``eval/side_by_side.md`` (the metrics table, then the examples, regressions first).

A champion's answers are read from where its run recorded them when its generation key (``trainers.generation.
generation_key``: the examples, tokenizer, lengths, dtypes, device, prompts and decoding) is this run's; otherwise it
answers again in the evaluation job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.platforms.store import RunStore, write_text
from components.spec import RunSpec
from components.spec.run_spec import HELDOUT_LOSS

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 0  # fixed: the same scores give the same interval in every run
CONFIDENCE = 0.95
ANSWERS = "eval/answers.jsonl"  # in the run's store
SIDE_BY_SIDE = "eval/side_by_side.md"
MIN_SHOWN = 16  # the fewest examples the side-by-side shows (all of them when fewer were answered)
SHOWN = 64  # the most


def from_records(records: list[tuple[str, dict]]) -> dict[str, dict[str, Any]]:
    """The ``answers`` events of a job's records by model (``before``, ``after``, ``champion``), the last of each."""
    found: dict[str, dict[str, Any]] = {}
    for kind, p in records:
        if kind == "event" and p.get("event") == "answers":
            found[p["which"]] = {k: v for k, v in p.items() if k not in ("event", "time")}
    return found


def read(path: str | None) -> list[dict[str, Any]] | None:
    """The answers at ``path`` (JSON lines), or None when there is no such file here."""
    if not path or not Path(path).is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def paired_bootstrap(
    candidate: list[float], other: list[float], samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float, float]:
    """(mean of candidate - other, and the low and high ends of its ``CONFIDENCE`` interval)."""
    import numpy as np

    a, b = np.asarray(candidate, dtype=float), np.asarray(other, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired scores must be two equal, non-empty lists: {a.shape} and {b.shape}")
    diff = a - b
    picks = np.random.default_rng(seed).integers(0, len(diff), (samples, len(diff)))
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(diff[picks].mean(axis=1), [tail, 1 - tail])
    return float(diff.mean()), float(low), float(high)


def compare(candidate: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each metric both sets of answers were scored by, over the examples both answered (the same prompts, in order):
    both means, the difference and its interval."""
    n = min(len(candidate), len(other))
    if any(candidate[i]["prompt"] != other[i]["prompt"] for i in range(n)):
        raise ValueError("the two sets of answers are not to the same prompts")
    table = {}
    for name in candidate[0]["scores"] if n else ():
        if name not in other[0]["scores"]:
            continue
        a = [candidate[i]["scores"][name] for i in range(n)]
        b = [other[i]["scores"][name] for i in range(n)]
        difference, low, high = paired_bootstrap(a, b)
        table[name] = {"candidate": sum(a) / n, "other": sum(b) / n, "difference": difference, "low": low, "high": high}
    return table


def primary_metric(spec: RunSpec, names: list[str]) -> str | None:
    """The metric the examples are ordered by: ``gate.metric`` when it is a task metric, else the first score in [0,
    1] of ``eval.metrics`` (answer_length is none)."""
    if spec.gate.metric != HELDOUT_LOSS and spec.gate.metric in names:
        return spec.gate.metric
    return next((n for n in names if n != "answer_length"), None)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or " "


def side_by_side(
    spec: RunSpec,
    table: dict[str, dict[str, float]],
    candidate: list[dict[str, Any]],
    other: list[dict[str, Any]],
    other_label: str,
    reason: str = "",
) -> str:
    """The Markdown a reviewer reads: the metrics table (candidate, the other model, difference, interval), then the
    examples side by side, regressions on the primary metric first."""
    level = f"{CONFIDENCE:.0%}"
    lines = [
        f"# {spec.model_name}: the trained model beside {other_label}",
        "",
        f"{len(candidate)} evaluation prompts, greedy decoding, at most {spec.eval.max_new_tokens} new tokens. "
        f"Difference: candidate - {other_label}, with its {level} paired bootstrap interval "
        f"({BOOTSTRAP_SAMPLES} resamples).",
    ]
    if reason:
        lines += ["", f"Gate: {reason}"]
    lines += ["", f"| metric | candidate | {other_label} | difference | {level} interval |", "|---|---|---|---|---|"]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['candidate']:.4f} | {row['other']:.4f} | {row['difference']:+.4f} | "
            f"[{row['low']:+.4f}, {row['high']:+.4f}] |"
        )
    primary = primary_metric(spec, list(table))
    n = min(len(candidate), len(other))

    def change(i: int) -> float:
        return candidate[i]["scores"][primary] - other[i]["scores"][primary] if primary else 0.0

    order = sorted(range(n), key=lambda i: (change(i), i))
    shown = order[: max(MIN_SHOWN, min(SHOWN, n))]
    regressions = sum(1 for i in range(n) if change(i) < 0)
    lines += [
        "",
        f"## Examples ({len(shown)} of {n}; ordered by {primary or 'index'}: {regressions} regressions first)",
        "",
        f"| # | prompt | reference | {other_label} | candidate | {primary or 'change'} change |",
        "|---|---|---|---|---|---|",
    ]
    for i in shown:
        c, o = candidate[i], other[i]
        lines.append(
            f"| {c['index']} | {_cell(c['prompt'])} | {_cell(c['reference'])} | {_cell(o['answer'])} | "
            f"{_cell(c['answer'])} | {change(i):+.2f} |"
        )
    return "\n".join(lines) + "\n"


def merged(candidate: list[dict[str, Any]], other: list[dict[str, Any]], other_label: str) -> str:
    """``eval/answers.jsonl``: each prompt, its reference, the candidate's answer and scores and the other model's."""
    rows = []
    for c, o in zip(candidate, other, strict=False):
        rows.append(
            {
                "index": c["index"],
                "prompt": c["prompt"],
                "reference": c["reference"],
                "answer": c["answer"],
                "scores": c["scores"],
                other_label: {"answer": o["answer"], "scores": o["scores"]},
            }
        )
    return "".join(json.dumps(r) + "\n" for r in rows)


def task_figures(
    spec: RunSpec,
    store: RunStore,
    candidate: dict[str, Any],
    other: dict[str, Any] | None,
    other_label: str,
) -> dict[str, Any]:
    """What the evaluate stage records of the answers: each model's means, the comparison table and the run's two
    files (written to ``store``). ``candidate``/``other``: ``answers`` events (``from_records``) or a champion's
    record. Without readable answers files, the means alone."""
    found: dict[str, Any] = {
        "generation_key": candidate.get("generation_key"),
        "metrics_after": candidate.get("means"),
        "answers_path": candidate.get("path"),
        "num_examples": candidate.get("num_examples"),
    }
    if other is None:
        return found
    found.update(against=other_label, metrics_other=other.get("means"), other_path=other.get("path"))
    rows, other_rows = read(candidate.get("path")), read(other.get("path"))
    if rows is None or other_rows is None:
        found["comparison_missing"] = "the answers files are not readable here"
        return found
    found["comparison"] = compare(rows, other_rows)
    found["answers"] = write_text(store, ANSWERS, merged(rows, other_rows, other_label), "application/jsonl")
    found["side_by_side"] = write_text(
        store, SIDE_BY_SIDE, side_by_side(spec, found["comparison"], rows, other_rows, other_label), "text/markdown"
    )
    return found


def rewrite_with_reason(spec: RunSpec, store: RunStore, task: dict[str, Any], reason: str) -> None:
    """The side-by-side again with the gate's reason on top (the register stage decides after evaluate wrote it)."""
    rows = read(task.get("answers_path"))
    other = read(task.get("other_path"))
    if rows is None or other is None or not task.get("comparison"):
        return
    text = side_by_side(spec, task["comparison"], rows, other, task["against"], reason)
    write_text(store, SIDE_BY_SIDE, text, "text/markdown")


# ---------------------------------------------------------------- in the evaluate stage


def recorded_answers(ctx, ref: str, key: str | None) -> dict[str, Any] | None:
    """The answers the registered version ``ref`` gave under the generation key ``key``, as its provenance records them
    (``answers_path``, ``generation_key``, ``task_metrics``) and while its run's file is still there; None otherwise
    (it answers again)."""
    from components.stages import gate

    if not key:
        return None
    name, _, version_ref = ref.partition("@")
    try:
        version = gate.registry(ctx).get(name, version_ref)
    except Exception:  # noqa: BLE001 - a version the registry cannot give answers again; nothing is lost
        return None
    p = version.provenance if version else {}
    if p.get("generation_key") != key or read(p.get("answers_path")) is None:
        return None
    return {"path": p["answers_path"], "means": p.get("task_metrics"), "generation_key": key, "recorded_by": ref}


def plan_champion(ctx, train_result: dict[str, Any], champion: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """(the champion's recorded answers, when they are to this run's prompts under its generation key; whether the
    evaluation job must have the champion answer instead). Nothing of either without the trained model's answers or
    a champion the evaluation measures."""
    candidate = (train_result.get("answers") or {}).get("after")
    if not candidate or not champion.get("path"):
        return None, False
    recorded = recorded_answers(ctx, champion["ref"], candidate.get("generation_key"))
    return recorded, recorded is None


def evaluate_answers(
    ctx,
    train_result: dict[str, Any],
    champion: dict[str, Any],
    recorded: dict[str, Any] | None,
    job_records: list[tuple[str, dict]],
) -> dict[str, Any]:
    """The task figures of the evaluate stage's result (``task_figures``): the trained model's answers beside the
    champion's (recorded, or answered in this evaluation job), else beside the model's training started from."""
    answered = train_result.get("answers") or {}
    candidate = answered.get("after")
    if not candidate:
        return {}
    other, label = None, ""
    if champion.get("path"):
        other = recorded or from_records(job_records).get("champion")
        label = "champion"
    if other is None and answered.get("before"):
        other, label = answered["before"], "before training"
    found = task_figures(ctx.spec, ctx.store, candidate, other, label)
    if answered.get("before"):
        found["metrics_before"] = answered["before"].get("means")
    if other is not None and label == "champion":
        found["champion_answers"] = "recorded by " + recorded["recorded_by"] if recorded else "answered in this job"
    return found


def line(task: dict[str, Any]) -> str:
    """The task figures in one line: each metric of the other model (champion, or before training) and the trained
    one's, with the difference's interval."""
    after = task.get("metrics_after") or {}
    comparison = task.get("comparison") or {}
    label = task.get("against") or "before training"
    parts = []
    for name, value in after.items():
        row = comparison.get(name)
        if row:
            parts.append(
                f"{name} {row['other']:.3f} -> {value:.3f} ({row['difference']:+.3f}, "
                f"[{row['low']:+.3f}, {row['high']:+.3f}])"
            )
        else:
            parts.append(f"{name} {value:.3f}")
    return f"evaluate: {task.get('num_examples')} answers, {label} -> trained: " + "; ".join(parts)
