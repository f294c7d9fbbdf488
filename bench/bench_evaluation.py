"""Evaluation chip-seconds of a recurring run: the evaluation as it was (the commit before the train job measured the
model it trained in itself, ``trainers/heldout.py``) against as it is, side by side in one run, on the same pair of
runs.

Each side runs the local gate's pair: two `tpupipe run`s of local-fsdp with one output root (one local registry).
The first (2 emulated hosts, one epoch) registers the champion; the second, the recurring run, starts from it
(``train.init_from=champion``, one host, no slice check, one epoch) and is judged on the same held-out split. The
figure is the second run's evaluation chip-seconds (its goodput ledger's "evaluation": the evaluate stage and, as it
is, the train job's own evaluation), as it is / as it was; target <= 0.5 (issue 41). The first run's ratio is
reported beside it. The side as it was runs from ``git archive`` of that commit in a temporary directory, with the
same Python and the same trainer environments (the images did not change), A then B (one pair: each side takes
minutes, and the figure is far from its bound).

The MaxText pair: MaxText's train job measures the model it trained, and only an evaluation job measures the model as
initialised ("before"), once per initial-model key (``components.stages.ray_stages.initial_model_key``); the
registered version records it, and a recurring run with the same key reads it there. Two runs of local-maxtext under
one output root: the first, whose evaluate stage is today's (an evaluation job measures "before"; the champion and
"after" need none), registers the champion with that figure; the recurring run (the same preset again, judged on the
same held-out split) finds every figure known. The figure is the recurring run's evaluation chip-seconds / the first
run's; target <= 0.5 (issue 41), with both runs' figures for the gate beside it (the recurring run's "before" is the
one the first run measured). The recurring run of the code before the initial-model key is no baseline here: in the
two tries made, on a machine at a load average above 20, its evaluation job (the first to load its programs from the
compile cache the first run filled) failed in MaxText's gloo set-up (``GetKeyValue() timed out``); whether it fails on
a quiet machine is not known.

The answers (issue 58): three runs of local-fsdp under one output root, one epoch each, 16 evaluation prompts. The
first registers the champion (local-fsdp@1) with its answers. The other two are one configuration run twice (from the
champion, the same metrics and answers key, ``gate.min_improvement=0.99`` so that neither is promoted and both face
local-fsdp@1): "reuse" reads the champion's answers from its record; before "again", the first run's kept answers are
removed, so its evaluate stage passes the record over (with a warning) and its evaluation job has the champion answer
again, as after a change of image or accelerator. That job also measures the champion's held-out loss again, although
its record knows it (the job that answers is the one that measures: ``ray_stages.evaluate``), so the figure is what a
run pays today when the champion has no answers under its key, not answering alone. Two figures: the evaluate stage's
seconds with the answers reused / asked again (target <= 0.5; one pair, not alternated: each run takes minutes), and
generation's share of the first run's in-job evaluation seconds on CPU (its goodput ledger's "evaluation": the train
job's held-out figures and answers, before and after training, both measured the same way; no target, and no
figure of a chip's), with the share of the "again" run's evaluate stage that its champion's answering took beside it.
These are the default (``make bench BENCH=evaluation``: minutes); ``TPUPIPE_BENCH_EVALUATION=all`` adds the two pairs
above (tens of minutes on two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.figures import Figure, table

REPO = Path(__file__).resolve().parents[1]

TARGET = "<= 0.5"
RUNS = {  # the pair, in order: run -> its overrides
    "first": ("epochs=1",),
    "recurring": ("cluster.num_hosts=1", "cluster.slice_check=false", "train.init_from=champion", "epochs=1"),
}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def baseline() -> str:
    """The commit before the in-job evaluation: the parent of the one that added trainers/heldout.py."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", "trainers/heldout.py").splitlines()
    if not added:
        raise SystemExit("bench_evaluation: no commit adds trainers/heldout.py: nothing to compare with")
    return _git("rev-parse", f"{added[-1]}^")


