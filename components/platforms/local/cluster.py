"""The local platform's Ray cluster: a real multi-node Ray cluster of processes on this machine.

One Ray head and N worker raylets (N emulated hosts), each its own process group, on loopback, on ports
chosen free (``ports``), under a run-scoped temporary directory, all from the trainer image's environment, and the
host keeper that replaces a lost host (``keeper``). Every process this run starts carries ``TPUPIPE_RUN_ID``
(``processes``) and ``RAY_ADDRESS`` (the run's own GCS address) in its environment and is recorded in the run's ledger
(``ledger.json`` in the run's directory, ``components.platforms.ledger``) before anything waits on it, so teardown finds
exactly what the run started.

The platform (``platform``) starts the cluster with :func:`start` when it provisions and stops it with :func:`stop`
when it tears down; the janitor (``pipelines.backends.local.run``) finds the runs left running with
:func:`orphaned_runs`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.platforms import RunContext, interrupts, postmortem, procs
from components.platforms import ledger as ledgers
from components.platforms.local import auth, keeper, processes
from components.platforms.local.envs import Env
from components.platforms.local.ports import LOOPBACK, allocate_ports, bound
from components.platforms.local.processes import RUN_MARKER, carries_marker, run_processes
from components.platforms.store import LocalStore
from components.platforms.waiting import wait_for
from components.spec import InfraError, RunSpec, ready_limits

OBJECT_STORE_BYTES = 200 * 1024 * 1024
# What a local run needs free where its temporary directory is (Ray's logs and spilled objects, the datasets cache),
# asked for before anything starts, instead of Ray's rule: no new objects once the disk is 95% used (12 GiB free on a
# shared 250 GiB disk; local_fs_capacity_threshold, https://github.com/ray-project/ray/blob/master/src/ray/common/
# ray_config_def.h), which the hosts turn off (host_environment).
MIN_FREE_BYTES = 1 << 30

# How soon a lost host is noticed, in what every process of a local run inherits (host_environment). Local only: the
# hosts are processes on loopback, where a lost host's raylet refuses the next connection at once and no network
# delays a live one; on GKE a check crosses the network and a TPU host under load may answer late, so the gke platform
# keeps Ray's defaults.
RECOVERY_ENVIRONMENT = {
    # The GCS asks each raylet for its health every health_check_period_ms (3000 by default) and marks its node dead
    # after health_check_failure_threshold (5) failures in a row: 15 s in which a new placement group may still be
    # placed on the lost host's free resources. Here 3 refused connections 500 ms apart (1.5 s); a live raylet that
    # is merely slow still has health_check_timeout_ms (10 s, left as it is) to answer each check
    # (https://github.com/ray-project/ray/blob/master/src/ray/common/ray_config_def.h; every RayConfig entry is read
    # from its RAY_<name> environment variable: src/ray/common/ray_config.h).
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    # Ray Train's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default): a worker
    # group whose host is lost is seen failed, and a new one started, up to that much later. Each poll is one small
    # actor call per worker; with a few emulated hosts 4 polls a second cost nothing (ray 2.60,
    # ray/train/v2/_internal/constants.py, HEALTH_CHECK_INTERVAL_S_ENV_VAR, propagated by Ray Train from the job's
    # driver to its controller and workers: ENV_VARS_TO_PROPAGATE there).
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
}

# Ray starts its workers at nice 15 ("so that the OS prioritizes CPU for other processes over worker": worker_niceness
# in https://github.com/ray-project/ray/blob/master/src/ray/common/ray_config_def.h). On a real host the GCS, raylet
# and agents have cores of their own; here every emulated host shares the machine's few cores with them, and each of
# their wake-ups pre-empted a training worker at once, while its peer waited in the next collective. At 0 the
# workers take their turn with the rest (`make bench BENCH=trainer` measures the loop against torchrun).
WORKER_NICENESS = {"RAY_worker_niceness": "0"}

# Each host's log monitor tails its session's log files and looks for new ones. With fewer files than
# RAY_LOG_MONITOR_MANY_FILES_THRESHOLD (1000) it globs the log directory on every pass of its 0.1 s loop; at or above
# it, once every LOG_NAME_UPDATE_INTERVAL_S (0.5 s) (should_update_filenames in
# https://github.com/ray-project/ray/blob/master/python/ray/_private/log_monitor.py). A threshold of 0 takes the
# 0.5 s scan: a new worker's first lines reach the driver up to 0.4 s later, and the three idle monitors of a
# two-host run use half the CPU they did, on cores the training workers share.
LOG_MONITOR_SCAN = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}


def orphaned_runs(output_root: Path) -> list[str]:
    """The janitor's list: local runs under ``output_root`` whose driver is gone while processes of theirs still run
    (a run whose ledger names no driver is left alone: nothing says it is over)."""
    found = []
    for path in sorted(output_root.glob(f"*/{ledgers.KEY}")):
        ledger = ledgers.load(LocalStore(path.parent)) or {}
        if ledger.get("platform") != "local" or not ledger.get("driver") or interrupts.alive(ledger["driver"]):
            continue
        if any(carries_marker(p["pid"], ledger["run_id"]) for p in ledger.get("processes", [])) or run_processes(
            ledger["run_id"]
        ):
            found.append(ledger["run_id"])
    return found


# ---------------------------------------------------------------- starting the cluster


def check_disk(path: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """A clear error, before anything starts, when the disk that holds the run's temporary directory (Ray's
    session directories) has less free space than a run needs."""
    free = shutil.disk_usage(path).free
    if free < min_free:
        raise InfraError(
            f"the disk that holds {path} has {free / 2**30:.1f} GiB free; a local run needs at least "
            f"{min_free / 2**30:.1f} GiB there (Ray's logs and spilled objects, checkpoints): free some space "
            "and run again"
        )


def new_ledger(ctx: RunContext, env: Env) -> dict[str, Any]:
    """The ledger of a new cluster: its ports (chosen free), temp dir and addresses; no process yet."""
    cluster = ctx.spec.cluster
    ports = allocate_ports(cluster.num_hosts * cluster.num_slices)
    # Private to this user (mode 0700) and unpredictable (mkdtemp's random name), made now: no other local
    # user can pre-create it or read the sessions' sockets and logs Ray writes there, or the run's Ray token.
    temp_dir = tempfile.mkdtemp(prefix="tp-")
    head = ports[0]
    return {
        "run_id": ctx.run_id,
        "platform": "local",
        "spec": ctx.spec.to_dict(),  # what `tpupipe teardown RUN_ID` reads back
        "driver": interrupts.driver(),  # the keeper exits when it is gone
        "marker": f"{RUN_MARKER}={ctx.run_id}",  # in the environment of every process the run starts
        "env": env.path,
        "temp_dir": temp_dir,
        "auth_token_path": auth.new_token(temp_dir),
        "gcs_address": f"{LOOPBACK}:{head['port']}",
        "dashboard_url": f"http://{LOOPBACK}:{head['dashboard-port']}",
        "num_hosts": len(ports) - 1,
        "ports": ports,
        "processes": [],
    }


def host_environment(run_id: str, gcs_address: str, env: Env, token_path: str) -> dict[str, str]:
    """The environment of the run's head, hosts and keeper (and of everything Ray starts on them): the run's
    marker, its own cluster's address and token, the trainer image's environment first on the PATH."""
    return {
        **os.environ,
        RUN_MARKER: run_id,
        # This run's cluster, by name: every process Ray starts on the hosts inherits it (job drivers, Ray Train's
        # PlacementGroupCleaner), so none looks for "the" cluster among the runs this machine holds.
        "RAY_ADDRESS": gcs_address,
        "PATH": f"{env.bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": env.path,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
        # The hosts here are CPU (the platform's check): torch's autoload of the torch image's torch_tpu (with
        # torch._dynamo and libtpu) would only add 15-20 s to every process that imports torch, a restarted worker
        # group's too. Where chips exist, trainers.devices.detect_backend imports torch_tpu itself.
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        # Ray's disk rule is a fraction of the disk (MIN_FREE_BYTES); a threshold of 1 reads as "never over
        # capacity" (FileSystemMonitor::CheckIfAnyPathOverCapacity,
        # https://github.com/ray-project/ray/blob/master/src/ray/common/file_system_monitor.cc). Provision asks
        # for the free space a run needs instead.
        "RAY_local_fs_capacity_threshold": "1",
        **RECOVERY_ENVIRONMENT,
        **WORKER_NICENESS,
        **LOG_MONITOR_SCAN,
        # The run's own token (auth): not ~/.ray/auth_token, which any local ray.init() writes and every run of
        # this user would share.
        **auth.environment(token_path),
    }


def preemption_environment(spec: RunSpec) -> dict[str, str]:
    """Ray Train's preemption watcher (an actor per worker group, which polls the GCS's draining nodes and announces a
    drain to the workers: RAY_TRAIN_ENABLE_PREEMPTION_WATCHER, ray/train/v2/_internal/constants.py, propagated to the
    controller and workers) runs where the spec schedules a drain (``testing.drain_host_at_step``: the keeper's notice,
    ``keeper.preempt``), polling as every job's runtime environment says (``components.workload.derive``'s
    ``JOB_RUNTIME_ENV``, as on GKE); elsewhere it stays off, and no worker group pays for starting its actor."""
    return {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1" if spec.testing.drain_host_at_step else "0"}


def start(ctx: RunContext, ledger: dict[str, Any], env: Env, log: Callable[[str], None] = print) -> None:
    """The head (waited on), one raylet per emulated host, then the keeper; each recorded as it starts."""
    cluster, temp_dir, head = ctx.spec.cluster, Path(ledger["temp_dir"]), ledger["ports"][0]
    process_env = host_environment(ctx.run_id, ledger["gcs_address"], env, ledger["auth_token_path"])
    process_env.update(preemption_environment(ctx.spec))
    # What the run's processes write to a temporary directory (the trainers' datasets cache) goes to the run's
    # private one, deleted by teardown with the rest, as a pod's /tmp goes with the pod.
    process_env["TMPDIR"] = str(temp_dir / "tmp")
    (temp_dir / "tmp").mkdir(mode=0o700, exist_ok=True)
    ray = str(env.bin / "ray")
    common = [
        "--block",
        f"--node-ip-address={LOOPBACK}",
        "--disable-usage-stats",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
    ]
    log(
        f"starting Ray head on {ledger['gcs_address']} (dashboard {ledger['dashboard_url']}), "
        f"{ledger['num_hosts']} emulated hosts and their keeper (replaces a lost host)"
    )
    head_cmd = [
        ray,
        "start",
        "--head",
        *common,
        f"--dashboard-host={LOOPBACK}",
        "--include-dashboard=true",
        "--num-cpus=0",
        f"--temp-dir={temp_dir / 'head'}",
        *[f"--{k}={v}" for k, v in head.items()],
    ]
    spawn(ctx, ledger, "head", head_cmd, process_env)
    wait_for(
        lambda: head_up(ledger),
        timeout_s=ready_limits(ctx.spec).deadline_s,
        interval_s=0.5,
        what="the Ray head's GCS port",
    )
    for index, node_ports in enumerate(ledger["ports"][1:], start=1):
        worker_cmd = [
            ray,
            "start",
            f"--address={ledger['gcs_address']}",
            *common,
            f"--num-cpus={cluster.cpus_per_host}",
            f"--temp-dir={temp_dir / f'host{index}'}",
            f"--labels={json.dumps({'tpupipe/host': f'host-{index}'})}",
            *[f"--{k}={v}" for k, v in node_ports.items()],
        ]
        start_delay_s = ctx.spec.testing.host_start_delay_s
        if start_delay_s:  # the same process (exec) joins later: a node still pulling its image
            worker_cmd = ["/bin/sh", "-c", f'sleep {start_delay_s}; exec "$@"', "sh", *worker_cmd]
        spawn(ctx, ledger, f"host-{index}", worker_cmd, process_env)
    spawn(ctx, ledger, "keeper", keeper.command(ctx.run_dir / ledgers.KEY), process_env)


def spawn(ctx: RunContext, ledger: dict[str, Any], role: str, cmd: list[str], env: dict[str, str]) -> None:
    """Start ``cmd`` as the run's ``role`` (its output in the run's logs), recorded in ``ledger`` and the stored
    ledger before anything waits on it."""
    log_file = ctx.run_dir / "logs" / f"{role}.out"
    with interrupts.deferred():  # an interrupt never falls between starting a process and recording it
        pid = processes.spawn(cmd, env, log_file)
        entry = {"role": role, "pid": pid, "pgid": pid, "log": str(log_file), "cmd": cmd}
        ledger["processes"].append(entry)
        ledgers.update(ctx.store, lambda stored: stored["processes"].append(entry))


def head_up(ledger: dict[str, Any]) -> bool | None:
    """True once the head's GCS port takes connections, None before (what ``wait_for`` polls); raises when a process
    of the cluster exited."""
    raise_if_dead(ledger)
    host, port = ledger["gcs_address"].split(":")
    with socket.socket() as s:
        s.settimeout(0.5)
        return True if s.connect_ex((host, int(port))) == 0 else None


def raise_if_dead(ledger: dict[str, Any]) -> None:
    """An InfraError with the last lines of its log when the head or the keeper exited, or when a host keeps exiting
    (the keeper replaces a lost one)."""
    for proc in ledger["processes"]:
        if not procs.alive(proc["pid"]) and not proc["role"].startswith("host-"):  # the keeper replaces hosts
            raise InfraError(
                f"{proc['role']} (pid {proc['pid']}) exited; last lines of {proc['log']}:\n"
                + processes.tail(proc["log"])
            )
        if proc.get("replacements", 0) >= 3:
            raise InfraError(
                f"{proc['role']} keeps exiting ({proc['replacements']} replacements); last "
                f"lines of {proc['log']}:\n{processes.tail(proc['log'])}"
            )


def describe(ledger: dict[str, Any]) -> dict[str, Any]:
    """What provision returns of the cluster: its addresses, temporary directory and processes."""
    return {k: ledger[k] for k in ("gcs_address", "dashboard_url", "num_hosts", "temp_dir")} | {
        "pids": [p["pid"] for p in ledger["processes"]]
    }


# ---------------------------------------------------------------- stopping it


def note(ctx: RunContext, **fields: Any) -> dict[str, Any]:
    """Set ``fields`` in the stored ledger (those already set are kept); the ledger as written."""

    def set_unset(ledger: dict[str, Any]) -> None:
        for key, value in fields.items():
            ledger[key] = ledger.get(key) or value

    return ledgers.update(ctx.store, set_unset)


def _exited(pid: int) -> bool | None:
    """True once process ``pid`` is gone (a poll of ``wait_for``)."""
    return True if not procs.alive(pid) else None


def stop(ctx: RunContext, ledger: dict[str, Any], log: Callable[[str], None] = print) -> dict[str, Any]:
    """Stop exactly what the run started (the keeper first, then its process groups and every process carrying its
    marker), keep the Ray session logs, delete the temporary directory, check the ports are free; what was done."""
    # Teardown began: the keeper replaces no host from now on. Then the keeper is stopped, and the ledger read
    # again as it left it (with a replacement it may have just recorded).
    ledger = note(ctx, teardown_started=time.time())
    keepers = [p for p in ledger["processes"] if p["role"] == "keeper" and carries_marker(p["pid"], ctx.run_id)]
    for proc in keepers:
        procs.signal_group(proc["pgid"], signal.SIGKILL)
        wait_for(functools.partial(_exited, proc["pid"]), timeout_s=10, interval_s=0.1, what="the host keeper to exit")
    ledger = note(ctx, teardown_started=time.time())
    # Only groups whose leader is still ours: a pid (and its group id) may since belong to another process.
    live = [p for p in ledger["processes"] if carries_marker(p["pid"], ctx.run_id)]
    groups = [p["pgid"] for p in live]
    strays = processes.stop(ctx.run_id, groups)
    postmortem.ray_session_logs(ctx.store, {d.name: d for d in Path(ledger["temp_dir"]).glob("*") if d.is_dir()})
    shutil.rmtree(ledger["temp_dir"], ignore_errors=True)
    busy = bound(ledger["ports"])
    note(ctx, processes_stopped=True)
    log(
        f"stopped {len(groups)} process groups of {ctx.run_id}"
        + (f" and {len(strays)} processes outside them" if strays else "")
    )
    deleted = [f"{p['role']} (pid {p['pid']})" for p in live + keepers] + [f"process {pid}" for pid in strays]
    return {"stopped_groups": len(groups), "strays": len(strays), "ports_still_bound": busy, "deleted": deleted}
