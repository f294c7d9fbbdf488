"""A run queued in Kueue on a shared cluster (gke.queue), over the emulators (the Kubernetes emulator playing Kueue:
tests/emulators/kueue.py) with the gke platform's real stage code: two teams' runs on one cluster with a quota of one
slice (the second waits, saying where it stands, and is admitted when the first is torn down; nothing of either is
left), a run whose deadline passes in the queue, and preflight's checks of the queue, each problem naming its field."""

from __future__ import annotations

import json
import threading
import time

import pytest

from components.platforms import RunContext
from components.platforms.gke import GkePlatform
from components.platforms.gke.plan import queued
from components.platforms.store import LocalStore
from components.spec import InfraError
from components.workload import resolve
from tests.emulators.kueue import Kueue
from tests.emulators.project import ONE_SLICE, PROJECT
from tests.gke.test_preflight import _team_cluster, preflight_cli

QUEUED = ONE_SLICE + " gke.cluster_name=team cluster.ready_timeout_s=60"


def setup(project, quota_chips: int = 4, topology: str = "2x2", priority: bool = False) -> Kueue:
    """Kueue installed in the team's cluster: one flavor for the v6e slice, one for CPUs, a ClusterQueue with
    ``quota_chips`` of google.com/tpu that preempts lower priorities, LocalQueues team-a and team-b in tpupipe."""
    kueue = project.kube.kueue = Kueue(project.kube)
    with project.kube.lock:
        project.kube.objects[("namespaces", "", "tpupipe")] = {"metadata": {"name": "tpupipe"}}
    v1 = "kueue.x-k8s.io/v1beta2"
    labels = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": topology}
    kueue.apply(
        {"apiVersion": v1, "kind": "ResourceFlavor", "metadata": {"name": "v6e"}, "spec": {"nodeLabels": labels}}
    )
    kueue.apply({"apiVersion": v1, "kind": "ResourceFlavor", "metadata": {"name": "cpu"}, "spec": {}})
    cpu = [{"name": "cpu", "nominalQuota": 64}, {"name": "memory", "nominalQuota": "512Gi"}]
    kueue.apply(
        {
            "apiVersion": v1,
            "kind": "ClusterQueue",
            "metadata": {"name": "shared-tpu"},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {"coveredResources": ["cpu", "memory"], "flavors": [{"name": "cpu", "resources": cpu}]},
                    {
                        "coveredResources": ["google.com/tpu"],
                        "flavors": [
                            {"name": "v6e", "resources": [{"name": "google.com/tpu", "nominalQuota": quota_chips}]}
                        ],
                    },
                ],
            },
        }
    )
    for team in ("team-a", "team-b"):
        kueue.apply(
            {
                "apiVersion": v1,
                "kind": "LocalQueue",
                "metadata": {"name": team, "namespace": "tpupipe"},
                "spec": {"clusterQueue": "shared-tpu"},
            }
        )
    if priority:
        kueue.apply({"apiVersion": v1, "kind": "WorkloadPriorityClass", "metadata": {"name": "high"}, "value": 1000})
    return kueue


def context(tmp_path, run_id: str, overrides: str) -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke"
    )


def _workloads(project) -> list[dict]:
    with project.kube.lock:
        return [o for (p, _, _), o in project.kube.objects.items() if p == "workloads"]


def _left(project, run_id: str) -> dict:
    """What of the run is left, the shared cluster apart (kept: the run did not create it)."""
    left = project.leftovers(run_id)
    assert left.pop("clusters", []) == [f"projects/{PROJECT}/locations/us-east5-b/clusters/team"]
    return left


