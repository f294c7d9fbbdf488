"""The gate in front of a registered model's champion, and what every version records of how it was made (see
docs/architecture.md, "The gate").

Every run that trains registers its model as a new version of ``spec.model_name`` (``gate.model``, else the
preset's name) with its provenance; the version becomes the champion only when its held-out loss is lower than the
champion's, both measured on the same held-out examples the same way (one evaluation key, :func:`known_figure`), by
at least ``gate.min_improvement`` (relative). The first version of a model, or the first after a model lost its
champion, becomes the champion. The decision is made here, once (:func:`decide`); the register stage records it and the
promote stage, under the pipeline's ``dsl.If``, acts on it.

Which registry a run uses is the platform's answer (``Platform.registry_place``): the local platform's directory
beside its runs, Vertex AI Model Registry of the project for gke runs. A registered version's checkpoint reaches the
cluster's jobs as a path they can read (``Platform.checkpoint_path``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from components.platforms import RunContext, get_platform
from components.registry import PROVENANCE_FIELDS, Registry, Version, digest, open_registry
from components.spec import CHAMPION, SCRATCH_PREFIX, RunSpec, SpecError, datasets, names
from components.spec.images import pinned_image

PROMOTE, KEEP, OFF = "promote", "keep", "off"  # the register stage's decision: its output the pipeline's dsl.If reads


def registry(ctx: RunContext) -> Registry:
    """The registry of the run's platform."""
    return open_registry(**get_platform(ctx.platform).registry_place(ctx))


# ---------------------------------------------------------------- registered versions as checkpoints


def starting_point(ctx: RunContext) -> dict[str, Any] | None:
    """The registered version ``train.init_from`` names, resolved now (at train time, not when the run was set up:
    a schedule's next run starts from the champion of its day): its reference, checkpoint URI, the path the cluster
    reads it at, and its held-out loss. None when training starts from ``train.model_id``: no ``train.init_from``,
    or ``train.init_from=champion`` of a model that has no champion yet (its first run: :func:`bootstrap`)."""
    ref = ctx.spec.init_from_ref
    if ref is None:
        return None
    name, version_ref = ref
    if ref == (ctx.spec.model_name, CHAMPION) and ctx.spec.gate.register and current_champion(ctx) is None:
        # A model's first run: a schedule's settings are fixed, and its first run has no champion by definition.
        return None
    reg = registry(ctx)
    try:
        version = reg.champion(name) if version_ref == CHAMPION else reg.get(name, version_ref)
    except SpecError as exc:
        raise SpecError("train.init_from", f"{ctx.spec.train.init_from}: {exc}") from None
    if version is None:
        raise SpecError(
            "train.init_from",
            f"model {name!r} has no {CHAMPION} yet in {reg.where}: run once without "
            f"train.init_from, or promote a version (tpupipe models promote {name} VERSION)",
        )
    _check_fits(ctx.spec, version)
    return {
        "ref": version.ref,
        "artifact_uri": version.artifact_uri,
        "path": get_platform(ctx.platform).checkpoint_path(ctx, version.artifact_uri),
        "eval_loss": version.provenance.get("eval_loss_after"),
    }


def bootstrap(spec: RunSpec) -> str:
    """What a run with ``train.init_from=champion`` that found no champion (``starting_point`` None) starts from, as
    its output's line and its provenance say it."""
    base = base_model(spec)
    return f"{spec.model_name} has no {CHAMPION} yet (its first run): training from the preset's base {base}"


def _check_fits(spec: RunSpec, version: Version) -> None:
    """A version's weights load over the architecture it was trained on: the same ``train.model_id``."""
    trained_on = version.provenance.get("model_id")
    if trained_on and trained_on != spec.train.model_id:
        raise SpecError(
            "train.init_from",
            f"{version.ref} was trained over train.model_id={trained_on}; this run's "
            f"train.model_id is {spec.train.model_id}: its weights do not load over it",
        )


def base_model(spec: RunSpec) -> str:
    """The architecture and tokenizer a run's weights belong to: ``train.model_id`` (FSDP) or ``maxtext.model_name``;
    every version records it as its provenance's ``model_id``."""
    return spec.train.model_id if spec.train.workload == "fsdp" else spec.maxtext.model_name


def current_champion(ctx: RunContext) -> Version | None:
    """The champion of the run's registered model now; None when the gate is off, the model is not registered yet or
    has no champion."""
    if not ctx.spec.gate.register:
        return None
    try:
        return registry(ctx).champion(ctx.spec.model_name)
    except SpecError as exc:
        if exc.field == "name":  # no such model yet: this run registers its first version
            return None
        raise


