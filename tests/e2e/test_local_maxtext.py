"""MaxText through JaxTrainer on the local platform: 2 emulated hosts x 2 CPU devices as one JAX runtime, and
an emulated host lost mid-run (the tutorial's deleted worker pod) that the run survives."""

import json
import os
import signal
import subprocess

import pytest

from components.platforms.local.processes import run_processes
from components.spec import protocol
from tests.helpers import tpupipe_cmd, unique_run_id, wait_until

pytestmark = pytest.mark.e2e
# The lost-host run: the host is killed at its first checkpoint (step 10), two checkpoint periods before the end.
LOST_HOST_STEPS = 30


def start(root, run_id, *sets):
    cmd = [*tpupipe_cmd(), "run", "--preset", "local-maxtext", "--run-id", run_id, "--output-root", str(root)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def records(run_dir):
    return list(protocol.parse((run_dir / "logs" / "train.log").read_text().splitlines()))


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    root, run_id = tmp_path_factory.mktemp("runs"), unique_run_id("mt-clean")
    proc = start(root, run_id)
    out, _ = proc.communicate(timeout=1500)
    return root / run_id, proc.returncode, out


def test_local_maxtext_completes_with_the_mesh_the_spec_asked_for(clean_run):
    run_dir, rc, out = clean_run
    assert rc == 0, out[-5000:]
    log = (run_dir / "logs" / "train.log").read_text()
    assert "jax runtime: 2 processes, 4 devices (2 per process, cpu)" in log
    assert "MaxText mesh: 4 devices: fsdp 2 x tensor 2" in log
    assert "ici_fsdp_parallelism=2 ici_tensor_parallelism=2" in log


def test_local_maxtext_loss_decreases_and_evaluate_compares(clean_run):
    run_dir, _, out = clean_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded"
    steps = [row["step"] for row in summary["history"]]
    assert steps == list(range(40))
    losses = summary["train_losses"]
    assert losses[-1] < 0.5 * losses[0]
    assert all(row["tflops_per_s_per_device"] >= 0 and row["tokens_per_s_per_device"] > 0 for row in summary["history"])
    assert summary["eval_loss_after"] < summary["eval_loss_before"]
    check = summary["slice_check"]  # a psum over the 4 devices of both hosts, and the sharded block's parity
    assert check["ok"] and check["backend"] == "jax" and check["device"] == "cpu"
    assert (check["num_ranks"], check["num_hosts"], check["num_devices"], check["ranks_verified"]) == (2, 2, 4, 2)
    assert check["all_reduce"] == check["expected_all_reduce"] == 10
    assert check["max_abs_diff"] < 1e-2 and check["seconds"] > 0
    for needle in ("TFLOP/s/dev", "tok/s/dev", "held-out loss", "slice check"):
        assert needle in out
    assert run_processes(run_dir.name) == []


def checkpoint_steps(run_dir, run_id):
    root = run_dir / "train" / run_id / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "_CHECKPOINT_METADATA").exists())


def test_a_lost_host_is_replaced_and_training_resumes_from_the_last_checkpoint(tmp_path):
    run_id = unique_run_id("mt-lost-host")
    run_dir = tmp_path / run_id
    proc = start(tmp_path, run_id, f"maxtext.steps={LOST_HOST_STEPS} cluster.slice_check=false")

    def first_checkpoint() -> bool:  # the first periodic checkpoint
        assert proc.poll() is None, proc.stdout.read()[-5000:]
        return any(s > 0 for s in checkpoint_steps(run_dir, run_id))

    try:
        wait_until(first_checkpoint, 900, "the first periodic checkpoint")
        ledger = json.loads((run_dir / "ledger.json").read_text())
        host = next(p for p in ledger["processes"] if p["role"] == "host-2")
        os.killpg(host["pgid"], signal.SIGKILL)  # the emulated host, with every process on it
        out, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-5000:]
    assert "host-2 (pid" in (run_dir / "logs" / "keeper.out").read_text()

    events = [p for k, p in records(run_dir) if k == "event" and p["event"] == "worker_group_started"]
    groups = list(dict.fromkeys(e["group"] for e in events))
    assert len(groups) >= 2, "Ray Train did not restart the worker group"
    restart = next(e for e in events if e["group"] == groups[1])
    assert restart["restore_step"] is not None and restart["restore_step"] > 0
    steps = [(p["group"], p["step"]) for k, p in records(run_dir) if k == "metric"]
    before = max(step for group, step in steps if group == groups[0])
    after = min(step for group, step in steps if group == groups[1])
    assert after == restart["restore_step"] + 1
    assert before - restart["restore_step"] <= 10, "more than one checkpoint period was repeated"

    summary = json.loads((run_dir / "summary.json").read_text())
    assert [row["step"] for row in summary["history"]] == list(range(LOST_HOST_STEPS))
    assert LOST_HOST_STEPS - 1 in checkpoint_steps(run_dir, run_id)
    assert summary["checkpoint"].endswith(f"/{LOST_HOST_STEPS - 1}")
    assert run_processes(run_id) == []
