"""The processes of a local run: each started as its own process group with ``TPUPIPE_RUN_ID`` (:data:`RUN_MARKER`)
in its environment, which everything it starts inherits, so that teardown finds every process of the run, the ones
that left their group too (Ray's job supervisors, say), and nothing of another run's."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from components.platforms import procs
from components.platforms.waiting import wait_for

RUN_MARKER = "TPUPIPE_RUN_ID"
GRACE_S = 3.0  # SIGTERM to SIGKILL: Ray's `start --block` and GCS can take far longer to exit on their own


def carries_marker(pid: int, run_id: str) -> bool:
    """Whether ``pid`` is a live process of the run (its environment carries the run's marker)."""
    return procs.carries(pid, RUN_MARKER, run_id)


def run_processes(run_id: str) -> list[int]:
    """Live processes carrying this run's marker in their environment (zombies excluded)."""
    return procs.carrying(RUN_MARKER, run_id)


def spawn(cmd: list[str], env: dict[str, str] | None, log_file: Path) -> int:
    """Start ``cmd`` as its own process group (an emulated host, or the head), output to log_file."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return proc.pid


def tail(path: str | Path, lines: int = 15) -> str:
    """The last lines of a process's log."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(run_id: str, groups: list[int], grace_s: float = GRACE_S) -> list[int]:
    """Stop the run's process ``groups`` (the last first: workers before the head) and every other process of the
    run: SIGTERM, then SIGKILL to what is left after ``grace_s``; returns the processes found outside the groups."""
    for pgid in reversed(groups):
        procs.signal_group(pgid, signal.SIGTERM)
    # Processes that left their group (Ray's job supervisors, say) carry the run marker: signal them too.
    strays = [pid for pid in run_processes(run_id) if procs.group_of(pid) not in groups]
    for pid in strays:
        procs.signal_process(pid, signal.SIGTERM)
    try:
        wait_for(
            lambda: True if not run_processes(run_id) else None,
            timeout_s=grace_s,
            interval_s=0.2,
            what="a graceful exit",
        )
    except TimeoutError:
        for pgid in groups:
            procs.signal_group(pgid, signal.SIGKILL)
        for pid in run_processes(run_id):
            procs.signal_process(pid, signal.SIGKILL)
        wait_for(
            lambda: True if not run_processes(run_id) else None,
            timeout_s=10,
            interval_s=0.2,
            what=f"the processes of run {run_id} to exit",
        )
    return strays