def checkout(commit: str, into: Path) -> Path:
    """The tree of ``commit``, as files under ``into`` (no git state changed)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run(repo: Path, root: Path, run_id: str, overrides: tuple[str, ...], preset: str = "") -> dict:
    """One `tpupipe run` (of ``preset``, else the default local-fsdp) with the code in ``repo``: its evaluation's
    chip-seconds and seconds, its evaluate stage's seconds, its goodput and the figures the gate read, from its
    summary."""
    cmd = [str(Path(sys.executable).parent / "tpupipe"), "run", "--run-id", run_id, "--output-root", str(root)]
    cmd += ["--preset", preset] if preset else []
    for o in overrides:
        cmd += ["--set", o]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"bench_evaluation: {run_id} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    summary = json.loads((root / run_id / "summary.json").read_text())
    categories = {c["name"]: c for c in summary["goodput"]["categories"]}
    stages = {s["name"]: s for s in summary["stages"]}
    evaluation = json.loads((root / run_id / "stages" / "evaluate.json").read_text())["result"]
    return {
        "evaluation_chip_s": categories["evaluation"]["chip_s"],
        "evaluation_s": round(categories["evaluation"]["seconds"], 2),
        "evaluate_stage_s": round(stages["evaluate"]["seconds"], 2),
        "evaluation_job": bool(evaluation.get("job")),
        "goodput": summary["goodput"]["goodput"],
        "gate_figures": {k: evaluation.get(k) for k in ("eval_loss_before", "eval_loss_after", "champion_loss")},
        "measured_by": evaluation.get("measured_by"),
    }


def pair(repo: Path, root: Path, side: str) -> dict[str, dict]:
    return {name: run(repo, root, f"bench-eval-{side}-{name}", overrides) for name, overrides in RUNS.items()}


def maxtext_figure() -> Figure:
    """The MaxText pair (the module's docstring): a first run and the recurring run, under one output root."""
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        first, recurring = (run(REPO, Path(tmp), f"bench-eval-mx-{name}", (), "local-maxtext") for name in RUNS)
    ratio = recurring["evaluation_chip_s"] / first["evaluation_chip_s"]
    print(
        f"MaxText evaluation chip-seconds: {recurring['evaluation_chip_s']:.1f} in the recurring run, "
        f"{first['evaluation_chip_s']:.1f} in the first (today's evaluate stage) ({ratio:.2f}); gate figures "
        f"{recurring['gate_figures']} and {first['gate_figures']}"
    )
    return Figure(
        "evaluation: a recurring local-maxtext run's evaluation chip-seconds / the first's (today's evaluate stage)",
        ratio,
        "x",
        TARGET,
        {"first": first, "recurring": recurring},
    )


ANSWERS = ("epochs=1", "eval.generate_examples=16", "cluster.slice_check=false")
RECURRING = (*ANSWERS, "train.init_from=champion", "gate.min_improvement=0.99")  # kept: the champion stays @1
ANSWERS_RUNS = {  # one output root, in order: run -> its overrides
    "first": ANSWERS,
    "reuse": RECURRING,
    "again": RECURRING,  # after the champion's kept answers are removed (answers_figures)
}


def answering_seconds(log: Path) -> float:
    """The seconds a job's ``answers`` records say its answering took (``trainers.generation``), from its log."""
    from components.spec import protocol

    found = {}
    for text in log.read_text().splitlines() if log.is_file() else []:
        m = protocol.RECORD.match(text)
        body = json.loads(m["body"]) if m and m["kind"] == "event" else {}
        if body.get("event") == "answers":
            found[(body["which"], body["time"])] = body["seconds"]  # a line Ray forwarded twice counts once
    return sum(found.values())


def answers_figures() -> list[Figure]:
    """The answers' three runs (the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        root = Path(tmp)
        runs = {}
        for name, overrides in ANSWERS_RUNS.items():
            if name == "again":  # the champion's record has nothing to read: it answers again, all else alike
                (root / "bench-answers-first" / "eval" / "answers-after.jsonl").unlink()
            runs[name] = run(REPO, root, f"bench-answers-{name}", overrides)
        tasks = {
            name: json.loads((root / f"bench-answers-{name}" / "stages" / "evaluate.json").read_text())["result"]
            for name in runs
        }
        first_answering = answering_seconds(root / "bench-answers-first" / "logs" / "train.log")
        again_answering = answering_seconds(root / "bench-answers-again" / "logs" / "evaluate.log")
    for name, task in tasks.items():
        runs[name]["champion_answers"] = (task.get("task") or {}).get("champion_answers")
        runs[name]["champion"] = (task.get("champion") or {}).get("ref")
    if (
        runs["reuse"]["champion_answers"] != "recorded by local-fsdp@1"
        or runs["again"]["champion_answers"] != "answered in this job"
        or runs["reuse"]["champion"] != runs["again"]["champion"]
    ):
        raise SystemExit(f"bench_evaluation: the runs did not reuse, then ask again, the champion's answers: {runs}")
    ratio = runs["reuse"]["evaluate_stage_s"] / runs["again"]["evaluate_stage_s"]
    share = first_answering / runs["first"]["evaluation_s"]
    again_share = again_answering / runs["again"]["evaluate_stage_s"]
    print(
        f"evaluate stage: {runs['reuse']['evaluate_stage_s']:.2f}s with the champion's answers reused, "
        f"{runs['again']['evaluate_stage_s']:.2f}s with the champion answering again ({ratio:.3f}); answering "
        f"{first_answering:.1f}s of the first run's {runs['first']['evaluation_s']:.1f}s of evaluation ({share:.2f}), "
        f"{again_answering:.1f}s of the again run's evaluate stage ({again_share:.2f})"
    )
    detail = {"runs": runs, "overrides": {k: list(v) for k, v in ANSWERS_RUNS.items()}}
    return [
        Figure(
            "evaluation: the evaluate stage's seconds with the champion's answers reused / asked again (one champion)",
            ratio,
            "x",
            TARGET,
            detail,
        ),
        Figure(
            "evaluation: generation's share of a first local-fsdp run's in-job evaluation seconds (CPU)",
            share,
            "x",
            None,
            {"answering_s": round(first_answering, 2), "again_evaluate_stage_share": round(again_share, 3)},
        ),
    ]


def figures() -> list[Figure]:
    found = answers_figures()
    if os.environ.get("TPUPIPE_BENCH_EVALUATION") == "all":
        found += [fsdp_figure(), maxtext_figure()]
    return found


def fsdp_figure() -> Figure:
    was_commit = baseline()
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        was = pair(checkout(was_commit, Path(tmp) / "was"), Path(tmp) / "runs-was", "was")
        now = pair(REPO, Path(tmp) / "runs-now", "now")
    ratio = {name: now[name]["evaluation_chip_s"] / was[name]["evaluation_chip_s"] for name in RUNS}
    detail = {"as_it_was": {"commit": was_commit, **was}, "as_it_is": now, "first_run_ratio": round(ratio["first"], 3)}
    print(
        f"evaluation chip-seconds, recurring run: {now['recurring']['evaluation_chip_s']:.1f} as it is, "
        f"{was['recurring']['evaluation_chip_s']:.1f} as it was ({ratio['recurring']:.2f}); first run "
        f"{now['first']['evaluation_chip_s']:.1f} vs {was['first']['evaluation_chip_s']:.1f} ({ratio['first']:.2f})"
    )
    return Figure(
        "evaluation: a recurring run's evaluation chip-seconds, as it is / as it was",
        ratio["recurring"],
        "x",
        TARGET,
        detail,
    )


if __name__ == "__main__":
    results = figures()
    print(table(results))
    print(json.dumps([f.detail for f in results], indent=1))
