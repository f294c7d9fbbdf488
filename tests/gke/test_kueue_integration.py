"""A Kueue that does not manage RayClusters (``ray.io/raycluster`` not among its configuration's
``integrations.frameworks``) makes no Workload for the run's RayCluster, which KubeRay keeps suspended: preflight
finds it, naming gke.queue; a configuration it cannot read is a warning; and a run that meets such a Kueue anyway
fails fast at deploy_raycluster, saying why, instead of waiting for its deadline."""

from __future__ import annotations

import time

import pytest

from components.platforms.gke import GkePlatform
from components.platforms.gke.run import queueing
from components.spec import InfraError
from tests.emulators.kueue import CONFIG_MAP, CONFIG_NAMESPACE, FRAMEWORKS
from tests.gke.test_kueue import QUEUED, _left, _workloads, context, setup
from tests.gke.test_preflight import _team_cluster, preflight_cli

WITHOUT_RAY = [f for f in FRAMEWORKS if f != "ray.io/raycluster"]


def test_preflight_finds_kueue_managing_rayclusters(project_factory, capsys):
    project = project_factory()
    _team_cluster(project)
    setup(project)
    code, text = preflight_cli(QUEUED + " gke.queue=team-a", capsys)
    assert code == 0 and "Kueue manages RayClusters (ray.io/raycluster in its ConfigMap kueue-system/" in text, text


def test_preflight_refuses_a_kueue_without_the_raycluster_integration_naming_gke_queue(project_factory, capsys):
    project = project_factory()
    _team_cluster(project)
    setup(project).configure(WITHOUT_RAY)
    before = project.mutations()
    code, text = preflight_cli(QUEUED + " gke.queue=team-a", capsys)
    assert (
        code == 2
        and (
            "gke.queue: Kueue in cluster team does not manage RayClusters: its configuration (ConfigMap "
            "kueue-system/kueue-manager-config) lists integrations.frameworks batch/job, kubeflow.org/mpijob, "
            "ray.io/rayjob, jobset.x-k8s.io/jobset, without ray.io/raycluster"
        )
        in text
    ), text
    assert project.mutations() == before


def test_an_unreadable_kueue_configuration_is_a_warning(project_factory, capsys):
    project = project_factory()
    _team_cluster(project)
    setup(project)
    with project.kube.lock:
        del project.kube.objects[("configmaps", CONFIG_NAMESPACE, CONFIG_MAP)]
    code, text = preflight_cli(QUEUED + " gke.queue=team-a", capsys)
    assert (
        code == 0
        and ("warning: Kueue's configuration (ConfigMap kueue-system/kueue-manager-config) could not be read (404)")
        in text
    ), text


def test_a_run_kueue_makes_no_workload_for_fails_fast_saying_why(tmp_path, project_factory, monkeypatch):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(queueing, "NO_WORKLOAD_S", 1.0)  # Kueue's controller answers within seconds; the test's wait
    _team_cluster(project)
    kueue = setup(project)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = context(tmp_path, "unmanaged", QUEUED + " gke.queue=team-a")
    gke.provision(ctx)  # preflight passed: the integration was on
    kueue.configure(WITHOUT_RAY)  # ...and is off by the time the RayCluster is made
    started = time.monotonic()
    with pytest.raises(InfraError) as failed:
        gke.deploy_raycluster(ctx)
    assert time.monotonic() - started < 30
    assert "Kueue made no Workload for RayCluster unmanaged" in str(failed.value)
    assert "ray.io/raycluster is not in the integrations.frameworks" in str(failed.value)
    assert _workloads(project) == [] and not project.kube.objects.get(("pods", "tpupipe", "unmanaged-head"))
    gke.teardown(ctx)
    assert _left(project, "unmanaged") == {}