def test_two_teams_share_a_quota_of_one_slice_the_second_waits_its_turn(tmp_path, project_factory, monkeypatch):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project)
    setup(project)
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    first = context(tmp_path, "team-a-run", QUEUED + " gke.queue=team-a")
    second = context(tmp_path, "team-b-run", QUEUED + " gke.queue=team-b")
    for ctx in (first, second):
        gke.provision(ctx)
    assert project.gke.state.calls.count("CreateNodePool") == 0  # no node pool: the nodes are the cluster's
    assert gke.deploy_raycluster(first)["available_workers"] == 1
    done: dict = {}
    waiter = threading.Thread(target=lambda: done.update(result=gke.deploy_raycluster(second)))
    waiter.start()
    for _ in range(200):
        if any("queued in team-b: position 1, 0 chips ahead" in line for line in logs):
            break
        waiter.join(0.05)
    assert waiter.is_alive()  # waiting for the quota the first run holds
    assert any("insufficient quota for google.com/tpu in ClusterQueue shared-tpu" in line for line in logs), logs
    assert project.rayclusters("team-b-run") == ["team-b-run"] and not project.kube.objects.get(
        ("pods", "tpupipe", "team-b-run-head")
    )
    gke.teardown(first)  # its Workload goes with its RayCluster: the quota is free
    waiter.join(30)
    assert done["result"]["available_workers"] == 1 and done["result"]["queue_wait"]
    gke.teardown(second)
    for run in ("team-a-run", "team-b-run"):
        assert _left(project, run) == {}
    assert _workloads(project) == []


def test_a_run_still_queued_at_its_deadline_fails_saying_where_it_stood(tmp_path, project_factory, monkeypatch):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project)
    setup(project)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    holder = context(tmp_path, "holder", QUEUED + " gke.queue=team-a")
    waiter = context(tmp_path, "waiter", QUEUED + " gke.queue=team-b run.deadline_h=0.0003")  # about a second
    gke.provision(holder)
    gke.deploy_raycluster(holder)
    gke.provision(waiter)
    with pytest.raises(
        InfraError,
        match=r"not admitted by Kueue within \d+s \(run.deadline_h\): queued in team-b: "
        r"position 1, 0 chips ahead: insufficient quota",
    ):
        gke.deploy_raycluster(waiter)
    gke.teardown(waiter)  # withdrawn from the queue: its RayCluster and Workload are gone, why it waited kept
    kept = json.loads((tmp_path / "waiter" / "logs" / "kueue_workload.json").read_text())
    assert kept["queue"] == "team-b" and kept["admission"] is None
    assert kept["conditions"][0]["message"] == "insufficient quota for google.com/tpu in ClusterQueue shared-tpu"
    assert project.rayclusters("waiter") == [] and len(_workloads(project)) == 1
    gke.teardown(holder)
    assert _left(project, "waiter") == {} and _left(project, "holder") == {} and _workloads(project) == []


# ---------------------------------------------------------------- preflight on a shared cluster


def test_preflight_finds_the_queue_its_flavor_and_quota(project_factory, capsys):
    project = project_factory()
    _team_cluster(project)
    setup(project, priority=True)
    code, text = preflight_cli(QUEUED + " gke.queue=team-a gke.priority_class=high", capsys)
    assert code == 0, text
    assert "Kueue serves kueue.x-k8s.io/v1beta2 (Kueue v0.15 or later)" in text
    assert (
        "LocalQueue team-a -> ClusterQueue shared-tpu: flavor v6e (tpu-v6e-slice 2x2) has a quota of 4 "
        "google.com/tpu, the run asks for 4" in text
    )
    assert "may do all 24 things the run does there" in text  # Kueue's reads among them
    assert ("get", "visibility.kueue.x-k8s.io", "localqueues", "pendingworkloads") in project.kube.reviews


