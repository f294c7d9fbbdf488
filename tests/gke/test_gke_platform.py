"""The gke platform against the emulated project (GKE ClusterManager over gRPC, Kubernetes API over HTTPS): the
real google-cloud-container and kubernetes clients, no Ray cluster. Faults are injected at the wire."""

from __future__ import annotations

import time

import grpc
import pytest
from kubernetes.client.exceptions import ApiException

from components.platforms import RunContext
from components.platforms import ledger as ledgers
from components.platforms.gke import GkePlatform
from components.platforms.gke.checks.preflight import PreflightFailed
from components.platforms.gke.cloud import cluster as gke_cluster
from components.platforms.gke.cloud import kube as gke_kube
from components.platforms.gke.plan import network
from components.platforms.gke.run import readiness
from components.platforms.store import LocalStore
from components.platforms.waiting import DeadlineExceeded
from components.spec import SpecError
from components.workload import resolve
from tests.emulators import kube as kube_emulator
from tests.emulators.project import ALLOW, ONE_SLICE, PROJECT, PROJECT_NUMBER
from tests.helpers import REPO, wait_until

TWO_SLICES = (
    f"cluster.accelerator=v6e cluster.topology=4x4 cluster.num_hosts=4 cluster.num_slices=2 "
    "cluster.cpus_per_host=4 "
    f"gke.multislice_network=none gke.project={PROJECT} gke.zone=us-east5-b gke.image=local/torch "
    "gke.allow_default_identities=true "
    "train.num_workers=0"
)


def context(tmp_path, run_id: str, overrides: str = ONE_SLICE) -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke"
    )


# The rate-limit policy's seven tries with short waits: its 125 s (components/cloud/errors.py, RATE_LIMIT_RETRY) are
# the real clock's here (tests/gke/test_compute_rate_limits.py runs them on a fake one).
QUICK_RATE_RETRY = gke_cluster.RetryPolicy(attempts=7, initial_s=0.01, max_s=0.05)


def platform() -> GkePlatform:
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    gke.clients.rate_retry = QUICK_RATE_RETRY
    return gke


def test_provision_creates_the_planned_cluster_and_pools_with_the_run_label(tmp_path, project_factory):
    project = project_factory()
    ctx = context(tmp_path, "plan-run")
    result = platform().provision(ctx)
    assert project.clusters("plan-run") == [f"projects/{PROJECT}/locations/us-east5-b/clusters/tpupipe-plan-run"]
    assert sorted(p.rsplit("/", 1)[-1] for p in project.pools("plan-run")) == ["plan-run-cpu", "plan-run-s0"]
    assert result["node_pools"] == ["plan-run-s0"]
    cluster = project.gke.state.clusters[project.clusters("plan-run")[0]]
    pool = cluster.node_pools[1]
    assert pool.config.machine_type == "ct6e-standard-4t" and pool.initial_node_count == 1
    # Shielded nodes, every pool's with secure boot and integrity monitoring.
    assert cluster.shielded_nodes.enabled
    for each in cluster.node_pools:
        shielded = each.config.shielded_instance_config
        assert shielded.enable_secure_boot and shielded.enable_integrity_monitoring, each.name


NODE_ACCOUNT = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"  # the project's default Compute Engine one


def test_nodes_run_as_the_default_compute_account_its_project_number_filled_in(tmp_path, project_factory):
    project = project_factory()
    platform().provision(context(tmp_path, "identity"))
    pools = project.gke.state.clusters[project.clusters("identity")[0]].node_pools
    assert [p.config.service_account for p in pools] == [NODE_ACCOUNT, NODE_ACCOUNT]  # CPU pool, TPU pool
    assert project.projects.calls[:3] == ["TestIamPermissions", "GetProject", "GetIamPolicy"]  # preflight's checks


@pytest.mark.parametrize("role", ["roles/logging.logWriter", "roles/monitoring.metricWriter"])
def test_a_node_account_without_a_needed_role_is_refused_before_anything_is_created(tmp_path, project_factory, role):
    project = project_factory()
    project.projects.revoke(PROJECT, role, f"serviceAccount:{NODE_ACCOUNT}")
    ctx = context(tmp_path, "norole")
    with pytest.raises(
        PreflightFailed,
        match=f"- gke.node_service_account: the nodes' service account {NODE_ACCOUNT} "
        f"lacks {role} on project {PROJECT}",
    ):
        platform().provision(ctx)
    assert project.mutations() == []
    project.projects.grant(PROJECT, "roles/container.defaultNodeServiceAccount", f"serviceAccount:{NODE_ACCOUNT}")
    platform().provision(ctx)  # a role that includes it will do
    platform().teardown(ctx)


def test_image_pulls_need_the_artifact_registry_reader_only_for_this_projects_registry(tmp_path, project_factory):
    project = project_factory()
    project.projects.revoke(PROJECT, "roles/artifactregistry.reader", f"serviceAccount:{NODE_ACCOUNT}")
    built = context(tmp_path, "pulls", BUILD)  # the trainer image goes to this project's Artifact Registry
    with pytest.raises(
        PreflightFailed,
        match=r"lacks roles/artifactregistry.reader on repository .*/repositories/tpupipe \(or project .*pulling the",
    ):
        platform().provision(built)
    assert project.mutations() == []
    named = context(tmp_path, "named")  # gke.image=local/torch: not this project's registry to grant
    platform().provision(named)
    platform().teardown(named)


def test_a_named_node_account_is_checked_and_set_on_every_pool(tmp_path, project_factory):
    project = project_factory()
    account = f"tpu-nodes@{PROJECT}.iam.gserviceaccount.com"
    ctx = context(tmp_path, "ownsa", f"{ONE_SLICE} gke.node_service_account={account}")
    with pytest.raises(PreflightFailed, match=f"service account {account} lacks roles/logging.logWriter"):
        platform().provision(ctx)
    for role in ("roles/logging.logWriter", "roles/monitoring.metricWriter"):
        project.projects.grant(PROJECT, role, f"serviceAccount:{account}")
    platform().provision(ctx)
    pools = project.gke.state.clusters[project.clusters("ownsa")[0]].node_pools
    assert {p.config.service_account for p in pools} == {account}
    platform().teardown(ctx)


def test_a_cluster_the_run_creates_takes_no_node_upgrade_until_the_runs_deadline(tmp_path, project_factory):
    """A node pool upgrade recreates the nodes: the cluster carries a maintenance exclusion of scope
    NO_MINOR_OR_NODE_UPGRADES from provision to the run's deadline (its window added when the cluster is created)."""
    from datetime import UTC, datetime

    from google.cloud import container_v1

    project = project_factory()
    platform().provision(context(tmp_path, "calm", ONE_SLICE + " run.deadline_h=6"))
    cluster = project.gke.state.clusters[project.clusters("calm")[0]]
    window = cluster.maintenance_policy.window.maintenance_exclusions["tpupipe-run"]
    scope = container_v1.MaintenanceExclusionOptions.Scope.NO_MINOR_OR_NODE_UPGRADES
    assert window.maintenance_exclusion_options.scope == scope
    hours = (window.end_time - window.start_time).total_seconds() / 3600
    assert hours == 6 and abs((window.start_time - datetime.now(UTC)).total_seconds()) < 300


def test_provision_twice_reattaches_one_cluster(tmp_path, project_factory):
    project = project_factory()
    ctx = context(tmp_path, "twice")
    platform().provision(ctx)
    platform().provision(ctx)
    assert len(project.gke.state.clusters) == 1
    assert project.gke.state.calls.count("CreateCluster") == 1
    assert project.gke.state.calls.count("CreateNodePool") == 1


def test_already_exists_on_create_is_a_reuse(tmp_path, project_factory):
    project = project_factory()
    ctx = context(tmp_path, "exists")
    platform().provision(ctx)
    # A second run of provision whose get raced a create of the same name: the create says ALREADY_EXISTS.
    project.gke.fail("GetNodePool", grpc.StatusCode.NOT_FOUND, "Not found", times=1)
    platform().provision(ctx)
    assert project.gke.state.calls.count("CreateNodePool") == 2
    assert len(project.pools("exists")) == 2


