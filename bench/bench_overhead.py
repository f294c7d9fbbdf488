"""Orchestration overhead: `tpupipe run` against the same work done by hand with Ray's own CLI, side by side in one
run.

A: `tpupipe run` of local-fsdp (kfp.local runs each stage as its own process: provision, build image, deploy,
   slice check, train, evaluate, teardown).
B: what the public GKE tutorials the presets reproduce teach (docs/tutorials.md), scripted: `ray start --head` and one
   `ray start --address` per emulated host (each in the background, as in a terminal of its own), `ray job submit` of
   the slice check, the train job and the evaluate job (each waits and streams its log, as the tutorials' commands do;
   the checkpoint for evaluation is read from the train job's log), then the cluster stopped (SIGTERM to each `ray
   start`, as Ctrl-C in its terminal) and waited for.
Both sides run the same jobs, with the same commands, in the same environment, on the same number of hosts.
Target: A / B <= 1.15. The detail keeps each side's steps, to show where the time goes.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.figures import Figure, table
from components.platforms.local import envs
from components.platforms.local.cluster import OBJECT_STORE_BYTES
from components.platforms.local.ports import LOOPBACK, allocate_ports, port_is_free
from components.spec import protocol
from components.workload import resolve
from components.workload.derive import JOB_RUNTIME_ENV, job_command, trainer_image

REPO = Path(__file__).resolve().parents[1]

PRESET = "local-fsdp"
TARGET = "<= 1.15"
STOP_GRACE_S = 16  # as `ray stop`: SIGTERM, then SIGKILL what is left after this


def by_pipeline(root: Path) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "tpupipe"),
            "run",
            "--preset",
            PRESET,
            "--run-id",
            "bench-overhead",
            "--output-root",
            str(root),
        ],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"tpupipe run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((root / "bench-overhead" / "summary.json").read_text())
    return seconds, {s["name"]: round(s["seconds"], 1) for s in summary["stages"]}


def _wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while port_is_free(port):
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing listens on port {port} after {timeout_s:.0f}s")
        time.sleep(0.2)


def by_hand(root: Path) -> tuple[float, dict[str, float]]:
    """The hand-run workflow, timed step by step."""
    spec = resolve(PRESET)
    env = envs.ensure_env(trainer_image(spec), log=lambda _m: None)
    ray = str(env.bin / "ray")
    proc_env = {**os.environ, "PATH": f"{env.bin}{os.pathsep}{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0"}
    ports = allocate_ports(spec.cluster.num_hosts)
    head, out = ports[0], root / "by-hand"
    out.mkdir(parents=True)
    dashboard = f"http://{LOOPBACK}:{head['dashboard-port']}"
    common = [
        "--block",
        f"--node-ip-address={LOOPBACK}",
        "--disable-usage-stats",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
    ]
    steps: dict[str, float] = {}
    nodes: list[subprocess.Popen] = []

    def start(args: list[str], name: str) -> None:
        with open(out / f"{name}.out", "w") as log:
            nodes.append(
                subprocess.Popen(
                    [ray, "start", *common, *args],
                    env=proc_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def submit(mode: str, checkpoint: str = "") -> str:
        command = job_command(spec, mode, str(out / "train"), "bench-by-hand", checkpoint)
        proc = subprocess.run(
            [
                ray,
                "job",
                "submit",
                f"--address={dashboard}",
                f"--runtime-env-json={json.dumps(JOB_RUNTIME_ENV)}",
                "--",
                *shlex.split(command),
            ],
            env=proc_env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or "succeeded" not in proc.stdout:
            raise SystemExit(f"ray job submit ({mode}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
        return proc.stdout

    started = time.perf_counter()
    try:
        mark = time.perf_counter()
        start(
            [
                "--head",
                "--num-cpus=0",
                f"--dashboard-host={LOOPBACK}",
                "--include-dashboard=true",
                f"--temp-dir={out / 'head'}",
                *[f"--{k}={v}" for k, v in head.items()],
            ],
            "head",
        )
        _wait_port(head["port"])
        for index, node_ports in enumerate(ports[1:], start=1):
            start(
                [
                    f"--address={LOOPBACK}:{head['port']}",
                    f"--num-cpus={spec.cluster.cpus_per_host}",
                    f"--temp-dir={out / f'host{index}'}",
                    *[f"--{k}={v}" for k, v in node_ports.items()],
                ],
                f"host{index}",
            )
        _wait_nodes(dashboard, len(ports))
        steps["cluster up"] = time.perf_counter() - mark
        mark = time.perf_counter()
        submit("check")
        steps["slice check job"] = time.perf_counter() - mark
        mark = time.perf_counter()
        log = submit("train")
        result = next(p for kind, p in reversed(list(protocol.parse(log.splitlines()))) if kind == "result")
        steps["train job"] = time.perf_counter() - mark
        mark = time.perf_counter()
        submit("eval", result["checkpoint"])
        steps["evaluate job"] = time.perf_counter() - mark
    finally:
        mark = time.perf_counter()
        for node in nodes:
            os.killpg(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for node in nodes:
            try:
                node.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
        steps["cluster down"] = time.perf_counter() - mark
    return time.perf_counter() - started, {k: round(v, 1) for k, v in steps.items()}


def _wait_nodes(dashboard: str, want: int, timeout_s: float = 120) -> None:
    from ray.util.state import list_nodes

    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            if sum(n.state == "ALIVE" for n in list_nodes(address=dashboard, raise_on_missing_output=False)) >= want:
                return
        except Exception as exc:  # noqa: BLE001 - the dashboard is still starting
            last = exc
        time.sleep(0.5)
    raise SystemExit(f"{want} Ray nodes were not alive after {timeout_s:.0f}s (last: {last!r})")


def figures() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        hand, hand_steps = by_hand(Path(tmp))
        pipeline, stages = by_pipeline(Path(tmp))
    return [
        Figure(
            "overhead: tpupipe run / the same work by hand (Ray CLI)",
            pipeline / hand,
            "x",
            TARGET,
            {
                "A_tpupipe_run_s": round(pipeline, 1),
                "A_stages_s": stages,
                "B_by_hand_s": round(hand, 1),
                "B_steps_s": hand_steps,
            },
        )
    ]


if __name__ == "__main__":
    results = figures()
    print(table(results))
    print(json.dumps([f.detail for f in results], indent=1))
