"""The control-plane endpoint every client of a cluster's Kubernetes API uses (``control_plane``): the DNS-based one for
a cluster tpupipe creates (it asks for it), trusted through the public roots (the emulators name their own CA); the IP
one with the cluster's CA for an existing cluster without DNS access; and an existing cluster whose only endpoint is
private is a preflight problem, and a stage's error, naming the gcloud command that turns DNS access on, instead of a
wait."""

from __future__ import annotations

import base64
import time

import pytest
from google.cloud import container_v1 as c

from components.cloud.credentials import AccessToken
from components.platforms.gke.cloud import cluster as gke_cluster
from components.platforms.gke.cloud import kube as gke_kube
from components.platforms.gke.cloud.control_plane import DNS_CA_ENV, control_plane, restricted
from components.spec import InfraError
from tests.emulators.gke import PRIVATE_ENDPOINT
from tests.emulators.project import PROJECT
from tests.gke.test_gke_platform import context, platform
from tests.gke.test_preflight import PARENT, SHARED, _team_cluster, preflight_cli

ENABLE = f"gcloud container clusters update team --location us-east5-b --project {PROJECT} --enable-dns-access"
CA = base64.b64encode(b"the cluster's CA").decode()


def _cluster(body: dict) -> c.Cluster:
    import json

    return c.Cluster.from_json(json.dumps({"endpoint": "34.1.2.3", "masterAuth": {"clusterCaCertificate": CA}, **body}))


def _dns(allow: bool | None) -> dict:
    config = {"endpoint": "gke-0123.us-east5.gke.goog"}
    if allow is not None:
        config["allowExternalTraffic"] = allow
    return {"controlPlaneEndpointsConfig": {"dnsEndpointConfig": config}}


def test_the_dns_endpoint_is_used_when_it_takes_user_traffic_else_the_ip_one_with_the_clusters_ca(monkeypatch):
    monkeypatch.delenv(DNS_CA_ENV, raising=False)
    assert control_plane(_cluster(_dns(True))) == ("gke-0123.us-east5.gke.goog", None, True)  # None: public roots
    for off in (_dns(False), _dns(None), {}):
        assert control_plane(_cluster(off)) == ("34.1.2.3", b"the cluster's CA", False)
    assert restricted(_cluster(_dns(True) | {"privateClusterConfig": {"enablePrivateEndpoint": True}})) == ""
    assert restricted(_cluster({"privateClusterConfig": {"enablePrivateEndpoint": True}})) == (
        "its only IP endpoint is private"
    )
    public_off = {"controlPlaneEndpointsConfig": {"ipEndpointsConfig": {"enablePublicEndpoint": False}}}
    assert restricted(_cluster(public_off)) == "its only IP endpoint is private"
    assert restricted(_cluster({"masterAuthorizedNetworksConfig": {"enabled": True}})) == (
        "its IP endpoint admits authorized networks only"
    )
    assert restricted(_cluster({})) == ""


def _hosts(project) -> set[str]:
    with project.kube.lock:
        return {headers.get("Host", "") for _, _, headers in project.kube.requests}


def test_a_cluster_tpupipe_creates_asks_for_dns_access_and_every_client_goes_there(tmp_path, project_factory):
    project = project_factory()
    ctx = context(tmp_path, "dns")
    platform().provision(ctx)  # provision reads KubeRay's CRD through the cluster's API as soon as it exists
    (name,) = project.clusters("dns")
    cluster = project.gke.state.clusters[name]
    assert cluster.control_plane_endpoints_config.dns_endpoint_config.allow_external_traffic is True
    plane = control_plane(cluster)
    assert plane.dns and plane.host == project.kube.dns_endpoint and plane.ca_pem == project.kube.ca_pem
    assert _hosts(project) == {project.kube.dns_endpoint}  # by name, its certificate checked against the name
    kube, _, _ = platform().clients.kube(ctx)  # every stage's (the Ray job client's: tests/gke/test_tokens_and_retries)
    assert kube.crd("rayclusters.ray.io") is not None
    assert _hosts(project) == {project.kube.dns_endpoint}
    platform().teardown(ctx)


