"""The command line's Kubeflow Pipelines side: ``tpupipe submit``, ``schedule`` and ``runs`` given ``--kfp-host``
(``pipelines.backends.kfp.jobs`` does the work). Bad input exits 2 before any call; an API server that cannot be reached
or refuses exits 1, in one line."""

from __future__ import annotations

import sys

from components.spec import SpecError
from components.spec.names import EXAMPLE_PROJECT
from pipelines.backends.kfp import identity as kfp_identity
from pipelines.backends.kfp import jobs as kfp
from pipelines.backends.vertex import jobs as vertex


def add_arguments(p) -> None:
    """The KFP place's options, on every command that reaches Kubeflow Pipelines."""
    p.add_argument(
        "--kfp-host",
        default="",
        help="the Kubeflow Pipelines API server (http://localhost:8888 through a port-forward, or the deployment's "
        "URL): the run goes to open-source Kubeflow Pipelines there instead of Vertex AI (docs/kubeflow.md)",
    )
    p.add_argument("--kfp-namespace", default="kubeflow", help="with --kfp-host: the runs' namespace (kubeflow)")
    p.add_argument(
        "--kfp-auth",
        choices=kfp.AUTHS,
        default="none",
        help="with --kfp-host: none (a port-forward), sa-token (the pod's projected KFP token, in-cluster) or iap "
        "(a Google ID token for an endpoint behind Identity-Aware Proxy, with --kfp-iap-client-id)",
    )
    p.add_argument("--kfp-iap-client-id", default="", help="the OAuth client id of the endpoint's IAP (--kfp-auth iap)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="with --kfp-host http://… and --kfp-auth sa-token or iap: send the token over plain HTTP to a host that "
        "is not this machine (refused without it; localhost needs no flag)",
    )
    p.add_argument(
        "--kfp-service-account",
        default="",
        help="with --kfp-host: the Google service account the KFP runner uses by Workload Identity; checked before "
        'the run is created: its binding to the runner and its roles (docs/kubeflow.md, "Setup, once")',
    )
    p.add_argument(
        "--kfp-runner",
        default=kfp_identity.DEFAULT_RUNNER,
        help="with --kfp-service-account: the runner's Kubernetes service account (default "
        f"{kfp_identity.DEFAULT_RUNNER})",
    )


def place_of(args) -> kfp.Place:
    place = kfp.Place(args.kfp_host, args.kfp_namespace, args.kfp_auth, args.kfp_iap_client_id, insecure=args.insecure)
    kfp.check_place(place)
    return place


def project_of(args, overrides: str) -> str:
    """The run's project: --project, else the spec's gke.project (``--set gke.project=...``)."""
    if args.project and args.project != EXAMPLE_PROJECT:
        return args.project
    from components.workload import resolve

    project = resolve(args.preset, overrides).gke.project
    if not project:
        raise SpecError("--project", "required with --kfp-host: --project PROJECT or --set gke.project=PROJECT")
    return project


def checked_identity(args, sub: vertex.Submission, scheduled: bool = False) -> None:
    """The input, then the KFP runner's Google identity when named (else a warning that it is not checked)."""
    vertex.check(sub, scheduled)
    if not args.kfp_service_account:
        warn("the KFP runner's Google identity is not checked: name it with --kfp-service-account")
        return
    kfp_identity.check(sub.project, args.kfp_service_account, args.kfp_namespace, args.kfp_runner, warn)


def warn(message: str) -> None:
    print(f"tpupipe: warning: {message}", file=sys.stderr)


def cmd_submit(args, submission, overrides: str) -> int:
    """``submission(args, project)``: the run as ``tpupipe submit`` makes it for Vertex AI."""
    place = place_of(args)
    sub = submission(args, project_of(args, overrides))
    checked_identity(args, sub)
    kfp_run, run_id = kfp.submit(sub, place, publish_first=args.publish)
    print(f"submitted run {kfp_run} (run id {run_id})\n  {kfp.run_url(place, kfp_run)}", flush=True)
    if not args.wait:
        return 0
    job = kfp.follow(kfp.client(place), kfp_run)
    failed = vertex.failing_stage(job)
    print(f"run {kfp_run}: {job['state'].lower()}" + (f" — {failed}" if failed else ""))
    return 0 if job["state"] == "SUCCEEDED" else 1


def cmd_schedule(args, submission, overrides: str) -> int:
    place = place_of(args)
    if args.action == "create":
        if args.max_runs:
            raise SpecError("--max-runs", "Kubeflow Pipelines' recurring runs take no run count: use --end")
        sub = submission(args, project_of(args, overrides))
        checked_identity(args, sub, scheduled=True)
        made = kfp.schedule_create(sub, place, args.name, args.cron, args.max_concurrent, args.start, args.end)
        print(f"recurring run {args.name} created: {made} (0 {args.cron}, at most {args.max_concurrent} at a time)")
        return 0
    client = kfp.client(place)
    if args.action == "list":
        for r in kfp.recurring_runs(client, place):
            cron = ((r.get("trigger") or {}).get("cron_schedule") or {}).get("cron", "")
            print(f"{r['display_name']:<28} {r.get('status', ''):<10} {cron}")
        return 0
    kfp.schedule_action(client, place, args.name, args.action)
    print(f"recurring run {args.name}: {args.action}d")
    return 0


def cmd_runs(args) -> int:
    place = place_of(args)
    client = kfp.client(place)
    if args.action == "list":
        for run in kfp.runs(client, place, args.preset, args.state):
            preset = ((run.get("runtime_config") or {}).get("parameters") or {}).get("preset", "")
            created = str(run.get("created_at") or "")[:19]
            shown = f"{run['run_id']:<38} {run.get('display_name', ''):<44} {run.get('state', ''):<10}"
            print(f"{shown} {created} {preset}")
        return 0
    if args.action == "cancel":
        return kfp.cancel(client, args.job, args.timeout)
    run = kfp.show(client, args.job)
    print(f"{run['name']}  {run['display_name']}  {run['state']}  preset {run['preset']}")
    print(f"  {kfp.run_url(place, run['name'])}")
    for stage, state in run["stages"]:
        print(f"  {stage:<20} {state.lower()}")
    return 0
