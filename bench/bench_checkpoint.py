"""Asynchronous checkpoints: how long training waits for a save, against how long the save takes (FSDP2 and MaxText).

FSDP2: one `tpupipe run --preset local-fsdp` with a sharded checkpoint every 4 steps (``train.checkpoint_every_steps``).
Its rank 0 logs, per save, a ``checkpoint`` event with the seconds training waited (the previous save if still in
flight, the state's shards gathered, the copy to host memory started), one more when the next optimizer step waited
for that copy, and a ``checkpoint_written`` event when the save's shards are written, with its whole duration from the
start of the save (``trainers.ray_checkpoints.Checkpointer``).

MaxText: one `tpupipe run --preset local-maxtext` over ``small-llama`` (``components.workload.maxtext``: an 86 MB
checkpoint, parameters and AdamW's moments; tiny-llama's 1.3 MB would time only a save's fixed costs), a checkpoint
every 3 steps. Its rank 0 logs Orbax's own figures (``trainers.jax_events``): per save, a ``checkpoint`` event with
the seconds the save blocked training (with the hosts' barrier at its start and the wait for the previous save), then
a ``checkpoint_written`` event with its whole duration, blocking and background; Orbax starts a save only once the
one before it is written, so the two pair in order.

Each figure: the median over the run's saves of waited / whole, with the spread; the trained model's save at the end,
which training waits for by design (nothing is left to train), is not one of them. Target: <= 0.2.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.bench_recovery import records
from bench.figures import Figure, table
from trainers import jax_events

REPO = Path(__file__).resolve().parents[1]

PRESET = "local-fsdp"
OVERRIDES = "cluster.slice_check=false train.checkpoint_every_steps=4 train.num_eval_examples=16"
MAXTEXT_STEPS = 12
MAXTEXT_OVERRIDES = (
    f"cluster.slice_check=false maxtext.model_name=small-llama maxtext.steps={MAXTEXT_STEPS} "
    "maxtext.checkpoint_period=3 maxtext.max_lost_steps=3 gate.register=false"
)
TARGET = "<= 0.2"
RUN_TIMEOUT_S = 1800


# A sharded save's parts of the wait (trainers.checkpoints.AsyncSaver, trainers.ray_checkpoints.Checkpointer): the
# previous save, the state gathered, the copy started (or, synchronous, the whole write), an optimizer step's wait for
# the copy, and the preemption poll's wait for the write and report and, at its barrier, for slower ranks.
PARTS = ("previous_s", "state_s", "staging_s", "write_s", "copy_wait_s", "poll_wait_s")


def events(log_text: str) -> Iterator[dict]:
    """The run's events, each once (Ray may forward a worker's line twice)."""
    seen = set()
    for kind, p in records(log_text):
        if kind == "event" and (p.get("event"), p.get("time")) not in seen:
            seen.add((p.get("event"), p.get("time")))
            yield p


def saves(log_text: str) -> list[dict]:
    """The run's sharded saves: {"step", "waited_s", "whole_s"} and the parts of the wait, by step (lines Ray
    forwarded twice kept once). A save's wait is every ``checkpoint`` event of its step with parts: the save's own
    and, when an optimizer step waited for the save's copy to host memory, that one's."""
    waited: dict[int, dict] = {}
    whole: dict[int, float] = {}
    for p in events(log_text):
        if p.get("event") == "checkpoint" and any(k in p for k in PARTS):  # the final save has no parts
            save = waited.setdefault(p["step"], {"waited_s": 0.0})
            save["waited_s"] += p["seconds"]
            for part in PARTS:
                save[part] = save.get(part, 0.0) + p.get(part, 0.0)
        elif p.get("event") == "checkpoint_written":
            whole[p["step"]] = p["seconds"]
    return [{"step": s, **waited[s], "whole_s": whole[s]} for s in sorted(whole) if s in waited]


def maxtext_saves(log_text: str) -> list[dict]:
    """MaxText's saves in order: {"step", "waited_s", "whole_s"} and Orbax's parts of the wait, less the save at the
    run's last step (lines Ray forwarded twice kept once)."""
    blocked, whole = [], []
    for p in events(log_text):
        if p.get("event") == "checkpoint" and "seconds" in p:
            parts = {k: p[k] for k in jax_events.SAVE_PARTS.values() if k in p}
            blocked.append({"step": p["step"], "waited_s": p["seconds"], **parts})
        elif p.get("event") == "checkpoint_written":
            whole.append(p["seconds"])
    paired = [{**b, "whole_s": w} for b, w in zip(blocked, whole, strict=True)]
    return [s for s in paired if s["step"] < MAXTEXT_STEPS - 1]


def run_log(tmp: str, preset: str, overrides: str, run_id: str) -> tuple[str, float]:
    """The run's train log and its seconds."""
    started = time.perf_counter()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "tpupipe"), "run", "--preset", preset, "--set", overrides]
        + ["--run-id", run_id, "--output-root", tmp],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise SystemExit(f"tpupipe run {preset} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return (Path(tmp) / run_id / "logs" / "train.log").read_text(), time.perf_counter() - started


def figure(trainer: str, found: list[dict], run_s: float, sets: str) -> Figure:
    if not found:
        raise SystemExit(f"the {trainer} run logged no save with both its waited and its whole seconds")
    ratios = [s["waited_s"] / s["whole_s"] for s in found]
    detail = {
        "spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "saves": [{k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()} for s in found],
        "waited_over_whole_summed": round(sum(s["waited_s"] for s in found) / sum(s["whole_s"] for s in found), 3),
        "run_s": round(run_s, 1),
        "sets": sets,
    }
    return Figure(
        f"checkpoint: {trainer} training waited / the save's whole duration (median of {len(found)} saves)",
        round(statistics.median(ratios), 3),
        "x",
        TARGET,
        detail,
    )


def figures() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        fsdp_log, fsdp_s = run_log(tmp, PRESET, OVERRIDES, "bench-checkpoint")
        maxtext_log, maxtext_s = run_log(tmp, "local-maxtext", MAXTEXT_OVERRIDES, "bench-checkpoint-maxtext")
    return [
        figure("FSDP2", saves(fsdp_log), fsdp_s, OVERRIDES),
        figure("MaxText", maxtext_saves(maxtext_log), maxtext_s, MAXTEXT_OVERRIDES),
    ]


if __name__ == "__main__":
    results = figures()
    print(table(results))
    print(json.dumps({f.name: f.detail for f in results}, indent=1))
