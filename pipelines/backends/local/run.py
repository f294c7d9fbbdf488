"""The run driver behind ``tpupipe run`` and ``tpupipe teardown``: the compiled pipeline run with kfp.local on this
machine (each task a subprocess; the platform says where the run's resources are), the dry run of a gke run, and
the teardown of a run by its id. ``pipelines.cli.main`` parses the arguments and calls these."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.exits import fail

if TYPE_CHECKING:
    from components.platforms import RunContext


def default_run_id(preset: str) -> str:
    return f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(
    preset: str,
    platform_name: str,
    overrides: str,
    run_id: str,
    output_root: str,
    pipeline_file: str = "",
    dry_run: bool = False,
    verbose: bool = False,
) -> int:
    """Run the whole pipeline with kfp.local (``dry_run``: print its calls instead) and print its summary; the exit
    code: 0 when it succeeded (or was skipped: nothing new to learn), 1 when it failed, 128 + the signal when one
    stopped it."""
    from components.platforms import get_platform
    from components.stages import report
    from components.stages import runner as stages

    # Every input checked before anything is started: a SpecError here exits 2 (main).
    ctx = stages.context(preset, platform_name, overrides, run_id or default_run_id(preset), "", output_root)
    _check_unused(ctx)  # a run id is used once: before anything is checked against the cloud or created
    platform = get_platform(ctx.platform)
    platform.check(ctx)
    if dry_run:
        return _dry_run(ctx)
    platform.check_access(ctx)  # no credentials: one line (exit 2), not a failed provision task
    # kfp.local runs the tasks one at a time, and build_image, which needs nothing of provision, may come first:
    # preflight now, so its problems (exit 2, nothing created) come before an image is built; provision checks again
    # when it starts (nothing to check on a platform that calls no cloud).
    platform.preflight(ctx)
    from components.stages import gate

    if ctx.spec.init_from_ref:  # the version to start from exists now (train resolves it again when it starts)
        gate.starting_point(ctx)
    gate.check_lineage(ctx)  # the champion's base is this run's, or the gate could not compare: exit 2 now
    if ctx.store.exists("summary.json"):
        return fail(f"run_id: {ctx.run_id!r} already ran ({ctx.store.uri}); choose another run id")
    # The run id claimed, atomically, once every input is known good and before anything of the run is written (the
    # data snapshot below is): a second `tpupipe run` of it exits 2 here (components.stages.claims); the driver's
    # tasks claim as the driver.
    from components.stages import claims, dataset

    me = claims.local_claimant()
    claims.claim(ctx.store, ctx.run_id, ctx.platform, me, first=True, environ={})
    claims.claim_resources(ctx, me, create=True, environ={})
    # The data snapshot now: bad data (no such file or object, no permission, no examples, an example without the
    # prompt's fields) exits 2 before anything starts; the pipeline's snapshot_data stage reads this one.
    dataset.snapshot_data(ctx)

    import warnings

    from kfp import components, local

    from pipelines.pipeline import compile_pipeline, source_version

    if not pipeline_file:
        pipeline_file = str(ctx.run_dir / "pipeline.yaml")
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        compile_pipeline(pipeline_file, retries=False)  # the driver stops a stage on Ctrl-C: nothing retries it
    pipeline = components.load_component_from_file(pipeline_file)
    local_dir = ctx.store.local()  # the tasks get it absolute: they need not share this process's directory
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(ctx.run_dir / "kfp"), raise_on_error=False
    )
    import contextlib

    from pipelines.backends.local import driver
    from pipelines.backends.local.quiet import Quiet

    log = ctx.run_dir / "logs" / "pipeline.log"
    print(
        f"tpupipe: running {pipeline_file} with kfp.local, run {ctx.run_id}, platform {ctx.platform}"
        + ("" if verbose else f"; its whole output in {log} (--verbose shows it here)"),
        flush=True,
    )
    quiet = contextlib.nullcontext() if verbose else Quiet(log)
    crashed: Exception | None = None
    with driver.Interrupts(ctx, output_root) as interrupted, quiet:  # Ctrl-C, SIGTERM: stop, tear down, exit 130/143
        try:
            pipeline(
                preset=preset,
                platform=platform_name,
                overrides=overrides,
                run_id=ctx.run_id,
                output_root=str(local_dir.parent) if local_dir else output_root,
                project="",
                bucket="",
                source_version=source_version(),
            )
        except Exception as e:  # noqa: BLE001 - kfp.local itself failed (a task it could not start): no exit task ran
            crashed = e
            print(traceback.format_exc(), flush=True)  # to the log, with the run's other output
    if crashed is not None:
        return _teardown_after_crash(ctx, output_root, crashed, log if not verbose else None)
    if interrupted.abandoned:
        return interrupted.exit_abandoned()
    failed = 128 + interrupted.signum if interrupted.signum else 1
    summary_text = ctx.store.read_text("summary.json")
    if summary_text is None:
        where = "above" if verbose else f"in {log}"
        return fail(f"the pipeline wrote no summary ({ctx.store.uri}/summary.json); see the log {where}", failed)
    summary = json.loads(summary_text)
    print(report.format_table(summary))
    return 0 if summary["status"] in ("succeeded", "skipped") and not interrupted.signum else failed


def _teardown_after_crash(ctx: RunContext, output_root: str, crashed: Exception, log: Path | None) -> int:
    """kfp.local raised instead of running the pipeline to its end: its exit task, teardown, may never have run, so
    the driver tears down what the run's ledger holds itself, says so, and exits 1."""
    import signal

    from pipelines.backends.local.driver import teardown_command

    where = f"; the traceback in {log}" if log else ""
    print(
        f"tpupipe: kfp.local failed: {type(crashed).__name__}: {crashed}{where}; tearing down (Ctrl-C and a closed "
        f"terminal do not stop it; should this process be killed, `{teardown_command(ctx, output_root)}` finishes it)",
        flush=True,
    )
    # The driver's own handlers are gone with its Interrupts context: without these, a Ctrl-C or a hang-up would end
    # it part way, the cluster still up.
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGHUP)}
    try:
        code = teardown(ctx.run_id, ctx.platform, output_root)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if code:
        return code
    return fail(f"run {ctx.run_id} failed in kfp.local ({type(crashed).__name__}); torn down", 1)