def other_base(spec: RunSpec, champion: Version) -> str | None:
    """Why ``champion`` cannot be measured beside this run's model, or None: it was trained over another base. A
    held-out loss is a mean over the tokens of its model's tokenizer, so the losses of two bases are figures over
    different token sequences and vocabularies and do not compare (docs/registry.md, "One base per registered
    model")."""
    trained_on = champion.provenance.get("model_id")
    if not trained_on or trained_on == base_model(spec):
        return None
    return f"{CHAMPION} {champion.ref} was trained over {trained_on}, this run over {base_model(spec)}"


def new_lineage(spec: RunSpec) -> str:
    """A model name for this run's base beside the registered one: ``<model>-<the base's last path part>``."""
    return names.model_name(f"{spec.model_name}-{base_model(spec).rstrip('/').rsplit('/', 1)[-1]}")


def check_lineage(ctx: RunContext) -> None:
    """Before anything starts (``tpupipe run``, and the pipeline's first task): a run over another base than its
    registered model's champion is refused, naming ``gate.model`` for a new lineage, instead of training in full and
    then finding that the gate cannot compare the two."""
    champion = current_champion(ctx)
    why = other_base(ctx.spec, champion) if champion else None
    if champion and why:
        raise SpecError(
            "gate.model",
            f"{ctx.spec.model_name}: {why}; their held-out losses do not compare, so the gate could not decide: "
            f"register this base as a model of its own (gate.model={new_lineage(ctx.spec)}), or train over "
            f"{champion.provenance['model_id']}",
        )


def champion_to_measure(ctx: RunContext) -> dict[str, Any] | None:
    """The champion the evaluation measures beside the new model: its reference, version and checkpoint path, read
    from the registry now. None when the gate is off, the model is not registered yet or has no champion. A champion
    over another base (one promoted since this run's first task checked) is not measured: ``not_compared`` says why,
    and the gate keeps it."""
    champion = current_champion(ctx)
    if champion is None:
        return None
    found = {"ref": champion.ref, "version": champion.version}
    why = other_base(ctx.spec, champion)
    if why:
        return {**found, "path": "", "not_compared": why}
    return {**found, "path": get_platform(ctx.platform).checkpoint_path(ctx, champion.artifact_uri)}


def known_figure(ctx: RunContext, ref: str, key: str | None) -> tuple[float, str] | None:
    """(held-out loss, the version that records it) of the registered version ``ref`` (``NAME@VERSION``) measured
    by a like run: one whose figure key (``ray_stages.figure_key``: the same examples, tokenizer, lengths and dtypes,
    image and accelerator) is ``key``, as the versions of its model record it: its own figure (``eval_loss_after``),
    or a later version's figure of it (as the champion measured beside it, or as the model it started from). Each
    version's provenance is written once, at registration, so the figure is the one measurement, found by any later
    like run wherever it runs; None when no version records one with that key (the evaluation measures it again:
    a version registered under another image or accelerator, or before figure keys were recorded)."""
    if not key:
        return None
    name = ref.split("@", 1)[0]
    try:
        versions = registry(ctx).versions(name)
    except SpecError:
        return None
    for version in versions:
        p = version.provenance
        if p.get("figure_key") != key:
            continue
        for field, holder in (("eval_loss_after", version.ref), ("champion_loss", p.get("champion_measured"))):
            if holder == ref and isinstance(p.get(field), float):
                return p[field], version.ref
        if p.get("base_model") == ref and isinstance(p.get("eval_loss_before"), float):
            return p["eval_loss_before"], version.ref
    return None


def known_initial_figure(ctx: RunContext, key: str | None) -> tuple[float, str] | None:
    """(held-out loss, the version that records it) of the model as initialised whose figure depends on ``key``
    (``ray_stages.initial_model_key``: MaxText's), as a version of the run's model records it (its
    ``eval_loss_before``, measured with that key); None when none does (the evaluation measures it)."""
    if not key:
        return None
    try:
        versions = registry(ctx).versions(ctx.spec.model_name)
    except SpecError:
        return None
    for version in versions:
        p = version.provenance
        if p.get("initial_key") == key and isinstance(p.get("eval_loss_before"), float):
            return p["eval_loss_before"], version.ref
    return None


