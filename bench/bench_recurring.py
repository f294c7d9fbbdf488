"""A recurring pair: the same preset run twice on the local platform under one output root, the second finding what
the first kept across runs (the compile cache under ``<output root>/cache``, ``components.workload.cache``).

For local-maxtext and local-fsdp: trainer start (the train stage's start to its first step's end) of the second run /
of the first (target <= 0.5), each run's goodput, and where trainer start went: until the first worker group
started, from there to the trainer's data and model (FSDP's ``data`` event), compiling (the ledger's compilation,
the cache's hits), the rest; for FSDP also the worker's start by phase (tokenizer, data, model, shard, resume, the
held-out split) and whether the tokenised split came from the cache. MaxText's asynchronous saves are measured by
``bench/bench_checkpoint.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.figures import Figure, table
from components.spec import protocol

REPO = Path(__file__).resolve().parents[1]

# TPUPIPE_BENCH_RECURRING names some of them (e.g. "local-fsdp"): the others' figures are not measured.
PRESETS = tuple(os.environ.get("TPUPIPE_BENCH_RECURRING", "local-maxtext local-fsdp").split())


def run(root: Path, preset: str, name: str) -> Path:
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "tpupipe"), "run", "--preset", preset, "--run-id", name]
        + ["--output-root", str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    train = root / name / "stages" / "train.json"
    if not train.is_file() or json.loads(train.read_text()).get("status") != "succeeded":
        raise SystemExit(f"tpupipe run {preset}: train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if proc.returncode != 0:  # a later stage failed (evaluate, say): its trainer start is measured all the same
        print(f"tpupipe run {preset} {name} failed after train:\n{proc.stdout[-1500:]}", file=sys.stderr)
    return root / name


def train_records(run_dir: Path) -> list[tuple[str, dict]]:
    lines = (run_dir / "logs" / "train.log").read_text().splitlines()
    nonces = {m["nonce"] for m in map(protocol.RECORD.match, lines) if m}
    return list(protocol.parse(lines, nonces.pop() if nonces else ""))


def start_of(run_dir: Path) -> dict:
    """Where the run's trainer start went, in seconds from the train stage's start."""
    stage = json.loads((run_dir / "stages" / "train.json").read_text())
    timeline = stage["result"]["timeline"]
    records = train_records(run_dir)
    events = {p.get("event"): p for kind, p in records if kind == "event" and "time" in p}
    started = stage["started"]
    summary = json.loads((run_dir / "summary.json").read_text())
    categories = {c["name"]: c["seconds"] for c in summary["goodput"]["categories"]}
    first_step = timeline["steps"][0]["time"] - started
    out = {
        "to_first_step_s": round(first_step, 2),
        "worker_group_started_s": round(events["worker_group_started"]["time"] - started, 2),
        "compiling_s": round(sum(c["seconds"] for c in timeline.get("compiles") or []), 2),
        "compile_cache": timeline.get("compile_cache"),
        "status": summary.get("status"),
        "goodput": summary["goodput"]["goodput"],
        "trainer_start_s": categories["trainer start"],
        "compilation_s": categories["compilation"],
    }
    if "data" in events:  # FSDP: tokenizer, data and model built
        out["data_and_model_s"] = round(events["data"]["time"] - events["worker_group_started"]["time"], 2)
    if "setup" in events:  # FSDP: the worker's start by phase (trainers.fsdp.Phases), and the tokenised split's hit
        setup = events["setup"]
        out["worker_setup_s"] = round(setup["time"] - events["worker_group_started"]["time"], 2)
        out["setup_to_first_step_s"] = round(timeline["steps"][0]["time"] - setup["time"], 2)
        out["setup_phases"] = setup["phases"]
        out["tokenized_cached"] = setup.get("tokenized_cached")
    return out


def figures() -> list[Figure]:
    found = []
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-recurring-") as tmp:
        for preset in PRESETS:
            root = Path(tmp) / preset
            first, second = (start_of(run(root, preset, f"recurring-{i}")) for i in (1, 2))
            ratio = second["to_first_step_s"] / first["to_first_step_s"]
            found.append(
                Figure(
                    f"{preset}: trainer start of a recurring run with warm caches / of the first",
                    ratio,
                    "x",
                    "<= 0.5",
                    {"first": first, "second": second, "load_average_1m": os.getloadavg()[0]},
                )
            )
    return found


if __name__ == "__main__":
    results = figures()
    print(table(results))
    print(json.dumps({f.name: f.detail for f in results}, indent=1))
