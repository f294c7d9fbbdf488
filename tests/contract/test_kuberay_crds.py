"""Every RayCluster tpupipe renders validates against the real KubeRay v1.7.0 CRD (and KubeRay's own checks), for
every seed preset and for the variants the derivations branch on. (tpupipe creates no RayJob: the stages submit
their jobs through the Ray Jobs API; docs/architecture.md.)"""

from __future__ import annotations

import copy

import pytest

from components.platforms.gke.plan import document as plan
from components.spec import presets
from components.tpu import catalogue
from components.workload import resolve

TPU_PRESETS = sorted(n for n, p in presets.PRESETS.items() if p.get("cluster", {}).get("accelerator", "cpu") != "cpu")

VARIANTS = [
    *[(name, "") for name in TPU_PRESETS],
    ("gemma4-e2b-v6e-16", "gke.cluster_mode=autopilot"),
    ("gemma4-e2b-v6e-16", "cluster.capacity=spot gke.cluster_mode=autopilot"),
    ("llama3-8b-v6e-16x2", "gke.cluster_mode=autopilot gke.multislice_network=none"),
    ("llama3-8b-v6e-16x2", "gke.multislice_network=accelerator_network_profile"),
    ("llama3-8b-v6e-16x2", "cluster.capacity=flex-start"),
    (
        "llama3-8b-v6e-16x2",
        "cluster.capacity=reservation cluster.reservation=projects/other-project/reservations/tpu "
        "gke.cluster_mode=autopilot gke.multislice_network=none",
    ),
    ("llama3-70b-v6e-16x2", "gke.cluster_name=shared-cluster gke.project=my-project gke.bucket=my-bucket"),
    ("gemma4-e2b-v6e-16", "cluster.accelerator=v5e cluster.topology=2x2 cluster.num_hosts=1 train.num_workers=0"),
    (
        "gemma4-e2b-v6e-16",
        "cluster.accelerator=v5p cluster.topology=4x4x4 cluster.num_hosts=16 cluster.num_slices=2 train.num_workers=0",
    ),
    ("gemma4-e2b-tpu7x-16", "cluster.topology=4x4x4 cluster.num_hosts=16 cluster.num_slices=4 train.num_workers=0"),
    (
        "llama3-8b-v6e-16x2",
        "cluster.topology=16x16 cluster.num_hosts=64 cluster.num_slices=64 maxtext.ici_fsdp_parallelism=-1",
    ),
]


def rendered(preset: str, overrides: str, run_id: str = "") -> dict[str, dict]:
    spec = resolve(preset, overrides)
    document = plan.build(spec, run_id or preset)
    return {obj["kind"]: obj for obj in plan.kubernetes_objects(document)}


@pytest.mark.parametrize(("preset", "overrides"), VARIANTS, ids=[f"{p}[{o}]" for p, o in VARIANTS])
def test_raycluster_validates(crds, preset, overrides):
    objects = rendered(preset, overrides)
    assert "RayJob" not in objects  # nothing is listed that the run does not create
    assert crds.errors(objects["RayCluster"]) == []


def test_longest_run_id_still_fits_kuberay(crds):
    objects = rendered("llama3-70b-v6e-16x2", "", run_id="r" + "x" * 39)
    assert crds.errors(objects["RayCluster"]) == []


@pytest.mark.parametrize(("preset", "overrides"), VARIANTS, ids=[f"{p}[{o}]" for p, o in VARIANTS])
def test_kuberay_checks_beyond_the_schema(preset, overrides):
    """What ray-operator/controllers/ray/utils/validation.go rejects, and what the TPU webhook checks."""
    spec = resolve(preset, overrides)
    shape = catalogue.slice_shape(spec.cluster.accelerator, spec.cluster.topology)
    objects = rendered(preset, overrides)
    cluster = objects["RayCluster"]["spec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        assert group["template"]["spec"]["containers"], "a group needs a container"
        start = group.get("rayStartParams", {})
        if any(start.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")):
            assert not group.get("resources"), "resources in both rayStartParams and resources"
        assert "labels" not in start
    (workers,) = cluster["workerGroupSpecs"]
    assert workers["numOfHosts"] == shape.num_hosts  # the webhook rejects a numOfHosts the topology does not have
    assert workers["minReplicas"] <= workers["replicas"] == spec.cluster.num_slices == workers["maxReplicas"]


def _first_worker_container(obj):
    return obj["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]


MUTATIONS = {
    "unknown field": lambda o: o["spec"].update(workerGroupsSpecs=[]),
    "replicas as a string": lambda o: o["spec"]["workerGroupSpecs"][0].update(replicas="2"),
    "int32 overflow": lambda o: o["spec"]["workerGroupSpecs"][0].update(numOfHosts=2**31),
    "bad quantity": lambda o: _first_worker_container(o)["resources"]["limits"].update(memory="lots"),
    "duplicate port": lambda o: o["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"].append(
        {"name": "again", "containerPort": 6379, "protocol": "TCP"}
    ),
    "duplicate container": lambda o: o["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"].append(
        copy.deepcopy(_first_worker_container(o))
    ),
    "no head group": lambda o: o["spec"].pop("headGroupSpec"),
    "no minReplicas": lambda o: o["spec"]["workerGroupSpecs"][0].pop("minReplicas"),
    "bad managedBy": lambda o: o["spec"].update(managedBy="someone-else"),
    "name too long for KubeRay": lambda o: o["metadata"].update(name="r" * 54),
    "bad label value": lambda o: o["metadata"]["labels"].update(bad="not ok!"),
    "bad node selector value": lambda o: o["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"].update(
        **{"cloud.google.com/reservation-name": "projects/p/reservations/r"}
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_check_rejects_broken_rayclusters(crds, mutation):
    obj = copy.deepcopy(rendered("llama3-8b-v6e-16x2", "")["RayCluster"])
    assert crds.errors(obj) == []
    MUTATIONS[mutation](obj)
    assert crds.errors(obj), mutation


def test_a_rule_the_check_cannot_evaluate_fails_instead_of_passing_unchecked(crds):
    from tests.contract.kuberay_schema import _cel_rules

    errors = list(_cel_rules(None, [{"rule": "self.size() > 1"}], "x", {}))
    assert errors and "not evaluated" in errors[0].message
    assert list(_cel_rules(None, [{"rule": "self == oldSelf"}], "x", {})) == []  # update-only rules are skipped
