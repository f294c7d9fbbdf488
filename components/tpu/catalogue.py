"""The Cloud TPU catalogue: accelerator families and the slice shapes GKE accepts for each, as data.

One row per accepted (family, topology): how many chips, how many hosts (VMs, i.e. GKE nodes) of which
machine type, and the strings that name the slice to GKE (node label) and to Ray (accelerator type, pod
type). Everything else is derived from the rows; nothing here talks to a cloud.

Pure standard library and cheap to import: the pipeline image, the trainer images and the CLI all read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "FAMILIES",
    "CatalogueError",
    "Family",
    "SliceShape",
    "family",
    "link_floor",
    "slice_shape",
    "topologies",
    "zones",
]


class CatalogueError(ValueError):
    """An accelerator family or a topology the catalogue does not know.

    ``field`` is ``"accelerator"`` or ``"topology"``; ``valid`` lists the values that would have been
    accepted.
    """

    def __init__(self, field: str, message: str, valid: Iterable[str], also: Iterable[str] = ()):
        self.field = field
        self.valid = list(valid)
        text = f"{message} (valid: {', '.join(self.valid)}"
        also = list(also)
        if also:
            text += f"; also accepted: {', '.join(also)}"
        super().__init__(text + ")")


@dataclass(frozen=True)
class Family:
    """One TPU accelerator family (generation)."""

    name: str  # canonical: "v5e", "v5p", "v6e", "tpu7x"
    aliases: tuple[str, ...]  # other spellings family() accepts, matched case-insensitively
    gke_accelerator: str  # value of the node label cloud.google.com/gke-tpu-accelerator
    ray_accelerator_type: str  # Ray's ScalingConfig(accelerator_type=...), e.g. "TPU-V6E"
    logical_devices_per_chip: int  # devices a framework (JAX) sees per chip
    topology_dims: int  # 2 (AxB) or 3 (AxBxC)
    # Node settings of the family's GKE node pools (sources below, at FAMILIES):
    threads_per_core: int | None = None  # advancedMachineFeatures.threadsPerCore; None: GKE's default, not set
    accelerator_network_profile: bool = False  # node pools may take accelerator_network_profile=auto (DRANET NICs)
    # Documented link bandwidths (sources at FAMILIES), the slice check's floors derive from them (link_floor):
    ici_gbytes_per_s: float | None = None  # bidirectional inter-chip interconnect per chip, GB/s
    dcn_gbits_per_s: float | None = None  # data center network per chip, Gbit/s
    # The public Google source that shows GKE's queued provisioning (flex-start node pools with
    # --enable-queued-provisioning, fulfilled by a ProvisioningRequest) for the family's slices; "": none, and
    # cluster.capacity=queued is refused for it (sources below, at FAMILIES).
    queued_provisioning: str = ""
    hbm_gib_per_chip: float | None = None  # high-bandwidth memory per chip, GiB (sources below, at FAMILIES)

    @property
    def hbm_bytes_per_device(self) -> int | None:
        """The HBM one logical device (what JAX sees) holds: the chip's, shared by its devices (TPU7x: two)."""
        if self.hbm_gib_per_chip is None:
            return None
        return int(self.hbm_gib_per_chip * 2**30) // self.logical_devices_per_chip


@dataclass(frozen=True)
class SliceShape:
    """One accepted slice: a family, a topology, and the hosts that carry it."""

    family: Family
    topology: str  # "4x4"
    num_chips: int
    num_hosts: int  # VMs in the slice: GKE nodes in its node pool
    chips_per_host: int
    machine_type: str  # GKE machine type of every host, e.g. "ct6e-standard-4t"
    pod_type: str  # Ray's TPU pod type, e.g. "v6e-16" (label ray.io/tpu-pod-type)

    @property
    def multi_host(self) -> bool:
        return self.num_hosts > 1

    @property
    def logical_devices_per_host(self) -> int:
        return self.chips_per_host * self.family.logical_devices_per_chip


