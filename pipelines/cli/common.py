"""What every module of the command line shares: the ``--set`` overrides (the flag, and its values joined into one
spec string), ``--project`` and ``--region`` (one default each, one refusal of the placeholder project), the one
way a command fails (a message on stderr, an exit code), and the warnings a checked spec may still earn."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from components.spec import SpecError
from components.spec.names import DEFAULT_REGION, EXAMPLE_PROJECT

# What ``add_subparsers`` returns, where each module of the command line adds its commands.
type Commands = argparse._SubParsersAction[argparse.ArgumentParser]

PROJECT_ENV = "GOOGLE_CLOUD_PROJECT"
CALLS_GOOGLE_CLOUD = "calls_google_cloud"  # set on the parsed arguments of a command add_place marks as calling it


ALLOW_DEFAULT_IDENTITIES = "gke.allow_default_identities=true"


def add_set(parser: argparse.ArgumentParser, text: str) -> None:
    """The ``--set KEY=VALUE ...`` flag of ``parser``, ``text`` its help (``overrides`` reads it), and
    ``--allow-default-identities``, which adds ``gke.allow_default_identities=true`` to them (``allow_defaults``)."""
    parser.add_argument("--set", action="append", metavar="KEY=VALUE ...", help=text)
    add_allow_defaults(parser)


def add_allow_defaults(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-default-identities",
        action="store_true",
        help="let the nodes, Cloud Build and the Vertex AI pipeline act as the project's default service accounts "
        '(refused without it, exit 2: name dedicated ones, docs/gke.md "IAM roles")',
    )


def allow_defaults(args: argparse.Namespace) -> None:
    """``--allow-default-identities`` as the spec override it stands for, appended to ``--set``'s."""
    if getattr(args, "allow_default_identities", False) and hasattr(args, "set"):
        args.set = [*(args.set or []), ALLOW_DEFAULT_IDENTITIES]


def overrides(sets: list[str] | None) -> str:
    """--set may be given several times, each with one or more key=value items."""
    items = [item for s in (sets or []) for item in shlex.split(s)]
    return " ".join(shlex.quote(i) for i in items)


def add_place(
    parser: argparse.ArgumentParser,
    project: str,
    region: str,
    *,
    offline: bool = False,
    without_project: str = "",
    repeatable: bool = False,
    empty_region: str = "",
) -> None:
    """``--project`` and ``--region`` of a command, the only place they are added: ``project`` and ``region`` say what
    the command uses each for. --project defaults to $GOOGLE_CLOUD_PROJECT, else the placeholder ``EXAMPLE_PROJECT``,
    which only an ``offline`` command accepts: every other one refuses it before any call (``refuse_placeholder``).
    Where the command has something to do without a project (``without_project``: what that is), --project has no
    default; ``repeatable``: it may be given several times. --region defaults to ``DEFAULT_REGION``;
    ``empty_region``: what ``--region ''`` means, where it means something."""
    if without_project or repeatable:
        default = [] if repeatable else ""
        given = f"{project}; repeatable" if repeatable else project
        parser.add_argument(
            "--project",
            action="append" if repeatable else "store",
            default=default,
            metavar="PROJECT",
            help=f"{given} (default: {without_project})",
        )
    else:
        accepted = "accepted: this command is offline" if offline else "refused: name your project"
        parser.add_argument(
            "--project",
            default=os.environ.get(PROJECT_ENV, EXAMPLE_PROJECT),
            help=f"{project} (default ${PROJECT_ENV}, else the placeholder {EXAMPLE_PROJECT}, {accepted})",
        )
    empty = f"; '' {empty_region}" if empty_region else ""
    parser.add_argument("--region", default=DEFAULT_REGION, help=f"{region} (default {DEFAULT_REGION}{empty})")
    parser.set_defaults(**{CALLS_GOOGLE_CLOUD: not offline})


def refuse_placeholder(args: argparse.Namespace) -> None:
    """Bad input before anything is called: the placeholder project given to a command that calls Google Cloud."""
    if not getattr(args, CALLS_GOOGLE_CLOUD, False) or getattr(args, "kfp_host", None):
        return  # on Kubeflow Pipelines the project may come from the spec (KfpBackend.run_project)
    given = args.project if isinstance(args.project, list) else [args.project]
    if EXAMPLE_PROJECT in given:
        raise SpecError(
            "--project",
            f"{EXAMPLE_PROJECT!r} is the examples' placeholder, not a project of yours: name yours with --project "
            f"PROJECT or ${PROJECT_ENV}",
        )


def warn_same_day(dataset: str) -> None:
    """One warning line on stderr for a dated BigQuery table of the schedule's own day (``datasets.same_day_table``);
    nothing for any other dataset."""
    from components.spec import datasets

    note = datasets.same_day_table(dataset)
    if note:
        print(f"tpupipe: warning: {note}", file=sys.stderr)
