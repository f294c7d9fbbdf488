"""``tpupipe``: run the pipeline locally, compile it, inspect presets and specs, build local images."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

DEFAULT_PIPELINE_FILE = "build/tpupipe_pipeline.yaml"

EPILOG = """examples:
  tpupipe run                                   the whole pipeline, local-fsdp preset, local platform
  tpupipe run --set "epochs=2 cluster.num_hosts=3"
  tpupipe compile --output build/tpupipe_pipeline.yaml
  tpupipe validate gemma4-e2b-v6e-16 --set train.epochs=1
  tpupipe presets
  tpupipe plan llama3-70b-v6e-16x2              what a gke run would create and cost (creates nothing)
  tpupipe preflight llama3-70b-v6e-16x2 --set gke.project=my-project   quota, reservation, APIs, permissions
  tpupipe publish --project my-project          the components image and the template, for the Vertex AI UI
  tpupipe submit llama3-8b-v6e-16x2 --project my-project --wait     a run on Vertex AI Pipelines
  tpupipe teardown local-fsdp-20261129-101500   delete what that run left (a killed driver, an abandoned teardown)
  tpupipe teardown --orphans                    the same for every local run whose driver is gone
  tpupipe janitor --output-root gs://my-project-tpupipe/runs --older-than 6h --dry-run   what gke runs left behind

