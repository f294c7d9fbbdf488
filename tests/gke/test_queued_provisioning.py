"""cluster.capacity=queued (Dynamic Workload Scheduler's queued provisioning, docs/gke.md "Queued provisioning"): the
plan's node pool and its ProvisioningRequest, checked against the vendored CRD (several slices refused at validate);
the run over the emulators waits for the request and bills nothing while it waits (a request no one pool can take is
never provisioned); a request that fails ends the run with a
clear message, nothing billed, nothing left; preflight of an existing cluster without the API. And a pod lost
mid-run (a preempted host, replaced) kept in the post-mortem as it goes."""

from __future__ import annotations

import copy
import json
import threading
import time

import pytest

from components.platforms import RunContext, postmortem
from components.platforms.gke import GkePlatform
from components.platforms.gke.checks.preflight import PreflightFailed
from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import queued
from components.platforms.gke.run import readiness
from components.platforms.store import LocalStore
from components.spec import SpecError
from components.stages import goodput
from components.workload import resolve
from tests.emulators import provisioning
from tests.emulators.project import ONE_SLICE

QUEUED = ONE_SLICE + " cluster.capacity=queued run.deadline_h=6"
ONE_V6E_16 = "gke.project=my-project cluster.num_slices=1 cluster.capacity=queued"  # the llama3-8b-v6e-16x2 preset's


def context(tmp_path, run_id: str, overrides: str) -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke"
    )


