"""The emulated project: the GKE ClusterManager (gRPC), Compute Engine (REST), Cloud Storage (JSON API), Resource
Manager, Cloud Build and Artifact Registry (gRPC), Vertex AI Model Registry (REST) and the cluster's Kubernetes API
server (HTTPS), in this process, and the environment that points the gke platform at them (as Google's emulators are
found). The buckets' objects are files (``storage.bucket_dir(bucket)``, under ``tmp_path/buckets``), and the emulated
pods' Cloud Storage FUSE mounts are those files: what a pod writes is an object, and an object written through the
API is there for the pods. Credentials are found as on a workstation: ``GOOGLE_APPLICATION_CREDENTIALS`` names an
``authorized_user`` file, refreshed (``TPUPIPE_GKE_EMULATOR_TOKEN_URI``) at the emulated token issuer (``tokens``,
``project.tokens``), whose tokens expire; every emulator that checks a token takes only those. With ``vertex=True``,
Vertex AI Pipelines too, on the same endpoint as the Model Registry (as Google serves both on one). ``start_project``
makes one; the ``project_factory`` fixture (tests/conftest.py) makes them for a test and stops them after it."""

from __future__ import annotations

import functools
from pathlib import Path

from components.cloud.credentials import VERTEX_ENDPOINT_ENV
from components.data.bigquery import EMULATOR_HOST_ENV as BIGQUERY_EMULATOR_HOST_ENV
from components.data.bigquery import STORAGE_EMULATOR_HOST_ENV as BIGQUERY_STORAGE_EMULATOR_HOST_ENV
from components.platforms.gke.cloud.control_plane import DNS_CA_ENV
from components.spec import names
from tests.emulators.artifactregistry import ArtifactRegistryEmulator
from tests.emulators.bigquery import BigQueryEmulator
from tests.emulators.bigquery_storage import BigQueryStorageEmulator
from tests.emulators.cloudbuild import CloudBuildEmulator
from tests.emulators.compute import ComputeEmulator
from tests.emulators.gke import ClusterManagerEmulator
from tests.emulators.kube import KubeEmulator
from tests.emulators.models import ModelServiceEmulator
from tests.emulators.resourcemanager import ResourceManagerEmulator
from tests.emulators.serviceusage import ServiceUsageEmulator
from tests.emulators.storage import StorageEmulator
from tests.emulators.tokens import TokenIssuer

PROJECT = "tpupipe-emulated"
# BigQuery's calls that change something (a job is billed; a dataset made; a table changed or deleted)
BIGQUERY_MUTATIONS = ("jobs.insert", "jobs.query", "datasets.insert", "tables.patch", "tables.delete")
REGION = "us-east5"
PROJECT_NUMBER = "123456789012"
# The emulated project's nodes run as its Compute Engine default account, which holds what nodes need, and Cloud Build
# as its default build account: the tests accept them (those of their refusal leave this out).
ALLOW = " gke.allow_default_identities=true"
# Runs whose answers and step counts no test reads: local-fsdp's batches of 16 (half its default run's steps) and no
# answers generated before and after training (eval.generate_examples=0).
LEAN = " train.batch_size=16 eval.generate_examples=0"
# local-fsdp shaped as a 1-slice TPU plan: one v6e 2x2 host (ct6e-standard-4t, 4 chips), one Ray Train worker
# per TPU device, 1 CPU per worker pod; the emulated KubeRay runs the pods as local raylets on CPU.
ONE_SLICE = (
    f"cluster.accelerator=v6e cluster.topology=2x2 cluster.num_hosts=1 cluster.cpus_per_host=4 "
    f"gke.project={PROJECT} gke.zone=us-east5-b gke.image=local/torch gke.namespace=tpupipe" + ALLOW
)


