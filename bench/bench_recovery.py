"""Recovery after a lost host, for MaxText (JaxTrainer) and FSDP2 (TorchTrainer), one `tpupipe run` each.

Each run trains on 2 emulated hosts; once a checkpoint is behind it and half a checkpoint period more has been
trained (read from the workers' own log files, seconds ahead of the job log), host-2 is lost: its process group is
killed (SIGKILL) as in the lost-host test, with the Ray workers under it that left that group, and the host keeper
replaces it. From the trainers' timed records in the run's `logs/train.log` (MaxText: a metric per step; FSDP2: a
`step` event per step; both: `worker_group_started`): the seconds from the kill to the first training step of the
restarted worker group, where they went, and the steps trained again (trained by the lost group, at or after the step
the new one resumes at). The run must then succeed. Targets: recovery <= 60 s, steps repeated <= the preset's
checkpoint period in steps. The runs' directories are kept when a figure misses its target (`run_dir` in detail).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.figures import Figure, table  # noqa: E402
from components.platforms import procs  # noqa: E402
from components.spec import protocol  # noqa: E402
from components.workload import resolve  # noqa: E402

RUN_TIMEOUT_S = 1800
LOST_HOST = "host-2"


@dataclass(frozen=True)
class Case:
    preset: str
    sets: str  # the run's --set: enough steps that training goes on well past the kill
    label: str


CASES = (
    Case("local-maxtext", "maxtext.steps=30 cluster.slice_check=false", "MaxText"),
    # The preset's epochs (16 steps each, a checkpoint at the end of each), more of them; Ray Train may restart.
    Case("local-fsdp", "epochs=6 max_failures=3 cluster.slice_check=false", "FSDP2"),
)


def checkpoint_period(case: Case) -> int:
    """Training steps between two checkpoints: MaxText's checkpoint_period; FSDP2 checkpoints once an epoch, of
    (examples / workers, rounded up, as the distributed sampler pads) // batch size steps (drop_last)."""
    spec = resolve(case.preset, case.sets)
    if spec.train.workload == "maxtext":
        return spec.maxtext.checkpoint_period
    per_worker = -(-spec.train.num_train_examples // spec.num_workers)
    return per_worker // spec.train.batch_size


def timeline(log_text: str) -> list[dict]:
    """The run's worker-group starts and training steps, in log order: {"kind": "start"|"step", "time", "step"}, a
    start also with "launched" (when its train function began, where the trainer says so, else its time).
    Lines Ray forwarded twice are kept once (the records carry their time, so two real ones differ)."""
    out, seen = [], set()
    for kind, p in protocol.parse(log_text.splitlines()):
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
        "worker_group_starts": sum(1 for e in events if e["kind"] == "start"),
    }


def lose_host(host: dict) -> float:
    """Kill an emulated host as a lost machine dies: its process group, as the lost-host test does, and also every
    process under it that left that group (Ray starts each worker in a session of its own; killed with the group
    alone they outlive their raylet by seconds, and keep training). Returns the wall-clock time of the kill."""
    groups = {host["pgid"]}
    for pid in procs.descendants(host["pid"]):
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    killed_at = time.time()
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed_at


def _latest_step(temp_dir: Path, offsets: dict[Path, int]) -> int:
    """The newest step the workers have written to their own log files (Ray's worker-*.out under the run's temp
    dir): seconds ahead of logs/train.log, which comes through the Jobs API."""
    latest = -1
    for path in temp_dir.glob("*/session_latest/logs/worker-*.out"):
        try:
            with open(path, errors="replace") as f:
                f.seek(offsets.get(path, 0))
                text = f.read()
        except OSError:  # Ray removes the logs of workers it no longer keeps
            continue
        cut = text.rfind("\n") + 1
        offsets[path] = offsets.get(path, 0) + len(text[:cut].encode())
        latest = max([latest] + [e["step"] for e in timeline(text[:cut]) if e["kind"] == "step"])
    return latest


def _kill_when_due(proc: subprocess.Popen, run_dir: Path, period: int) -> tuple[float, int]:
    """Wait until a checkpoint is behind the run and half a period more has been trained, then lose the host.
    Returns (wall-clock time of the kill, the last step seen before it)."""
    deadline, offsets, latest = time.monotonic() + RUN_TIMEOUT_S, {}, -1
    while latest < period + period // 2:
        if proc.poll() is not None:
            raise SystemExit(f"the run ended (exit {proc.returncode}) before the host was lost")
        if time.monotonic() > deadline:
            raise SystemExit("training did not get under way in time")
        time.sleep(0.05)
        ledger_path = run_dir / "ledger.json"
        if ledger_path.is_file():
            latest = max(latest, _latest_step(Path(json.loads(ledger_path.read_text())["temp_dir"]), offsets))
    ledger = json.loads((run_dir / "ledger.json").read_text())
    return lose_host(next(p for p in ledger["processes"] if p["role"] == LOST_HOST)), latest


def measure(case: Case, root: Path) -> dict:
    """One run with a lost host: the recovery figures, the run's exit and what the keeper and summary say."""
    run_id = f"recovery-{case.preset.removeprefix('local-')}-{os.getpid()}"
    run_dir = root / run_id
    period = checkpoint_period(case)
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
        killed_at, seen = _kill_when_due(proc, run_dir, period)
        load = os.getloadavg()[0]  # this machine's 1-minute load: other work on it slows a recovery down
        proc.wait(timeout=RUN_TIMEOUT_S)
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


def figures() -> list[Figure]:
    out = []
    root = Path(tempfile.mkdtemp(prefix="tpupipe-bench-recovery-"))  # kept when a run fails or misses a target
    for case in CASES:
        d = measure(case, root)
        out.append(
            Figure(
                f"recovery: {case.label} ({case.preset}), lost host to first new step",
                round(d["recovery_s"], 2),
                "s",
                "<= 60",
                d,
            )
        )
        out.append(
            Figure(
                f"recovery: {case.label} ({case.preset}), steps repeated",
                d["steps_repeated"],
                "steps",
                f"<= {d['checkpoint_period']}",
                d,
            )
        )
    if all(f.holds for f in out):
        shutil.rmtree(root, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(table(figures()))
