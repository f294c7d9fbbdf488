"""`tpupipe plan`: every resource a gke run would create and what it would cost, before anything is created.

``build(spec, run_id)`` derives the whole plan as one JSON-able document (the shape is documented in docs/plan.md,
"The `--output json` document"): its resources are the records of ``records`` and ``k8s_records`` in creation order
(``resources``). ``render_text`` (``plan.text``) and ``to_json`` print it; ``manifest_files`` gives the Kubernetes
objects the run would apply, one YAML file each. No credentials and no network: everything comes from the spec, the
TPU catalogue and the price table. The plan's size grows with the number of slices (one node pool each) and not with
the number of chips: the RayCluster has one worker group whatever the size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from components.platforms.gke.plan import accounts, candidates, k8s_records, records
from components.platforms.gke.plan import resources as r
from components.platforms.gke.plan.compute_resources import check_ranges
from components.platforms.gke.plan.target import CACHE_MOUNT_PATH, Target, target
from components.spec import RunSpec, SpecError, names, ready_limits
from components.tpu import catalogue, pricing
from components.workload import budget, cache_trust, fsdp_plan, maxtext, weights
from components.workload import derive as d
from components.workload.cache import CACHE_PREFIX

PLAN_VERSION = 1


def check_plannable(spec: RunSpec) -> None:
    """A plan describes the gke platform's TPU resources; the cpu accelerator runs on the local platform."""
    if not d.is_tpu(spec):
        raise SpecError(
            "cluster.accelerator",
            f"preset {spec.name!r} emulates cpu hosts on the local platform; a plan describes TPU slices on gke",
            list(catalogue.FAMILIES),
        )


def _slice_doc(spec: RunSpec) -> dict[str, Any]:
    shape = d.slice_shape(spec)
    c = spec.cluster
    return {
        "family": shape.family.name,
        "topology": shape.topology,
        "num_slices": c.num_slices,
        "chips_per_slice": shape.num_chips,
        "hosts_per_slice": shape.num_hosts,
        "chips_per_host": shape.chips_per_host,
        "logical_devices_per_host": shape.logical_devices_per_host,
        "machine_type": shape.machine_type,
        "gke_accelerator": shape.family.gke_accelerator,
        "ray_accelerator_type": shape.family.ray_accelerator_type,
        "pod_type": shape.pod_type,
        "multi_host": shape.multi_host,
        "total_chips": shape.num_chips * c.num_slices,
        "total_hosts": shape.num_hosts * c.num_slices,
        "capacity": c.capacity,
    }


def resources(spec: RunSpec, run_id: str) -> list[records.Resource]:
    """Every resource the run creates or uses, in the order the stages create them (of the first candidate, unless
    ``spec`` is placed already: ``candidates``)."""
    check_plannable(spec)
    spec = candidates.first(spec)
    t = target(spec, run_id)
    check_ranges(spec, t)
    return [
        *records.compute_records(spec, t),
        *records.storage_records(t),
        *records.cluster_records(spec, t),
        *records.image_records(spec, t),
        *k8s_records.kubernetes_records(spec, t),
    ]


def _cost(spec: RunSpec, listed: list[records.Resource], table: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The hourly price of the run's billed resources (the records that carry a price: the cluster, the CPU pool,
    the TPU chips)."""
    lines = [pricing.line(table, res.kind, res.name, *res.price) for res in listed if res.price]
    return pricing.summarize(lines, spec.cluster.expected_hours, table)


def cost(spec: RunSpec, run_id: str, prices: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The plan's cost (``_cost``) alone, from ``prices`` (default: the table)."""
    return _cost(spec, resources(spec, run_id), prices if prices is not None else pricing.load())


def limits(spec: RunSpec, run_id: str, prices: Mapping[str, Mapping[str, Any]] | None = None) -> budget.Limits:
    """The budget and deadline the run is held to on gke: the spec's, else the defaults derived from the plan's cost
    (``components.workload.budget``)."""
    return budget.limits(spec, cost(spec, run_id, prices))


