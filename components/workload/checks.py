"""The checks of a run spec against the hardware: the slice against the TPU catalogue, Ray Train worker counts
against the slice, GKE version floors of the features the slice needs, and MaxText's argument rules.

``resolve`` is the one entry point every caller that runs or plans anything uses: preset -> overrides -> the
spec's own checks (``components.spec``) -> these. Each raises SpecError naming the field.
"""

from __future__ import annotations

import re
import typing
from typing import Any

from components.spec import RunSpec, SpecError, layered, names
from components.tpu import catalogue
from components.workload import derive, maxtext


def resolve(preset: str, overrides: str | typing.Iterable[str] | dict[str, Any] = "") -> RunSpec:
    """preset name + overrides -> a RunSpec that passed every check, or SpecError naming the first bad field."""
    spec = layered(preset, overrides)
    check(spec)
    return spec


def check(spec: RunSpec) -> None:
    check_slice(spec)
    check_queued(spec)
    check_flex_start_duration(spec)
    check_workers(spec)
    check_gke_network(spec)
    check_gke_versions(spec)
    check_testing_ranks(spec)
    if spec.train.workload == "maxtext":
        maxtext.validate(spec)


def check_slice(spec: RunSpec) -> None:
    """The slice against the TPU catalogue: family, topology, hosts per slice, and multislice."""
    c = spec.cluster
    if c.accelerator == "cpu":
        return
    try:
        family = catalogue.family(c.accelerator)
    except catalogue.CatalogueError:
        raise SpecError(
            "cluster.accelerator", f"unknown accelerator {c.accelerator!r}", ["cpu", *catalogue.FAMILIES]
        ) from None
    valid = catalogue.topologies(family.name)
    if not c.topology:
        raise SpecError("cluster.topology", f"required for accelerator {family.name}", valid)
    try:
        shape = catalogue.slice_shape(family.name, c.topology)
    except catalogue.CatalogueError:
        raise SpecError("cluster.topology", f"{c.topology!r} is not a {family.name} topology", valid) from None
    if c.num_hosts != shape.num_hosts:
        raise SpecError(
            "cluster.num_hosts",
            f"a {family.name} {shape.topology} slice is {shape.num_hosts} hosts of {shape.machine_type} "
            f"({shape.chips_per_host} chips each), got {c.num_hosts}",
            [str(shape.num_hosts)],
        )
    # A reservation by name, one block of it, or one sub-block of a block (GKE docs, "Consume reserved zonal
    # resources": https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations), in this project or a
    # shared one.
    name = "[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
    part = rf"(/reservationBlocks/{name}(/reservationSubBlocks/{name})?)?"
    if "reservation" in c.capacities and not re.fullmatch(
        rf"(projects/{names.PROJECT_ID_PATTERN}/reservations/)?{name}{part}", c.reservation
    ):
        raise SpecError(
            "cluster.reservation",
            f"{c.reservation!r} is not a reservation",
            [
                "a reservation name",
                "NAME/reservationBlocks/BLOCK",
                "NAME/reservationBlocks/BLOCK/reservationSubBlocks/SUB_BLOCK",
                "projects/PROJECT/reservations/NAME",
                "projects/PROJECT/reservations/NAME/reservationBlocks/BLOCK",
            ],
        )
    block = "/reservationBlocks/" in c.reservation
    if "reservation" in c.capacities and spec.gke.cluster_mode == "autopilot" and block:
        # On Autopilot the reservation is a pod's node selector, cloud.google.com/reservation-name, whose value is the
        # reservation's name alone: a label value has no "/" (https://kubernetes.io/docs/concepts/overview/
        # working-with-objects/labels/#syntax-and-character-set), so the API server would refuse the pods.
        raise SpecError(
            "cluster.reservation",
            f"{c.reservation!r}: a block or sub-block of a reservation is consumed by a Standard cluster's node pools; "
            "Autopilot selects a reservation by name alone",
            ["a reservation name", "projects/PROJECT/reservations/NAME", "gke.cluster_mode=standard"],
        )
    if c.num_slices > 1 and not shape.multi_host:
        multi = [t for t in valid if catalogue.slice_shape(family.name, t).multi_host]
        raise SpecError(
            "cluster.num_slices",
            f"{c.num_slices} slices of the single-host {family.name} {shape.topology}: GKE Multislice takes "
            f"multi-host slices only ({', '.join(multi)})",
            ["1"],
        )


