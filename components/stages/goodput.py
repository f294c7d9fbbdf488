"""The goodput ledger of a run: every second of its wall-clock time, and every billed chip-second, in one named
category; goodput = productive chip-seconds / billed chip-seconds, and the cost of each category at the plan's list
prices.

Measured from records the run already keeps: the stages' own (``stages/<stage>.json``: when each started, how long it
took) and the trainer's per-step records (the train stage's ``timeline``: when each worker group started, when each
step ended, when each checkpoint was saved and for how long), the same for FSDP and MaxText and on every platform.

- The run's wall time runs from its first stage's start to its last stage's end. Where stages overlap (on Vertex AI
  ``build_image`` and ``provision`` run side by side), an instant counts once, for the stage that holds the chips
  longest (``PRIORITY``); an instant in no stage is "idle between stages" (the pipeline starting the next task).
- The chips bill from the end of ``provision`` (its node pools exist) to the end of ``teardown`` (it deletes them),
  the rule the plan's "before training" figure uses (``components.platforms.gke.plan.document``), less "waiting for
  capacity": the time ``deploy_raycluster`` saw the RayCluster's pods Unschedulable, waiting for nodes the cluster
  autoscaler adds (a flex-start or Autopilot pool starts with none, and its nodes bill from when they come:
  https://cloud.google.com/kubernetes-engine/docs/concepts/dws#pricing). Where some of the nodes came before the
  others, those billed during the wait: the figures are at most what was billed. With queued provisioning
  (``cluster.capacity=queued``) no node of any slice exists until all of them do, so the wait bills nothing. The
  local platform's emulated chips (one per host) are priced at zero; the categories are the same.
- Inside ``train``: until the first step of the first worker group ends, "trainer start" (imports, building the
  model, restoring, XLA's compile of the first step); a step that ends later is "productive" unless a later worker
  group ran the same step again, then it is "lost to failures", as is the time from a worker group's last step to the
  next group's first (the failure, the restart, the restore and compile); checkpoint saves are their own category;
  after the last step, "trainer start" again (the last report, the driver's result, the job's end). A train job lost
  to an eviction (Kueue took the cluster back: the train stage's ``evictions``) is one more worker group: the wait
  until the cluster was admitted again and its pods had nodes is "waiting for capacity" (not billed, as the first
  admission's), the restart around it and the steps trained again since the checkpoint "lost to failures".
  "Compilation" is cut out of the rest: each XLA compile of the trainer's programs, or load of one from the compile
  cache kept across runs, that the trainer reported (``trainers.jax_events``: its end and seconds); the ledger's
  ``compile_cache`` counts them and the cache's hits.
"""

from __future__ import annotations

import bisect
from typing import Any

from components.spec.protocol import Record

# (category, what it is), in the order the summary lists them.
CATEGORIES = (
    ("data snapshot", "snapshot_data: the data resolved and read before anything is created (no chip billed)"),
    ("image build", "build_image"),
    ("provisioning", "provision"),
    (
        "waiting for capacity",
        "deploy_raycluster: queued in Kueue for admission (gke.queue), or the RayCluster's pods waiting for nodes; "
        "train: the cluster evicted by Kueue, waiting to be admitted again (not billed)",
    ),
    ("cluster start", "deploy_raycluster: the RayCluster's pods scheduled and ready"),
    ("slice check", "check_slice"),
    ("trainer start", "train until its first step: imports, model, restore; and after its last step"),
    ("compilation", "XLA compiling the trainer's programs, or loading them from the compile cache"),
    ("productive steps", "training steps that were kept"),
    ("checkpoint saves", "the trainer saving checkpoints"),
    ("lost to failures", "steps repeated after a restart, and the restart itself"),
    ("evaluation", "evaluate, and the train job's own evaluation of the model it trained"),
    ("registry", "register and promote"),
    ("teardown", "teardown"),
    ("idle between stages", "no stage running: the pipeline starting the next"),
)
STAGE_CATEGORY = {
    "snapshot_data": "data snapshot",
    "build_image": "image build",
    "provision": "provisioning",
    "deploy_raycluster": "cluster start",
    "check_slice": "slice check",
    "evaluate": "evaluation",
    "register": "registry",
    "promote": "registry",
    "teardown": "teardown",
}
# An instant two stages share counts for the one listed first.
PRIORITY = (
    "waiting for capacity",  # the train job's cluster evicted: the wait to run again, not the restart it is part of
    "compilation",  # a step that waited for a compile (its first, an eval's) was compiling, not training
    "productive steps",
    "checkpoint saves",
    "lost to failures",
    "trainer start",
    "slice check",
    "evaluation",
    "cluster start",
    "provisioning",
    "image build",
    "registry",
    "teardown",
    "data snapshot",
)
UNBILLED = "waiting for capacity"  # wall time, no chip billed
TRAIN_PARTS = ("trainer start", "compilation", "productive steps", "checkpoint saves", "lost to failures")


