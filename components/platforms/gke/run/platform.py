"""The gke platform: the run's plan executed on GKE. Each stage walks the plan's records of its kinds
(``plan.resources``, in creation order) through one handler per kind (``walk``); every handler records what it
creates in the run's ledger before it waits on it.

- provision: first preflight (``preflight``: quota, reservation, APIs, permissions, the nodes' service account's roles,
  an existing cluster's features; every problem in one report, nothing created), then the Compute Engine resources
  (the DCN networks, subnets and firewall rules of multislice ``dcn_networks`` plans, the TPU7x workload policy), the
  checkpoint bucket (got or created, kept) and the run's Workload Identity binding on it, the GKE cluster (with the
  Ray head's CPU pool) or the existing one named (what it lacks that GKE enables in place enabled first,
  ``features``), and one TPU node pool per slice, each labelled ``tpupipe-run: <run id>`` (``handlers``); a stockout
  or quota error deletes what this run created and moves to the next candidate (zone x capacity type: ``candidates``,
  each preflight passed, within ``run.deadline_h``), or, with none left, ends the stage with one message naming what,
  where and what to try; the ledger records the candidate taken, which every later stage runs on (``_placed``);
- build_image: the trainer image named by ``gke.image``, or built by Cloud Build from ``images/<name>/`` and pushed to
  Artifact Registry (the repository got or created first; ``handlers``);
- deploy_raycluster: the namespace, ServiceAccount, ResourceClaimTemplate (multislice), the Hugging Face token Secret
  (from $HF_TOKEN when the namespace has none), the Ray token Secret, then the RayCluster by server-side apply, with
  Ray token authentication on; waits for every worker, failing fast with the pod's reason (``deploy``); a stockout
  seen there, on nodes that come from zero, deletes the rung's TPU pools and moves the run to the next rung of its
  ladder, provisioned and deployed in turn (``failover``);
- jobs: the Ray Jobs API through the API server's service proxy to the head's dashboard port;
- teardown: newest first, the run's Kubernetes objects (by label), its node pools or cluster (by label and ledger),
  its binding on the bucket, its Compute Engine resources (by ledger and derived name); not found is success
  (``teardown``);
- dry_run: the same walk printed, with the job commands and teardown's deletes (``dry_run``).

Heavy imports (google-cloud, kubernetes, ray) stay inside functions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.platforms import Platform, RunContext, changed_since_evaluated, redaction
from components.platforms import ledger as ledgers
from components.platforms.gke.cloud.clients import Clients, load_ledger
from components.platforms.gke.cloud.control_plane import control_plane
from components.platforms.gke.plan import candidates, dry_run, ownership
from components.platforms.gke.plan.compute_resources import check_ranges
from components.platforms.gke.plan.target import CACHE_MOUNT_PATH, MOUNT_PATH, Target, target
from components.platforms.gke.run import failover, walk
from components.platforms.gke.run import teardown as teardowns
from components.platforms.gke.run.session import Session
from components.spec import InfraError, SpecError, names
from components.workload import budget
from components.workload import derive as d
from components.workload.cache import CACHE_PREFIX

if TYPE_CHECKING:
    from components.platforms.gke.checks.findings import Report
    from components.platforms.gke.cloud.ray_jobs import JobClient
    from components.platforms.gke.cloud.transient import Backoff
    from components.platforms.store import GcsStore
    from components.workload.cache_trust import Places


class GkePlatform(Platform):
    name = "gke"

    def __init__(self, log: Callable[[str], None] = print, poll_s: float = 5.0, backoff: Backoff | None = None) -> None:
        self.log = log
        self.poll_s = poll_s
        self.clients = Clients(log=log, poll_s=poll_s, backoff=backoff)
        self.keepers: dict[str, Any] = {}  # run id -> its lost-pods keeper (``lost_pods``), while its jobs run

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
        check_ranges(spec, self._target(ctx))

    def check_access(self, ctx: RunContext) -> None:
        from components.cloud.credentials import credentials

        credentials()  # none: an AccessError naming `gcloud auth application-default login`

    def _target(self, ctx: RunContext) -> Target:
        return target(ctx.spec, ctx.run_id)

    def _walk(self, ctx: RunContext, stage: str) -> Session:
        self.check(ctx)
        return walk.walk(self._placed(ctx), stage, self.clients)

    # ---------------------------------------------------------------- the stages that create
    def provision(self, ctx: RunContext) -> dict[str, Any]:
        from components.platforms.gke.cloud import cluster as gke_cluster

        self.check(ctx)  # before anything is derived or recorded: bad input creates nothing
        t = self._target(ctx)
        pods = f"gs://{t.bucket}/{names.RUNS_PREFIX}/"
        if ctx.store.uri.startswith(pods):
            raise SpecError(
                "output_root",
                f"the run's state {ctx.store.uri} would be under {pods}, where runs' pods write: a pod could rewrite "
                "the ledger teardown deletes by",
                [names.state_root(t.bucket)],
            )
        recorded = load_ledger(ctx)
        if recorded.get("created") and not recorded.get("torn_down"):  # resumes: it passed preflight when it started
            return self._provision_on(self._placed(ctx), None, recorded)
        tries = self._ranked(ctx)
        for index, (placed, report) in enumerate(tries):
            try:
                return self._provision_on(placed, report, load_ledger(ctx), first=index == 0)
            except gke_cluster.CapacityError as exc:
                started = load_ledger(ctx).get("started", time.time())
                deadline_h = ctx.spec.run.deadline_h
                past = deadline_h is not None and time.time() - started >= deadline_h * 3600
                if index == len(tries) - 1 or past:
                    raise
                here, nxt = self._key(placed), self._key(tries[index + 1][0])
                self.log(
                    f"provision: {here['capacity']} in {here['zone']} had no capacity and is rolled back; trying the "
                    f"next candidate, {nxt['capacity']} in {nxt['zone']}"
                )

                failover.tried(ctx, here, str(exc), "provision", 0.0)  # its pools never got nodes: none billed
        raise AssertionError("unreachable: _ranked returns at least one candidate or raises")

    @staticmethod
    def _key(ctx: RunContext) -> dict[str, str]:
        """The candidate a placed context is, as the ledger records it."""
        return {"zone": target(ctx.spec, ctx.run_id).zone, "capacity": ctx.spec.cluster.capacity}

    def _placed(self, ctx: RunContext) -> RunContext:
        """The run as provision placed it (the zone and capacity type its ledger records: ``candidates.chosen``);
        every stage after provision, teardown and the janitor run on it."""
        spec = candidates.chosen(ctx.spec, ledgers.load(ctx.store) or {})
        return ctx if spec is ctx.spec else dataclasses.replace(ctx, spec=spec)

    def _ranked(self, ctx: RunContext) -> list[tuple[RunContext, Report]]:
        """The candidates preflight passes, in order, each with its report, the others' problems among its warnings;
        none: :class:`PreflightFailed` with every candidate's problems under its name (a single candidate's as
        preflight raised them)."""
        from components.platforms.gke.checks import preflight
        from components.platforms.gke.checks.findings import PreflightFailed, Problem
        from components.platforms.gke.plan import document as plan

        listed = candidates.ranked(ctx.spec, lambda placed: plan.cost(placed, ctx.run_id))
        passed, refused = [], []
        for cand in listed:
            placed = dataclasses.replace(ctx, spec=candidates.place(ctx.spec, cand.zone, cand.capacity))
            if cand.excluded and len(listed) > 1:
                refused.append((cand, [Problem("cluster.capacity", cand.excluded)]))
                continue
            try:
                passed.append((placed, preflight.check(placed.spec, ctx.run_id, log=self.log)))
            except PreflightFailed as exc:
                if len(listed) == 1:
                    raise
                refused.append((cand, exc.problems))
        why = [f"candidate {cand} excluded: " + "; ".join(map(str, problems)) for cand, problems in refused]
        for line in why:
            self.log(f"preflight: {line}")
        if not passed:
            problems = [Problem(p.field, f"[{cand}] {p.message}") for cand, found in refused for p in found]
            raise PreflightFailed(f"preflight of run {ctx.run_id}: no candidate passed", problems)
        passed[0][1].warnings.extend(why)  # `tpupipe preflight` prints the report: the excluded say why there
        return passed

    def _provision_on(
        self, ctx: RunContext, report: Report | None, recorded: dict[str, Any], first: bool = True
    ) -> dict[str, Any]:
        """Provision one candidate (``ctx`` placed): the ledger records it before anything is created; a stockout or
        quota error deletes what it created and ends with one message naming what, where and what to try."""
        from components.platforms.gke.cloud import cluster as gke_cluster

        t = self._target(ctx)

        def begin(ledger: dict[str, Any]) -> None:
            if report is not None:
                if first:
                    ledger["started"] = time.time()  # the janitor measures a run's age from here
                ledger["cluster_version"] = report.version  # as resolved against the versions GKE offers
                ledger["release_channel"] = report.channel  # the most stable channel that offers it
                ledger["candidate"] = self._key(ctx)  # the zone and capacity type the stages after this run on
            ledger.setdefault("started", time.time())
            ledger.update(
                {
                    "parent": t.parent,
                    "cluster": t.cluster_path,
                    "owns_cluster": t.owns_cluster,
                    "namespace": t.namespace,
                    "spec": ctx.spec.to_dict(),  # placed: the janitor's teardown finds the candidate's zone
                }
            )
            ledger.pop("torn_down", None)

        ledger = ledgers.update(ctx.store, begin, recorded)
        try:
            session = self._walk(ctx, "provision")
        except gke_cluster.CapacityError as exc:
            self.log(f"provision: no capacity or quota: {exc}; deleting what this run created")
            creds = gke_cluster.credentials()
            owned = ownership.owned(ctx, load_ledger(ctx), self.log)
            teardowns.delete_created(self.clients, self.clients.gke(creds), None, owned, t)
            raise gke_cluster.CapacityError(
                walk.capacity_message(ctx.spec, t, exc, getattr(exc, "resource", None))
            ) from None
        cluster = session.cluster
        return {
            "cluster": ledger["cluster"],
            "endpoint": control_plane(cluster).host if cluster else "",
            "node_pools": session.tpu_pools,
            "created": [c["name"] for c in load_ledger(ctx)["created"]],
            **self._key(ctx),
        }

    def preflight(self, ctx: RunContext) -> Report:
        """Quota, reservation, APIs, permissions and an existing cluster's features, all checked before anything is
        created, for every candidate (``_ranked``): the first that passes' report; :class:`preflight.PreflightFailed`
        lists every problem when none does."""
        self.check(ctx)
        return self._ranked(ctx)[0][1]

    def build_image(self, ctx: RunContext) -> dict[str, Any]:
        return self._walk(ctx, "build_image").image_result

    def deploy_raycluster(self, ctx: RunContext) -> dict[str, Any]:
        """The RayCluster deployed and ready; a stockout seen while it waits for its TPU nodes (nodes that come from
        zero) moves the run to the next rung of its capacity ladder first (``failover``)."""
        return failover.deploy(self, ctx)

    # ---------------------------------------------------------------- the jobs and their output
    def job_client(self, ctx: RunContext, deadline: float | None = None) -> JobClient:
        """The Ray Jobs API through the API server's service proxy, its Google token refreshed before it expires, its
        transient errors retried until ``deadline`` (the job's)."""
        from components.platforms.gke.cloud import kube as gke_kube
        from components.platforms.gke.cloud import ray_jobs

        kube, cluster, token = self.clients.kube(self._placed(ctx))
        if kube is None or cluster is None or token is None:  # all three None, or none of them
            raise InfraError(f"no running cluster for run {ctx.run_id}")
        ray_token = gke_kube.ray_token(kube, ctx.run_id)
        client = ray_jobs.job_client(
            control_plane(cluster),
            ctx.run_dir / "gke",
            kube.namespace,
            names.raycluster(ctx.run_id),
            token,
            ray_token,
            log=self.log,
            backoff=self.clients.backoff,
        )
        if deadline is not None:
            client.until(deadline)
        if ctx.run_id not in self.keepers:  # from the first job on, a pod the run loses is kept as it goes
            from components.platforms.gke.run.lost_pods import Keeper

            selector = f"ray.io/cluster={names.raycluster(ctx.run_id)}"
            self.keepers[ctx.run_id] = Keeper(ctx, kube, selector, min(self.poll_s * 2, 10.0), self.log).start()
        if ctx.spec.gke.queue:  # a RayCluster Kueue evicts loses its pods, the head's among them: no use retrying
            from components.platforms.gke.run import queueing

            client.retrying.abort = queueing.lost_to_eviction(kube, names.raycluster(ctx.run_id))
        return client

    def evicted(self, ctx: RunContext) -> str | None:
        """Kueue's reason when it evicted the run's RayCluster (``gke.queue``) and has not admitted it again; the
        Workload as it stands then is kept for the post-mortem (``queueing.keep_workload``)."""
        if not ctx.spec.gke.queue:
            return None
        from components.platforms.gke.run import queueing

        kube, _, _ = self.clients.kube(self._placed(ctx))
        if kube is None:
            return None
        reason = queueing.evicted(kube, names.raycluster(ctx.run_id))
        if reason is not None:
            queueing.keep_workload(ctx.store, kube, names.raycluster(ctx.run_id))
        return reason

    def wait_to_run_again(self, ctx: RunContext) -> dict[str, Any]:
        """The evicted RayCluster admitted again by Kueue and ready (``deploy.readmitted``)."""
        from components.platforms.gke.run import deploy

        return deploy.readmitted(Session(self._placed(ctx), self.clients), names.raycluster(ctx.run_id))

    def job_output_dir(self, ctx: RunContext) -> str:
        return self._target(ctx).run_dir

    def hub_token(self, ctx: RunContext) -> str | None:
        """The Secret Manager secret ``gke.hf_token_secret`` (as deploy_raycluster reads it for the pods; a Vertex AI
        task has no other). Never logged, never written."""
        if not ctx.spec.gke.hf_token_secret:
            return None
        from components.cloud import secrets

        token = secrets.read(ctx.spec.gke.hf_token_secret).decode().strip()
        redaction.register(token)
        return token or None

    def no_internet(self, ctx: RunContext) -> str | None:
        from components.platforms.gke.plan import network
        from components.platforms.gke.plan.target import target

        return network.no_internet(ctx.spec, target(ctx.spec, ctx.run_id))

    def compile_cache_root(self, ctx: RunContext) -> str:
        return CACHE_MOUNT_PATH  # the bucket's cache/ prefix, mounted read-only in the worker pods (plan.manifests)

    def run_cache_root(self, ctx: RunContext) -> str:
        from components.workload.cache_trust import RUN_CACHE_DIR

        return f"{self._target(ctx).run_dir}/{RUN_CACHE_DIR}"  # the run's own prefix, which its pods write

    def compile_job_root(self, ctx: RunContext) -> str:
        from components.workload.cache_trust import COMPILE_DIR

        return f"{self._target(ctx).run_dir}/{COMPILE_DIR}"  # the run's own prefix: its compile job's output

    def claims_store(self, ctx: RunContext) -> GcsStore:
        """``gs://<gke.bucket>/state/_claims/``: the run's cluster, service accounts and objects are named from its id
        within the project and the bucket, whatever its output root."""
        from components.platforms.ledger import RESOURCE_CLAIMS
        from components.platforms.store import GcsStore

        return GcsStore(target(ctx.spec, ctx.run_id).bucket, RESOURCE_CLAIMS)

    def cache_places(self, ctx: RunContext) -> Places:
        """The bucket's ``cache/`` (read-only to every pod), the run's ``runs/<id>/cache/`` (the training job's) and
        ``runs/<id>/compiled/`` (the compile job's), and the manifests in ``state/_cache/`` (no pod's identity reaches
        it), through this process's Cloud Storage client: the pipeline's identity
        (``components.workload.cache_trust``)."""
        from components.platforms.store import gcs_client
        from components.workload.cache_trust import COMPILE_DIR, MANIFESTS_PREFIX, RUN_CACHE_DIR, GcsPlace, Places

        t, client = self._target(ctx), gcs_client()
        return Places(
            GcsPlace(t.bucket, CACHE_PREFIX, client),
            GcsPlace(t.bucket, f"{names.run_prefix(ctx.run_id)}/{RUN_CACHE_DIR}", client),
            GcsPlace(t.bucket, f"{names.STATE_PREFIX}/{MANIFESTS_PREFIX}", client),
            GcsPlace(t.bucket, f"{names.run_prefix(ctx.run_id)}/{COMPILE_DIR}", client),
        )

    def checkpoint_uri(self, ctx: RunContext, path: str) -> str:
        """The bucket's object path of a path under the pods' GCS FUSE mount (``/data/runs/<id>/...``)."""
        if not path.startswith(MOUNT_PATH + "/"):
            return path
        return f"gs://{self._target(ctx).bucket}/{path.removeprefix(MOUNT_PATH + '/')}"

    def checkpoint_path(self, ctx: RunContext, uri: str) -> str:
        """A checkpoint of the run's bucket where the run's pods can read it: under their own prefix, the only one
        they mount and may read (``manifests``, ``target.bucket_binding``). A checkpoint of another run (a registered
        version, the champion) is copied in first, server-side, to ``runs/<run id>/inputs/<its object path>/``: the
        original stays out of this run's reach, read-only to every run."""
        t = self._target(ctx)
        if not uri.startswith(f"gs://{t.bucket}/"):
            raise SpecError(
                "train.init_from",
                f"checkpoint {uri} is outside the run's bucket gs://{t.bucket}, the one "
                f"the cluster mounts from: copy it there, or set gke.bucket",
            )
        source, own = uri.removeprefix(f"gs://{t.bucket}/").rstrip("/"), names.run_prefix(ctx.run_id)
        if source == own or source.startswith(f"{own}/"):
            return f"{MOUNT_PATH}/{source}"
        inputs = f"{own}/inputs/{source}"
        copied, total, size = self.clients.storage(t).copy_prefix(t.bucket, source, inputs)
        if not total:
            raise SpecError("train.init_from", f"checkpoint {uri} holds no object: nothing to start from")
        self.log(
            f"copied {copied} of {total} objects ({size / 2**30:.2f} GiB) of {uri} to gs://{t.bucket}/{inputs}/, "
            "where the run's pods read it"
        )
        return f"{MOUNT_PATH}/{inputs}"

    def checkpoint_versions(self, ctx: RunContext, uri: str) -> dict[str, str]:
        """The generation of every object under the checkpoint's prefix (``Storage.generations``)."""
        t = self._target(ctx)
        prefix = self._own_object_path(ctx, uri)
        return {n: str(g) for n, g in self.clients.storage(t).generations(t.bucket, prefix).items()}

    def _own_object_path(self, ctx: RunContext, uri: str) -> str:
        """``uri``'s object path in the bucket, refused unless it is under the run's own prefix."""
        t = self._target(ctx)
        own = f"gs://{t.bucket}/{names.run_prefix(ctx.run_id)}/"
        if not uri.startswith(own):
            raise InfraError(f"checkpoint {uri} is not the run's own (under {own})")
        return uri.removeprefix(f"gs://{t.bucket}/").rstrip("/")

    def keep_registered(self, ctx: RunContext, uri: str, model: str, versions: dict[str, str]) -> str:
        """A server-side copy of the run's checkpoint at ``models/<model>/<run id>/`` in the bucket, made with the
        pipeline's identity: no run's pods may write there (their binding names ``runs/<run id>/`` alone:
        ``target.bucket_binding``), so a later run cannot change a registered version; with
        ``gate.hold_registered`` every object of it is also under a temporary hold (``Storage.hold_prefix``). Each
        object is created, never replaced: a copy there with other bytes (another run's under this id) is refused, a
        retried register of the same bytes keeps what is there. Each is copied from the generation ``versions``
        names (what the evaluate stage measured), with ``ifSourceGenerationMatch``: one rewritten since (the run's
        pods can write its prefix) fails the registration, whatever of the copy was made stays unregistered."""
        from components.cloud.storage import SourceChanged

        t = self._target(ctx)
        source, kept = self._own_object_path(ctx, uri), names.model_prefix(model, ctx.run_id)
        storage = self.clients.storage(t)
        pinned = {n: int(v) for n, v in versions.items()}
        try:  # never another's copy, never other bytes than those evaluated
            copied, total, size = storage.copy_prefix(t.bucket, source, kept, create_only=True, generations=pinned)
        except SourceChanged as exc:
            raise changed_since_evaluated(uri, exc.changed) from None
        if not total:
            raise InfraError(f"register: checkpoint {uri} holds no object: nothing to register")
        held = storage.hold_prefix(t.bucket, kept) if ctx.spec.gate.hold_registered else 0
        self.log(
            f"register: copied {copied} of {total} objects ({size / 2**30:.2f} GiB) of {uri} to gs://{t.bucket}/{kept}/"
            + (f", {held} newly under a temporary hold" if ctx.spec.gate.hold_registered else "")
        )
        return f"gs://{t.bucket}/{kept}"

    def registry_place(self, ctx: RunContext) -> dict[str, str]:
        """Vertex AI Model Registry of the run's project, in the region of its zone."""
        t = self._target(ctx)
        return {"project": t.project, "region": t.region}

    def limits(self, ctx: RunContext) -> budget.Limits:
        """The spec's budget and deadline, else the defaults derived from the plan's cost, which is also the hourly
        price spending is counted at (``plan.limits``)."""
        from components.platforms.gke.plan import document as plan

        return plan.limits(self._placed(ctx).spec, ctx.run_id)

    def hosts_lost(self, ctx: RunContext) -> int | None:
        return None  # a lost TPU host shows as a restart of Ray Train's worker group (restarts)

    # ---------------------------------------------------------------- teardown and the dry run
    def teardown(self, ctx: RunContext) -> dict[str, Any]:
        """Delete what the run created, newest first (``teardown``); what is shared is kept."""
        keeper = self.keepers.pop(ctx.run_id, None)
        if keeper is not None:  # before anything is deleted: the pods teardown deletes are not lost ones
            keeper.stop()
        try:
            self.check(ctx)
        except SpecError as exc:  # provision checks first: a run that fails the checks created nothing
            self.log(f"teardown: nothing to delete: the run never got past its checks ({exc})")
            return {"deleted": [], "kept_cluster": None}
        return teardowns.teardown(self._placed(ctx), self.clients)

    def release(self, ctx: RunContext) -> list[str]:
        """The run's cluster (or its node pools) as its ledger records them: deletes started, not waited on."""
        return teardowns.start_deletes(self._placed(ctx), self.clients)

    def remaining(self, ctx: RunContext) -> list[str]:
        return teardowns.remaining(self._placed(ctx))

    def dry_run(self, ctx: RunContext, entrypoint: Callable[[str], str]) -> list[str]:
        """The calls a run makes, stage by stage, in order, without credentials or network (``dry_run``)."""
        self.check(ctx)
        return dry_run.calls(self._placed(ctx), entrypoint)
