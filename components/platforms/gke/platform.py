"""The gke platform: the run's plan executed on GKE. Each stage walks the plan's records of its kinds
(``plan.resources``, in creation order) through one handler per kind (``HANDLERS``); every handler records what it
creates in the run's ledger before it waits on it.

- provision: first preflight (``preflight``: quota, reservation, APIs, permissions, the nodes' service account's roles,
  an existing cluster's features; every problem in one report, nothing created), then the Compute Engine resources
  (the DCN networks, subnets and firewall rules of multislice ``dcn_networks`` plans, the TPU7x workload policy), the
  checkpoint bucket (got or created, kept) and the run's Workload Identity binding on it, the GKE cluster (with the
  Ray head's CPU pool) or the existing one named (what it lacks that GKE enables in place enabled first,
  ``features``), and one TPU node pool per slice, each labelled ``tpupipe-run: <run id>``; a stockout or quota error
  ends the stage with one message naming what, where and what to try, after deleting what this run created;
- build_image: the trainer image named by ``gke.image``, or built by Cloud Build from ``images/<name>/`` and pushed to
  Artifact Registry (the repository got or created first);
- deploy_raycluster: the namespace, ServiceAccount, ResourceClaimTemplate (multislice), the Hugging Face token Secret
  (from $HF_TOKEN when the namespace has none), the Ray token Secret, then the RayCluster by server-side apply, with
  Ray token authentication on; waits for every worker, failing fast with the pod's reason;
- jobs: the Ray Jobs API through the API server's service proxy to the head's dashboard port;
- teardown: newest first, the run's Kubernetes objects (by label), its node pools or cluster (by label and ledger),
  its binding on the bucket, its Compute Engine resources (by ledger and derived name); not found is success;
- dry_run: the same walk printed, with the job commands and teardown's deletes.

Heavy imports (google-cloud, kubernetes, ray) stay inside functions.
"""

from __future__ import annotations

import os
import time
from typing import Any

from components.platforms import RunContext
from components.platforms import ledger as ledgers
from components.platforms.gke import features, plan
from components.platforms.gke import manifests as m
from components.platforms.gke import resources as r
from components.spec import InfraError, SpecError, names, ready_limits
from components.workload import derive as d

HF_TOKEN_ENV = "HF_TOKEN"
# With the emulators: the local directory that plays the bucket mounted at /data in every pod (GCS FUSE).
MOUNT_ROOT_ENV = "TPUPIPE_GKE_MOUNT_ROOT"
# The unschedulable grace of readiness, in seconds, over the capacity type's (components.spec.READY_LIMITS_S).
UNSCHEDULABLE_GRACE_ENV = "TPUPIPE_GKE_UNSCHEDULABLE_GRACE_S"


