"""Orchestration overhead of the local pipeline, measured side by side in one run.

A: the whole pipeline (`tpupipe run`: kfp.local, provision, build image, deploy, train, evaluate, teardown).
B: the same trainer job (`python -m trainers.fsdp ...`, same spec) submitted with the Ray Jobs API to a local
   cluster that is already running, timed from submission to SUCCEEDED.
Prints A, B and A / B (the cost of everything around the training job, as a factor).
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from components.platforms.local.cluster import LocalPlatform  # noqa: E402
from components.stages import runner as stages  # noqa: E402
from components.workload.derive import job_command  # noqa: E402


def pipeline_seconds(root: Path) -> tuple[float, dict]:
    started = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "tpupipe"), "run", "--run-id", "bench-pipeline",
                           "--output-root", str(root)], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"pipeline run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds, json.loads((root / "bench-pipeline" / "summary.json").read_text())


def direct_job_seconds(root: Path) -> float:
    from ray.job_submission import JobStatus

    ctx = stages.context("local-fsdp", "local", "", "bench-direct", "", str(root))
    platform = LocalPlatform(log=lambda _m: None)
    try:
        platform.provision(ctx)
        platform.deploy_raycluster(ctx)
        client = platform.job_client(ctx)
        entrypoint = job_command(ctx.spec, "train", platform.job_output_dir(ctx), ctx.run_id)
        started = time.perf_counter()
        job = client.submit_job(entrypoint=entrypoint)
        while not client.get_job_status(job).is_terminal():
            time.sleep(0.2)
        seconds = time.perf_counter() - started
        if client.get_job_status(job) != JobStatus.SUCCEEDED:
            raise SystemExit(f"direct job failed:\n{client.get_job_logs(job)[-3000:]}")
        return seconds
    finally:
        platform.teardown(ctx)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        root = Path(tmp)
        direct = direct_job_seconds(root)
        pipeline, summary = pipeline_seconds(root)
    stage_s = {s["name"]: round(s["seconds"], 1) for s in summary["stages"]}
    print(f"pipeline wall time (A):                 {pipeline:7.1f} s   stages: {stage_s}")
    print(f"trainer job on a running cluster (B):   {direct:7.1f} s")
    print(f"orchestration overhead A / B:           {pipeline / direct:7.2f}x")


if __name__ == "__main__":
    main()
