"""A run queued in a ClusterQueue of a Kueue cohort (``cohortName``): its own quota too small, it may borrow the rest
from the cohort's other ClusterQueues (their ``lendingLimit``, else their whole ``nominalQuota``). Preflight warns and
lets it go (the emulated Kueue then admits it by borrowing); a run that fits nowhere, its cohort included, is still
refused, and the emulated Kueue never admits it either."""

from __future__ import annotations

import copy

from components.platforms.gke import GkePlatform
from tests.gke.test_kueue import QUEUED, _left, _workloads, context, setup
from tests.gke.test_preflight import _team_cluster, preflight_cli

V1 = "kueue.x-k8s.io/v1beta2"


def cohort(project, own: int, lends: int | None) -> None:
    """shared-tpu (``own`` chips of v6e) joins cohort ``research`` beside other-team, a ClusterQueue of 4 v6e chips
    that lends ``lends`` of them (all, when None) and runs nothing."""
    kueue = setup(project, quota_chips=own)
    with project.kube.lock:
        shared = copy.deepcopy(project.kube.objects[("clusterqueues", "", "shared-tpu")])
    shared["spec"]["cohortName"] = "research"
    kueue.apply(shared)
    other = copy.deepcopy(shared)
    other["metadata"] = {"name": "other-team"}
    tpu = other["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0]
    tpu["nominalQuota"] = 4
    if lends is not None:
        tpu["lendingLimit"] = lends
    kueue.apply(other)


def test_a_run_that_fits_only_by_borrowing_in_its_cohort_is_warned_and_admitted(
    tmp_path, project_factory, monkeypatch, capsys
):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project)
    cohort(project, own=2, lends=None)
    code, text = preflight_cli(QUEUED + " gke.queue=team-a", capsys)
    assert code == 0, text
    assert (
        "warning: ClusterQueue shared-tpu (of LocalQueue team-a) has a quota of 2 google.com/tpu in flavor v6e, less "
        "than the run's 4: the run fits only by borrowing 2 from the other ClusterQueues of its cohort research (they "
        "lend it up to 4)" in text
    ), text
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = context(tmp_path, "borrower", QUEUED + " gke.queue=team-a")
    gke.provision(ctx)
    assert gke.deploy_raycluster(ctx)["available_workers"] == 1
    (workload,) = _workloads(project)
    usage = {a["name"]: a["resourceUsage"] for a in workload["status"]["admission"]["podSetAssignments"]}
    assert workload["status"]["admission"]["clusterQueue"] == "shared-tpu" and "4" in [
        u.get("google.com/tpu") for u in usage.values()
    ]
    gke.teardown(ctx)
    assert _left(project, "borrower") == {}


def test_a_run_that_fits_nowhere_in_its_cohort_is_refused_and_never_admitted(project_factory, capsys):
    project = project_factory()
    _team_cluster(project)
    cohort(project, own=2, lends=1)  # 2 + 1 < 4
    before = project.mutations()
    code, text = preflight_cli(QUEUED + " gke.queue=team-a", capsys)
    assert (
        code == 2
        and (
            "gke.queue: ClusterQueue shared-tpu (of LocalQueue team-a) has a quota of 2 google.com/tpu in flavor v6e, "
            "less than the run's 4 (1 x 4-chip tpu-v6e-slice 2x2), and its cohort research lends it at most 1: Kueue "
            "admits"
        )
        in text
    ), text
    assert project.mutations() == before


def test_the_emulated_kueue_lends_only_what_the_lender_leaves_unused(project_factory):
    """The emulator's rule on its own: each member may take its own part plus the cohort pool's unused part (every
    member's lendable quota), at most nominalQuota + borrowingLimit."""
    project = project_factory()
    _team_cluster(project)
    cohort(project, own=2, lends=None)
    kueue = project.kube.kueue
    with project.kube.lock:
        shared = project.kube.objects[("clusterqueues", "", "shared-tpu")]
        other = project.kube.objects[("clusterqueues", "", "other-team")]
        assert kueue._room(shared, "v6e", "google.com/tpu", {}) == 6
        assert kueue._room(other, "v6e", "google.com/tpu", {("v6e", "google.com/tpu"): 3.0}) == 3
        other["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0]["lendingLimit"] = 1
        assert kueue._room(shared, "v6e", "google.com/tpu", {}) == 3
        assert kueue._room(shared, "v6e", "google.com/tpu", {("v6e", "google.com/tpu"): 3.0}) == 0
        shared["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0]["borrowingLimit"] = 0
        assert kueue._room(shared, "v6e", "google.com/tpu", {}) == 2


def test_a_hierarchical_cohort_is_warned_not_refused(project_factory, capsys):
    """A Cohort object with quota of its own (or a parent) lends what this check cannot count: the run is warned and
    let through for Kueue to decide, where a flat cohort that lends too little refuses it (above)."""
    project = project_factory()
    _team_cluster(project)
    cohort(project, own=2, lends=1)
    research = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Cohort",
        "metadata": {"name": "research", "uid": "c1"},
        "spec": {"parentName": "org"},
    }
    with project.kube.lock:
        project.kube.objects[("cohorts", "", "research")] = research
    code, text = preflight_cli(QUEUED + " gke.queue=team-a", capsys)
    assert code == 0 and "cohort research is a Cohort object with its own quota or a parent" in text, text