@pytest.mark.parametrize(
    "case, overrides, expected",
    [
        ("no kueue", "gke.queue=team-a", "gke.queue: Kueue is not installed in cluster team (no CRD localqueues"),
        (
            "no queue",
            "gke.queue=team-c",
            "gke.queue: no Kueue LocalQueue team-c in namespace tpupipe: its LocalQueues are team-a, team-b",
        ),
        (
            "other slice",
            "gke.queue=team-a",
            "gke.queue: ClusterQueue shared-tpu (of LocalQueue team-a) has no ResourceFlavor for tpu-v6e-slice 2x2",
        ),
        (
            "small quota",
            "gke.queue=team-a",
            "gke.queue: ClusterQueue shared-tpu (of LocalQueue team-a) has a quota of 2 "
            "google.com/tpu in flavor v6e, less than the run's 4",
        ),
        (
            "no priority",
            "gke.queue=team-a gke.priority_class=urgent",
            "gke.priority_class: no Kueue WorkloadPriorityClass urgent",
        ),
        (
            "denied",
            "gke.queue=team-a",
            "gke.cluster_name: the caller may not, in namespace tpupipe of cluster team: "
            "list workloads.kueue.x-k8s.io (deploy_raycluster finds the RayCluster's Workload",
        ),
    ],
    ids=["no kueue", "no queue", "other slice", "small quota", "no priority", "denied"],
)
def test_preflight_names_the_field_of_each_queue_problem(project_factory, capsys, case, overrides, expected):
    project = project_factory()
    _team_cluster(project)
    if case != "no kueue":
        setup(
            project, quota_chips=2 if case == "small quota" else 4, topology="4x4" if case == "other slice" else "2x2"
        )
    if case == "denied":
        project.kube.denied.add(("list", "kueue.x-k8s.io", "workloads", ""))
    before = project.mutations()  # the cluster's own objects: the namespace, Kueue's
    code, text = preflight_cli(f"{QUEUED} {overrides}", capsys)
    assert code == 2 and expected in text, text
    assert project.mutations() == before


def test_the_janitor_withdraws_a_queued_run_past_its_deadline_from_the_queue(tmp_path, project_factory, monkeypatch):
    from components.platforms.gke.run import janitor

    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project)
    kueue = setup(project)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    holder = context(tmp_path, "holder", QUEUED + " gke.queue=team-a")
    lost = context(tmp_path, "lost", QUEUED + " gke.queue=team-b run.deadline_h=0.0003")
    gke.provision(holder)
    gke.deploy_raycluster(holder)
    gke.provision(lost)
    kueue.visibility = False  # its feature gate off: the run waits all the same, without its position
    with pytest.raises(
        InfraError,
        match=r"not admitted by Kueue .*: queued in team-b \(no position: Kueue's "
        r"visibility API answered 404\)",
    ):
        gke.deploy_raycluster(lost)  # then its driver is gone: no teardown
    assert [w["spec"]["queueName"] for w in kueue.pending()] == ["team-b"]
    # Each run's own limit: the lost one's deadline and the teardown's grace, once they have passed.
    later = time.time() + janitor.STOP_GRACE_S + 60
    sweep = janitor.Janitor(str(tmp_path), log=lambda m: None, now=lambda: later).sweep()
    assert [f.run_id for f in sweep.collected] == ["lost"] and not sweep.failed, janitor.render(sweep, False)
    assert any(k.startswith("holder: kept") for k in sweep.kept), sweep.kept
    assert kueue.pending() == [] and project.rayclusters("lost") == [] and _left(project, "lost") == {}
    gke.teardown(holder)
    sets = ONE_SLICE + " train.timeout_s=3600 cluster.ready_timeout_s=600 cluster.slice_check_timeout_s=100"
    queued = sets + " gke.cluster_name=team gke.queue=team-a"
    assert janitor.limit_s(resolve("local-fsdp", queued)) == 3600 + 24 * 3600 + 600 + 300 + 7200
    assert (
        janitor.limit_s(resolve("local-fsdp", queued + " run.deadline_h=2")) == 7200 + janitor.STOP_GRACE_S
    )  # its deadline, and its teardown's time


# ---------------------------------------------------------------- the spec and the ledger


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ("gke.queue=team-a", "gke.queue: a Kueue LocalQueue is in an existing, shared cluster: gke.cluster_name"),
        ("gke.cluster_name=team gke.queue=Team_A", "gke.queue: 'Team_A' is not a Kueue object name"),
        ("gke.cluster_name=team gke.priority_class=high", "gke.priority_class: applies to a run queued in Kueue"),
    ],
)
def test_bad_queue_settings_are_refused_naming_the_field(overrides, expected):
    from components.spec import SpecError

    with pytest.raises(SpecError) as caught:
        resolve("local-fsdp", f"{ONE_SLICE} {overrides}")
    assert str(caught.value).startswith(expected), str(caught.value)


