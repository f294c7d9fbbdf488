"""The janitor and Kubeflow Pipelines: a run left behind (provision and deploy ran, then its KFP run ended without
teardown, as a terminate leaves it on KFP's Argo backend) is collected at once when its KFP run has ended, and a run
whose KFP run still runs is kept, past any age limit; the state is read from the emulated KFP API server."""

from __future__ import annotations

from components.platforms.gke.run import janitor
from components.spec.names import run_id_from
from tests.emulators.project import PROJECT
from tests.gke.test_gke_platform import platform
from tests.gke.test_janitor import _left_behind, _local


def test_the_janitor_sweeps_the_cluster_of_an_ended_kfp_run_and_keeps_a_running_ones(kfp, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ended = kfp.server.add_run("FAILED", parameters={"preset": "local-fsdp", "run_id": "kfp-failed"})
    running = kfp.server.add_run("RUNNING", parameters={"preset": "local-fsdp", "run_id": "kfp-busy"})
    # A recurring run's run has no run_id parameter: its tasks derived the run id from its workflow's name, which is
    # its display name.
    scheduled = kfp.server.add_run("CANCELED", parameters={"preset": "local-fsdp"}, recurring="nightly")
    nightly = run_id_from("", kfp.server.run(scheduled).resource["workflow"])
    failed, busy, late = (_local(tmp_path, rid) for rid in ("kfp-failed", "kfp-busy", nightly))
    for ctx in (failed, busy, late):
        _left_behind(kfp.project, ctx)
    lines: list[str] = []
    sweep = janitor.Janitor(
        str(tmp_path), (PROJECT,), older_than_s=0.0, log=lines.append, platform=platform(), kfp=(kfp.host, "kubeflow")
    ).sweep()
    text = janitor.render(sweep, dry_run=False)
    assert f"kfp-failed (its Kubeflow Pipelines run {ended} is failed):" in text, text
    assert f"kfp-busy: kept: its Kubeflow Pipelines run {running} is running" in text, text
    assert f"{nightly} (its Kubeflow Pipelines run {scheduled} is canceled):" in text, text
    assert kfp.project.clusters("kfp-failed") == [] and kfp.project.clusters("kfp-busy")
    assert kfp.project.clusters(nightly) == []
    assert "ListRuns" in kfp.server.calls
