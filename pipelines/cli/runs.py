"""`tpupipe show` and `tpupipe logs`: a run's summary and its stages' logs, read from its store (a local run
directory or Cloud Storage: the same records on every platform, and still there after teardown)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.platforms.store import RunStore, open_store, read_json
from components.spec import SpecError
from components.stages.table import STAGES, TABLE

if TYPE_CHECKING:
    from pipelines.cli.common import Commands

JOB_STAGES = tuple(stage.name for stage in TABLE if stage.job)  # each runs a Ray job, its log logs/<stage>.log
FOLLOW_S = 2.0  # how often --follow reads the log again (a gke run saves it to Cloud Storage every 15 s)
TAIL_LINES = 20


def run_store(run: str, output_root: str) -> RunStore:
    """RUN as the commands take it: a run directory (``./runs/ID``, ``gs://BUCKET/state/ID``) or a run id under
    ``output_root``."""
    root, _, run_id = run.rstrip("/").rpartition("/") if "/" in run else (output_root, "", run)
    return open_store(root, run_id)


def cmd_show(args: argparse.Namespace) -> int:
    """A finished run's summary (its table, goodput and where the chip-seconds went) from its ``summary.json``; with
    ``--answers``, its side-by-side page instead, as the run wrote it (``components.stages.answers.SIDE_BY_SIDE``: the
    metrics table, then the examples, regressions first), the one artifact the Vertex UI shows too."""
    from components.stages import answers, report

    store = run_store(args.run, args.output_root)
    if args.answers:
        page = store.read_text(answers.SIDE_BY_SIDE)
        if page is None:
            raise SpecError(
                "--answers",
                f"no {answers.SIDE_BY_SIDE} in {store.uri}: the run answered no evaluation prompts "
                "(eval.generate_examples=0), or its evaluate stage has not ended",
            )
        print(page.rstrip("\n"))
        return 0
    text = store.read_text("summary.json")
    if text is None:
        raise SpecError("run", f"no summary.json in {store.uri}: the run is still going, or did not start")
    summary = json.loads(text)
    print(json.dumps(summary, indent=2) if args.json else report.format_table(summary).lstrip("\n"))
    return 0


def _header(stage: str, rec: dict[str, Any]) -> str:
    seconds = f", {rec['seconds']:.1f}s" if rec.get("seconds") is not None else ""
    error = f"\n{rec['error']}" if rec.get("error") else ""
    return f"== {stage}: {rec.get('status', 'unknown')}{seconds}{error}"


def cmd_logs(args: argparse.Namespace) -> int:
    """A stage's record and its job's whole log (``--stage``), or every stage's record with the last lines of each
    job log; ``--follow`` prints a running stage's log as it grows, until the stage ends."""
    store = run_store(args.run, args.output_root)
    records = {stage: read_json(store, f"stages/{stage}.json") for stage in STAGES}
    if not any(records.values()):
        raise SpecError("run", f"no stage records in {store.uri}: not a run, or it did not start")
    if args.stage:
        return _stage_log(store, args.stage, args.follow)
    if args.follow:
        raise SpecError("--follow", "follows one stage's log: name it with --stage (train, say)")
    for stage, rec in records.items():
        if not rec:
            continue
        print(_header(stage, rec))
        text = store.read_text(f"logs/{stage}.log") if stage in JOB_STAGES else None
        if text:
            lines = text.splitlines()
            print(f"-- last {min(TAIL_LINES, len(lines))} of {len(lines)} lines of {store.uri}/logs/{stage}.log")
            print("\n".join(lines[-TAIL_LINES:]))
    return 0


def _stage_log(store: RunStore, stage: str, follow: bool, sleep: Callable[[float], None] = time.sleep) -> int:
    shown = 0
    while True:
        rec = read_json(store, f"stages/{stage}.json") or {}
        text = (store.read_text(f"logs/{stage}.log") if stage in JOB_STAGES else None) or ""
        sys.stdout.write(text[shown:])
        sys.stdout.flush()
        shown = len(text)
        if not follow or rec.get("status") not in ("running", None):
            break
        sleep(FOLLOW_S)
    print(_header(stage, rec) if rec else f"== {stage}: not started")
    return 0


def add_commands(sub: Commands) -> None:
    p = sub.add_parser(
        "show",
        help="a run's summary: its stages, figures, goodput and where the chip-seconds went",
        description="Print a run's summary from its summary.json: RUN is a run directory (local or gs://...) or a "
        "run id under --output-root.",
    )
    p.add_argument("run", help="a run directory (./runs/ID, gs://BUCKET/state/ID) or a run id")
    p.add_argument("--output-root", default="runs", help="where run directories are (default ./runs)")
    p.add_argument("--json", action="store_true", help="print summary.json itself")
    p.add_argument(
        "--answers",
        action="store_true",
        help="print the evaluation's side-by-side page: each task metric (candidate, champion, difference, interval), "
        "then the prompts with the reference and both models' answers, regressions first",
    )
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "logs",
        help="a run's stage records and job logs, kept after teardown; --follow a running job's",
        description="Print what a run's stages recorded (status, seconds, error) and the last lines of each Ray job's "
        "log (check_slice, train, evaluate), read from the run's store: its directory locally, Cloud Storage on gke, "
        "where they stay after teardown. --stage prints one stage's whole log; with --follow, as it grows, until the "
        "stage ends (a gke run saves its job logs every 15 s).",
    )
    p.add_argument("run", help="a run directory (./runs/ID, gs://BUCKET/state/ID) or a run id")
    p.add_argument("--output-root", default="runs", help="where run directories are (default ./runs)")
    p.add_argument("--stage", choices=STAGES, default="", help="one stage: its record and its job's whole log")
    p.add_argument("--follow", action="store_true", help="with --stage: print the log as it grows until it ends")
    p.set_defaults(func=cmd_logs)