def _planned(spec, run_id: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for res in plan.resources(spec, run_id):
        out.setdefault(res.kind, []).append(res.body)
    return out


def test_the_plan_has_a_queued_pool_and_a_request_for_it_that_the_crd_accepts():
    spec = resolve("llama3-8b-v6e-16x2", f"{ONE_V6E_16} run.deadline_h=12")
    planned = _planned(spec, "q2")
    pools = [p for p in planned["node-pool"] if p and "queuedProvisioning" in p]
    assert len(pools) == 1
    for pool in pools:
        assert pool["queuedProvisioning"] == {"enabled": True}
        assert pool["config"]["flexStart"] is True
        assert pool["config"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
        assert pool["initialNodeCount"] == 0
        assert pool["autoscaling"] == {"enabled": True, "minNodeCount": 0, "maxNodeCount": 4, "locationPolicy": "ANY"}
        assert pool["management"] == {"autoRepair": False, "autoUpgrade": True}
    requests, templates = planned["k8s/ProvisioningRequest"], planned["k8s/PodTemplate"]
    (raycluster,) = planned["k8s/RayCluster"]
    groups = raycluster["spec"]["workerGroupSpecs"]
    assert len(requests) == len(templates) == len(groups) == 1  # one for the slice's pool
    for pool, request, template, group in zip(pools, requests, templates, groups, strict=True):
        assert request["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
        assert request["spec"]["podSets"] == [{"podTemplateRef": {"name": template["metadata"]["name"]}, "count": 4}]
        # the slice's topology, as cluster-toolkit's TPU example passes it, and the run's deadline
        assert request["spec"]["parameters"] == {"tpu-topology": "4x4", "maxRunDurationSeconds": str(12 * 3600)}
        # no label of queued nodes selected: GKE gives them none (cluster-toolkit adds one to its pools' own labels)
        assert "cloud.google.com/gke-queued" not in group["template"]["spec"]["nodeSelector"]
        assert provisioning.errors(request) == []
        assert template["template"] == group["template"]  # what the pods will be
        assert (group["replicas"], group["numOfHosts"]) == (1, 4)
        pod = group["template"]["spec"]
        assert pod["nodeSelector"]["cloud.google.com/gke-nodepool"] == pool["name"]  # this pool's request only
        assert pod["tolerations"] == [queued.TOLERATION]  # GKE's taint on the queued pool's nodes
        annotations = group["template"]["metadata"]["annotations"]
        assert annotations[queued.CONSUME_ANNOTATION] == request["metadata"]["name"]
        assert annotations[queued.CLASS_ANNOTATION] == "queued-provisioning.gke.io"
    assert [r["metadata"]["name"] for r in requests] == queued.request_names(spec, "q2")
    kinds = [res.kind for res in plan.resources(spec, "q2")]  # the requests before the pods that consume them
    assert kinds.index("k8s/PodTemplate") < kinds.index("k8s/ProvisioningRequest") < kinds.index("k8s/RayCluster")


def test_the_crd_refuses_a_request_with_no_pods_and_autopilot_is_refused_naming_the_field():
    spec = resolve("llama3-8b-v6e-16x2", ONE_V6E_16)
    request = dict(_planned(spec, "q")["k8s/ProvisioningRequest"][0])
    # no run.deadline_h: flex-start's seven days, sent
    assert request["spec"]["parameters"] == {"tpu-topology": "4x4", "maxRunDurationSeconds": str(7 * 24 * 3600)}
    request["spec"] = {**request["spec"], "podSets": [{"podTemplateRef": {"name": "w"}, "count": 0}]}
    assert any("podSets.0.count" in e for e in provisioning.errors(request))
    with pytest.raises(SpecError) as refused:
        resolve("llama3-8b-v6e-16x2", ONE_V6E_16 + " gke.cluster_mode=autopilot")
    assert refused.value.field == "cluster.capacity" and refused.value.exit_code == 2


@pytest.mark.parametrize("queue", ["", " gke.cluster_name=shared gke.queue=team-a"])
def test_several_slices_with_queued_are_refused_at_validate_pointing_to_flex_start_behind_kueue(queue):
    with pytest.raises(SpecError) as refused:
        resolve("llama3-8b-v6e-16x2", "gke.project=my-project cluster.capacity=queued,spot" + queue)
    assert refused.value.field == "cluster.num_slices" and refused.value.exit_code == 2
    assert "cluster.capacity=flex-start behind Kueue (gke.queue)" in str(refused.value)


@pytest.mark.parametrize(
    "run_id, overrides, workers",
    [("queued", QUEUED, 1)],
)
def test_a_queued_run_waits_for_every_pools_request_bills_nothing_meanwhile_and_leaves_nothing(
    tmp_path, project_factory, monkeypatch, run_id, overrides, workers
):
    project = project_factory()
    project.kube.ready_without_ray = True
    project.kube.provisioner.provision_s = 1.0  # well past the unschedulable grace below
    monkeypatch.setenv("TPUPIPE_GKE_UNSCHEDULABLE_GRACE_S", "0.2")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, run_id, overrides + " cluster.ready_timeout_s=30")
    slices = ctx.spec.cluster.num_slices
    chips = slices * 4 * ctx.spec.cluster.num_hosts
    logs: list[str] = []
    seen_waiting = project.kube.provisioner.hold = threading.Event()  # decided only once the run says it waits

    def log(line: str) -> None:
        logs.append(line)
        if "waiting for ProvisioningRequest" in line:
            seen_waiting.set()

    gke = GkePlatform(log=log, poll_s=0.05)
    gke.provision(ctx)
    pools = project.gke.pools_labelled("tpupipe-run", run_id)
    assert len(pools) == slices + 1  # a queued pool per slice, and the head's
    result = gke.deploy_raycluster(ctx)
    assert result["available_workers"] == workers
    requests = queued.request_names(ctx.spec, run_id)
    assert len(requests) == slices  # one request per slice's pool, each Provisioned
    assert sorted(project.kube.provisioner.decided) == [("tpupipe", r, "Provisioned") for r in requests]
    since, until = result["capacity_wait"]
    # every pod of every slice waited (not billed: the goodput ledger's rule) until the last request came
    last = max(project.kube.provisioner.decided_at[("tpupipe", r)] for r in requests)
    assert since < last <= until
    assert any("waiting for ProvisioningRequest" in line for line in logs)
    ledger = goodput.ledger(
        {
            "provision": {"started": since - 5, "seconds": 5},
            "deploy_raycluster": {"started": since, "seconds": until - since + 1, "result": result},
        },
        chips=chips,
        usd_per_hour=10.0,
    )
    by_name = {c["name"]: c for c in ledger["categories"]}
    waited, started = by_name["waiting for capacity"], by_name["cluster start"]
    assert waited["seconds"] == pytest.approx(until - since, abs=0.01) and waited["chip_s"] == 0 and waited["usd"] == 0
    assert started["chip_s"] == pytest.approx(chips * 1, abs=0.05)  # billed from when the whole request came
    gke.teardown(ctx)
    assert project.leftovers(run_id) == {}


@pytest.mark.parametrize(
    "what, hosts, selector",
    [
        # more hosts than the run's one pool of 4 holds: GKE fulfils a request within one node pool
        ("too-many", 8, {}),
        # the label xpk's queued pods select, which GKE puts on no node (only cluster-toolkit's pools carry it)
        ("gke-queued", 4, {"cloud.google.com/gke-queued": "true"}),
    ],
)
def test_a_request_no_single_queued_pool_can_take_is_never_provisioned(
    tmp_path, project_factory, what, hosts, selector
):
    project = project_factory()
    kube = project.kube
    run_id = "nofit"
    ctx = context(tmp_path, run_id, QUEUED)
    GkePlatform(log=lambda m: None, poll_s=0.05).provision(ctx)
    template = copy.deepcopy(_planned(ctx.spec, run_id)["k8s/PodTemplate"][0])
    template["metadata"]["name"] = what
    template["template"]["spec"]["nodeSelector"].update(selector)
    kube.create("namespaces", "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tpupipe"}})
    kube.create("podtemplates", "tpupipe", template)
    request = {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": what},
        "spec": {
            "provisioningClassName": queued.CLASS_NAME,
            "podSets": [{"podTemplateRef": {"name": what}, "count": hosts}],
        },
    }
    kube.create("provisioningrequests", "tpupipe", request)
    conditions = kube.objects[("provisioningrequests", "tpupipe", what)]["status"]["conditions"]
    assert [(c["type"], c["status"]) for c in conditions] == [("Accepted", "True"), ("Provisioned", "False")]
    assert "all-or-nothing" in conditions[1]["message"]
    time.sleep(kube.provisioner.provision_s + 0.5)
    assert ("tpupipe", what) not in kube.provisioner.decided_at
    kube.delete("provisioningrequests", "tpupipe", what)
    kube.delete("podtemplates", "tpupipe", what)
    GkePlatform(log=lambda m: None, poll_s=0.05).teardown(ctx)
    assert project.leftovers(run_id) == {}


