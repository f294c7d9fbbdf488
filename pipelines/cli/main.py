"""``tpupipe``: run the pipeline locally, compile it, inspect presets and specs, build local images.

This module parses the arguments and holds the small commands; ``local_run`` runs the pipeline (``tpupipe run``) and
tears a run down (``tpupipe teardown``); ``cli_gke``, ``cli_vertex`` and ``cli_models`` add the gke, Vertex AI and
model registry commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines import check
from pipelines.cli.common import (
    add_allow_defaults,
    add_place,
    add_set,
    allow_defaults,
    overrides,
    refuse_placeholder,
    warn_same_day,
)
from pipelines.exits import fail

if TYPE_CHECKING:
    from pipelines.cli.common import Commands
    from pipelines.pipeline import Target

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
  tpupipe janitor --output-root gs://my-project-tpupipe/state --older-than 6h --dry-run   what gke runs left behind

Ctrl-C (or SIGTERM) during `tpupipe run` stops the running stage, runs teardown, prints what it deleted and exits
130 (143); a second Ctrl-C says what a third would leave behind; a third abandons teardown and prints the
`tpupipe teardown` command that finishes it.
"""


def cmd_presets(_args: argparse.Namespace) -> int:
    from components.spec import presets

    rows = []
    for name, layers in presets.PRESETS.items():
        cluster = layers.get("cluster", {})
        shape = cluster.get("accelerator", "cpu") + (f" {cluster['topology']}" if cluster.get("topology") else "")
        rows.append((name, shape, layers.get("train", {}).get("model_id", "")))
    name_width = max(len(name) for name, _, _ in rows)
    shape_width = max(len(shape) for _, shape, _ in rows)
    for name, shape, model in rows:
        print(f"{name:<{name_width}}  {shape:<{shape_width}}  {model}".rstrip())
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from components.spec import reference
    from components.workload import resolve

    spec = resolve(args.preset, overrides(args.set))
    if not args.explain:
        print(json.dumps(spec.to_dict(), indent=2))
        warn_same_day(spec.train.dataset)
        return 0
    text = reference.explain(args.explain)
    key = text.splitlines()[0]
    section, _, leaf = key.rpartition(".")
    value = getattr(getattr(spec, section), leaf) if section else getattr(spec, leaf)
    print(f"{text}\n  {args.preset}{' with --set' if args.set else ''}: {json.dumps(value)}")
    return 0


def _target(args: argparse.Namespace) -> Target:
    from components.spec import SpecError, names
    from pipelines.pipeline import Target

    names.check_project("--project", args.project)
    fields = {"--region": args.region, "--repository": args.repository}
    for flag, value in fields.items():
        if not value or not all(ch.isalnum() or ch == "-" for ch in value) or value != value.lower():
            raise SpecError(flag, f"{value!r} is not a Google Cloud name (lowercase letters, digits, '-')")
    if args.bucket and not args.bucket.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise SpecError("--bucket", f"{args.bucket!r} is not a bucket name")
    return Target(project=args.project, region=args.region, repository=args.repository, bucket=args.bucket)


def cmd_compile(args: argparse.Namespace) -> int:
    from components.spec.images import check_digest
    from pipelines.janitor import janitor_pipeline
    from pipelines.pipeline import compile_pipeline

    target = _target(args)
    digest = check_digest("--image-digest", args.image_digest) if args.image_digest else None
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    compile_pipeline(args.output, target, janitor_pipeline if args.pipeline == "janitor" else None, digest=digest)
    check.check(args.output, target.project, target.region)
    tag = "" if digest else ", by tag alone: not pinned (publish, submit, schedule pin it; --image-digest pins it here)"
    print(
        f"compiled pipeline: {args.output} (tasks run in {target.components_image(digest)}{tag}; runs default to "
        f"project {target.project}, bucket {target.run_bucket}); checked as Vertex AI will read it"
    )
    return 0