class Project:
    def __init__(
        self,
        gke: ClusterManagerEmulator,
        compute: ComputeEmulator,
        storage: StorageEmulator,
        projects: ResourceManagerEmulator,
        cloudbuild: CloudBuildEmulator,
        kube: KubeEmulator,
        env: dict[str, str],
    ):
        self.gke, self.compute, self.storage, self.projects, self.kube = gke, compute, storage, projects, kube
        self.cloudbuild = cloudbuild
        self.env = env
        self.extras: list = []  # emulators added on top (Vertex AI, the KFP registry), stopped first

    def stop(self) -> None:
        for emulator in (
            *self.extras,
            self.tokens,
            self.gke,
            self.compute,
            self.storage,
            self.projects,
            self.cloudbuild,
            self.registry,
            self.services,
            self.kube,
        ):
            emulator.stop()

    def mutations(self) -> list[str]:
        """Every call that reached an emulator and changes something (creates, updates, deletes, grants, builds),
        in each emulator's order: none before preflight passes."""
        grpc_calls = [
            *self.gke.state.calls,
            *self.cloudbuild.state.calls,
            *self.registry.state.calls,
            *self.projects.calls,
            *self.services.calls,
        ]
        with self.storage._lock:
            storage = [c for c in self.storage.state.calls if c.endswith((".insert", ".delete", ".setIamPolicy"))]
        with self.kube.lock:
            objects = [f"kubernetes {p}/{n}" for (p, _, n) in self.kube.objects]
        with self.bigquery._lock:  # a job (billed), a dataset, a table changed or deleted
            bigquery = [f"bigquery {c}" for c in self.bigquery.calls if c in BIGQUERY_MUTATIONS]
        return (
            [c for c in grpc_calls if c.startswith(("Create", "Update", "Delete", "Set", "Cancel", "Enable"))]
            + self.compute.mutations()
            + storage
            + objects
            + bigquery
        )

    def clusters(self, run_id: str) -> list[str]:
        return self.gke.clusters_labelled("tpupipe-run", run_id)

    def pools(self, run_id: str) -> list[str]:
        return self.gke.pools_labelled("tpupipe-run", run_id)

    def leftovers(self, run_id: str) -> dict[str, list]:
        """What of the run any emulator still holds (empty when nothing): clusters, node pools, Kubernetes objects
        labelled with the run, Compute Engine resources named after it, its bucket bindings, unfinished builds, and
        the local processes that play its Ray cluster."""
        from components.platforms.local.processes import run_processes
        from components.spec import names
        from tests.emulators.cloudbuild import FINISHED, Status

        with self.kube.lock:
            objects = [
                f"{p}/{n}"
                for (p, _, n), o in self.kube.objects.items()
                if o.get("metadata", {}).get("labels", {}).get(names.RUN_LABEL) == run_id
            ]
        titles = (f"tpupipe run {run_id}", f"tpupipe run {run_id}: cache")  # the run's (plan.target.binding_titles)
        with self.storage._lock:
            members = [
                m
                for policy in self.storage.state.policies.values()
                for b in policy.get("bindings", [])
                for m in b["members"]
                if (b.get("condition") or {}).get("title") in titles
            ]
        with self.cloudbuild._lock:
            builds = [
                i
                for i, b in self.cloudbuild.state.builds.items()
                if names.build_tag(run_id) in b.tags and Status(b.status) not in FINISHED
            ]
        found = {
            "clusters": list(self.gke.state.clusters),
            "node pools": self.pools(run_id),
            "kubernetes": objects,
            "compute": [
                n
                for kind in ("networks", "subnetworks", "firewalls", "resourcePolicies")
                for n in self.compute.names(kind)
                if run_id in n
            ],
            "bucket bindings": members,
            "builds": builds,
            "processes": run_processes(run_id),
        }
        return {k: v for k, v in found.items() if v}

    def rayclusters(self, run_id: str) -> list[str]:
        with self.kube.lock:
            return [
                n
                for (p, _, n), o in self.kube.objects.items()
                if p == "rayclusters" and o["metadata"].get("labels", {}).get("tpupipe-run") == run_id
            ]


@functools.cache
def crd_validator():
    """The KubeRay and Kueue CRD schemas, read once (the CRD files are large)."""
    from tests.contract.kuberay_schema import KUEUE_SCHEMA_DIR, CrdValidator, schema_dir

    return CrdValidator(schema_dir(), KUEUE_SCHEMA_DIR)