def stage_span(rec: dict[str, Any]) -> tuple[float, float] | None:
    """(start, end) in epoch seconds of a stage that started and has its seconds recorded."""
    if rec.get("started") is None or rec.get("seconds") is None:
        return None
    return rec["started"], rec["started"] + rec["seconds"]


def group_of(groups: list[float], t: float) -> int:
    """Which worker group ran what ended at ``t``: the index of the last of ``groups`` (their start times, sorted) that
    started by then; 0 before the first."""
    return max(0, bisect.bisect_right(groups, t) - 1)


def train_intervals(span: tuple[float, float], timeline: dict[str, Any]) -> list[tuple[float, float, str]]:
    """The train stage's ``span`` cut into (start, end, category) by the trainer's ``timeline``:
    ``groups`` (each worker group's start time), ``steps`` (``{step, time}``, every step each group ended, repeated
    ones included), ``checkpoints`` (``{time, seconds}``, each save's end and length) and ``compiles`` (the same, of
    each compile)."""
    start, end = span
    groups = sorted(timeline.get("groups") or [])
    steps = sorted((s for s in timeline.get("steps") or [] if start <= s["time"] <= end), key=lambda s: s["time"])
    saves = [(c["time"], c.get("seconds", 0.0), "checkpoint saves") for c in timeline.get("checkpoints") or []]
    saves += [(e["time"], e["seconds"], "evaluation") for e in timeline.get("evaluations") or []]  # in-job
    saves.sort()

    last_run: dict[int, int] = {}  # step number -> the group that ran it last
    for s in steps:
        last_run[s["step"]] = max(last_run.get(s["step"], 0), group_of(groups, s["time"]))
    out: list[tuple[float, float, str]] = []

    def add(a: float, b: float, category: str) -> None:
        """[a, b] as ``category``, less the checkpoint saves and in-job evaluations that ended inside it."""
        for when, seconds, cut in saves:
            if a < when <= b:
                save_start = max(a, when - seconds)
                out.append((save_start, when, cut))
                if save_start > a:
                    out.append((a, save_start, category))
                a = when
        if b > a:
            out.append((a, b, category))

    previous, previous_group = start, None
    for s in steps:
        group = group_of(groups, s["time"])
        if previous_group is None:
            category = "trainer start"
        elif group != previous_group:
            category = "lost to failures"
        elif last_run[s["step"]] > group:
            category = "lost to failures"
        else:
            category = "productive steps"
        add(previous, s["time"], category)
        previous, previous_group = s["time"], group
    add(previous, end, "trainer start")
    for c in timeline.get("compiles") or []:
        if start <= c["time"] <= end:
            out.append((max(start, c["time"] - c["seconds"]), c["time"], "compilation"))
    return out


def _sweep(intervals: list[tuple[float, float, str]], lo: float, hi: float) -> dict[str, float]:
    """Seconds of [lo, hi] per category, each instant counted once (``PRIORITY``), uncovered time as idle."""
    rank = {c: i for i, c in enumerate(PRIORITY)}
    cuts = sorted({lo, hi, *(t for a, b, _ in intervals for t in (a, b) if lo < t < hi)})
    seconds: dict[str, float] = {name: 0.0 for name, _ in CATEGORIES}
    for a, b in zip(cuts, cuts[1:], strict=False):
        covering = [c for s, e, c in intervals if s <= a and e >= b]
        seconds[min(covering, key=rank.__getitem__) if covering else "idle between stages"] += b - a
    return seconds


