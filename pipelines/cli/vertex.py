"""The command line's pipeline commands: ``tpupipe submit``, ``tpupipe schedule …`` and ``tpupipe runs …``, on Vertex
AI, or on Kubeflow Pipelines given ``--kfp-host``. The backend is picked once (``backend_of``) and reached through the
one interface (``pipelines.backends.Backend``), whose normalised answers are formatted here alike for both. Bad input
exits 2 before any API call."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, Any

from pipelines.backends import VERTEX_STATES, Backend, Submission, get_backend
from pipelines.cli import kfp as cli_kfp
from pipelines.cli.common import add_place, add_set, overrides, warn_same_day

if TYPE_CHECKING:
    from pipelines.cli.common import Commands

EXAMPLES = """examples:
  tpupipe submit llama3-8b-v6e-16x2 --project my-project --wait
  tpupipe schedule create weekly-gemma gemma4-e2b-v6e-16 --cron "TZ=Europe/Paris 0 3 * * 1" --project my-project
  tpupipe runs list --state failed
  tpupipe runs cancel tpupipe-llama3-8b-v6e-16x2-20261130120000-3f9a2c
"""


def _labels(items: list[str] | None) -> dict[str, str]:
    from components.spec import SpecError

    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError("--label", f"{item!r} is not key=value")
        out[key] = value
    return out


def _overrides(args: argparse.Namespace) -> str:
    """The run's overrides: ``--set``'s, then what ``--data-since champion`` means, ``train.data_since=champion`` and,
    unless ``--set`` names a start of its own (which validation then refuses), ``train.init_from=champion``: a run
    that trains only on what the champion has not seen continues from the champion."""
    given = overrides(args.set)
    since = ["train.data_since=champion"] if args.data_since else []
    if since and not any(word.startswith("train.init_from=") for word in shlex.split(given)):
        since.append("train.init_from=champion")
    return " ".join([given, *since]).strip()


def _submission(args: argparse.Namespace, backend: Backend) -> Submission:
    """The run the flags describe, in the project the backend bills it to (``Backend.run_project``)."""
    overrides = _overrides(args)
    # the spec the project is read from is the run's: with --dataset's source (a bq:// dataset's own fields are valid
    # only beside it)
    dataset = f" train.dataset={shlex.quote(args.dataset)}" if args.dataset else ""
    project = backend.run_project(args.project, args.preset, overrides + dataset)
    return Submission(
        preset=args.preset,
        overrides=overrides,
        project=project,
        region=args.region,
        pipeline_root=args.pipeline_root or (f"gs://{project}-tpupipe/pipeline-root" if project else ""),
        template=args.template,
        service_account=args.service_account,
        network=args.network,
        labels=_labels(args.label),
        run_id=args.run_id,
        dataset=args.dataset,
    )


def _job_args(p: argparse.ArgumentParser, preset: bool = True) -> None:
    if preset:
        p.add_argument("preset", help="the preset (`tpupipe presets`)")
    add_set(p, "override spec fields")
    add_place(p, "the project the run's pipeline job runs in on Vertex AI", "the Vertex AI region of the job")
    cli_kfp.add_arguments(p)
    p.add_argument(
        "--pipeline-root",
        default="",
        help="gs:// path of the pipeline's artifacts (default "
        "gs://PROJECT-tpupipe/pipeline-root; always explicit, else the SDK makes a bucket per call)",
    )
    p.add_argument(
        "--template",
        default="",
        help="a compiled pipeline file or its Artifact Registry URL "
        "(default: compile this source tree for PROJECT and REGION)",
    )
    p.add_argument(
        "--service-account",
        default="",
        help="the service account the pipeline runs as: on Vertex AI a Google service account's e-mail; with "
        "--kfp-host the Kubernetes service account of the run's pods in --kfp-namespace (default: the server's "
        "runner), whose Google identity --kfp-service-account names",
    )
    p.add_argument(
        "--network", default="", help="the VPC network to peer the pipeline with (projects/N/global/networks/NAME)"
    )
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="a label of the job (repeatable)")
    p.add_argument("--run-id", default="", help="names every resource of the run (default: from the job name)")
    p.add_argument(
        "--dataset",
        default="",
        help="the examples to train on instead of the preset's (the run form's dataset field): gs://BUCKET/PREFIX/, "
        "gs://BUCKET/PATH/*.jsonl or bq://PROJECT.DATASET.TABLE; {date} is the schedule's date (YYYY-MM-DD, UTC), "
        "{date-1} the day before, {date:%%Y%%m%%d} in a format of date directives (bq://P.D.events_{date:%%Y%%m%%d}; "
        "docs/recurring.md)",
    )
    p.add_argument(
        "--data-since",
        choices=("champion",),
        default=None,
        help="train only on what the champion has not seen, continuing from it (train.data_since=champion "
        "train.init_from=champion; a model's first run starts from the preset's base and takes everything): a day "
        "with nothing new ends after the data snapshot, nothing created or billed",
    )


def backend_of(args: argparse.Namespace) -> Backend:
    """The backend the command's flags pick, once: Kubeflow Pipelines with --kfp-host, else Vertex AI."""
    if args.kfp_host:
        return get_backend(
            "kfp", place=cli_kfp.place_of(args), service_account=args.kfp_service_account, runner=args.kfp_runner
        )
    return get_backend("vertex", project=args.project, region=args.region)


