"""The local platform: a real multi-node Ray cluster on this machine.

One Ray head and N worker raylets (N emulated hosts), each its own process group, on loopback, on ports
chosen free (``ports``), under a run-scoped temporary directory, all from the trainer image's environment, and the
host keeper that replaces a lost host (``keeper``). Every process this run starts carries ``TPUPIPE_RUN_ID``
(``processes``) and ``RAY_ADDRESS`` (the run's own GCS address) in its environment and is recorded in the run's ledger
(``ledger.json`` in the run's directory, ``components.platforms.ledger``) before anything waits on it, so teardown finds
exactly what the run started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from components.platforms import Platform, RunContext, interrupts, postmortem, procs
from components.platforms import ledger as ledgers
from components.platforms.local import auth, envs, keeper, processes
from components.platforms.local.ports import LOOPBACK, allocate_ports, bound
from components.platforms.local.processes import RUN_MARKER, carries_marker, run_processes
from components.platforms.store import LocalStore
from components.platforms.waiting import wait_for
from components.spec import InfraError, SpecError, ready_limits
from components.workload.derive import trainer_image

OBJECT_STORE_BYTES = 200 * 1024 * 1024
# What a local run needs free where its temporary directory is (Ray's logs and spilled objects, the datasets cache),
# asked for before anything starts, instead of Ray's rule: no new objects once the disk is 95% used (12 GiB free on a
# shared 250 GiB disk; local_fs_capacity_threshold, https://github.com/ray-project/ray/blob/master/src/ray/common/
# ray_config_def.h), which the hosts turn off (host_environment).
MIN_FREE_BYTES = 1 << 30


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


# ---------------------------------------------------------------- the platform


class LocalPlatform(Platform):
    name = "local"

    def __init__(self, log=print):
        self.log = log

    # -- ledger: what this run started, written before anything waits on it
    def _load(self, ctx: RunContext) -> dict[str, Any] | None:
        return ledgers.load(ctx.store)

    def _note(self, ctx: RunContext, **fields: Any) -> dict[str, Any]:
        """Set ``fields`` in the stored ledger (those already set are kept); the ledger as written."""

        def note(ledger: dict[str, Any]) -> None:
            for key, value in fields.items():
                ledger[key] = ledger.get(key) or value

        return ledgers.update(ctx.store, note)

    def check_access(self, ctx: RunContext) -> None:
        """Nothing to find: the local platform keeps its runs on this machine and calls no cloud."""

    def check(self, ctx: RunContext) -> None:
        if ctx.spec.cluster.accelerator != "cpu":
            raise SpecError(
                "cluster.accelerator",
                f"the local platform emulates CPU hosts; preset {ctx.spec.name!r} asks for "
                f"{ctx.spec.cluster.accelerator!r}: run it with platform=gke, or set cluster.accelerator=cpu",
                ["cpu"],
            )
        if ctx.store.local() is None:
            raise SpecError(
                "output_root",
                f"the local platform keeps its runs on this machine, not in {ctx.store.uri}",
                ["a local directory (default ./runs)"],
            )
        model_id = ctx.spec.train.model_id
        if model_id.startswith(("/", "./", "../", "~")) and not Path(model_id).expanduser().is_dir():
            # Local hosts share this machine's files, so a model directory must be here (on GKE it is a path the
            # pods see, such as the bucket under /data).
            raise SpecError(
                "train.model_id",
                f"directory not found: {model_id}",
                ["a hub name", "a local directory (config, weights, tokenizer)", "scratch:<config>"],
            )

    @staticmethod
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

    # -- provision: start the head and the worker raylets
    def provision(self, ctx: RunContext) -> dict[str, Any]:
        self.check(ctx)
        ledger = self._load(ctx)
        if (
            ledger
            and ledger["processes"]
            and procs.alive(ledger["processes"][0]["pid"])
            and not ledger.get("processes_stopped")
            and not ledger.get("teardown_started")
        ):
            self.log(f"re-attaching to the running cluster of {ctx.run_id} ({ledger['dashboard_url']})")
            return self._describe(ledger)
        if ledger:  # a previous attempt died half-way: clear what it left before starting again
            self._stop(ctx, ledger)
        self.check_disk(Path(tempfile.gettempdir()))
        env = envs.ensure_env(trainer_image(ctx.spec), log=self.log)
        ledger = self._new_ledger(ctx, env)
        ledgers.replace(ctx.store, ledger)
        self._start(ctx, ledger, env)
        return self._describe(ledger)

    @staticmethod
    def _new_ledger(ctx: RunContext, env) -> dict[str, Any]:
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

    @staticmethod
    def host_environment(run_id: str, gcs_address: str, env, token_path: str) -> dict[str, str]:
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
            # The hosts here are CPU (check): torch's autoload of the torch image's torch_tpu (with torch._dynamo and
            # libtpu) would only add 15-20 s to every process that imports torch, a restarted worker group's too.
            # Where chips exist, trainers.fsdp.detect_backend imports torch_tpu itself.
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            # Ray Train's preemption watcher (an actor per training run) polls Ray's drain state, which only a
            # platform that drains nodes sets (GKE spot, through KubeRay); nothing drains these hosts.
            # (RAY_TRAIN_ENABLE_PREEMPTION_WATCHER, ray/train/v2/_internal/constants.py.)
            "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
            # Ray's disk rule is a fraction of the disk (MIN_FREE_BYTES); a threshold of 1 reads as "never over
            # capacity" (FileSystemMonitor::CheckIfAnyPathOverCapacity,
            # https://github.com/ray-project/ray/blob/master/src/ray/common/file_system_monitor.cc). Provision asks
            # for the free space a run needs instead.
            "RAY_local_fs_capacity_threshold": "1",
            # The run's own token (auth): not ~/.ray/auth_token, which any local ray.init() writes and every run of
            # this user would share.
            **auth.environment(token_path),
        }

    def _start(self, ctx: RunContext, ledger: dict[str, Any], env) -> None:
        """The head (waited on), one raylet per emulated host, then the keeper; each recorded as it starts."""
        cluster, temp_dir, head = ctx.spec.cluster, Path(ledger["temp_dir"]), ledger["ports"][0]
        process_env = self.host_environment(ctx.run_id, ledger["gcs_address"], env, ledger["auth_token_path"])
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
        self.log(
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
        self._spawn(ctx, ledger, "head", head_cmd, process_env)
        wait_for(
            lambda: self._head_up(ctx, ledger),
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
            if cluster.host_start_delay_s:  # the same process (exec) joins later: a node still pulling its image
                worker_cmd = ["/bin/sh", "-c", f'sleep {cluster.host_start_delay_s}; exec "$@"', "sh", *worker_cmd]
            self._spawn(ctx, ledger, f"host-{index}", worker_cmd, process_env)
        self._spawn(ctx, ledger, "keeper", keeper.command(ctx.run_dir / ledgers.KEY), process_env)

    def _spawn(self, ctx: RunContext, ledger: dict, role: str, cmd: list[str], env: dict) -> None:
        log_file = ctx.run_dir / "logs" / f"{role}.out"
        with interrupts.deferred():  # an interrupt never falls between starting a process and recording it
            pid = processes.spawn(cmd, env, log_file)
            entry = {"role": role, "pid": pid, "pgid": pid, "log": str(log_file), "cmd": cmd}
            ledger["processes"].append(entry)
            ledgers.update(ctx.store, lambda stored: stored["processes"].append(entry))

    def _head_up(self, ctx: RunContext, ledger: dict) -> bool | None:
        self._raise_if_dead(ledger)
        host, port = ledger["gcs_address"].split(":")
        with socket.socket() as s:
            s.settimeout(0.5)
            return True if s.connect_ex((host, int(port))) == 0 else None

    @staticmethod
    def _raise_if_dead(ledger: dict) -> None:
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

    @staticmethod
    def _describe(ledger: dict) -> dict[str, Any]:
        return {k: ledger[k] for k in ("gcs_address", "dashboard_url", "num_hosts", "temp_dir")} | {
            "pids": [p["pid"] for p in ledger["processes"]]
        }

    # -- build_image: the trainer image's environment, by content hash
    def build_image(self, ctx: RunContext) -> dict[str, Any]:
        env = envs.ensure_env(trainer_image(ctx.spec), log=self.log)
        return {**env.to_dict(), "image": f"local/{env.image}@{env.digest}"}

    # -- deploy_raycluster: wait until the head and every host are alive
    def deploy_raycluster(self, ctx: RunContext) -> dict[str, Any]:
        ledger = self._load(ctx)
        if not ledger:
            raise InfraError(f"no cluster recorded for run {ctx.run_id}: provision did not run")
        want = ledger["num_hosts"] + 1

        def alive_nodes() -> int | None:
            self._raise_if_dead(self._load(ctx))
            try:
                alive = auth.alive_nodes(ledger["dashboard_url"], ledger["auth_token_path"])
            except Exception:  # noqa: BLE001 - the dashboard is still starting
                return None
            return alive if alive >= want else None

        started = time.monotonic()
        seen = wait_for(
            alive_nodes,
            timeout_s=ready_limits(ctx.spec).deadline_s,
            interval_s=1.0,
            what=f"{want} Ray nodes (head + {want - 1} hosts) to be alive",
            progress=lambda s: self.log(f"  waiting for {want} nodes ... {s:.0f}s") if int(s) % 10 == 0 else None,
        )
        self.log(f"Ray cluster ready: {seen} nodes alive after {time.monotonic() - started:.1f}s")
        return {"nodes_alive": seen, "dashboard_url": ledger["dashboard_url"]}

    def job_client(self, ctx: RunContext, deadline: float | None = None):
        from ray.job_submission import JobSubmissionClient

        ledger = self._load(ctx)
        if not ledger:
            raise InfraError(f"no cluster recorded for run {ctx.run_id}: provision did not run")
        return JobSubmissionClient(ledger["dashboard_url"], headers=auth.headers(ledger["auth_token_path"]))

    def job_output_dir(self, ctx: RunContext) -> str:
        return str(ctx.run_dir / "train")

    def checkpoint_uri(self, ctx: RunContext, path: str) -> str:
        return path  # the jobs write on this machine

    def checkpoint_path(self, ctx: RunContext, uri: str) -> str:
        if "://" in uri:
            raise SpecError(
                "train.init_from",
                f"the local platform reads checkpoints on this machine; {uri} is not "
                "one (a model of the Vertex AI registry)",
            )
        if not Path(uri).is_dir():
            raise SpecError("train.init_from", f"checkpoint {uri} of the registered version is gone from this machine")
        return uri

    def registry_place(self, ctx: RunContext) -> dict[str, str]:
        return {"output_root": str(ctx.run_dir.parent)}  # <output root>/registry, beside the runs

    def hosts_lost(self, ctx: RunContext) -> int | None:
        """The hosts the keeper replaced, as the ledger records them."""
        ledger = self._load(ctx) or {}
        return sum(p.get("replacements", 0) for p in ledger.get("processes", []) if p["role"].startswith("host-"))

    # -- teardown: stop exactly what this run started, free its ports, keep its outputs
    def teardown(self, ctx: RunContext) -> dict[str, Any]:
        ledger = self._load(ctx)
        if not ledger:
            leftover = run_processes(ctx.run_id)
            for pid in leftover:
                procs.signal_process(pid, signal.SIGKILL)
            return {
                "stopped_groups": 0,
                "strays": len(leftover),
                "note": "no cluster was recorded",
                "deleted": [f"process {pid}" for pid in leftover],
            }
        return self._stop(ctx, ledger)

    def _stop(self, ctx: RunContext, ledger: dict) -> dict[str, Any]:
        # Teardown began: the keeper replaces no host from now on. Then the keeper is stopped, and the ledger read
        # again as it left it (with a replacement it may have just recorded).
        ledger = self._note(ctx, teardown_started=time.time())
        keepers = [p for p in ledger["processes"] if p["role"] == "keeper" and carries_marker(p["pid"], ctx.run_id)]
        for proc in keepers:
            procs.signal_group(proc["pgid"], signal.SIGKILL)
            wait_for(
                lambda p=proc: True if not procs.alive(p["pid"]) else None,
                timeout_s=10,
                interval_s=0.1,
                what="the host keeper to exit",
            )
        ledger = self._note(ctx, teardown_started=time.time())
        # Only groups whose leader is still ours: a pid (and its group id) may since belong to another process.
        live = [p for p in ledger["processes"] if carries_marker(p["pid"], ctx.run_id)]
        groups = [p["pgid"] for p in live]
        strays = processes.stop(ctx.run_id, groups)
        postmortem.ray_session_logs(ctx.store, {d.name: d for d in Path(ledger["temp_dir"]).glob("*") if d.is_dir()})
        shutil.rmtree(ledger["temp_dir"], ignore_errors=True)
        busy = bound(ledger["ports"])
        self._note(ctx, processes_stopped=True)
        self.log(
            f"stopped {len(groups)} process groups of {ctx.run_id}"
            + (f" and {len(strays)} processes outside them" if strays else "")
        )
        deleted = [f"{p['role']} (pid {p['pid']})" for p in live + keepers] + [f"process {pid}" for pid in strays]
        return {"stopped_groups": len(groups), "strays": len(strays), "ports_still_bound": busy, "deleted": deleted}

    def remaining(self, ctx: RunContext) -> list[str]:
        """What of the run is still running, found from its ledger and its marker (read here, no call made)."""
        ledger = self._load(ctx) or {"processes": []}
        live = [p for p in ledger["processes"] if carries_marker(p["pid"], ctx.run_id)]
        recorded = {p["pid"] for p in live}
        others = [pid for pid in run_processes(ctx.run_id) if pid not in recorded]
        return [f"{p['role']} (pid {p['pid']})" for p in live] + (
            [f"{len(others)} more processes carrying {RUN_MARKER}={ctx.run_id}"] if others else []
        )