def _check_unused(ctx: RunContext) -> None:
    """SpecError (exit 2) when the run's id has had a ledger under the output root, or a driver beats there
    (``pipelines.run_ids``): a second run would resume its checkpoints and write its outputs."""
    from components.platforms import heartbeat
    from components.platforms import ledger as ledgers
    from pipelines import run_ids

    run_ids.refuse_reused(ctx.run_id, ctx.store, heartbeat.fresh(ctx.store), ledgers.load(ctx.store) is not None)


def _dry_run(ctx: RunContext) -> int:
    """Print the calls the run would make, in order, and create nothing (gke: no credentials, no network)."""
    from components.platforms import get_platform
    from components.spec.images import IMAGE_WITH_DIGEST
    from components.stages import ray_stages
    from components.workload import cache

    named = ctx.spec.gke.image  # the compile cache as the run will key it: by the digest of the image it runs
    image = named if IMAGE_WITH_DIGEST.match(named) else "" if named else cache.UNKNOWN_IMAGE
    lines = get_platform(ctx.platform).dry_run(  # a platform without one raises SpecError: exit 2
        ctx,
        lambda mode: ray_stages.entrypoint(
            ctx, mode, checkpoint="<the checkpoint the train job reports>" if mode == "eval" else "", image=image
        ),
    )
    print(
        f"tpupipe run {ctx.spec.name} --platform {ctx.platform} --dry-run: the calls run {ctx.run_id} makes, in "
        "order; nothing is created"
    )
    print("\n".join(lines))
    return 0


def teardown_orphans(output_root: str, preset: str = "", overrides: str = "") -> int:
    """Tear down every local run under ``output_root`` whose driver is gone; the worst exit code of them."""
    from components.platforms.local.cluster import orphaned_runs

    found = orphaned_runs(Path(output_root))
    if not found:
        print(f"tpupipe teardown --orphans: no local run under {output_root} outlived its driver")
    return max([teardown(run_id, "local", output_root, preset, overrides) for run_id in found], default=0)


def teardown(run_id: str, platform_name: str, output_root: str, preset: str = "", overrides: str = "") -> int:
    """Delete what run ``run_id`` created, from its ledger and labels alone; 0 when nothing of it is left."""
    from components.platforms import get_platform
    from components.stages import runner

    ctx = runner.teardown_context(run_id, platform_name, output_root, preset, overrides)
    platform = get_platform(ctx.platform)
    result = platform.teardown(ctx)
    deleted = result.get("deleted") or []
    print(
        f"tpupipe teardown {ctx.run_id} ({ctx.platform}): "
        + (f"deleted {', '.join(deleted)}" if deleted else "nothing was left to delete")
    )
    left = platform.remaining(ctx)
    if left:
        return fail(f"still there after teardown: {', '.join(left)}", 1)
    return 0