def ledger(
    records: dict[str, dict[str, Any]], chips: int, usd_per_hour: float | None, chip_kind: str = "TPU chip"
) -> dict[str, Any] | None:
    """The run's goodput ledger from its stage ``records`` (name -> record; train's result carries its ``timeline``)
    for ``chips`` chips billed at ``usd_per_hour`` for all the run's resources (None: a price is unknown); None when
    no stage has its times."""
    found = {name: stage_span(rec) for name, rec in records.items()}
    spans = {name: span for name, span in found.items() if span}
    if not spans:
        return None
    wall_lo, wall_hi = min(a for a, _ in spans.values()), max(b for _, b in spans.values())
    intervals = [(a, b, STAGE_CATEGORY[name]) for name, (a, b) in spans.items() if name in STAGE_CATEGORY]
    deployed = (records.get("deploy_raycluster") or {}).get("result") or {}
    for wait in ("queue_wait", "capacity_wait"):  # queued for admission, then the pods waiting for nodes
        if deployed.get(wait):
            intervals.append((*deployed[wait], UNBILLED))
    for eviction in ((records.get("train") or {}).get("result") or {}).get("evictions") or []:
        for wait in ("queue_wait", "capacity_wait"):  # the train job lost to an eviction, waiting to run again
            if eviction.get(wait):
                intervals.append((*eviction[wait], UNBILLED))
    if "train" in spans:
        if records["train"].get("status") == "succeeded":
            intervals += train_intervals(spans["train"], records["train"].get("result", {}).get("timeline") or {})
        else:  # the job failed or was stopped: nothing of it was kept
            intervals.append((*spans["train"], "lost to failures"))
    wall = _sweep(intervals, wall_lo, wall_hi)
    bill_lo = spans["provision"][1] if "provision" in spans else None
    billed = _sweep(intervals, bill_lo, max(bill_lo, wall_hi)) if bill_lo is not None else dict.fromkeys(wall, 0.0)
    billed[UNBILLED] = 0.0
    billed_s = sum(billed.values())
    categories = [
        {
            "name": name,
            "what": what,
            "seconds": round(wall[name], 3),
            "chip_s": round(billed[name] * chips, 3),
            "usd": None if usd_per_hour is None else round(billed[name] * usd_per_hour / 3600, 4),
        }
        for name, what in CATEGORIES
    ]
    productive = billed["productive steps"] * chips
    train_result = (records.get("train") or {}).get("result") or {}
    return {
        "wall_s": round(wall_hi - wall_lo, 3),
        "chips": chips,
        "chip_kind": chip_kind,
        "billed_s": round(billed_s, 3),
        "billed_chip_s": round(billed_s * chips, 3),
        "productive_chip_s": round(productive, 3),
        "goodput": round(productive / (billed_s * chips), 4) if billed_s and chips else None,
        "usd_per_hour": usd_per_hour,
        "usd": None if usd_per_hour is None else round(billed_s * usd_per_hour / 3600, 4),
        "categories": categories,
        "compile_cache": (train_result.get("timeline") or {}).get("compile_cache"),
    }


def line(g: dict[str, Any] | None) -> str | None:
    """The summary's one line: goodput with its figures, and the three categories most of the chip-seconds went to
    (``tpupipe show --json`` and summary.json have every category)."""
    if not g:
        return None
    cost = "price unknown" if g["usd"] is None else f"${g['usd']:.2f}"
    if g["goodput"] is None:
        return f"  goodput              - (no chip billed; {g['wall_s']:.0f}s wall)"
    shares = sorted((c for c in g["categories"] if c["chip_s"] > 0), key=lambda c: -c["chip_s"])[:3]
    most = ", ".join(f"{c['name']} {c['chip_s'] / g['billed_chip_s']:.0%}" for c in shares)
    return (
        f"  goodput              {g['goodput']:.1%} of {g['billed_chip_s'] / 60:.1f} {g['chip_kind']}-minutes billed "
        f"({cost}); most to {most}{compile_words(g.get('compile_cache'))}"
    )