# --- Families ---------------------------------------------------------------------------------------------
#
# Node label values (cloud.google.com/gke-tpu-accelerator):
#   https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus
#   https://cloud.google.com/kubernetes-engine/docs/how-to/tpus
#   TPU7x's value, "tpu7x", is also xpk's gke_accelerator for it:
#   https://github.com/AI-Hypercomputer/xpk/blob/main/src/xpk/core/system_characteristics.py
# Ray accelerator types: Ray names a TPU node "TPU-" + its generation in upper case, the generation being the
# prefix of the pod type ("v6e-16" -> "TPU-V6E"; GKE's "tpu7x-16" is first respelled "v7x-16" -> "TPU-V7X"):
#   https://github.com/ray-project/ray/blob/master/python/ray/_private/accelerators/tpu.py
#   https://github.com/ray-project/ray/blob/master/python/ray/util/accelerators/accelerators.py
# Logical devices per chip: a v5e or v6e chip has one TensorCore (https://cloud.google.com/tpu/docs/v5e,
# https://cloud.google.com/tpu/docs/v6e); a v5p chip has two, run together as one "megacore" device
# (https://cloud.google.com/tpu/docs/v5p); a TPU7x chip has two TensorCores, exposed as two devices
# (https://cloud.google.com/tpu/docs/tpu7x; Ray's tpu.py says the same of v7x).
# Aliases include each family's node label and its Ray type in lower case, so either names the family.
# Node settings: v6e pools run 1 thread per core in the GKE tutorial "Train an LLM such as Llama 3 70B on GKE with
#   MaxText, Ray Train and multislice Trillium TPUs" ("Infrastructure":
#   https://docs.cloud.google.com/kubernetes-engine/docs/tutorials/multi-slice-training-ray); neither the GKE
#   tutorial "Fine-tune models on multi-host TPUs with Ray and TorchTPU" (TPU7x) nor xpk sets threads per core on
#   TPU7x pools, and neither tutorial names it for v5e or v5p: GKE's default (docs/tutorials.md lists both).
#   The accelerator network profile (GKE-made DCN networks, DRANET NICs) is what xpk uses on v6e; xpk
#   (https://github.com/AI-Hypercomputer/xpk) does not support it on TPU7x, and the DRANET claims of
#   https://cloud.google.com/kubernetes-engine/docs/how-to/allocate-network-resources-dra use `All`; nor is it
#   documented for v5e or v5p.

# Link bandwidths, each family's "System architecture" table: v5e ICI 400 GBps bidirectional per chip, 2 x 100 Gbps
#   NICs per 8-chip host (25 Gbps of DCN a chip; https://docs.cloud.google.com/tpu/docs/v5e); v6e ICI 800 GBps,
#   4 x 200 Gbps NICs per 8-chip host (100 Gbps a chip; https://docs.cloud.google.com/tpu/docs/v6e); v5p ICI 1200
#   GBps, DCN 50 Gbps per chip (https://docs.cloud.google.com/tpu/docs/v5p); TPU7x ICI 1200 GBps, DCN 100 Gbps per
#   chip (https://docs.cloud.google.com/tpu/docs/tpu7x). A family without a figure would have its slice check
#   measure and report the bandwidth but hold it to no floor (the check warns).

# HBM per chip: the TPU7x page's comparison table, "HBM capacity per chip (GiB)": v5p 95, v6e 32, TPU7x 192
#   (https://docs.cloud.google.com/tpu/docs/tpu7x, "System architecture"); v5e 16 ("HBM capacity per chip: 16 GB",
#   https://docs.cloud.google.com/tpu/docs/v5e, whose "GB" is taken as the GiB of the table above, where v6e's own
#   page's "32 GB" is 32 GiB). A TPU7x chip's two devices share its 192 (Family.hbm_bytes_per_device).

