"""The emulated project (tests/emulators/project.py) refuses what the real APIs refuse: GKE's one update at a time and
its create-only fields, Resource Manager's and Service Usage's permission checks, Compute Engine's unknown
reservation; the real clients against it."""

from __future__ import annotations

import pytest

from tests.emulators.project import PROJECT
from tests.gke.test_preflight import _team_cluster


def test_the_emulated_apis_refuse_what_the_real_ones_refuse(project_factory):
    from google.api_core import exceptions
    from google.cloud import container_v1

    from components.platforms.credentials import credentials
    from components.platforms.gke import compute, preflight, storage
    from components.platforms.gke.cluster import cluster_manager

    project = project_factory()
    name = _team_cluster(project, dataplane_v2=False)
    gke = cluster_manager()
    two = container_v1.ClusterUpdate(
        desired_enable_multi_networking=True, desired_addons_config={"ray_operator_config": {"enabled": True}}
    )
    with pytest.raises(exceptions.InvalidArgument, match="one update"):
        gke.update_cluster(name=name, update=two)
    with pytest.raises(exceptions.InvalidArgument, match="only be set when a cluster is created"):
        gke.update_cluster(
            name=name,
            update=container_v1.ClusterUpdate(
                desired_datapath_provider=container_v1.DatapathProvider.ADVANCED_DATAPATH
            ),
        )
    with pytest.raises(exceptions.FailedPrecondition, match="requires Dataplane V2"):
        gke.update_cluster(name=name, update=container_v1.ClusterUpdate(desired_enable_multi_networking=True))
    projects = storage.projects_client()
    with pytest.raises(exceptions.InvalidArgument, match="not valid"):
        projects.test_iam_permissions(request={"resource": f"projects/{PROJECT}", "permissions": ["container"]})
    with pytest.raises(exceptions.PermissionDenied):
        projects.test_iam_permissions(request={"resource": "projects/someone-else", "permissions": ["a.b.c"]})
    usage = preflight.service_usage_client(None)
    with pytest.raises(exceptions.PermissionDenied):
        usage.batch_get_services(
            request={
                "parent": "projects/someone-else",
                "names": ["projects/someone-else/services/compute.googleapis.com"],
            }
        )
    with pytest.raises(exceptions.NotFound):
        compute.client("ReservationsClient", credentials()).get(project=PROJECT, zone="us-east5-b", reservation="x")