class GkePlatform:
    name = "gke"

    def __init__(self, log=print, poll_s: float = 5.0):
        self.log = log
        self.poll_s = poll_s

    # ---------------------------------------------------------------- the ledger
    def _ledger(self, ctx: RunContext) -> dict[str, Any]:
        return ledgers.load(ctx.store) or {"run_id": ctx.run_id, "platform": "gke", "created": []}

    def _save(self, ctx: RunContext, ledger: dict[str, Any]) -> None:
        ledgers.save(ctx.store, ledger)

    def _recorder(self, ctx: RunContext, ledger: dict[str, Any]):
        return ledgers.recorder(ctx.store, ledger)

    # ---------------------------------------------------------------- checks
    def check(self, ctx: RunContext) -> None:
        spec = ctx.spec
        if not d.is_tpu(spec):
            raise SpecError(
                "cluster.accelerator",
                "the gke platform runs on TPU slices; cpu hosts run on the local platform (platform=local)",
                ["v5e", "v5p", "v6e", "tpu7x"],
            )
        if not spec.gke.project:
            raise SpecError("gke.project", "required on the gke platform", ["a GCP project id"])
        if spec.gke.image and spec.gke.torch_tpu_base:
            raise SpecError(
                "gke.torch_tpu_base",
                f"builds the torch image FROM a base, but gke.image={spec.gke.image} "
                "names a built one and nothing is built",
                ["", "with gke.image empty"],
            )
        r.check_ranges(spec, self._target(ctx))

    def _target(self, ctx: RunContext) -> r.Target:
        return r.target(ctx.spec, ctx.run_id)

    def _gke(self, creds=None):
        from components.platforms.gke import cluster as gke_cluster

        return gke_cluster.Gke(gke_cluster.cluster_manager(creds), log=self.log, poll_s=self.poll_s)

    def _compute(self, creds=None):
        from components.platforms.gke import compute as gke_compute

        return gke_compute.Compute(gke_compute.clients(creds), log=self.log, poll_s=min(self.poll_s, 2.0))

    # ---------------------------------------------------------------- the walk
    def records(self, ctx: RunContext, stage: str) -> list[plan.Resource]:
        """The plan's records that ``stage`` creates, in plan order: what the stage applies and the dry run prints."""
        return [res for res in plan.resources(ctx.spec, ctx.run_id) if res.stage == stage]

    def _walk(self, ctx: RunContext, stage: str) -> _Session:
        """Apply the stage's records in order through each kind's handler, after the stage's checks of what is there
        (``BEFORE``); every handler records what it creates in the ledger before it waits on it."""
        self.check(ctx)
        from components.platforms.gke.cluster import CapacityError

        session = _Session(self, ctx)
        if stage in BEFORE:
            BEFORE[stage](session)
        for res in self.records(ctx, stage):
            try:
                HANDLERS[res.kind](session, res)
            except CapacityError as exc:
                exc.resource = res  # the message names what had no capacity or quota
                raise
        return session

    # ---------------------------------------------------------------- provision
    def provision(self, ctx: RunContext) -> dict[str, Any]:
        from components.platforms.gke import cluster as gke_cluster

        self.check(ctx)  # before anything is derived or recorded: bad input creates nothing
        t = self._target(ctx)
        ledger = self._ledger(ctx)
        if not ledger.get("created") or ledger.get("torn_down"):  # one that resumes passed preflight when it started
            self.preflight(ctx)
            ledger["started"] = time.time()  # the janitor measures a run's age from here
        ledger.setdefault("started", time.time())
        ledger.update(
            {
                "parent": t.parent,
                "cluster": f"{t.parent}/clusters/{t.cluster}",
                "owns_cluster": t.owns_cluster,
                "namespace": t.namespace,
                "spec": ctx.spec.to_dict(),
            }
        )
        ledger.pop("torn_down", None)
        self._save(ctx, ledger)
        try:
            session = self._walk(ctx, "provision")
        except gke_cluster.CapacityError as exc:
            self.log(f"provision: no capacity or quota: {exc}; deleting what this run created")
            creds = gke_cluster.credentials()
            self._delete_created(self._gke(creds), None, self._ledger(ctx), t)
            raise gke_cluster.CapacityError(
                _capacity_message(ctx.spec, t, exc, getattr(exc, "resource", None))
            ) from None
        cluster = session.cluster
        return {
            "cluster": ledger["cluster"],
            "endpoint": cluster.endpoint if cluster else "",
            "node_pools": session.tpu_pools,
            "created": [c["name"] for c in self._ledger(ctx)["created"]],
        }

    def preflight(self, ctx: RunContext):
        """Quota, reservation, APIs, permissions and an existing cluster's features, all checked before anything is
        created; :class:`preflight.PreflightFailed` lists every problem."""
        from components.platforms.gke import preflight

        self.check(ctx)
        return preflight.check(ctx.spec, ctx.run_id, log=self.log)

    def _storage(self, t: r.Target, creds=None):
        from components.platforms.gke import storage as gke_storage

        return gke_storage.Storage(gke_storage.storage_client(t.project, creds), log=self.log)

    def _bucket_member(self, t: r.Target, creds=None) -> tuple[str, str]:
        """(role, member) of the run's binding on the bucket, the project number looked up."""
        from components.platforms.gke import storage as gke_storage

        binding = r.bucket_binding(t)
        return binding["role"], gke_storage.member(binding, gke_storage.project_number(t.project, creds))

    def _revoke_bucket(self, t: r.Target, who: str = "") -> list[str]:
        """Remove the run's binding on the bucket: ``who`` as recorded, else looked up again."""
        role, who = (r.bucket_binding(t)["role"], who) if who else self._bucket_member(t)
        if self._storage(t).remove_binding(t.bucket, role, who):
            return [f"{role} on gs://{t.bucket} for {who}"]
        return []

    def _delete_created(self, gke, compute, ledger: dict[str, Any], target: r.Target) -> list[str]:
        """Delete what the ledger says this run created, newest first (node pools go with their cluster)."""
        deleted = []
        has_cluster = any(e["kind"] == "cluster" for e in ledger["created"])
        for entry in reversed(ledger["created"]):
            kind, name = entry["kind"], entry["name"]
            if kind == "node_pool" and not has_cluster:
                gone = gke.delete_node_pool(name)
            elif kind == "cluster":
                gone = gke.delete_cluster(name)
            elif kind in COMPUTE_KINDS.values():
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
        session = self._walk(ctx, "build_image")
        return session.image_result

    # ---------------------------------------------------------------- Kubernetes
    def _kube(self, ctx: RunContext):
        import base64

        from components.platforms.gke import cluster as gke_cluster
        from components.platforms.gke import kube as gke_kube

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
        session = self._walk(ctx, "deploy_raycluster")
        return session.deploy_result

    def job_client(self, ctx: RunContext):
        from components.platforms.gke import kube as gke_kube

        kube, cluster, token = self._kube(ctx)
        if kube is None:
            raise InfraError(f"no running cluster for run {ctx.run_id}")
        ray_token = (kube.secret(names.ray_token_secret(ctx.run_id)) or {}).get(gke_kube.RAY_TOKEN_KEY, "")
        return gke_kube.job_client(
            cluster.endpoint,
            ctx.run_dir / "gke" / "cluster-ca.crt",
            kube.namespace,
            names.raycluster(ctx.run_id),
            token,
            ray_token,
        )

    def job_output_dir(self, ctx: RunContext) -> str:
        return os.environ.get(MOUNT_ROOT_ENV, "") + self._target(ctx).run_dir

    def checkpoint_uri(self, ctx: RunContext, path: str) -> str:
        """The bucket's object path of a path under the pods' GCS FUSE mount (``/data/runs/<id>/...``)."""
        mounted = path.removeprefix(os.environ.get(MOUNT_ROOT_ENV, ""))
        if not mounted.startswith(r.MOUNT_PATH + "/"):
            return path
        return f"gs://{self._target(ctx).bucket}/{mounted.removeprefix(r.MOUNT_PATH + '/')}"

    def checkpoint_path(self, ctx: RunContext, uri: str) -> str:
        """A checkpoint in the run's bucket, as the pods see it through their GCS FUSE mount (``/data/...``)."""
        bucket = self._target(ctx).bucket
        if not uri.startswith(f"gs://{bucket}/"):
            raise SpecError(
                "train.init_from",
                f"checkpoint {uri} is outside the run's bucket gs://{bucket}, the one "
                f"the cluster mounts at {r.MOUNT_PATH}: copy it there, or set gke.bucket",
            )
        return os.environ.get(MOUNT_ROOT_ENV, "") + f"{r.MOUNT_PATH}/{uri.removeprefix(f'gs://{bucket}/')}"

    def registry_place(self, ctx: RunContext) -> dict[str, str]:
        """Vertex AI Model Registry of the run's project, in the region of its zone."""
        t = self._target(ctx)
        return {"project": t.project, "region": t.region}

    def hosts_lost(self, ctx: RunContext) -> int | None:
        return None  # a lost TPU host shows as a restart of Ray Train's worker group (restarts)

    # ---------------------------------------------------------------- teardown
    def teardown(self, ctx: RunContext) -> dict[str, Any]:
        """Delete what the run created, newest first: its Kubernetes objects (by the run label), its node pools or
        its cluster (by label and by the ledger), its binding on the bucket, its Compute Engine resources (by the
        ledger and by the names derived from the run id). Not found is success; what is shared (the namespace, the
        bucket, the image repository, a cluster the spec names) is kept."""
        try:
            self.check(ctx)
        except SpecError as exc:  # provision checks first: a run that fails the checks created nothing
            self.log(f"teardown: nothing to delete: the run never got past its checks ({exc})")
            return {"deleted": [], "kept_cluster": None}
        ledger = self._ledger(ctx)
        owns = ledger.get("owns_cluster", self._target(ctx).owns_cluster)
        cluster_name = ledger.get("cluster") or f"{self._target(ctx).parent}/clusters/{self._target(ctx).cluster}"
        deleted: list[str] = []
        failures: list[str] = []
        for step in (
            self._delete_kubernetes,
            self._delete_cluster_or_pools,
            self._delete_binding,
            self._delete_compute,
        ):
            try:
                deleted += step(ctx, ledger)
            except Exception as exc:  # noqa: BLE001 - teardown goes on with the next step, then reports
                failures.append(f"{step.__name__.removeprefix('_delete_').replace('_', ' ')}: {exc}")
        self.log(
            f"teardown: deleted {len(deleted)} resources of {ctx.run_id}"
            + (": " + ", ".join(x.rsplit("/", 1)[-1] for x in deleted) if deleted else "")
        )
        if failures:
            raise InfraError("teardown could not remove: " + "; ".join(failures))
        if ledgers.load(ctx.store) is not None:
            self._save(ctx, {**self._ledger(ctx), "torn_down": time.time()})
        return {"deleted": deleted, "kept_cluster": None if owns else cluster_name}

    def remaining(self, ctx: RunContext) -> list[str]:
        """What the run may still have, as its ledger says (read here, no call made); nothing once a teardown
        finished."""
        ledger = ledgers.load(ctx.store)
        if not ledger or ledger.get("torn_down") or not ledger.get("created"):
            return []
        return [
            f"{e['kind'].replace('_', ' ')} {e['name'].rsplit('/', 1)[-1]}" for e in reversed(ledger["created"])
        ] + [f"the Kubernetes objects labelled {names.RUN_LABEL}={ctx.run_id}"]

    def _delete_kubernetes(self, ctx: RunContext, ledger: dict[str, Any]) -> list[str]:
        """The run's Kubernetes objects, found by the run label (the namespace is shared and kept)."""
        cluster = self._gke().get_cluster(
            ledger.get("cluster") or f"{self._target(ctx).parent}/clusters/{self._target(ctx).cluster}"
        )
        if cluster is None or not cluster.endpoint:
            return []
        kube, _, _ = self._kube(ctx)
        return kube.delete_labelled(f"{names.RUN_LABEL}={ctx.run_id}") if kube is not None else []

    def _delete_cluster_or_pools(self, ctx: RunContext, ledger: dict[str, Any]) -> list[str]:
        """The cluster the run created (by label, and as recorded); in a cluster the spec names, the run's pools."""
        t, gke, deleted = self._target(ctx), self._gke(), []
        parent = ledger.get("parent") or t.parent
        cluster_name = ledger.get("cluster") or f"{parent}/clusters/{t.cluster}"
        if not ledger.get("owns_cluster", t.owns_cluster):
            if gke.get_cluster(cluster_name) is not None:
                deleted += [
                    p
                    for p in gke.pools_with_label(cluster_name, names.RUN_LABEL, ctx.run_id)
                    if gke.delete_node_pool(p)
                ]
            return deleted
        deleted += [c for c in gke.clusters_with_label(parent, names.RUN_LABEL, ctx.run_id) if gke.delete_cluster(c)]
        # Recorded but not (yet) labelled, or in another location: the ledger finds it.
        recorded = [e["name"] for e in ledger.get("created", []) if e["kind"] == "cluster"]
        return deleted + [c for c in recorded if c not in deleted and gke.delete_cluster(c)]

    def _delete_binding(self, ctx: RunContext, ledger: dict[str, Any]) -> list[str]:
        """The run's binding on the bucket; the bucket itself is kept: it holds every run's checkpoints."""
        return self._revoke_bucket(self._target(ctx))

    def _delete_compute(self, ctx: RunContext, ledger: dict[str, Any]) -> list[str]:
        """The DCN networks, subnets, firewall rules and workload policy, newest first. They take no labels: the ledger
        has them, and their names derive from the run id."""
        planned = [
            (COMPUTE_KINDS[res.kind], res.path)
            for res in plan.resources(ctx.spec, ctx.run_id)
            if res.kind in COMPUTE_KINDS
        ]
        recorded = [(e["kind"], e["name"]) for e in ledger.get("created", []) if e["kind"] in COMPUTE_KINDS.values()]
        paths = list(dict.fromkeys(recorded + planned))
        if not paths:
            return []
        compute = self._compute()
        return [path for kind, path in reversed(paths) if compute.delete(kind, path)]

    # ---------------------------------------------------------------- the dry run
    def dry_run(self, ctx: RunContext, entrypoint) -> list[str]:
        """The calls a run makes, stage by stage, in order, without credentials or network: the same records the
        stages walk, the job commands they submit (``entrypoint(mode)``), and what teardown deletes, newest first."""
        from components.platforms.gke import preflight

        self.check(ctx)
        records = plan.resources(ctx.spec, ctx.run_id)
        lines = []
        for stage in ("provision", "build_image", "deploy_raycluster"):
            lines.append(stage)
            if stage == "provision":  # preflight first: read-only calls, every problem reported before any create
                lines += [
                    f"  check         {api} {path} ({what})"
                    for api, path, what in preflight.reads(preflight.needs(ctx.spec, ctx.run_id))
                ]
            lines += [
                f"  {res.action:<13} {res.api} {res.path or res.name}".rstrip() for res in records if res.stage == stage
            ]
        spec, t = ctx.spec, self._target(ctx)
        registered = f"projects/{t.project}/locations/{t.region}/models/{spec.model_name}"
        reads = {}  # what a stage reads from the model registry before it submits its job
        if spec.init_from_ref:
            name, ref = spec.init_from_ref
            reads["train"] = f"{registered.rsplit('/', 1)[0]}/{name}@{ref} (train.init_from)"
        if spec.gate.register:
            reads["evaluate"] = f"{registered}@champion (measured beside the new model)"
        jobs = (("check_slice", "check"),) if spec.cluster.slice_check else ()
        for stage, mode in (*jobs, ("train", "train"), ("evaluate", "eval")):
            submission = names.job_submission_id(ctx.run_id, stage)
            lines.append(stage)
            if stage in reads:
                lines.append(f"  read          aiplatform.models.get {reads[stage]}")
            lines.append(f"  submit        ray.jobs.submit {submission}: {entrypoint(mode)}")
        if spec.gate.register:
            lines += [
                "register",
                f"  upload        aiplatform.models.upload {registered} (a new version, its provenance)",
                "promote",
                f"  alias         aiplatform.models.mergeVersionAliases {registered}@<the new version> champion "
                "(only when the gate promotes)",
            ]
        lines.append("teardown")
        for res in reversed(records):
            if res.deleted_by_teardown and res.action != "use" and _deletes(res, ctx):
                lines.append(f"  delete        {_deletes(res, ctx)} {res.path or res.name}")
        return lines


