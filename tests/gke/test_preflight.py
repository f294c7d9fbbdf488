"""Preflight and an existing cluster's features, against the emulated project: the real Service Usage, Resource
Manager, Compute Engine and GKE clients. Nothing is created before every check passed; what GKE can enable in an
existing cluster is enabled before any node pool exists, the rest refused by name."""

from __future__ import annotations

import hashlib

import pytest

from components.platforms.gke.checks.preflight import PreflightFailed
from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan.needs import needs
from components.spec import SpecError
from components.workload import resolve
from pipelines.cli import main as cli
from tests.emulators.project import ALLOW, ONE_SLICE, PROJECT
from tests.emulators.tokens import ACCOUNT
from tests.gke.test_gke_platform import TWO_SLICES, context, platform
from tests.unit.test_plan_goldens import TPU_PRESETS

RESERVED = ONE_SLICE + " cluster.capacity=reservation cluster.reservation=team-v6e"
# v5e: the family whose TPU quota Compute Engine reports per region (TPU_LITE_PODSLICE_V5; resources.QUOTA_METRICS).
# Its ct5lp-hightpu-4t hosts have 192 GB: pods sized to fit one.
V5E_PODS = " cluster.worker_memory_gib=160 cluster.worker_shm_gib=16"
V5E_TWO_SLICES = (
    TWO_SLICES.replace("cluster.accelerator=v6e", "cluster.accelerator=v5e").replace(
        "gke.zone=us-east5-b", "gke.zone=us-west4-a"
    )
    + V5E_PODS
)
V5E_ONE_SLICE = (
    ONE_SLICE.replace("cluster.accelerator=v6e", "cluster.accelerator=v5e").replace(
        "gke.zone=us-east5-b", "gke.zone=us-west4-a"
    )
    + V5E_PODS
)
PARENT = f"projects/{PROJECT}/locations/us-east5-b"


DAY_MS = 24 * 3600 * 1000  # a default table expiration of a day
CALLER = ACCOUNT  # whose login the emulated project's credentials are
MINE = [{"role": "OWNER", "userByEmail": CALLER}]  # a dataset's access list with no one but the caller


def tag(email: str) -> str:
    """The first 8 hex digits of the SHA-256 of an e-mail in lower case: what names an identity's results dataset."""
    return hashlib.sha256(email.lower().encode()).hexdigest()[:8]


def preflight_cli(overrides: str, capsys) -> tuple[int, str]:
    code = cli.main(["preflight", "local-fsdp", "--set", overrides, "--run-id", "pre"])
    out = capsys.readouterr()
    return code, out.out + out.err


def refused(project, tmp_path, overrides: str, text: str, needles: tuple[str, ...], problems: int) -> None:
    """Every needle is in the one report; provision's first step (the same check) refuses the same problems; nothing
    was created."""
    for needle in needles:
        assert needle in text
    with pytest.raises(PreflightFailed) as caught:
        platform().provision(context(tmp_path, "pre", overrides))
    assert len(caught.value.problems) == problems
    assert project.mutations() == []
    assert project.leftovers("pre") == {}