def test_a_request_that_fails_ends_the_run_with_a_clear_message_nothing_billed_and_nothing_left(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    project.kube.ready_without_ray = True
    project.kube.provisioner.outcome = "capacity_not_found"
    project.kube.provisioner.provision_s = 0.5
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "qfail", QUEUED + " cluster.ready_timeout_s=30")
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.provision(ctx)
    with pytest.raises(readiness.RayClusterNotReady) as failed:
        gke.deploy_raycluster(ctx)
    message = str(failed.value)
    assert f"ProvisioningRequest {queued.request_name('qfail')} will give the run no TPU nodes" in message
    assert "Failed: CapacityNotFound" in message and "Nothing of the slices was billed" in message
    with project.kube.lock:  # no worker ever had a node: none of the request's nodes was made
        workers = [
            o
            for (p, _, n), o in project.kube.objects.items()
            if p == "pods" and o["metadata"]["labels"].get("ray.io/node-type") == "worker"
        ]
        assert workers and all(readiness.unschedulable(w) is not None for w in workers)
    gke.teardown(ctx)
    assert project.leftovers("qfail") == {}


def test_the_readiness_machine_waits_on_an_unprovisioned_request_past_the_grace_and_fails_on_a_failed_one():
    machine = readiness.Readiness(unschedulable_grace_s=1.0, request_names=("r",))
    unsched = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "waits"}]
    pods = [{"metadata": {"name": "w0"}, "status": {"conditions": unsched}}]
    raycluster = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0}}
    accepted = {"status": {"conditions": [{"type": "Accepted", "status": "True"}]}}
    assert machine.step(raycluster, pods, 0.0, [], {"r": accepted}) is None
    assert machine.step(raycluster, pods, 100.0, [], {"r": accepted}) is None  # no scale-up event, yet not stuck
    assert "waiting for ProvisioningRequest r" in machine.last
    failed = json.loads(json.dumps(accepted))
    failed["status"]["conditions"].append(
        {"type": "Failed", "status": "True", "reason": "CapacityNotFound", "message": "no capacity"}
    )
    with pytest.raises(readiness.RayClusterNotReady, match="Failed: CapacityNotFound: no capacity"):
        machine.step(raycluster, pods, 101.0, [], {"r": failed})
    with pytest.raises(readiness.RayClusterNotReady, match="is gone"):
        machine.step(raycluster, pods, 102.0, [], {"r": None})


def test_an_existing_cluster_without_the_provisioning_request_api_is_a_preflight_problem_naming_the_field(
    tmp_path, project_factory, capsys
):
    from tests.gke.test_gke_platform import platform
    from tests.gke.test_preflight import SHARED, _team_cluster, preflight_cli

    project = project_factory()
    _team_cluster(project)
    project.kube.provisioner.crd_served = False
    overrides = SHARED + " cluster.capacity=queued"
    code, text = preflight_cli(overrides, capsys)
    assert code == 2 and "1 problem;" in text
    assert (
        f"gke.cluster_name: cluster team serves no autoscaling.x-k8s.io/v1 ProvisioningRequest (CRD {queued.CRD_NAME}"
        in text
    )
    assert "preflight does not check it" in text  # the version floor it holds no figure for: a warning
    with pytest.raises(PreflightFailed):
        platform().provision(context(tmp_path, "pre", overrides))
    assert project.mutations() == []
    project.kube.provisioner.crd_served = True
    code, text = preflight_cli(overrides, capsys)
    assert code == 0 and "cluster team: serves the autoscaling.x-k8s.io/v1 ProvisioningRequest API" in text
    for verb in ("create", "get", "delete"):  # the caller's rights on the request, asked of the API server
        assert (verb, "autoscaling.x-k8s.io", "provisioningrequests", "") in project.kube.reviews


