"""The janitor and Kubeflow Pipelines: a run left behind (provision and deploy ran, then its KFP run ended without
teardown, as a terminate leaves it on KFP's Argo backend) is collected at once when its KFP run has ended, and a run
whose KFP run still runs is kept, past any age limit; the state is read from the emulated KFP API server."""

from __future__ import annotations

from components.platforms.gke.run import janitor
from tests.emulators.project import PROJECT
from tests.gke.test_gke_platform import platform
from tests.gke.test_janitor import _left_behind, _local


def test_the_janitor_sweeps_the_cluster_of_an_ended_kfp_run_and_keeps_a_running_ones(kfp, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    failed, busy = _local(tmp_path, "kfp-failed"), _local(tmp_path, "kfp-busy")
    for ctx in (failed, busy):
        _left_behind(kfp.project, ctx)
    ended = kfp.server.add_run("FAILED", parameters={"preset": "local-fsdp", "run_id": "kfp-failed"})
    running = kfp.server.add_run("RUNNING", parameters={"preset": "local-fsdp", "run_id": "kfp-busy"})
    lines: list[str] = []
    sweep = janitor.Janitor(
        str(tmp_path), (PROJECT,), older_than_s=0.0, log=lines.append, platform=platform(), kfp=(kfp.host, "kubeflow")
    ).sweep()
    text = janitor.render(sweep, dry_run=False)
    assert f"kfp-failed (its Kubeflow Pipelines run {ended} is failed):" in text, text
    assert f"kfp-busy: kept: its Kubeflow Pipelines run {running} is running" in text, text
    assert kfp.project.clusters("kfp-failed") == [] and kfp.project.clusters("kfp-busy")
    assert "ListRuns" in kfp.server.calls