def register_once(reg: Registry, name: str, artifact_uri: str, provenance: dict[str, Any]) -> Version:
    """A new version of ``name``, or the one this run registered already (same run id and checkpoint): a retried
    register task does not register the run's model twice."""
    try:
        earlier = reg.versions(name)
    except SpecError as exc:
        if exc.field != "name":
            raise
        earlier = []  # no such model yet: this is its first version
    for version in earlier:
        if version.provenance.get("run_id") == provenance["run_id"] and version.artifact_uri == artifact_uri:
            return version
    return reg.register(name, artifact_uri, provenance)


# ---------------------------------------------------------------- the decision


def not_held_out(spec: RunSpec) -> str | None:
    """Why this run's evaluation is no held-out figure, or None. With ``maxtext.dataset_type=synthetic`` MaxText's
    eval loop reads the very batch training reads: its synthetic iterator builds one batch of random tokens from
    ``jax.random.PRNGKey(0)`` and returns it on every call, train and eval alike (maxtext 0.2.5 on PyPI,
    ``maxtext/input_pipeline/synthetic_data_processing.py``, ``SyntheticDataIterator``). An FSDP evaluation of the
    training split is none either."""
    t = spec.train
    if t.workload == "maxtext" and spec.maxtext.dataset_type == "synthetic":
        return "maxtext.dataset_type=synthetic: MaxText evaluates on the same fixed batch it trains on"
    train_split, eval_split = datasets.splits(t.dataset, t.train_split, t.eval_split)
    if t.workload == "fsdp" and eval_split == train_split:
        return f"train.eval_split is train.train_split ({t.train_split!r}): the evaluation reads the training examples"
    return None


@dataclass(frozen=True)
class Decision:
    decision: str  # PROMOTE or KEEP
    reason: str  # one line with both figures, as the summary and the gate's table say it
    improvement: float | None = None  # (champion - new) / champion; None without a champion


def decide(
    new_loss: float, champion_loss: float | None, min_improvement: float, new_ref: str, champion_ref: str = ""
) -> Decision:
    """Promote the new version when there is no champion, or when its held-out loss is lower than the champion's
    by at least ``min_improvement`` of the champion's (relative). Equal is not better: a schedule whose run learns
    nothing keeps its champion."""
    if champion_loss is None:
        return Decision(
            PROMOTE, f"promoted {new_ref} to {CHAMPION}: there was no {CHAMPION} yet (held-out {new_loss:.4f})"
        )
    if not math.isfinite(new_loss):
        return Decision(
            KEEP,
            f"kept {CHAMPION} {champion_ref} (held-out {champion_loss:.4f}): {new_ref}'s held-out loss is {new_loss}",
        )
    # A champion at 0 (a loss no model goes below) cannot be bettered; its improvement is no number (None, not -inf:
    # the decision is recorded in JSON, which has no infinity).
    improvement = (champion_loss - new_loss) / champion_loss if champion_loss > 0 else None
    figures = f"held-out {new_loss:.4f} vs {CHAMPION} {champion_ref} {champion_loss:.4f}"
    needed = f"gate.min_improvement {min_improvement:.2%}"
    if improvement is None:
        return Decision(KEEP, f"kept {CHAMPION} {champion_ref}: {new_ref} {figures}, and no loss is below 0")
    if new_loss < champion_loss and improvement >= min_improvement:
        return Decision(
            PROMOTE, f"promoted {new_ref} to {CHAMPION}: {figures}, {improvement:.2%} better ({needed})", improvement
        )
    if new_loss < champion_loss:
        return Decision(
            KEEP,
            f"kept {CHAMPION} {champion_ref}: {new_ref} {figures}, {improvement:.2%} better, short of {needed}",
            improvement,
        )
    return Decision(
        KEEP,
        f"kept {CHAMPION} {champion_ref}: {new_ref} {figures}, "
        f"{'not better' if new_loss == champion_loss else f'{-improvement:.2%} worse'}",
        improvement,
    )


# ---------------------------------------------------------------- provenance


def tokens_seen(spec: RunSpec, history: list[dict[str, Any]]) -> int | None:
    """Training tokens processed up to the last epoch or step the checkpoint holds (padded sequences)."""
    if not history:
        return None
    last = history[-1]
    if "tokens_seen" in last:
        return int(last["tokens_seen"])
    if all("tokens" in r for r in history):  # MaxText: each kept step's global batch at its worker group's size
        return int(sum(r["tokens"] for r in history))  # (trainers.maxtext_train: an elastic group may be smaller)
    if "step" in last:  # MaxText before per-step tokens: steps x global batch x sequence length
        from components.workload import maxtext

        m = spec.maxtext
        per_step = m.per_device_batch_size * maxtext.devices_per_host(spec) * spec.total_hosts * m.max_target_length
        return int((last["step"] + 1) * per_step)
    return None