Ctrl-C (or SIGTERM) during `tpupipe run` stops the running stage, runs teardown, prints what it deleted and exits
130 (143); a second Ctrl-C says what a third would leave behind; a third abandons teardown and prints the
`tpupipe teardown` command that finishes it.
"""


def _overrides(sets: list[str] | None) -> str:
    """--set may be given several times, each with one or more key=value items."""
    items = [item for s in (sets or []) for item in shlex.split(s)]
    return " ".join(shlex.quote(i) for i in items)


def _fail(message: str, code: int = 2) -> int:
    print(f"tpupipe: error: {message}", file=sys.stderr)
    return code


def cmd_presets(_args) -> int:
    from components.spec import presets

    for name, layers in presets.PRESETS.items():
        cluster = layers.get("cluster", {})
        shape = cluster.get("accelerator", "cpu") + (f" {cluster['topology']}" if cluster.get("topology") else "")
        print(f"{name:<24} {shape:<14} {layers.get('train', {}).get('model_id', '')}")
    return 0


def cmd_validate(args) -> int:
    from components.workload import resolve

    spec = resolve(args.preset, _overrides(args.set))
    print(json.dumps(spec.to_dict(), indent=2))
    return 0


def _target(args):
    from components.spec import SpecError
    from pipelines.pipeline import Target

    fields = {"--project": args.project, "--region": args.region, "--repository": args.repository}
    for flag, value in fields.items():
        if not value or not all(ch.isalnum() or ch == "-" for ch in value) or value != value.lower():
            raise SpecError(flag, f"{value!r} is not a Google Cloud name (lowercase letters, digits, '-')")
    if args.bucket and not args.bucket.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise SpecError("--bucket", f"{args.bucket!r} is not a bucket name")
    return Target(project=args.project, region=args.region, repository=args.repository, bucket=args.bucket)


def cmd_compile(args) -> int:
    from pipelines.pipeline import compile_pipeline

    target = _target(args)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    if args.pipeline == "janitor":
        from pipelines.janitor import janitor_pipeline

        compile_pipeline(args.output, target, janitor_pipeline)
    else:
        compile_pipeline(args.output, target)
    print(
        f"compiled pipeline: {args.output} (tasks run in {target.image('...')[:-4]}:<source hash>; runs default to "
        f"project {target.project}, bucket {target.run_bucket})"
    )
    return 0


def cmd_publish(args) -> int:
    from pipelines.publish import publish

    target = _target(args)
    result = publish(target, args.kfp_repository, args.version)
    print(
        f"published: template {result.template} ({', '.join(result.tags)}) in {result.host}; tasks run in "
        f"{result.image} ({'built now' if result.built else 'already built'}). In the Vertex AI console: "
        f"Pipelines > Create run > Select from existing pipelines, repository {args.kfp_repository}."
    )
    return 0


def cmd_env(args) -> int:
    from components.platforms.local import envs

    for image in args.images or ["torch"]:
        try:
            envs.ensure_env(image)
        except ValueError as exc:
            return _fail(str(exc))
    return 0


def cmd_plan(args) -> int:
    """Print every resource a gke run would create and its cost; create nothing, need no credentials."""
    from components.platforms.gke import plan
    from components.spec import SpecError
    from components.tpu import pricing

    spec, run_id = _gke_run(args)
    try:
        prices = pricing.load(args.prices)
    except pricing.PriceError as exc:  # the price table is data: its errors become the flag's
        raise SpecError("--prices", str(exc)) from None
    document = plan.build(spec, run_id, prices)
    if args.manifests:
        out = Path(args.manifests)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in plan.manifest_files(document).items():
            (out / name).write_text(text)
    sys.stdout.write(plan.to_json(document) if args.output == "json" else plan.render_text(document))
    if args.manifests and args.output != "json":
        print(f"manifests: {len(plan.kubernetes_objects(document))} Kubernetes objects in {args.manifests}")
    return 0


def cmd_preflight(args) -> int:
    """Check quota, reservation, APIs, permissions and an existing cluster before a gke run: every problem in one
    report, exit 2 when there is one; creates nothing."""
    from components.platforms import RunContext
    from components.platforms.gke import preflight
    from components.platforms.gke.platform import GkePlatform
    from components.platforms.store import LocalStore

    spec, run_id = _gke_run(args)
    ctx = RunContext(spec=spec, run_id=run_id, store=LocalStore(Path(".")), platform="gke")
    report = GkePlatform(log=lambda m: None).preflight(ctx)
    sys.stdout.write(preflight.render(spec, run_id, report))
    return 0


def cmd_janitor(args) -> int:
    """Tear down every gke run under the output root that is finished or older than its limit; --dry-run lists it."""
    from components.platforms.gke import janitor

    older = janitor.parse_age(args.older_than) if args.older_than else None
    sweep = janitor.Janitor(args.output_root, tuple(args.project or ()), older, log=lambda m: None).sweep(args.dry_run)
    sys.stdout.write(janitor.render(sweep, args.dry_run))
    if sweep.failed:
        return _fail("janitor: could not tear down " + "; ".join(f"{k}: {v}" for k, v in sweep.failed.items()), 1)
    return 0


def default_run_id(preset: str) -> str:
    return f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"


def cmd_run(args) -> int:
    from components.platforms import get_platform
    from components.stages import report
    from components.stages import runner as stages

    overrides = _overrides(args.set)
    preset = args.preset_name or args.preset
    # Every input checked before anything is started: a SpecError here exits 2 (main).
    ctx = stages.context(preset, args.platform, overrides, args.run_id or default_run_id(preset), "", args.output_root)
    get_platform(ctx.platform).check(ctx)
    if args.dry_run:
        return _dry_run(ctx)
    if ctx.spec.init_from_ref:  # the version to start from exists now (train resolves it again when it starts)
        from components.stages import gate

        gate.starting_point(ctx)
    if ctx.store.exists("summary.json"):
        return _fail(f"run_id: {ctx.run_id!r} already ran ({ctx.store.uri}); choose another run id")

    import warnings

    from kfp import components, local

    from pipelines.pipeline import compile_pipeline, source_version

    pipeline_file = args.pipeline_file
    if not pipeline_file:
        pipeline_file = str(ctx.run_dir / "pipeline.yaml")
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        compile_pipeline(pipeline_file)
    pipeline = components.load_component_from_file(pipeline_file)
    local_dir = ctx.store.local()  # the tasks get it absolute: they need not share this process's directory
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(ctx.run_dir / "kfp"), raise_on_error=False
    )
    print(f"tpupipe: running {pipeline_file} with kfp.local, run {ctx.run_id}, platform {ctx.platform}", flush=True)
    from pipelines import driver

    with driver.Interrupts(ctx, args.output_root) as interrupted:  # Ctrl-C, SIGTERM: stop, tear down, exit 130/143
        pipeline(
            preset=preset,
            platform=args.platform,
            overrides=overrides,
            run_id=ctx.run_id,
            output_root=str(local_dir.parent) if local_dir else args.output_root,
            project="",
            bucket="",
            source_version=source_version(),
        )
    if interrupted.abandoned:
        return interrupted.exit_abandoned()
    failed = 128 + interrupted.signum if interrupted.signum else 1
    summary_text = ctx.store.read_text("summary.json")
    if summary_text is None:
        return _fail(f"the pipeline wrote no summary ({ctx.store.uri}/summary.json); see the log above", failed)
    summary = json.loads(summary_text)
    print(report.format_table(summary))
    return 0 if summary["status"] == "succeeded" and not interrupted.signum else failed


def cmd_teardown(args) -> int:
    """Delete what a run created, from its ledger and labels alone; exit 0 when nothing of it is left. --orphans: every
    local run under the output root whose driver is gone."""
    if args.orphans:
        from components.platforms.local.cluster import orphaned_runs

        found = orphaned_runs(Path(args.output_root))
        if not found:
            print(f"tpupipe teardown --orphans: no local run under {args.output_root} outlived its driver")
        return max([_teardown(run_id, "local", args) for run_id in found], default=0)
    if not args.run_id:
        return _fail("RUN_ID: name the run to tear down (or --orphans: every local run whose driver is gone)")
    return _teardown(args.run_id, args.platform, args)


def _teardown(run_id: str, platform_name: str, args) -> int:
    from components.platforms import get_platform
    from components.stages import runner

    ctx = runner.teardown_context(run_id, platform_name, args.output_root, args.preset, _overrides(args.set))
    platform = get_platform(ctx.platform)
    result = platform.teardown(ctx)
    deleted = result.get("deleted") or []
    print(
        f"tpupipe teardown {ctx.run_id} ({ctx.platform}): "
        + (f"deleted {', '.join(deleted)}" if deleted else "nothing was left to delete")
    )
    left = platform.remaining(ctx)
    if left:
        return _fail(f"still there after teardown: {', '.join(left)}", 1)
    return 0


def _dry_run(ctx) -> int:
    """Print the calls the run would make, in order, and create nothing (gke: no credentials, no network)."""
    from components.platforms import get_platform
    from components.stages import runner

    platform = get_platform(ctx.platform)
    if not hasattr(platform, "dry_run"):
        return _fail(
            f"--dry-run: the {ctx.platform} platform has no dry run; it creates only processes on this "
            "machine (try --platform gke)"
        )
    lines = platform.dry_run(
        ctx,
        lambda mode: runner.entrypoint(
            ctx, mode, checkpoint="<the checkpoint the train job reports>" if mode == "eval" else ""
        ),
    )
    print(
        f"tpupipe run {ctx.spec.name} --platform {ctx.platform} --dry-run: the calls run {ctx.run_id} makes, in "
        "order; nothing is created"
    )
    print("\n".join(lines))
    return 0


def _with_spec_args(p, preset_positional=False):
    if preset_positional:
        p.add_argument("preset", nargs="?", default="local-fsdp", help="preset name (default local-fsdp)")
    else:
        p.add_argument("--preset", default="local-fsdp", help="preset name (default local-fsdp)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE ...",
        help="override spec fields; dotted (train.epochs=2) or unique leaf names (epochs=2)",
    )


def _with_gke_run_args(p) -> None:
    """PRESET, --set and --run-id: a gke run as `tpupipe plan` and `tpupipe preflight` see it (``_gke_run``)."""
    p.add_argument("preset", help="preset name (`tpupipe presets`)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE ...",
        help="override spec fields; dotted (cluster.num_slices=4) or unique leaf names",
    )
    p.add_argument("--run-id", default="", help="the run id every name derives from (default: the preset name)")


def _gke_run(args):
    """(spec, run id) of PRESET --set ... --run-id; a cpu preset is a SpecError (it runs on the local platform)."""
    from components.platforms.gke import plan
    from components.spec.names import run_id_from
    from components.workload import resolve

    spec = resolve(args.preset, _overrides(args.set))
    plan.check_plannable(spec)
    return spec, run_id_from(args.run_id, args.preset)


def _with_target_args(p) -> None:
    import os

    p.add_argument(
        "--project",
        default=os.environ.get("GOOGLE_CLOUD_PROJECT", "my-project"),
        help="the Google Cloud project (default $GOOGLE_CLOUD_PROJECT, else the placeholder my-project)",
    )
    p.add_argument(
        "--region",
        default="us-east5",
        help="the region of the registry and of Vertex AI (default us-east5, where v6e and TPU7x slices are)",
    )
    p.add_argument(
        "--repository",
        default="tpupipe",
        help="the Artifact Registry Docker repository of the components image (default tpupipe)",
    )
    p.add_argument("--bucket", default="", help="the bucket of checkpoints and run state (default PROJECT-tpupipe)")


def _add_run(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run the whole pipeline with kfp.local",
        description="Run the whole pipeline with kfp.local: provision, build image, deploy the RayCluster, train, "
        "evaluate, and teardown whatever happens. --platform local (the default) runs it on this machine: a Ray "
        "head and one raylet per emulated host, real Ray Jobs and Ray Train on CPU. --platform gke runs it on "
        "Google Cloud in gke.project with your Application Default Credentials (gcloud auth "
        "application-default login); `tpupipe plan` first prints every resource it creates and its hourly cost. "
        "Ctrl-C (SIGINT) or SIGTERM stops the running stage (its Ray job, cloud operation or cluster start), runs "
        "teardown, prints what it deleted and exits 130 (143); a second Ctrl-C says what a third would leave behind; a "
        "third abandons teardown and prints the `tpupipe teardown` command that finishes it. Closing the terminal "
        "(SIGHUP) does what Ctrl-C does; the output then goes to <run dir>/logs/driver.log.",
    )
    _with_spec_args(p)
    p.add_argument("preset_name", nargs="?", default="", metavar="PRESET", help="the preset (same as --preset)")
    p.add_argument("--platform", default="local", help="local (default) or gke")
    p.add_argument("--run-id", default="", help="names every resource of the run (default: preset + time)")
    p.add_argument("--output-root", default="runs", help="where run directories go (default ./runs)")
    p.add_argument("--pipeline-file", default="", help="a compiled pipeline YAML to run (default: compile now)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="gke: print every call the run would make, stage by stage, in order (the plan's records, the "
        "job commands, teardown's deletes); needs no credentials and creates nothing",
    )
    p.set_defaults(func=cmd_run)


def _add_teardown(sub) -> None:
    p = sub.add_parser(
        "teardown",
        help="delete what a run created, by its run id (after a lost or abandoned run)",
        description="Delete everything a run created, found from its ledger (<output root>/<run id>/ledger.json) and "
        "its labels alone: on the local platform its processes (the Ray head, the hosts, their keeper, anything that "
        "carries the run's marker), on gke its Kubernetes objects, node pools or cluster, bucket binding and Compute "
        "Engine resources. Safe to run again; exits 0 when nothing of the run is left.",
    )
    p.add_argument(
        "run_id", metavar="RUN_ID", nargs="?", default="", help="the run's id (the last part of its run directory)"
    )
    p.add_argument(
        "--orphans",
        action="store_true",
        help="instead of RUN_ID: every local run under the output root whose driver (its `tpupipe run`) is "
        "gone while processes of it still run",
    )
    p.add_argument("--platform", default="", help="local or gke (default: as the run's ledger says, else local)")
    p.add_argument("--output-root", default="runs", help="where the run's directory is (default ./runs)")
    p.add_argument("--preset", default="", help="gke, when the run left no ledger: the preset it ran")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE ...",
        help="gke, when the run left no ledger: the overrides it ran with (gke.project=...)",
    )
    p.set_defaults(func=cmd_teardown)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpupipe",
        description="Train and fine-tune LLMs on Cloud TPU slices from one Kubeflow pipeline; "
        "the local platform runs the whole pipeline on this machine.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_teardown(sub)

    p = sub.add_parser(
        "compile",
        help="compile the pipeline to YAML (what Vertex AI Pipelines runs); offline, no credentials",
        description="Compile the pipeline for Vertex AI Pipelines. Every task runs in the components image of this "
        "exact source tree, REGION-docker.pkg.dev/PROJECT/REPOSITORY/pipeline:<hash of its build context> "
        "(`tpupipe publish` builds it), and the run form defaults to a gke run in PROJECT with its state under "
        "gs://BUCKET/runs. The same tree gives the same bytes.",
    )
    _with_target_args(p)
    p.add_argument("--output", default=DEFAULT_PIPELINE_FILE, help=f"default {DEFAULT_PIPELINE_FILE}")
    p.add_argument(
        "--pipeline",
        choices=("tpupipe", "janitor"),
        default="tpupipe",
        help="tpupipe (default): the training pipeline; janitor: the sweep of what runs left behind, to "
        "schedule beside it",
    )
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser(
        "publish",
        help="build the components image if missing and upload the pipeline template to Artifact Registry",
        description="Publish the pipeline for the Vertex AI UI: build the components image of this source tree with "
        "Cloud Build when its tag is missing from Artifact Registry, then upload the compiled template to an "
        "Artifact Registry KFP repository, tagged with --version, the git commit and latest. Needs Application "
        "Default Credentials with the roles the README lists.",
    )
    _with_target_args(p)
    p.add_argument(
        "--kfp-repository",
        default="tpupipe-pipelines",
        help="the Artifact Registry KFP repository of the templates (default tpupipe-pipelines; created if missing)",
    )
    p.add_argument("--version", default="", help="a version tag for the template, e.g. v1.2 (optional)")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("validate", help="resolve a preset and overrides; print the spec or the error")
    _with_spec_args(p, preset_positional=True)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="every resource a gke run would create and its cost; creates nothing")
    _with_gke_run_args(p)
    p.add_argument("--output", choices=("text", "json"), default="text", help="text (default) or one JSON document")
    p.add_argument(
        "--manifests",
        metavar="DIR",
        default="",
        help="write each Kubernetes object the run would apply to DIR as a YAML file",
    )
    p.add_argument(
        "--prices",
        metavar="FILE",
        default="",
        help="a JSON price table that replaces or adds to the built-in one (keys like tpu/v6e/spot)",
    )
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "preflight",
        help="check quota, reservation, APIs, permissions and an existing cluster; creates nothing",
        description="Before a gke run spends anything: the region's TPU quota for the chips the plan needs, the "
        "reservation (cluster.capacity=reservation) exists and has room, the APIs the plan calls are enabled, the "
        "caller holds the IAM permissions the plan needs, and a cluster named by gke.cluster_name has what the run "
        "needs (or GKE can enable it in place). Read-only calls with your Application Default Credentials; every "
        "problem in one report; exits 2 when there is one. provision runs the same checks first.",
    )
    _with_gke_run_args(p)
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser(
        "janitor",
        help="delete what gke runs left behind (finished, or older than their limit)",
        description="Find every gke run under the output root by its ledger, and clusters labelled tpupipe-run whose "
        "run left no ledger, in the runs' projects and those named by --project; tear down each one that is finished "
        "or older than its limit (--older-than, else the longest its stages may wait), newest resource first, with "
        "the teardown every run uses. A second sweep finds nothing. `tpupipe compile --pipeline janitor` gives the "
        "same sweep as a pipeline to schedule.",
    )
    p.add_argument(
        "--output-root",
        default="runs",
        help="where the runs' directories are: gs://BUCKET/runs on Vertex AI, or a local directory (default ./runs)",
    )
    p.add_argument(
        "--older-than",
        default="",
        metavar="AGE",
        help="collect runs started longer ago than AGE (6h, 90m, 2d); default: each run's own limit",
    )
    p.add_argument(
        "--project",
        action="append",
        metavar="PROJECT",
        help="also search this project for clusters labelled tpupipe-run (repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    p.set_defaults(func=cmd_janitor)

    from pipelines import cli_models, cli_vertex

    cli_vertex.add_commands(sub)
    cli_models.add_commands(sub)

    p = sub.add_parser("presets", help="list the presets")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("env", help="create (or reuse, by content hash) local image environments")
    p.add_argument("images", nargs="*", help="image names under images/ (default: torch)")
    p.set_defaults(func=cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Bad input exits 2 with one message naming the field; an infrastructure failure exits 1 (teardown has run, and
    the summary says what it deleted)."""
    from components.spec import TpupipeError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TpupipeError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before a run started (the run's own handler takes over then)
        return _fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
