"""The gke platform: the run's plan executed on GKE (``components.plan`` lists what it creates).

- provision: get-or-create the Compute Engine resources of the plan (the DCN networks and subnets of multislice
  ``dcn_networks`` plans, the TPU7x workload policy; ``components.gke_compute``), then the GKE cluster (with its CPU
  pool for the Ray head) and one TPU node pool per slice, each labelled ``tpupipe-run: <run id>``; a stockout or
  quota error ends the stage with one clear message naming zone, accelerator and count, after deleting what this
  run created;
- provision also gets or creates the checkpoint bucket (kept after the run) and grants the run's Kubernetes
  ServiceAccount access to it (``components.gke_storage``);
- build_image: the trainer image named by ``gke.image``, or else built by Cloud Build from ``images/<name>/``
  and pushed to Artifact Registry (``components.gke_build``);
- deploy_raycluster: the Kubernetes client from the cluster's endpoint, CA certificate and a Google access token;
  the namespace, ServiceAccount, ResourceClaimTemplate (multislice), the Hugging Face token Secret (from $HF_TOKEN
  when the cluster has none), the Ray token Secret, then the RayCluster by server-side apply with Ray token
  authentication on; waits for every worker, failing fast with the pod's reason;
- jobs: the Ray Jobs API through the API server's service proxy to the head's dashboard port;
- teardown: everything with the run's label (RayCluster, RayJob, Secrets, ServiceAccount, node pools, the cluster
  when the run created it), the run's binding on the bucket, then the run's Compute Engine resources (named from
  the run id: they take no labels); not found is success.

The run's ledger (``<run dir>/gke.json``) records every cloud resource before the run waits on it. Heavy imports
(google-cloud, kubernetes, ray) stay inside functions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from components import derivations as d
from components import manifests as m
from components import names
from components.platform import RunContext
from components.spec import SpecError

HF_TOKEN_ENV = "HF_TOKEN"
# With the emulators: the local directory that plays the bucket mounted at /data in every pod (GCS FUSE).
MOUNT_ROOT_ENV = "TPUPIPE_GKE_MOUNT_ROOT"
UNSCHEDULABLE_GRACE_ENV = "TPUPIPE_GKE_UNSCHEDULABLE_GRACE_S"
DEFAULT_UNSCHEDULABLE_GRACE_S = 120.0


class GkePlatform:
    name = "gke"

    def __init__(self, log=print, poll_s: float = 5.0):
        self.log = log
        self.poll_s = poll_s

    # ---------------------------------------------------------------- the ledger
    @staticmethod
    def ledger_path(ctx: RunContext) -> Path:
        return ctx.run_dir / "gke.json"

    def _ledger(self, ctx: RunContext) -> dict[str, Any]:
        path = self.ledger_path(ctx)
        return json.loads(path.read_text()) if path.is_file() else {"run_id": ctx.run_id, "created": []}

    def _save(self, ctx: RunContext, ledger: dict[str, Any]) -> None:
        from components.local import save_ledger

        save_ledger(self.ledger_path(ctx), ledger)

    def _recorder(self, ctx: RunContext, ledger: dict[str, Any]):
        def record(kind: str, name: str) -> None:
            if {"kind": kind, "name": name} not in ledger["created"]:
                ledger["created"].append({"kind": kind, "name": name})
                self._save(ctx, ledger)
        return record

    # ---------------------------------------------------------------- checks
    def check(self, ctx: RunContext) -> None:
        spec = ctx.spec
        if not d.is_tpu(spec):
            raise SpecError("cluster.accelerator", "the gke platform runs on TPU slices; cpu hosts run on the local "
                            "platform (platform=local)", ["v5e", "v5p", "v6e", "tpu7x"])
        if not spec.gke.project:
            raise SpecError("gke.project", "required on the gke platform", ["a GCP project id"])
        if not spec.gke.image and d.WORKLOAD_IMAGES[spec.train.workload] == "torch" and not spec.gke.torch_tpu_base:
            raise SpecError("gke.torch_tpu_base", "the run builds the torch trainer image (gke.image is empty), and on "
                            "TPU hosts it must be built FROM the TorchTPU base image (torch, torch_tpu, libtpu): name "
                            "it, or name a built image in gke.image", ["REGISTRY/PATH/TORCH_TPU_BASE:TAG"])

    def _target(self, ctx: RunContext) -> d.Target:
        return d.target(ctx.spec, ctx.run_id)

    def _gke(self, creds=None):
        from components import gke_cluster

        return gke_cluster.Gke(gke_cluster.cluster_manager(creds), log=self.log, poll_s=self.poll_s)

    def _compute(self, creds=None):
        from components import gke_compute

        return gke_compute.Compute(gke_compute.clients(creds), log=self.log, poll_s=min(self.poll_s, 2.0))

    @staticmethod
    def compute_resources(spec, t: d.Target) -> list[tuple[str, str, dict[str, Any]]]:
        """(kind, path, body) of the Compute Engine resources the plan needs, in creation order: the DCN networks,
        each followed by its subnet, then the TPU7x workload policy. Deleted in the reverse order."""
        from components.gke_compute import path

        out = []
        for net in d.dcn_networks(spec, t):
            out.append(("network", path("network", t.project, net["network"]["name"]), net["network"]))
            out.append(("subnetwork", path("subnetwork", t.project, net["subnetwork"]["name"], t.region),
                        net["subnetwork"]))
        policy = d.workload_policy(spec, t)
        if policy:
            out.append(("resource_policy", path("resource_policy", t.project, policy["name"], t.region), policy))
        return out

    # ---------------------------------------------------------------- provision
    def provision(self, ctx: RunContext) -> dict[str, Any]:
        from components import gke_cluster

        self.check(ctx)
        spec, t = ctx.spec, self._target(ctx)
        ledger = self._ledger(ctx)
        ledger.update({"parent": t.parent, "cluster": f"{t.parent}/clusters/{t.cluster}",
                       "owns_cluster": t.owns_cluster, "namespace": t.namespace})
        self._save(ctx, ledger)
        record = self._recorder(ctx, ledger)
        creds = gke_cluster.credentials()
        gke = self._gke(creds)
        compute_resources = self.compute_resources(spec, t)
        compute = self._compute(creds) if compute_resources else None
        cluster_name = ledger["cluster"]
        for kind, path, body in compute_resources:
            try:
                compute.ensure(kind, path, body, record)
            except gke_cluster.CapacityError as exc:
                self.log(f"provision: no quota: {exc}; deleting what this run created")
                self._delete_created(gke, compute, ledger, t)
                raise gke_cluster.CapacityError(
                    f"no quota for the {kind.replace('_', ' ')} {path.rsplit('/', 1)[-1]} in {t.region} of project "
                    f"{t.project}: {exc}. Nothing this run created is left. Raise the quota" +
                    (", or use gke.multislice_network=accelerator_network_profile (no extra networks)."
                     if kind != "resource_policy" else ".")
                ) from None
        self._grant_bucket(t, creds, record)
        try:
            if t.owns_cluster:
                cluster = gke.ensure_cluster(t.parent, d.cluster(spec, t), record)
            else:
                cluster = gke.get_cluster(cluster_name)
                if cluster is None:
                    raise SpecError("gke.cluster_name", f"no cluster {t.cluster} in {t.location} of project "
                                                        f"{t.project}")
            pools = [gke.ensure_node_pool(cluster_name, body, record).name for body in d.tpu_node_pools(spec, t)]
        except gke_cluster.CapacityError as exc:
            shape = d.slice_shape(spec)
            self.log(f"provision: no capacity: {exc}; deleting what this run created")
            self._delete_created(gke, compute, ledger, t)
            raise gke_cluster.CapacityError(
                f"no capacity for {spec.cluster.num_slices} x {shape.num_chips} {shape.family.name} chips "
                f"({spec.cluster.num_slices * shape.num_hosts} x {shape.machine_type}, topology {shape.topology}, "
                f"{spec.cluster.capacity}) in zone {t.zone}: {exc}. Nothing this run created is left. Try another zone "
                f"(gke.zone), another capacity type (cluster.capacity=spot, reservation or flex-start) or later."
            ) from None
        return {"cluster": cluster_name, "endpoint": cluster.endpoint, "node_pools": pools,
                "created": [c["name"] for c in ledger["created"]]}

    def _storage(self, t: d.Target, creds=None):
        from components import gke_storage

        return gke_storage.Storage(gke_storage.storage_client(t.project, creds), log=self.log)

    def _bucket_member(self, t: d.Target, creds=None) -> tuple[str, str]:
        """(role, member) of the run's binding on the bucket, the project number looked up."""
        from components import gke_storage

        binding = d.bucket_binding(t)
        return binding["role"], gke_storage.member(binding, gke_storage.project_number(t.project, creds))

    def _grant_bucket(self, t: d.Target, creds, record) -> None:
        """The checkpoint bucket (got or created, kept after the run) and the run's access to it."""
        storage = self._storage(t, creds)
        storage.ensure_bucket(t.bucket, t.region)
        role, who = self._bucket_member(t, creds)
        record("iam_binding", who)
        storage.add_binding(t.bucket, role, who)

    def _revoke_bucket(self, t: d.Target, who: str = "") -> list[str]:
        """Remove the run's binding on the bucket: ``who`` as recorded, else looked up again."""
        role, who = (d.bucket_binding(t)["role"], who) if who else self._bucket_member(t)
        if self._storage(t).remove_binding(t.bucket, role, who):
            return [f"{role} on gs://{t.bucket} for {who}"]
        return []

    def _delete_created(self, gke, compute, ledger: dict[str, Any], target: d.Target) -> list[str]:
        """Delete what the ledger says this run created, newest first (node pools go with their cluster)."""
        deleted = []
        has_cluster = any(e["kind"] == "cluster" for e in ledger["created"])
        for entry in reversed(ledger["created"]):
            kind, name = entry["kind"], entry["name"]
            if kind == "node_pool" and not has_cluster:
                gone = gke.delete_node_pool(name)
            elif kind == "cluster":
                gone = gke.delete_cluster(name)
            elif kind in ("network", "subnetwork", "resource_policy"):
                gone = (compute or self._compute()).delete(kind, name)
            elif kind == "iam_binding":
                deleted += self._revoke_bucket(target, name)
                continue
            else:
                continue
            if gone:
                deleted.append(name)
        return deleted

    # ---------------------------------------------------------------- build_image
    def build_image(self, ctx: RunContext) -> dict[str, Any]:
        from components import gke_build, gke_cluster

        self.check(ctx)
        spec, t = ctx.spec, self._target(ctx)
        if spec.gke.image:
            self.log(f"trainer image: {t.image} (gke.image)")
            return {"image": t.image, "built": False}
        creds = gke_cluster.credentials()
        image = d.WORKLOAD_IMAGES[spec.train.workload]
        gke_build.Registry(gke_build.registry_client(creds), log=self.log, poll_s=min(self.poll_s, 2.0)).ensure(
            t.project, t.region, spec.gke.artifact_repository)
        self._storage(t, creds).upload(t.bucket, names.build_source(ctx.run_id), gke_build.build_context(image),
                                       content_type="application/gzip")
        ledger = self._ledger(ctx)
        builder = gke_build.CloudBuild(gke_build.client(creds), t.project, t.region, log=self.log,
                                       poll_s=min(self.poll_s, 10.0))
        build = builder.ensure(d.cloud_build(spec, t), names.build_tag(ctx.run_id), self._recorder(ctx, ledger),
                               timeout_s=d.BUILD_TIMEOUT_S + 600)
        digest = build.results.images[0].digest if build.results.images else ""
        return {"image": t.image, "built": True, "build": build.id, "digest": digest}

    # ---------------------------------------------------------------- Kubernetes
    def _kube(self, ctx: RunContext):
        import base64

        from components import gke_cluster, gke_kube

        ledger = self._ledger(ctx)
        cluster_name = ledger.get("cluster") or f"{self._target(ctx).parent}/clusters/{self._target(ctx).cluster}"
        creds = gke_cluster.credentials()
        cluster = self._gke(creds).get_cluster(cluster_name)
        if cluster is None or not cluster.endpoint:
            return None, None, None
        token = gke_cluster.access_token(creds)
        ca_pem = base64.b64decode(cluster.master_auth.cluster_ca_certificate)
        api = gke_kube.api_client(cluster.endpoint, ca_pem, token, ctx.run_dir / "gke")
        namespace = ledger.get("namespace") or ctx.spec.gke.namespace
        return gke_kube.Kube(api, namespace, log=self.log), cluster, token

    def deploy_raycluster(self, ctx: RunContext) -> dict[str, Any]:
        from components import gke_kube

        self.check(ctx)
        spec, t = ctx.spec, self._target(ctx)
        kube, cluster, _ = self._kube(ctx)
        if kube is None:
            raise RuntimeError(f"no running cluster {t.cluster} for run {ctx.run_id}: provision did not finish")
        kube.ensure_namespace()
        kube.ensure(m.service_account(t))
        claim = m.dcn_claim_template(spec, t)
        if claim:
            kube.ensure(claim)
        if spec.gke.hf_secret and kube.secret(spec.gke.hf_secret) is None:
            value = os.environ.get(HF_TOKEN_ENV, "")
            if not value:
                raise SpecError("gke.hf_secret", f"no Secret {spec.gke.hf_secret} in namespace {t.namespace} and "
                                                 f"${HF_TOKEN_ENV} is not set: set it, or gke.hf_secret= (empty) "
                                                 "for models that need no token")
            import base64

            kube.ensure({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                         "metadata": {"name": spec.gke.hf_secret, "namespace": t.namespace,
                                      "labels": names.labels(ctx.run_id)},
                         "data": {m.HF_TOKEN_KEY: base64.b64encode(value.encode()).decode()}})
        token_secret = names.ray_token_secret(ctx.run_id)
        if kube.secret(token_secret) is None:
            kube.ensure(gke_kube.ray_token_secret(token_secret, t.namespace, names.labels(ctx.run_id),
                                                  gke_kube.new_ray_token()))
        raycluster = m.raycluster(spec, t)
        kube.apply(raycluster)
        name = raycluster["metadata"]["name"]
        grace = float(os.environ.get(UNSCHEDULABLE_GRACE_ENV, DEFAULT_UNSCHEDULABLE_GRACE_S))
        ready = gke_kube.wait_ready(kube, name, spec.cluster.ready_timeout_s, unschedulable_grace_s=grace,
                                    poll_s=min(self.poll_s, 2.0), log=self.log)
        status = ready.get("status", {})
        self.log(f"RayCluster {name} ready: {status.get('availableWorkerReplicas')} of "
                 f"{status.get('desiredWorkerReplicas')} workers available")
        return {"raycluster": name, "namespace": t.namespace, "endpoint": cluster.endpoint,
                "available_workers": status.get("availableWorkerReplicas")}

    def job_client(self, ctx: RunContext):
        from components import gke_kube

        kube, cluster, token = self._kube(ctx)
        if kube is None:
            raise RuntimeError(f"no running cluster for run {ctx.run_id}")
        ray_token = (kube.secret(names.ray_token_secret(ctx.run_id)) or {}).get(gke_kube.RAY_TOKEN_KEY, "")
        return gke_kube.job_client(cluster.endpoint, ctx.run_dir / "gke" / "cluster-ca.crt", kube.namespace,
                                   names.raycluster(ctx.run_id), token, ray_token)

    def job_output_dir(self, ctx: RunContext) -> str:
        return os.environ.get(MOUNT_ROOT_ENV, "") + self._target(ctx).run_dir

    # ---------------------------------------------------------------- teardown
    def teardown(self, ctx: RunContext) -> dict[str, Any]:
        try:
            self.check(ctx)
        except SpecError as exc:  # provision checks first: a run that fails the checks created nothing
            self.log(f"teardown: nothing to delete: the run never got past its checks ({exc})")
            return {"deleted": [], "kept_cluster": None}
        ledger = self._ledger(ctx)
        t = self._target(ctx)
        parent = ledger.get("parent") or t.parent
        cluster_name = ledger.get("cluster") or f"{parent}/clusters/{t.cluster}"
        owns = ledger.get("owns_cluster", t.owns_cluster)
        selector = f"{names.RUN_LABEL}={ctx.run_id}"
        deleted: list[str] = []
        gke = self._gke()
        cluster = gke.get_cluster(cluster_name)
        if cluster is not None and cluster.endpoint:
            kube, _, _ = self._kube(ctx)
            if kube is not None:
                deleted += kube.delete_labelled(selector)
        if cluster is not None and not owns:  # a cluster the spec names is kept: only the run's pools go
            for pool in gke.pools_with_label(cluster_name, names.RUN_LABEL, ctx.run_id):
                if gke.delete_node_pool(pool):
                    deleted.append(pool)
        for name in gke.clusters_with_label(parent, names.RUN_LABEL, ctx.run_id) if owns else []:
            if gke.delete_cluster(name):
                deleted.append(name)
        if owns:  # recorded but not (yet) labelled, or in another location: the ledger finds it
            for entry in ledger.get("created", []):
                if entry["kind"] == "cluster" and entry["name"] not in deleted and gke.delete_cluster(entry["name"]):
                    deleted.append(entry["name"])
        failures = []
        try:
            deleted += self._revoke_bucket(t)  # the bucket itself is kept: it holds every run's checkpoints
        except Exception as exc:  # noqa: BLE001 - teardown goes on to the networks, then reports
            failures.append(f"the run's binding on gs://{t.bucket}: {exc}")
        # Compute Engine resources take no labels: their names derive from the run id (and the ledger has them).
        planned = [(kind, path) for kind, path, _ in self.compute_resources(ctx.spec, t)]
        recorded = [(e["kind"], e["name"]) for e in ledger.get("created", []) if e["kind"] in
                    ("network", "subnetwork", "resource_policy")]
        compute_paths = list(dict.fromkeys(recorded + planned))
        if compute_paths:
            compute = self._compute()
            for kind, path in reversed(compute_paths):
                if compute.delete(kind, path):
                    deleted.append(path)
        self.log(f"teardown: deleted {len(deleted)} resources of {ctx.run_id}" +
                 (": " + ", ".join(x.rsplit("/", 1)[-1] for x in deleted) if deleted else ""))
        if failures:
            raise RuntimeError("teardown could not remove: " + "; ".join(failures))
        return {"deleted": deleted, "kept_cluster": None if owns else cluster_name}
