"""The command line's model registry commands: ``tpupipe models list | show | promote | rollback`` over the local
registry (``<output root>/registry``) or, with ``--project``, Vertex AI Model Registry (``components.registry`` does
the work). Unknown names and versions exit 2 naming the field; a registry that fails (a permission, an outage
that outlasted the retries) exits 1."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from components.registry import PROVENANCE_FIELDS, Registry, Version, open_registry
from components.spec import CHAMPION, SpecError
from pipelines.cli.common import add_place

if TYPE_CHECKING:
    from pipelines.cli.common import Commands

EXAMPLES = """examples:
  tpupipe models list                          every model of the local registry (./runs/registry)
  tpupipe models list gemma-ft                 its versions
  tpupipe models show gemma-ft@champion        a version and its whole provenance (also NAME@3; NAME: the champion)
  tpupipe models promote gemma-ft 3            version 3 becomes the champion
  tpupipe models rollback gemma-ft             the champion goes back to the version that held it before
  tpupipe models list --project my-project     Vertex AI Model Registry of that project
"""


def _registry(args: argparse.Namespace) -> Registry:
    if args.project and args.output_root:
        raise SpecError("--output-root", "names the local registry; with --project the registry is Vertex AI's")
    return open_registry(args.output_root or "runs", args.project, args.region)


def _text(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _aliases(version: Version) -> str:
    return ",".join(version.aliases) or "-"


def cmd_list(args: argparse.Namespace) -> int:
    registry = _registry(args)
    if args.name:
        versions = registry.versions(args.name)
        print(f"{'VERSION':<8} {'ALIASES':<20} {'CREATED':<25} {'EVAL LOSS':<10} {'RUN ID':<40} ARTIFACT")
        for v in versions:
            print(
                f"{v.version:<8} {_aliases(v):<20} {v.created:<25} {_text(v.provenance.get('eval_loss_after')):<10} "
                f"{_text(v.provenance.get('run_id')):<40} {v.artifact_uri}"
            )
        return 0
    names = registry.models()
    if not names:
        print(f"no models in {registry.where}")
        return 0
    print(f"{'MODEL':<32} {'VERSIONS':<9} {'CHAMPION':<9} LATEST")
    for name in names:
        versions = registry.versions(name)
        champion = next((v.version for v in versions if CHAMPION in v.aliases), "-")
        print(f"{name:<32} {len(versions):<9} {champion:<9} {versions[-1].version if versions else '-'}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    registry = _registry(args)
    name, _, ref = args.model.partition("@")
    if ref:
        version = registry.get(name, ref)
        note = ""
    else:
        version = registry.champion(name) or registry.versions(name)[-1]
        note = "" if CHAMPION in version.aliases else "  (no champion yet: the newest version)"
    print(f"{version.ref}{note}")
    print(f"  aliases           {_aliases(version)}")
    print(f"  artifact          {version.artifact_uri}")
    print(f"  created           {version.created}")
    print(f"  labels            {' '.join(f'{k}={v}' for k, v in sorted(version.labels.items())) or '-'}")
    print("  provenance")
    extra = sorted(k for k in version.provenance if k not in PROVENANCE_FIELDS)
    for key in (*PROVENANCE_FIELDS, *extra):
        print(f"    {key:<18} {_text(version.provenance.get(key))}")
    history = registry.history(name)
    print(f"  {CHAMPION} history  {' -> '.join(history) or '-'}")
    print(f"  versions          {', '.join(v.version for v in registry.versions(name))}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    registry = _registry(args)
    before = registry.champion(args.name)
    version = registry.promote(args.name, args.version)
    if before is not None and before.version == version.version:
        print(f"{args.name}: version {version.version} is already the {CHAMPION}")
    else:
        print(f"{args.name}: {CHAMPION} is now version {version.version} (was {before.version if before else 'none'})")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    registry = _registry(args)
    before = registry.champion(args.name)
    version = registry.rollback(args.name)
    print(
        f"{args.name}: {CHAMPION} moved back to version {version.version} (from {before.version if before else 'none'})"
    )
    return 0


def _place_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output-root", default="", help="the local registry is OUTPUT_ROOT/registry (default ./runs)")
    add_place(
        p,
        "Vertex AI Model Registry of this Google Cloud project",
        "the Vertex AI region of that registry",
        without_project="the local registry",
    )


def add_commands(sub: Commands) -> None:
    p = sub.add_parser(
        "models",
        help="the model registry: list, show, promote, rollback",
        description="The fine-tuned models and their versions: each version's artifact, labels and "
        f"provenance; the '{CHAMPION}' alias marks the version in use. The local registry by default "
        "(OUTPUT_ROOT/registry), Vertex AI Model Registry with --project.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("list", help="the models, or one model's versions")
    a.add_argument("name", nargs="?", default="", help="a model: list its versions")
    _place_args(a)
    a.set_defaults(func=cmd_list)
    a = actions.add_parser("show", help="a version, every provenance field")
    a.add_argument("model", metavar="NAME[@VERSION|@ALIAS]", help=f"NAME alone: the {CHAMPION} (else the newest)")
    _place_args(a)
    a.set_defaults(func=cmd_show)
    a = actions.add_parser("promote", help=f"make VERSION the {CHAMPION}")
    a.add_argument("name", metavar="NAME")
    a.add_argument("version", metavar="VERSION")
    _place_args(a)
    a.set_defaults(func=cmd_promote)
    a = actions.add_parser("rollback", help=f"move the {CHAMPION} back to the version that held it before")
    a.add_argument("name", metavar="NAME")
    _place_args(a)
    a.set_defaults(func=cmd_rollback)