def test_transient_unavailable_is_retried_and_provision_succeeds(tmp_path, project_factory):
    project = project_factory()
    project.gke.fail("CreateCluster", grpc.StatusCode.UNAVAILABLE, times=2)
    project.gke.fail("CreateNodePool", grpc.StatusCode.DEADLINE_EXCEEDED, times=1)
    platform().provision(context(tmp_path, "flaky"))
    assert project.gke.state.calls.count("CreateCluster") == 3
    assert project.gke.state.calls.count("CreateNodePool") == 2
    assert len(project.clusters("flaky")) == 1


def test_stockout_on_the_second_pool_is_one_clear_error_and_leaves_nothing(tmp_path, project_factory):
    project = project_factory()
    project.gke.stockout(when=lambda request: request.node_pool.name.endswith("-s1"))
    ctx = context(tmp_path, "stockout", TWO_SLICES)
    with pytest.raises(gke_cluster.CapacityError) as caught:
        platform().provision(ctx)
    message = str(caught.value)
    for needle in ("us-east5-b", "v6e", "2 x 16", "ct6e-standard-4t", "ZONE_RESOURCE_POOL_EXHAUSTED"):
        assert needle in message
    assert project.gke.state.calls.count("CreateNodePool") == 2  # the first pool was created
    assert project.clusters("stockout") == [] and project.pools("stockout") == []
    assert project.gke.state.clusters == {}
    assert platform().teardown(ctx)["deleted"] == []  # the exit handler's teardown finds nothing left


def test_quota_exhausted_is_a_capacity_error_and_leaves_nothing(tmp_path, project_factory):
    project = project_factory()
    project.gke.fail(
        "CreateNodePool",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Insufficient quota to satisfy the request: TPU_V6E_PODSLICE_CHIPS",
        times=1,
    )
    with pytest.raises(gke_cluster.CapacityError, match="TPU_V6E_PODSLICE_CHIPS"):
        platform().provision(context(tmp_path, "quota"))
    assert project.gke.state.clusters == {}


def test_a_rate_limited_call_is_asked_again_not_taken_for_a_stockout(tmp_path, project_factory):
    """RESOURCE_EXHAUSTED whose ErrorInfo says RATE_LIMIT_EXCEEDED (too many requests, or operations at once) passes
    with time: retried, where a quota's is a CapacityError at once (the test above)."""
    project = project_factory()
    project.gke.fail(
        "CreateNodePool",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Quota exceeded for quota metric 'Cluster write requests' and limit 'per minute'.",
        times=2,
        reason="RATE_LIMIT_EXCEEDED",
    )
    platform().provision(context(tmp_path, "throttled"))
    assert project.gke.state.calls.count("CreateNodePool") == 3
    assert len(project.pools("throttled")) == 2


def test_bad_input_is_refused_before_anything_is_created(tmp_path, project_factory):
    project = project_factory()
    for overrides, key in (
        (f"{ONE_SLICE} gke.torch_tpu_base=registry/base/torch-tpu:2", "gke.torch_tpu_base"),
        (ONE_SLICE.replace(f"gke.project={PROJECT}", ""), "gke.project"),
        ("gke.image=x", "cluster.accelerator"),
    ):
        with pytest.raises(SpecError, match=key):
            platform().provision(context(tmp_path, "bad", overrides))
        assert platform().teardown(context(tmp_path, "bad", overrides))["deleted"] == []  # the exit handler's
    assert project.gke.state.calls == [] and project.storage.state.calls == [] and project.projects.calls == []


def test_unschedulable_pods_are_a_clear_error_within_the_deadline_and_teardown_leaves_nothing(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory(fault="unschedulable")
    monkeypatch.setenv("TPUPIPE_GKE_UNSCHEDULABLE_GRACE_S", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "nocap", ONE_SLICE + " cluster.ready_timeout_s=60")
    gke = platform()
    gke.provision(ctx)
    with pytest.raises(readiness.RayClusterNotReady, match="Unschedulable: 0/2 nodes are available.*google.com/tpu"):
        gke.deploy_raycluster(ctx)
    assert project.rayclusters("nocap") == ["nocap"]
    gke.teardown(ctx)
    assert project.rayclusters("nocap") == [] and project.clusters("nocap") == [] and project.pools("nocap") == []


FLEX_START = ONE_SLICE.replace("us-east5-b", "us-east5-a") + " cluster.capacity=flex-start"  # a zone offering it


@pytest.mark.parametrize(
    "run_id, overrides", [("flex", FLEX_START), ("auto", ONE_SLICE + " gke.cluster_mode=autopilot")]
)
def test_tpu_nodes_that_come_after_the_pods_are_pending_are_waited_for_and_teardown_leaves_nothing(
    tmp_path, project_factory, monkeypatch, run_id, overrides
):
    """Flex-start pools and Autopilot start with no TPU nodes: the run waits while the autoscaler makes them."""
    project = project_factory(fault="scale_from_zero")
    project.kube.scale_up_s = 1.5  # the nodes come well after the unschedulable grace
    project.kube.ready_without_ray = True
    monkeypatch.setenv("TPUPIPE_GKE_UNSCHEDULABLE_GRACE_S", "0.3")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, run_id, overrides + " cluster.ready_timeout_s=30")
    worker = f"{run_id}-tpu-v6e-4-0-0"
    logs = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    gke.provision(ctx)
    started = time.monotonic()
    assert gke.deploy_raycluster(ctx)["available_workers"] == 1
    assert time.monotonic() - started >= 1.5  # it waited past the grace: the pods were scaling up, not failing
    with project.kube.lock:
        reasons = {
            (e["involvedObject"]["name"], e["reason"]) for (p, _, _), e in project.kube.objects.items() if p == "events"
        }
    assert {(worker, "FailedScheduling"), (worker, "TriggeredScaleUp")} <= reasons
    assert any(m == "GET" and p == "/api/v1/namespaces/tpupipe/events" for m, p, _ in project.kube.requests)
    kube, _, _ = gke.clients.kube(ctx)  # the events as the API server selects them, through the real client
    listed = kube.core.list_namespaced_event(
        "tpupipe", field_selector=f"involvedObject.name={worker},involvedObject.kind=Pod"
    )
    assert {e.reason for e in listed.items} == {"FailedScheduling", "TriggeredScaleUp"}
    assert [
        e.source.component
        for e in kube.core.list_namespaced_event("tpupipe", field_selector="reason=TriggeredScaleUp").items
    ] == ["cluster-autoscaler"]
    with pytest.raises(ApiException) as refused:
        kube.core.list_namespaced_event("tpupipe", field_selector="spec.nodeName=n1")
    assert refused.value.status == 400
    assert any("waiting up to 30s (cluster.ready_timeout_s)" in line for line in logs)
    gke.teardown(ctx)
    assert project.leftovers(run_id) == {}


@pytest.mark.parametrize(
    "failure, grace, match",
    [
        (
            kube_emulator.OUT_OF_RESOURCES,
            "600",
            "scale-up failed: FailedScaleUp: Node scale up in zones us-east5-b "
            "associated with this pod failed: GCE out of resources",
        ),
        (
            kube_emulator.NOT_TRIGGERED,
            "0.3",
            "with no scale-up under way; pod noscale-tpu-v6e-4-0-0: NotTriggerScaleUp: "
            "pod didn't trigger scale-up: 1 max node group size reached",
        ),
    ],
)
def test_a_pool_that_never_scales_up_fails_with_the_autoscalers_reason_and_teardown_leaves_nothing(
    tmp_path, project_factory, monkeypatch, failure, grace, match
):
    project = project_factory(fault="never_scales_up")
    project.kube.scale_up_s = 0.5
    project.kube.scale_up_failure = failure
    monkeypatch.setenv("TPUPIPE_GKE_UNSCHEDULABLE_GRACE_S", grace)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    # A fixed pool: the autoscaler's FailedScaleUp is final at once (flex-start's retries: test_readiness_limits.py).
    ctx = context(tmp_path, "noscale", ONE_SLICE + " cluster.ready_timeout_s=30")
    gke = platform()
    gke.provision(ctx)
    started = time.monotonic()
    with pytest.raises(readiness.RayClusterNotReady, match=match):
        gke.deploy_raycluster(ctx)
    assert time.monotonic() - started < 30  # the autoscaler's word, not the deadline
    gke.teardown(ctx)
    assert project.leftovers("noscale") == {}


