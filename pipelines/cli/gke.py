"""The command line's gke commands: ``tpupipe plan``, ``tpupipe preflight`` and ``tpupipe janitor``
(``components.platforms.gke`` does the work). Bad input exits 2 before any API call."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.cli.common import add_place, add_set, overrides
from pipelines.exits import fail

if TYPE_CHECKING:
    from components.spec import RunSpec
    from pipelines.cli.common import Commands


def cmd_plan(args: argparse.Namespace) -> int:
    """Print every resource a gke run would create and its cost; create nothing, need no credentials."""
    from components.platforms.gke.plan import document as plan
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


def cmd_preflight(args: argparse.Namespace) -> int:
    """Check quota, reservation, APIs, permissions and an existing cluster before a gke run: every problem in one
    report, exit 2 when there is one; creates nothing."""
    from components.platforms import RunContext
    from components.platforms.gke import GkePlatform
    from components.platforms.gke.checks import preflight
    from components.platforms.store import LocalStore

    spec, run_id = _gke_run(args)
    ctx = RunContext(spec=spec, run_id=run_id, store=LocalStore(Path(".")), platform="gke")
    report = GkePlatform(log=lambda m: None).preflight(ctx)
    sys.stdout.write(preflight.render(spec, run_id, report))
    return 0


def cmd_janitor(args: argparse.Namespace) -> int:
    """Tear down every gke run under the output root that is finished or older than its limit; --dry-run lists it."""
    from components.platforms.gke.run import janitor

    older = janitor.parse_age(args.older_than) if args.older_than else None
    sweep = janitor.Janitor(
        args.output_root, tuple(args.project or ()), older, log=lambda m: None, region=args.region, adopt=args.adopt
    ).sweep(args.dry_run)
    sys.stdout.write(janitor.render(sweep, args.dry_run))
    if sweep.failed:
        return fail("janitor: could not tear down " + "; ".join(f"{k}: {v}" for k, v in sweep.failed.items()), 1)
    return 0


def _with_gke_run_args(p: argparse.ArgumentParser) -> None:
    """PRESET, --set and --run-id: a gke run as `tpupipe plan` and `tpupipe preflight` see it (``_gke_run``)."""
    p.add_argument("preset", help="preset name (`tpupipe presets`)")
    add_set(p, "override spec fields; dotted (cluster.num_slices=4) or unique leaf names")
    p.add_argument("--run-id", default="", help="the run id every name derives from (default: the preset name)")


def _gke_run(args: argparse.Namespace) -> tuple[RunSpec, str]:
    """(spec, run id) of PRESET --set ... --run-id; a cpu preset is a SpecError (it runs on the local platform)."""
    from components.platforms.gke.plan import document as plan
    from components.spec.names import run_id_from
    from components.workload import resolve

    spec = resolve(args.preset, overrides(args.set))
    plan.check_plannable(spec)
    return spec, run_id_from(args.run_id, args.preset)


def add_commands(sub: Commands) -> None:
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
        "caller holds the IAM permissions the plan needs, a cluster named by gke.cluster_name has what the run "
        "needs (or GKE can enable it in place), and the plan's expected cost fits the run's budget (run.max_cost_usd, "
        "else its default; `tpupipe plan` shows it). Read-only calls with your Application Default Credentials; every "
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
        "the teardown every run uses. A run that ran on Vertex AI is collected as soon as its pipeline job has "
        "ended (a Stop in the UI, a cancel) and left alone while it runs, whatever its age; so is a run whose "
        "driver's heartbeat is fresh. A labelled cluster without a ledger is collected only with --adopt. A second "
        "sweep finds "
        "nothing. `tpupipe compile --pipeline janitor` gives the same sweep as a pipeline to schedule "
        "(`tpupipe publish --janitor-schedule`: every 15 minutes).",
    )
    p.add_argument(
        "--output-root",
        default="runs",
        help="where the runs' directories are: gs://BUCKET/state on Vertex AI, or a local directory (default ./runs)",
    )
    p.add_argument(
        "--older-than",
        default="",
        metavar="AGE",
        help="collect runs started longer ago than AGE (6h, 90m, 2d); default: each run's own limit",
    )
    add_place(
        p,
        "also search this project for clusters labelled tpupipe-run; once given, a ledger naming any other project is "
        "reported and kept, not obeyed",
        "the Vertex AI region asked for the state of the runs' pipeline jobs",
        without_project="the projects the runs' ledgers name",
        repeatable=True,
        empty_region="asks nothing",
    )
    p.add_argument(
        "--adopt",
        action="store_true",
        help="also collect clusters labelled tpupipe-run whose run left no ledger under the output root (without it "
        "they are reported and kept: their ledger may be under another output root)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    p.set_defaults(func=cmd_janitor)
