"""The janitor after a gke run whose pipeline was SIGKILLed during train (driver and every task at once, as a lost
Vertex worker): nothing tore it down; `tpupipe janitor` finds it by its ledger and deletes everything, the Ray
cluster's processes included, and a second sweep finds nothing. Needs Ray (the emulated KubeRay runs the
RayCluster as local raylets)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from components.platforms import heartbeat
from components.platforms.store import LocalStore
from tests.emulators.project import start_project
from tests.gke.test_gke_pipeline import _env, _wait_gone, training
from tests.helpers import tpupipe_cmd, unique_run_id

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def project(tmp_path):
    project = start_project(tmp_path, ray=True)
    yield project
    project.stop()


def test_a_run_sigkilled_during_train_is_swept_by_the_janitor(tmp_path, project):
    root, run_id = tmp_path / "runs", unique_run_id("gke-killed")
    proc = training(project, root, run_id)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and every task: no teardown runs
    proc.communicate(timeout=60)
    left = project.leftovers(run_id)
    assert {"node pools", "kubernetes", "bucket bindings"} <= set(left), left
    assert not (root / run_id / "summary.json").exists()
    # Its last heartbeat is seconds old: the janitor would keep it as live for heartbeat.STALE_S (test_janitor.py
    # shows it). Those minutes pass here at once: the heartbeat made as old as a dead driver's.
    heartbeat.beat(LocalStore(root / run_id), "train", now=time.time() - heartbeat.STALE_S - 1)

    sweep = subprocess.run(
        [*tpupipe_cmd(), "janitor", "--output-root", str(root), "--older-than", "0s"],
        env=_env(project),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert f"{run_id} (started" in sweep.stdout and "deleted" in sweep.stdout
    # Through the same teardown, the janitor kept what the cluster knew before deleting it: the pods' statuses and
    # events, each Ray pod's log, the node pools, Ray's state and the nodes' Ray logs (the train job's driver's too).
    logs = root / run_id / "logs"
    kept = json.loads((logs / "kubernetes.json").read_text())
    assert kept["pods"] and kept["raycluster"], kept
    assert {p.name for p in (logs / "pods").glob("*.log")} == {f"{p['name']}.log" for p in kept["pods"]}
    assert json.loads((logs / "node_pools.json").read_text()) and json.loads((logs / "ray_state.json").read_text())
    assert any(f.name.startswith("job-driver-") for f in (logs / "ray").rglob("*.log")), list((logs / "ray").rglob("*"))
    _wait_gone(run_id)
    assert project.leftovers(run_id) == {}
    again = subprocess.run(
        [*tpupipe_cmd(), "janitor", "--output-root", str(root), "--older-than", "0s"],
        env=_env(project),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0 and "nothing found" in again.stdout, again.stdout + again.stderr
