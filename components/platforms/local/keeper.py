"""The host keeper of a local run: KubeRay's part for the emulated hosts, a process of its own
(``python -m components.platforms.local.keeper keep LEDGER``) that the run starts after its hosts."""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.platforms import interrupts, procs
from components.platforms import ledger as ledgers
from components.platforms.local.processes import spawn
from components.platforms.store import LocalStore
from components.spec import protocol


def command(ledger_path: Path) -> list[str]:
    """The keeper's command line, for the run whose ledger is at ``ledger_path``."""
    return [sys.executable, "-m", "components.platforms.local.keeper", "keep", str(ledger_path)]


# How often the keeper looks for a lost host: a replacement's raylet must register before Ray Train's new worker group
# can be placed, so every second here is a second of recovery; a look is a read of the ledger and a signal 0 per host.
INTERVAL_S = 0.2


def keep(ledger_path: Path, interval_s: float = INTERVAL_S, log: Callable[[str], None] = print) -> str:
    """Play KubeRay's part for the emulated hosts: when a host's process is gone (a lost host, a deleted
    pod), start a replacement with the same command, as KubeRay recreates a worker pod; with the spec's
    ``testing.host_replace_delay_s``, that long after it saw the host gone (a preempted Spot VM's replacement comes
    later). Runs until teardown begins or the run's driver is gone (then ``tpupipe teardown RUN_ID`` stops the
    rest); returns why it stopped."""
    lost: dict[int, float] = {}  # pid of a host seen gone -> when
    drain = Drain()
    while True:
        store = LocalStore(ledger_path.parent)
        ledger = ledgers.load(store)
        reason = _done(ledger, ledger_path)
        if ledger is None or reason:
            log(f"keeper: {reason}: exiting")
            return reason
        delay = float(((ledger.get("spec") or {}).get("testing") or {}).get("host_replace_delay_s") or 0.0)
        drain.tick(ledger, log)
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


def lose_host(host: dict[str, Any]) -> float:
    """Kill an emulated host as a lost machine dies: its process group, and every process under it that left that
    group (Ray starts each worker in a session of its own; killed with the group alone they outlive their raylet by
    seconds, and keep training). Returns the wall-clock time of the kill."""
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


# After the notice's deadline, how long before the host is killed: Ray's GCS records a drained node that dies as
# preempted only when its death comes after the drain's deadline (``GcsNodeManager::InferDeathInfo``: "was forcibly
# preempted" when the current time is past the deadline of a PREEMPTION drain, an unexpected termination before it;
# https://github.com/ray-project/ray/blob/ray-2.60.0/src/ray/gcs/gcs_node_manager.cc), and Ray Train counts only
# that death as a preemption (``RayActorError.preempted``), any other as a failure of the run's.
KILL_AFTER_DEADLINE_S = 0.3


def preempt(ledger: dict[str, Any], host: dict[str, Any], notice_s: float) -> float:
    """A preemption notice to an emulated host, as a Spot VM gets one: its Ray node drained with reason PREEMPTION
    and a deadline ``notice_s`` away, through the GCS's DrainNode (what ``ray drain-node --reason
    DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds`` sends, and what Ray 2.60's ``ray start`` sends on the
    SIGTERM of a pod's preemption: ``Node._drain_node_before_shutdown`` in https://github.com/ray-project/ray/blob/
    ray-2.60.0/python/ray/_private/node.py). Ray Train's preemption watcher announces it to the training
    (``ray.train.get_preemption_info``). Whoever noticed must still kill the host once the deadline has passed
    (:func:`lose_host`, :data:`KILL_AFTER_DEADLINE_S`), as GKE does at the grace's end. Needs the run's Ray token in
    this process's environment (the keeper's has it). Returns the wall-clock time of the notice."""
    # Ray's compiled module and generated messages carry no type information for these names
    from ray._raylet import GcsClient  # type: ignore[attr-defined]
    from ray.core.generated import autoscaler_pb2, gcs_pb2

    gcs = GcsClient(address=ledger["gcs_address"])
    nodes = [
        node_id
        for node_id, info in gcs.get_all_node_info().items()
        if info.state == gcs_pb2.GcsNodeInfo.ALIVE  # type: ignore[attr-defined]
        and dict(info.labels).get("tpupipe/host") == host["role"]
    ]
    if len(nodes) != 1:
        raise RuntimeError(f"{host['role']}: {len(nodes)} alive Ray nodes carry its label, not 1")
    noticed_at = time.time()
    accepted, why = gcs.drain_node(
        nodes[0].hex(),
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),  # type: ignore[attr-defined]
        f"{host['role']} preempted (a {notice_s:g} s notice)",
        int((noticed_at + notice_s) * 1000),
    )
    if not accepted:
        raise RuntimeError(f"{host['role']}: the drain was refused: {why}")
    return noticed_at


