"""Asynchronous checkpoints: how long FSDP2's training waits for a save, against how long the save takes.

One `tpupipe run --preset local-fsdp` with a sharded checkpoint every 4 steps (``train.checkpoint_every_steps``).
Its rank 0 logs, per save, a ``checkpoint`` event with the seconds training waited (the previous save if still in
flight, the state's shards gathered, the copy to host memory started), one more when the next optimizer step waited
for that copy, and a ``checkpoint_written`` event when the save's shards are written, with its whole duration from the
start of the save (``trainers.ray_checkpoints.Checkpointer``). The figure: the median over the run's
sharded saves of waited / whole, with the spread; the trained model's save at the end, which training waits for by
design (nothing is left to train), is not one of them. Target: <= 0.2.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_recovery import records  # noqa: E402
from bench.figures import Figure, table  # noqa: E402

PRESET = "local-fsdp"
OVERRIDES = "cluster.slice_check=false train.checkpoint_every_steps=4 train.num_eval_examples=16"
TARGET = "<= 0.2"
RUN_TIMEOUT_S = 1800


PARTS = ("previous_s", "state_s", "staging_s", "copy_wait_s")  # a sharded save's (trainers.checkpoints.AsyncSaver)


def saves(log_text: str) -> list[dict]:
    """The run's sharded saves: {"step", "waited_s", "whole_s"} and the parts of the wait, by step (lines Ray
    forwarded twice kept once). A save's wait is every ``checkpoint`` event of its step with parts: the save's own
    and, when an optimizer step waited for the save's copy to host memory, that one's."""
    waited: dict[int, dict] = {}
    whole: dict[int, float] = {}
    seen = set()
    for kind, p in records(log_text):
        if kind != "event" or (p.get("event"), p.get("time")) in seen:
            continue
        seen.add((p.get("event"), p.get("time")))
        if p.get("event") == "checkpoint" and any(k in p for k in PARTS):  # the final save has no parts
            save = waited.setdefault(p["step"], {"waited_s": 0.0})
            save["waited_s"] += p["seconds"]
            for part in PARTS:
                save[part] = save.get(part, 0.0) + p.get(part, 0.0)
        elif p.get("event") == "checkpoint_written":
            whole[p["step"]] = p["seconds"]
    return [{"step": s, **waited[s], "whole_s": whole[s]} for s in sorted(whole) if s in waited]


def figures() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        started = time.perf_counter()
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "tpupipe"),
                "run",
                "--preset",
                PRESET,
                "--set",
                OVERRIDES,
                "--run-id",
                "bench-checkpoint",
                "--output-root",
                tmp,
            ],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        if proc.returncode != 0:
            raise SystemExit(f"tpupipe run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        found = saves((Path(tmp) / "bench-checkpoint" / "logs" / "train.log").read_text())
    if not found:
        raise SystemExit("the run logged no sharded save with both its waited and its whole seconds")
    ratios = [s["waited_s"] / s["whole_s"] for s in found]
    detail = {
        "spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "saves": [{k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()} for s in found],
        "run_s": round(time.perf_counter() - started, 1),
        "sets": OVERRIDES,
    }
    return [
        Figure(
            f"checkpoint: FSDP2 training waited / the save's whole duration (median of {len(found)} saves)",
            round(statistics.median(ratios), 3),
            "x",
            TARGET,
            detail,
        )
    ]


if __name__ == "__main__":
    results = figures()
    print(table(results))
    print(json.dumps(results[0].detail, indent=1))