def test_image_pull_failure_is_a_clear_error(tmp_path, project_factory, monkeypatch):
    project_factory(fault="image_pull")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "noimage")
    gke = platform()
    gke.provision(ctx)
    with pytest.raises(readiness.RayClusterNotReady, match="cannot pull its image local/torch: ErrImagePull"):
        gke.deploy_raycluster(ctx)
    gke.teardown(ctx)


def test_missing_hugging_face_secret_and_token_is_a_clear_error(tmp_path, project_factory, monkeypatch):
    project_factory()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    ctx = context(tmp_path, "nohf")
    gke = platform()
    gke.provision(ctx)
    with pytest.raises(SpecError, match="gke.hf_secret.*HF_TOKEN"):
        gke.deploy_raycluster(ctx)
    gke.teardown(ctx)


def provisioned_kube(tmp_path, run_id: str):
    """A provisioned run's platform, context, and Kubernetes client with the namespace made."""
    ctx = context(tmp_path, run_id)
    gke = platform()
    gke.provision(ctx)
    kube, _, _ = gke.clients.kube(ctx)
    kube.ensure_namespace()
    return gke, ctx, kube


def test_the_api_server_rejects_a_raycluster_the_crd_rejects(tmp_path, project_factory, monkeypatch):
    from kubernetes.client.exceptions import ApiException

    project_factory()
    gke, ctx, kube = provisioned_kube(tmp_path, "invalid")
    bad = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "invalid", "namespace": "tpupipe"},
        "spec": {"headGroupSpec": {"template": {"spec": {"containers": []}}, "rayStartParams": {}}, "notAField": 1},
    }
    with pytest.raises(ApiException) as caught:
        kube.apply(bad)
    assert caught.value.status == 422 and "notAField" in caught.value.body
    gke.teardown(ctx)


def test_token_auth_is_refused_on_a_kuberay_that_would_drop_it_before_anything_is_applied(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "oldray")
    gke = platform()
    gke.provision(ctx)  # provision checks it too, before any TPU node pool (test_preflight.py); then it changed:
    project.kube.kuberay_version = "1.5.0"  # the Ray Operator add-on of an older GKE: no authOptions at all
    with pytest.raises(
        SpecError,
        match="^gke.cluster_version: cluster tpupipe-oldray runs a KubeRay older than 1.5.1: "
        "its RayCluster has no spec.authOptions, spec.authOptions.secretName, which the API server would "
        "drop, leaving the Ray cluster without token authentication",
    ):
        gke.deploy_raycluster(ctx)
    assert ("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayclusters.ray.io") in [
        (method, path) for method, path, _ in project.kube.requests
    ]
    assert project.leftovers("oldray").get("kubernetes") is None  # nothing applied: no secret, no RayCluster
    gke.teardown(ctx)
    assert project.leftovers("oldray") == {}


def test_an_old_kuberay_drops_the_token_secret_silently_which_is_why_it_is_refused(tmp_path, project_factory):
    """The emulated API server prunes a field its CRD lacks, as a real one does: what the check guards against."""
    project = project_factory()
    gke, ctx, kube = provisioned_kube(tmp_path, "prune")
    body = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "prune", "namespace": "tpupipe"},
        "spec": {
            "authOptions": {"mode": "token", "secretName": "prune-ray-token"},
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": "local/torch",
                                "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}},
                            }
                        ]
                    }
                },
            },
        },
    }
    project.kube.kuberay_version = "1.5.1"
    assert "secretName" not in kube.apply(body)["spec"]["authOptions"]
    assert gke_kube.missing_fields(kube.crd("rayclusters.ray.io")) == {"spec.authOptions.secretName": "1.6.0"}
    project.kube.kuberay_version = "1.7.0"
    assert kube.apply(body)["spec"]["authOptions"]["secretName"] == "prune-ray-token"
    assert gke_kube.missing_fields(kube.crd("rayclusters.ray.io")) == {}
    assert kube.crd("rayjobs.ray.io") is None
    gke.teardown(ctx)


def test_the_api_server_needs_the_google_token(tmp_path, project_factory):
    import requests

    project = project_factory()
    ca = tmp_path / "ca.crt"
    ca.write_bytes(project.kube.ca_pem)
    r = requests.get(f"https://{project.kube.endpoint}/api/v1/namespaces", verify=str(ca), timeout=10)
    assert r.status_code == 401


def test_teardown_keeps_a_cluster_the_spec_names(tmp_path, project_factory):
    project = project_factory()
    owner = context(tmp_path, "owner")
    platform().provision(owner)
    shared = ONE_SLICE + " gke.cluster_name=tpupipe-owner"
    guest = context(tmp_path, "guest", shared)
    platform().provision(guest)
    assert len(project.pools("guest")) == 2  # its Ray head's CPU pool and its slice, as the plan lists
    result = platform().teardown(guest)
    assert project.pools("guest") == [] and project.clusters("owner") != []
    assert result["kept_cluster"].endswith("/clusters/tpupipe-owner")
    platform().teardown(owner)
    assert project.gke.state.clusters == {}


def test_teardown_of_a_run_that_created_nothing_succeeds(tmp_path, project_factory):
    project_factory()
    assert platform().teardown(context(tmp_path, "nothing"))["deleted"] == []


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _pod(name, **status):
    return {"metadata": {"name": name}, "spec": {"containers": [{"image": "img"}]}, "status": status}


def test_readiness_state_machine_steps():
    machine = readiness.Readiness(unschedulable_grace_s=30)
    cluster = {"status": {"desiredWorkerReplicas": 2, "availableWorkerReplicas": 1, "state": ""}}
    assert machine.step(cluster, [_pod("w0")], now=0) is None
    unsched = _pod(
        "w1",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes: Insufficient google.com/tpu",
            }
        ],
    )
    assert machine.step(cluster, [unsched], now=10) is None
    assert machine.step(cluster, [unsched], now=39) is None
    with pytest.raises(readiness.RayClusterNotReady, match="Insufficient google.com/tpu"):
        machine.step(cluster, [unsched], now=40)
    machine = readiness.Readiness(unschedulable_grace_s=30)
    assert machine.step(cluster, [unsched], now=0) is None
    assert machine.step(cluster, [_pod("w1")], now=20) is None  # scheduled after all: the grace starts again
    assert machine.unschedulable_since is None
    ready = {"status": {"desiredWorkerReplicas": 2, "availableWorkerReplicas": 2, "state": "ready"}}
    assert machine.step(ready, [], now=21) is True
    pull = _pod("w0", containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "x"}}}])
    with pytest.raises(readiness.RayClusterNotReady, match="ImagePullBackOff"):
        readiness.Readiness().step(cluster, [pull], now=0)
    with pytest.raises(readiness.RayClusterNotReady, match="gone"):
        readiness.Readiness().step(None, [], now=0)


def _event(pod, reason, message, at):
    """A core/v1 Event about ``pod`` as the API server serves it (the autoscaler's records carry seconds)."""
    return {
        "metadata": {"name": f"{pod}.{at}"},
        "involvedObject": {"kind": "Pod", "name": pod},
        "reason": reason,
        "message": message,
        "type": "Normal",
        "lastTimestamp": f"2026-11-30T10:00:{at:02d}Z",
    }


UNSCHED = {
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient google.com/tpu",
        }
    ]
}
TRIGGERED = "pod triggered scale-up: [{.../instanceGroups/gke-tpu-grp 0->1 (max: 1)}]"