# What a family without queued provisioning uses instead: flex-start node pools behind Kueue, as GKE's tutorial
# "Optimize AI training on TPUs with DWS and Kueue" does (https://docs.cloud.google.com/kubernetes-engine/docs/tutorials/
# ray-kueue-dws: a DWS flex-start TPU pool that Kueue falls back to).
QUEUED_ALTERNATIVE = (
    "cluster.capacity=flex-start, on a shared cluster behind Kueue (gke.queue) as GKE's tutorial \"Optimize AI "
    'training on TPUs with DWS and Kueue" does (https://docs.cloud.google.com/kubernetes-engine/docs/tutorials/'
    "ray-kueue-dws)"
)
QUEUED_REFUSED = (
    "GKE answered TPU node pools with queued provisioning \"400 Flex start node pools don't support TPUs with queued "
    'provisioning" (https://github.com/AI-Hypercomputer/xpk/pull/900, src/xpk/utils/kueue.py)'
)


def check_queued(spec: RunSpec) -> None:
    """cluster.capacity=queued (a rung of the ladder) only for a family a public source shows GKE's queued
    provisioning for (``Family.queued_provisioning``, sources in the catalogue); elsewhere refused, naming the
    source of the refusal and the alternative."""
    c = spec.cluster
    if "queued" not in c.capacities or c.accelerator == "cpu":
        return
    family = catalogue.family(c.accelerator)
    if not family.queued_provisioning:
        _refuse_queued(family)
    if c.num_slices > 1:
        # Queued provisioning is for one slice at a time: xpk turns it off for multislice
        # (https://github.com/AI-Hypercomputer/xpk/pull/631, "Don't set --enable-queued-provisioning for flex
        # multislice"). Through Kueue, its admission check would ask for every slice's hosts in ONE ProvisioningRequest
        # (https://kueue.sigs.k8s.io/docs/admission-check-controllers/provisioning/), which GKE fulfils within one node
        # pool of one slice (components.platforms.gke.plan.queued); without it, one request per slice is decided on
        # its own, and nothing public bounds how long a Provisioned slice's nodes bill while the others wait.
        raise SpecError(
            "cluster.num_slices",
            f"{c.num_slices} slices with cluster.capacity=queued: GKE's queued provisioning gives one slice's nodes at "
            "a time and cannot start several together; one slice, or cluster.capacity=flex-start behind Kueue "
            "(gke.queue), which admits the slices together",
            ["1"],
        )


# Flex-start (and queued provisioning, which is flex-start's) gives nodes "for up to seven days": GKE, "About flex-start
# provisioning mode" (https://cloud.google.com/kubernetes-engine/docs/concepts/dws), where a ProvisioningRequest's
# ``maxRunDurationSeconds`` also defaults to seven days; the run's deadline becomes that parameter (``plan.queued``).
FLEX_START_MAX_H = 7 * 24


def check_flex_start_duration(spec: RunSpec) -> None:
    """A run with a flex-start or queued rung may not ask for more than flex-start's seven days (run.deadline_h)."""
    hours, capacities = spec.run.deadline_h, spec.cluster.capacities
    flex = [c for c in capacities if c in ("flex-start", "queued")]
    if hours is not None and hours > FLEX_START_MAX_H and flex and spec.cluster.accelerator != "cpu":
        raise SpecError(
            "run.deadline_h",
            f"{hours:g} hours with cluster.capacity {', '.join(flex)}: flex-start nodes run for at most seven days "
            f'({FLEX_START_MAX_H} hours, the longest maxRunDurationSeconds: GKE, "About flex-start provisioning '
            'mode"); a shorter deadline, or another capacity (spot, on-demand, reservation)',
        )


def _refuse_queued(family: catalogue.Family) -> None:
    """capacity=queued on a family without a source: refused, naming GKE's refusal and the alternative."""
    supported = [f"{f.name} ({f.queued_provisioning})" for f in catalogue.FAMILIES.values() if f.queued_provisioning]
    raise SpecError(
        "cluster.capacity",
        f"queued provisioning of {family.name} TPU slices has no public GKE source; {QUEUED_REFUSED}, and Google "
        f"shows it for {', '.join(supported)} only. Use {QUEUED_ALTERNATIVE}",
        ["flex-start", "spot", "on-demand", "reservation"],
    )