def cmd_check_pipeline(args: argparse.Namespace) -> int:
    check.check(args.file, args.project, args.region)
    print(f"{args.file}: Vertex AI can run it as compiled (every parameter typed, defaulted and described)")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from pipelines.publish.vertex import publish

    target = _target(args)
    if args.janitor_schedule and not args.kfp_host:  # the janitor's runs, every 15 minutes, as the account named
        from pipelines.backends.vertex import service_account

        service_account.refuse_default(args.service_account, args.allow_default_identities)
    result = publish(
        target,
        args.kfp_repository,
        args.version,
        build_account=args.build_service_account,
        allow_default=args.allow_default_identities,
    )
    if args.kfp_host:  # the same pinned pipeline on Kubeflow Pipelines, and the janitor's recurring run there
        from pipelines.cli.kfp import place_of
        from pipelines.publish.kfp import publish_kfp

        publish_kfp(target, result, place_of(args), args.janitor_schedule)
        return 0
    print(
        f"published: template {result.template} ({', '.join(result.tags)}) in {result.host}; tasks run in "
        f"{result.image} ({'built now' if result.built else 'already built'}). In the Vertex AI console: "
        f"Pipelines > Create run > Select from existing pipelines, repository {args.kfp_repository}."
    )
    from pipelines.backends.vertex import stopping

    if args.janitor_schedule:
        stopping.janitor_schedule(target.project, target.region, args.service_account)
    else:
        print(
            "publish: warning: --no-janitor: no janitor schedule. A Stop in the Vertex AI UI cancels the exit "
            "handler's teardown too, and a Stop between two tasks (each task starts a while after it is created) "
            "reaches no task: the run's TPUs stay up until `tpupipe janitor` or `tpupipe runs cancel` collects them"
        )
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """The images' environments side by side: creating one is mostly pip waiting on downloads and unpacking."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from components.platforms.local import envs

    images = list(dict.fromkeys(args.images or ["torch"]))
    for image in images:
        envs.env_for(image)  # an unknown image fails (exit 2) before any environment is started
    lock = threading.Lock()

    def log(message: str) -> None:  # one whole line at a time from the threads side by side
        with lock:
            print(message, flush=True)

    with ThreadPoolExecutor(len(images)) as pool:
        list(pool.map(lambda image: envs.ensure_env(image, log=log), images))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from pipelines.backends.local import run as local_run

    preset = args.preset_name or args.preset
    return local_run.run(
        preset,
        args.platform,
        overrides(args.set),
        args.run_id,
        args.output_root,
        args.pipeline_file,
        args.dry_run,
        args.verbose,
    )


def cmd_teardown(args: argparse.Namespace) -> int:
    """Delete what a run created, from its ledger and labels alone; exit 0 when nothing of it is left. --orphans: every
    local run under the output root whose driver is gone."""
    from pipelines.backends.local import run as local_run

    if args.orphans:
        return local_run.teardown_orphans(args.output_root, args.preset, overrides(args.set))
    if not args.run_id:
        return fail("RUN_ID: name the run to tear down (or --orphans: every local run whose driver is gone)")
    return local_run.teardown(args.run_id, args.platform, args.output_root, args.preset, overrides(args.set))


def _with_spec_args(p: argparse.ArgumentParser, preset_positional: bool = False) -> None:
    if preset_positional:
        p.add_argument("preset", nargs="?", default="local-fsdp", help="preset name (default local-fsdp)")
    else:
        p.add_argument("--preset", default="local-fsdp", help="preset name (default local-fsdp)")
    add_set(p, "override spec fields; dotted (train.epochs=2) or unique leaf names (epochs=2)")


def _with_target_args(p: argparse.ArgumentParser, project: str, region: str, offline: bool = False) -> None:
    """--project and --region (``add_place``), --repository and --bucket: where a compiled pipeline runs."""
    add_place(p, project, region, offline=offline)
    p.add_argument(
        "--repository",
        default="tpupipe",
        help="the Artifact Registry Docker repository of the components image (default tpupipe)",
    )
    p.add_argument("--bucket", default="", help="the bucket of checkpoints and run state (default PROJECT-tpupipe)")


def _add_run(sub: Commands) -> None:
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
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="stream kfp.local's whole output (each task's executor input and outputs, the Ray jobs' logs); by "
        "default the terminal shows each stage's progress and the summary, and the rest goes to "
        "<run dir>/logs/pipeline.log",
    )
    p.set_defaults(func=cmd_run)


def _add_teardown(sub: Commands) -> None:
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
    add_set(p, "gke, when the run left no ledger: the overrides it ran with (gke.project=...)")
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
        "gs://BUCKET/state. The same tree gives the same bytes. Offline, the image goes by its tag alone unless "
        "--image-digest pins it; publish, submit and schedule pin it to the digest Artifact Registry gives.",
    )
    _with_target_args(
        p,
        "the project the run form defaults to, whose Artifact Registry holds the components image",
        "the region of that registry and of the runs on Vertex AI",
        offline=True,
    )
    p.add_argument("--output", default=DEFAULT_PIPELINE_FILE, help=f"default {DEFAULT_PIPELINE_FILE}")
    p.add_argument(
        "--pipeline",
        choices=("tpupipe", "janitor"),
        default="tpupipe",
        help="tpupipe (default): the training pipeline; janitor: the sweep of what runs left behind, to "
        "schedule beside it",
    )
    p.add_argument("--image-digest", default="", metavar="sha256:HEX", help="pin every task's image to this digest")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser(
        "check-pipeline",
        help="check a compiled pipeline as Vertex AI will read it (offline); exit 2 naming each problem",
        description="Check a compiled pipeline offline as Vertex AI Pipelines will read it: the PipelineSpec "
        "parses, every parameter is typed, defaulted and described, the default pipeline root is gs://, and the "
        "SDK builds a job of it with the defaults. `tpupipe compile` runs the same check on what it compiles.",
    )
    p.add_argument("file", help="the compiled pipeline (YAML)")
    add_place(p, "the project the job is built for", "the Vertex AI region the job is built for", offline=True)
    p.set_defaults(func=cmd_check_pipeline)

    p = sub.add_parser(
        "publish",
        help="build the components image if missing and upload the pipeline template to Artifact Registry",
        description="Publish the pipeline for the Vertex AI UI: build the components image of this source tree with "
        "Cloud Build when its tag is missing from Artifact Registry, then upload the compiled template to an "
        "Artifact Registry KFP repository, tagged with --version, the git commit and latest. Needs Application "
        'Default Credentials with the roles docs/vertex.md lists ("Setup"). A Stop of a run needs no trigger, so there '
        "is no --stop-trigger: the stage the Stop's SIGTERM reaches sees its pipeline job cancelling and starts the "
        "deletion of the run's cluster within seconds; the janitor schedule, made by default, catches a Stop between "
        "two tasks "
        '(docs/vertex.md, "Stopping a run").',
    )
    _with_target_args(
        p,
        "the project the components image is built in, the template published to and the janitor scheduled in",
        "the region of its Artifact Registry repositories and of the janitor's schedule on Vertex AI",
    )
    p.add_argument(
        "--kfp-repository",
        default="tpupipe-pipelines",
        help="the Artifact Registry KFP repository of the templates (default tpupipe-pipelines; created if missing)",
    )
    p.add_argument("--version", default="", help="a version tag for the template, e.g. v1.2 (optional)")
    p.add_argument(
        "--build-service-account",
        default="",
        help="the service account Cloud Build builds the components image as (the caller needs "
        "iam.serviceAccounts.actAs on it); without it the project's default build account, refused unless "
        "--allow-default-identities",
    )
    add_allow_defaults(p)
    p.add_argument(
        "--no-janitor",
        dest="janitor_schedule",
        action="store_false",
        help="do not schedule the janitor pipeline. By default publish schedules it every 15 minutes (created if "
        "missing, replaced when it runs another image than the one published): it tears down each run whose "
        "pipeline job has ended, so a Stop between two tasks leaves the TPUs up 15 minutes at most",
    )
    # The flag of the releases where the schedule was opt-in: still taken, now the default.
    p.add_argument("--janitor-schedule", dest="janitor_schedule", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(janitor_schedule=True)
    p.add_argument("--service-account", default="", help="the service account the janitor's runs run as")
    from pipelines.cli.kfp import add_arguments as add_kfp

    add_kfp(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("validate", help="resolve a preset and overrides; print the spec or the error")
    _with_spec_args(p, preset_positional=True)
    p.add_argument(
        "--explain",
        metavar="KEY",
        default="",
        help="print KEY's meaning, default and allowed values (docs/config.md) and its value in the preset",
    )
    p.set_defaults(func=cmd_validate)

    from pipelines.cli import data as cli_data
    from pipelines.cli import gke as cli_gke
    from pipelines.cli import models as cli_models
    from pipelines.cli import runs as cli_runs
    from pipelines.cli import vertex as cli_vertex

    cli_data.add_commands(sub)
    cli_gke.add_commands(sub)
    cli_vertex.add_commands(sub)
    cli_models.add_commands(sub)
    cli_runs.add_commands(sub)

    p = sub.add_parser("presets", help="list the presets")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("env", help="create (or reuse, by content hash) local image environments")
    p.add_argument("images", nargs="*", help="image names under images/ (default: torch)")
    p.set_defaults(func=cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Bad input exits 2 with one message naming the field, and so does a Google Cloud that cannot be reached as the
    command needs (no credentials, no such project, an API not enabled, a permission denied: ``access_error``); an
    infrastructure failure exits 1 (teardown has run, and the summary says what it deleted)."""
    from components.spec import TpupipeError

    args = build_parser().parse_args(argv)
    allow_defaults(args)
    try:
        refuse_placeholder(args)
        code: int = args.func(args)  # the command's (each parser's ``func`` default)
        return code
    except TpupipeError as exc:
        return fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before a run started (the run's own handler takes over then)
        return fail("interrupted", 130)
    except Exception as exc:  # credentials, project, API or permission: one line naming the fix, exit 2
        from components.cloud.credentials import access_error

        error = access_error(exc)
        if error is None:
            raise
        return fail(str(error), error.exit_code)


if __name__ == "__main__":
    sys.exit(main())
