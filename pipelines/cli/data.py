"""``tpupipe data PRESET``: the data snapshot a run would take (``components.data.snapshot``), and nothing created: the
files, objects or table it would read, the examples to train and evaluate on, their fields and a token estimate, the
snapshot's digest; with ``train.data_since=champion``, only what is new since the champion, or that a run would end
after its snapshot. The data's ``tpupipe plan``."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pipelines.cli.common import add_set, overrides

if TYPE_CHECKING:
    from pipelines.cli.common import Commands

EXAMPLES = """examples:
  tpupipe data local-fsdp --set train.dataset=examples/sft/          every data file under a directory
  tpupipe data gemma4-e2b-v6e-16 --set "train.dataset=gs://my-bucket/sft/{date}/*.jsonl" --date 2026-12-01
  tpupipe data local-fsdp --set "train.dataset=bq://P.D.events_{date-1:%Y%m%d}" --date 2026-12-02  the day before's
  tpupipe data local-fsdp --set "train.dataset=DIR/ train.data_since=champion"    what is new since the champion
"""


def cmd_data(args: argparse.Namespace) -> int:
    from components.spec import SpecError, datasets
    from components.stages import dataset, runner

    ctx = runner.context(args.preset, args.platform, overrides(args.set), "tpupipe-data", "", args.output_root)
    t = ctx.spec.train
    if not datasets.snapshotted(t.dataset):
        print(f"data {ctx.spec.name}: {t.dataset} ({datasets.kind(t.dataset)} data): nothing to snapshot")
        return 0
    try:
        when = datetime.fromisoformat(args.date).replace(tzinfo=UTC) if args.date else datetime.now(UTC)
    except ValueError:
        raise SpecError("--date", f"not a date: {args.date!r}", ["YYYY-MM-DD"]) from None
    manifest = dataset.take(ctx, when, log=lambda line: None).manifest
    print(json.dumps(manifest, indent=2, default=str) if args.output == "json" else render(ctx.spec.name, manifest))
    return 0


def _part(part: dict[str, Any]) -> list[str]:
    if part["kind"] == "bigquery":
        table = part["table"]
        return [f"    {table['table']} as of {table['snapshot_time']}: {table['num_rows']} rows"]
    return [
        f"    {item['uri']}  {item['size']} bytes  {item.get('num_examples', '?')} examples  "
        f"generation {str(item['generation'])[:19]}"
        for item in part["items"]
    ]


def render(preset: str, manifest: dict[str, Any]) -> str:
    train = manifest["train"]
    lines = [f"data {preset}: {manifest['dataset']} ({train['kind']}, as of {manifest['taken'][:10]})"]
    if manifest.get("since"):
        lines.append(f"  since champion {manifest['since']['champion']} (snapshot {manifest['since']['digest']})")
    if manifest.get("skip"):
        lines += [f"  {manifest['skip']}: a run would end after its snapshot, nothing created or billed"]
        return "\n".join(lines)
    shown = _part(train)
    lines.append(f"  {len(train['items']) or 1} {'table' if train['kind'] == 'bigquery' else 'files'}:")
    lines += shown[:20] + ([f"    ... and {len(shown) - 20} more"] if len(shown) > 20 else [])
    held = "the fixed evaluation set" if manifest.get("eval") else "held out of these by their instruction's digest"
    lines += [
        f"  examples             {manifest['num_train_examples']} to train on, "
        f"{manifest['num_heldout_examples']} to evaluate on ({held})",
        f"  fields               {', '.join(manifest['fields'])}",
        f"  tokens (estimate)    {manifest['tokens_estimate']:,} to train on, at 4 characters a token",
        f"  snapshot             {manifest['digest']}",
    ]
    if manifest.get("eval"):
        lines.append(f"  evaluation set       {manifest['eval']['source']}: snapshot {manifest['eval']['digest']}")
    return "\n".join(lines)


def add_commands(sub: Commands) -> None:
    p = sub.add_parser(
        "data",
        help="the data snapshot a run would take: files, examples, fields, tokens; creates nothing",
        description="Resolve the preset's train.dataset (and train.eval_dataset) as a run's first stage would: "
        "every file, object or table row it would read, checked for the fields the prompt needs; print what it "
        "found. Reads only; nothing is created or written.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("preset", nargs="?", default="local-fsdp", help="preset name (default local-fsdp)")
    add_set(p, "override spec fields; dotted (train.dataset=DIR/) or unique leaf names")
    p.add_argument(
        "--date",
        default="",
        help="the schedule's date, YYYY-MM-DD (default today, UTC): {date} stands for it, {date-N} for N days before, "
        "{date:%%Y%%m%%d} for it in that format (docs/recurring.md)",
    )
    p.add_argument("--platform", default="local", help="the platform whose registry holds the champion (local, gke)")
    p.add_argument("--output-root", default="", help="where the runs and the local registry are (default ./runs)")
    p.add_argument("--output", choices=("text", "json"), default="text", help="text (default) or the manifest's JSON")
    p.set_defaults(func=cmd_data)