# Queued provisioning: GKE's guide, "Run a large-scale workload with flex-start with queued provisioning"
#   (https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest), is written for GPUs, and GKE has
#   refused TPU node pools that ask for it: xpk turned it off for TPUs after "ResponseError: code=400, message=Flex
#   start node pools don't support TPUs with queued provisioning" (https://github.com/AI-Hypercomputer/xpk/pull/900,
#   "fix: FSQ only for GPUs", src/xpk/utils/kueue.py: is_queued_cluster is true for GPUs only, 2025-12-03). Google's
#   cluster-toolkit then published TPU queued provisioning for v6e and TPU7x only
#   (https://github.com/GoogleCloudPlatform/cluster-toolkit/pull/5218, "Adding GKE TPU DWS Queued Provisioning support
#   for v6e and 7x", 2026-02-12: examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-tpu-v6e and
#   gke-tpu-7x, each pool one slice, max nodes = the slice's hosts). No public source shows it for v5e or v5p.
QUEUED_V6E = (
    "https://github.com/GoogleCloudPlatform/cluster-toolkit/tree/1047080375afbb44da4b596be314634e7486af4a/"
    "examples/gke-consumption-options/dws-flex-start-queued-provisioning/gke-tpu-v6e"
)
QUEUED_TPU7X = QUEUED_V6E.removesuffix("gke-tpu-v6e") + "gke-tpu-7x"

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="v5e",
            aliases=("v5litepod", "v5lite", "v5-lite", "tpu-v5e", "tpu-v5litepod", "tpu-v5-lite-podslice"),
            gke_accelerator="tpu-v5-lite-podslice",
            ray_accelerator_type="TPU-V5LITEPOD",
            logical_devices_per_chip=1,
            topology_dims=2,
            ici_gbytes_per_s=400,
            dcn_gbits_per_s=25,
            hbm_gib_per_chip=16,
        ),
        Family(
            name="v5p",
            aliases=("tpu-v5p", "tpu-v5p-slice"),
            gke_accelerator="tpu-v5p-slice",
            ray_accelerator_type="TPU-V5P",
            logical_devices_per_chip=1,
            topology_dims=3,
            ici_gbytes_per_s=1200,
            dcn_gbits_per_s=50,
            hbm_gib_per_chip=95,
        ),
        Family(
            name="v6e",
            aliases=("trillium", "tpu-v6e", "tpu-v6e-slice"),
            gke_accelerator="tpu-v6e-slice",
            ray_accelerator_type="TPU-V6E",
            logical_devices_per_chip=1,
            topology_dims=2,
            threads_per_core=1,
            accelerator_network_profile=True,
            ici_gbytes_per_s=800,
            dcn_gbits_per_s=100,
            hbm_gib_per_chip=32,
            queued_provisioning=QUEUED_V6E,
        ),
        Family(
            name="tpu7x",
            aliases=("ironwood", "v7x", "7x", "tpu-v7x"),
            gke_accelerator="tpu7x",
            ray_accelerator_type="TPU-V7X",
            logical_devices_per_chip=2,
            topology_dims=3,
            ici_gbytes_per_s=1200,
            dcn_gbits_per_s=100,
            hbm_gib_per_chip=192,
            queued_provisioning=QUEUED_TPU7X,
        ),
    )
}

# Ray's pod type is "<generation>-<N>", N counting TensorCores: one per chip on v5e and v6e, two per chip on
# v5p and TPU7x (a v5p 2x2x1, 4 chips, is "v5p-8"; a TPU7x 2x2x2, 8 chips, is "v7x-16"). From
# infer_tpu_pod_type_from_topology, get_tpu_cores_per_chip and normalize_tpu_accelerator_type in
#   https://github.com/ray-project/ray/blob/master/python/ray/_private/accelerators/tpu.py
_RAY_POD_TYPE: dict[str, tuple[str, int]] = {
    # family: (generation, TensorCores per chip)
    "v5e": ("v5litepod", 1),
    "v5p": ("v5p", 2),
    "v6e": ("v6e", 1),
    "tpu7x": ("v7x", 2),
}

# --- Zones ------------------------------------------------------------------------------------------------
#
# Where each family can be created, North America first, from https://docs.cloud.google.com/tpu/docs/regions-zones
# (read 2026-11-29; it also lists AI zones such as us-central1-ai1a, left out here). The first zone of a family
# is the default zone of `tpupipe plan`; a zone not listed is allowed (the table changes) but warned about.
_ZONES: dict[str, tuple[str, ...]] = {
    "v5e": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    "v5p": ("us-east5-a", "us-central1-a"),
    "v6e": ("us-east5-b", "us-east5-a", "us-east1-d", "us-central1-b", "europe-west4-a"),
    "tpu7x": ("us-central1-c",),
}


