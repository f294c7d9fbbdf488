"""A reservation's sub-block parsed as a sub-block (``NAME/reservationBlocks/B/reservationSubBlocks/S``), read with
Compute Engine's reservationSubBlocks.get under its block and checked by its own count; a shared reservation of
another project read there, the caller's permission to read it tested on that owner project, not the run's."""

from __future__ import annotations

import pytest

from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan.needs import needs
from components.spec import SpecError
from components.workload import resolve
from tests.emulators.project import PROJECT
from tests.gke.test_preflight import RESERVED, preflight_cli

ZONE = "us-east5-b"
SUB_BLOCK = RESERVED + "/reservationBlocks/block-1/reservationSubBlocks/sub-1"
OWNER = "capacity-owner"
SHARED = RESERVED.replace("cluster.reservation=team-v6e", f"cluster.reservation=projects/{OWNER}/reservations/team-v6e")


def test_a_sub_block_is_parsed_read_and_counted_as_a_sub_block(project_factory, capsys):
    found = needs(resolve("local-fsdp", SUB_BLOCK), "pre").reservation
    assert (found.name, found.block, found.sub_block) == ("team-v6e", "block-1", "sub-1")
    assert found.path.endswith("/reservations/team-v6e/reservationBlocks/block-1/reservationSubBlocks/sub-1")
    assert "compute.reservationSubBlocks.get" in needs(resolve("local-fsdp", SUB_BLOCK), "pre").permissions
    project = project_factory()
    project.compute.add_reservation(PROJECT, ZONE, "team-v6e", "ct6e-standard-4t", count=8, in_use=8)
    project.compute.add_reservation_block(PROJECT, ZONE, "team-v6e", "block-1", count=8, in_use=8)
    project.compute.add_reservation_sub_block(PROJECT, ZONE, "team-v6e", "block-1", "sub-1", count=2, in_use=1)
    code, text = preflight_cli(SUB_BLOCK, capsys)
    assert code == 0, text
    assert "sub-block sub-1 of block block-1 of reservation team-v6e: 1 of 2 VMs free, 1 needed" in text
    assert "reservationSubBlocks.get" in project.compute.state.calls
    code, text = preflight_cli(SUB_BLOCK.replace("sub-1", "sub-9"), capsys)
    assert code == 2 and "no sub-block sub-9 in block block-1 of reservation team-v6e in zone us-east5-b" in text
    project.compute.add_reservation_sub_block(PROJECT, ZONE, "team-v6e", "block-1", "sub-2", count=2, in_use=2)
    code, text = preflight_cli(SUB_BLOCK.replace("sub-1", "sub-2"), capsys)
    assert code == 2 and "sub-block sub-2 of block block-1 of reservation team-v6e has room for 0 of the 1" in text
    # The node pools name the sub-block as GKE takes it.
    pools = [r for r in plan.resources(resolve("local-fsdp", SUB_BLOCK), "pre") if r.kind == "node-pool"]
    affinity = pools[-1].body["config"]["reservationAffinity"]
    assert affinity["values"] == ["team-v6e/reservationBlocks/block-1/reservationSubBlocks/sub-1"]


def test_a_malformed_sub_block_is_refused_naming_the_field():
    with pytest.raises(SpecError) as refused:
        resolve("local-fsdp", RESERVED + "/reservationSubBlocks/sub-1")  # a sub-block needs its block
    assert refused.value.field == "cluster.reservation"
    assert "NAME/reservationBlocks/BLOCK/reservationSubBlocks/SUB_BLOCK" in str(refused.value)


def test_a_shared_reservations_read_is_checked_on_its_owner_project(project_factory, capsys):
    n = needs(resolve("local-fsdp", SHARED), "pre")
    assert n.reservation.project == OWNER and "compute.reservations.get" not in n.permissions
    assert n.owner_permissions == ("compute.reservations.get",)
    project = project_factory()
    project.projects.projects[OWNER] = "555555555555"
    project.compute.add_reservation(OWNER, ZONE, "team-v6e", "ct6e-standard-4t", count=8)
    project.projects.denied_on[PROJECT] = {"compute.reservations.get"}  # not needed on the run's project
    code, text = preflight_cli(SHARED, capsys)
    assert code == 0, text
    assert f"compute.reservations.get held on project {OWNER}, the reservation's owner" in text
    project.projects.denied_on = {OWNER: {"compute.reservations.get"}}
    code, text = preflight_cli(SHARED, capsys)
    assert (
        code == 2
        and (
            f"cluster.reservation: the caller lacks on project {OWNER}, which owns the shared reservation team-v6e: "
            "compute.reservations.get"
        )
        in text
    ), text


@pytest.mark.parametrize(
    "part", ["/reservationBlocks/block-1", "/reservationBlocks/block-1/reservationSubBlocks/sub-1"]
)
def test_a_block_or_sub_block_on_autopilot_is_refused_naming_the_field(part):
    """Autopilot's reservation selector is a label, whose value cannot hold the block's path."""
    with pytest.raises(SpecError) as refused:
        resolve("local-fsdp", f"{RESERVED}{part} gke.cluster_mode=autopilot")
    assert refused.value.field == "cluster.reservation" and "Autopilot" in str(refused.value)
    resolve("local-fsdp", f"{RESERVED}{part}")  # a Standard cluster's node pools take it