def test_readiness_waits_for_a_triggered_scale_up_past_the_grace_then_is_ready():
    machine = readiness.Readiness(unschedulable_grace_s=30)
    cluster = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0, "state": ""}}
    pods = [_pod("w0", **UNSCHED)]
    assert machine.step(cluster, pods, now=0) is None  # no event yet: the grace starts
    assert machine.unschedulable_since == 0
    scaling = [_event("w0", "FailedScheduling", "0/1 nodes", 0), _event("w0", "TriggeredScaleUp", TRIGGERED, 1)]
    assert machine.step(cluster, pods, now=5, events=scaling) is None  # waiting for nodes: not counted
    assert machine.unschedulable_since is None and "1 waiting for new nodes (TriggeredScaleUp)" in machine.last
    assert machine.step(cluster, pods, now=600, events=scaling) is None  # far past the grace: still waiting
    other = [_event("w1", "TriggeredScaleUp", TRIGGERED, 1)]  # another pod's scale-up says nothing of w0
    assert machine.step(cluster, pods, now=601, events=other) is None and machine.unschedulable_since == 601
    assert machine.capacity_wait == (0, None)  # waiting for a node since the first observation
    assert machine.step(cluster, [_pod("w0")], now=620, events=scaling) is None  # the nodes came: scheduled
    assert machine.capacity_wait == (0, 620)
    ready = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 1, "state": "ready"}}
    assert machine.step(ready, [_pod("w0")], now=640) is True and machine.capacity_wait == (0, 620)


def test_readiness_fails_at_once_with_a_failed_scale_up_and_its_reason():
    machine = readiness.Readiness(unschedulable_grace_s=30)
    cluster = {"status": {"desiredWorkerReplicas": 2, "availableWorkerReplicas": 0, "state": ""}}
    pods = [_pod("w0", **UNSCHED), _pod("w1", **UNSCHED)]
    events = [_event("w0", "TriggeredScaleUp", TRIGGERED, 1), _event("w1", "TriggeredScaleUp", TRIGGERED, 1)]
    assert machine.step(cluster, pods, now=0, events=events) is None
    failed = "Node scale up in zones us-east5-b associated with this pod failed: GCE out of resources."
    events.append(_event("w1", "FailedScaleUp", failed, 40))  # the latest about w1
    with pytest.raises(
        readiness.RayClusterNotReady,
        match="pod w1 .*scale-up failed: FailedScaleUp: Node scale up in zones us-east5-b .*GCE out of resources",
    ):
        machine.step(cluster, pods, now=41, events=events)
    # Triggered again after the failure (the autoscaler retries): the latest event decides.
    retried = [_event("w0", "FailedScaleUp", failed, 40), _event("w0", "TriggeredScaleUp", TRIGGERED, 50)]
    assert readiness.Readiness().step(cluster, pods[:1], now=51, events=retried) is None
    same_second = [_event("w0", "TriggeredScaleUp", TRIGGERED, 40), _event("w0", "FailedScaleUp", failed, 40)]
    with pytest.raises(readiness.RayClusterNotReady, match="FailedScaleUp"):
        readiness.Readiness().step(cluster, pods[:1], now=41, events=same_second[::-1])


def test_readiness_fails_a_scale_up_not_triggered_after_the_grace_with_its_reason():
    machine = readiness.Readiness(unschedulable_grace_s=30)
    cluster = {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0, "state": ""}}
    pods = [_pod("w0", **UNSCHED)]
    events = [_event("w0", "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached", 0)]
    assert machine.step(cluster, pods, now=0, events=events) is None
    assert machine.step(cluster, pods, now=29, events=events) is None and "1 unschedulable" in machine.last
    with pytest.raises(
        readiness.RayClusterNotReady,
        match="for 30s with no scale-up under way; pod w0: NotTriggerScaleUp: pod didn't trigger scale-up: 1 max node",
    ):
        machine.step(cluster, pods, now=30, events=events)


def test_wait_ready_has_a_deadline_with_the_last_status():
    class NeverReady:
        def get(self, kind, name):
            return {"status": {"desiredWorkerReplicas": 1, "availableWorkerReplicas": 0, "state": ""}}

        def pods(self, selector):
            return []

    clock = FakeClock()

    def sleep(seconds):
        clock.now += seconds

    with pytest.raises(DeadlineExceeded, match="0/1 workers available"):
        readiness.wait_ready(
            NeverReady(), "rc", 30, unschedulable_grace_s=10, clock=clock, sleep=sleep, log=lambda m: None
        )
    assert clock.now >= 30


# ---------------------------------------------------------------- Compute Engine: DCN networks, TPU7x workload policy

DCN_SLICES = TWO_SLICES.replace("gke.multislice_network=none", "gke.multislice_network=dcn_networks")
TPU7X_SLICE = (
    f"cluster.accelerator=tpu7x cluster.topology=2x2x2 cluster.num_hosts=2 cluster.cpus_per_host=8 "
    f"gke.project={PROJECT} gke.zone=us-central1-c gke.image=local/torch train.num_workers=0"
    " gke.allow_default_identities=true"
)  # us-central1-c: where Cloud TPU offers TPU7x (the Compute emulator's machine types per zone)


def test_dcn_networks_come_before_the_pools_that_use_them_and_go_after_them(tmp_path, project_factory):
    project = project_factory()
    ctx = context(tmp_path, "dcn", DCN_SLICES)
    platform().provision(ctx)
    assert project.compute.names("networks") == ["dcn-dcn0", "dcn-dcn1"]
    # each new network denies all ingress: a rule per network lets the other slices' NICs in
    assert project.compute.names("firewalls") == ["dcn-dcn0-allow-internal", "dcn-dcn1-allow-internal"]
    rules = {r["name"]: r for r in project.compute.state.firewalls.values()}
    rule = rules["dcn-dcn1-allow-internal"]
    assert rule["network"].endswith(f"projects/{PROJECT}/global/networks/dcn-dcn1")
    assert rule["direction"] == "INGRESS" and rule["sourceRanges"] == ["10.60.0.0/16"]
    assert [a["IPProtocol"] for a in rule["allowed"]] == ["tcp", "udp", "icmp"]
    calls = project.compute.state.calls
    assert calls.index("firewalls.insert") > calls.index("subnetworks.insert")
    assert [n["mtu"] for n in project.compute.state.networks.values()] == [8896, 8896]
    subnets = {n: s["ipCidrRange"] for n, s in project.compute.state.subnetworks.items()}
    assert subnets == {
        f"projects/{PROJECT}/regions/us-east5/subnetworks/dcn-dcn0-subnet": "10.50.0.0/16",
        f"projects/{PROJECT}/regions/us-east5/subnetworks/dcn-dcn1-subnet": "10.60.0.0/16",
        # the private nodes' own subnetwork, in the default network (plan.network)
        f"projects/{PROJECT}/regions/us-east5/subnetworks/dcn-nodes": network.node_range("dcn"),
    }
    cluster = project.gke.state.clusters[project.clusters("dcn")[0]]
    tpu_pools = [p for p in cluster.node_pools if p.name.startswith("dcn-s")]
    assert len(tpu_pools) == 2
    for pool in tpu_pools:  # the GKE emulator refuses a pool whose networks do not exist
        assert [x.network for x in pool.network_config.additional_node_network_configs] == ["dcn-dcn0", "dcn-dcn1"]
    platform().provision(ctx)  # again: everything reused
    assert project.compute.state.calls.count("networks.insert") == 2
    result = platform().teardown(ctx)
    assert project.gke.state.clusters == {}
    assert project.compute.names("networks") == [] and project.compute.names("subnetworks") == []
    assert project.compute.names("firewalls") == [] and project.leftovers("dcn") == {}
    assert f"projects/{PROJECT}/global/networks/dcn-dcn1" in result["deleted"]
    assert result["deleted"].index(f"projects/{PROJECT}/global/firewalls/dcn-dcn1-allow-internal") < result[
        "deleted"
    ].index(f"projects/{PROJECT}/global/networks/dcn-dcn1")  # the rule holds its network
    assert platform().teardown(ctx)["deleted"] == []


