"""The compile cache's trusted path, in the train stage before the training job (``components.workload.cache_trust``
says who writes what): the verified entries of the cache kept across runs staged into the training job's own
directory; when the trusted manifest does not yet name the run's compile configuration (or an entry of it was
refused), a compile job first, whose output this process (the pipeline's identity) hashes and records before the
training job is submitted. What the training job compiles stays in its run.

The compile job is MaxText's own train step from the pinned image on synthetic inputs of the run's shapes
(``components.workload.maxtext.compile_args``: no dataset, tokenizer, weights or checkpoint), in fresh Ray Train
worker processes. It is trusted for when it runs: before any job of this run has loaded anything a user chose on the
cluster. So none runs once the run's training job was ever submitted (a retried train stage: that job's pods may have
run hostile code); that run's training job then compiles what is missing for itself.

The FSDP trainer keeps no shared compile cache: its directory is per run (TorchTPU's compiled executables and the
tokenised split), nothing staged into it and nothing promoted out of it. TorchTPU's cache is named only by vLLM's
TorchTPU backend (``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``, https://github.com/vllm-project/vllm-torchtpu/blob/main/
docs/user_guide/compilation_cache.md) and no public source gives its entries' keys or format, so nothing can say that a
compile-only run of the trainer writes the entries a training run reads, nor check one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from components.platforms import RunContext, get_platform
from components.platforms.store import read_json, write_json
from components.stages.jobs import JobFailed, LimitCrossed, log, run_job

if TYPE_CHECKING:
    from components.workload.cache_trust import Places

SUBMITTED = "jobs/train-submitted.json"  # in the run's store: the training job was submitted once (no compile job)


def prepare(ctx: RunContext, image: str) -> dict[str, Any] | None:
    """Before the training job: the verified entries staged, the compile job run and recorded when the cache lacks
    the run's compile configuration, and the training job marked as submitted. None when the run keeps no shared
    compile cache (no pinned ``image``, a platform without one, the FSDP trainer)."""
    from components.workload import cache

    platform, spec = get_platform(ctx.platform), ctx.spec
    places = platform.cache_places(ctx) if image and spec.train.workload == "maxtext" else None
    if places is None:
        return None
    try:
        result = _prepare(ctx, places, image)
    except LimitCrossed:  # the run's budget or deadline: the run stops
        raise
    except Exception as e:  # noqa: BLE001 - a cache problem is never a failed run (the storage's, the manifest's)
        log(f"WARNING: compile cache: {type(e).__name__}: {e}; the training job runs without the cache it lacks")
        result = {"error": f"{type(e).__name__}: {e}"}
    write_json(ctx.store, SUBMITTED, {"key": cache.key(spec, image)})
    return result


def _prepare(ctx: RunContext, places: Places, image: str) -> dict[str, Any]:
    from components.workload import cache, cache_trust, derive, maxtext

    spec = ctx.spec
    key, config = cache.key(spec, image), maxtext.compile_config(spec, derive.compile_devices(spec))
    staged = cache_trust.stage_in(places.shared, places.run, places.manifests, key, log)
    result: dict[str, Any] = {"staged": staged, "compile_job": None, "recorded": None}
    if config in staged["compiled"] and not staged["refused"]:
        log(
            f"compile cache: {staged['staged']} verified entries staged; this configuration is compiled: no compile job"
        )
    elif read_json(ctx.store, SUBMITTED):
        log(
            "compile cache: no compile job: this run's training job already ran on its cluster, whose processes may "
            "have loaded what the run's data or code chose; the training job compiles what is missing for itself"
        )
    else:
        result.update(_compile(ctx, places, key, config, image, staged))
    return result


def _compile(
    ctx: RunContext, places: Places, key: str, config: str, image: str, staged: dict[str, Any]
) -> dict[str, Any]:
    """The compile job, followed, and its output recorded; a failed one is a warning (the training job compiles)."""
    from components.workload import cache, cache_trust
    from components.workload.derive import job_command

    platform = get_platform(ctx.platform)
    nonce = cache_trust.new_nonce()  # this attempt's own directory: nothing written before the job is in it
    where = cache.directory(f"{platform.compile_job_root(ctx).rstrip('/')}/{nonce}", ctx.spec, image)
    out = f"{platform.job_output_dir(ctx).rstrip('/')}/compile"
    command = job_command(ctx.spec, "compile", out, f"{ctx.run_id}-compile", compile_cache=where)
    counted: dict[str, Any] = {}

    def on_record(kind: str, p: dict[str, Any]) -> None:
        if kind == "event" and p.get("event") == "compile_cache":
            counted.update(p)

    log(f"compile cache: compile job (synthetic inputs, the pinned image's trainer) into {where}")
    try:
        job = run_job(ctx, "compile", command, cache_trust.compile_timeout_s(ctx.spec), on_record)
    except LimitCrossed:
        raise
    except JobFailed as e:
        log(f"WARNING: compile cache: the compile job failed ({e}); nothing recorded, the training job compiles")
        return {"compile_job": {"failed": str(e)}}
    reported = job["result"].get("entries")
    if not isinstance(reported, dict) or not all(isinstance(v, str) for v in reported.values()):
        log("WARNING: compile cache: the compile job reported no entries; nothing recorded, the training job compiles")
        reported = {}
    recorded = cache_trust.record(places, key, ctx.run_id, config, staged["names"], reported, f"{nonce}/{key}", log)
    counts = {k: counted[k] for k in ("compiles", "hits", "seconds") if k in counted}
    return {"compile_job": {"job": job["submission_id"], **counts}, "recorded": recorded}