def compile_words(cache: dict[str, Any] | None) -> str:
    """``; compiling 12.3 s, 40 of 42 programs from the compile cache`` (nothing when the trainer counted none)."""
    if not cache or not cache.get("compiles"):
        return ""
    return (
        f"; compiling {cache['seconds']:.1f} s, {cache['hits']} of {cache['compiles']} programs from the compile cache"
    )


def timeline(records: list[Record]) -> dict[str, Any]:
    """The train job's ``TPUPIPE`` records -> its timeline (``train_intervals``): each worker group's start, each
    step's end (FSDP's ``step`` events, MaxText's per-step metrics), each checkpoint save's end and seconds (a save
    that gives none: the time since the record before it), each compile of at least a few hundredths of a second
    (``compiled``), the compile cache's counts (``compile_cache``: the last worker group's) and the job's own
    evaluations (``eval``). A line Ray forwarded twice counts once."""
    groups, steps, saves, seen = set(), {}, [], set()
    evaluations: dict[float, dict[str, Any]] = {}
    compiles: dict[tuple[float, float], dict[str, Any]] = {}
    cache = None
    last_time = None
    for kind, p in records:
        if "time" not in p:
            continue
        event = p.get("event") if kind == "event" else None
        if event == "worker_group_started":
            groups.add(p["time"])
        elif event == "step" or (kind == "metric" and "step" in p and "epoch" not in p):
            steps[(p["step"], p["time"])] = {"step": p["step"], "time": p["time"]}
        elif event == "compiled":
            compiles[(p["time"], p["seconds"])] = {"time": p["time"], "seconds": p["seconds"], "hit": p.get("hit")}
            continue  # a compile ends inside a step: the time since the record before a save stays the step's
        elif event == "compile_cache":
            cache = {k: p[k] for k in ("compiles", "hits", "seconds")}
        elif event == "checkpoint" and (p["time"], p.get("step")) not in seen:
            seen.add((p["time"], p.get("step")))
            seconds = p.get("seconds")
            if seconds is None:
                seconds = max(0.0, p["time"] - last_time) if last_time is not None else 0.0
            saves.append({"time": p["time"], "seconds": seconds, "step": p.get("step")})
        elif event in ("eval", "answers", "answered"):  # the train job's own evaluation (trainers.heldout; answering
            # and scoring, trainers.generation: answers made before training are scored after it, each its own time)
            evaluations[p["time"]] = {"time": p["time"], "seconds": p["seconds"]}
        last_time = p["time"]
    return {
        "groups": sorted(groups),
        "steps": sorted(steps.values(), key=lambda s: s["time"]),
        "checkpoints": saves,
        "compiles": sorted(compiles.values(), key=lambda c: c["time"]),
        "compile_cache": cache,
        "evaluations": sorted(evaluations.values(), key=lambda e: e["time"]),
    }


def step_records(records: list[Record], timeline_: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per kept step (the last worker group's run of it): ``step``, ``loss``, ``time``, ``group`` (the
    worker group that ran it: 0, then 1 after the first restart). Losses come from MaxText's per-step metrics or
    FSDP's ``step_losses`` events (rank 0's loss of each step, sent once per epoch)."""
    losses: dict[int, float] = {}
    for kind, p in records:
        if kind == "metric" and "step" in p and "epoch" not in p:
            losses[p["step"]] = p["loss"]
        elif kind == "event" and p.get("event") == "step_losses":
            losses.update({p["first_step"] + i: loss for i, loss in enumerate(p["losses"])})
    groups = sorted(timeline_["groups"])
    kept: dict[int, dict[str, Any]] = {}
    for s in timeline_["steps"]:
        group = group_of(groups, s["time"])
        kept[s["step"]] = {"step": s["step"], "loss": losses.get(s["step"]), "time": s["time"], "group": group}
    return [kept[k] for k in sorted(kept)]