def test_the_70b_preset_provisions_its_firewall_rules_and_teardown_deletes_them(tmp_path, project_factory):
    """Seed A's 70B run as its preset plans it (two v6e 4x4 slices over DCN networks, GKE pinned): each network's
    allow-internal rule is created, and teardown leaves nothing of the run."""
    project = project_factory()
    spec = resolve("llama3-70b-v6e-16x2", f"gke.project={PROJECT} gke.image=local/maxtext{ALLOW}")
    ctx = RunContext(spec=spec, run_id="seventy", store=LocalStore(tmp_path / "seventy"), platform="gke")
    platform().provision(ctx)
    assert project.compute.names("firewalls") == ["seventy-dcn0-allow-internal", "seventy-dcn1-allow-internal"]
    assert {r["sourceRanges"][0] for r in project.compute.state.firewalls.values()} == {"10.50.0.0/16", "10.60.0.0/16"}
    cluster = project.gke.state.clusters[project.clusters("seventy")[0]]
    assert cluster.current_master_version == "1.35.2-gke.1842000"  # pinned by the preset
    assert cluster.network_config.enable_multi_networking
    platform().teardown(ctx)
    assert project.compute.names("firewalls") == [] and project.leftovers("seventy") == {}


def test_the_cluster_runs_the_pinned_version_and_its_pools_run_it_too(tmp_path, project_factory):
    project = project_factory()
    platform().provision(context(tmp_path, "pinned", ONE_SLICE + " gke.cluster_version=1.36"))
    cluster = project.gke.state.clusters[project.clusters("pinned")[0]]
    assert cluster.current_master_version == "1.36.1-gke.1012000"  # GKE's newest 1.36
    assert {p.version for p in cluster.node_pools} == {"1.36.1-gke.1012000"}


def test_a_cluster_gke_made_older_than_the_slices_floor_is_refused_before_any_node_pool(tmp_path, project_factory):
    project = project_factory()
    project.gke.default_version = "1.33.5-gke.1080000"  # no version pinned: GKE's default, older than DRANET's
    ctx = context(tmp_path, "oldgke", DCN_SLICES)
    with pytest.raises(
        SpecError,
        match="^gke.cluster_version: cluster tpupipe-oldgke runs GKE 1.33.5-gke.1080000, "
        "older than 1.34.1-gke.1829001, the first standard version with managed "
        "DRANET",
    ):
        platform().provision(ctx)
    assert project.gke.state.calls.count("CreateNodePool") == 0
    platform().teardown(ctx)  # the exit handler's
    assert project.leftovers("oldgke") == {}


def test_an_existing_cluster_older_than_the_slices_floor_is_refused_naming_it(tmp_path, project_factory):
    project = project_factory()
    project.gke.default_version = "1.33.5-gke.1080000"
    owner = context(tmp_path, "owner")
    platform().provision(owner)  # one v6e slice: 1.33 reaches v6e's floor
    guest = context(tmp_path, "guest", DCN_SLICES + " gke.cluster_name=tpupipe-owner")
    with pytest.raises(
        SpecError,
        match="^gke.cluster_name: cluster tpupipe-owner runs GKE 1.33.5-gke.1080000, older than 1.34.1-gke.1829001",
    ):
        platform().provision(guest)
    assert project.pools("guest") == []
    platform().teardown(guest)
    assert set(project.leftovers("guest")) == {"clusters"}  # the owner's only: its DCN networks are gone
    platform().teardown(owner)


def test_pod_ranges_gke_picked_over_a_dcn_subnet_are_refused_before_any_node_pool(tmp_path, project_factory):
    project = project_factory()
    project.gke.default_pod_range = "10.48.0.0/14"  # 10.48-10.51: over the first DCN subnet, 10.50.0.0/16
    ctx = context(tmp_path, "overlap", DCN_SLICES)
    with pytest.raises(
        SpecError,
        match="^gke.pod_range: cluster tpupipe-overlap's Pod range 10.48.0.0/14 overlaps the DCN subnet 10.50.0.0/16",
    ):
        platform().provision(ctx)
    assert project.gke.state.calls.count("CreateNodePool") == 0
    platform().teardown(ctx)
    assert project.leftovers("overlap") == {}
    ok = context(tmp_path, "pinnedrange", DCN_SLICES + " gke.pod_range=10.8.0.0/14")  # pinned clear of them
    platform().provision(ok)
    assert project.gke.state.clusters[project.clusters("pinnedrange")[0]].cluster_ipv4_cidr == "10.8.0.0/14"
    platform().teardown(ok)


def test_a_tpu7x_slice_is_placed_by_a_workload_policy_the_run_creates_and_deletes(tmp_path, project_factory):
    project = project_factory()
    ctx = context(tmp_path, "ironwood", TPU7X_SLICE)
    platform().provision(ctx)
    path = f"projects/{PROJECT}/regions/us-central1/resourcePolicies/ironwood-placement"
    assert project.compute.names("resourcePolicies") == ["ironwood-placement"]
    policy = project.compute.state.resource_policies[path]["workloadPolicy"]
    assert policy == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    pool = project.gke.state.clusters[project.clusters("ironwood")[0]].node_pools[1]
    assert pool.placement_policy.policy_name == "ironwood-placement"
    assert pool.config.machine_type == "tpu7x-standard-4t" and pool.initial_node_count == 2
    platform().teardown(ctx)
    assert project.compute.names("resourcePolicies") == [] and project.gke.state.clusters == {}


def test_a_subnet_quota_error_is_a_capacity_error_and_leaves_nothing(tmp_path, project_factory):
    project = project_factory()
    project.compute.quota("subnetworks.insert", when=lambda body: body["name"].endswith("dcn1-subnet"))
    ctx = context(tmp_path, "subquota", DCN_SLICES)
    with pytest.raises(gke_cluster.CapacityError) as caught:
        platform().provision(ctx)
    for needle in (
        "no quota for the subnetwork subquota-dcn1-subnet in us-east5",
        PROJECT,
        "QUOTA_EXCEEDED",
        "SUBNETWORKS",
        "accelerator_network_profile",
    ):
        assert needle in str(caught.value)
    assert project.compute.names("networks") == [] and project.compute.names("subnetworks") == []
    assert project.gke.state.calls.count("CreateCluster") == 0
    assert platform().teardown(ctx)["deleted"] == []


def test_transient_compute_errors_are_retried(tmp_path, project_factory):
    project = project_factory()
    project.compute.fail("networks.insert", 503, times=2)
    project.compute.fail("subnetworks.delete", 503, times=1)
    ctx = context(tmp_path, "flakynet", DCN_SLICES)
    platform().provision(ctx)
    assert len(project.compute.names("networks")) == 2
    platform().teardown(ctx)
    assert project.compute.names("networks") == [] and project.compute.names("subnetworks") == []


def test_rate_limits_and_server_errors_of_compute_are_retried(tmp_path, project_factory):
    """Compute Engine speaks REST: its rate limit is HTTP 403 with the reason rateLimitExceeded
    (https://cloud.google.com/compute/api-quota), not a refused permission, and a server or gateway error 500 or 502;
    each passes with time, so each is asked again."""
    project = project_factory()
    project.compute.rate_limit("networks.insert")
    project.compute.rate_limit("globalOperations.get")
    project.compute.fail("subnetworks.insert", 500)
    project.compute.fail("networks.delete", 502)
    ctx = context(tmp_path, "throttled", DCN_SLICES)
    platform().provision(ctx)
    assert len(project.compute.names("networks")) == 2
    assert project.compute.state.calls.count("networks.insert") == 3  # one refused, then the two networks
    platform().teardown(ctx)
    assert project.compute.names("networks") == [] and project.compute.names("subnetworks") == []


def test_a_compute_insert_whose_answer_was_lost_is_waited_on_before_what_depends_on_it(tmp_path, project_factory):
    """The first network's insert takes effect and its answer is lost (a 504): the retry carries the same request id,
    so Compute answers the operation the first try started (no 409 while the network is still being created), and
    provision waits on it before it inserts the subnetwork that names the network (which Compute refuses while the
    network is not there). A delete's lost answer likewise: its retry waits on the delete it started."""
    project = project_factory()
    project.compute.polls_to_done = 3  # the network still being created when the retry comes
    project.compute.lose("networks.insert")
    project.compute.lose("subnetworks.delete")
    ctx = context(tmp_path, "lostnet", DCN_SLICES)
    platform().provision(ctx)
    made = {kind: project.compute.names(kind) for kind in ("networks", "subnetworks", "firewalls", "routers")}
    assert len(made["networks"]) == 2 and {"lostnet-dcn0-subnet", "lostnet-dcn1-subnet"} <= set(made["subnetworks"])
    assert project.compute.state.calls.count("networks.insert") == 3  # the lost one, its retry, the second network
    inserts = [e for e in project.compute.state.operations.values() if e.op["operationType"] == "insert"]
    assert len(inserts) == sum(map(len, made.values()))  # one operation a resource: the retry started none
    platform().teardown(ctx)
    assert project.compute.names("networks") == [] and project.compute.names("subnetworks") == []


