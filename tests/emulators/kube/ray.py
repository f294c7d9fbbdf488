"""Ray in the emulated RayClusters' pods: each RayCluster's pods run as a local Ray cluster of the manifest's shape
(``Ray.run``: the ``ray start`` KubeRay gives each pod, ``Node``), from the torch image's environment (``env``), with
Ray token authentication on when the RayCluster asks for it; its dashboard, whose Jobs API the product calls, is what
the API server's service proxy reaches (``dashboard``). With ``ready_without_ray`` and no Ray environment, the
RayCluster's status turns ready once its pods are scheduled, with no Ray behind it (the service proxy answers 503):
KubeRay's part without the Ray cluster, for tests of readiness alone; with ``jobs`` (a ``tests/emulators/rayjobs.py``
Jobs API) as well, the proxy forwards to that, the cluster's Ray token required.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

POD_RESTARTS = 3  # the times a Ray pod whose Ray start failed is started again before the cluster is left unready


@dataclass
class Node:
    """One pod's ``ray start`` as KubeRay makes it from the pod: its CPUs, its container's environment and where its
    output goes (the pod's log); a worker's custom resources and labels (the head's: None)."""

    pod: str
    cpus: str | float  # a rayStartParams num-cpus, or a cpu limit
    env: dict[str, str]
    log: Path
    resources: dict | None = field(default=None, kw_only=True)
    labels: dict | None = field(default=None, kw_only=True)


class Ray:
    """The local Ray clusters of the RayClusters, by (namespace, name) (``clusters``, guarded by ``lock``); ``env``:
    components.envs.Env of the torch image, for the raylets (None: never start Ray); logs and the no-Ray record's
    directory under ``work_dir``."""

    def __init__(self, work_dir: Path, lock, env=None):
        self.work_dir, self.lock, self.env = work_dir, lock, env
        self.ready_without_ray = False  # no Ray environment: the status turns ready once the pods are scheduled
        # A fault: the Ray cluster runs without token authentication whatever its spec says (a Ray older than 2.52 in
        # the image, or RAY_AUTH_MODE=disabled baked into it), so it answers requests that carry no token.
        self.auth_off = False
        self.jobs = None  # with ready_without_ray: the Jobs API (rayjobs.RayJobsEmulator) behind the head's proxy
        self._own_jobs = False  # the Jobs API was made here (not given by a test): stopped with the server
        self.clusters: dict[tuple[str, str], dict] = {}  # (namespace, raycluster) -> local Ray cluster record
        self._stopping: dict[tuple[str, str], threading.Thread] = {}  # a RayCluster's Ray being stopped (stop)

    def dashboard(self, key: tuple[str, str]) -> int | None:
        """The port of the dashboard of the RayCluster ``key``'s Ray; None while it has none."""
        with self.lock:
            record = self.clusters.get(key)
        return None if record is None else record["dashboard"]

    def serve_jobs(self, key: tuple[str, str], token: str) -> None:
        """The RayCluster ``key`` without Ray: its head's dashboard is the emulated Jobs API, with its Ray token."""
        if self.jobs is None:
            from tests.emulators.rayjobs import RayJobsEmulator

            self.jobs = RayJobsEmulator()
            self.jobs.start()
            self._own_jobs = True
        self.jobs.token = token
        self.clusters[key] = {
            "processes": [],
            "temp_dir": self.work_dir / "no-ray",
            "dashboard": self.jobs.port,
            "token": self.jobs.token,
            "run_id": f"no-ray-{secrets.token_hex(6)}",  # no process of any run is this cluster's
        }

    def run(self, key: tuple[str, str], run_id: str, token: str, nodes: list[Node]) -> bool:
        """Start the RayCluster ``key``'s Ray: ``nodes`` (the head first), their processes marked with ``run_id``;
        True once every node is alive, False when it never is (or the cluster was stopped meanwhile)."""
        from components.platforms.local import cluster, processes
        from components.platforms.local.ports import allocate_ports

        workers = nodes[1:]
        ports = allocate_ports(len(workers))
        temp_dir = Path(tempfile.gettempdir()) / f"tk-{secrets.token_hex(4)}"
        record = {
            "processes": [],
            "temp_dir": temp_dir,
            "dashboard": ports[0]["dashboard-port"],
            "token": token,
            "run_id": run_id,
        }
        with self.lock:
            self.clusters[key] = record
        env = self.env
        gcs = f"127.0.0.1:{ports[0]['port']}"
        base_env = {
            **os.environ,
            # KubeRay sets RAY_ADDRESS in the head and every worker pod to the head's GCS address (KubeRay's docs,
            # "Network-related environment variables"; https://github.com/ray-project/kuberay/pull/388), so nothing
            # in a pod looks for "the" Ray cluster of the machine.
            "RAY_ADDRESS": gcs,
            processes.RUN_MARKER: run_id,
            "PATH": f"{env.bin}{os.pathsep}{os.environ['PATH']}",
            "VIRTUAL_ENV": env.path,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
            # The emulated nodes have no chips: as on the local platform's hosts (components/platforms/local/
            # cluster.py), torch does not autoload the torch image's torch_tpu into every process that imports it
            # (seconds each); trainers.devices.detect_backend imports torch_tpu itself where chips exist.
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            # A pod's disk is its own; the emulated pods share this machine's, which other work may have filled past
            # Ray's 95% rule: turned off as on the local hosts (components/platforms/local/cluster.py).
            "RAY_local_fs_capacity_threshold": "1",
        }
        base_env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {"RAY_AUTH_MODE": "disabled"}
        ray = str(env.bin / "ray")
        common = [
            "--block",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            f"--object-store-memory={cluster.OBJECT_STORE_BYTES}",
        ]
        head = ports[0]
        cmd = [
            ray,
            "start",
            "--head",
            *common,
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            f"--num-cpus={nodes[0].cpus}",
            f"--temp-dir={temp_dir / 'head'}",
            *[f"--{k}={v}" for k, v in head.items()],
        ]
        launches = [(cmd, base_env | nodes[0].env, nodes[0].log)]
        for index, (node, node_ports) in enumerate(zip(workers, ports[1:], strict=True)):
            cmd = [
                ray,
                "start",
                f"--address={gcs}",
                *common,
                f"--num-cpus={node.cpus}",
                f"--resources={json.dumps(node.resources)}",
                f"--labels={json.dumps(node.labels)}",
                f"--temp-dir={temp_dir / f'w{index}'}",
                *[f"--{k}={v}" for k, v in node_ports.items()],
            ]
            launches.append((cmd, base_env | node.env, node.log))
        record["launches"], record["head_port"] = launches, head["port"]
        self._launch(record)
        return self._watch_ready(key, len(nodes), deadline=time.monotonic() + 240)

    def _launch(self, record: dict) -> None:
        """Start the pods' Ray: the head (until its GCS port opens), then the workers."""
        from components.platforms.local import processes

        (head, *workers) = record["launches"]
        record["processes"] = [processes.spawn(*head)]
        deadline = time.monotonic() + 120
        while not self._port_open(record["head_port"]) and time.monotonic() < deadline:
            time.sleep(0.5)
        record["processes"] += [processes.spawn(*worker) for worker in workers]

    def _recreate_ended_pods(self, record: dict) -> bool:
        """Whether a Ray pod's container had ended before the cluster was ready (``ray start`` gives up when the GCS
        answers too slowly on a loaded machine), and so was started again: KubeRay deletes a Ray pod whose container
        has terminated and creates it again (``shouldDeletePod``, https://github.com/ray-project/kuberay/pull/1386).
        The head's: the workers, which cannot join without it, start again with it; a worker's: that pod alone."""
        from components.platforms import procs
        from components.platforms.local import processes

        pids = record["processes"]
        head_ended = not procs.alive(pids[0])
        ended = range(len(pids)) if head_ended else [i for i, pid in enumerate(pids) if i and not procs.alive(pid)]
        if not ended:
            return False
        for index in ended:
            procs.signal_group(pids[index], signal.SIGKILL)
            if not head_ended:
                pids[index] = processes.spawn(*record["launches"][index])
        if head_ended:
            self._launch(record)
        record["restarts"] = record.get("restarts", 0) + 1
        return True

    @staticmethod
    def _port_open(port: int) -> bool:
        import socket

        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def _alive_nodes(self, record: dict) -> int:
        import requests

        headers = {"Authorization": f"Bearer {record['token']}"} if record["token"] else {}
        try:
            r = requests.get(f"http://127.0.0.1:{record['dashboard']}/nodes?view=summary", headers=headers, timeout=5)
            nodes = r.json()["data"]["summary"]
        except Exception:  # noqa: BLE001 - a dashboard not answering has no live nodes
            return 0
        return sum(1 for n in nodes if n.get("raylet", {}).get("state") == "ALIVE")

    def _watch_ready(self, key: tuple[str, str], want: int, deadline: float) -> bool:
        while time.monotonic() < deadline:
            with self.lock:
                record = self.clusters.get(key)
            if record is None:
                return False
            if self._alive_nodes(record) >= want:
                return True
            if record.get("restarts", 0) < POD_RESTARTS and self._recreate_ended_pods(record):
                deadline = time.monotonic() + 240
            time.sleep(1.0)
        return False

    def wait_stopped(self, key: tuple[str, str]) -> None:
        """Until the Ray that RayCluster ``key`` had before (``stop``) has ended."""
        stopping = self._stopping.get(key)
        if stopping is not None:
            stopping.join()

    def stop(self, key: tuple[str, str]) -> None:
        """RayCluster ``key``'s Ray stopped, in the background (``wait_stopped`` waits for it)."""
        with self.lock:  # at once: a RayCluster admitted again (Kueue) starts a Ray of its own, not stopped by this
            record = self.clusters.pop(key, None)
        stopping = threading.Thread(target=self._stop_record, args=(record,), daemon=True)
        self._stopping[key] = stopping
        stopping.start()

    def stop_all(self) -> None:
        """Every Ray stopped (and the Jobs API made here)."""
        for key in list(self.clusters):
            with self.lock:
                record = self.clusters.pop(key, None)
            self._stop_record(record)
        if self._own_jobs:
            self.jobs.stop()

    def _stop_record(self, record: dict | None) -> None:
        import shutil

        from components.platforms import procs
        from components.platforms.local import processes

        if not record:
            return
        for pid in reversed(record["processes"]):
            procs.signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + processes.GRACE_S
        while time.monotonic() < deadline and processes.run_processes(record["run_id"]):
            time.sleep(0.2)
        for pid in record["processes"]:
            procs.signal_group(pid, signal.SIGKILL)
        for pid in processes.run_processes(record["run_id"]):
            procs.signal_process(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and processes.run_processes(record["run_id"]):
            time.sleep(0.2)
        shutil.rmtree(record["temp_dir"], ignore_errors=True)

    def job_status(self, submission_id: str) -> str:
        """A Ray job's status (``RUNNING``, say) as the Jobs API of the local Ray cluster running it reports it; ''
        while no cluster knows the job."""
        import requests

        with self.lock:
            records = list(self.clusters.values())
        for record in records:
            headers = {"Authorization": f"Bearer {record['token']}"} if record["token"] else {}
            url = f"http://127.0.0.1:{record['dashboard']}/api/jobs/{submission_id}"
            try:
                r = requests.get(url, headers=headers, timeout=5)
            except requests.RequestException:
                continue
            if r.ok:
                return r.json().get("status", "")
        return ""
