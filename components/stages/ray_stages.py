"""The stages that are Ray jobs on the run's cluster, the same on every platform: ``check_slice`` (every device of
the slice, before training), ``train`` (the trainer) and ``evaluate`` (held-out loss before and after training, and
the champion's beside them). Each submits its job through the Jobs API and follows it (``components.stages.jobs``);
its log is ``logs/<stage>.log`` of the run's store.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any

from components.platforms import RunContext, get_platform
from components.spec import CHAMPION, InfraError, RunSpec, datasets
from components.spec.protocol import Record
from components.stages import answers, base_weights, compile_cache, dataset, gate, goodput, progress
from components.stages.jobs import JobFailed, OnRecord, log, run_job
from components.workload import maxtext


def entrypoint(
    ctx: RunContext,
    mode: str,
    checkpoint: str = "",
    init_from: str = "",
    champion: str = "",
    measure: tuple[str, ...] = (),
    image: str | None = None,
    generate: tuple[str, ...] = (),
) -> str:
    """The command of the run's ``mode`` (check, train or eval) job, as the stage submits it; its compile cache keyed
    by ``image``, by default the pinned trainer image build_image recorded (none: no cache, a tag can move): the run's
    own copy, which ``compile_cache.prepare`` fills with the verified entries of the cache kept across runs."""
    from components.workload import cache
    from components.workload.derive import job_command

    platform = get_platform(ctx.platform)
    if image is None:
        image = trainer_image(ctx)
    compiled = cache.directory(platform.run_cache_root(ctx), ctx.spec, image) if image else ""
    out = platform.job_output_dir(ctx)
    return job_command(
        ctx.spec,
        mode,
        out,
        ctx.run_id,
        checkpoint,
        init_from,
        champion,
        compile_cache=compiled,
        measure=measure,
        generate=generate,
    )


def trainer_image(ctx: RunContext) -> str:
    """The pinned trainer image build_image recorded; empty when there is none (a tag can move: no cache)."""
    from components.platforms.store import read_json
    from components.spec.images import pinned_image

    return pinned_image((read_json(ctx.store, "stages/build_image.json") or {}).get("result") or {}) or ""


def figure_key(ctx: RunContext, eval_key: str | None) -> str | None:
    """``sha256:<hex>`` of what makes two held-out figures one measurement, so that only a like run reuses one
    recorded by another: the evaluation key (``trainers.heldout.eval_key``, ``trainers.maxtext_log.eval_key``: the
    examples, tokenizer, lengths, dtypes and device kind, and for MaxText the jax, jaxlib, libtpu and maxtext versions
    that ran it), the trainer image with its digest (a local environment's content hash; the build_image stage's
    record, :func:`trainer_image`: the code and libraries that computed it) and the accelerator with its generation
    (``cluster.accelerator``; a TPU family's GKE accelerator label and family: numerics differ between chips). None
    without an evaluation key or a pinned image (an image by tag alone can change under the same name): nothing is
    then reused, every figure is measured."""
    image = trainer_image(ctx)
    if not eval_key or not image:
        return None
    accelerator: str | dict[str, str] = ctx.spec.cluster.accelerator
    if accelerator != "cpu":
        from components.tpu import catalogue

        family = catalogue.family(ctx.spec.cluster.accelerator)
        accelerator = {"gke_accelerator": family.gke_accelerator, "generation": family.name}
    what = {"eval_key": eval_key, "image": image, "accelerator": accelerator}
    return "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def answers_key(ctx: RunContext, generation_key: str | None) -> str | None:
    """What a model's recorded answers and their scores are reused by: the trainer's generation key
    (``trainers.generation.generation_key``: the examples, tokenizer, lengths, dtypes, device, worker group, prompts,
    decoding, the task metrics and the team scorer with its module's source) with the trainer image's digest and the
    accelerator's generation added (:func:`figure_key`, as for a held-out figure): greedy decoding's argmax
    follows the library versions' kernels and the chip's numerics, so another image or chip answers again. None
    without a generation key or a pinned image: nothing is reused.

    The metrics and the scorer are in the key, rather than the answers kept alone and scored again under the current
    metrics: scoring runs in the trainer image (``rouge-score`` and the team's scorer ship there, not in the
    components image the stages run in), so scoring again would be a job of its own; and the scores kept are then
    the ones computed beside the answers, by the same code."""
    return figure_key(ctx, generation_key)


def history(records: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per-epoch (FSDP) or per-step (MaxText) metric records in order; after a restart, the figures of a
    re-run epoch or step replace the earlier ones."""
    latest: dict[int, dict[str, Any]] = {}
    for kind, payload in records:
        if kind == "metric":
            latest[payload["epoch"] if "epoch" in payload else payload["step"]] = payload  # FSDP's, MaxText's
    return [latest[k] for k in sorted(latest)]


class SliceCheckFailed(InfraError):
    """The slice check found bad ranks: the message names each rank and its host. Training does not start."""


def check_slice(ctx: RunContext, _upstream: str = "") -> dict[str, Any]:
    """Every device's collectives and tensor-parallel parity, as a Ray job on the training hosts, before training
    (``trainers.slice_check``); ``cluster.slice_check=false`` skips it."""
    c = ctx.spec.cluster
    if not c.slice_check:
        log("check_slice: skipped (cluster.slice_check=false)")
        return {"skipped": True, "reason": "cluster.slice_check=false"}
    seen: dict[str, Any] = {}

    def keep(kind: str, payload: dict[str, Any]) -> None:
        if kind == "result":
            seen.update(payload)

    # Its own waits (the slice's reservation, the actors, the checks) are each bounded by the timeout.
    try:
        job = run_job(ctx, "check_slice", entrypoint(ctx, "check"), 3 * c.slice_check_timeout_s, keep)
    except JobFailed:
        if seen.get("ok") is False:
            raise SliceCheckFailed(f"check_slice: {seen['failure']}") from None
        raise
    r = job["result"]
    log(
        f"check_slice: {r['ranks_verified']}/{r['num_ranks']} ranks verified on {r['num_hosts']} hosts "
        f"({r['device']}, {r['backend']}): max abs difference {r['max_abs_diff']:.3g}, all-reduce {r['all_reduce']:g} "
        f"(expected {r['expected_all_reduce']}), {r['seconds']:.1f}s"
    )
    if "bandwidth_bytes" in r:
        log(f"check_slice: {bandwidth_line(r)}")
    return {"job": job["submission_id"], **r}


def bandwidth_line(check: dict[str, Any]) -> str:
    """The slice check's timed all-reduce and its floor, in words."""
    figure = check.get("gbytes_per_s")
    measured = "one rank, no link to time" if figure is None else f"{figure:.3g} GB/s on the slowest rank"
    size = f"all-reduce of {check['bandwidth_bytes'] // 2**20} MiB: {measured}"
    if check.get("floor_gbytes_per_s") is None:
        return f"{size}, held to no floor ({check.get('floor_source') or 'none known'})"
    return f"{size}, floor {check['floor_gbytes_per_s']:.3g} GB/s ({check['floor_source']})"


def train(ctx: RunContext, _upstream: str = "") -> dict[str, Any]:
    """The trainer as a Ray job; ``train.init_from`` is resolved to a registered version's checkpoint now. A job lost
    to an eviction is submitted again when the cluster is back (``jobs.run_job``) and resumes from the run's newest
    checkpoint, as after a lost host."""
    t = ctx.spec.train
    start = gate.starting_point(ctx)
    first = ctx.spec.init_from_ref is not None and start is None  # init_from=champion, no champion yet
    if start:
        log(f"train: starting from {start['ref']} ({start['artifact_uri']}; held-out loss {start['eval_loss']})")
    elif first:
        log(f"train: train.init_from=champion: {gate.bootstrap(ctx.spec)}")

    dataset.stage_files(ctx)  # the snapshot's examples where the jobs read them
    base = base_weights.prepare(ctx, log)  # a hub model's weights where the jobs read them
    command = entrypoint(ctx, "train", init_from=start["path"] if start else "")
    # before the job is pointed at its directory: only verified entries in it, compiled by a compile job; what the
    # training job compiles there stays in this run (components.stages.compile_cache)
    compiled = compile_cache.prepare(ctx, trainer_image(ctx))
    job = run_job(ctx, "train", command, t.timeout_s, _train_progress(ctx.spec))
    rows = history(job["records"])
    events = [p for kind, p in job["records"] if kind == "event"]
    data: dict[str, Any] = next((p for p in reversed(events) if p.get("event") == "data"), {})
    timeline = goodput.timeline(job["records"])
    return {
        "job": job["submission_id"],
        "init_from": start,
        **({"bootstrap": gate.bootstrap(ctx.spec)} if first else {}),
        "data_snapshot": data.get("data_snapshot"),
        "num_train_examples": data.get("num_examples"),
        "restarts": restarts(events),
        # Each time the platform took the cluster back (a Kueue eviction) and the job was submitted again: Kueue's
        # reason, the waits until the cluster was back (not billed: the goodput ledger's "waiting for capacity").
        "evictions": job["evictions"],
        "first_step_at": first_step_at(job["records"]),
        "checkpoint": job["result"]["checkpoint"],
        "checkpoint_uri": get_platform(ctx.platform).checkpoint_uri(ctx, job["result"]["checkpoint"] or ""),
        "history": rows,
        "losses": [r["loss"] for r in rows],
        "steps": goodput.step_records(job["records"], timeline),
        "timeline": timeline,
        "tokens_per_s": rows[-1]["tokens_per_s"] if rows else None,
        "device": job["result"]["device"],
        "backend": job["result"]["backend"],
        "num_workers": job["result"]["num_workers"],
        "heldout": in_job_figures(job["result"], job["records"]),
        "answers": answers.from_records(job["records"]),  # to the evaluation prompts (trainers.generation)
        "base_weights": base,
        "compile_cache": compiled,
    }


def _train_progress(spec: RunSpec) -> OnRecord:
    """What the train job's records show while it runs: a progress bar of its steps (FSDP's ``step`` events carry
    their total and tokens, its losses come once an epoch; MaxText's per-step metrics carry the loss and tokens/s,
    ``maxtext.steps`` in all) and, for FSDP, a line per epoch."""
    seen: set[tuple[Any, ...]] = set()  # Ray may forward a worker's line twice; a re-run step after a restart differs
    bar = progress.Bar("train", spec.maxtext.steps, "steps", log)  # FSDP's records give its total
    last: dict[str, float] = {}  # the last loss known

    def on_record(kind: str, p: dict[str, Any]) -> None:
        key = (kind, p.get("event"), p.get("step"), p.get("epoch"), p.get("time"), p.get("loss"))
        if key in seen:
            return
        seen.add(key)
        if kind == "event" and p.get("event") == "step_losses" and p.get("losses"):
            last["loss"] = p["losses"][-1]
        elif kind == "event" and p.get("event") == "step" and p.get("total"):
            bar.update(p["step"], p.get("time"), last.get("loss"), tokens=p.get("tokens", 0.0), total=p["total"])
        elif kind == "metric" and "step" in p:  # MaxText: its step counts from 0
            last["loss"] = p["loss"]
            bar.update(p["step"] + 1, p.get("time"), p["loss"], rate=p.get("tokens_per_s"))
        elif kind == "metric" and "epoch" in p:
            log(
                f"train: epoch {p['epoch']}/{spec.train.epochs}  loss {p['loss']:.4f}  "
                f"{p['tokens_per_s']:.0f} tokens/s  ({p['epoch_s']:.2f}s)"
            )

    return on_record


def first_step_at(records: list[Record]) -> float | None:
    """When the trainer's first step ended (epoch seconds): its first ``step`` event (FSDP), or its first step's
    metric (MaxText); None when it stamped none."""
    times = [p["time"] for kind, p in records if "time" in p and (p.get("event") == "step" or kind == "metric")]
    return min(times) if times else None


def restarts(events: list[dict[str, Any]]) -> int:
    """How many times the trainer's worker group started again. Each start is stamped with its time: a line Ray
    forwarded twice is one start, not a restart."""
    return max(0, len({p.get("time") for p in events if p.get("event") == "worker_group_started"}) - 1)


def in_job_figures(result: dict[str, Any], records: list[Record]) -> dict[str, Any]:
    """What the train job measured on the held-out split in itself (``trainers.heldout.InJob``): the trained model's
    figure bound to the checkpoint it returns (its result's ``heldout``), the model as built from its ``eval``
    event, their key, and the seconds it spent on them. Empty when it measured nothing."""
    found = dict(result.get("heldout") or {})
    events = {(p["which"], p["time"]): p for kind, p in records if kind == "event" and p.get("event") == "eval"}
    before = next((p for (which, _), p in events.items() if which == "before"), None)
    if before and before["eval_key"] == found.get("eval_key", before["eval_key"]):
        found.update(eval_loss_before=before["eval_loss"], eval_key=before["eval_key"])
        found.setdefault("num_eval_examples", before["num_eval_examples"])
    if found:
        found["seconds"] = sum(p["seconds"] for p in events.values())
    return found


FIGURES = {"before": "eval_loss_before", "after": "eval_loss_after", "champion": "champion_loss"}


def known_figures(
    ctx: RunContext, train_result: dict[str, Any], start: dict[str, Any], champion: dict[str, Any]
) -> dict[str, Any]:
    """The figures the evaluation has before it starts anything, each with where it comes from: the train job's own
    (``in_job_figures``), and a registered version's (the "before" model started from, the champion) that the
    registry records as measured by a like run (the same :func:`figure_key`: evaluation key, image and accelerator;
    ``gate.known_figure``), and MaxText's model as initialised as a version records it with the same initial-model
    key (``initial_model_key``, ``gate.known_initial_figure``). A figure of another key is none: measured again."""
    figures = train_result.get("heldout") or {}
    key = figures.get("eval_key")
    like = figure_key(ctx, key)
    known = {which: (figures[name], "the train job") for which, name in FIGURES.items() if name in figures}
    for which, version in (("before", start), ("champion", champion)):
        if which not in known and version.get("ref") and version.get("path"):
            found = gate.known_figure(ctx, version["ref"], like)
            if found:
                known[which] = (found[0], f"{found[1]}'s record")
    initial = gate.known_initial_figure(ctx, initial_model_key(ctx, key)) if not start.get("ref") else None
    if "before" not in known and initial:
        known["before"] = (initial[0], f"{initial[1]}'s record")
    return known


# MaxText arguments that do not change the model as initialised or what its evaluation reads: the evaluation job's
# run of MaxText replaces the training figures (``trainers.maxtext_log.eval_args``: steps, learning rate, checkpoint
# period, run name), checkpoints and the output directory are the run's own, and the held-out file's and tokenizer's
# paths are per run while their bytes are in the evaluation key (``trainers.maxtext_log.eval_key``), and logging is
# not the model.
_NOT_OF_THE_INITIAL_MODEL = frozenset(
    (
        "steps",
        "learning_rate",
        "checkpoint_period",
        "max_num_checkpoints_to_keep",
        "jax_cache_dir",
        "base_output_directory",
        "run_name",
        "hf_train_files",
        "hf_eval_files",
        "tokenizer_path",
        *(arg.split("=", 1)[0] for arg in maxtext.QUIET_ARGS),
    )
)


def initial_model_key(ctx: RunContext, eval_key: str | None) -> str | None:
    """What the held-out figure of MaxText's model as initialised (its "before" model, which only an evaluation job
    measures: ``trainers.maxtext_log.in_job_eval_args``) depends on: the evaluation key (the examples, tokenizer,
    lengths, eval batch, dtypes and device), every MaxText argument that builds or initialises the model (all but
    ``_NOT_OF_THE_INITIAL_MODEL``), and the pinned trainer image and accelerator (:func:`figure_key`: MaxText's and
    JAX's code, the chip). The registry finds a recorded figure by it (``gate.known_initial_figure``), so a recurring
    run measures it once. None for the FSDP trainer (its train job measures the model as built in itself), without a
    key, or without a pinned image (an image by tag alone can change under the same name)."""
    like = figure_key(ctx, eval_key)
    if ctx.spec.train.workload != "maxtext" or not like:
        return None
    args = [a for a in maxtext.train_args(ctx.spec, "", "") if a.split("=", 1)[0] not in _NOT_OF_THE_INITIAL_MODEL]
    what = {"figure_key": like, "args": args}
    return "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def evaluate(ctx: RunContext, upstream: str) -> dict[str, Any]:
    """Held-out loss before and after training, of the checkpoint the train stage (``upstream``) reported, and of
    the registered model's champion beside them (``gate.champion_to_measure``, read from the registry now): the
    figures the gate compares. Each is measured once per model and evaluation key: the train job measures the model
    it trained (and the model as built) in itself, a registered version's figure with the same key is its record's,
    and an evaluation job measures only what is still missing, on the same held-out examples; with nothing missing
    no job starts. An evaluation the gate cannot use (``gate.not_held_out``) starts none either."""
    train_result = json.loads(upstream) if upstream else {}
    if not train_result.get("checkpoint"):
        raise JobFailed("evaluate: the train stage reported no checkpoint")
    measured = pin_checkpoint(ctx, train_result)
    start = train_result.get("init_from") or {}
    champion = gate.champion_to_measure(ctx) or {}
    if champion.get("not_compared"):
        log(f"evaluate: not measuring {champion['ref']}: {champion['not_compared']}")
    not_held_out = gate.not_held_out(ctx.spec)
    known = known_figures(ctx, train_result, start, champion)
    wanted = ["before", "after"] + (["champion"] if champion.get("path") else [])
    missing = () if not_held_out else tuple(w for w in wanted if w not in known)
    key_of = functools.partial(answers_key, ctx)
    recorded, answer = answers.plan_champion(
        ctx, train_result, champion, key_of
    )  # the champion's answers: kept, or again
    generate = ("champion",) if answer and not not_held_out else ()
    missing += tuple(w for w in generate if w not in missing)
    if generate:
        log(f"evaluate: {champion['ref']} answers the evaluation prompts again: no answers of its under this key")
    job: dict[str, Any] = {"records": []}
    result = {k: v for k, v in (train_result.get("heldout") or {}).items() if k not in ("seconds", *FIGURES.values())}
    result.update(device=train_result.get("device"), num_workers=train_result.get("num_workers"))
    if not_held_out:  # register keeps the champion whatever such a figure says (registration.register)
        log(f"evaluate: not held out: {not_held_out}; the gate does not promote on it, so nothing more is measured")
    if missing:
        log(f"evaluate: measuring {', '.join(missing)} in an evaluation job" + _sources(known))
        job = _evaluation_job(ctx, train_result["checkpoint"], start, champion, missing, generate)
        if known and job["result"].get("eval_key") != result.get("eval_key"):  # not the same yardstick: all again
            log("evaluate: the evaluation job read other held-out examples than the figures known: measuring all")
            known, missing = {}, tuple(wanted)
            job = _evaluation_job(ctx, train_result["checkpoint"], start, champion, missing, generate)
        result.update({k: v for k, v in job["result"].items() if k not in FIGURES.values()}, job=job["submission_id"])
        known.update({which: (job["result"][FIGURES[which]], "this evaluation job") for which in missing})
        if pin_checkpoint(ctx, train_result) != measured:  # the job read a checkpoint its pods could rewrite
            raise JobFailed(
                f"evaluate: checkpoint {measured['uri']} changed while the evaluation job measured it: its figures "
                "are of no one set of bytes; run the pipeline again under a new run id"
            )
    elif not not_held_out:
        log("evaluate: no evaluation job: every figure is known" + _sources(known))
    figures = {FIGURES[which]: loss for which, (loss, _) in known.items()}
    initial = initial_model_key(ctx, result.get("eval_key")) if "before" in known and not start else None
    if initial:  # what the "before" figure is of, for a later run's known_figures
        result["initial_key"] = initial
    like = figure_key(ctx, result.get("eval_key"))
    if like:  # which later runs are like this one, for their known_figures
        result["figure_key"] = like
    champion_known = "champion_loss" in figures
    result.update(figures, measured_by={which: where for which, (_, where) in known.items()})
    for which in ("before", "after", "champion"):
        if FIGURES[which] in figures:
            result[f"perplexity_{which}"] = math.exp(figures[FIGURES[which]])
    t = ctx.spec.train
    result.setdefault("eval_split", datasets.splits(t.dataset, t.train_split, t.eval_split)[1])
    if "eval_loss_after" in figures and "eval_loss_before" in figures:
        beside = f"  ({CHAMPION} {champion['ref']}: {figures['champion_loss']:.4f})" if champion_known else ""
        log(
            f"evaluate: {'eval' if not_held_out else 'held-out'} loss {figures['eval_loss_before']:.4f} -> "
            f"{figures['eval_loss_after']:.4f}  "
            f"perplexity {result['perplexity_before']:.2f} -> {result['perplexity_after']:.2f}{beside}"
        )
    if champion:
        result["champion"] = {k: v for k, v in champion.items() if k != "path"}
    if start:
        result["init_from"] = start["ref"]
    task = answers.evaluate_answers(ctx, train_result, champion, recorded, job["records"], key_of)
    if task:
        result["task"] = task
        log(answers.line(task))
    result[MEASURED] = measured  # what register copies, exactly (registration.register)
    return result


MEASURED = "measured_checkpoint"  # in evaluate's result: the checkpoint's uri and its files' versions


def pin_checkpoint(ctx: RunContext, train_result: dict[str, Any]) -> dict[str, Any]:
    """The trained checkpoint's uri and the version of each of its files now (``Platform.checkpoint_versions``: the
    object generations on Cloud Storage): what the evaluate stage measures, recorded in its result, so that register
    copies those bytes and no others."""
    platform = get_platform(ctx.platform)
    uri = trained_uri(ctx, train_result)
    return {"uri": uri, "versions": platform.checkpoint_versions(ctx, uri)}


def trained_uri(ctx: RunContext, train_result: dict[str, Any]) -> str:
    """Where the train stage's checkpoint lives for the pipeline's side (a local path, or gs://BUCKET/...)."""
    return train_result.get("checkpoint_uri") or get_platform(ctx.platform).checkpoint_uri(
        ctx, train_result["checkpoint"]
    )


def _sources(known: dict[str, tuple[float, str]]) -> str:
    """Where the figures the evaluation has came from, in words."""
    if not known:
        return ""
    return "; known: " + ", ".join(f"{which} ({where})" for which, (_, where) in known.items())


def _evaluation_job(
    ctx: RunContext,
    checkpoint: str,
    start: dict[str, Any],
    champion: dict[str, Any],
    measure: tuple[str, ...],
    generate: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The evaluation job measuring ``measure`` of before, after and champion (``generate`` of them answering the
    evaluation prompts too), followed with a progress bar."""
    command = entrypoint(
        ctx, "eval", checkpoint, start.get("path", ""), champion.get("path", ""), measure, generate=generate
    )
    bar = progress.Bar("evaluate", 0, "batches", log)

    def on_record(kind: str, p: dict[str, Any]) -> None:  # the evaluation's progress: its batches, model after model
        if kind == "event" and p.get("event") == "eval_model":
            bar.update(p["done"], p.get("time"), total=p["total"])

    return run_job(ctx, "evaluate", command, ctx.spec.train.timeout_s, on_record)