def test_sigterm_while_provision_waits_cancels_the_operation_and_teardown_leaves_nothing(tmp_path, project_factory):
    import os
    import signal
    import threading

    project = project_factory(polls_to_done=10_000)  # the cluster's create operation never finishes by itself
    project.compute.polls_to_done = 1  # the run's subnetwork and NAT gateway are made at once: the wait is GKE's
    ctx = context(tmp_path, "cancelled")
    before = signal.getsignal(signal.SIGTERM)

    def waiting() -> bool:
        return "CreateCluster" in project.gke.state.calls and signal.getsignal(signal.SIGTERM) is not before

    def terminate_once_waiting() -> None:
        """SIGTERM once provision waits on the cluster's operation with its handler in place (a timer could fire
        before, on a loaded machine, and the default handler would end this process); at the latest after 120 s."""
        try:
            wait_until(waiting, 120, "provision to wait on the cluster's operation", interval_s=0.05)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_once_waiting, daemon=True).start()
    with pytest.raises(SystemExit) as caught:
        platform().provision(ctx)
    assert caught.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is gone with the wait
    assert "CancelOperation" in project.gke.state.calls
    aborted = [e.op for e in project.gke.state.operations.values() if e.op.status.name == "ABORTING"]
    assert [op.operation_type.name for op in aborted] == ["CREATE_CLUSTER"]
    project.gke.polls_to_done = 1
    for entry in project.gke.state.operations.values():
        entry.polls_left = 1
    platform().teardown(ctx)  # the exit handler's teardown: the cluster the run recorded is deleted
    assert project.clusters("cancelled") == [] and project.gke.state.clusters == {}


# ---------------------------------------------------------------- the checkpoint bucket and the run's access to it


def _principal(project, run_id: str) -> str:
    """The run's Kubernetes ServiceAccount by the UID the emulated cluster gave it (``plan.target.member``)."""
    with project.kube.lock:
        uid = project.kube.objects[("serviceaccounts", "tpupipe", f"tpupipe-{run_id}")]["metadata"]["uid"]
    return (
        f"principal://iam.googleapis.com/projects/{PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
        f"{PROJECT}.svc.id.goog/kubernetes.serviceaccount.uid/{uid}"
    )


NO_HF = ONE_SLICE + " gke.hf_secret= cluster.ready_timeout_s=30"  # a model that needs no Hugging Face token


def _deploy(project, ctx) -> None:
    project.kube.ready_without_ray = True
    assert platform().deploy_raycluster(ctx)["available_workers"] == 1


def test_provision_creates_the_bucket_deploy_grants_the_runs_service_account_teardown_revokes_and_keeps_the_bucket(
    tmp_path, project_factory
):
    project = project_factory()
    ctx = context(tmp_path, "bucketrun", NO_HF)
    bucket = f"{PROJECT}-tpupipe"
    platform().provision(ctx)
    resource = project.storage.state.buckets[bucket]
    assert resource["location"] == "US-EAST5" and resource["iamConfiguration"]["uniformBucketLevelAccess"]["enabled"]
    assert project.storage.members(bucket, "roles/storage.objectUser") == []  # no ServiceAccount yet to name
    _deploy(project, ctx)
    assert project.storage.members(bucket, "roles/storage.objectUser") == [_principal(project, "bucketrun")]
    platform().provision(ctx)  # again: the bucket reused
    _deploy(project, ctx)  # again: the grant already there
    assert project.storage.state.calls.count("buckets.insert") == 1
    # the run's two bindings (its own prefix, the cache read-only), each once: the second deploy added nothing
    assert project.storage.state.calls.count("buckets.setIamPolicy") == 2
    other = context(tmp_path, "otherrun", NO_HF)
    platform().provision(other)
    _deploy(project, other)
    mine, theirs = _principal(project, "bucketrun"), _principal(project, "otherrun")
    assert project.storage.members(bucket, "roles/storage.objectUser") == sorted([mine, theirs])
    result = platform().teardown(ctx)
    assert f"roles/storage.objectUser on gs://{bucket} for {mine}" in result["deleted"]
    assert project.storage.members(bucket, "roles/storage.objectUser") == [theirs]
    platform().teardown(other)
    assert project.storage.members(bucket, "roles/storage.objectUser") == []
    assert bucket in project.storage.state.buckets  # kept: it holds every run's checkpoints


def test_an_existing_bucket_without_uniform_access_is_refused_by_preflight_and_provision(
    tmp_path, project_factory, capsys
):
    """The run's grant on the bucket is conditioned on its prefix, which Cloud Storage refuses on a bucket without
    uniform bucket-level access: refused before anything is created, naming gke.bucket."""
    from components.cloud.storage import storage_client
    from tests.gke.test_preflight import preflight_cli

    project = project_factory()
    storage_client(PROJECT).create_bucket(f"{PROJECT}-tpupipe", location="us-east5")  # fine-grained ACLs
    code, text = preflight_cli(ONE_SLICE, capsys)
    assert code == 2 and f"gke.bucket: the bucket {PROJECT}-tpupipe has no uniform bucket-level access" in text
    with pytest.raises(PreflightFailed, match="uniform bucket-level access"):
        platform().provision(context(tmp_path, "ubla"))
    assert project.clusters("ubla") == [] and project.mutations() == ["buckets.insert"]


