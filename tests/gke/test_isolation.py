"""Runs that share a cluster and its namespace stay out of each other's way: each run's pods mount a Hugging Face
token Secret of its own, so one run's teardown leaves the Secrets another run uses (and the namespace's own)
alone. Against the emulated project, through the real kubernetes client."""

from __future__ import annotations

import base64

from components.platforms import RunContext
from components.platforms.gke.platform import GkePlatform
from components.platforms.store import LocalStore
from components.spec import names
from components.workload import resolve
from tests.emulators.project import ONE_SLICE

SHARED = ONE_SLICE + " gke.cluster_name=tpupipe-owner cluster.ready_timeout_s=30"


def context(tmp_path, run_id: str, overrides: str) -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke"
    )


def _secrets(project) -> dict[str, str]:
    """The namespace's Secrets: name -> the Hugging Face token they hold ('' for another kind)."""
    with project.kube.lock:
        found = {n: o for (p, ns, n), o in project.kube.objects.items() if p == "secrets" and ns == "tpupipe"}
    return {n: base64.b64decode(o.get("data", {}).get("hf_api_token", "")).decode() for n, o in found.items()}


def test_one_runs_teardown_leaves_the_secrets_another_run_in_the_namespace_mounts(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.delenv("HF_TOKEN", raising=False)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    owner = context(tmp_path, "owner", ONE_SLICE)
    gke.provision(owner)
    kube, _, _ = gke.clients.kube(owner)
    kube.ensure_namespace()
    # The namespace's Secret, made by its user (no run label): what gke.hf_secret names by default.
    kube.ensure(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf-secret", "namespace": "tpupipe"},
            "data": {"hf_api_token": base64.b64encode(b"hf_shared").decode()},
        }
    )
    first, second = context(tmp_path, "first", SHARED), context(tmp_path, "second", SHARED)
    for ctx in (first, second):
        gke.provision(ctx)
        assert gke.deploy_raycluster(ctx)["available_workers"] == 1
    own = {run: names.hf_token_secret(run) for run in ("first", "second")}
    held = _secrets(project)
    assert held["hf-secret"] == held[own["first"]] == held[own["second"]] == "hf_shared"
    for run in ("first", "second"):  # each run's pods mount its own copy, as a file
        (cluster,) = [o for (p, _, n), o in project.kube.objects.items() if p == "rayclusters" and n == run]
        volumes = cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]
        assert [v["secret"]["secretName"] for v in volumes if "secret" in v] == [own[run]]
    gke.teardown(first)
    held = _secrets(project)
    assert own["first"] not in held and names.ray_token_secret("first") not in held
    assert held["hf-secret"] == held[own["second"]] == "hf_shared"  # the second run's pods can still start
    assert names.ray_token_secret("second") in held
    assert project.rayclusters("second") == ["second"]
    gke.teardown(second)
    assert set(_secrets(project)) == {"hf-secret"}  # the namespace's own Secret: no run's to delete
    gke.teardown(owner)
