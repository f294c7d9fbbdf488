"""The pipeline on (emulated) Kubeflow Pipelines end to end: `tpupipe submit smoke --kfp-host URL --set
"gke.project=PROJECT train.epochs=1" --wait` against the emulated KFP API server (tests/emulators/kfp.py), every task
in its own process and empty directory in the components image's environment, sharing nothing but the emulated cloud
services: the run's state in Cloud Storage, its cluster on the emulated GKE with a real Ray cluster of processes. One
epoch of the smoke preset's three: what is asserted is the service's path (every task succeeded, the first version
promoted as there is no champion yet, nothing left), which one epoch takes as three do."""

from __future__ import annotations

import json

import pytest

from tests.emulators.project import PROJECT
from tests.kfp.conftest import start_kfp

BUCKET = f"{PROJECT}-tpupipe"


@pytest.mark.e2e  # a run of the smoke preset: each task its own process, a real Ray cluster trains
def test_submit_smoke_on_kubeflow_pipelines_runs_to_success_and_leaves_nothing(project_factory, tmp_path, tpupipe):
    from components.platforms.local import envs

    project = project_factory(ray=True, vertex=True, polls_to_done=1)  # vertex: the template registry publish uses
    kfp = start_kfp(project, tmp_path, python_bin=envs.ensure_env("pipeline").bin, published=False)
    code, out, err = tpupipe("publish", "--project", PROJECT, "--kfp-host", kfp.host, "--allow-default-identities")
    assert code == 0 and "on Kubeflow Pipelines at" in out, out + err
    sets = f"gke.project={PROJECT} train.epochs=1 gke.allow_default_identities=true"
    code, out, err = tpupipe("submit", "smoke", "--kfp-host", kfp.host, "--set", sets, "--wait")
    kfp_run = out.split("submitted run ", 1)[1].split()[0] if "submitted run " in out else ""
    logs = kfp.server.run(kfp_run).logs if kfp_run else {}
    failed = (
        {
            t["taskName"]: logs.get(t["taskName"], "")[-3000:]
            for t in kfp.server.run(kfp_run).tasks
            if t["state"] == "FAILED"
        }
        if kfp_run
        else {}
    )
    assert code == 0, out + err + json.dumps(failed, indent=1)
    run_id = out.split("(run id ", 1)[1].split(")")[0]
    assert f"run {kfp_run}: succeeded" in out
    summary = json.loads(project.storage.data(BUCKET, f"state/{run_id}/summary.json"))
    assert summary["status"] == "succeeded" and summary["run_dir"] == f"gs://{BUCKET}/state/{run_id}"
    states = {t["taskName"]: t["state"] for t in kfp.server.run(kfp_run).tasks}
    assert states["teardown"] == states["train"] == states["promote"] == "SUCCEEDED", states
    assert project.clusters(run_id) == [] and project.gke.state.clusters == {} and project.rayclusters(run_id) == []
    code, shown, err = tpupipe("runs", "show", kfp_run, "--kfp-host", kfp.host)
    assert code == 0 and "SUCCEEDED" in shown and "  train                succeeded" in shown, shown + err
