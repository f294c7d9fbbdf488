"""The emulated project (tests/emulators/project.py) refuses what the real APIs refuse: GKE's one update at a time and
its create-only fields, Resource Manager's and Service Usage's permission checks, Compute Engine's unknown
reservation; the real clients against it. And its pods' Cloud Storage FUSE mounts are its bucket: each mount path is
the bucket's directory, or the ``only-dir`` of it the volume mounts, and nothing outside them."""

from __future__ import annotations

import pytest

from tests.emulators.project import PROJECT
from tests.gke.test_preflight import _team_cluster


def test_the_emulated_apis_refuse_what_the_real_ones_refuse(project_factory):
    from google.api_core import exceptions
    from google.cloud import container_v1

    from components.cloud import iam
    from components.cloud.credentials import credentials
    from components.platforms.gke.checks import preflight
    from components.platforms.gke.cloud import compute
    from components.platforms.gke.cloud.cluster import cluster_manager

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
    projects = iam.projects_client()
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


def test_the_pods_fuse_mounts_are_the_bucket_or_the_directory_they_mount(project_factory):
    from google.cloud import storage
    from google.oauth2.credentials import Credentials

    from tests.emulators import kube

    project = project_factory()
    name = f"{PROJECT}-tpupipe"
    bucket = storage.Client(project=PROJECT, credentials=Credentials(token=project.token)).create_bucket(name)
    bucket.blob("models/m1/weights").upload_from_string(b"registered")

    def fuse(volume: str, options: str) -> dict:
        attributes = {"bucketName": name, "mountOptions": options}
        return {"name": volume, "csi": {"driver": kube.GCSFUSE_DRIVER, "volumeAttributes": attributes}}

    head = {
        "volumes": [
            fuse("run", "implicit-dirs,only-dir=runs/r1,uid=1000,gid=1000"),
            fuse("whole", "implicit-dirs"),
            {"name": "home", "emptyDir": {}},
        ],
        "containers": [
            {
                "name": "ray-head",
                "volumeMounts": [
                    {"name": "run", "mountPath": "/data/runs/r1"},
                    {"name": "whole", "mountPath": "/bucket/"},
                    {"name": "home", "mountPath": "/home/tpupipe"},
                ],
            }
        ],
    }
    with project.kube.lock:
        project.kube.objects[("rayclusters", "tpupipe", "r1")] = {
            "spec": {"headGroupSpec": {"template": {"spec": head}}}
        }
    mounts = project.kube._fuse_mounts("tpupipe", "r1")
    root = project.storage.bucket_dir(name)
    assert mounts == {"/data/runs/r1": root / "runs" / "r1", "/bucket": root}
    sent = (
        b"train --run /data/runs/r1 --out /data/runs/r1/ckpt --peek /data/runs/r2/x,/data/runs/r1x --home /home/tpupipe"
    )
    reached = kube._into_pods(sent + b" --ledger /bucket/state/l", mounts)
    # at or under a mount: where the mount's directory is here; /data/runs/r2 and /data/runs/r1x are under no mount
    # (a pod cannot reach them)
    expected = f"train --run {root}/runs/r1 --out {root}/runs/r1/ckpt --peek /data/runs/r2/x,/data/runs/r1x --home"
    assert reached == f"{expected} /home/tpupipe --ledger {root}/state/l".encode()
    assert kube._from_pods(reached, mounts) == sent + b" --ledger /bucket/state/l"  # the pods' paths again

    # What a pod writes under its mount is an object of the run's prefix, and an object copied there through the
    # API is a file the pod reads.
    written = mounts["/data/runs/r1"] / "ckpt" / "step-1"
    written.parent.mkdir(parents=True)
    written.write_bytes(b"step one")
    assert bucket.blob("runs/r1/ckpt/step-1").download_as_bytes() == b"step one"
    bucket.copy_blob(bucket.blob("models/m1/weights"), bucket, "runs/r1/model/weights")
    assert (mounts["/data/runs/r1"] / "model" / "weights").read_bytes() == b"registered"
    assert sorted(project.storage.objects_of(name, "runs/")) == ["runs/r1/ckpt/step-1", "runs/r1/model/weights"]


def test_a_conditional_grant_is_answered_as_the_requested_policy_version_says(project_factory):
    """Resource Manager's getIamPolicy: at version 3 a conditional binding with its condition and the policy at
    version 3; at 0 or 1 the role as ROLE_withcond_HASH without it, the policy at version 1; another version refused;
    a policy without conditions is version 1 whatever was asked."""
    from google.api_core import exceptions

    from components.cloud import iam

    project = project_factory()
    projects = iam.projects_client()

    def read(version: int):
        request = {"resource": f"projects/{PROJECT}", "options": {"requested_policy_version": version}}
        return projects.get_iam_policy(request=request)

    assert read(3).version == 1 and not any(b.HasField("condition") for b in read(3).bindings)
    member = f"serviceAccount:nodes@{PROJECT}.iam.gserviceaccount.com"
    until = {"title": "until-2030", "expression": 'request.time < timestamp("2030-01-01T00:00:00Z")'}
    project.projects.grant(PROJECT, "roles/logging.logWriter", member, condition=until)
    policy = read(3)
    (binding,) = [b for b in policy.bindings if member in b.members]
    assert policy.version == 3 and binding.role == "roles/logging.logWriter"
    assert (binding.condition.title, binding.condition.expression) == (until["title"], until["expression"])
    for version in (0, 1):
        policy = read(version)
        (binding,) = [b for b in policy.bindings if member in b.members]
        assert policy.version == 1 and not binding.HasField("condition")
        assert binding.role.startswith("roles/logging.logWriter_withcond_")
        # what tpupipe reads of such a policy: the role held only under a condition, never as a grant
        level = iam.policy_level_of(f"projects/{PROJECT}", policy)
        assert member not in level.grants and level.conditional[member] == {"roles/logging.logWriter": {iam.UNSHOWN}}
    with pytest.raises(exceptions.InvalidArgument, match="policy version 2"):
        read(2)