# The slice check's floor is this fraction of the documented figure (one direction of ICI, a chip's DCN share): a
# choice of tpupipe's, not a documented figure. A healthy link's 32 MiB all-reduce runs well above it; a link degraded
# to a few percent of its speed (a flapping or mis-cabled link) falls below it.
LINK_FLOOR_FRACTION = 0.05


def link_floor(family_name: str, multislice: bool) -> tuple[float | None, str]:
    """The GB/s an all-reduce's bus bandwidth must reach on every rank (a device) of a slice of ``family_name``: over
    ICI within one slice, over DCN across slices (``multislice``), a chip's figure shared by its devices (TPU7x: two,
    https://docs.cloud.google.com/tpu/docs/tpu7x, "Dual-chiplet architecture"); and where the figure comes from.
    None: no documented figure."""
    fam = family(family_name)
    if multislice:
        if fam.dcn_gbits_per_s is None:
            return None, f"{fam.name}: no documented DCN bandwidth in the catalogue"
        peak, link = fam.dcn_gbits_per_s / 8, f"DCN {fam.dcn_gbits_per_s:g} Gbps per chip"
    else:
        if fam.ici_gbytes_per_s is None:
            return None, f"{fam.name}: no documented ICI bandwidth in the catalogue"
        peak, link = fam.ici_gbytes_per_s / 2, f"ICI {fam.ici_gbytes_per_s:g} GB/s bidirectional per chip"
    per_device = fam.logical_devices_per_chip
    share = f", over {per_device} devices a chip" if per_device > 1 else ""
    return (
        peak * LINK_FLOOR_FRACTION / per_device,
        f"{LINK_FLOOR_FRACTION:.0%} of {fam.name}'s {link}{share} (Cloud TPU docs)",
    )


def zones(family_name: str) -> list[str]:
    """The documented zones of a family; the first is the default."""
    return list(_ZONES[family(family_name).name])


# --- Machine types ----------------------------------------------------------------------------------------
#
# TPU chips on one VM of each GKE machine type (the "-<N>t" suffix):
#   https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus
#   https://cloud.google.com/compute/docs/tpus/tpu-machines
_CHIPS_PER_MACHINE: dict[str, int] = {
    "ct5lp-hightpu-1t": 1,
    "ct5lp-hightpu-4t": 4,
    "ct5lp-hightpu-8t": 8,
    "ct5p-hightpu-4t": 4,
    "ct6e-standard-1t": 1,
    "ct6e-standard-4t": 4,
    "ct6e-standard-8t": 8,
    "tpu7x-standard-4t": 4,
}

# --- Slice shapes -----------------------------------------------------------------------------------------
#
# (topology, machine type) per family, smallest slice first. A slice's chips are the product of its
# topology's dimensions; its hosts are chips / chips per machine.
#
# v5e, v6e: the topology table of https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus (and
#   https://cloud.google.com/tpu/docs/v5e, https://cloud.google.com/tpu/docs/v6e): 1x1 on a 1-chip VM, 2x2 and
#   2x4 on one VM, every larger shape on 4-chip VMs. GKE also offers 2x4 as two 4-chip VMs; the catalogue
#   takes the one 8-chip VM (ct5lp-hightpu-8t, ct6e-standard-8t) because Ray places a 2x4 of these families
#   on a single host (get_chips_per_host in Ray's tpu.py). Ray's extra 2x8 is not in GKE's table: not here.
# v5p: https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus and
#   https://cloud.google.com/tpu/docs/v5p: every shape on 4-chip ct5p-hightpu-4t VMs. GKE takes many more
#   AxBxC shapes; the catalogue keeps the doubling series Ray tabulates (2x2x1 .. 16x16x16) and 16x16x24.
# TPU7x: https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus,
#   https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood (four chips per VM) and
#   https://cloud.google.com/tpu/docs/tpu7x: every shape on 4-chip tpu7x-standard-4t VMs. The shapes are those
#   Ray accepts for v7x (VALID_TPU_TOPOLOGY in its tpu.py), all also listed by xpk for tpu7x-standard-4t.
#   The 1-chip tpu7x-standard-1t (1x1x1) is left out: Ray does not accept a 1x1x1 v7x topology.