def test_the_ledger_counts_the_queue_wait_as_waiting_for_capacity_never_billed():
    from components.stages import goodput

    records = {
        "provision": {"started": 0.0, "seconds": 10.0, "status": "succeeded"},
        "deploy_raycluster": {"started": 10.0, "seconds": 110.0, "result": {"queue_wait": [10.0, 100.0]}},
    }
    ledger = goodput.ledger(records, chips=4, usd_per_hour=3600.0)
    by_name = {c["name"]: c for c in ledger["categories"]}
    assert by_name["waiting for capacity"]["seconds"] == 90.0 and by_name["waiting for capacity"]["chip_s"] == 0
    assert by_name["provisioning"]["seconds"] == 10.0 and by_name["cluster start"]["seconds"] == 20.0
    assert ledger["billed_s"] == 20.0  # the cluster's start after admission, not the 90 s in the queue


def test_a_higher_priority_run_evicts_a_running_one_which_is_admitted_again_after_it(
    tmp_path, project_factory, monkeypatch
):
    from components.platforms.gke.run import queueing

    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project)
    setup(project, priority=True)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    low = context(tmp_path, "low", QUEUED + " gke.queue=team-a")
    high = context(tmp_path, "high", QUEUED + " gke.queue=team-b gke.priority_class=high")
    for ctx in (low, high):
        gke.provision(ctx)
    gke.deploy_raycluster(low)
    kube, _, _ = gke.clients.kube(low)
    assert queueing.evicted(kube, "low") is None
    assert gke.deploy_raycluster(high)["available_workers"] == 1  # admitted at once: the low one is preempted
    reason = queueing.evicted(kube, "low")
    assert reason and reason.startswith("Preempted: Preempted to accommodate a workload"), reason
    jobs = gke.job_client(low, deadline=time.monotonic() + 120)  # its train job, say, now lost with its head
    started = time.monotonic()
    with pytest.raises(
        InfraError, match="RayCluster low was evicted by Kueue \\(Preempted: .*\\): its pods and the Ray job"
    ):
        jobs.get_job_info("low-train")
    assert time.monotonic() - started < 30  # at its first 503, not at the job's deadline
    with project.kube.lock:
        suspended = project.kube.objects[("rayclusters", "tpupipe", "low")]["spec"]["suspend"]
        low_pods = [n for (p, _, n) in project.kube.objects if p == "pods" and n.startswith("low-")]
    assert suspended is True and low_pods == []  # KubeRay deleted its pods
    gke.teardown(high)  # the quota is free again: the evicted run is admitted again, its pods made anew
    assert queueing.evicted(kube, "low") is None
    with project.kube.lock:
        assert project.kube.objects[("rayclusters", "tpupipe", "low")]["spec"]["suspend"] is False
        assert ("pods", "tpupipe", "low-head") in project.kube.objects
    gke.teardown(low)
    assert _left(project, "low") == {} and _left(project, "high") == {} and _workloads(project) == []


def test_a_run_evicted_before_its_raycluster_is_ready_waits_in_the_queue_again(tmp_path, project_factory, monkeypatch):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project)
    setup(project, priority=True)
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    low = context(tmp_path, "low", QUEUED + " gke.queue=team-a")
    high = context(tmp_path, "high", QUEUED + " gke.queue=team-b gke.priority_class=high")
    for ctx in (low, high):
        gke.provision(ctx)
    project.kube.fault = "never_starts"  # admitted, its pods stay in ContainerCreating
    done: dict = {}
    starting = threading.Thread(target=lambda: done.update(result=gke.deploy_raycluster(low)))
    starting.start()
    for _ in range(200):
        if ("pods", "tpupipe", "low-head") in project.kube.objects:
            break
        starting.join(0.05)
    project.kube.fault = ""
    gke.deploy_raycluster(high)  # preempts the low one on its way to ready
    for _ in range(200):
        if any("was evicted by Kueue: Preempted" in line for line in logs):
            break
        starting.join(0.05)
    assert starting.is_alive() and any("waiting for Kueue to admit it again" in line for line in logs), logs
    gke.teardown(high)
    starting.join(30)
    assert done["result"]["available_workers"] == 1 and done["result"]["queue_wait"]
    gke.teardown(low)
    assert _left(project, "low") == {} and _left(project, "high") == {} and _workloads(project) == []