def _maxtext(tmp_path, run_id: str) -> RunContext:
    spec = resolve("local-maxtext", ONE_SLICE.replace("gke.image=local/torch", "gke.image=local/maxtext"))
    return RunContext(spec=spec, run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke")


def test_a_maxtext_run_creates_its_bucket_with_hierarchical_namespace(tmp_path, project_factory):
    """MaxText commits a checkpoint by renaming its step's directory on the bucket's FUSE mount, atomic only in a bucket
    with hierarchical namespace: a bucket the run creates has it; an FSDP run's does not need it."""
    project = project_factory()
    platform().provision(_maxtext(tmp_path, "hnsrun"))
    resource = project.storage.state.buckets[f"{PROJECT}-tpupipe"]
    assert resource["hierarchicalNamespace"] == {"enabled": True}
    assert resource["iamConfiguration"]["uniformBucketLevelAccess"]["enabled"]
    platform().provision(context(tmp_path, "fsdprun"))  # an FSDP run uses it as it is
    assert project.storage.state.calls.count("buckets.insert") == 1


def test_an_existing_flat_bucket_is_refused_for_maxtext_by_preflight_and_provision_naming_the_field(
    tmp_path, project_factory, capsys
):
    """A bucket without hierarchical namespace (which a bucket gets only when created) is refused for a MaxText run
    before anything is created, naming gke.bucket, the bucket's field and the fix; an FSDP run may use it."""
    from components.cloud.storage import storage_client
    from tests.gke.test_preflight import preflight_cli

    project = project_factory()
    flat = storage_client(PROJECT).bucket(f"{PROJECT}-tpupipe")
    flat.iam_configuration.uniform_bucket_level_access_enabled = True
    storage_client(PROJECT).create_bucket(flat, location="us-east5")
    overrides = ONE_SLICE.replace("gke.image=local/torch", "gke.image=local/maxtext")
    from pipelines.cli import main as cli

    code = cli.main(["preflight", "local-maxtext", "--set", overrides, "--run-id", "flat"])
    text = capsys.readouterr()
    text = text.out + text.err
    assert code == 2 and f"gke.bucket: the bucket {PROJECT}-tpupipe has no hierarchical namespace" in text
    assert "hierarchicalNamespace.enabled" in text and "a new name (the run creates it" in text
    with pytest.raises(PreflightFailed, match="hierarchical namespace"):
        platform().provision(_maxtext(tmp_path, "flat"))
    assert project.clusters("flat") == [] and project.mutations() == ["buckets.insert"]
    code, text = preflight_cli(ONE_SLICE, capsys)  # the FSDP trainer renames files only: the flat bucket serves it
    assert "hierarchical namespace" not in text and "uniform bucket-level access" in text


def test_a_bucket_this_identity_cannot_read_is_refused_before_the_cluster(tmp_path, project_factory):
    project = project_factory()
    project.storage.fail("buckets.get", 403, message="tpupipe@x.iam does not have storage.buckets.get access")
    with pytest.raises(PreflightFailed, match="gke.bucket.*cannot read it"):  # preflight reads it first
        platform().provision(context(tmp_path, "foreign"))
    assert project.gke.state.calls.count("CreateCluster") == 0


def test_a_concurrent_policy_change_is_read_again_not_overwritten(tmp_path, project_factory):
    project = project_factory()
    project.storage.fail("buckets.setIamPolicy", 412, times=1)
    ctx = context(tmp_path, "racing", NO_HF)
    platform().provision(ctx)
    _deploy(project, ctx)
    # the refused write asked again after reading the policy again, then the second binding (the cache, read-only)
    assert project.storage.state.calls.count("buckets.setIamPolicy") == 3
    assert project.storage.members(f"{PROJECT}-tpupipe", "roles/storage.objectUser") == [_principal(project, "racing")]


# ---------------------------------------------------------------- the trainer image, built by Cloud Build

TORCH_TPU_BASE = "us-docker.pkg.dev/tpupipe-emulated/base/torch-tpu:2.14"
BUILD = ONE_SLICE.replace("gke.image=local/torch", f"gke.torch_tpu_base={TORCH_TPU_BASE}")


def test_build_image_uploads_the_context_builds_with_cloud_build_and_reuses_the_build(tmp_path, project_factory):
    import io
    import tarfile

    project = project_factory()
    ctx = context(tmp_path, "built", BUILD)
    gke = platform()
    # build_image first: it needs nothing of provision (the pipeline runs the two side by side); it gets or creates
    # the bucket for its build context itself, and writes nothing to the ledger provision writes meanwhile.
    result = gke.build_image(ctx)
    assert project.storage.state.buckets.get(f"{PROJECT}-tpupipe") is not None
    assert ledgers.load(ctx.store) is None
    gke.provision(ctx)
    assert project.storage.state.calls.count("buckets.insert") == 1  # provision found it
    image = f"us-east5-docker.pkg.dev/{PROJECT}/tpupipe/torch:built"
    assert result["image"] == image and result["built"] and result["digest"].startswith("sha256:")
    (build,) = project.cloudbuild.state.builds.values()
    assert build.status.name == "SUCCESS" and list(build.images) == [image]
    assert f"TORCH_TPU_BASE={TORCH_TPU_BASE}" in build.steps[0].args and "tpupipe-run-built" in build.tags
    assert "TORCH_FROM_BASE=1" in build.steps[0].args  # the base's torch is not re-pinned
    source = project.storage.data(f"{PROJECT}-tpupipe", "builds/built/context.tar.gz")  # out of the pods' reach
    uploaded = project.storage.object(f"{PROJECT}-tpupipe", "builds/built/context.tar.gz")
    assert build.source.storage_source.generation == int(uploaded["generation"])  # the build pinned to it
    names = tarfile.open(fileobj=io.BytesIO(source)).getnames()
    assert {"images/torch/Dockerfile", "images/torch/requirements.txt", "pyproject.toml", "trainers/fsdp.py"} <= set(
        names
    )
    assert not any("__pycache__" in n for n in names)
    repository = project.registry.state.repositories[f"projects/{PROJECT}/locations/us-east5/repositories/tpupipe"]
    assert repository.format_.name == "DOCKER"  # created for the push (the emulated build fails without it)
    assert repository.docker_config.immutable_tags  # a tag, once pushed, names that image for good
    again = gke.build_image(ctx)  # a re-run of the stage: the image is found by its sources' tag and reused
    assert again["digest"] == result["digest"] and project.cloudbuild.state.calls.count("CreateBuild") == 1
    assert project.registry.state.calls.count("CreateRepository") == 1
    gke.teardown(ctx)
    assert repository.name in project.registry.state.repositories  # kept: every run's images are in it


def test_a_later_run_of_the_same_sources_reuses_the_image_and_its_compile_cache(tmp_path, project_factory, monkeypatch):
    from components.spec.images import pinned_image
    from components.workload import cache

    project = project_factory()
    first = platform().build_image(context(tmp_path, "monday", BUILD))
    tagged = f"us-east5-docker.pkg.dev/{PROJECT}/tpupipe/torch:ctx-"
    (content,) = [i for i in project.registry.state.images if i.startswith(tagged)]
    assert project.registry.state.images[content] == first["digest"]  # the build's digest, under its context's tag
    ctx = context(tmp_path, "tuesday", BUILD)
    second = platform().build_image(ctx)
    assert project.cloudbuild.state.calls.count("CreateBuild") == 1  # nothing built again
    assert not project.storage.object(f"{PROJECT}-tpupipe", "builds/tuesday/context.tar.gz")  # nor uploaded
    assert second == {"image": content, "built": False, "reused": True, "digest": first["digest"]}
    assert cache.key(ctx.spec, pinned_image(second)) == cache.key(ctx.spec, pinned_image(first))
    assert platform().build_image(context(tmp_path, "options", BUILD + " train.max_length=64"))["reused"]  # the
    # spec is not in the image; a change to what the image holds is another context: built, under its own tag.
    import shutil

    from components.cloud import build as gke_build

    changed = tmp_path / "sources"
    for top in ("images/torch", *gke_build.CONTEXT_PATHS):
        copy = shutil.copytree if (REPO / top).is_dir() else shutil.copy
        copy(REPO / top, changed / top, **({"dirs_exist_ok": True} if copy is shutil.copytree else {}))
    (changed / "trainers" / "fsdp.py").write_text((REPO / "trainers" / "fsdp.py").read_text() + "# changed\n")
    monkeypatch.setenv(gke_build.SOURCE_ROOT_ENV, str(changed))
    rebuilt = platform().build_image(context(tmp_path, "changed", BUILD))
    assert rebuilt["built"] and rebuilt["digest"] != first["digest"]
    assert len([i for i in project.registry.state.images if i.startswith(tagged)]) == 2


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_create_build_whose_reply_was_lost_is_followed_not_started_twice(tmp_path, project_factory, code):
    """CreateBuild takes effect and its reply is lost: before asking again the build is looked up by the run's tag,
    and the one the lost reply started is waited on; a second would push the run's tag again (immutable)."""
    project = project_factory()
    project.cloudbuild.lose_reply("CreateBuild", code)
    result = platform().build_image(context(tmp_path, "lostbuild", BUILD))
    (build,) = project.cloudbuild.state.builds.values()
    assert build.status.name == "SUCCESS" and result["built"] and result["build"] == build.id
    assert project.cloudbuild.state.calls.count("CreateBuild") == 1


def test_a_repository_that_is_not_for_docker_images_is_refused(tmp_path, project_factory):
    from google.cloud import artifactregistry_v1

    from components.cloud import build as gke_build

    project = project_factory()
    registry = gke_build.registry_client()
    registry.create_repository(
        request={
            "parent": f"projects/{PROJECT}/locations/us-east5",
            "repository_id": "tpupipe",
            "repository": {"format_": artifactregistry_v1.Repository.Format.MAVEN},
        }
    ).result(timeout=30)
    ctx = context(tmp_path, "maven", BUILD)
    gke = platform()
    gke.provision(ctx)
    with pytest.raises(SpecError, match="gke.artifact_repository.*MAVEN repository, not Docker"):
        gke.build_image(ctx)
    assert project.cloudbuild.state.calls.count("CreateBuild") == 0
    gke.teardown(ctx)


def test_an_existing_docker_repository_whose_tags_can_move_is_used_and_said(project_factory):
    from google.cloud import artifactregistry_v1

    from components.cloud import build as gke_build

    project_factory()
    client = gke_build.registry_client()
    parent = f"projects/{PROJECT}/locations/us-east5"
    docker = artifactregistry_v1.Repository.Format.DOCKER
    client.create_repository(
        request={"parent": parent, "repository_id": "mutable", "repository": {"format_": docker}}
    ).result(timeout=30)
    logs: list[str] = []
    registry = gke_build.Registry(client, log=logs.append)
    assert registry.ensure(PROJECT, "us-east5", "mutable") == f"{parent}/repositories/mutable"
    assert any(line.startswith("warning: ") and "no immutable tags" in line for line in logs)
    logs.clear()
    registry.ensure(PROJECT, "us-east5", "fresh")  # created by tpupipe: immutable, nothing to say
    assert client.get_repository(name=f"{parent}/repositories/fresh").docker_config.immutable_tags
    registry.ensure(PROJECT, "us-east5", "fresh")
    assert not any("warning" in line for line in logs)


def test_a_failed_build_is_one_clear_error_with_cloud_builds_detail(tmp_path, project_factory):
    from components.cloud import build as gke_build

    project = project_factory()
    project.cloudbuild.build_fails()
    ctx = context(tmp_path, "badbuild", BUILD)
    gke = platform()
    gke.provision(ctx)
    with pytest.raises(gke_build.BuildFailed, match="ended FAILURE: .*non-zero status"):
        gke.build_image(ctx)
    gke.teardown(ctx)


def test_sigterm_while_the_image_builds_cancels_the_build(tmp_path, project_factory):
    import os
    import signal
    import threading

    project = project_factory()
    ctx = context(tmp_path, "cancelbuild", BUILD)
    gke = platform()
    gke.provision(ctx)
    project.cloudbuild.polls_to_done = 10_000

    def terminate_once_polled() -> None:  # the wait's first poll runs with its interrupt handler in place
        wait_until(lambda: "GetBuild" in project.cloudbuild.state.calls, 120, "the build's first poll")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_once_polled, daemon=True).start()
    with pytest.raises(SystemExit):
        gke.build_image(ctx)
    (build,) = project.cloudbuild.state.builds.values()
    assert build.status.name == "CANCELLED"
    gke.teardown(ctx)