def cmd_submit(args: argparse.Namespace) -> int:
    backend = backend_of(args)
    run = backend.submit(_submission(args, backend), publish_first=args.publish)
    print(f"submitted {' '.join(filter(None, (run.named, run.detail)))}\n  {run.url}", flush=True)
    if not args.wait:
        return 0
    outcome = backend.follow(run)
    print(f"{run.named}: {outcome.state}" + (f" — {outcome.failing}" if outcome.failing else ""))
    return 0 if outcome.succeeded else 1


def cmd_schedule(args: argparse.Namespace) -> int:
    backend = backend_of(args)
    noun = backend.schedule_noun
    if args.action == "create":
        sub = _submission(args, backend)
        made, cron = backend.schedule_create(
            sub, args.name, args.cron, args.max_concurrent, args.start, args.end, args.max_runs
        )
        print(f"{noun} {args.name} created: {made} ({cron}, at most {args.max_concurrent} at a time)")
        from components.workload import resolve

        warn_same_day(resolve(sub.preset, sub.resolved_overrides).train.dataset)
        return 0
    if args.action == "list":
        for s in backend.schedules():
            runs = "" if s.runs is None else f"{s.cron:<32} runs {s.runs}"
            print(f"{s.name:<28} {s.state:<10} {runs or s.cron}")
        return 0
    backend.schedule_action(args.name, args.action)
    print(f"{noun} {args.name}: {args.action}d")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    backend = backend_of(args)
    if args.action == "list":
        for row in backend.runs(args.preset, args.state):
            named = f"{row.id:<52}" if row.display_name is None else f"{row.id:<38} {row.display_name:<44}"
            print(f"{named} {row.state:<10} {row.created:<20} {row.preset}")
        return 0
    if args.action == "cancel":
        return backend.cancel(args.job, args.timeout)
    shown = backend.show(args.job)
    names = [shown.name] + ([] if shown.display_name is None else [shown.display_name])
    print(f"{'  '.join(names)}  {shown.state}  preset {shown.preset}\n  {shown.url}")
    for stage, state in shown.stages:
        print(f"  {stage:<20} {state.lower()}")
    for key, value in sorted(shown.metrics.items()):
        print(f"  {key:<20} {value}")
    if shown.cost is not None:
        print(f"  cost so far          {_usd(shown.cost)}")
    return 0


def _usd(cost: dict[str, Any]) -> str:
    if cost["usd"] is None:
        return "unknown (a price is missing from the table: see tpupipe plan)"
    return f"${cost['usd']:,.2f} ({cost['hours']:.2f} h at ${cost['usd_per_hour']:,.2f}/h, list prices)"


