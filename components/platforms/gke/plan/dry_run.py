"""``tpupipe run --platform gke --dry-run``: the calls a run makes, stage by stage, in order, without credentials or
network: preflight's reads, the same records the stages walk (``plan.resources``), the job commands they submit, the
model registry's calls, and what teardown deletes, newest first.
"""

from __future__ import annotations

from collections.abc import Callable

from components.cloud.build import image_tag_path
from components.platforms import RunContext
from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import needs
from components.platforms.gke.plan.records import Resource
from components.platforms.gke.plan.resources import compile_job
from components.platforms.gke.plan.target import target
from components.spec import datasets, names


def calls(ctx: RunContext, entrypoint: Callable[[str], str]) -> list[str]:
    """The calls a run makes, stage by stage, in order, without credentials or network: the same records the
    stages walk, the job commands they submit (``entrypoint(mode)``), and what teardown deletes, newest first."""
    records = plan.resources(ctx.spec, ctx.run_id)
    lines = snapshot_calls(ctx)
    kuberay = (
        "  check         kubernetes get customresourcedefinitions/rayclusters.ray.io (the cluster's KubeRay serves "
        "every RayCluster field the run sets)"
    )
    for stage in ("provision", "build_image", "deploy_raycluster"):
        lines.append("build_image (beside provision: it needs nothing of it)" if stage == "build_image" else stage)
        if stage == "provision":  # preflight first: read-only calls, every problem reported before any create
            lines += [
                f"  check         {api} {path} ({what})"
                for api, path, what in needs.reads(needs.needs(ctx.spec, ctx.run_id))
            ]
            lines += [
                f"  check         storage.buckets.testIamPermissions {bucket} (the caller may list and read it)"
                for bucket in _data_buckets(ctx)
            ]
            if ctx.spec.gate.register:  # the champion's base is this run's (components.stages.gate.check_lineage)
                t = target(ctx.spec, ctx.run_id)
                lines.append(
                    f"  check         aiplatform.models.get projects/{t.project}/locations/{t.region}/models/"
                    f"{ctx.spec.model_name}@champion (trained over this run's base, or gate.model names a new model)"
                )
        if stage == "deploy_raycluster":
            lines.append(kuberay)
        for res in records:
            if res.stage == stage:
                if res.kind == "build-source":  # an image of the same sources is reused: no upload, no build
                    lines.append(f"  check         artifactregistry.tags.get {_content_tag_path(records)}")
                lines.append(f"  {res.action:<13} {res.api} {res.path or res.name}".rstrip())
                if res.kind == "gke-cluster":  # as soon as the cluster exists, before any TPU node pool
                    lines.append(kuberay)
    spec, t = ctx.spec, target(ctx.spec, ctx.run_id)
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
        if stage == "train" and datasets.snapshotted(spec.train.dataset):
            lines.append(
                f"  copy          the snapshot's train.jsonl and heldout.jsonl to gs://{t.bucket}/"
                f"{names.run_prefix(ctx.run_id)}/data/ (where the jobs read them)"
            )
        if stage in reads:
            lines.append(f"  read          aiplatform.models.get {reads[stage]}")
        if stage == "train" and spec.train.workload == "maxtext":  # the compile cache's only producer
            job = compile_job(spec, t)
            lines.append(
                f"  submit        ray.jobs.submit {job['submission_id']}: {job['entrypoint']} (only when the trusted "
                "manifest lacks this compile configuration; its output recorded before the train job)"
            )
        if stage == "evaluate":  # what register copies, exactly (ray_stages.pin_checkpoint)
            lines.append(
                f"  list          storage.objects.list gs://{t.bucket}/{names.run_prefix(ctx.run_id)}/<the checkpoint> "
                "(the generations measured, before and after the job)"
            )
        lines.append(f"  submit        ray.jobs.submit {submission}: {entrypoint(mode)}")
    if spec.gate.register:
        lines += [
            "register",
            f"  copy          storage.objects.rewrite gs://{t.bucket}/{names.run_prefix(ctx.run_id)}/<the checkpoint> "
            f"to gs://{t.bucket}/{names.model_prefix(spec.model_name, ctx.run_id)}/ (out of every run's reach; "
            "the generations evaluate measured, ifSourceGenerationMatch)",
            *(
                ["  hold          storage.objects.patch temporaryHold on each object of the copy (hold_registered)"]
                if spec.gate.hold_registered
                else []
            ),
            f"  upload        aiplatform.models.upload {registered} (a new version, its provenance: the copy)",
            "promote",
            f"  alias         aiplatform.models.mergeVersionAliases {registered}@<the new version> champion "
            "(only when the gate promotes)",
        ]
    lines.append("teardown")
    for res in reversed(records):
        if res.deleted_by_teardown and res.action != "use" and _deletes(res, ctx):
            lines.append(f"  delete        {_deletes(res, ctx)} {res.path or res.name}")
    return lines