_3D_SERIES = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16")

_SHAPE_ROWS: dict[str, tuple[tuple[str, str], ...]] = {
    "v5e": (
        ("1x1", "ct5lp-hightpu-1t"),
        ("2x2", "ct5lp-hightpu-4t"),
        ("2x4", "ct5lp-hightpu-8t"),
        ("4x4", "ct5lp-hightpu-4t"),
        ("4x8", "ct5lp-hightpu-4t"),
        ("8x8", "ct5lp-hightpu-4t"),
        ("8x16", "ct5lp-hightpu-4t"),
        ("16x16", "ct5lp-hightpu-4t"),
    ),
    "v5p": tuple((topo, "ct5p-hightpu-4t") for topo in (*_3D_SERIES, "16x16x16", "16x16x24")),
    "v6e": (
        ("1x1", "ct6e-standard-1t"),
        ("2x2", "ct6e-standard-4t"),
        ("2x4", "ct6e-standard-8t"),
        ("4x4", "ct6e-standard-4t"),
        ("4x8", "ct6e-standard-4t"),
        ("8x8", "ct6e-standard-4t"),
        ("8x16", "ct6e-standard-4t"),
        ("16x16", "ct6e-standard-4t"),
    ),
    "tpu7x": tuple((topo, "tpu7x-standard-4t") for topo in _3D_SERIES),
}


def _build_shape(fam: Family, topology: str, machine_type: str) -> SliceShape:
    dims = [int(d) for d in topology.split("x")]
    if len(dims) != fam.topology_dims:
        raise AssertionError(f"catalogue row {fam.name} {topology}: not {fam.topology_dims}-dimensional")
    num_chips = math.prod(dims)
    chips_per_host = _CHIPS_PER_MACHINE[machine_type]
    num_hosts, spare = divmod(num_chips, chips_per_host)
    if spare or not num_hosts:
        raise AssertionError(f"catalogue row {fam.name} {topology}: {machine_type} does not tile it")
    generation, cores_per_chip = _RAY_POD_TYPE[fam.name]
    return SliceShape(
        family=fam,
        topology=topology,
        num_chips=num_chips,
        num_hosts=num_hosts,
        chips_per_host=chips_per_host,
        machine_type=machine_type,
        pod_type=f"{generation}-{num_chips * cores_per_chip}",
    )


_SHAPES: dict[str, dict[str, SliceShape]] = {
    name: {topo: _build_shape(FAMILIES[name], topo, machine) for topo, machine in rows}
    for name, rows in _SHAPE_ROWS.items()
}


def _spellings() -> dict[str, Family]:
    by_spelling: dict[str, Family] = {}
    for fam in FAMILIES.values():
        for spelling in (fam.name, *fam.aliases):
            if by_spelling.setdefault(spelling.lower(), fam) is not fam:
                raise AssertionError(f"catalogue: {spelling!r} names two families")
    return by_spelling


_BY_SPELLING = _spellings()


def family(name: str) -> Family:
    """The family called ``name``: a canonical name or an alias, in any case."""
    found = _BY_SPELLING.get(name.strip().lower()) if isinstance(name, str) else None
    if found is None:
        raise CatalogueError(
            "accelerator",
            f"unknown TPU accelerator family {name!r}",
            FAMILIES,
            also=(alias for fam in FAMILIES.values() for alias in fam.aliases),
        )
    return found


def topologies(family_name: str) -> list[str]:
    """The topologies accepted for a family, smallest slice first."""
    return list(_SHAPES[family(family_name).name])


def slice_shape(family_name: str, topology: str) -> SliceShape:
    """The accepted slice of family ``family_name`` with ``topology`` (e.g. ``"4x4"``, ``"2x2x2"``)."""
    fam = family(family_name)
    shapes = _SHAPES[fam.name]
    found = shapes.get(topology.strip().lower()) if isinstance(topology, str) else None
    if found is None:
        raise CatalogueError(
            "topology",
            f"topology {topology!r} is not accepted for TPU family {fam.name}",
            shapes,
        )
    return found
