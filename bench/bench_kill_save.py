"""Kills during a save, then resumes: the FSDP trainer's ranks SIGKILLed at seeded random points of a sharded save's
write, TPUPIPE_BENCH_KILLS times (30 by default), each followed by a resume on 1, 2 or 3 ranks
(``tests/e2e/kill_during_save.py``, in the torch trainer environment, no Ray, its ranks forked; about 10 s a trial on
2 cores).

Figures: the resumes that restored a checkpoint whose DCP index was not in place before the resume (target 0); the
resumes that restored anything but the newest committed one (target 0); the steps a resume ran again, the most of
any trial: the killed save's period (its write is what was lost) plus the steps trained while that write ran (the
save is asynchronous: training goes on during it, and the next save waits for it), so at most two periods; and the
resumes that did not end at the loss of a run never killed (target 0). The same number of kills of MaxText during
Orbax saves (``tests/e2e/maxtext_kill_during_save.py``, about 35 s a trial): restarts that restored other than the
newest step renamed before them (target 0), and the steps run again (at most two periods).
``python bench/bench_kill_save.py [KILLS]`` runs it alone.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.figures import Figure, table

REPO = Path(__file__).resolve().parents[1]

KILLS = int(os.environ.get("TPUPIPE_BENCH_KILLS", "30"))
SEED = 30


def facts(kills: int, env_name: str = "torch", script: str = "kill_during_save.py") -> dict:
    from components.platforms.local import envs

    python = envs.ensure_env(env_name, log=lambda _m: None).python
    with tempfile.TemporaryDirectory(prefix="tpupipe-kill-save-") as tmp:
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [python, str(REPO / "tests" / "e2e" / script), tmp, str(kills), str(SEED)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120 * kills + 300,
            env=env,
        )
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])


def maxtext_figures(kills: int) -> list[Figure]:
    """MaxText killed during Orbax saves (``tests/e2e/maxtext_kill_during_save.py``): the restarts whose restored
    step (MaxText's own log line) was not the newest step renamed before the restart, and the steps run again."""
    found = facts(kills, "maxtext", "maxtext_kill_during_save.py")
    trials, period = found["trials"], found["period"]
    newest = [max((int(n) for n, done in t["committed_before_resume"].items() if done), default=None) for t in trials]
    wrong = [t for t, n in zip(trials, newest, strict=True) if t["restored_step"] != n or t["resumed_rc"] != 0]
    repeated = [t["last_step_before_kill"] - n for t, n in zip(trials, newest, strict=True)]
    detail = {"kills": len(trials), "seed": SEED, "period": period, "steps_repeated": repeated}
    detail["kill_points"] = [t["kill"] for t in trials]
    name = f"kill during save (MaxText, {len(trials)} kills)"
    return [
        Figure(f"{name}: restores of other than the newest committed step", len(wrong), "", "<= 0", detail),
        Figure(
            f"{name}: steps repeated, most of a trial (period {period})", max(repeated), "steps", f"<= {2 * period}"
        ),
    ]


def figures(kills: int = KILLS) -> list[Figure]:
    found = facts(kills)
    trials, period = found["trials"], found["period"]
    newest = [max((n for n, done in t["committed_before_resume"].items() if done), default=None) for t in trials]
    uncommitted = [t for t in trials if t["restored"] and not t["committed_before_resume"].get(t["restored"])]
    other = [t for t, n in zip(trials, newest, strict=True) if t["restored"] != n]
    repeated = [t["steps_repeated"] for t in trials]
    diverged = [t for t in trials if abs(t["final_loss"] - t["reference_loss"]) > 1e-4]
    detail = {
        "kills": len(trials),
        "killed": sum(t["killed"] for t in trials),
        "seed": SEED,
        "period": period,
        "steps_repeated": repeated,
        "resume_worlds": [t["resume_world"] for t in trials],
        "kill_points": [t["kill"] for t in trials],
    }
    name = f"kill during save (FSDP2, {len(trials)} kills)"
    return [
        Figure(f"{name}: restores of an uncommitted checkpoint", len(uncommitted), "", "<= 0", detail),
        Figure(f"{name}: restores of other than the newest committed", len(other), "", "<= 0"),
        Figure(
            f"{name}: steps repeated, most of a trial (period {period})", max(repeated), "steps", f"<= {2 * period}"
        ),
        Figure(f"{name}: resumes not at the unkilled run's loss", len(diverged), "", "<= 0"),
        *maxtext_figures(kills),
    ]


if __name__ == "__main__":
    print(table(figures(int(sys.argv[1]) if len(sys.argv) > 1 else KILLS)))