def add_commands(sub: Commands) -> None:
    p = sub.add_parser(
        "submit",
        help="submit a run to Vertex AI Pipelines",
        description="Submit a run of PRESET to Vertex AI Pipelines, or with --kfp-host URL to open-source Kubeflow "
        "Pipelines at URL (docs/kubeflow.md) (the spec is checked first: bad "
        "input exits 2 before any call, as does a components image missing from Artifact Registry); prints the "
        "job and its console URL. --wait follows the "
        "stages and exits 0 when the run succeeded, 1 (naming the failing stage) when not.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _job_args(p)
    p.add_argument("--wait", action="store_true", help="follow the run to its end; exit 0 or 1 with its outcome")
    p.add_argument(
        "--publish",
        action="store_true",
        help="publish this source tree first (`tpupipe publish`: its components image built if missing); without "
        "it, a tree whose image is not in Artifact Registry is refused (exit 2)",
    )
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "schedule",
        help="recurring runs on Vertex AI (create, list, pause, resume, delete)",
        description="Schedules of recurring runs (Vertex AI PipelineJobSchedule). Every scheduled run "
        "gets its own run id from its job name; at most --max-concurrent run at a time. With --kfp-host URL, each "
        "action works on the recurring runs of open-source Kubeflow Pipelines at URL instead (experiment tpupipe; "
        "the cron in UTC, no --max-runs: docs/kubeflow.md).",
    )
    actions = p.add_subparsers(dest="action", required=True)
    c = actions.add_parser("create", help="create a schedule NAME of PRESET on --cron")
    c.add_argument("name", help="the schedule's name")
    _job_args(c)
    c.add_argument(
        "--cron",
        required=True,
        help="when: 5 cron fields, optionally after TZ=ZONE, e.g. "
        '"TZ=Europe/Paris 0 3 * * 1" (Mondays at 03:00 in Paris)',
    )
    c.add_argument("--max-concurrent", type=int, default=1, help="runs at a time (default 1)")
    c.add_argument("--start", default="", help="RFC 3339 time of the first possible run (default now)")
    c.add_argument("--end", default="", help="RFC 3339 time after which no run starts (default never)")
    c.add_argument("--max-runs", type=int, default=0, help="stop after this many runs (default: no limit)")
    c.set_defaults(func=cmd_schedule)
    for action in ("list", "pause", "resume", "delete"):
        a = actions.add_parser(action, help=f"{action} schedules" if action == "list" else f"{action} schedule NAME")
        if action != "list":
            a.add_argument("name", help="the schedule's name")
        add_place(a, "the project of the schedules on Vertex AI", "their Vertex AI region")
        cli_kfp.add_arguments(a)
        a.set_defaults(func=cmd_schedule)

    p = sub.add_parser(
        "runs",
        help="list, show or cancel runs on Vertex AI",
        description="Runs on Vertex AI; with --kfp-host URL, on open-source Kubeflow Pipelines at URL "
        "(docs/kubeflow.md).",
    )
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser(
        "list",
        help="tpupipe's runs, newest first",
        description="tpupipe's runs (its jobs, by their tpupipe-preset label), newest first: job id, state, "
        "creation time (UTC), preset. A job id is tpupipe-PRESET-YYYYMMDDHHMMSS-XXXXXX (UTC, 6 random hex digits); "
        "a scheduled run's is the schedule's.",
    )
    a.add_argument("--preset", default="", help="only runs of this preset")
    a.add_argument("--state", default="", help=f"only runs in this state ({', '.join(VERTEX_STATES)})")
    add_place(a, "the project of the runs' pipeline jobs on Vertex AI", "their Vertex AI region")
    cli_kfp.add_arguments(a)
    a.set_defaults(func=cmd_runs)
    for action, text in (
        ("show", "a run's stages, figures and console URL"),
        ("cancel", "cancel a run, wait for its end, then tear it down from its ledger"),
    ):
        a = actions.add_parser(
            action,
            help=text,
            description=None
            if action == "show"
            else "Cancel the job and wait for it to end (each task's state printed). Vertex AI cancels every remaining "
            "task, the exit handler's teardown included, so this command then runs the teardown `tpupipe teardown "
            "RUN_ID --platform gke` runs, from the run's ledger in Cloud Storage, and prints what it deleted. Exit 0 "
            "when the job ended cancelled and nothing of the run is left.",
        )
        a.add_argument("job", help="the job id or resource name")
        if action == "cancel":
            a.add_argument(
                "--timeout", type=float, default=1800.0, help="seconds to wait for the job to end (default 1800)"
            )
        add_place(a, "the project of the run's pipeline job on Vertex AI", "its Vertex AI region")
        cli_kfp.add_arguments(a)
        a.set_defaults(func=cmd_runs)