def _written(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def start_project(tmp_path, fault: str = "", ray: bool = False, polls_to_done: int = 2, vertex: bool = False):
    validator = crd_validator()
    ray_env = None
    if ray:
        from components.platforms.local import envs

        ray_env = envs.ensure_env("torch")
    token = TokenIssuer()
    token.start()
    adc = token.adc_file(Path(tmp_path) / "adc" / "application_default_credentials.json")
    # The buckets' objects are files under tmp_path/buckets/<bucket>, which the emulated pods' processes reach where
    # their Cloud Storage FUSE volumes mount the bucket (or a directory of it): one world, as on GKE.
    storage = StorageEmulator({PROJECT: PROJECT_NUMBER}, token=token, root=tmp_path / "buckets")
    kube = KubeEmulator(
        tmp_path / "kube", token, validator, ray_env=ray_env, fault=fault, bucket_dir=storage.bucket_dir
    )
    kube.start()
    compute = ComputeEmulator(token=token, polls_to_done=polls_to_done)
    gke = ClusterManagerEmulator(
        kube_endpoint=kube.endpoint, kube_ca_pem=kube.ca_pem, polls_to_done=polls_to_done, compute=compute
    )
    gke.on_cluster_deleted.append(lambda cluster: kube.delete_run(cluster.resource_labels.get(names.RUN_LABEL, "")))
    kube.provisioner.pools = gke.queued_pools  # a ProvisioningRequest is fulfilled within one of them
    kube.scale_up_stockout = gke.scale_up_stockout  # the autoscaler cannot grow a flex-start pool GKE has no TPUs for
    projects = ResourceManagerEmulator({PROJECT: PROJECT_NUMBER})
    registry = ArtifactRegistryEmulator(polls_to_done=polls_to_done)
    cloudbuild = CloudBuildEmulator(storage=storage, polls_to_done=polls_to_done, registry=registry)
    env = {
        "TPUPIPE_GKE_EMULATOR_HOST": gke.start(),
        "GOOGLE_APPLICATION_CREDENTIALS": str(adc),
        "TPUPIPE_GKE_EMULATOR_TOKEN_URI": f"{token.endpoint}/token",
        "TPUPIPE_COMPUTE_EMULATOR_HOST": compute.start(),
        "STORAGE_EMULATOR_HOST": storage.start(),
        "TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST": projects.start(),
        "TPUPIPE_CLOUD_BUILD_EMULATOR_HOST": cloudbuild.start(),
        "TPUPIPE_ARTIFACT_REGISTRY_EMULATOR_HOST": registry.start(),
        # The CA the emulated DNS-based endpoint's certificate chains to (Google's chains to public roots).
        DNS_CA_ENV: str(_written(tmp_path / "kube" / "pki" / "ca.crt", kube.ca_pem)),
    }
    env["TPUPIPE_IAM_EMULATOR_HOST"] = env["TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST"]  # the IAM API, same server
    services = ServiceUsageEmulator({PROJECT: PROJECT_NUMBER})
    env["TPUPIPE_SERVICE_USAGE_EMULATOR_HOST"] = services.start()
    project = Project(gke, compute, storage, projects, cloudbuild, kube, env)
    project.registry = registry
    project.services = services
    project.tokens = token
    project.token = token.mint()  # one of its tokens, for a test's own client (it lives the issuer's lifetime)
    project.models = ModelServiceEmulator(token=token)  # the runs' model registry (gke runs register there)
    project.bigquery = BigQueryEmulator(token=token)  # the datasets' tables (train.dataset=bq://...)
    env[BIGQUERY_EMULATOR_HOST_ENV] = project.bigquery.start()
    project.extras.append(project.bigquery)
    project.bigquery_storage = BigQueryStorageEmulator(project.bigquery)  # its Storage Read API, the same tables
    env[BIGQUERY_STORAGE_EMULATOR_HOST_ENV] = project.bigquery_storage.start()
    project.extras.append(project.bigquery_storage)
    if vertex:
        _add_vertex(project, tmp_path)
    else:
        env[VERTEX_ENDPOINT_ENV] = project.models.start()
        project.extras.append(project.models)
    return project


def _add_vertex(project: Project, tmp_path) -> None:
    """Vertex AI Pipelines and the KFP template registry on top: ``project.vertex``, ``project.kfp``. The tasks it
    runs get the emulators' endpoints in their environment, as Vertex tasks get Google's, and run in the components
    image's environment (images/pipeline's requirements alone, by content hash, as ``tpupipe env pipeline`` makes it),
    not this test's: a package the components import that the image lacks fails the run."""
    from components.platforms.local import envs
    from tests.emulators.artifactregistry import KfpRegistryEmulator
    from tests.emulators.vertex import VertexEmulator

    project.kfp = KfpRegistryEmulator(project.registry, REGION, token=project.tokens)
    project.env["TPUPIPE_KFP_REGISTRY_HOST"] = project.kfp.start()
    # The tasks import this source tree's components, as its published components image holds them (an environment
    # built elsewhere may hold another tree's), as the KFP emulator's tasks do (tests/kfp/conftest.py).
    task_env = {**project.env, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    project.vertex = VertexEmulator(
        project.storage,
        project.registry,
        task_env,
        # Built (once, by content hash) before any job starts, so no job's wait includes pip's minutes.
        python_bin=envs.ensure_env("pipeline").bin,
        workdir=tmp_path,
        token=project.tokens,
        models=project.models,
    )
    project.vertex.backoff_scale = 0.01  # a retry's 30 s backoff: 0.3 s here
    # Every task, and this process, reach Vertex AI (pipelines and the Model Registry) at the emulator.
    project.env[VERTEX_ENDPOINT_ENV] = task_env[VERTEX_ENDPOINT_ENV] = project.vertex.start()
    project.extras += [project.vertex, project.kfp]