def _data_buckets(ctx: RunContext) -> list[str]:
    t = ctx.spec.train
    found = [d.removeprefix("gs://").split("/", 1)[0] for d in (t.dataset, t.eval_dataset) if d.startswith("gs://")]
    return [f"gs://{bucket}" for bucket in dict.fromkeys(found)]


def snapshot_calls(ctx: RunContext) -> list[str]:
    """snapshot_data's calls (``components.stages.dataset``): the dataset's listing or table read, pinned, before
    anything is created; none for generated or hub data."""
    lines = ["snapshot_data"]
    t = ctx.spec.train
    for key, value in (("train.dataset", t.dataset), ("train.eval_dataset", t.eval_dataset)):
        if not value or not datasets.snapshotted(value):
            continue
        kind = datasets.kind(value)
        if kind == "gcs":
            if key == "train.dataset" and t.dataset_ready:
                from components.data import drops, gcs

                bucket, prefix, _ = gcs.parse(value, key)
                lines.append(
                    f"  read          storage.objects.get gs://{bucket}/{drops.marker_dir(prefix)}{t.dataset_ready} "
                    "(train.dataset_ready: the drop is read only once it is there)"
                )
            lines += [
                f"  read          storage.objects.list {value} ({key}; {{date}}: the schedule's date; every .jsonl, "
                ".json, .parquet and .jsonl.gz object but hidden ones (_ or . in its path), each pinned by its "
                "generation)",
                "  read          storage.objects.get each object at its pinned generation (every example checked)",
            ]
        elif kind == "bigquery":
            from components.data import snapshot

            jobs = snapshot.job_project(ctx.spec) or "the table's project"
            lines += [
                f"  read          bigquery.tables.get {value} ({key}: its schema)",
                f"  read          bigquery.readsessions.create {value} as of the run's time (the Storage Read API: "
                f"one read session of {jobs}, billed there; its streams read in Arrow batches)",
            ]
            if key == "train.dataset" and t.data_since == "champion":
                lines.append(
                    f"  read          bigquery.jobs.query APPENDS({value}) since the champion's snapshot time (the "
                    f"rows committed since, when the champion read the same table and filter; a job of {jobs})"
                )
        elif kind == "hub":
            from components.data import hub

            splits = ", ".join(dict.fromkeys(s for s in (t.train_split, "" if t.eval_dataset else t.eval_split) if s))
            lines += [
                f"  read          GET /api/datasets/{value}/revision/{hub.CONVERTED} (the hub's Parquet files of "
                f"{key}, and the commit it resolves to)",
                f"  read          GET /datasets/{value}/resolve/COMMIT/default/SPLIT/*.parquet for {splits} (each "
                "checked against its listed sha256, which pins it; listed again once if a conversion removed COMMIT)",
            ]
        else:
            lines.append(f"  read          the local files of {value} ({key}), each pinned by its bytes' digest")
    if len(lines) == 1:
        lines.append(f"  (none: {datasets.kind(t.dataset)} data is not snapshotted)")
    else:
        lines.append(
            "  write         the run's state data/manifest.json, card.md (the data card), train.jsonl, heldout.jsonl"
        )
    return lines


def _deletes(res: Resource, ctx: RunContext) -> str:
    """The call teardown deletes ``res`` with ('' when it goes with another: the cluster's CPU pool, Autopilot's
    nodes, a node pool of a cluster the run deletes)."""
    owns = target(ctx.spec, ctx.run_id).owns_cluster
    if res.kind == "node-pool":
        return "" if owns else f"container.nodePools.delete (label {names.RUN_LABEL})"
    if res.kind.startswith("k8s/"):
        return f"kubernetes delete {res.kind.removeprefix('k8s/')} (label {names.RUN_LABEL})"
    return {
        "gke-cluster": "container.clusters.delete",
        "iam-binding": "storage.buckets.setIamPolicy (binding removed)",
        "vpc-network": "compute.networks.delete",
        "subnetwork": "compute.subnetworks.delete",
        "cloud-nat": "compute.routers.delete",
        "firewall-rule": "compute.firewalls.delete",
        "workload-policy": "compute.resourcePolicies.delete",
    }.get(res.kind, "")


def _content_tag_path(records: list[Resource]) -> str:
    """The Artifact Registry tag that finds a trainer image built from the same sources (its build context's hash),
    for the dry run: ``.../packages/NAME/tags/ctx-HASH``."""
    image = next(res.name for res in records if res.kind == "container-image")
    package, _ = image_tag_path(image)
    reused = "an image built from the same sources, reused: no upload, no build"
    return f"{package}/tags/{names.CONTENT_TAG_PREFIX}HASH ({reused})"