def _capacity_message(spec, t: r.Target, exc: Exception, res: plan.Resource | None) -> str:
    """One error naming what had no capacity or quota, where, and what to try; nothing the run created is left."""
    shape = d.slice_shape(spec)
    if res is not None and res.kind in COMPUTE_KINDS:
        kind = COMPUTE_KINDS[res.kind]
        where = "" if r.COMPUTE_COLLECTIONS[kind][0] == "global" else f" in {t.region}"
        return (
            f"no quota for the {kind.replace('_', ' ')} {res.name}{where} of project {t.project}: {exc}. "
            "Nothing this run created is left. Raise the quota"
            + (
                ", or use gke.multislice_network=accelerator_network_profile (no extra networks)."
                if res.kind != "workload-policy"
                else "."
            )
        )
    return (
        f"no capacity for {spec.cluster.num_slices} x {shape.num_chips} {shape.family.name} chips "
        f"({spec.cluster.num_slices * shape.num_hosts} x {shape.machine_type}, topology {shape.topology}, "
        f"{spec.cluster.capacity}) in zone {t.zone}: {exc}. Nothing this run created is left. Try another zone "
        f"(gke.zone), another capacity type (cluster.capacity=spot, reservation or flex-start) or later."
    )


def _deletes(res: plan.Resource, ctx: RunContext) -> str:
    """The call teardown deletes ``res`` with ('' when it goes with another: the cluster's CPU pool, Autopilot's
    nodes, a node pool of a cluster the run deletes)."""
    owns = r.target(ctx.spec, ctx.run_id).owns_cluster
    if res.kind == "node-pool":
        return "" if owns else f"container.nodePools.delete (label {names.RUN_LABEL})"
    if res.kind.startswith("k8s/"):
        return f"kubernetes delete {res.kind.removeprefix('k8s/')} (label {names.RUN_LABEL})"
    return {
        "gke-cluster": "container.clusters.delete",
        "iam-binding": "storage.buckets.setIamPolicy (binding removed)",
        "vpc-network": "compute.networks.delete",
        "subnetwork": "compute.subnetworks.delete",
        "firewall-rule": "compute.firewalls.delete",
        "workload-policy": "compute.resourcePolicies.delete",
    }.get(res.kind, "")


