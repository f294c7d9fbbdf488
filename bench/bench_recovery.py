"""Recovery after a lost host, for MaxText (JaxTrainer) and FSDP2 (TorchTrainer), 3 `tpupipe run`s each (the
median, and the spread of the 3).

Each run trains on 2 emulated hosts; the bench waits for the kill step (a checkpoint behind it and half a checkpoint
period more, read from the workers' own log files, seconds ahead of the job log), then host-2 is lost: its process
group is killed (SIGKILL) as in the lost-host test, with the Ray workers under it that left that group, and the host
keeper replaces it. The run is sized from the kill step: STEPS_AFTER_KILL more steps than it (FSDP2: in whole
epochs), far more than any machine trains between the step's log line and the kill (the bench reads the logs every
50 ms), so the run cannot end before the kill; if it still did, the bench says so.

From the trainers' timed records in the run's `logs/train.log` (MaxText: a metric per step; FSDP2: a `step` event per
step; both: `worker_group_started`): the seconds from the kill to the first training step of the restarted worker
group, where they went, and the steps trained again (trained by the lost group, at or after the step the new one
resumes at); FSDP2's restore timed apart; from Ray's own logs while the run is live, when the lost host's node was
marked dead and when its replacement's raylet registered (the new worker group waits for it). The run must then
succeed.
Targets: recovery <= 40 s (MaxText) and <= 15 s (FSDP2), steps repeated <= the checkpoint period in steps. The runs'
directories are kept when a figure misses its target (`run_dir` in detail).
``python -m bench.bench_recovery [FSDP2|MaxText] [REPEATS]`` runs one case alone.
"""

import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.figures import Figure, table
from components.platforms.local.keeper import latest_step, lose_host
from components.spec import protocol
from components.workload import maxtext, resolve

REPO = Path(__file__).resolve().parents[1]

RUN_TIMEOUT_S = 1800
LOST_HOST = "host-2"
REPEATS = 3
# Steps the run trains after the kill step, at least: MaxText's steps take seconds on CPU; FSDP2's tiny model's
# tens of milliseconds here, so its margin is larger (100 steps at even 5 ms each outlast the bench's reading).
STEPS_AFTER_KILL = {"maxtext": 20, "fsdp": 100}


@dataclass(frozen=True)
class Case:
    preset: str
    sets: str  # the run's --set, less its length (sized from the kill step: sized())
    label: str
    target_s: float


CASES = (
    Case("local-maxtext", "cluster.slice_check=false", "MaxText", 40.0),
    # A sharded checkpoint every 4 steps (asynchronous: training goes on while it is written); Ray Train may restart.
    Case("local-fsdp", "max_failures=3 cluster.slice_check=false checkpoint_every_steps=4", "FSDP2", 15.0),
)