def test_the_image_build_is_cancelled_once_provision_beside_it_failed(tmp_path, project_factory):
    """build_image runs beside provision: when provision fails, nothing will deploy the image, so its build is
    cancelled (the exit handler's teardown waits for this task); a provision record of an earlier attempt is not
    taken for this run's."""
    import threading

    from components.cloud.build import BuildFailed
    from components.platforms.store import write_json

    project = project_factory()
    project.cloudbuild.polls_to_done = 10_000
    ctx = context(tmp_path, "orphanbuild", BUILD)
    key, error = "stages/provision.json", "preflight of run orphanbuild: 1 problem"
    write_json(ctx.store, key, {"stage": "provision", "status": "failed", "started": time.time() - 7200})
    failed = {"stage": "provision", "status": "failed", "started": time.time(), "error": error}
    threading.Timer(1.0, write_json, (ctx.store, key, failed)).start()
    with pytest.raises(BuildFailed, match=f"cancelled: provision failed \\({error}\\)"):
        platform().build_image(ctx)
    (build,) = project.cloudbuild.state.builds.values()
    assert build.status.name == "CANCELLED"


def test_tpupipe_teardown_deletes_a_run_left_behind_by_its_id_and_is_safe_twice(
    tmp_path, project_factory, monkeypatch, capsys
):
    """A run whose driver died after deploy: `tpupipe teardown RUN_ID` finds everything from the ledger and the labels
    (the spec it ran with comes from the ledger), and a second one finds nothing and exits 0."""
    from pipelines.cli import main as cli

    project = project_factory(polls_to_done=1)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "left-behind", ONE_SLICE + " cluster.ready_timeout_s=1")
    gke = platform()
    gke.provision(ctx)
    with pytest.raises(DeadlineExceeded):  # no Ray in this emulated cluster: the RayCluster never gets ready
        gke.deploy_raycluster(ctx)
    # compute: the private nodes' subnetwork and the NAT gateway (gke.image=local/torch is outside Google)
    assert set(project.leftovers("left-behind")) == {
        "clusters",
        "node pools",
        "compute",
        "kubernetes",
        "bucket bindings",
    }
    left = gke.remaining(ctx)  # newest first: deploy's bindings of the run's ServiceAccount, then provision's
    assert left[0].startswith("iam binding tpupipe-left-behind (UID ")
    assert any(entry.startswith("node pool left-behind-s0") for entry in left)

    assert cli.main(["teardown", "left-behind", "--platform", "gke", "--output-root", str(tmp_path)]) == 0
    assert "tpupipe teardown left-behind (gke): deleted " in capsys.readouterr().out
    assert project.leftovers("left-behind") == {} and gke.remaining(ctx) == []
    assert cli.main(["teardown", "left-behind", "--output-root", str(tmp_path)]) == 0  # the ledger names the platform
    assert "tpupipe teardown left-behind (gke): nothing was left to delete" in capsys.readouterr().out


def test_tpupipe_teardown_of_a_gke_run_without_a_ledger_needs_its_spec(tmp_path, capsys):
    from pipelines.cli import main as cli

    assert cli.main(["teardown", "never-ran", "--platform", "gke", "--output-root", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("tpupipe: error: run_id: run never-ran left no ledger")


def test_a_cluster_busy_upgrading_is_waited_for_in_provision_and_teardown_and_nothing_is_left(
    tmp_path, project_factory
):
    """An existing cluster GKE starts upgrading on its own: node pool create, then delete, are refused with GKE's
    failedPrecondition until the upgrade ends, asked again, and succeed; teardown leaks no billing pool."""
    project = project_factory()
    owner = context(tmp_path, "owner")
    platform().provision(owner)
    cluster = project.clusters("owner")[0]
    guest = context(tmp_path, "guest", ONE_SLICE + " gke.cluster_name=tpupipe-owner")
    lines: list[str] = []
    busy = GkePlatform(log=lines.append, poll_s=0.01)
    project.gke.upgrading(cluster, refusals=8)  # GetCluster calls count too: provision waits for RUNNING first
    busy.provision(guest)
    assert len(project.pools("guest")) == 2
    assert any("the cluster is busy" in line and "is currently upgrading" in line for line in lines)
    lines.clear()
    project.gke.upgrading(cluster, refusals=8)
    result = busy.teardown(guest)
    assert project.pools("guest") == [] and len(result["deleted"]) >= 2
    assert any("the cluster is busy" in line for line in lines)
    project.gke.upgrading(cluster, refusals=2)
    platform().teardown(owner)
    assert project.gke.state.clusters == {}


def test_a_failed_precondition_that_is_not_a_busy_cluster_is_not_retried(tmp_path, project_factory):
    project = project_factory()
    project.gke.fail("CreateNodePool", grpc.StatusCode.FAILED_PRECONDITION, "Multi-networking requires Dataplane V2.")
    ctx = context(tmp_path, "precondition")
    with pytest.raises(Exception, match="Multi-networking requires Dataplane V2"):
        platform().provision(ctx)
    assert project.gke.state.calls.count("CreateNodePool") == 1
    platform().teardown(ctx)
    assert project.gke.state.clusters == {}


def test_teardown_after_a_cancel_started_the_deletes_finds_them_under_way_and_leaves_nothing(tmp_path, project_factory):
    """A cancelled run's task starts its cluster's deletion and does not wait (``release``); the janitor's or
    ``tpupipe teardown``'s later delete meets GKE's failedPrecondition ("currently deleting"), waits for that delete
    and succeeds; a second release meanwhile counts the delete under way."""
    project = project_factory()
    ctx = context(tmp_path, "released")
    gke = platform()
    gke.provision(ctx)
    (cluster,) = project.clusters("released")
    assert gke.release(ctx) == [cluster]
    assert project.gke.state.clusters[cluster].status.name == "STOPPING"
    assert gke.release(ctx) == [cluster]  # the delete already under way
    gke.teardown(ctx)
    assert project.gke.state.clusters == {} and project.leftovers("released") == {}
