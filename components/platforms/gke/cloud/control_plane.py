"""Which control-plane endpoint of a GKE cluster the clients talk to, and how they trust its certificate: one answer
for every client of the cluster's Kubernetes API (``clients.Clients.kube``, the Ray job client through the API
server's service proxy, preflight's reads in ``k8s_access`` and ``deploy.existing_cluster_kuberay``).

A GKE control plane has a DNS-based endpoint and IP-based endpoints
(https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation). The DNS-based one is a name
(google-cloud-container, ``container_v1/types/cluster_service.py``, ``ControlPlaneEndpointsConfig.DNSEndpointConfig``:
``endpoint``, "A DNS format address. This is accessible from the public internet. Ex: uid.us-central1.gke.goog"),
which takes user traffic when ``allow_external_traffic`` is on ("Controls whether user traffic is allowed over this
endpoint") and is reached from any network that reaches Google Cloud's APIs, access decided by IAM: the one a Vertex AI
task, outside the cluster's VPC, can reach. The IP-based one (``Cluster.endpoint``) may be private
(``PrivateClusterConfig.enable_private_endpoint``: "Whether the master's internal IP address is used as the cluster
endpoint"; ``IPEndpointsConfig.enable_public_endpoint`` reversed) or limited to authorized networks
(``MasterAuthorizedNetworksConfig``: "restricts access to the control plane based on source IP"), which keep out
callers outside those networks. So the clients use the DNS-based endpoint when it takes user traffic, else the IP one.

The IP endpoint's certificate chains to the cluster's own CA (``master_auth.cluster_ca_certificate``); the DNS-based
endpoint's does not (google-github-actions/get-gke-credentials ``src/client.ts``, v3.0.0: a kubeconfig for a
DNS-based endpoint "can not use the cluster's CA cert" and has none), so it is checked against the public roots the
clients trust by default (the ``kubernetes`` client's ``certifi`` bundle, ``kubernetes/client/rest.py``; requests'
for the Ray job client). With the emulators, ``TPUPIPE_GKE_EMULATOR_DNS_CA`` names the CA file the emulated DNS
endpoint's certificate chains to instead.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from components.platforms.gke.plan import paths

if TYPE_CHECKING:  # the message GKE describes a cluster with, for the type checker only (no client imported here)
    from google.cloud.container_v1 import Cluster

DNS_CA_ENV = "TPUPIPE_GKE_EMULATOR_DNS_CA"
CA_FILE = "cluster-ca.crt"
# The gcloud command that turns the DNS-based endpoint's user traffic on, in place
# (https://cloud.google.com/sdk/gcloud/reference/container/clusters/update, ``--enable-dns-access``).
GCLOUD_UPDATE_DOC = "https://cloud.google.com/sdk/gcloud/reference/container/clusters/update"


class ControlPlane(NamedTuple):
    host: str  # what the clients reach at https://HOST ("" while the cluster has no endpoint yet)
    ca_pem: bytes | None  # the CA its certificate chains to; None: the public roots
    dns: bool  # the DNS-based endpoint

    def ca_file(self, directory: Path) -> str | None:
        """The CA as a file the clients read (written in ``directory``); None: the clients' public roots."""
        if self.ca_pem is None:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CA_FILE
        path.write_bytes(self.ca_pem)
        return str(path)


def control_plane(cluster: Cluster) -> ControlPlane:
    """The endpoint of ``cluster`` (a ``container_v1.Cluster``) the clients use: the DNS-based one when it takes user
    traffic, else the IP one with the cluster's CA."""
    dns = cluster.control_plane_endpoints_config.dns_endpoint_config
    if dns.endpoint and dns.allow_external_traffic:
        ca = os.environ.get(DNS_CA_ENV)
        return ControlPlane(dns.endpoint, Path(ca).read_bytes() if ca else None, True)
    return ControlPlane(cluster.endpoint, base64.b64decode(cluster.master_auth.cluster_ca_certificate), False)


def restricted(cluster: Cluster) -> str:
    """What keeps callers outside the cluster's networks from the endpoint the clients use ("" when nothing does:
    the DNS-based endpoint, or a public IP open to all)."""
    if control_plane(cluster).dns:
        return ""
    ip = cluster.control_plane_endpoints_config.ip_endpoints_config
    if cluster.private_cluster_config.enable_private_endpoint or (
        "enable_public_endpoint" in ip and not ip.enable_public_endpoint
    ):
        return "its only IP endpoint is private"
    if cluster.master_authorized_networks_config.enabled or ip.authorized_networks_config.enabled:
        return "its IP endpoint admits authorized networks only"
    return ""


def enable_dns_access(path: str) -> str:
    """The command that lets the DNS-based endpoint of the cluster at ``path`` (``projects/P/locations/L/clusters/N``)
    take user traffic, with its reference page."""
    project = path.split("/")[1]
    name = path.rsplit("/", 1)[-1]
    return (
        f"gcloud container clusters update {name} --location {paths.cluster_location(path)} --project {project} "
        f"--enable-dns-access ({GCLOUD_UPDATE_DOC}; access is then IAM's, from any network that reaches Google "
        "Cloud's APIs: https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation)"
    )


def unreachable(cluster: Cluster, path: str, exc: BaseException) -> str:
    """Why the clients cannot reach the cluster's Kubernetes API, and the fix."""
    plane = control_plane(cluster)
    why = restricted(cluster)
    message = (
        f"the Kubernetes API of cluster {cluster.name} at {plane.host} cannot be reached from here "
        f"({type(exc).__name__})"
    )
    if plane.dns:
        return message + ": check that this machine reaches Google Cloud's APIs (the DNS-based endpoint is one of them)"
    if why:
        return f"{message}: {why} and its DNS-based endpoint takes no user traffic: run {enable_dns_access(path)}"
    return (
        f"{message}: a firewall keeps this machine out, or the cluster is not running; its DNS-based endpoint, "
        "reachable from anywhere that reaches Google Cloud's APIs, takes no user traffic: run "
        + enable_dns_access(path)
    )