def steps_per_epoch(spec) -> int:
    """FSDP2's steps an epoch: (examples / workers, rounded up, as the distributed sampler pads) // batch size
    (drop_last)."""
    return -(-spec.train.num_train_examples // spec.num_workers) // spec.train.batch_size


def checkpoint_period(case: Case) -> int:
    """Training steps between two checkpoints: MaxText's checkpoint_period; FSDP2's train.checkpoint_every_steps,
    else an epoch's steps."""
    spec = resolve(case.preset, case.sets)
    if spec.train.workload == "maxtext":
        return maxtext.checkpoint_period(spec)
    return spec.train.checkpoint_every_steps or steps_per_epoch(spec)


def kill_step(case: Case) -> int:
    """The step the bench waits for before the kill: a checkpoint behind it and half a period more."""
    period = checkpoint_period(case)
    return period + period // 2


def sized(case: Case) -> Case:
    """The case with its run's length set from the kill step: at least STEPS_AFTER_KILL steps after it."""
    spec = resolve(case.preset, case.sets)
    steps = kill_step(case) + STEPS_AFTER_KILL[spec.train.workload]
    if spec.train.workload == "maxtext":
        return replace(case, sets=f"{case.sets} maxtext.steps={steps}")
    return replace(case, sets=f"{case.sets} epochs={math.ceil(steps / steps_per_epoch(spec))}")


def records(log_text: str):
    """Every (kind, payload) record in a log, whatever its job's nonce (``components.spec.protocol``: a job's records
    carry the nonce the stage gave it, which the bench, reading the logs from outside, does not know)."""
    for text in log_text.splitlines():
        m = protocol.RECORD.match(text)
        if m:
            yield from protocol.parse([text], m["nonce"])


def timeline(log_text: str) -> list[dict]:
    """The run's worker-group starts, restores and training steps, in log order: {"kind": "start"|"restored"|"step",
    "time", "step"}, a start also with "launched" (when its train function began, where the trainer says so, else its
    time), a restore with its "seconds" (where the trainer says so: FSDP2).
    Lines Ray forwarded twice are kept once (the records carry their time, so two real ones differ)."""
    out, seen = [], set()
    for kind, p in records(log_text):
        key = json.dumps(p, sort_keys=True)
        if key in seen or "time" not in p:
            continue
        seen.add(key)
        if kind == "event" and p.get("event") == "worker_group_started":
            out.append(
                {
                    "kind": "start",
                    "time": p["time"],
                    "step": p.get("restore_step"),
                    "launched": p.get("launched", p["time"]),
                }
            )
        elif kind == "event" and p.get("event") == "restored":
            out.append({"kind": "restored", "time": p["time"], "step": p["step"], "seconds": p["seconds"]})
        elif (kind == "event" and p.get("event") == "step") or (kind == "metric" and "step" in p):
            out.append({"kind": "step", "time": p["time"], "step": p["step"]})
    return out


def recovery(events: list[dict], killed_at: float) -> dict:
    """Seconds from the kill to the first step of the worker group started after it, and the steps repeated: the
    steps the lost group had trained (before the kill, or in the moments its processes outlived it) that the new
    group trains again from its checkpoint."""
    restart = next((i for i, e in enumerate(events) if e["kind"] == "start" and e["time"] > killed_at), None)
    lost = [e for e in events[:restart] if e["kind"] == "step"]
    if not lost or restart is None:
        raise SystemExit(f"no restart after the kill in the train log: {len(lost)} steps before it")
    first = next((e for e in events[restart:] if e["kind"] == "step"), None)
    if first is None:
        raise SystemExit("the restarted worker group logged no step")
    last = max(e["step"] for e in lost)
    return {
        "recovery_s": first["time"] - killed_at,
        "steps_repeated": max(0, last - first["step"] + 1),
        "last_step_before_kill": max(e["step"] for e in lost if e["time"] <= killed_at),
        "steps_after_kill_by_lost_group": sum(1 for e in lost if e["time"] > killed_at),
        "first_step_after": first["step"],
        "restore_step": events[restart]["step"],
        # where the time went: Ray's restart, up to the new group's train function; the trainer's own start
        # (MaxText: JAX's runtime, importing MaxText); its setup, restore and first step
        "train_function_launched_s": events[restart]["launched"] - killed_at,
        "trainer_started_s": events[restart]["time"] - killed_at,
        "setup_and_first_step_s": first["time"] - events[restart]["time"],
        **_restore_parts(events[restart:], first),
        "worker_group_starts": sum(1 for e in events if e["kind"] == "start"),
    }


def _restore_parts(events: list[dict], first: dict) -> dict:
    """The new group's setup split at its restore, where the trainer times it: up to the restore (the model built and
    sharded, the data loaded), the restore, and from it to the first step."""
    restored = next((e for e in events if e["kind"] == "restored" and e["time"] <= first["time"]), None)
    if restored is None:
        return {}
    began = restored["time"] - restored["seconds"]
    return {
        "setup_before_restore_s": began - events[0]["time"],
        "restore_s": restored["seconds"],
        "restore_to_first_step_s": first["time"] - restored["time"],
    }


# Ray's own log lines (raylet.out, gcs_server.out: "[<local time>,<ms> <level> <pid> <tid>] (<component>) ...") in
# each node's session logs under the run's temp dir (<temp>/<node>/session_*/logs/), read while the run is live (the
# copies kept with the run at teardown are only the logs' tails): when the lost host's node was marked dead, and when
# the replacement's raylet registered.
RAY_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
RAY_MOMENTS = {
    "lost_node_marked_dead_s": ("head", "gcs_server", "Node is dead because the health check failed"),
    "replacement_registered_s": (LOST_HOST.replace("-", ""), "raylet", "started. Raylet consists of"),
}


def ray_moments(temp_dir: Path, killed_at: float, found: dict | None = None) -> dict:
    """Seconds from the kill to each of :data:`RAY_MOMENTS` not in ``found`` yet (its first line after the kill),
    where the logs have it; with those in ``found``."""
    found = dict(found or {})
    for name, (node, component, text) in RAY_MOMENTS.items():
        if name in found:
            continue
        for path in sorted(temp_dir.glob(f"{node}/session_*/logs/{component}*.out")):
            for line in path.read_text(errors="replace").splitlines():
                m = RAY_LOG_TIME.match(line)
                if not m or text not in line:
                    continue
                at = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1000
                if at > killed_at:
                    found[name] = min(found.get(name, math.inf), at - killed_at)
    return found


def _kill_when_due(proc: subprocess.Popen, run_dir: Path, step: int) -> tuple[float, int]:
    """Wait until the run has trained ``step`` (:func:`kill_step`), then lose the host. Returns (wall-clock time of
    the kill, the last step seen before it)."""
    deadline, offsets, latest = time.monotonic() + RUN_TIMEOUT_S, {}, -1
    while latest < step:
        if proc.poll() is not None:
            raise SystemExit(
                f"the run ended (exit {proc.returncode}) before the host was lost: the workers' logs showed step "
                f"{latest} of the {step} waited for (are the workers' logs where the bench reads them?)"
            )
        if time.monotonic() > deadline:
            raise SystemExit("training did not get under way in time")
        time.sleep(0.05)
        ledger_path = run_dir / "ledger.json"
        if ledger_path.is_file():
            latest = max(latest, latest_step(Path(json.loads(ledger_path.read_text())["temp_dir"]), offsets))
    ledger = json.loads((run_dir / "ledger.json").read_text())
    return lose_host(next(p for p in ledger["processes"] if p["role"] == LOST_HOST)), latest


def _watch_ray_logs(proc: subprocess.Popen, run_dir: Path, killed_at: float) -> dict:
    """Wait for the run to end, reading Ray's logs every second until :func:`ray_moments` has them all."""
    temp_dir = Path(json.loads((run_dir / "ledger.json").read_text())["temp_dir"])
    found: dict = {}
    started = time.monotonic()
    while proc.poll() is None:
        if len(found) < len(RAY_MOMENTS):
            found = ray_moments(temp_dir, killed_at, found)
        if time.monotonic() - started > RUN_TIMEOUT_S:
            raise SystemExit(f"the run did not end within {RUN_TIMEOUT_S} s of the lost host")
        time.sleep(1.0)
    return found


def measure(case: Case, root: Path) -> dict:
    """One run with a lost host: the recovery figures, the run's exit and what the keeper and summary say."""
    run_id = f"recovery-{case.preset.removeprefix('local-')}-{os.getpid()}-{time.time_ns() % 10**6}"
    run_dir = root / run_id
    period = checkpoint_period(case)
    case = sized(case)
    out_path = root / f"{run_id}.out"
    cmd = [
        str(Path(sys.executable).parent / "tpupipe"),
        "run",
        "--preset",
        case.preset,
        "--run-id",
        run_id,
        "--output-root",
        str(root),
        "--set",
        case.sets,
    ]
    started = time.monotonic()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        killed_at, seen = _kill_when_due(proc, run_dir, kill_step(case))
        load = os.getloadavg()[0]  # this machine's 1-minute load: other work on it slows a recovery down
        moments = _watch_ray_logs(proc, run_dir, killed_at)
    finally:
        if proc.poll() is None:  # an error here: let the run tear its cluster down
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    if proc.returncode != 0:
        raise SystemExit(
            f"{case.preset}: tpupipe run exited {proc.returncode}; its output is {out_path}, its run "
            f"directory {run_dir}:\n{out_path.read_text()[-3000:]}"
        )
    found = recovery(timeline((run_dir / "logs" / "train.log").read_text()), killed_at)
    found.update(moments)
    summary = json.loads((run_dir / "summary.json").read_text())
    keeper = (run_dir / "logs" / "keeper.out").read_text()
    if summary["status"] != "succeeded" or f"{LOST_HOST} (pid" not in keeper:
        raise SystemExit(f"{case.preset}: status {summary['status']}, keeper: {keeper[-500:]}")
    detail = {
        **found,
        "checkpoint_period": period,
        "step_seen_at_kill": seen,
        "load_1m_at_kill": load,
        "train_seconds": summary["train_seconds"],
        "run_seconds": time.monotonic() - started,
        "sets": case.sets,
        "killed_at": killed_at,
        "run_dir": str(run_dir),
    }
    (run_dir / "recovery.json").write_text(json.dumps(detail, indent=2))  # with the run, where it is kept
    return detail


def figures(cases: tuple[Case, ...] = CASES, repeats: int = REPEATS) -> list[Figure]:
    out = []
    root = Path(tempfile.mkdtemp(prefix="tpupipe-bench-recovery-"))  # kept when a run fails or misses a target
    for case in cases:
        runs = [measure(case, root) for _ in range(repeats)]
        seconds = [r["recovery_s"] for r in runs]
        repeated = [r["steps_repeated"] for r in runs]
        detail = {
            "recovery_s": [round(s, 2) for s in seconds],
            "spread_s": [round(min(seconds), 2), round(max(seconds), 2)],
            "steps_repeated": repeated,
            "checkpoint_period": runs[0]["checkpoint_period"],
            "runs": runs,
        }
        name = f"recovery: {case.label} ({case.preset})"
        median_s = round(statistics.median(seconds), 2)
        out.append(
            Figure(
                f"{name}, lost host to first new step (median of {repeats})",
                median_s,
                "s",
                f"<= {case.target_s:g}",
                detail,
            )
        )
        out.append(
            Figure(
                f"{name}, steps repeated (most of {repeats})",
                max(repeated),
                "steps",
                f"<= {detail['checkpoint_period']}",
                detail,
            )
        )
    if all(f.holds for f in out):
        shutil.rmtree(root, ignore_errors=True)
    return out


if __name__ == "__main__":
    chosen = tuple(c for c in CASES if c.label in sys.argv[1:2]) or CASES
    print(table(figures(chosen, int(sys.argv[2]) if len(sys.argv) > 2 else REPEATS)))
