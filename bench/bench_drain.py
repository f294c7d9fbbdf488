"""Preemptions with notice during local training, in one `tpupipe run` per trainer on 2 emulated hosts: FSDP2
(local-fsdp) TPUPIPE_BENCH_DRAINS times (20 by default), MaxText (local-maxtext) TPUPIPE_BENCH_MAXTEXT_DRAINS times
(10 by default) (``tests/e2e/test_local_drain.py`` and ``tests/e2e/test_local_maxtext.py`` check one each).

Each drain is a Spot-like notice to the last emulated host (``components.platforms.local.keeper.preempt``: Ray's
DrainNode with reason PREEMPTION and a deadline ``cluster.preemption_notice_s`` away), and the host killed just after
the deadline (``keeper.lose_host``); the keeper replaces it. The first is the spec's
``testing.drain_host_at_step`` (the keeper's own, which also turns Ray Train's preemption watcher on); the bench gives
each next one once the restarted worker group has trained ``GAP`` steps. From the trainer's records in the run's
``logs/train.log``, per drain: whether a just-in-time checkpoint was committed (the ``preemption_checkpoint`` event,
emitted once the save is committed, and the next worker group restoring that step), and the steps repeated (the
newest step the preempted group logged, less the step the next group restored; MaxText logs a step's figures only
after the next step's, so its saved step's own line may stay unwritten: a group that stopped at its save shows
``-1``, counted as 0). The step restored is the one the next group named (the FSDP trainer's ``restored`` event,
MaxText's ``restore_step``) only where its first step logged is the one after it: a group that trained from
elsewhere restored nothing of the drain's.
Targets: every drain commits its just-in-time checkpoint; 0 steps repeated in each.
``python -m bench.bench_drain [DRAINS [MAXTEXT_DRAINS]]`` runs it alone (0 skips that trainer).
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.bench_recovery import steps_per_epoch
from bench.figures import Figure, table
from components.platforms import procs
from components.platforms.local import auth, keeper
from components.spec import protocol
from components.workload import resolve

NOTICE_S = 10  # cluster.preemption_notice_s
FIRST = 20  # the first drain's step (testing.drain_host_at_step)
GAP = 8  # steps a restarted group trains before the next notice


@dataclass(frozen=True)
class Trainer:
    """A trainer's drain run: its preset, how many drains the issue asks of it, and the run's length per drain."""

    name: str
    preset: str
    issue_drains: int  # the drains the figure must count to hold: fewer run never holds
    count_env: str  # the environment variable that sets how many run
    steps_per_drain: int  # the steps a drain takes of the run's length (below)
    drain_s: int  # the most a drain may take, for the run's timeout

    def drains(self) -> int:
        return int(os.environ.get(self.count_env, str(self.issue_drains)))

    def sets(self, drains: int) -> str:
        steps = FIRST + self.steps_per_drain * (drains + 1)
        sets = (
            f"cluster.slice_check=false testing.drain_host_at_step={FIRST} cluster.preemption_notice_s={NOTICE_S} "
            "gate.register=false eval.generate_examples=0"  # no answers before and after: the run's work is its drains
        )
        if self.preset == "local-maxtext":
            return f"{sets} maxtext.steps={steps}"
        return f"{sets} epochs={math.ceil(steps / steps_per_epoch(resolve(self.preset, sets)))}"


# A drain's steps: those the restarted group trains before the bench sees its restore in the stage's log (a second or
# two through the Jobs API: 10 to 20 of local-fsdp's steps, at about 10 a second on 2 cores), GAP, those to the save
# the notice brings (FSDP2 polls for a notice every 10 steps, trainers.ray_checkpoints.PREEMPTION_POLL_STEPS;
# MaxText's JAX agrees a step a few past every process's current one, trainers.maxtext_train.preemption_notice_to_jax),
# and as many again for a loaded machine. A run that ends before its last notice counts only those given.
FSDP = Trainer("FSDP2", "local-fsdp", 20, "TPUPIPE_BENCH_DRAINS", 60, 240)
MAXTEXT = Trainer("MaxText", "local-maxtext", 10, "TPUPIPE_BENCH_MAXTEXT_DRAINS", 60, 300)


def events(log_text: str) -> list[dict]:
    """The trainer's events and per-step metrics in a log, each once (Ray may forward a line twice; each record
    carries its time); a metric as ``{"event": "step", ...}``, as the FSDP trainer's step events are."""
    out, seen = [], set()
    for line in log_text.splitlines():
        m = protocol.RECORD.match(line)
        if m is None:
            continue
        for kind, payload in protocol.parse([line], m["nonce"]):
            if kind == "metric" and "step" in payload and "epoch" not in payload:
                payload = {**payload, "event": "step"}
            elif kind != "event":
                continue
            key = json.dumps(payload, sort_keys=True)
            if key not in seen and "time" in payload:
                seen.add(key)
                out.append(payload)
    return sorted(out, key=lambda e: e["time"])


