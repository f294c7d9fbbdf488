"""The resource names Google Cloud's APIs take for what a gke run creates or uses, built and read in one place:
GKE's locations, clusters and node pools (``projects/P/locations/L/clusters/N[/nodePools/NP]``), and Compute
Engine's global and regional resources (``projects/P/global/networks/N``, ``projects/P/regions/R/subnetworks/N``).
"""

from __future__ import annotations

# Compute Engine resources by the ledger's kind: where their REST collection lives (global or in the region).
COMPUTE_COLLECTIONS = {
    "network": ("global", "networks"),
    "subnetwork": ("regional", "subnetworks"),
    "resource_policy": ("regional", "resourcePolicies"),
    "firewall": ("global", "firewalls"),
    "router": ("regional", "routers"),
}


def location_path(project: str, location: str) -> str:
    """``projects/P/locations/L``: where GKE lists and creates clusters (``-``: every location)."""
    return f"projects/{project}/locations/{location}"


def cluster_path(parent: str, name: str) -> str:
    """``projects/P/locations/L/clusters/N``, the cluster ``name`` in the location ``parent``."""
    return f"{parent}/clusters/{name}"


def cluster_parent(path: str) -> str:
    """The location path of a cluster's (or its node pool's) path: where its operations are waited on."""
    return path.rsplit("/clusters/", 1)[0]


def is_cluster(path: str, project: str, name: str) -> bool:
    """``path`` is the cluster ``name`` of ``project``, in any location."""
    parent, _, found = path.partition("/clusters/")
    return found == name and parent.startswith(f"projects/{project}/locations/") and parent.count("/") == 3


def cluster_location(path: str) -> str:
    """The zone or region of a cluster's path (``L`` of ``projects/P/locations/L/clusters/N``)."""
    return cluster_parent(path).rsplit("/", 1)[-1]


def node_pool_path(cluster: str, name: str) -> str:
    """``projects/P/locations/L/clusters/N/nodePools/NP``, the node pool ``name`` of the cluster path ``cluster``."""
    return f"{cluster}/nodePools/{name}"


def node_pool_cluster(path: str) -> str:
    """The cluster path of a node pool's path."""
    return path.rsplit("/nodePools/", 1)[0]


def compute_path(kind: str, project: str, region: str, name: str) -> str:
    """``projects/P/global/networks/N`` or ``projects/P/regions/R/<collection>/N``: the name Compute Engine's API and
    the run's ledger use for a resource of the ledger's ``kind``."""
    scope, collection = COMPUTE_COLLECTIONS[kind]
    where = "global" if scope == "global" else f"regions/{region}"
    return f"projects/{project}/{where}/{collection}/{name}"