def test_without_the_emulators_ca_the_dns_endpoint_is_checked_against_the_public_roots(
    tmp_path, project_factory, monkeypatch
):
    """The emulated endpoint's certificate chains to no public root: refused, so the cluster's own CA is not used."""
    from kubernetes import client
    from urllib3.exceptions import MaxRetryError

    project = project_factory()
    platform().provision(context(tmp_path, "roots"))
    (name,) = project.clusters("roots")
    monkeypatch.delenv(DNS_CA_ENV)
    plane = control_plane(project.gke.state.clusters[name])
    assert plane.dns and plane.ca_pem is None
    api = gke_kube.api_client(plane, AccessToken(gke_cluster.credentials()), tmp_path / "ca")
    with pytest.raises(MaxRetryError, match="CERTIFICATE_VERIFY_FAILED"):
        client.VersionApi(api).get_code(_request_timeout=5)


def _private_team_cluster(project) -> str:
    """Its only IP endpoint private, its DNS-based endpoint taking no user traffic (the emulator's default)."""
    return _team_cluster(project, privateClusterConfig={"enablePrivateEndpoint": True})


def _enable_dns_access(name: str) -> None:
    """What ``gcloud container clusters update NAME --enable-dns-access`` sends, through the ClusterManager client."""
    manager = gke_cluster.cluster_manager(gke_cluster.credentials())
    dns = c.ControlPlaneEndpointsConfig(
        dns_endpoint_config=c.ControlPlaneEndpointsConfig.DNSEndpointConfig(allow_external_traffic=True)
    )
    update = c.ClusterUpdate(desired_control_plane_endpoints_config=dns)
    manager.update_cluster(c.UpdateClusterRequest(name=name, update=update))
    while manager.get_cluster(name=name).status != c.Cluster.Status.RUNNING:
        time.sleep(0.01)


def test_an_existing_private_cluster_without_dns_access_is_a_problem_naming_the_command_that_fixes_it(
    project_factory, capsys
):
    project = project_factory()
    name = _private_team_cluster(project)
    assert project.gke.state.clusters[name].endpoint == PRIVATE_ENDPOINT
    code, text = preflight_cli(SHARED, capsys)
    assert code == 2 and "1 problem;" in text, text
    assert f"the Kubernetes API of cluster team at {PRIVATE_ENDPOINT} cannot be reached from here" in text
    assert "its only IP endpoint is private and its DNS-based endpoint takes no user traffic: run " + ENABLE in text
    assert "https://cloud.google.com/sdk/gcloud/reference/container/clusters/update" in text
    assert project.mutations() == []
    _enable_dns_access(name)
    code, text = preflight_cli(SHARED, capsys)
    assert code == 0, text
    assert "namespace tpupipe of cluster team: the caller may do all 20 things the run does" in text
    assert _hosts(project) == {project.kube.dns_endpoint}


def test_a_stage_that_cannot_reach_a_private_cluster_says_what_to_run_at_once(tmp_path, project_factory):
    """Every stage's client (``Clients.kube``): no minutes of retries against an address that cannot answer."""
    project = project_factory()
    _private_team_cluster(project)
    started = time.monotonic()
    with pytest.raises(InfraError, match="its only IP endpoint is private") as caught:
        platform().clients.kube(context(tmp_path, "shut", SHARED))
    assert ENABLE in str(caught.value) and time.monotonic() - started < 30
    assert project.kube.requests == []


def test_a_cluster_reached_from_here_through_authorized_networks_only_is_a_warning_for_vertex_runs(
    project_factory, capsys
):
    project = project_factory()
    name = _team_cluster(project, masterAuthorizedNetworksConfig={"enabled": True})  # this machine is in them
    code, text = preflight_cli(SHARED, capsys)
    assert code == 0, text
    assert (
        "cluster team: its IP endpoint admits authorized networks only and its DNS-based endpoint takes no user "
        "traffic: reached from here, but a run on Vertex AI" in text
    )
    assert ENABLE in text
    assert PARENT in name