def last_host(run_dir: Path) -> dict:
    ledger = json.loads((run_dir / "ledger.json").read_text())
    hosts = [p for p in ledger["processes"] if p["role"].startswith("host-")]
    return max(hosts, key=lambda p: int(p["role"].removeprefix("host-")))


def _reached(proc, temp_dir: Path, offsets: dict, step: int, deadline: float) -> bool:
    """Whether the workers logged ``step`` (False: the run ended first)."""
    while keeper.latest_step(temp_dir, offsets) < step:
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            raise SystemExit(f"step {step} not reached in time")
        time.sleep(0.1)
    return True


def _first_notice(proc, run_dir: Path, deadline: float) -> float:
    """When the keeper gave the first notice (its log line's time)."""
    while time.monotonic() < deadline and proc.poll() is None:
        log = run_dir / "logs" / "keeper.out"
        for line in log.read_text().splitlines() if log.is_file() else []:
            if "(testing.drain_host_at_step)" in line:
                return float(line.rsplit(" at ", 1)[1])
        time.sleep(0.2)
    raise SystemExit("the keeper gave no notice")


def drive(proc, run_dir: Path, drains: int, deadline: float) -> list[float]:
    """Give the notices (the keeper the first, the bench the rest), each once the group restarted after the one
    before has trained ``GAP`` steps; the wall-clock time of each. Fewer than ``drains`` where the run ends first:
    those given are measured, and the figure counts no drain that was not given."""
    noticed = [_first_notice(proc, run_dir, deadline)]  # the cluster is up by then: its ledger has its temp dir
    ledger = json.loads((run_dir / "ledger.json").read_text())
    temp_dir, offsets = Path(ledger["temp_dir"]), {}
    os.environ.update(auth.environment(ledger["auth_token_path"]))  # the run's Ray token, for the notices' DrainNode
    train_log = run_dir / "logs" / "train.log"
    while len(noticed) < drains:
        restored = restores(events(train_log.read_text()))
        while len(restored) < len(noticed):  # the group restarted after the last notice
            if proc.poll() is not None:
                return noticed
            if time.monotonic() > deadline:
                raise SystemExit(f"no restore after notice {len(noticed)}")
            time.sleep(0.5)
            restored = restores(events(train_log.read_text()))
        if not _reached(proc, temp_dir, offsets, restored[-1]["step"] + GAP, deadline):
            return noticed
        host = last_host(run_dir)
        noticed.append(keeper.preempt(json.loads((run_dir / "ledger.json").read_text()), host, NOTICE_S))
        print(
            f"drain {len(noticed)}/{drains}: a {NOTICE_S} s notice to {host['role']} (pid {host['pid']}); the group "
            f"before it restored step {restored[-1]['step']}",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(NOTICE_S + keeper.KILL_AFTER_DEADLINE_S)
        if procs.alive(host["pid"]):
            keeper.lose_host(host)
    return noticed


def restores(found: list[dict]) -> list[dict]:
    """Each restore of a worker group, ``{"step": S, "time": T}``: the FSDP trainer's ``restored`` events, MaxText's
    ``worker_group_started`` with a ``restore_step``."""
    out = [e for e in found if e["event"] == "restored"]
    out += [
        {"step": e["restore_step"], "time": e["time"]}
        for e in found
        if e["event"] == "worker_group_started" and e.get("restore_step") is not None
    ]
    return sorted(out, key=lambda e: e["time"])


def per_drain(found: list[dict], noticed: list[float]) -> list[dict]:
    """Each drain's just-in-time save, the restore after it and the steps repeated."""
    out = []
    for i, at in enumerate(noticed):
        until = noticed[i + 1] if i + 1 < len(noticed) else math.inf
        window = [e for e in found if at <= e["time"] < until]
        saves = [e for e in window if e["event"] == "preemption_checkpoint"]
        start = next((e for e in window if e["event"] == "worker_group_started"), None)
        restore = next((e for e in restores(window)), None)
        restart = (start or {}).get("time", until)
        before = [e["step"] for e in found if e["event"] == "step" and e["time"] < restart]
        after = [e["step"] for e in window if e["event"] == "step" and e["time"] >= restart]
        saved = saves[0]["step"] if saves else None
        # What the new group trained from, by its own first step (not only the step it named to restore)
        resumed = min(after) - 1 if after else None
        restored = restore["step"] if restore and resumed in (None, restore["step"]) else None
        out.append(
            {
                "noticed_at": at,
                "saved_step": saved,
                "restored_step": restored,
                "committed": saved is not None and restored == saved,
                "last_step_before_restart": max(before) if before else None,
                "resumed_from_step": resumed,
                "steps_repeated": max(0, max(before) - restored) if before and restored is not None else None,
                "notice_to_saved_s": (saves[0]["time"] - at) if saves else None,
                "notice_to_restart_s": (start["time"] - at) if start else None,
            }
        )
    return out


def measure(trainer: Trainer, drains: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="tpupipe-bench-drain-"))
    run_id = f"drain-{os.getpid()}-{time.time_ns() % 10**6}"
    run_dir = root / run_id
    cmd = [str(Path(sys.executable).parent / "tpupipe"), "run", "--preset", trainer.preset, "--run-id", run_id]
    cmd += ["--output-root", str(root), "--set", trainer.sets(drains)]
    deadline = time.monotonic() + 600 + trainer.drain_s * drains
    with open(root / f"{run_id}.out", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        noticed = drive(proc, run_dir, drains, deadline)
        proc.wait(timeout=max(60.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:  # an error here: let the run tear its cluster down
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"tpupipe run exited {proc.returncode}; its run directory is {run_dir}")
    trials = per_drain(events((run_dir / "logs" / "train.log").read_text()), noticed)
    detail = {"drains": trials, "sets": trainer.sets(drains), "run_dir": str(run_dir)}
    if all(t["committed"] and t["steps_repeated"] == 0 for t in trials):
        shutil.rmtree(root, ignore_errors=True)
    return detail


def trainer_figures(trainer: Trainer, drains: int) -> list[Figure]:
    found = measure(trainer, drains)
    trials = found["drains"]
    repeated = [t["steps_repeated"] for t in trials]
    committed = sum(1 for t in trials if t["committed"])
    detail = {
        "drains": drains,
        "given": len(trials),  # fewer where the run ended before its last notice
        "notice_s": NOTICE_S,
        "steps_repeated": repeated,
        "saved_steps": [t["saved_step"] for t in trials],
        "notice_to_saved_s": [round(t["notice_to_saved_s"], 2) if t["notice_to_saved_s"] else None for t in trials],
        "notice_to_restart_s": [
            round(t["notice_to_restart_s"], 2) if t["notice_to_restart_s"] else None for t in trials
        ],
        "run": found,
    }
    name = f"drain with notice ({trainer.name}, {drains} drains, {NOTICE_S} s notice)"
    worst = max((r for r in repeated if r is not None), default=-1)
    missing = sum(1 for r in repeated if r is None)
    target = f">= {trainer.issue_drains}"
    return [
        Figure(f"{name}: drains that committed a just-in-time checkpoint", committed, "", target, detail),
        Figure(f"{name}: steps repeated, most of a drain", worst if not missing else math.inf, "steps", "<= 0"),
    ]


def figures(fsdp: int | None = None, maxtext: int | None = None) -> list[Figure]:
    """Both trainers' figures, one run each (a count of 0 skips a trainer), each measured in a process of its own:
    Ray's client keeps the first cluster token it reads for the process, and each run has its own (the second run's
    notices were refused, InvalidAuthToken). A trainer whose run fails gives a failing figure, not the other's loss."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    out = []
    for trainer, drains in ((FSDP, fsdp), (MAXTEXT, maxtext)):
        drains = trainer.drains() if drains is None else drains
        if drains <= 0:
            continue
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            try:
                out += pool.submit(trainer_figures, trainer, drains).result()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - the bench reports it as the trainer's figure
                name = f"drain with notice ({trainer.name}, {drains} drains, {NOTICE_S} s notice): the run measured"
                out.append(Figure(name, 0, "", ">= 1", {"error": str(exc)}))
    return out


if __name__ == "__main__":
    counts = [int(a) for a in sys.argv[1:3]]
    print(table(figures(*counts)))
