"""What preflight checks, derived from the run's plan with no call made: the APIs and permissions of the plan's
calls, the quota metric and chips of the capacity type, the reservation of the zone, an existing cluster."""

import pytest

from components.platforms.gke.plan import features
from components.platforms.gke.plan import needs as gke_needs
from components.platforms.gke.plan.needs import Reservation
from components.spec import SpecError
from components.workload import resolve


def needs(preset: str, overrides: str = "") -> gke_needs.Needs:
    return gke_needs.needs(resolve(preset, "gke.project=my-proj " + overrides), "r1")


def test_a_multislice_dcn_plan_needs_the_network_calls_and_their_apis():
    n = needs("llama3-8b-v6e-16x2")
    for permission in (
        "compute.networks.create",
        "compute.networks.delete",
        "compute.subnetworks.create",
        "container.clusters.create",
        "container.clusters.update",
        "storage.buckets.setIamPolicy",
        "compute.firewalls.create",
        "iam.serviceAccounts.actAs",
    ):
        assert permission in n.permissions
    assert {
        "compute.googleapis.com",
        "container.googleapis.com",
        "storage.googleapis.com",
        "cloudresourcemanager.googleapis.com",
    } <= set(n.services)
    assert "iam.googleapis.com" not in n.services  # actAs is tested on the project: no API of its own
    # v6e has no regional Compute Engine quota metric: no read, the quota a warning (preflight)
    assert n.quota == ("", 32) and "compute.regions.get" not in n.permissions
    assert n.reservation is None and n.cluster == ""


def test_a_one_slice_plan_with_a_named_image_asks_for_no_network_and_no_build():
    n = needs("gemma4-e2b-v6e-16", "gke.image=registry/torch:1 gke.multislice_network=none")
    assert not any(p.startswith(("compute.networks.create", "cloudbuild", "artifactregistry")) for p in n.permissions)
    assert "cloudbuild.googleapis.com" not in n.services


def test_the_capacity_type_picks_the_quota_or_the_reservation():
    v5e = "cluster.accelerator=v5e cluster.topology=4x4 gke.zone=us-west4-a"
    assert needs("gemma4-e2b-v6e-16", v5e).quota == ("TPU_LITE_PODSLICE_V5", 16)
    assert needs("gemma4-e2b-v6e-16", v5e + " cluster.capacity=spot").quota == ("PREEMPTIBLE_TPU_LITE_PODSLICE_V5", 16)
    assert needs("gemma4-e2b-v6e-16", "cluster.capacity=spot").quota == ("", 16)  # no metric: a warning
    assert needs("gemma4-e2b-tpu7x-16", "cluster.capacity=flex-start").quota[0] == ""
    shared = needs(
        "gemma4-e2b-v6e-16",
        "cluster.capacity=reservation cluster.reservation=projects/owner-proj/reservations/big gke.zone=us-east5-b",
    )
    assert shared.quota is None
    assert shared.reservation == Reservation("owner-proj", "us-east5-b", "big", "", "ct6e-standard-4t", 4, 16)
    # Read in its owner project, so held there: tested on owner-proj, not the run's project.
    assert "compute.reservations.get" not in shared.permissions
    assert shared.owner_permissions == ("compute.reservations.get",)
    block = needs("gemma4-e2b-v6e-16", "cluster.capacity=reservation cluster.reservation=big/reservationBlocks/b1")
    assert (block.reservation.name, block.reservation.block) == ("big", "b1")
    assert block.reservation.path.endswith("/reservations/big/reservationBlocks/b1")
    assert "compute.reservationBlocks.get" in block.permissions


@pytest.mark.parametrize("bad", ["Big", "big/blocks/b1", "projects/p/reservations/big", "a/b/c"])
def test_a_reservation_that_is_not_a_reservation_path_is_refused_naming_the_field(bad):
    with pytest.raises(SpecError, match="is not a reservation") as caught:
        resolve("gemma4-e2b-v6e-16", f"cluster.capacity=reservation cluster.reservation={bad}")
    assert "NAME/reservationBlocks/BLOCK" in str(caught.value)


def test_an_existing_cluster_is_checked_and_may_be_updated():
    n = needs("llama3-8b-v6e-16x2", "gke.cluster_name=team")
    assert n.cluster == "projects/my-proj/locations/us-east5-b/clusters/team"
    assert "container.clusters.update" in n.permissions and "container.clusters.create" not in n.permissions


def test_every_feature_is_enabled_in_place_or_refused_with_a_reason():
    for feature in features.FEATURES:
        assert feature.in_place or feature.refused_because, feature.name
    names = [f.name for f in features.needed(resolve("llama3-8b-v6e-16x2", "gke.project=my-proj"))]
    assert names[-1] == "multi-networking"
    one_slice = resolve("gemma4-e2b-v6e-16", "gke.project=my-proj")
    assert "multi-networking" not in [f.name for f in features.needed(one_slice)]


def test_the_dry_run_prints_preflight_s_reads_first(capsys):
    from pipelines.cli.main import main

    assert (
        main(
            [
                "run",
                "gemma4-e2b-v6e-16",
                "--platform",
                "gke",
                "--dry-run",
                "--run-id",
                "r1",
                "--set",
                "gke.project=my-proj gke.cluster_name=team cluster.capacity=reservation cluster.reservation=big",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    provision = lines[lines.index("provision") + 1 :]
    assert [line.split()[1] for line in provision[:9]] == [
        "serviceusage.services.batchGet",
        "resourcemanager.projects.testIamPermissions",
        "resourcemanager.projects.getIamPolicy",
        "compute.reservations.get",
        "container.clusters.get",
        "kubernetes.selfsubjectaccessreviews.create",  # what the run does in the cluster, asked of its API server
        "compute.machineTypes.get",  # the head's pool, then the slice's, in their zone
        "compute.machineTypes.get",
        "storage.buckets.get",  # the run's bucket, if it exists: uniform bucket-level access
    ]
    assert (
        "projects/my-proj/zones/us-east5-b/reservations/big (4 ct6e-standard-4t VMs (or, aggregate, 16 chips) free)"
        in provision[3]
    )
    # then the champion's base (components.stages.gate.check_lineage), then what provision creates
    assert provision[9].startswith("  check         aiplatform.models.get projects/my-proj/locations/us-east5/models/")
    assert provision[10].startswith("  get-or-create storage.buckets.get")