def _revision(spec: RunSpec, copy: dict[str, Any]) -> dict[str, Any]:
    """The hub revision of a hub model's weights (``train.model_revision``) and the commit it resolved to when the
    train stage copied them (``components.stages.base_weights``; None when it made no copy)."""
    t = spec.train
    hub = t.workload == "fsdp" and not t.model_id.startswith(SCRATCH_PREFIX) and t.model_id.count("/") == 1
    revision = copy.get("revision") or (t.model_revision if hub else None)
    return {"model_revision": revision, "model_commit": copy.get("commit")}


def provenance(
    spec: RunSpec,
    run_id: str,
    records: dict[str, dict[str, Any]],
    source_version: str = "",
    job_name: str = "",
    hosts_lost: int | None = None,
) -> dict[str, Any]:
    """Every field of ``components.registry.PROVENANCE_FIELDS`` from the results of the run's stages (``records``:
    stage -> its result; train, evaluate and build_image), plus what the gate and a later run need:
    ``model_id`` (the architecture the weights load over), the champion measured beside it and its figure."""
    train, ev, build = records.get("train", {}), records.get("evaluate", {}), records.get("build_image", {})
    data = records.get("snapshot_data") or {}
    c, t = spec.cluster, spec.train
    started = (train.get("init_from") or {}).get("ref")
    first = train.get("bootstrap")  # train.init_from=champion, and no champion yet
    base = started or (spec.maxtext.model_name if t.workload == "maxtext" else t.model_id)
    champion, task = ev.get("champion") or {}, ev.get("task") or {}
    found = {
        "preset": spec.name,
        "spec_hash": digest(spec.to_dict()),
        "base_model": base,
        "data_snapshot": data.get("snapshot") or train.get("data_snapshot"),
        "trainer_image": pinned_image(build),
        "git_sha": source_version or None,
        "accelerator": c.accelerator,
        "topology": c.topology or None,
        "slices": c.num_slices,
        "tokens_seen": tokens_seen(spec, train.get("history") or []),
        "restarts": train.get("restarts"),
        "preemptions": hosts_lost,
        "eval_loss_before": ev.get("eval_loss_before"),
        "eval_loss_after": ev.get("eval_loss_after"),
        "pipeline_job": job_name or None,
        "run_id": run_id,
        "model_id": base_model(spec),
        **_revision(spec, train.get("base_weights") or {}),
        "data_manifest": data.get("manifest"),  # what the run read, and every item its lineage has seen
        # the lineage's key file (its run store's data/keys.bin) and its sha256, which the next run under
        # train.data_since=champion checks it against (components.stages.dataset.champion_keys)
        "data_keys": (data.get("keys") or {}).get("uri"),
        "data_keys_digest": (data.get("keys") or {}).get("digest"),
        "eval_snapshot": data.get("eval_snapshot"),  # the fixed evaluation set it was judged on
        "eval_split": ev.get("eval_split"),
        "eval_key": ev.get("eval_key"),  # what its figures were measured on (known_figure finds them by it)
        "figure_key": ev.get("figure_key"),  # which runs' figures are like its own (known_figure finds them by it)
        "initial_key": ev.get("initial_key"),  # what eval_loss_before is of, when it is the model as initialised
        # train.init_from=champion and train.data_since=champion on a model's first run: both said here
        "init_from_champion": first or None,
        "data_since_champion": data.get("data_since"),
        "champion_measured": champion.get("ref"),
        "champion_loss": ev.get("champion_loss"),
        # its answers to the evaluation prompts: each task metric's mean, the file kept in the run's store and the
        # key a later run reuses them by; the champion's, when it answered in this run's evaluation job
        # (components.stages.answers.recorded_answers)
        "task_metrics": task.get("metrics_after"),
        "generation_key": task.get("generation_key"),
        "answers_key": task.get("answers_key"),
        "answers_uri": task.get("answers_uri"),
        "champion_answers_key": task.get("champion_answers_key"),
        "champion_answers_uri": task.get("champion_answers_uri"),
        # the team's scorer that scored them (eval.scorer) as the train job resolved it: its file under
        # trainers/scorers/ and the sha256 of its package's Python files (trainers.metrics.resolve_scorer)
        "scorer": (task.get("scorer") or {}).get("ref"),
        "scorer_file": (task.get("scorer") or {}).get("file"),
        "scorer_digest": (task.get("scorer") or {}).get("digest"),
    }
    assert set(PROVENANCE_FIELDS) <= set(found)
    return found
