"""The host keeper of a local run: KubeRay's part for the emulated hosts, a process of its own
(``python -m components.platforms.local.keeper keep LEDGER``) that the run starts after its hosts."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Any

from components.platforms import interrupts, procs
from components.platforms import ledger as ledgers
from components.platforms.local.processes import spawn
from components.platforms.store import LocalStore


def command(ledger_path: Path) -> list[str]:
    """The keeper's command line, for the run whose ledger is at ``ledger_path``."""
    return [sys.executable, "-m", "components.platforms.local.keeper", "keep", str(ledger_path)]


# How often the keeper looks for a lost host: a replacement's raylet must register before Ray Train's new worker group
# can be placed, so every second here is a second of recovery; a look is a read of the ledger and a signal 0 per host.
INTERVAL_S = 0.2


def keep(ledger_path: Path, interval_s: float = INTERVAL_S, log=print) -> str:
    """Play KubeRay's part for the emulated hosts: when a host's process is gone (a lost host, a deleted
    pod), start a replacement with the same command, as KubeRay recreates a worker pod; with the spec's
    ``cluster.host_replace_delay_s``, that long after it saw the host gone (a preempted Spot VM's replacement comes
    later). Runs until teardown begins or the run's driver is gone (then ``tpupipe teardown RUN_ID`` stops the
    rest); returns why it stopped."""
    lost: dict[int, float] = {}  # pid of a host seen gone -> when
    while True:
        store = LocalStore(ledger_path.parent)
        ledger = ledgers.load(store)
        reason = _done(ledger, ledger_path)
        if ledger is None or reason:
            log(f"keeper: {reason}: exiting")
            return reason
        delay = float(((ledger.get("spec") or {}).get("cluster") or {}).get("host_replace_delay_s") or 0.0)
        for proc in ledger["processes"]:
            if proc["role"].startswith("host-") and not procs.alive(proc["pid"]):
                if proc["pid"] not in lost and delay:
                    log(f"{proc['role']} (pid {proc['pid']}) is gone: its replacement starts in {delay:.0f}s")
                if time.monotonic() - lost.setdefault(proc["pid"], time.monotonic()) < delay:
                    continue
                if _done(ledgers.load(store) or ledger, ledger_path):  # teardown may have begun since
                    break
                log(f"{proc['role']} (pid {proc['pid']}) is gone: starting a replacement")
                pid = spawn(proc["cmd"], None, Path(proc["log"]))
                ledgers.update(store, functools.partial(_replaced, role=proc["role"], pid=pid))
        time.sleep(interval_s)


def _replaced(ledger: dict[str, Any], role: str, pid: int) -> None:
    """Record ``pid`` as the process of ``role`` now, one replacement more."""
    for proc in ledger["processes"]:
        if proc["role"] == role:
            proc["pid"] = proc["pgid"] = pid
            proc["replacements"] = proc.get("replacements", 0) + 1


def _done(ledger: dict[str, Any] | None, ledger_path: Path) -> str:
    """Why the keeper stops ('' while it keeps the hosts): teardown began, or the run's driver is gone (or its
    ledger, with the run's directory)."""
    if ledger is None:
        return f"the run's ledger {ledger_path} is gone"
    if ledger.get("teardown_started"):
        return "teardown began"
    driver = ledger.get("driver")
    if driver and not interrupts.alive(driver):
        return (
            f"the run's driver (pid {driver['pid']}) is gone; `tpupipe teardown {ledger['run_id']} --output-root "
            f"{ledger_path.parent.parent}` stops the cluster"
        )
    return ""


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="The local platform's host keeper.")
    parser.add_argument("command", choices=("keep",))
    parser.add_argument("ledger", help="the run's ledger.json")
    args = parser.parse_args(argv)
    keep(Path(args.ledger), log=lambda m: print(m, flush=True))


if __name__ == "__main__":
    main()
