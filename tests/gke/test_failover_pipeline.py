"""The whole pipeline through a failover after provisioning, against the emulated project: a `flex-start,spot` ladder
whose flex-start pool GKE has no TPUs for (its scale-ups fail, seen while deploy_raycluster waits), so the run
deletes the flex-start pool, provisions Spot and trains there (the smoke preset, as test_gke_pipeline.py runs it)."""

from __future__ import annotations

import json
import subprocess

import pytest

from components.platforms import ledger as ledgers
from components.platforms.gke.run.deploy import FAILED_SCALE_UP_GRACE_ENV, UNSCHEDULABLE_GRACE_ENV
from components.platforms.store import LocalStore
from tests.emulators.project import start_project
from tests.gke.test_gke_pipeline import _command, _env
from tests.helpers import unique_run_id

pytestmark = [pytest.mark.e2e]
# What this test reads of training is a falling loss on Spot: 2 epochs of 8 steps (128 examples, 32 held out), and no
# slice check (test_gke_pipeline.py's run checks the slice).
SMALL = " cluster.slice_check=false train.num_train_examples=128 train.num_eval_examples=32"


@pytest.fixture
def emulated(tmp_path):
    project = start_project(tmp_path, ray=True)
    yield project
    project.stop()


def test_a_flex_start_stockout_in_readiness_moves_the_run_to_spot_where_it_trains(tmp_path, emulated):
    root, run_id = tmp_path / "runs", unique_run_id("gke-failover")
    emulated.gke.flex_start_stocked_out("us-east5-a")
    emulated.kube.scale_up_s = 1.0
    env = {**_env(emulated), UNSCHEDULABLE_GRACE_ENV: "30", FAILED_SCALE_UP_GRACE_ENV: "2"}
    proc = subprocess.run(
        _command(root, run_id, " cluster.capacity=flex-start,spot gke.zone=us-east5-a" + SMALL),
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = json.loads((root / run_id / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["train_losses"][-1] < summary["train_losses"][0]
    ledger = ledgers.load(LocalStore(root / run_id))
    assert ledger["candidate"] == {"zone": "us-east5-a", "capacity": "spot"}
    assert [(t["capacity"], t["left_at"], t["chip_s"]) for t in ledger["tried"]] == [
        ("flex-start", "deploy_raycluster", 0.0)
    ]
    calls = [c for c in emulated.gke.state.calls if c in ("CreateNodePool", "DeleteNodePool")]
    assert calls[:3] == ["CreateNodePool", "DeleteNodePool", "CreateNodePool"]  # flex-start's pool gone first
    assert "trying the next rung, spot in us-east5-a" in proc.stdout + proc.stderr
    assert emulated.clusters(run_id) == [] and emulated.gke.state.clusters == {}