# ------------------------------------------------------------------ capacity=queued through Kueue's admission check
QUEUED_CAPACITY = QUEUED + " gke.queue=team-a cluster.capacity=queued"
# The platform team's queued provisioning pool of v6e 2x2 slices in the shared cluster (GKE fulfils a
# ProvisioningRequest within one such pool: tests/emulators/provisioning.py).
QUEUED_POOL = {
    "name": "dws-v6e",
    "config": {"machineType": "ct6e-standard-4t"},
    "initialNodeCount": 0,
    "autoscaling": {"enabled": True, "minNodeCount": 0, "maxNodeCount": 1, "locationPolicy": "ANY"},
    "queuedProvisioning": {"enabled": True},
}


def provisioning_check(kueue: Kueue, config: bool = True, class_name: str | None = None, **retry):
    """The shared-tpu ClusterQueue runs Kueue's ProvisioningRequest admission check ``dws`` for its TPU flavor, of a
    ProvisioningRequestConfig ``dws-config`` of ``class_name`` (none unless ``config``) managing google.com/tpu."""
    v1 = "kueue.x-k8s.io/v1beta2"
    if config:
        spec = {
            "provisioningClassName": class_name or "queued-provisioning.gke.io",
            "managedResources": ["google.com/tpu"],
        }
        if retry:
            spec["retryStrategy"] = retry
        kueue.apply(
            {"apiVersion": v1, "kind": "ProvisioningRequestConfig", "metadata": {"name": "dws-config"}, "spec": spec}
        )
    params = {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "dws-config"}
    kueue.apply(
        {
            "apiVersion": v1,
            "kind": "AdmissionCheck",
            "metadata": {"name": "dws"},
            "spec": {"controllerName": "kueue.x-k8s.io/provisioning-request", "parameters": params},
        }
    )
    with kueue.kube.lock:
        cq = kueue.kube.objects[("clusterqueues", "", "shared-tpu")]
        cq["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": "dws", "onFlavors": ["v6e"]}]}
        kueue.reconcile()


def _requests(project) -> dict[str, dict]:
    with project.kube.lock:
        return {n: o for (p, _, n), o in project.kube.objects.items() if p == "provisioningrequests"}


