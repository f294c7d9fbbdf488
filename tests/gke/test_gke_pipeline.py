"""The whole pipeline with platform=gke against the emulated project: `tpupipe run --platform gke` (kfp.local)
talks gRPC to the GKE emulator and HTTPS to the Kubernetes emulator, whose KubeRay part runs the RayCluster as a
local Ray cluster of the manifest's shape; the training and evaluation jobs go through the API server's service
proxy with Ray token authentication on. The run is the smoke preset, the first real run README tells a new user to
make (one v6e 1x1 slice: one host, one chip, one Ray Train worker), its hosts' CPUs cut to the emulated host's; the
chip is emulated and the worker computes on CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from components.platforms.gke.run.deploy import UNSCHEDULABLE_GRACE_ENV
from components.platforms.local.processes import run_processes
from tests.emulators.project import ALLOW, PROJECT, start_project
from tests.helpers import (
    assert_goodput_accounts,
    assert_no_secret,
    ray_tokens,
    tpupipe_cmd,
    unique_run_id,
    wait_until,
)
from tests.terminal import Terminal, driver_processes

# The trainer image is built by (emulated) Cloud Build from images/torch, FROM the TorchTPU base named here.
BUILT = (
    f"gke.project={PROJECT} gke.zone=us-east5-b gke.namespace=tpupipe cluster.cpus_per_host=4 "
    "gke.torch_tpu_base=us-docker.pkg.dev/tpupipe-emulated/base/tt:2" + ALLOW
)

pytestmark = [
    pytest.mark.e2e,
]

SENTINEL = "hf_SENTINEL0123456789abcdefTOKEN"


def _wait_gone(run_id: str, timeout_s: float = 60) -> None:
    wait_until(
        lambda: not run_processes(run_id),
        timeout_s,
        f"the processes of run {run_id} to exit",
        detail=lambda: run_processes(run_id),
    )


@pytest.fixture
def project(tmp_path):
    project = start_project(tmp_path, ray=True)
    yield project
    project.stop()


def _command(root: Path, run_id: str, extra: str = "") -> list[str]:
    return [
        *tpupipe_cmd(),
        "run",
        "--platform",
        "gke",
        "--preset",
        "smoke",
        "--run-id",
        run_id,
        "--output-root",
        str(root),
        "--set",
        BUILT + " train.epochs=2" + extra,
    ]


def _env(project) -> dict[str, str]:
    return {**os.environ, **project.env, "HF_TOKEN": SENTINEL}


def assert_secrets_kept(project, run_id: str, run_dir: Path, output: str) -> None:
    """The secret sentinel, on every path a run ends by: the Hugging Face token and the run's Ray token (plain and
    base64) reached their Secrets and nothing else: not the command's output, nor the run's files (its stages' records,
    jobs' logs, post-mortem). The Ray token was made (the run deployed its cluster) wherever the caller expects it."""
    assert_no_secret([SENTINEL, *ray_tokens(project.kube, run_id)], output=output, files=_files_text(run_dir))


def _files_text(*roots: Path) -> str:
    out = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.stat().st_size < 50_000_000:
                out.append(path.read_bytes().decode(errors="replace"))
    return "\n".join(out)


def test_the_whole_pipeline_on_emulated_gke_then_nothing_is_left(tmp_path, project):
    """A flex-start run, its TPU pool scaled from zero: the worker pod is Unschedulable with a TriggeredScaleUp event
    for longer than the unschedulable grace, which is waiting for nodes, not a failure; then the whole pipeline."""
    root, run_id = tmp_path / "runs", unique_run_id("gke-e2e")
    project.kube.fault, project.kube.scale_up_s = "scale_from_zero", 8.0
    env = {**_env(project), UNSCHEDULABLE_GRACE_ENV: "2"}
    proc = subprocess.run(
        _command(root, run_id, " cluster.capacity=flex-start gke.zone=us-east5-a"),
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    run_dir = root / run_id
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    with project.kube.lock:
        reasons = {o["reason"] for (plural, _, _), o in project.kube.objects.items() if plural == "events"}
    assert "TriggeredScaleUp" in reasons, "the pool did not scale from zero"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["platform"] == "gke"
    losses = summary["train_losses"]
    assert len(losses) == 2 and losses[-1] < losses[0]
    assert summary["eval_loss_after"] < summary["eval_loss_before"]
    train = json.loads((run_dir / "stages" / "train.json").read_text())["result"]
    assert train["num_workers"] == 1 and train["device"] == "cpu"  # one worker per (emulated) TPU device
    # The slice check reserved the slice with a slice placement group, one actor per emulated chip; without chips
    # (torch_tpu installed, registering nothing) it ran on CPU with gloo.
    check = summary["slice_check"]
    assert check["ok"] and (check["num_ranks"], check["ranks_verified"], check["num_hosts"]) == (1, 1, 1)
    assert (check["device"], check["backend"], check["all_reduce"]) == ("cpu", "gloo", check["expected_all_reduce"])
    # The chips billed before the first training step, measured: from provision's end to the trainer's first step.
    assert summary["before_training"]["chips"] == 1 and summary["before_training"]["minutes"] > 0
    # The goodput ledger accounts for every second and billed chip-second; flex-start has no list price, so the cost
    # is unknown, not zero.
    categories = assert_goodput_accounts(summary)
    assert (summary["goodput"]["chips"], summary["goodput"]["chip_kind"], summary["goodput"]["usd"]) == (
        1,
        "TPU chip",
        None,
    )
    assert categories["cluster start"]["chip_s"] > 0 and "TPU chip-minutes billed (price unknown)" in proc.stdout
    # The pool scales from zero (flex-start): the pods waited for their node, the scale-up's seconds, billing none.
    waited = categories["waiting for capacity"]
    assert waited["seconds"] >= project.kube.scale_up_s * 0.9 and waited["chip_s"] == 0, categories
    built = json.loads((run_dir / "stages" / "build_image.json").read_text())["result"]
    assert built["built"] and built["digest"].startswith("sha256:")
    assert built["image"] == f"us-east5-docker.pkg.dev/tpupipe-emulated/tpupipe/torch:{run_id}"
    deploy = json.loads((run_dir / "stages" / "deploy_raycluster.json").read_text())["result"]
    assert deploy["available_workers"] == 1
    assert deploy["images"] == [f"{built['image']}@{built['digest']}"]  # every pod pulls what was built, by digest
    # Every job call went through the API server's service proxy, Kubernetes token in Authorization and the Ray
    # token in X-Ray-Authorization; but one: deploy's request without the Ray token, which the real Ray cluster
    # (token authentication on) refused with 401.
    proxied = [(m, p, h) for m, p, h in project.kube.requests if "/proxy/api/jobs/" in p]
    probes = [(m, p) for m, p, h in proxied if "X-Ray-Authorization" not in h]
    assert [m for m, _ in probes] == ["GET"] and probes[0][1].endswith("/proxy/api/jobs/")
    assert (*probes[0], 401) in project.kube.statuses
    assert any(m == "POST" for m, _, _ in proxied)
    assert (
        all(
            h.get("Authorization", "").startswith("Bearer ") and h.get("X-Ray-Authorization", "").startswith("Bearer ")
            for _, _, h in proxied
            if "X-Ray-Authorization" in h
        )
        and len(proxied) > 1
    )
    # Afterwards: no cluster, node pool or RayCluster of the run, and no local process of the run.
    assert project.clusters(run_id) == [] and project.pools(run_id) == [] and project.rayclusters(run_id) == []
    assert project.gke.state.clusters == {}
    _wait_gone(run_id)
    # The Hugging Face token reached the pods (a Secret) and nothing else: no log line, no artifact, no compiled
    # pipeline, no plan.
    plan = subprocess.run(
        [*tpupipe_cmd(), "plan", "smoke", "--set", BUILT, "--output", "json"],
        env=_env(project),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plan.returncode == 0, plan.stderr
    assert (run_dir / "pipeline.yaml").is_file()
    assert ray_tokens(project.kube, run_id)
    assert_secrets_kept(project, run_id, run_dir, proc.stdout + proc.stderr + plan.stdout + plan.stderr)
    assert SENTINEL not in _files_text(project.kube.work_dir / "ray")


def training(project, root: Path, run_id: str) -> subprocess.Popen:
    """`tpupipe run --platform gke` in its own session, returned once its train job runs (the slice check off: the
    first job the run submits is the train job). The caller ends it."""
    command = _command(root, run_id, " train.epochs=50 cluster.slice_check=false")
    proc = subprocess.Popen(
        command, env=_env(project), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    job = f"{run_id}-train"

    def running() -> bool:
        assert proc.poll() is None, f"the run ended before its train job ran:\n{proc.stdout.read()[-4000:]}"
        return project.kube.job_status(job) == "RUNNING"

    try:
        wait_until(running, 900, f"the train job {job} to run", interval_s=1)
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc


def test_ctrl_c_during_train_stops_the_job_and_leaves_nothing_in_any_emulator(tmp_path, project):
    """Ctrl-C in the terminal of a gke run. (The SIGTERM that Vertex AI sends a task it cancels, the train task's
    among them, is tests/vertex/test_submit_schedule.py's cancel during train.)"""
    root, run_id = tmp_path / "runs", unique_run_id("gke-ctrl-c")
    # --verbose: the whole stream on the terminal, the train job's log among it (what this waits for)
    command = [*_command(root, run_id, " train.epochs=50 cluster.slice_check=false"), "--verbose"]
    term = Terminal(command, env=_env(project))
    rc = term.ctrl_c_when("  [train] ", timeout_s=900, exit_timeout_s=600)  # once the job runs: its log streams
    out = term.output
    assert rc == 130, out[-4000:]
    assert "KFP Executor" in out  # kfp.local's own output too, as --verbose streams it
    assert f"train: SIGINT: stopping job {run_id}-train" in out and f"train: job {run_id}-train STOPPED" in out
    stops = [p for m, p, _ in project.kube.requests if m == "POST" and p.endswith(f"/api/jobs/{run_id}-train/stop")]
    assert stops, "the job was not stopped through the proxy"
    assert "status: interrupted during train (SIGINT)" in out
    assert project.leftovers(run_id) == {}
    assert driver_processes(term.pid) == []
    assert ray_tokens(project.kube, run_id)
    assert_secrets_kept(project, run_id, root / run_id, out)


def test_a_run_that_crosses_its_budget_during_train_is_stopped_and_torn_down(tmp_path, project):
    """A budget preflight accepts (cluster.expected_hours=0.001: the plan expects $0.0032 at the smoke preset's
    $3.19/h, within $0.01) that the run crosses 11 s after provision ended: the train job, the run's first (the slice
    check off), is stopped through the API server's proxy as an interrupt stops it, the stage fails with the figures,
    teardown runs as after any failure, nothing is left and the run exits 1."""
    root, run_id = tmp_path / "runs", unique_run_id("gke-budget")
    extra = " train.epochs=50 cluster.slice_check=false cluster.expected_hours=0.001 run.max_cost_usd=0.01"
    proc = subprocess.run(
        _command(root, run_id, extra), env=_env(project), capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 1, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = json.loads((root / run_id / "summary.json").read_text())
    stages = {s["name"]: s for s in summary["stages"]}
    assert summary["status"] == "failed" and stages["train"]["status"] == "failed", stages["train"]
    error = stages["train"]["error"]
    assert error.startswith("stopped: budget: $"), error
    assert "of the $0.01 budget (run.max_cost_usd)" in error, error
    assert "since provision ended at $3.19/h (list prices)" in error, error
    assert "train failed: stopped: budget: $" in proc.stdout
    stops = [p for m, p, _ in project.kube.requests if m == "POST" and p.endswith(f"/api/jobs/{run_id}-train/stop")]
    assert stops, "the train job was not stopped through the proxy"
    assert stages["teardown"]["status"] == "succeeded", stages["teardown"]
    assert project.clusters(run_id) == [] and project.pools(run_id) == [] and project.rayclusters(run_id) == []
    assert project.leftovers(run_id) == {}
    assert ray_tokens(project.kube, run_id)
    assert_secrets_kept(project, run_id, root / run_id, proc.stdout + proc.stderr)
    _wait_gone(run_id)
