"""Preflight's check of the reservation a run's slices consume (``cluster.capacity=reservation``), with
Compute Engine's ``reservations.get`` (and ``reservationBlocks.get`` for a block, ``reservationSubBlocks.get`` for a
sub-block): it exists in the zone and has room
for the slices. ``preflight`` runs it with its other checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from components.platforms.gke.checks.findings import Problem, Report
from components.platforms.gke.cloud import compute as gke_compute
from components.platforms.gke.plan.needs import Needs, Reservation
from components.spec import RunSpec

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import compute_v1

# An aggregate reservation (what Cloud TPU capacity is sold as) reserves chips of one TPU VM family, not VMs of one
# machine type: compute_v1's ``AllocationAggregateReservation`` (``vm_family``, ``reserved_resources`` and
# ``in_use_resources`` of accelerators); its ``VmFamily`` enum names only TPU families, by machine type prefix.
VM_FAMILIES = {
    "ct5lp-": "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT5LP",
    "ct6e-": "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E",
    "ct5p-": "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P",
    "tpu7x-": "VM_FAMILY_CLOUD_TPU_POD_SLICE_TPU7X",
}


def check(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """The reservation exists in the zone and has room for the slices: a specific one in VMs of the slice's machine
    type, an aggregate one in chips of its TPU family, a block (``NAME/reservationBlocks/B``) in its own VMs."""
    if n.reservation is None:
        return
    from google.api_core import exceptions as gexc

    r = n.reservation
    try:
        found = gke_compute.client("ReservationsClient", creds).get(project=r.project, zone=r.zone, reservation=r.name)
    except gexc.NotFound:
        report.problems.append(
            Problem(
                "cluster.reservation",
                f"no reservation {r.name} in zone {r.zone} of project {r.project} (gke.zone is {r.zone})",
            )
        )
        return
    if "aggregate_reservation" in found:
        _aggregate(r, found.aggregate_reservation, report)
    else:
        _specific(r, found.specific_reservation, report)
    if r.block:
        _block(r, creds, report)


def _specific(r: Reservation, specific: compute_v1.AllocationSpecificSKUReservation, report: Report) -> None:
    reserved = specific.instance_properties.machine_type.rsplit("/", 1)[-1]
    free = specific.count - specific.in_use_count
    if reserved != r.machine_type:
        report.problems.append(
            Problem(
                "cluster.reservation", f"reservation {r.name} is for {reserved} VMs; the slice needs {r.machine_type}"
            )
        )
    elif free < r.hosts and not r.block:
        report.problems.append(
            Problem(
                "cluster.reservation",
                f"reservation {r.name} in {r.zone} has room for {free} of the {r.hosts} {r.machine_type} VMs the run "
                f"needs ({specific.in_use_count} of {specific.count} in use)",
            )
        )
    report.checked.append(
        f"reservation {r.name} in {r.zone}: {free} of {specific.count} {reserved} free, {r.hosts} needed"
    )


def _aggregate(r: Reservation, aggregate: compute_v1.AllocationAggregateReservation, report: Report) -> None:
    family = next((f for prefix, f in VM_FAMILIES.items() if r.machine_type.startswith(prefix)), "")
    if aggregate.vm_family != family:
        report.problems.append(
            Problem(
                "cluster.reservation",
                f"aggregate reservation {r.name} reserves {aggregate.vm_family or 'no VM family'}; the slice's "
                f"{r.machine_type} hosts are {family or 'of no TPU VM family'}",
            )
        )
        return
    reserved = sum(each.accelerator.accelerator_count for each in aggregate.reserved_resources)
    in_use = sum(each.accelerator.accelerator_count for each in aggregate.in_use_resources)
    if reserved - in_use < r.chips and not r.block:
        report.problems.append(
            Problem(
                "cluster.reservation",
                f"aggregate reservation {r.name} in {r.zone} has {reserved - in_use} of the {r.chips} chips the run "
                f"needs free ({in_use} of {reserved} in use)",
            )
        )
    report.checked.append(
        f"aggregate reservation {r.name} in {r.zone}: {reserved - in_use} of {reserved} chips free, {r.chips} needed"
    )


def _block(r: Reservation, creds: Credentials, report: Report) -> None:
    """The block of the reservation (``ReservationBlock``), or its sub-block (``ReservationSubBlock``, read under
    its parent ``reservations/NAME/reservationBlocks/BLOCK``): ``count`` VMs, ``in_use_count`` of them taken."""
    from google.api_core import exceptions as gexc

    if r.sub_block:
        what, of = f"sub-block {r.sub_block}", f"block {r.block} of reservation {r.name}"
        read = gke_compute.client("ReservationSubBlocksClient", creds).get
        args = {
            "parent_name": f"reservations/{r.name}/reservationBlocks/{r.block}",
            "reservation_sub_block": r.sub_block,
        }
    else:
        what, of = f"block {r.block}", f"reservation {r.name}"
        read = gke_compute.client("ReservationBlocksClient", creds).get
        args = {"reservation": r.name, "reservation_block": r.block}
    try:
        part = read(project=r.project, zone=r.zone, **args).resource
    except gexc.NotFound:
        report.problems.append(Problem("cluster.reservation", f"no {what} in {of} in zone {r.zone}"))
        return
    free = part.count - part.in_use_count
    if free < r.hosts:
        report.problems.append(
            Problem(
                "cluster.reservation",
                f"{what} of {of} has room for {free} of the {r.hosts} VMs the run needs "
                f"({part.in_use_count} of {part.count} in use)",
            )
        )
    report.checked.append(f"{what} of {of}: {free} of {part.count} VMs free, {r.hosts} needed")