def test_a_queued_run_in_kueue_is_admitted_once_its_provisioning_request_is_provisioned(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    project.kube.ready_without_ray = True
    project.kube.provisioner.provision_s = 0.3
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project, nodePools=[QUEUED_POOL])
    kueue = setup(project)
    provisioning_check(kueue)
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    ctx = context(tmp_path, "dws", QUEUED_CAPACITY + " run.deadline_h=2")
    gke.provision(ctx)
    assert gke.deploy_raycluster(ctx)["available_workers"] == 1
    ((name, request),) = _requests(project).items()  # Kueue's, not the run's: one, for the TPU pod set alone
    workload = _workloads(project)[0]
    assert request["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    # the slice's topology and the run's deadline, by annotation
    assert request["spec"]["parameters"] == {"tpu-topology": "2x2", "maxRunDurationSeconds": "7200"}
    assert [s["count"] for s in request["spec"]["podSets"]] == [1]
    assert request["metadata"]["ownerReferences"][0]["uid"] == workload["metadata"]["uid"]
    assert [(s["name"], s["state"]) for s in workload["status"]["admissionChecks"]] == [("dws", "Ready")]
    assert project.kube.provisioner.decided == [("tpupipe", name, "Provisioned")]
    with project.kube.lock:
        worker = project.kube.objects[("pods", "tpupipe", "dws-tpu-v6e-4-0-0")]
    assert worker["metadata"]["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"] == name
    # the pods, and so the request's PodTemplate Kueue makes of them, tolerate the queued nodes' taint
    template = project.kube.objects[
        ("podtemplates", "tpupipe", request["spec"]["podSets"][0]["podTemplateRef"]["name"])
    ]
    for pod_spec in (worker["spec"], template["template"]["spec"]):
        assert pod_spec["tolerations"] == [queued.TOLERATION]
    assert any("admission check dws Pending: Waiting for ProvisioningRequest" in line for line in logs), logs
    gke.teardown(ctx)
    assert _left(project, "dws") == {} and _workloads(project) == [] and _requests(project) == {}


def test_a_queued_run_whose_requests_fail_is_rejected_by_kueue_with_a_clear_message(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    project.kube.ready_without_ray = True
    project.kube.provisioner.provision_s = 0.1
    project.kube.provisioner.outcome = "capacity_not_found"
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _team_cluster(project, nodePools=[QUEUED_POOL])
    provisioning_check(setup(project), backoffLimitCount=1, backoffBaseSeconds=1, backoffMaxSeconds=5)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = context(tmp_path, "nodws", QUEUED_CAPACITY)
    gke.provision(ctx)
    with pytest.raises(
        InfraError,
        match="will not be admitted by Kueue: admission check dws Rejected: "
        "ProvisioningRequest .*-dws-2 is Failed .*Nothing of the slices was billed",
    ):
        gke.deploy_raycluster(ctx)
    assert [d[2] for d in project.kube.provisioner.decided] == ["Failed", "Failed"]  # retried once, after its backoff
    assert _workloads(project)[0]["spec"]["active"] is False  # deactivated
    gke.teardown(ctx)
    assert _left(project, "nodws") == {} and _workloads(project) == [] and _requests(project) == {}


def test_kueue_ignores_a_booking_that_expires_once_the_workload_is_admitted(project_factory):
    """Provisioned admits the Workload; the request's later conditions do not evict it (Kueue's docs: they "only
    affect non-admitted Workloads")."""
    from components.platforms.gke.plan import manifests
    from components.platforms.gke.plan.target import target

    project = project_factory()
    project.kube.ready_without_ray = True
    _team_cluster(project, nodePools=[QUEUED_POOL])
    kueue = setup(project)
    provisioning_check(kueue)
    provisioner = project.kube.provisioner
    provisioner.provision_s = 60.0  # decided by this test
    spec = resolve("local-fsdp", QUEUED_CAPACITY)
    body = manifests.raycluster(spec, target(spec, "exp"))
    body["metadata"]["uid"] = "uid-exp"
    with project.kube.lock:
        project.kube.objects[("rayclusters", "tpupipe", "exp")] = body
        kueue.raycluster_created("tpupipe", body)
    (first,) = _requests(project)
    assert [s["state"] for s in _workloads(project)[0]["status"]["admissionChecks"]] == ["Pending"]
    assert body["spec"]["suspend"] is True  # quota reserved, not admitted: KubeRay makes no pods
    provisioner._decide("tpupipe", first, "Provisioned", "Provisioned", "booked")
    assert [s["state"] for s in _workloads(project)[0]["status"]["admissionChecks"]] == ["Ready"]
    assert body["spec"]["suspend"] is False
    provisioner.expire_booking("tpupipe", first)
    assert _workloads(project)[0]["status"]["admission"] and body["spec"]["suspend"] is False


@pytest.mark.parametrize(
    "case, expected",
    [
        ("fine", "ClusterQueue shared-tpu: admission check dws (kueue.x-k8s.io/provisioning-request, Active, "),
        ("no check", "gke.queue: ClusterQueue shared-tpu (of LocalQueue team-a) runs no "),
        ("no config", "gke.queue: ClusterQueue shared-tpu (of LocalQueue team-a): its admission check dws is not "),
        ("other class", "names ProvisioningRequestConfig dws-config, of another class (check-capacity."),
    ],
    ids=["fine", "no check", "no config", "other class"],
)
def test_preflight_of_queued_capacity_in_kueue_checks_the_provisioning_admission_check(
    project_factory, capsys, case, expected
):
    project = project_factory()
    _team_cluster(project, nodePools=[QUEUED_POOL])
    kueue = setup(project)
    if case != "no check":
        other = "check-capacity.autoscaling.x-k8s.io"
        provisioning_check(kueue, config=case != "no config", class_name=other if case == "other class" else None)
    code, text = preflight_cli(QUEUED_CAPACITY, capsys)
    assert code == (0 if case == "fine" else 2) and expected in text, text