def test_too_little_quota_a_disabled_api_and_a_missing_permission_are_one_report_and_exit_2(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    project.compute.set_quota(PROJECT, "us-west4", "TPU_LITE_PODSLICE_V5", limit=48, usage=40)
    project.services.disable("compute.googleapis.com")
    project.projects.deny("container.clusters.create")
    code, text = preflight_cli(V5E_TWO_SLICES, capsys)
    assert code == 2
    assert "3 problems; nothing was created" in text
    needles = (
        "cluster.capacity: TPU quota TPU_LITE_PODSLICE_V5 in us-west4",
        "the run needs 32 chips, 8 of 48",
        "apis: not enabled in project tpupipe-emulated: compute.googleapis.com",
        "permissions: the caller lacks on project tpupipe-emulated: container.clusters.create",
    )
    refused(project, tmp_path, V5E_TWO_SLICES, text, needles, problems=3)


def test_a_missing_reservation_and_a_missing_permission_exit_2_before_anything_is_created(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    project.projects.deny("storage.buckets.setIamPolicy", "compute.networks.create")
    code, text = preflight_cli(RESERVED, capsys)
    assert code == 2 and "2 problems" in text
    assert f"cluster.reservation: no reservation team-v6e in zone us-east5-b of project {PROJECT}" in text
    assert "lacks on project tpupipe-emulated: storage.buckets.setIamPolicy" in text
    assert "compute.networks.create" not in text  # a one-slice plan creates no network: not asked
    assert project.mutations() == []


def test_a_run_that_registers_needs_to_claim_and_take_back_its_copies_of_the_model(project_factory, capsys):
    """register copies the trained checkpoint to models/, create-only: a retried copy claims what it finds already
    there (objects.patch: ``storage.objects.update``), a failed one deletes what it wrote; preflight asks for both."""
    project = project_factory()
    project.projects.deny("storage.objects.update", "storage.objects.delete")
    code, text = preflight_cli(ONE_SLICE + " gate.register=true", capsys)
    assert code == 2
    assert "storage.objects.update" in text and "storage.objects.delete" in text
    assert project.mutations() == []


def test_an_aggregate_tpu_reservation_is_counted_in_chips_of_its_family(tmp_path, project_factory, capsys):
    """Cloud TPU capacity as it is sold: an aggregate reservation of chips of one TPU VM family (compute_v1's
    ``AllocationAggregateReservation``), not VMs of one machine type. A v6e 2x2 slice needs 4 chips."""
    project = project_factory()
    project.compute.add_aggregate_reservation(
        PROJECT, "us-east5-b", "team-v6e", "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E", chips=64, in_use=48
    )
    code, text = preflight_cli(RESERVED, capsys)
    assert code == 0, text
    assert "aggregate reservation team-v6e in us-east5-b: 16 of 64 chips free, 4 needed" in text
    project.compute.add_aggregate_reservation(
        PROJECT, "us-east5-b", "team-v6e", "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E", chips=64, in_use=62
    )
    code, text = preflight_cli(RESERVED, capsys)
    assert code == 2 and "has 2 of the 4 chips the run needs free (62 of 64 in use)" in text
    project.compute.add_aggregate_reservation(
        PROJECT, "us-east5-b", "team-v6e", "VM_FAMILY_CLOUD_TPU_POD_SLICE_TPU7X", chips=64
    )
    code, text = preflight_cli(RESERVED, capsys)
    assert code == 2 and "reserves VM_FAMILY_CLOUD_TPU_POD_SLICE_TPU7X; the slice's ct6e-standard-4t hosts" in text
    assert project.mutations() == []


def test_a_reservation_block_is_checked_by_its_own_count(tmp_path, project_factory, capsys):
    project = project_factory()
    project.compute.add_reservation(PROJECT, "us-east5-b", "team-v6e", "ct6e-standard-4t", count=8, in_use=8)
    project.compute.add_reservation_block(PROJECT, "us-east5-b", "team-v6e", "block-1", count=4, in_use=2)
    in_block = RESERVED + "/reservationBlocks/block-1"
    code, text = preflight_cli(in_block, capsys)
    assert code == 0, text
    assert "block block-1 of reservation team-v6e: 2 of 4 VMs free, 1 needed" in text
    code, text = preflight_cli(RESERVED + "/reservationBlocks/block-9", capsys)
    assert code == 2 and "no block block-9 in reservation team-v6e in zone us-east5-b" in text
    # The node pools name the block as GKE takes it.
    pools = [r for r in plan.resources(resolve("local-fsdp", in_block), "pre") if r.kind == "node-pool"]
    affinity = pools[-1].body["config"]["reservationAffinity"]
    assert affinity["values"] == ["team-v6e/reservationBlocks/block-1"]


def test_a_reservation_too_small_or_for_another_machine_is_a_problem(project_factory, capsys):
    project = project_factory()
    project.compute.add_reservation(PROJECT, "us-east5-b", "team-v6e", "ct6e-standard-4t", count=4, in_use=4)
    code, text = preflight_cli(RESERVED, capsys)
    assert code == 2 and "reservation team-v6e in us-east5-b has room for 0 of the 1 ct6e-standard-4t VMs" in text
    project.compute.add_reservation(PROJECT, "us-east5-b", "team-v6e", "ct5lp-hightpu-4t", count=4)
    code, text = preflight_cli(RESERVED, capsys)
    assert code == 2 and "reservation team-v6e is for ct5lp-hightpu-4t VMs; the slice needs ct6e-standard-4t" in text
    assert project.mutations() == []


def test_preflight_that_passes_says_what_it_found_and_creates_nothing(project_factory, capsys):
    project = project_factory()
    project.compute.add_reservation(PROJECT, "us-east5-b", "team-v6e", "ct6e-standard-4t", count=4, in_use=1)
    code, text = preflight_cli(RESERVED, capsys)
    assert code == 0, text
    assert "no problem found; nothing was created" in text
    assert "reservation team-v6e in us-east5-b: 3 of 4 ct6e-standard-4t free, 1 needed" in text
    nodes = f"tpu-nodes@{PROJECT}.iam.gserviceaccount.com"  # not the default account, which is warned of
    project.projects.grant(PROJECT, "roles/container.defaultNodeServiceAccount", f"serviceAccount:{nodes}")
    code, text = preflight_cli(f"{V5E_ONE_SLICE} gke.node_service_account={nodes}", capsys)
    assert code == 0 and "quota TPU_LITE_PODSLICE_V5 in us-west4: 4096 chips free, 4 needed" in text
    assert "warning" not in text
    assert project.mutations() == []


def test_spot_capacity_is_checked_against_the_preemptible_quota(project_factory, capsys):
    project = project_factory()
    project.compute.set_quota(PROJECT, "us-west4", "PREEMPTIBLE_TPU_LITE_PODSLICE_V5", limit=0)
    code, text = preflight_cli(V5E_ONE_SLICE + " cluster.capacity=spot", capsys)
    assert code == 2 and "PREEMPTIBLE_TPU_LITE_PODSLICE_V5" in text and "4 chips, 0 of 0 are free (spot)" in text


def test_a_quota_preflight_cannot_read_is_a_warning_in_the_report_never_silence(project_factory, capsys):
    project = project_factory()
    code, text = preflight_cli(ONE_SLICE, capsys)  # v6e: no regional Compute Engine metric
    assert code == 0, text
    assert (
        "warning: TPU quota not checked: Compute Engine's regional quotas have no metric for v6e "
        "(resources.QUOTA_METRICS); the run needs 4 on-demand v6e chips in us-east5"
    ) in text
    project.compute.hide_quota(PROJECT, "us-west4", "TPU_LITE_PODSLICE_V5")
    project.projects.deny("container.clusters.create")
    code, text = preflight_cli(V5E_ONE_SLICE, capsys)  # with a problem: the warning is in the failing report too
    assert code == 2, text
    assert "warning: TPU quota TPU_LITE_PODSLICE_V5 not checked: us-west4 of project" in text


# ---------------------------------------------------------------- an existing cluster (gke.cluster_name)

SHARED = ONE_SLICE + " gke.cluster_name=team"


def _team_cluster(project, *, ray: bool = True, dataplane_v2: bool = True, **more) -> str:
    """The team's shared cluster, ``more`` fields of the Cluster's REST body beside its features."""
    return project.gke.add_cluster(
        PARENT,
        {
            "name": "team",
            "addonsConfig": {
                "rayOperatorConfig": {"enabled": ray},
                "gcsFuseCsiDriverConfig": {"enabled": True},
                "httpLoadBalancing": {"disabled": False},
            },
            "workloadIdentityConfig": {"workloadPool": f"{PROJECT}.svc.id.goog"},
            "networkConfig": {"datapathProvider": "ADVANCED_DATAPATH" if dataplane_v2 else "LEGACY_DATAPATH"},
            **more,
        },
    )


def test_an_existing_cluster_without_the_ray_add_on_gets_it_before_any_node_pool(tmp_path, project_factory, capsys):
    project = project_factory()
    name = _team_cluster(project, ray=False)
    code, text = preflight_cli(SHARED, capsys)
    assert (
        code == 0
        and "cluster team: has GCS FUSE CSI driver, Workload Identity, Dataplane V2; provision "
        "enables Ray Operator add-on"
        in text
    )
    assert project.mutations() == []
    platform().provision(context(tmp_path, "shared", SHARED))
    calls = project.gke.state.calls
    assert calls.count("UpdateCluster") == 1
    assert calls.index("UpdateCluster") < calls.index("CreateNodePool")
    cluster = project.gke.state.clusters[name]
    assert cluster.addons_config.ray_operator_config.enabled
    assert cluster.addons_config.gcs_fuse_csi_driver_config.enabled  # the other add-ons are kept
    assert not cluster.addons_config.http_load_balancing.disabled
    assert sorted(p.rsplit("/", 1)[-1] for p in project.pools("shared")) == ["shared-cpu", "shared-s0"]
    platform().teardown(context(tmp_path, "shared", SHARED))
    assert name in project.gke.state.clusters and project.pools("shared") == []  # the cluster and its add-on stay
    assert cluster.addons_config.ray_operator_config.enabled


def test_an_existing_cluster_without_dataplane_v2_is_refused_by_name_before_anything_is_created(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    _team_cluster(project, ray=False, dataplane_v2=False)
    code, text = preflight_cli(SHARED, capsys)
    assert code == 2 and "1 problem;" in text
    assert (
        "gke.cluster_name: cluster team lacks the Dataplane V2: GKE chooses the dataplane when a cluster is "
        "created" in text
    )
    with pytest.raises(PreflightFailed, match="Dataplane V2"):
        platform().provision(context(tmp_path, "refused", SHARED))
    assert project.mutations() == [] and project.pools("refused") == []


def test_an_existing_cluster_with_another_workload_pool_is_refused_not_changed(tmp_path, project_factory, capsys):
    project = project_factory()
    name = project.gke.add_cluster(
        PARENT,
        {
            "name": "team",
            "addonsConfig": {"rayOperatorConfig": {"enabled": True}, "gcsFuseCsiDriverConfig": {"enabled": True}},
            "workloadIdentityConfig": {"workloadPool": "fleet-host.svc.id.goog"},
            "networkConfig": {"datapathProvider": "ADVANCED_DATAPATH"},
        },
    )
    code, text = preflight_cli(SHARED, capsys)
    assert (
        code == 2
        and "cluster team lacks the Workload Identity: it uses the workload pool fleet-host.svc.id.goog" in text
    )
    assert project.gke.state.clusters[name].workload_identity_config.workload_pool == "fleet-host.svc.id.goog"
    assert project.mutations() == []


def test_provision_again_after_a_teardown_checks_again_and_starts_the_clock_again(tmp_path, project_factory):
    from components.platforms import ledger

    project = project_factory()
    ctx = context(tmp_path, "again")
    platform().provision(ctx)
    first = ledger.load(ctx.store)["started"]
    platform().provision(ctx)  # resumed: passed preflight already
    assert project.services.calls.count("BatchGetServices") == 1
    platform().teardown(ctx)
    platform().provision(ctx)  # the same run id after its teardown: a new start
    assert project.services.calls.count("BatchGetServices") == 2
    assert ledger.load(ctx.store)["started"] > first
    platform().teardown(ctx)


def test_a_cluster_name_that_does_not_exist_is_a_problem(project_factory, capsys):
    project_factory()
    code, text = preflight_cli(SHARED, capsys)
    assert code == 2 and f"gke.cluster_name: no cluster team in us-east5-b of project {PROJECT}" in text


def test_the_plan_states_which_features_are_enabled_in_place_and_which_refused():
    spec = resolve("llama3-8b-v6e-16x2", f"gke.project={PROJECT} gke.cluster_name=team{ALLOW}")
    (cluster,) = [res for res in plan.resources(spec, "r1") if res.kind == "gke-cluster"]
    assert cluster.action == "use"
    for needle in (
        "Ray Operator add-on (enabled in place when missing, and kept)",
        "GCS FUSE CSI driver (enabled in place when missing, and kept)",
        "Workload Identity (enabled in place when missing, and kept; refused when the cluster uses "
        "another workload pool)",
        "Dataplane V2 (refused when missing: GKE chooses the dataplane",
        "multi-networking (enabled in place when missing, and kept)",
    ):
        assert needle in cluster.summary
    text = plan.render_text(plan.build(spec, "r1"))
    assert "checked before anything is created" in text and "Dataplane V2 (refused when missing" in text


def test_an_old_kuberay_on_an_existing_cluster_is_a_preflight_problem_and_nothing_tpu_is_created(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    _team_cluster(project)
    project.kube.kuberay_version = "1.5.0"  # the Ray Operator add-on of an older GKE: no authOptions at all
    code, text = preflight_cli(SHARED, capsys)
    assert code == 2 and "1 problem;" in text
    assert (
        "gke.cluster_name: cluster team runs a KubeRay older than 1.5.1: its RayCluster has no "
        "spec.authOptions, spec.authOptions.secretName" in text
    )
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayclusters.ray.io"
    assert ("GET", crd) in [(m, p) for m, p, _ in project.kube.requests]  # read through the cluster's API
    with pytest.raises(PreflightFailed, match="KubeRay older than 1.5.1"):
        platform().provision(context(tmp_path, "pre", SHARED))
    assert "CreateNodePool" not in project.gke.state.calls and project.mutations() == []
    project.kube.kuberay_version = "1.5.1"  # token authentication, its Secret generated by KubeRay: it will do
    code, text = preflight_cli(SHARED, capsys)
    assert code == 0 and "cluster team: its KubeRay is 1.5 (authOptions without secretName): it generates" in text
    project.kube.kuberay_version = "1.7.0"
    code, text = preflight_cli(SHARED, capsys)
    assert code == 0 and "cluster team: its KubeRay serves every RayCluster field the run sets" in text


def test_a_new_clusters_old_kuberay_is_refused_by_provision_before_any_tpu_node_pool(tmp_path, project_factory):
    project = project_factory()
    project.kube.kuberay_version = "1.5.0"
    ctx = context(tmp_path, "newold")
    with pytest.raises(SpecError, match="^gke.cluster_version: cluster tpupipe-newold runs a KubeRay older than 1.5.1"):
        platform().provision(ctx)
    assert "CreateCluster" in project.gke.state.calls and "CreateNodePool" not in project.gke.state.calls
    assert [p.rsplit("/", 1)[-1] for p in project.pools("newold")] == ["newold-cpu"]  # the head's, with the cluster
    platform().teardown(ctx)
    assert project.leftovers("newold") == {}


def test_tpupipe_run_preflights_before_kfp_local_builds_the_image(tmp_path, project_factory, capsys):
    """kfp.local runs the tasks one at a time, build_image (which needs nothing of provision) first: `tpupipe run`
    preflights before it starts them, so a problem costs no image build."""
    project = project_factory()
    project.projects.deny("container.clusters.create")
    built = ONE_SLICE.replace("gke.image=local/torch", "gke.torch_tpu_base=us-docker.pkg.dev/tpupipe-emulated/b/t:2")
    code = cli.main(
        ["run", "local-fsdp", "--platform", "gke", "--set", built, "--run-id", "pre", "--output-root", str(tmp_path)]
    )
    out = capsys.readouterr()
    assert code == 2, out.out + out.err
    assert "permissions: the caller lacks on project tpupipe-emulated: container.clusters.create" in out.out + out.err
    assert "CreateBuild" not in project.cloudbuild.state.calls and project.mutations() == []


def test_an_existing_cluster_where_the_caller_may_not_do_what_the_run_does_is_refused_naming_each(
    project_factory, capsys
):
    """Asked of the cluster's API server (SelfSubjectAccessReview), one action at a time: every one denied named."""
    project = project_factory()
    _team_cluster(project)
    project.kube.denied |= {("create", "", "services", "proxy"), ("list", "", "events", "")}
    code, text = preflight_cli(SHARED, capsys)
    assert code == 2 and "1 problem;" in text
    assert "gke.cluster_name: the caller may not, in namespace tpupipe of cluster team: list events (" in text
    assert "create services/proxy (the jobs are submitted through the head Service's proxy)" in text
    assert "roles/container.developer" in text
    assert ("patch", "ray.io", "rayclusters", "") in project.kube.reviews
    assert project.mutations() == []
    project.kube.denied.clear()
    code, text = preflight_cli(SHARED, capsys)
    assert code == 0 and "namespace tpupipe of cluster team: the caller may do all 20 things the run does" in text


def test_an_existing_cluster_whose_api_server_cannot_be_reached_is_a_problem(project_factory, capsys):
    project = project_factory()
    name = _team_cluster(project)
    project.gke.state.clusters[name].endpoint = "127.0.0.1:9"  # nothing answers there (a private endpoint, say)
    code, text = preflight_cli(SHARED, capsys)
    assert code == 2
    assert "the Kubernetes API of cluster team at 127.0.0.1:9 cannot be reached from here" in text
    assert project.mutations() == []


def test_a_dataset_in_a_bucket_the_caller_may_not_read_is_a_problem_naming_the_role(project_factory, capsys):
    """A Cloud Storage dataset in another project's bucket: the run's data snapshot reads it as the caller, so
    preflight asks the bucket what the caller may do there (testIamPermissions) and names the role it lacks."""
    from google.cloud import storage

    from components.cloud.credentials import credentials

    project = project_factory()
    storage.Client(project=PROJECT, credentials=credentials()).create_bucket("acme-sft")
    project.storage.put("acme-sft", "drops/2026-12-01/a.jsonl", b'{"instruction": "a", "response": "b"}\n')
    project.storage.foreign("acme-sft", "user:dev@example.com")
    data = "train.dataset=gs://acme-sft/drops/{date}/"
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert code == 2
    assert (
        "train.dataset: the caller may not read gs://acme-sft (it lacks storage.objects.list, storage.objects.get)"
        in text
    )
    assert "grant roles/storage.objectViewer on gs://acme-sft" in text
    policy = project.storage.state.policies["acme-sft"]  # the bucket's owner, in its project, grants the role
    policy.setdefault("bindings", []).append(
        {"role": "roles/storage.objectViewer", "members": ["user:dev@example.com"]}
    )
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert "train.dataset: the caller may list and read gs://acme-sft" in text, text


def test_a_bigquery_dataset_needs_a_read_session_where_the_run_bills_and_read_on_the_table(project_factory, capsys):
    """A table in another project: the data snapshot's read session (and, with train.data_since=champion, its APPENDS
    query job) is created in the run's project (gke.project), so preflight asks that project for
    bigquery.readsessions.create (and bigquery.jobs.create) (projects.testIamPermissions) and the table for read
    (BigQuery's tables.testIamPermissions), wherever the table is."""
    project = project_factory()
    project.bigquery.create_table("acme-data-1.sft.examples", [("instruction", "STRING"), ("response", "STRING")])
    data = "train.dataset=bq://acme-data-1.sft.examples"
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert f"train.dataset: as the caller, may open BigQuery read sessions in project {PROJECT} (billed there)" in text
    assert "train.dataset: as the caller, may read acme-data-1.sft.examples" in text
    assert "BigQuery jobs" not in text  # no query: no job
    since = " train.dataset_time_column=ingested train.data_since=champion train.init_from=champion"
    code, text = preflight_cli(f"{ONE_SLICE} {data}{since}", capsys)
    assert f"train.dataset: as the caller, may run BigQuery jobs in project {PROJECT} (billed there)" in text, text
    assert f"train.dataset: as the caller, may read BigQuery read sessions' rows in project {PROJECT}" in text
    project.projects.deny("bigquery.readsessions.getData")  # a custom role that opens sessions but reads no stream
    code, text = preflight_cli(f"{ONE_SLICE} {data}{since}", capsys)
    assert code == 2
    assert (
        f"gke.project: the caller lacks bigquery.readsessions.getData in project {PROJECT}, where the data snapshot's "
        "BigQuery read session reading acme-data-1.sft.examples is read and billed: grant "
        "roles/bigquery.readSessionUser"
    ) in text
    project.bigquery.add_row_access_policy("acme-data-1.sft.examples")
    code, text = preflight_cli(f"{ONE_SLICE} {data}{since}", capsys)
    assert (
        "train.dataset: acme-data-1.sft.examples has 1 row access policy: the data snapshot reads it as of a past "
        "time (its snapshot time, APPENDS), which only an identity holding "
        "bigquery.rowAccessPolicies.overrideTimeTravelRestrictions"
    ) in " ".join(text.split()), text
    project.projects.deny("bigquery.readsessions.create", "bigquery.jobs.create")
    code, text = preflight_cli(f"{ONE_SLICE} {data}{since}", capsys)
    assert code == 2
    assert (
        f"gke.project: the caller lacks bigquery.readsessions.create in project {PROJECT}, where the data snapshot's "
        "BigQuery read session reading acme-data-1.sft.examples is created and billed: grant "
        "roles/bigquery.readSessionUser"
    ) in text
    assert (
        f"gke.project: the caller lacks bigquery.jobs.create in project {PROJECT}, where the data snapshot's BigQuery "
        "APPENDS query reading acme-data-1.sft.examples is created and billed: grant roles/bigquery.jobUser"
    ) in text
    assert project.mutations() == []


def test_a_dated_bigquery_table_is_checked_by_its_dataset(project_factory, capsys):
    """``events_{date:%Y%m%d}``: the day's table need not exist before its day, so preflight checks the jobs' project
    and the dataset the tables are in (datasets.get), and leaves the table to the data snapshot; a dataset that is
    not there is a problem naming train.dataset."""
    project = project_factory()
    project.bigquery.create_dataset("acme-data-1.events")
    data = "train.dataset=bq://acme-data-1.events.events_{date:%Y%m%d}"
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    sessions = f"train.dataset: as the caller, may open BigQuery read sessions in project {PROJECT} (billed there)"
    assert sessions in text, text
    assert (
        "train.dataset: as the caller, may see the dataset acme-data-1.events of the dated table "
        "bq://acme-data-1.events.events_{date:%Y%m%d} (each day's table is read by the data snapshot)"
    ) in text, text
    code, text = preflight_cli(f"{ONE_SLICE} {data.replace('.events.', '.evnets.')}", capsys)
    assert code == 2
    assert (
        "train.dataset: the dataset acme-data-1.evnets, where the dated tables of "
        "bq://acme-data-1.evnets.events_{date:%Y%m%d} are, does not exist"
    ) in text, text
    assert project.mutations() == []


def test_a_pod_larger_than_its_node_is_refused_before_anything_is_created(tmp_path, project_factory, capsys):
    """The default TPU worker pod (200 GiB, 100 GiB /dev/shm) on v5e's ct5lp-hightpu-4t (192 GB, of which GKE gives
    pods about 181 GiB): it would stay Unschedulable while its pool bills. Refused naming the field and the most that
    fits; a pod that fits but whose /dev/shm would not is a warning."""
    project = project_factory()
    too_large = V5E_ONE_SLICE.replace(V5E_PODS, "")
    code, text = preflight_cli(too_large, capsys)
    assert code == 2, text
    assert (
        "cluster.worker_memory_gib: each TPU worker pod asks for 200 GiB but a ct5lp-hightpu-4t node gives pods "
        "111.7 vCPUs and 181 GiB of its 112 and 192 GiB: it would never be scheduled; ask for at most 181"
    ) in text
    refused(project, tmp_path, too_large, text, (), problems=1)
    code, text = preflight_cli(too_large + " cluster.worker_memory_gib=170", capsys)
    assert code == 0, text
    assert "cluster.worker_shm_gib: a TPU worker's 170 GiB and its 100 GiB /dev/shm" in text
    code, text = preflight_cli(ONE_SLICE + " cluster.head_cpus=9", capsys)  # n2-standard-8 carries the Ray head
    assert code == 2 and "cluster.head_cpus: each pod asks for 9 vCPUs but a n2-standard-8 node gives pods" in text


@pytest.mark.parametrize("preset", TPU_PRESETS)
def test_every_tpu_preset_preflights_clean_in_its_own_default_zone(preset, project_factory, capsys):
    """As shipped, with only the project named: what each preset's pools and pods ask for is offered and fits."""
    project_factory()
    code = cli.main(
        ["preflight", preset, "--set", f"gke.project={PROJECT}", "--run-id", "pre", "--allow-default-identities"]
    )
    out = capsys.readouterr()
    assert code == 0, out.out + out.err


def test_a_caller_who_may_create_the_cluster_but_not_use_its_kubernetes_api_is_refused_before_it(
    tmp_path, project_factory, capsys
):
    """A cluster the run creates has no RBAC binding for the caller: IAM alone decides. One who may create clusters
    (as roles/container.clusterAdmin allows) but not connect to the DNS endpoint or write the RayCluster would get
    a 403 at deploy_raycluster, after the cluster bills: refused before it, naming the permissions."""
    project = project_factory()
    project.projects.deny("container.clusters.connect", "container.thirdPartyObjects.update")
    code, text = preflight_cli(ONE_SLICE, capsys)
    assert code == 2, text
    assert (
        "permissions: the caller lacks on project tpupipe-emulated: container.clusters.connect, "
        "container.thirdPartyObjects.update"
    ) in text
    refused(project, tmp_path, ONE_SLICE, text, (), problems=1)
    # On an existing cluster the API server answers for itself (SelfSubjectAccessReview): not asked of IAM here.
    existing = needs(resolve("local-fsdp", ONE_SLICE + " gke.cluster_name=shared"), "pre")
    assert "container.clusters.connect" not in existing.permissions


def test_a_bigquery_dataset_checks_the_pipelines_service_account_from_the_iam_policies(project_factory, capsys):
    """The caller's permissions are labelled as the caller's; the pipeline's service account, which the data
    snapshot runs as on Vertex AI and KFP, is checked from the IAM policies (the jobs project's, the dataset's access
    list): a warning for each of running jobs and reading the table that no role of it grants, none once granted."""
    project = project_factory()
    project.bigquery.create_table("acme-data-1.sft.examples", [("instruction", "STRING"), ("response", "STRING")])
    account = f"pipeline@{PROJECT}.iam.gserviceaccount.com"
    data = f"train.dataset=bq://acme-data-1.sft.examples train.bigquery_service_account={account}"
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert code == 0, text
    assert f"train.dataset: as the caller, may open BigQuery read sessions in project {PROJECT} (billed there)" in text
    assert "train.dataset: as the caller, may read acme-data-1.sft.examples" in text
    assert (
        f"warning: train.bigquery_service_account: {account}, whom the data snapshot runs as, holds no role that "
        f"may open BigQuery read sessions in project {PROJECT} (of roles/bigquery.readSessionUser, "
    ) in text
    assert (
        f"{account}, whom the data snapshot runs as, holds no role that may read acme-data-1.sft.examples on the "
        "dataset acme-data-1.sft or its project (of roles/bigquery.dataViewer, "
    ) in text
    project.projects.grant(PROJECT, "roles/bigquery.user", f"serviceAccount:{account}")
    project.bigquery.grant(f"serviceAccount:{account}", "roles/bigquery.dataViewer", "acme-data-1.sft")
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert f"train.dataset: {account} may open BigQuery read sessions (roles/bigquery.user in project {PROJECT})" in (
        text
    ), text
    assert (  # the dataset's access list names the role in its legacy form, as BigQuery returns it
        f"{account} may read acme-data-1.sft.examples (READER on the dataset acme-data-1.sft or its project)"
    ) in text
    assert "train.bigquery_service_account" not in text
    assert project.mutations() == []
    assert set(project.projects.policy_versions) == {3}  # every policy read at the version conditions need


def test_a_pipeline_account_reading_through_its_projects_viewer_role_is_seen_by_the_datasets_special_group(
    project_factory, capsys
):
    """A dataset created without an access list grants READER to ``projectReaders`` (its project's viewers): an
    account that is a viewer of the data's project may read the table, and is not warned."""
    project = project_factory()
    project.projects.add_project("acme-data-1", "555000111")
    project.bigquery.create_table("acme-data-1.sft.examples", [("instruction", "STRING"), ("response", "STRING")])
    account = f"pipeline@{PROJECT}.iam.gserviceaccount.com"
    data = f"train.dataset=bq://acme-data-1.sft.examples train.bigquery_service_account={account}"
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert "holds no role that may read acme-data-1.sft.examples" in text, text  # not a viewer there yet
    project.projects.grant("acme-data-1", "roles/viewer", f"serviceAccount:{account}")
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert code == 0, text
    assert f"{account} may read acme-data-1.sft.examples (READER on the dataset acme-data-1.sft or its project)" in text
    assert "holds no role that may read" not in text


def test_a_pipeline_accounts_bigquery_roles_under_an_iam_condition_are_not_counted_and_named(project_factory, capsys):
    """Read sessions granted on the project, and reading granted on the dataset, each only under an IAM condition:
    neither is counted, and each warning names the role and the condition's title. The dataset's access list is read
    at accessPolicyVersion=3, the only version at which BigQuery answers an entry's condition; the same roles granted
    without a condition pass."""
    project = project_factory()
    project.bigquery.create_table("acme-data-1.sft.examples", [("instruction", "STRING"), ("response", "STRING")])
    account = f"pipeline@{PROJECT}.iam.gserviceaccount.com"
    member = f"serviceAccount:{account}"
    office = {"title": "office-hours", "expression": "request.time.getHours('Europe/Berlin') < 18"}
    project.projects.grant(PROJECT, "roles/bigquery.readSessionUser", member, condition=office)
    project.bigquery.grant(member, "roles/bigquery.dataViewer", "acme-data-1.sft", condition=office)
    data = f"train.dataset=bq://acme-data-1.sft.examples train.bigquery_service_account={account}"
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert code == 0, text
    assert (
        f"warning: train.bigquery_service_account: {account}, whom the data snapshot runs as, may open BigQuery read "
        f"sessions in project {PROJECT} only under an IAM condition: roles/bigquery.readSessionUser (under the "
        "condition "
        "'office-hours'): IAM grants it only to the requests the condition holds for, which preflight does not "
        "evaluate; make sure it admits the run's requests (its dataset, its dates)"
    ) in text, text
    assert (  # the entry's role as the access list names it, in its legacy form
        f"{account}, whom the data snapshot runs as, may read acme-data-1.sft.examples on the dataset acme-data-1.sft "
        "or its project only under an IAM condition: READER (under the condition 'office-hours')"
    ) in text, text
    (asked,) = [query for method, query, _ in project.bigquery.bodies if method == "datasets.get"]
    assert asked.get("accessPolicyVersion") == "3"
    assert set(project.projects.policy_versions) == {3}
    project.projects.grant(PROJECT, "roles/bigquery.readSessionUser", member)
    project.bigquery.grant(member, "roles/bigquery.dataViewer", "acme-data-1.sft")
    code, text = preflight_cli(f"{ONE_SLICE} {data}", capsys)
    assert code == 0 and "train.bigquery_service_account" not in text, text
    assert f"{account} may read acme-data-1.sft.examples (READER on the dataset acme-data-1.sft or its project)" in text


def preflight_said(overrides: str, capsys, code: int) -> str:
    """The report of ``tpupipe preflight`` with ``overrides``, its lines' wrapping undone, once it exited ``code``."""
    got, text = preflight_cli(overrides, capsys)
    assert got == code, text
    return " ".join(text.split())


def test_the_appends_results_dataset_is_checked_where_the_jobs_run(project_factory, capsys):
    """With train.data_since=champion the APPENDS query writes to train.bigquery_results_dataset, else to the
    caller's own dataset of the table's location (tpupipe_results_eu_HASH, the hash of its e-mail) in the jobs'
    project: absent, the caller may create it (bigquery.datasets.create, else a problem naming the field and the
    permission, the least privilege first); there, in the table's location (else a problem naming the field and both
    locations), with a default table expiration (else a problem; one over a day a warning), its access list open to no
    one (else a problem with the steps that replace it) and shared with no domain or group (else a warning); what its
    tables take is tested on the project, a grant on the dataset itself said to be unchecked. A named dataset that
    does not exist is a problem. A refusal to read it is a problem, another failure a warning that it was not
    checked. Nothing is created."""
    project = project_factory()
    project.bigquery.create_dataset("acme-data-1.sft", location="EU")
    project.bigquery.create_table("acme-data-1.sft.examples", [("instruction", "STRING"), ("response", "STRING")])
    data = (
        f"{ONE_SLICE} train.dataset=bq://acme-data-1.sft.examples train.dataset_time_column=ingested "
        "train.data_since=champion train.init_from=champion"
    )
    own = f"{PROJECT}.tpupipe_results_eu_{tag(CALLER)}"
    assert (
        f"train.dataset: as the caller, may create its own dataset {own} for the APPENDS query's result tables "
        "(absent: the data snapshot creates it in EU, the caller its one owner)"
    ) in preflight_said(data, capsys, 0)
    project.projects.deny("bigquery.datasets.create")
    assert (
        f"train.bigquery_results_dataset: the dataset {own}, the caller's own where the data snapshot's APPENDS query "
        f"writes its result, does not exist, and the caller lacks bigquery.datasets.create in project {PROJECT} to "
        "create it: make a dataset in EU, grant roles/bigquery.dataEditor on it alone and name it in "
        f"train.bigquery_results_dataset (the least privilege), or grant roles/bigquery.user on {PROJECT}"
    ) in preflight_said(data, capsys, 2)
    project.bigquery.create_dataset(own, location="US", default_table_expiration_ms=DAY_MS, access=MINE)
    assert (
        f"train.bigquery_results_dataset: the dataset {own}, where the data snapshot's APPENDS query writes its "
        "result, is in US, and acme-data-1.sft.examples in EU"
    ) in preflight_said(data, capsys, 2)
    project.bigquery.create_dataset(
        f"{PROJECT}.eu_results", location="EU", default_table_expiration_ms=DAY_MS, access=MINE
    )
    eu = f"{data} train.bigquery_results_dataset=eu_results"
    said = preflight_said(eu, capsys, 0)
    assert f"train.dataset: the dataset {PROJECT}.eu_results is in EU, as acme-data-1.sft.examples" in said
    assert f"may write, read and delete tables in {PROJECT}.eu_results (granted on project {PROJECT})" in said
    assert "warning: train.bigquery_results_dataset" not in said
    project.projects.deny("bigquery.tables.delete")
    assert (
        f"train.dataset: the caller's grant on the dataset {PROJECT}.eu_results not checked (on project {PROJECT} it "
        "lacks bigquery.tables.delete;"
    ) in preflight_said(eu, capsys, 0)
    project.bigquery.create_dataset(f"{PROJECT}.eu_open", location="EU", default_table_expiration_ms=DAY_MS)
    assert (  # made with BigQuery's default access list, as `bq mk` makes one
        f"train.bigquery_results_dataset: the dataset {PROJECT}.eu_open, where the data snapshot's APPENDS query "
        "writes its result, grants READER to projectReaders (the viewers of its project), WRITER to projectWriters "
        "(the editors of its project): the training rows its result tables hold would be theirs to read (or write); "
        f"remove those entries: `bq show --format=prettyjson {PROJECT}:eu_open > acl.json`, edit its `access` list, "
        f"then `bq update --source acl.json {PROJECT}:eu_open`"
    ) in preflight_said(f"{data} train.bigquery_results_dataset=eu_open", capsys, 2)
    shared = [*MINE, {"role": "READER", "domain": "example.com"}, {"role": "WRITER", "groupByEmail": "ml@example.com"}]
    project.bigquery.create_dataset(
        f"{PROJECT}.eu_shared", location="EU", default_table_expiration_ms=7 * DAY_MS, access=shared
    )
    said = preflight_said(f"{data} train.bigquery_results_dataset=eu_shared", capsys, 0)
    assert (
        f"warning: train.bigquery_results_dataset: the dataset {PROJECT}.eu_shared, where the data snapshot's APPENDS "
        "query writes its result, has a default table expiration of 168 hours, more than 24:"
    ) in said
    assert (
        f"warning: train.bigquery_results_dataset: the dataset {PROJECT}.eu_shared, where the data snapshot's APPENDS "
        "query writes its result, grants READER to domain example.com (everyone signed in with an account of the "
        "domain), WRITER to groupByEmail ml@example.com (the group's members):"
    ) in said
    project.bigquery.create_dataset(f"{PROJECT}.forever", location="EU", access=MINE)
    assert (
        f"train.bigquery_results_dataset: the dataset {PROJECT}.forever, where the data snapshot's APPENDS query "
        "writes its result, has no default table expiration: a result table of a run killed before its own "
        "expiration is set would keep its training rows for ever; `bq update --default_table_expiration 86400 "
        f"{PROJECT}:forever`"
    ) in preflight_said(f"{data} train.bigquery_results_dataset=forever", capsys, 2)
    assert (
        f"train.bigquery_results_dataset: the dataset {PROJECT}.team_results, named for the APPENDS query's result "
        f"tables, does not exist: make it once, `bq mk --dataset --location=EU"
    ) in preflight_said(f"{data} train.bigquery_results_dataset=team_results", capsys, 2)
    quota = "Quota exceeded: Your project exceeded quota for api requests per user."
    project.bigquery.fail(
        "datasets.get", 403, "quotaExceeded", quota, when=lambda r: r["path"]["dataset"] == "eu_results"
    )
    said = preflight_said(eu, capsys, 0)
    assert (
        f"warning: train.bigquery_results_dataset: the dataset {PROJECT}.eu_results, where the data snapshot's APPENDS "
        f"query writes its result, could not be checked (Forbidden: 403"
    ) in said and quota in said
    denied = f"Access Denied: Dataset {PROJECT}:eu_results: Permission bigquery.datasets.get denied"
    project.bigquery.fail(
        "datasets.get", 403, "accessDenied", denied, when=lambda r: r["path"]["dataset"] == "eu_results"
    )
    assert (
        f"train.bigquery_results_dataset: the caller may not see the dataset {PROJECT}.eu_results, where the data "
        "snapshot's APPENDS query writes its result (Forbidden): grant roles/bigquery.dataEditor on it (the least "
        f"privilege), or roles/bigquery.user on {PROJECT}"
    ) in preflight_said(eu, capsys, 2)
    assert "tpupipe_results" not in preflight_said(
        f"{ONE_SLICE} train.dataset=bq://acme-data-1.sft.examples", capsys, 0
    )
    assert project.mutations() == [] and set(project.bigquery.datasets) == {
        ("acme-data-1", "sft"), (PROJECT, own.split(".")[1]), (PROJECT, "eu_results"), (PROJECT, "eu_open"),
        (PROJECT, "eu_shared"), (PROJECT, "forever"),
    }  # fmt: skip


def test_a_caller_with_no_email_names_a_results_dataset_or_the_account_it_runs_as(project_factory, capsys, monkeypatch):
    """A caller whose e-mail cannot be learned (a federated principal, here a token the UserInfo endpoint does not
    name) has no results dataset of its own: a problem naming train.bigquery_results_dataset, unless a dataset is
    named or train.bigquery_service_account names the account the data snapshot runs as, whose own is checked."""
    from components.cloud.credentials import EMULATOR_TOKEN_ENV

    project = project_factory()
    project.bigquery.create_table("acme-data-1.sft.examples", [("instruction", "STRING"), ("response", "STRING")])
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, project.tokens.mint())  # a token of the cloud-platform scope alone
    data = (
        f"{ONE_SLICE} train.dataset=bq://acme-data-1.sft.examples train.dataset_time_column=ingested "
        "train.data_since=champion train.init_from=champion"
    )
    assert (
        "train.bigquery_results_dataset: the caller has no e-mail to name its own dataset for the APPENDS query's "
        "result tables after (tpupipe_results_LOCATION_HASH)"
    ) in preflight_said(data, capsys, 2)
    account = f"pipeline@{PROJECT}.iam.gserviceaccount.com"
    said = preflight_said(f"{data} train.bigquery_service_account={account}", capsys, 0)
    assert f"the dataset {PROJECT}.tpupipe_results_us_{tag(account)}, {account}'s own" in said, said


def test_a_pipeline_account_that_may_not_create_its_absent_results_dataset_is_warned(project_factory, capsys):
    """With train.bigquery_service_account, the results dataset checked is the account's own (named after its
    e-mail); absent, the account's roles on the jobs' project are read for one that creates datasets: none is a
    warning naming roles/bigquery.user; granted it, none."""
    project = project_factory()
    project.bigquery.create_table("acme-data-1.sft.examples", [("instruction", "STRING"), ("response", "STRING")])
    account = f"pipeline@{PROJECT}.iam.gserviceaccount.com"
    own = f"{PROJECT}.tpupipe_results_us_{tag(account)}"
    data = (
        f"{ONE_SLICE} train.dataset=bq://acme-data-1.sft.examples train.bigquery_service_account={account} "
        "train.dataset_time_column=ingested train.data_since=champion train.init_from=champion"
    )
    project.projects.grant(PROJECT, "roles/bigquery.jobUser", f"serviceAccount:{account}")
    said = preflight_said(data, capsys, 0)
    assert (
        f"warning: train.bigquery_service_account: {account}, whom the data snapshot runs as, holds no role that may "
        f"create the dataset {own} in project {PROJECT} (of roles/bigquery.user, "
    ) in said
    assert (
        f"train.dataset: the dataset {own}, {account}'s own for the APPENDS query's result tables, absent: the data "
        f"snapshot creates it in US, {account} its one owner"
    ) in said
    project.projects.grant(PROJECT, "roles/bigquery.user", f"serviceAccount:{account}")
    said = preflight_said(data, capsys, 0)
    assert f"{account} may create the dataset {own} (roles/bigquery.user in project" in said, said
    assert "holds no role that may create" not in said
    assert project.mutations() == []


def test_a_pipeline_account_that_may_not_write_the_results_dataset_there_is_warned(project_factory, capsys):
    """A team's results dataset (named) that another identity made grants the pipeline's service account nothing by
    itself: its access list is read for a role of the account's that creates tables there (WRITER, OWNER, a dataset
    role on it or its project), and none is a warning naming roles/bigquery.dataEditor on the dataset; a grant on the
    dataset is one. The account's own dataset, made by its earlier run, lists it as OWNER."""
    project = project_factory()
    project.bigquery.create_table("acme-data-1.sft.examples", [("instruction", "STRING"), ("response", "STRING")])
    results = f"{PROJECT}.team_results"
    project.bigquery.create_dataset(results, default_table_expiration_ms=DAY_MS, access=MINE)
    account = f"pipeline@{PROJECT}.iam.gserviceaccount.com"
    data = (
        f"{ONE_SLICE} train.dataset=bq://acme-data-1.sft.examples train.bigquery_service_account={account} "
        "train.dataset_time_column=ingested train.data_since=champion train.init_from=champion"
    )
    team = f"{data} train.bigquery_results_dataset=team_results"
    assert (
        f"warning: train.bigquery_service_account: {account}, whom the data snapshot runs as, holds no role that may "
        f"create tables in {results} (of WRITER, OWNER, roles/bigquery.dataEditor, roles/bigquery.dataOwner, "
        f"roles/bigquery.admin; its roles there: none), where the data snapshot's APPENDS query writes its result: "
        f"grant roles/bigquery.dataEditor on the dataset {results}"
    ) in preflight_said(team, capsys, 0)
    project.bigquery.grant(f"serviceAccount:{account}", "roles/bigquery.dataEditor", results)
    said = preflight_said(team, capsys, 0)
    assert f"train.dataset: {account} may create tables in {results} (WRITER)" in said, said
    assert "holds no role that may create tables" not in said
    own = f"{PROJECT}.tpupipe_results_us_{tag(account)}"
    project.bigquery.create_dataset(
        own, default_table_expiration_ms=DAY_MS, access=[{"role": "OWNER", "userByEmail": account}]
    )
    said = preflight_said(data, capsys, 0)
    assert f"train.dataset: {account} may create tables in {own} (OWNER)" in said, said
    assert "warning: train.bigquery_results_dataset" not in said and project.mutations() == []