def latest_step(temp_dir: Path, offsets: dict[Path, int]) -> int:
    """The newest step the training workers have logged (the trainers' ``step`` events and MaxText's per-step
    metrics, in Ray's worker-*.out of every node's session under the run's temporary directory: seconds ahead of the
    stage's log, which comes through the Jobs API); -1 before any. ``offsets`` keeps where each file was read to."""
    latest = -1
    for path in sorted({p.resolve() for p in temp_dir.glob("*/session_*/logs/worker-*.out")}):
        try:
            with open(path, errors="replace") as f:
                f.seek(offsets.get(path, 0))
                text = f.read()
        except OSError:  # Ray removes the logs of workers it no longer keeps
            continue
        cut = text.rfind("\n") + 1
        offsets[path] = offsets.get(path, 0) + len(text[:cut].encode())
        for line in text[:cut].splitlines():
            m = protocol.RECORD.match(line)
            if m is None:
                continue
            for kind, payload in protocol.parse([line], m["nonce"]):
                if (kind == "event" and payload.get("event") == "step") or (kind == "metric" and "step" in payload):
                    latest = max(latest, int(payload["step"]))
    return latest


class Drain:
    """The spec's ``testing.drain_host_at_step``: once the training's workers have logged that step, a preemption
    notice to the last emulated host (:func:`preempt`), and the host killed just after the notice's deadline
    (``cluster.preemption_notice_s``; :func:`lose_host`); then the keeper replaces it as any lost host. Once a run."""

    def __init__(self, notify: Callable[[dict[str, Any], dict[str, Any], float], float] = preempt) -> None:
        self.notify = notify  # gives the notice: (ledger, host, notice_s) -> its wall-clock time
        self.offsets: dict[Path, int] = {}
        self.host: dict[str, Any] | None = None  # the host noticed
        self.kill_at = 0.0  # when it is killed (time.monotonic)
        self.done = False

    def tick(self, ledger: dict[str, Any], log: Callable[[str], None]) -> None:
        spec = ledger.get("spec") or {}
        step = int((spec.get("testing") or {}).get("drain_host_at_step") or 0)
        if not step or self.done:
            return
        if self.host is None:
            if latest_step(Path(ledger["temp_dir"]), self.offsets) < step:
                return
            hosts = [p for p in ledger["processes"] if p["role"].startswith("host-")]
            self.host = max(hosts, key=lambda p: int(p["role"].removeprefix("host-")))
            notice = float((spec.get("cluster") or {}).get("preemption_notice_s") or 0.0)
            noticed_at = self.notify(ledger, self.host, notice)
            self.kill_at = time.monotonic() - (time.time() - noticed_at) + notice + KILL_AFTER_DEADLINE_S
            log(
                f"{self.host['role']} (pid {self.host['pid']}) preempted at step {step} "
                f"(testing.drain_host_at_step): a {notice:g}s notice at {noticed_at:.3f}"
            )
            return
        if time.monotonic() >= self.kill_at:
            self.done = True
            if procs.alive(self.host["pid"]):
                killed_at = lose_host(self.host)
                log(f"{self.host['role']} (pid {self.host['pid']}) killed at the notice's end, {killed_at:.3f}")


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