def test_a_pod_lost_mid_run_is_kept_with_its_log_and_events_though_gone_by_teardown(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "lost", ONE_SLICE + " cluster.ready_timeout_s=30")
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    gke.provision(ctx)
    gke.deploy_raycluster(ctx)
    gke.job_client(ctx)  # the first job: from here a pod the run loses is kept as it goes
    worker = "lost-tpu-v6e-4-0-0"
    said = project.kube.work_dir / "ray" / "lost" / f"{worker}.out"
    said.parent.mkdir(parents=True, exist_ok=True)
    said.write_text("step 41 done\nthe last words of a preempted host\n")
    project.kube.lose_pod("tpupipe", worker, grace_s=1.0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ctx.store.read_text(postmortem.LOST_PODS):
        time.sleep(0.1)
    time.sleep(1.5)  # the pod is gone now, replaced
    gke.teardown(ctx)
    (kept,) = json.loads(ctx.store.read_text(postmortem.LOST_PODS))
    assert kept["name"] == worker and kept["why"].startswith("lost: Terminated: Pod was terminated in response")
    assert "the last words of a preempted host" in ctx.store.read_text(kept["log"])
    assert any(f"pod {worker} lost" in line for line in logs)
    assert project.leftovers("lost") == {}


def test_gke_refuses_a_queued_provisioning_pool_without_the_settings_it_needs_and_takes_the_planned_one():
    from google.cloud import container_v1

    spec = resolve("llama3-8b-v6e-16x2", ONE_V6E_16)
    body = next(p for p in _planned(spec, "q")["node-pool"] if p and "queuedProvisioning" in p)
    assert provisioning.node_pool_refusal(container_v1.NodePool.from_json(json.dumps(body))) is None
    repaired = {**body, "management": {"autoRepair": True, "autoUpgrade": True}}
    assert "auto-repair" in provisioning.node_pool_refusal(container_v1.NodePool.from_json(json.dumps(repaired)))
    fixed = {**body, "initialNodeCount": 4}
    assert "from 0 nodes" in provisioning.node_pool_refusal(container_v1.NodePool.from_json(json.dumps(fixed)))


def test_a_booking_that_expires_before_the_pods_land_ends_the_wait_saying_so():
    machine = readiness.Readiness(unschedulable_grace_s=1.0, request_names=("r",))
    unsched = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "waits"}]
    pods = [{"metadata": {"name": "w0"}, "status": {"conditions": unsched}}]
    raycluster = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0}}
    expired = {
        "status": {
            "conditions": [
                {"type": "Provisioned", "status": "True", "reason": "Provisioned"},
                {"type": "BookingExpired", "status": "True", "reason": "BookingExpired", "message": "expired"},
            ]
        }
    }
    with pytest.raises(
        readiness.RayClusterNotReady,
        match="ProvisioningRequest r was Provisioned, but its booking expired before the worker pods landed on the "
        "nodes.*\\(BookingExpired: BookingExpired: expired\\); run again",
    ):
        machine.step(raycluster, pods, 0.0, [], {"r": expired})


def test_capacity_revoked_mid_run_loses_the_hosts_and_the_post_mortem_says_why(
    tmp_path, project_factory, monkeypatch, capsys
):
    project = project_factory()
    project.kube.ready_without_ray = True
    project.kube.provisioner.provision_s = 0.2
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "revoked", QUEUED + " cluster.ready_timeout_s=30")
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    gke.provision(ctx)
    gke.deploy_raycluster(ctx)
    gke.job_client(ctx)  # the first job: from here a pod the run loses is kept as it goes
    request = queued.request_name("revoked")
    project.kube.provisioner.revoke("tpupipe", request)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ctx.store.read_text(postmortem.LOST_PODS):
        time.sleep(0.1)
    gke.teardown(ctx)
    (kept,) = json.loads(ctx.store.read_text(postmortem.LOST_PODS))  # its one worker, lost as a preempted host's
    assert kept["name"] == "revoked-tpu-v6e-4-0-0" and kept["why"].startswith("lost: Terminated")
    said = json.loads(ctx.store.read_text("logs/provisioning_request.json"))
    assert [c["type"] for c in said["conditions"]] == ["Accepted", "Provisioned", "CapacityRevoked"]
    assert said["story"].startswith(f"the ProvisioningRequest {request} had its capacity revoked: its nodes were taken")
    assert f"teardown: {said['story']}" in capsys.readouterr().out
    assert project.leftovers("revoked") == {}