def check_workers(spec: RunSpec) -> None:
    """Ray Train worker counts: whole slices, and an elastic range (min_workers, max_workers) of whole slices."""
    t, slices = spec.train, spec.cluster.num_slices
    per_slice = derive.workers_per_slice(spec)
    whole = [str(per_slice * k) for k in range(1, slices + 1)]
    unit = (
        f"slices of {per_slice} workers ({derive.workers_per_host(spec)} per host x "
        f"{spec.cluster.num_hosts} hosts), at most {slices}"
    )
    if t.min_workers or t.max_workers:
        if not (t.min_workers and t.max_workers):
            missing = "train.max_workers" if t.min_workers else "train.min_workers"
            raise SpecError(
                missing,
                "an elastic range needs both train.min_workers and train.max_workers (both 0: not elastic)",
                whole,
            )
        if t.num_workers:
            raise SpecError(
                "train.num_workers",
                "set either train.num_workers or the elastic range train.min_workers..train.max_workers, not both",
                ["0"],
            )
        for key, value in (("train.min_workers", t.min_workers), ("train.max_workers", t.max_workers)):
            if value % per_slice or value > per_slice * slices:
                raise SpecError(key, f"{value} is not a whole number of {unit}", whole)
        if t.min_workers > t.max_workers:
            raise SpecError(
                "train.min_workers",
                f"{t.min_workers} is more than train.max_workers={t.max_workers}",
                [w for w in whole if int(w) <= t.max_workers],
            )
    elif derive.is_tpu(spec) and t.num_workers and str(t.num_workers) not in whole:
        raise SpecError("train.num_workers", f"{t.num_workers} is not a whole number of {unit}", ["0", *whole])
    elif not derive.is_tpu(spec) and t.workload == "fsdp" and slices > 1 and spec.num_workers % slices:
        # Emulated hosts: HSDP (trainers.mesh) shards the model over as many workers on every slice.
        raise SpecError(
            "train.num_workers",
            f"{spec.num_workers} workers do not split evenly over {slices} slices (HSDP shards the model over "
            "as many workers on every slice)",
            ["0", f"a multiple of {slices}"],
        )
    per_host = derive.workers_per_host(spec)
    if derive.is_tpu(spec) and spec.cluster.cpus_per_host < per_host:
        # Ray Train reserves a CPU with every worker's TPU bundle; the pod's CPU limit is the host's Ray CPUs.
        raise SpecError(
            "cluster.cpus_per_host",
            f"{spec.cluster.cpus_per_host} CPUs cannot hold the {per_host} "
            "Ray Train workers of each host (one CPU each)",
            [f"an integer >= {per_host}"],
        )


def check_testing_ranks(spec: RunSpec) -> None:
    """The slice check's test aids name one of its ranks."""
    ranks = derive.check_ranks(spec)
    for key, rank in {
        "testing.slice_check_corrupt_rank": spec.testing.slice_check_corrupt_rank,
        "testing.slice_check_slow_rank": spec.testing.slice_check_slow_rank,
    }.items():
        if rank >= ranks:
            valid = ["-1", f"0 to {ranks - 1}"]
            raise SpecError(key, f"rank {rank} is not one of the slice check's {ranks} ranks", valid)


def check_gke_network(spec: RunSpec) -> None:
    """The DCN NICs need node pools, and the accelerator network profile the families it supports (catalogue)."""
    g = spec.gke
    if not derive.has_dcn_nics(spec):
        return
    if g.cluster_mode == "autopilot":
        raise SpecError(
            "gke.multislice_network",
            "autopilot clusters have no node pools to attach the DCN NICs "
            "to; multislice on autopilot uses the default network",
            ["none"],
        )
    family = catalogue.family(spec.cluster.accelerator)
    if g.multislice_network == "accelerator_network_profile" and not family.accelerator_network_profile:
        supported = [f.name for f in catalogue.FAMILIES.values() if f.accelerator_network_profile]
        raise SpecError(
            "gke.multislice_network",
            f"the accelerator network profile does not support {family.name} "
            f"(only {', '.join(supported)}): give the slices their own DCN networks",
            ["dcn_networks", "none"],
        )


def version_floors(spec: RunSpec) -> list[tuple[str, str]]:
    """(minimum GKE version, the feature that needs it) of the slice's family and of managed DRANET
    (``derive.MIN_GKE_VERSION_*``, with their sources)."""
    if not derive.is_tpu(spec):
        return []
    mode = spec.gke.cluster_mode
    family = catalogue.family(spec.cluster.accelerator).name
    floors = []
    if (family, mode) in derive.MIN_GKE_VERSION_FOR_FAMILY:
        floors.append((derive.MIN_GKE_VERSION_FOR_FAMILY[family, mode], f"{family} TPUs"))
    if derive.has_dcn_nics(spec):
        floors.append((derive.MIN_GKE_VERSION_FOR_DRANET[mode], "managed DRANET"))
    return floors


def floor_missed(spec: RunSpec, version: str) -> tuple[str, str] | None:
    """The first (floor, feature) of ``version_floors`` that GKE ``version`` does not reach; None when it reaches
    them all."""
    return next(
        ((floor, feature) for floor, feature in version_floors(spec) if not derive.version_at_least(version, floor)),
        None,
    )


def check_gke_versions(spec: RunSpec) -> None:
    """A pinned GKE version must be at least the floors of the slice's family and of managed DRANET. (Provisioning
    checks the version GKE reports for the cluster against the same floors.)"""
    version = spec.gke.cluster_version
    missed = floor_missed(spec, version) if version else None
    if missed:
        floor, feature = missed
        raise SpecError(
            "gke.cluster_version",
            f"{version} is older than {floor}, the first {spec.gke.cluster_mode} version with {feature}",
            [f">= {floor}", "latest"],
        )
