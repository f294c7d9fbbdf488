"""The gate on what the team chooses (docs/architecture.md, "The gate"): ``gate.metric`` decides (the held-out loss,
``gate.decide``, or a task metric of the answers, higher is better, by at least ``gate.min_improvement`` absolute),
``gate.guards`` must hold (each a bound on the candidate's difference from the champion in one metric), and with
``gate.require_significance`` a task-metric improvement whose paired bootstrap interval reaches 0 is not enough.
Every figure is the champion's beside the candidate's on the same prompts (``components.stages.answers``); the
decision names the figure that decided and the guard that failed."""

from __future__ import annotations

from typing import Any

from components.spec import CHAMPION, RunSpec
from components.spec.run_spec import HELDOUT_LOSS
from components.stages.gate import KEEP, PROMOTE, Decision


def _holds(difference: float, op: str, bound: float) -> bool:
    return difference >= bound if op == ">=" else difference <= bound


def decide(
    spec: RunSpec, on_loss: Decision, task: dict[str, Any], new_ref: str, champion_ref: str
) -> tuple[Decision, dict[str, Any]]:
    """The gate's decision and what it rests on (``decided_by``, ``guards``: each guard's difference and whether it
    held, ``guard_failed``). ``on_loss``: the held-out loss's decision (``gate.decide``). Without a champion the
    first version is promoted as before: there is nothing to guard against."""
    g = spec.gate
    detail: dict[str, Any] = {"decided_by": g.metric, "guards": [], "guard_failed": None}
    if not champion_ref or (g.metric == HELDOUT_LOSS and not g.guards):
        return on_loss, detail
    table = task.get("comparison") or {} if task.get("against") == CHAMPION else {}
    needed = [m for m in [g.metric, *(m for m, _, _ in g.guard_list)] if m != HELDOUT_LOSS]
    lacking = [m for m in needed if m not in table]
    if lacking:
        why = task.get("comparison_missing") or "the champion's answers were not compared"
        reason = f"kept {CHAMPION} {champion_ref}: {new_ref}'s {', '.join(lacking)} has no figure beside it ({why})"
        return Decision(KEEP, reason, on_loss.improvement), {**detail, "decided_by": lacking[0]}
    decision = on_loss
    if g.metric != HELDOUT_LOSS:
        decision = _on_task_metric(spec, table[g.metric], new_ref, champion_ref)
    for metric, op, bound in g.guard_list:
        difference = table[metric]["difference"]
        held = _holds(difference, op, bound)
        detail["guards"].append({"guard": f"{metric}{op}{bound:g}", "difference": difference, "held": held})
        if not held and detail["guard_failed"] is None:
            detail["guard_failed"] = f"{metric}{op}{bound:g}"
    if detail["guard_failed"] and decision.decision == PROMOTE:
        failed = next(x for x in detail["guards"] if not x["held"])
        decision = Decision(
            KEEP,
            f"kept {CHAMPION} {champion_ref}: guard {failed['guard']} failed ({new_ref} - {CHAMPION} = "
            f"{failed['difference']:+.4f}); {g.metric} alone would have promoted it",
            decision.improvement,
        )
    return decision, detail


def _on_task_metric(spec: RunSpec, row: dict[str, float], new_ref: str, champion_ref: str) -> Decision:
    g = spec.gate
    difference, low, high = row["difference"], row["low"], row["high"]
    figures = (
        f"{g.metric} {row['candidate']:.4f} vs {CHAMPION} {champion_ref} {row['other']:.4f} "
        f"({difference:+.4f}, 95% interval [{low:+.4f}, {high:+.4f}])"
    )
    needed = f"gate.min_improvement {g.min_improvement:g}"
    if difference <= 0 or difference < g.min_improvement:
        verdict = "not better" if difference <= 0 else f"short of {needed}"
        return Decision(KEEP, f"kept {CHAMPION} {champion_ref}: {new_ref} {figures}, {verdict}", difference)
    if g.require_significance and low <= 0:
        return Decision(
            KEEP,
            f"kept {CHAMPION} {champion_ref}: {new_ref} {figures}: the improvement is inside the interval "
            "(gate.require_significance)",
            difference,
        )
    return Decision(PROMOTE, f"promoted {new_ref} to {CHAMPION}: {figures} ({needed})", difference)
