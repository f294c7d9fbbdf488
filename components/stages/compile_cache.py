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

from typing import Any

from components.platforms import RunContext, get_platform
from components.platforms.store import read_json, write_json
from components.stages.jobs import JobFailed, log, run_job

SUBMITTED = "jobs/train-submitted.json"  # in the run's store: the training job was submitted once (no compile job)


def prepare(ctx: RunContext, image: str) -> dict[str, Any] | None:
    """Before the training job: the verified entries staged, the compile job run and recorded when the cache lacks
    the run's compile configuration, and the training job marked as submitted. None when the run keeps no shared
    compile cache (no pinned ``image``, a platform without one, the FSDP trainer)."""
    from components.workload import cache, cache_trust, maxtext

    platform, spec = get_platform(ctx.platform), ctx.spec
    places = platform.cache_places(ctx) if image and spec.train.workload == "maxtext" else None
    if places is None:
        return None
    key, config = cache.key(spec, image), maxtext.compile_config(spec)
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
    write_json(ctx.store, SUBMITTED, {"key": key})
    return result


def _compile(ctx: RunContext, places: Any, key: str, config: str, image: str, staged: dict) -> dict[str, Any]:
    """The compile job, followed, and its output recorded; a failed one is a warning (the training job compiles)."""
    from components.workload import cache, cache_trust
    from components.workload.derive import job_command

    platform = get_platform(ctx.platform)
    where = cache.directory(platform.compile_job_root(ctx), ctx.spec, image)
    out = f"{platform.job_output_dir(ctx).rstrip('/')}/compile"
    command = job_command(ctx.spec, "compile", out, f"{ctx.run_id}-compile", compile_cache=where)
    counted: dict[str, Any] = {}

    def on_record(kind: str, p: dict) -> None:
        if kind == "event" and p.get("event") == "compile_cache":
            counted.update(p)

    log(f"compile cache: compile job (synthetic inputs, the pinned image's trainer) into {where}")
    try:
        job = run_job(ctx, "compile", command, ctx.spec.train.timeout_s, on_record)
    except JobFailed as e:
        log(f"WARNING: compile cache: the compile job failed ({e}); nothing recorded, the training job compiles")
        return {"compile_job": {"failed": str(e)}}
    recorded = cache_trust.record(places, key, ctx.run_id, config, staged["names"], log)
    counts = {k: counted[k] for k in ("compiles", "hits", "seconds") if k in counted}
    return {"compile_job": {"job": job["submission_id"], **counts}, "recorded": recorded}
