"""The TPU catalogue against the documented facts: GKE's topology tables, node labels, and Ray's strings."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from components.tpu import catalogue
from components.tpu.catalogue import CatalogueError

# (family, topology): chips, hosts, chips per host, machine type, Ray pod type
DOCUMENTED = {
    # v5e: GKE's table; 2x4 is the single 8-chip VM.
    ("v5e", "1x1"): (1, 1, 1, "ct5lp-hightpu-1t", "v5litepod-1"),
    ("v5e", "2x2"): (4, 1, 4, "ct5lp-hightpu-4t", "v5litepod-4"),
    ("v5e", "2x4"): (8, 1, 8, "ct5lp-hightpu-8t", "v5litepod-8"),
    ("v5e", "4x4"): (16, 4, 4, "ct5lp-hightpu-4t", "v5litepod-16"),
    ("v5e", "16x16"): (256, 64, 4, "ct5lp-hightpu-4t", "v5litepod-256"),
    # v5p: Ray counts two TensorCores per chip in the pod type.
    ("v5p", "2x2x1"): (4, 1, 4, "ct5p-hightpu-4t", "v5p-8"),
    ("v5p", "2x2x2"): (8, 2, 4, "ct5p-hightpu-4t", "v5p-16"),
    ("v5p", "4x4x4"): (64, 16, 4, "ct5p-hightpu-4t", "v5p-128"),
    ("v5p", "16x16x24"): (6144, 1536, 4, "ct5p-hightpu-4t", "v5p-12288"),
    # v6e
    ("v6e", "1x1"): (1, 1, 1, "ct6e-standard-1t", "v6e-1"),
    ("v6e", "2x2"): (4, 1, 4, "ct6e-standard-4t", "v6e-4"),
    ("v6e", "2x4"): (8, 1, 8, "ct6e-standard-8t", "v6e-8"),
    ("v6e", "4x4"): (16, 4, 4, "ct6e-standard-4t", "v6e-16"),
    ("v6e", "8x8"): (64, 16, 4, "ct6e-standard-4t", "v6e-64"),
    ("v6e", "16x16"): (256, 64, 4, "ct6e-standard-4t", "v6e-256"),
    # TPU7x: four chips per VM; Ray's pod type counts two TensorCores per chip ("tpu7x-16" -> "v7x-16").
    ("tpu7x", "2x2x1"): (4, 1, 4, "tpu7x-standard-4t", "v7x-8"),
    ("tpu7x", "2x2x2"): (8, 2, 4, "tpu7x-standard-4t", "v7x-16"),
    ("tpu7x", "4x4x4"): (64, 16, 4, "tpu7x-standard-4t", "v7x-128"),
    ("tpu7x", "8x16x16"): (2048, 512, 4, "tpu7x-standard-4t", "v7x-4096"),
}

# family: node label, Ray accelerator type, logical devices per chip, topology dimensions
FAMILY_FACTS = {
    "v5e": ("tpu-v5-lite-podslice", "TPU-V5LITEPOD", 1, 2),
    "v5p": ("tpu-v5p-slice", "TPU-V5P", 1, 3),
    "v6e": ("tpu-v6e-slice", "TPU-V6E", 1, 2),
    "tpu7x": ("tpu7x", "TPU-V7X", 2, 3),
}


@pytest.mark.parametrize(("name", "topology"), sorted(DOCUMENTED))
def test_documented_shapes(name: str, topology: str) -> None:
    chips, hosts, per_host, machine, pod_type = DOCUMENTED[(name, topology)]
    shape = catalogue.slice_shape(name, topology)
    assert shape.family is catalogue.family(name)
    assert shape.topology == topology
    assert (shape.num_chips, shape.num_hosts, shape.chips_per_host) == (chips, hosts, per_host)
    assert shape.machine_type == machine
    assert shape.pod_type == pod_type
    assert shape.multi_host is (hosts > 1)


@pytest.mark.parametrize("name", sorted(FAMILY_FACTS))
def test_family_facts(name: str) -> None:
    label, ray_type, devices, dims = FAMILY_FACTS[name]
    fam = catalogue.FAMILIES[name]
    assert fam.name == name
    assert fam.gke_accelerator == label
    assert fam.ray_accelerator_type == ray_type
    assert fam.logical_devices_per_chip == devices
    assert fam.topology_dims == dims


def test_families_are_the_four_documented() -> None:
    assert list(catalogue.FAMILIES) == ["v5e", "v5p", "v6e", "tpu7x"]


def test_v6e_4x4_as_the_tutorials_use_it() -> None:
    shape = catalogue.slice_shape("v6e", "4x4")
    assert shape.num_chips == 16
    assert shape.num_hosts == 4 and shape.chips_per_host == 4 and shape.multi_host
    assert shape.machine_type == "ct6e-standard-4t"
    assert shape.family.gke_accelerator == "tpu-v6e-slice"
    assert shape.family.ray_accelerator_type == "TPU-V6E"
    assert shape.pod_type == "v6e-16"
    assert shape.logical_devices_per_host == 4


def test_v6e_16x16_is_a_full_pod() -> None:
    shape = catalogue.slice_shape("v6e", "16x16")
    assert (shape.num_chips, shape.num_hosts, shape.chips_per_host) == (256, 64, 4)


def test_tpu7x_2x2x2_as_the_tutorials_use_it() -> None:
    shape = catalogue.slice_shape("tpu7x", "2x2x2")
    assert shape.num_chips == 8
    assert shape.num_hosts == 2 and shape.chips_per_host == 4 and shape.multi_host
    assert shape.machine_type == "tpu7x-standard-4t"
    assert shape.family.gke_accelerator == "tpu7x"
    assert shape.family.ray_accelerator_type == "TPU-V7X"
    assert shape.family.logical_devices_per_chip == 2
    assert shape.logical_devices_per_host == 8


@pytest.mark.parametrize(
    ("name", "first", "last"),
    [
        ("v5e", "1x1", "16x16"),
        ("v5p", "2x2x1", "16x16x24"),
        ("v6e", "1x1", "16x16"),
        ("tpu7x", "2x2x1", "8x16x16"),
    ],
)
def test_topologies_run_smallest_to_largest(name: str, first: str, last: str) -> None:
    topos = catalogue.topologies(name)
    assert topos[0] == first and topos[-1] == last
    chips = [catalogue.slice_shape(name, t).num_chips for t in topos]
    assert chips == sorted(chips) and len(set(topos)) == len(topos)


def test_topologies_returns_a_copy() -> None:
    catalogue.topologies("v6e").append("99x99")
    assert "99x99" not in catalogue.topologies("v6e")


@pytest.mark.parametrize("name", ["v5e", "v6e"])
def test_2d_families(name: str) -> None:
    assert catalogue.topologies(name) == ["1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"]


def test_every_shape_is_consistent() -> None:
    for name, fam in catalogue.FAMILIES.items():
        for topology in catalogue.topologies(name):
            shape = catalogue.slice_shape(name, topology)
            dims = [int(d) for d in topology.split("x")]
            assert len(dims) == fam.topology_dims
            assert shape.num_chips == math.prod(dims) == shape.num_hosts * shape.chips_per_host
            assert shape.machine_type.endswith(f"-{shape.chips_per_host}t")
            assert shape.multi_host is (shape.num_hosts > 1)
            assert shape.logical_devices_per_host == shape.chips_per_host * fam.logical_devices_per_chip
            generation, size = shape.pod_type.rsplit("-", 1)
            assert fam.ray_accelerator_type == f"TPU-{generation.upper()}"
            assert int(size) in (shape.num_chips, 2 * shape.num_chips)


def test_only_small_2d_slices_and_single_vms_are_single_host() -> None:
    single = {
        (name, t)
        for name in catalogue.FAMILIES
        for t in catalogue.topologies(name)
        if not catalogue.slice_shape(name, t).multi_host
    }
    assert single == {
        ("v5e", "1x1"), ("v5e", "2x2"), ("v5e", "2x4"),
        ("v6e", "1x1"), ("v6e", "2x2"), ("v6e", "2x4"),
        ("v5p", "2x2x1"), ("tpu7x", "2x2x1"),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("v5e", "v5e"),
        ("v5litepod", "v5e"),
        ("v5lite", "v5e"),
        ("V5LitePod", "v5e"),
        ("tpu-v5-lite-podslice", "v5e"),
        ("TPU-V5LITEPOD", "v5e"),
        ("v5p", "v5p"),
        ("tpu-v5p-slice", "v5p"),
        ("TPU-V5P", "v5p"),
        ("v6e", "v6e"),
        ("V6E", "v6e"),
        ("trillium", "v6e"),
        ("tpu-v6e-slice", "v6e"),
        ("TPU-V6E", "v6e"),
        ("tpu7x", "tpu7x"),
        ("TPU7x", "tpu7x"),
        ("ironwood", "tpu7x"),
        ("Ironwood", "tpu7x"),
        ("v7x", "tpu7x"),
        ("7x", "tpu7x"),
        ("TPU-V7X", "tpu7x"),
        (" v6e ", "v6e"),
    ],
)
def test_aliases(spelling: str, canonical: str) -> None:
    assert catalogue.family(spelling) is catalogue.FAMILIES[canonical]
    assert catalogue.topologies(spelling) == catalogue.topologies(canonical)


def test_slice_shape_accepts_aliases_and_spacing() -> None:
    assert catalogue.slice_shape("ironwood", " 2X2X2 ") is catalogue.slice_shape("tpu7x", "2x2x2")
    assert catalogue.slice_shape("v5litepod", "4x4") is catalogue.slice_shape("v5e", "4x4")


def test_no_spelling_names_two_families() -> None:
    spellings = [s.lower() for fam in catalogue.FAMILIES.values() for s in (fam.name, *fam.aliases)]
    assert len(spellings) == len(set(spellings))


@pytest.mark.parametrize("name", ["v9", "", "v4", "gpu", "tpu"])
def test_unknown_family(name: str) -> None:
    with pytest.raises(CatalogueError) as caught:
        catalogue.family(name)
    err = caught.value
    assert isinstance(err, ValueError)
    assert err.field == "accelerator"
    assert err.valid == ["v5e", "v5p", "v6e", "tpu7x"]
    message = str(err)
    assert repr(name) in message
    for valid in ("v5e", "v5p", "v6e", "tpu7x", "ironwood", "v5litepod"):
        assert valid in message


def test_unknown_family_through_topologies_and_slice_shape() -> None:
    with pytest.raises(CatalogueError) as caught:
        catalogue.topologies("v9")
    assert caught.value.field == "accelerator"
    with pytest.raises(CatalogueError) as caught:
        catalogue.slice_shape("v9", "4x4")
    assert caught.value.field == "accelerator"


@pytest.mark.parametrize(
    ("name", "topology"),
    [
        ("v6e", "4x5"),
        ("v6e", "2x2x2"),
        ("v6e", "2x8"),
        ("tpu7x", "4x4"),
        ("tpu7x", "1x1x1"),
        ("v5p", ""),
        ("v5e", "4"),
    ],
)
def test_unknown_topology(name: str, topology: str) -> None:
    with pytest.raises(CatalogueError) as caught:
        catalogue.slice_shape(name, topology)
    err = caught.value
    assert err.field == "topology"
    assert err.valid == catalogue.topologies(name)
    message = str(err)
    assert repr(topology) in message
    assert catalogue.family(name).name in message
    for valid in err.valid:
        assert valid in message


def test_v6e_4x5_message_lists_the_valid_topologies() -> None:
    with pytest.raises(CatalogueError, match=r"'4x5'.*v6e.*1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"):
        catalogue.slice_shape("v6e", "4x5")


def test_records_are_frozen() -> None:
    shape = catalogue.slice_shape("v6e", "4x4")
    with pytest.raises(AttributeError):
        shape.num_hosts = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        shape.family.name = "v7"  # type: ignore[misc]


def test_imports_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); from components.tpu import catalogue; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "std = set(sys.stdlib_module_names) | {'components'}; "
        "print(sorted(new - std))"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