# TorchTPU keeps its compiled programs across processes under TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT (vLLM's TorchTPU
# backend documents it: https://github.com/vllm-project/vllm-torchtpu/blob/main/docs/user_guide/compilation_cache.md);
# no public source gives its entries' keys or format, so no compile job can be shown to fill it for a training run and
# no entry can be checked: the FSDP trainer's cache is per run (components.stages.compile_cache).
TORCH_COMPILE_CACHE_WARNING = (
    "train.workload=fsdp: the FSDP trainer keeps no compiled programs across runs: its compile cache (TorchTPU's "
    "executables, the tokenised split) is per run, under runs/RUN_ID/cache/, never shared; torch_tpu documents no "
    "persistent compilation cache whose entries a trusted compile job could be shown to produce or a run could check "
    "(vLLM's TorchTPU backend sets TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT), so each run compiles its programs again"
)


# Answers on a slice: both trainers decode with static shapes so that each program compiles once (trainers/generation.py
# for the FSDP trainer, trainers/maxtext_generation.py for MaxText's engine), which runs on CPU hosts only so far.
GENERATION_WARNING = (
    "eval.generate_examples={n}: the {workload} trainer's answers to the evaluation prompts decode with one prompt "
    "shape and a static KV cache so the decode compiles once on a TPU, but that is untested on a TPU; a decode "
    "compiled again at each step would hold the slice (set eval.generate_examples=0 to leave it out)"
)


# The run's bucket access is granted to its Kubernetes ServiceAccount by its UID (``target.member``): no
# ServiceAccount of another cluster, or made again under its name, holds it. But whoever may create pods in a
# namespace may run them as any ServiceAccount there
# (https://kubernetes.io/docs/concepts/security/rbac-good-practices/#workload-creation). On a cluster others use, the
# namespace is what fences the run's bucket access (docs/gke.md, "What confines a run's pods").
SHARED_NAMESPACE_WARNING = (
    "gke.namespace={namespace}: whoever may create pods in that namespace of this cluster may run them as the run's "
    "ServiceAccount {account} and gets the run's bucket access; on a cluster others use, name a namespace only the "
    "run's submitters may write (docs/gke.md, \"What confines a run's pods\")"
)


def _warnings(spec: RunSpec, t: Target, cost: dict[str, Any]) -> list[str]:
    shape, c = d.slice_shape(spec), spec.cluster
    warnings = []
    if not spec.gke.project:
        warnings.append(
            f"gke.project is empty: names show {names.PLACEHOLDER_PROJECT}; set gke.project=... for a real run"
        )
    if not t.owns_cluster:
        warnings.append(
            f"gke.cluster_name={t.cluster}: the run uses an existing cluster; provisioning checks that "
            "it has " + ", ".join(records.cluster_features(spec, False)) + " before it creates anything, and "
            "that the GKE version it runs reaches the slice's floors (gke.cluster_version is not applied)"
        )
        warnings.append(SHARED_NAMESPACE_WARNING.format(namespace=t.namespace, account=t.service_account))
    if t.autopilot:
        warnings.append("autopilot: the Ray head pod is billed by Autopilot's pod prices, not in the table")
    documented = catalogue.zones(shape.family.name)
    if t.zone not in documented:
        warnings.append(
            f"gke.zone={t.zone}: not among the zones documented for {shape.family.name} ({', '.join(documented)})"
        )
    if c.capacity != "reservation" and shape.family.name not in r.QUOTA_METRICS:
        warnings.append(
            f"TPU quota: Compute Engine reports no regional quota metric for {shape.family.name}, so preflight "
            f"cannot check it; make sure {c.num_slices * shape.num_chips} chips of its {r.quota_kind(c.capacity)} "
            f"quota are free in {t.region} (the console's Quotas page)"
        )
    if d.is_elastic(spec):
        warnings.append(f"elastic: the cost assumes all {c.num_slices} slices run for the whole duration")
    if spec.train.workload == "fsdp":
        warnings.append(TORCH_COMPILE_CACHE_WARNING)
    if spec.eval.generate_examples:
        warnings.append(GENERATION_WARNING.format(n=spec.eval.generate_examples, workload=spec.train.workload))
    if spec.train.workload == "maxtext" and maxtext.parameters(spec) is None:
        warnings.append(
            f"maxtext.model_name={spec.maxtext.model_name}: its size is not in the plan's table, so the checkpoints' "
            f"size is unknown ({maxtext.CHECKPOINTS_KEPT} are kept)"
        )
    problem, unchecked = budget.plan_check(budget.limits(spec, cost), cost)
    if problem:
        warnings.append(f"run.max_cost_usd: {problem}; preflight refuses the run")
    if unchecked:
        warnings.append(unchecked)
    if cost["missing_prices"]:
        warnings.append(
            "no price in the table for "
            + ", ".join(cost["missing_prices"])
            + ": the totals are unknown; give them with --prices FILE"
        )
    return warnings