# Plan kinds of the Compute Engine resources -> the kind the Compute adapter and the ledger use.
COMPUTE_KINDS = {
    "vpc-network": "network",
    "subnetwork": "subnetwork",
    "firewall-rule": "firewall",
    "workload-policy": "resource_policy",
}


class _Session:
    """One stage's walk: the cloud clients (made on first use, with one set of credentials), and what the handlers
    found that the stage returns."""

    def __init__(self, platform: GkePlatform, ctx: RunContext):
        self.platform, self.ctx = platform, ctx
        self.t = r.target(ctx.spec, ctx.run_id)
        self.ledger = platform._ledger(ctx)
        self.record = ledgers.recorder(ctx.store, self.ledger)
        self._clients: dict[str, Any] = {}
        self.cluster = None
        self.tpu_pools: list[str] = []
        self.image_result: dict[str, Any] = {}
        self.deploy_result: dict[str, Any] = {}
        self._project_number: str | None = None

    def node_service_account(self) -> str:
        """The nodes' service account, the default's project number filled in (looked up once)."""
        account = self.t.node_service_account
        if account != r.DEFAULT_NODE_SERVICE_ACCOUNT:
            return account
        if self._project_number is None:
            from components.platforms.gke import storage as gke_storage

            self._project_number = gke_storage.project_number(self.t.project, self.client("creds"))
        return account.replace("PROJECT_NUMBER", self._project_number)

    def node_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A cluster or node pool body with the nodes' service account as it really is (the plan shows the default
        as PROJECT_NUMBER-compute@...)."""
        import json

        return json.loads(
            json.dumps(body).replace(json.dumps(self.t.node_service_account), json.dumps(self.node_service_account()))
        )

    def client(self, what: str):
        """``creds``, ``gke``, ``compute``, ``storage`` or ``kube`` (a (Kube, cluster, token) triple)."""
        if "creds" not in self._clients:
            from components.platforms.gke import cluster as gke_cluster

            self._clients["creds"] = gke_cluster.credentials()
        if what not in self._clients:
            creds, p, t = self._clients["creds"], self.platform, self.t
            made = {
                "gke": lambda: p._gke(creds),
                "compute": lambda: p._compute(creds),
                "storage": lambda: p._storage(t, creds),
                "kube": lambda: p._kube(self.ctx),
            }
            self._clients[what] = made[what]()
        return self._clients[what]


def _compute(s: _Session, res: plan.Resource) -> None:
    s.client("compute").ensure(COMPUTE_KINDS[res.kind], res.path, res.body, s.record)


def _bucket(s: _Session, res: plan.Resource) -> None:
    s.client("storage").ensure_bucket(s.t.bucket, s.t.region)


def _binding(s: _Session, res: plan.Resource) -> None:
    role, who = s.platform._bucket_member(s.t, s.client("creds"))
    s.record("iam_binding", who)
    s.client("storage").add_binding(s.t.bucket, role, who)


def _cluster(s: _Session, res: plan.Resource) -> None:
    gke = s.client("gke")
    if res.action == "create":
        s.cluster = gke.ensure_cluster(s.t.parent, s.node_body(res.body), s.record)
    else:
        s.cluster = gke.get_cluster(res.path)
        if s.cluster is None:
            raise SpecError("gke.cluster_name", f"no cluster {s.t.cluster} in {s.t.location} of project {s.t.project}")
        refused = features.refusals(s.ctx.spec, s.cluster, s.t.project)
        if refused:  # preflight refuses these first; the cluster may have changed since
            raise SpecError("gke.cluster_name", f"cluster {s.t.cluster} in {s.t.location} lacks " + "; ".join(refused))
        enable = features.to_enable(s.ctx.spec, s.cluster, s.t.project)
        if enable:
            gke.enable(res.path, enable, s.t.project)
            s.cluster = gke.get_cluster(res.path)
    _check_cluster_as_reported(s)


def _check_cluster_as_reported(s: _Session) -> None:
    """Before any node pool: the version GKE reports for the cluster reaches the floors of the slice's family and of
    managed DRANET, and the Pod and Service ranges it reports overlap no DCN subnet. A SpecError names the field to
    change: gke.cluster_version (or gke.pod_range, gke.service_range) for a cluster the run made, gke.cluster_name
    for an existing one."""
    from components.workload import checks

    spec, cluster, owns = s.ctx.spec, s.cluster, s.t.owns_cluster
    version = cluster.current_master_version
    missed = checks.floor_missed(spec, version) if version else None
    if missed:
        floor, feature = missed
        raise SpecError(
            "gke.cluster_version" if owns else "gke.cluster_name",
            f"cluster {s.t.cluster} runs GKE {version}, older than {floor}, the first "
            f"{spec.gke.cluster_mode} version with {feature}",
            [f">= {floor}"] if owns else [f"a cluster at GKE >= {floor}", "empty: the run creates one"],
        )
    overlap = r.dcn_range_overlap(spec, s.t, {"Pod": cluster.cluster_ipv4_cidr, "Service": cluster.services_ipv4_cidr})
    if overlap:
        which, value, cidr = overlap
        field = f"gke.{which.lower()}_range" if owns else "gke.cluster_name"
        raise SpecError(
            field,
            f"cluster {s.t.cluster}'s {which} range {value} overlaps the DCN subnet {cidr}",
            [f"a {which} range that overlaps no DCN subnet"]
            if owns
            else ["a cluster whose ranges overlap no DCN subnet", "empty: the run creates one"],
        )


def _node_pool(s: _Session, res: plan.Resource) -> None:
    if res.api == plan.WITH_THE_CLUSTER:
        return  # the cluster's body carries it
    s.client("gke").ensure_node_pool(res.path.rsplit("/nodePools/", 1)[0], s.node_body(res.body), s.record)
    if names.SLICE_LABEL in res.body["config"].get("labels", {}):
        s.tpu_pools.append(res.name)


def _autopilot_nodes(s: _Session, res: plan.Resource) -> None:
    s.platform.log(f"{res.name}: Autopilot makes the TPU nodes when the worker pods ask for them")


def _repository(s: _Session, res: plan.Resource) -> None:
    from components.platforms.gke import build as gke_build

    registry = gke_build.Registry(
        gke_build.registry_client(s.client("creds")), log=s.platform.log, poll_s=min(s.platform.poll_s, 2.0)
    )
    registry.ensure(s.t.project, s.t.region, s.ctx.spec.gke.artifact_repository)


def _build_source(s: _Session, res: plan.Resource) -> None:
    from components.platforms.gke import build as gke_build

    s.client("storage").upload(
        s.t.bucket,
        names.build_source(s.ctx.run_id),
        gke_build.build_context(d.trainer_image(s.ctx.spec)),
        content_type="application/gzip",
    )


def _image(s: _Session, res: plan.Resource) -> None:
    if res.action == "use":
        s.platform.log(f"trainer image: {res.name} (gke.image)")
        s.image_result = {"image": res.name, "built": False}
        return
    from components.platforms.gke import build as gke_build

    builder = gke_build.CloudBuild(
        gke_build.client(s.client("creds")),
        s.t.project,
        s.t.region,
        log=s.platform.log,
        poll_s=min(s.platform.poll_s, 10.0),
    )
    build = builder.ensure(res.body, names.build_tag(s.ctx.run_id), s.record, timeout_s=r.BUILD_TIMEOUT_S + 600)
    digest = build.results.images[0].digest if build.results.images else ""
    s.image_result = {"image": res.name, "built": True, "build": build.id, "digest": digest}


def _kube(s: _Session):
    kube, cluster, _ = s.client("kube")
    if kube is None:
        raise InfraError(f"no running cluster {s.t.cluster} for run {s.ctx.run_id}: provision did not finish")
    s.cluster = cluster
    return kube


def _k8s_object(s: _Session, res: plan.Resource) -> None:
    kube = _kube(s)
    if res.kind == "k8s/Namespace":
        kube.ensure_namespace()
    else:
        kube.ensure(res.body)


def _secret(s: _Session, res: plan.Resource) -> None:
    import base64

    from components.platforms.gke import kube as gke_kube

    kube, t, run_id = _kube(s), s.t, s.ctx.run_id
    if kube.secret(res.name) is not None:
        return
    if res.name == names.ray_token_secret(run_id):
        kube.ensure(gke_kube.ray_token_secret(res.name, t.namespace, names.labels(run_id), gke_kube.new_ray_token()))
        return
    source = s.ctx.spec.gke.hf_token_secret
    if source:
        from components.platforms.gke import secrets

        value = secrets.read(source, s.client("creds"))
    else:
        value = os.environ.get(HF_TOKEN_ENV, "").encode()
    if not value:
        raise SpecError(
            "gke.hf_secret",
            f"no Secret {res.name} in namespace {t.namespace}, no gke.hf_token_secret and "
            f"${HF_TOKEN_ENV} is not set: name the token's secret in Secret Manager "
            "(gke.hf_token_secret), or gke.hf_secret= (empty) for models that need none",
        )
    kube.ensure(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": res.name, "namespace": t.namespace, "labels": names.labels(run_id)},
            "data": {m.HF_TOKEN_KEY: base64.b64encode(value).decode()},
        }
    )


def _raycluster(s: _Session, res: plan.Resource) -> None:
    from components.platforms.gke import kube as gke_kube

    kube, spec = _kube(s), s.ctx.spec
    kube.apply(res.body)
    limits = ready_limits(spec)
    grace = float(os.environ.get(UNSCHEDULABLE_GRACE_ENV, limits.unschedulable_grace_s))
    s.platform.log(
        f"waiting up to {limits.deadline_s:.0f}s ({limits.by}) for RayCluster {res.name}; pods "
        f"unschedulable with no scale-up under way fail it after {grace:.0f}s"
    )
    ready = gke_kube.wait_ready(
        kube,
        res.name,
        limits.deadline_s,
        unschedulable_grace_s=grace,
        poll_s=min(s.platform.poll_s, 2.0),
        log=s.platform.log,
    )
    status = ready.get("status", {})
    s.platform.log(
        f"RayCluster {res.name} ready: {status.get('availableWorkerReplicas')} of "
        f"{status.get('desiredWorkerReplicas')} workers available"
    )
    s.deploy_result = {
        "raycluster": res.name,
        "namespace": s.t.namespace,
        "endpoint": s.cluster.endpoint,
        "available_workers": status.get("availableWorkerReplicas"),
    }


def _check_kuberay(s: _Session) -> None:
    """Before deploy_raycluster applies anything: the cluster's KubeRay serves every RayCluster field the run sets.
    The API server drops a field its CRD lacks without a word, and without ``authOptions.secretName`` (KubeRay < 1.6)
    the Ray cluster would run with no token: refused, never dropped silently."""
    from components.platforms.gke import kube as gke_kube

    kube, t = _kube(s), s.t
    field = "gke.cluster_version" if t.owns_cluster else "gke.cluster_name"
    crd = kube.crd(gke_kube.RAYCLUSTER_CRD)
    if crd is None:
        raise SpecError(
            field,
            f"cluster {t.cluster} serves no RayCluster (no {gke_kube.RAYCLUSTER_CRD} CRD): KubeRay, "
            "the Ray Operator add-on, is not installed",
            ["a cluster with the Ray Operator add-on"],
        )
    missing = gke_kube.missing_fields(crd)
    if missing:
        since = max(missing.values(), key=lambda v: tuple(int(x) for x in v.split(".")))
        raise SpecError(
            field,
            f"cluster {t.cluster} runs a KubeRay older than {since}: its RayCluster has no "
            f"{', '.join(missing)}, which the API server would drop, leaving the Ray cluster without token "
            "authentication",
            [f"a GKE version whose Ray Operator add-on is KubeRay >= {since}"],
        )


# The checks a stage makes of what is there before it walks its records.
BEFORE = {"deploy_raycluster": _check_kuberay}  # provision's checks are its preflight

# Plan kind -> the handler that creates (or gets) it: one per kind the plan can list (a test holds them equal).
HANDLERS = {
    "vpc-network": _compute,
    "subnetwork": _compute,
    "firewall-rule": _compute,
    "workload-policy": _compute,
    "gcs-bucket": _bucket,
    "iam-binding": _binding,
    "gke-cluster": _cluster,
    "node-pool": _node_pool,
    "autopilot-tpu-nodes": _autopilot_nodes,
    "artifact-repository": _repository,
    "build-source": _build_source,
    "container-image": _image,
    "k8s/Namespace": _k8s_object,
    "k8s/ServiceAccount": _k8s_object,
    "k8s/ResourceClaimTemplate": _k8s_object,
    "k8s/Secret": _secret,
    "k8s/RayCluster": _raycluster,
}