def _training(spec: RunSpec, t: Target) -> dict[str, Any]:
    scaling = d.scaling_config_args(spec)
    return {
        "submission_id": names.job_submission_id(t.run_id, "train"),
        "entrypoint": r.entrypoint(spec, t),
        "scaling_config": {**scaling, "num_workers": _jsonable(scaling["num_workers"])},
        "run_config": d.run_config_args(spec),
        "elastic": d.is_elastic(spec),
        "timeout_s": spec.train.timeout_s,
        "output_dir": t.run_dir,
        "compile_cache": _compile_cache(spec, t),
        "base_weights": weights.plan_entry(
            spec.train.model_id,
            spec.train.workload,
            f"gs://{t.bucket}/{CACHE_PREFIX}",
            CACHE_MOUNT_PATH,
            spec.train.model_revision,
            f"gs://{t.bucket}/{names.STATE_PREFIX}/{cache_trust.MANIFESTS_PREFIX}",
        ),
        **(_maxtext_figures(spec) if spec.train.workload == "maxtext" else fsdp_plan.plan_entry(spec)),
    }


def _compile_cache(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """Where the train job's compiled programs come from: the pods' path (the training job's own copy), the bucket's
    prefix kept across runs, the trusted manifest of their hashes, and the compile job that alone fills it
    (``components.workload.cache_trust``, ``components.stages.compile_cache``); None for a trainer that keeps none
    (``_warnings``)."""
    from components.workload.cache_trust import MANIFESTS_PREFIX, RUN_CACHE_DIR, manifest_name

    if spec.train.workload != "maxtext":
        return None
    path = r.compile_cache(spec, t)
    key = path.removeprefix(f"{t.run_dir}/{RUN_CACHE_DIR}/")
    return {
        "path": path,
        "uri": f"gs://{t.bucket}/{CACHE_PREFIX}/{key}",
        "manifest": f"gs://{t.bucket}/{names.STATE_PREFIX}/{MANIFESTS_PREFIX}/{manifest_name(key)}",
        "compile_job": {
            **r.compile_job(spec, t),
            "identity": f"the run's pods: Kubernetes service account {names.service_account(t.run_id)}",
            "trusted_because": COMPILE_JOB_TRUST,
        },
    }


COMPILE_JOB_TRUST = (
    "it runs only when the manifest lacks this compile configuration, before the run's training job was ever "
    "submitted, in fresh Ray Train worker processes, the pinned image's MaxText on synthetic inputs of the run's "
    "shapes (no dataset, tokenizer, weights, checkpoint or user code); the train stage (the pipeline's identity) "
    "hashes what it wrote and records it before the training job starts, and only those entries are ever shared: "
    "what the training job compiles stays under its run"
)


def _maxtext_figures(spec: RunSpec) -> dict[str, Any]:
    """The MaxText run's checkpoints and, with answers to the evaluation prompts, their decode slots and KV cache
    (``components.workload.maxtext.answers_plan``)."""
    period, most = maxtext.checkpoint_period(spec), spec.maxtext.max_lost_steps
    each = maxtext.checkpoint_bytes(spec)
    answers = maxtext.answers_plan(spec)
    return {
        "checkpoints": {
            "period_steps": period,
            "max_lost_steps": most,
            "kept": maxtext.CHECKPOINTS_KEPT,
            "parameters": maxtext.parameters(spec),
            "bytes_each": each,
            "bytes_kept": None if each is None else each * maxtext.CHECKPOINTS_KEPT,
        },
        **({"answers": answers} if answers else {}),
    }


def _before_training(spec: RunSpec, cost: dict[str, Any]) -> dict[str, Any]:
    """The TPU chips billed before the first training step, at most: from the node pools' creation through the
    readiness wait (its deadline) and the slice check (its job's deadline) to the trainer's start. The image builds
    beside provision (the pipeline's DAG), so it adds nothing unless it outlasts provision."""
    shape, c = d.slice_shape(spec), spec.cluster
    chips = shape.num_chips * c.num_slices
    ready_s = ready_limits(spec).deadline_s
    check_s = 3 * c.slice_check_timeout_s if c.slice_check else 0.0  # the check job's deadline (stages.ray_stages)
    compile_s = cache_trust.compile_timeout_s(spec)  # the compile job's, when the cache lacks the configuration
    minutes = (ready_s + check_s + compile_s) / 60
    tpu = [ln for ln in cost["lines"] if ln["price_key"].startswith("tpu/")]
    per_chip_hour = tpu[0]["unit_usd"] if tpu and all(ln["unit_usd"] is not None for ln in tpu) else None
    return {
        "chips": chips,
        "readiness_s": ready_s,
        "slice_check_s": check_s,
        "compile_job_s": compile_s,
        "chip_minutes_at_most": round(chips * minutes, 1),
        "usd_at_most": None if per_chip_hour is None else round(chips * minutes / 60 * per_chip_hour, 2),
        "image_build": "beside provision",
    }


def build(spec: RunSpec, run_id: str, prices: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The plan of ``spec`` under ``run_id`` (names derive from it) priced from ``prices`` (default table): of its
    first candidate, the others listed (``candidates``)."""
    table = prices if prices is not None else pricing.load()
    ranked = candidates.ranked(spec, lambda placed: cost(placed, run_id, table)) if candidates.several(spec) else []
    spec = candidates.first(spec)
    listed = resources(spec, run_id)
    t = target(spec, run_id)
    priced = _cost(spec, listed, table)
    return {
        "plan_version": PLAN_VERSION,
        "run_id": t.run_id,
        "preset": spec.name,
        "platform": "gke",
        "label": names.labels(t.run_id),
        "project": t.project,
        "zone": t.zone,
        "region": t.region,
        "cluster": {
            "name": t.cluster,
            "mode": "autopilot" if t.autopilot else "standard",
            "location": t.location,
            "created_by_run": t.owns_cluster,
        },
        "slice": _slice_doc(spec),
        "resources": [res.to_dict() for res in listed],
        "identities": accounts.plan_identities(spec, t),
        "readiness": asdict(ready_limits(spec)),
        "training": _training(spec, t),
        "cost": priced,
        "limits": asdict(budget.limits(spec, priced)),
        "before_training": _before_training(spec, priced),
        "warnings": _warnings(spec, t, priced),
        "spec": spec.to_dict(),
        **candidates.section(ranked),
    }


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def to_json(plan: dict[str, Any]) -> str:
    return json.dumps(plan, indent=2) + "\n"


def kubernetes_objects(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [res["body"] for res in plan["resources"] if res["kind"].startswith("k8s/") and res["body"] is not None]


def manifest_files(plan: dict[str, Any]) -> dict[str, str]:
    """``NN-kind-name.yaml`` -> YAML text of each Kubernetes object, in apply order."""
    import yaml

    files = {}
    for index, obj in enumerate(kubernetes_objects(plan)):
        filename = f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        files[filename] = yaml.safe_dump(obj, sort_keys=False, width=100)
    return files


def render_text(plan: dict[str, Any]) -> str:
    """The plan as text (``components.platforms.gke.plan.text``)."""
    from components.platforms.gke.plan import text

    return text.render_text(plan)
