"""The answers to the evaluation prompts as the gate and a reviewer read them: the trained model's (the candidate) and
its champion's (or, without one, the model training started from), each scored by the task metrics in the trainer
(``trainers.generation``), compared here example by example.

A metric's difference is the mean of (candidate - other) over the examples both answered, with a paired cluster
bootstrap interval: the examples grouped by their reference answer (one cluster per distinct reference, the examples
that ask one question in several phrasings are one cluster), the clusters resampled with replacement, the same ones
for both models, ``BOOTSTRAP_SAMPLES`` times with a fixed seed, each resample's difference the mean over the examples
of the clusters drawn, and the interval that distribution's quantiles. Examples of one question are not independent
(a model that knows a fact answers all its phrasings), so resampling them one by one gives intervals too narrow;
resampling whole clusters is the bootstrap of clustered data (Davison and Hinkley, "Bootstrap Methods and their
Application", 1997, section 3.8; Field and Welsh, "Bootstrapping clustered data", JRSS B 69(3), 2007; for language
model evaluations, Miller, "Adding Error Bars to Evals", https://arxiv.org/abs/2411.00640, "clustered standard
errors"); the paired bootstrap itself, Efron and Tibshirani, "An Introduction to the Bootstrap", ch. 13; numpy's
``Generator.integers``, https://numpy.org/doc/stable/reference/random/generated/numpy.random.Generator.integers.html.
Where every reference differs, each example is its own cluster (the ordinary paired bootstrap); where all are one,
the reference tells no question from another and the examples are resampled one by one. The run keeps
``eval/answers.jsonl`` (each prompt, its reference, the candidate's and the other model's answers and scores) and
``eval/side_by_side.md`` (the metrics table, then the examples, regressions first).

The jobs write their answers where the cluster writes (``Platform.job_output_dir``: on gke the bucket's
``runs/<id>/``, mounted in the pods); the stages read them through the run's store layer at the object the platform
names (``Platform.checkpoint_uri``, ``components.platforms.store.at``), never as a path on the task's disk: on Vertex AI
every task is its own container; and only at a file of the job's own ``eval/`` directory (``_job_file``), checked to
be this run's prompts answered and scored (:func:`checked`). The evaluate stage keeps each set of answers it compares
in the run's store (``eval/answers-<which>.jsonl``: the pipeline's identity writes the copy, no pod can; what it
says is what the pods wrote), and the registered version records where (provenance ``answers_uri``;
``champion_answers_uri`` for the champion's answers given in this run's evaluation job), so a later run reads the
champion's answers back from any task, when they were given under its answers key (``ray_stages.answers_key``) and
recorded by the champion itself or by a version that held the champion alias (:func:`recorded_answers`), and has the
champion answer again otherwise (docs/registry.md, "What the stage checks of the answers").
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Callable
from typing import Any

from components.platforms import RunContext, get_platform
from components.platforms.store import RunStore, at, write_text
from components.spec import CHAMPION, RunSpec, SpecError
from components.spec.protocol import Record
from components.spec.run_spec import HELDOUT_LOSS
from components.stages.jobs import log

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 0  # fixed: the same scores give the same interval in every run
CONFIDENCE = 0.95
ANSWERS = "eval/answers.jsonl"  # in the run's store
SIDE_BY_SIDE = "eval/side_by_side.md"
ANSWERS_DIR = "eval"  # under the job's output directory, where the jobs write their answers (trainers.generation)
KEPT = "eval/answers-{which}.jsonl"  # in the run's store: each model's answers the evaluate stage compared
KeyOf = Callable[[str | None], str | None]  # a generation key's answers key (ray_stages.answers_key)
MIN_SHOWN = 16  # the fewest examples the side-by-side shows (all of them when fewer were answered)
SHOWN = 64  # the most


UNBOUNDED = ("answer_length",)  # the metrics whose scores are no fraction in [0, 1] (trainers.metrics): >= 0 only


class Refused(ValueError):
    """Answers the evaluate stage does not compare: a file its job did not write where the job writes answers, or
    rows that are not this run's evaluation prompts answered and scored (:func:`checked`)."""


def from_records(records: list[Record]) -> dict[str, dict[str, Any]]:
    """The ``answers`` events of a job's records by model (``before``, ``after``, ``champion``), the last of each."""
    found: dict[str, dict[str, Any]] = {}
    for kind, p in records:
        if kind == "event" and p.get("event") == "answers":
            found[p["which"]] = {k: v for k, v in p.items() if k not in ("event", "time")}
    return found


def read(uri: str | None) -> list[dict[str, Any]] | None:
    """The answers (JSON lines) at ``uri``, a ``gs://`` object or a path on this machine, read through the store
    layer; None when there is no such file."""
    if not uri:
        return None
    store, key = at(uri)
    text = store.read_text(key)
    return None if text is None else [json.loads(line) for line in text.splitlines() if line.strip()]


def expected(ctx: RunContext) -> int:
    """How many answers the job writes: ``eval.generate_examples``, or every held-out example when the run's snapshot
    (``data/manifest.json``, written by the pipeline's own first stage) holds fewer; the trainer answers the first
    ``min(eval.generate_examples, held-out examples)`` prompts."""
    from components.platforms.store import read_json
    from components.stages.dataset import MANIFEST

    n = ctx.spec.eval.generate_examples
    held = (read_json(ctx.store, MANIFEST) or {}).get("num_heldout_examples")
    return min(n, held) if isinstance(held, int) and held > 0 else n


def checked(rows: list[dict[str, Any]] | None, spec: RunSpec, n: int) -> list[dict[str, Any]]:
    """``rows`` when they are the answers to this run's evaluation prompts as the job writes them
    (``trainers.generation.write``): ``n`` rows (:func:`expected`), indexed 0 to n-1 in order, each with its prompt,
    reference and answer, scored by every metric of ``eval.metrics`` (and the scorer) and nothing else, each score a
    finite number in [0, 1] (``answer_length`` a count, >= 0); Refused naming the first row that is not. The pods
    wrote the rows; what is checked here is their shape, so no mean, count or comparison rests on a row the stage
    did not read."""
    if rows is None:
        raise Refused("no such file")
    names = set(spec.eval.metric_names)
    if len(rows) != n:
        asked = spec.eval.generate_examples
        held = "" if n == asked else f" and the run's snapshot holds {n} held-out examples"
        raise Refused(f"{len(rows)} answers, eval.generate_examples asks for {asked}{held}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or row.get("index") != i:
            index = row.get("index") if isinstance(row, dict) else row
            raise Refused(f"row {i} is not the answer to prompt {i} (index {index!r})")
        for field in ("prompt", "reference", "answer"):
            if not isinstance(row.get(field), str):
                raise Refused(f"row {i} has no {field} text")
        scores = row.get("scores")
        if not isinstance(scores, dict) or set(scores) != names:
            found = sorted(scores) if isinstance(scores, dict) else scores
            raise Refused(f"row {i} is scored by {found}, this run's metrics are {sorted(names)}")
        for name, value in scores.items():
            number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            if not number or value < 0 or (value > 1 and name not in UNBOUNDED):
                raise Refused(f"row {i}'s {name} score {value!r} is not a number in [0, 1]")
    return rows


def means_of(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each metric's mean over the answers' scores."""
    names = list(rows[0]["scores"]) if rows else []
    return {name: sum(r["scores"][name] for r in rows) / len(rows) for name in names}


def _lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def clusters(keys: list[str]) -> tuple[list[int], int]:
    """(each example's cluster, numbered in order of first appearance; how many clusters) of the examples' cluster
    ``keys`` (their references): one cluster per distinct key, or each example its own when every key is the same (a
    single cluster has nothing to resample)."""
    numbers: dict[str, int] = {}
    codes = [numbers.setdefault(key, len(numbers)) for key in keys]
    if len(numbers) < 2:
        return list(range(len(keys))), len(keys)
    return codes, len(numbers)


def paired_bootstrap(
    candidate: list[float],
    other: list[float],
    cluster_of: list[int] | None = None,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """(mean of candidate - other, and the low and high ends of its ``CONFIDENCE`` interval), the clusters
    ``cluster_of`` numbers (:func:`clusters`; None: each example its own) resampled whole."""
    import numpy as np

    a, b = np.asarray(candidate, dtype=float), np.asarray(other, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired scores must be two equal, non-empty lists: {a.shape} and {b.shape}")
    diff = a - b
    codes = np.arange(len(diff)) if cluster_of is None else np.asarray(cluster_of)
    if codes.shape != diff.shape:
        raise ValueError(f"one cluster per example: {len(codes)} for {len(diff)} examples")
    count = int(codes.max()) + 1
    sums, sizes = np.bincount(codes, weights=diff, minlength=count), np.bincount(codes, minlength=count)
    picks = np.random.default_rng(seed).integers(0, count, (samples, count))
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(sums[picks].sum(axis=1) / sizes[picks].sum(axis=1), [tail, 1 - tail])
    return float(diff.mean()), float(low), float(high)


def compare(candidate: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each metric both sets of answers were scored by (the same prompts, in order, as many of each): both means, the
    difference, its interval (:func:`paired_bootstrap`, clustered by reference answer) and the number of clusters.
    Refused for sets of other lengths or prompts: a pair cut to the shorter set would compare the examples one side
    chose to answer."""
    n = len(candidate)
    if len(other) != n:
        raise Refused(f"{n} answers beside {len(other)}: not one set of prompts")
    if any(candidate[i]["prompt"] != other[i]["prompt"] for i in range(n)):
        raise Refused("the two sets of answers are not to the same prompts")
    cluster_of, count = clusters([row["reference"] for row in candidate])
    table = {}
    for name in candidate[0]["scores"] if n else ():
        if name not in other[0]["scores"]:
            continue
        a = [candidate[i]["scores"][name] for i in range(n)]
        b = [other[i]["scores"][name] for i in range(n)]
        difference, low, high = paired_bootstrap(a, b, cluster_of)
        table[name] = {
            "candidate": sum(a) / n,
            "other": sum(b) / n,
            "difference": difference,
            "low": low,
            "high": high,
            "clusters": count,
        }
    return table


def primary_metric(spec: RunSpec, names: list[str]) -> str | None:
    """The metric the examples are ordered by: ``gate.metric`` when it is a task metric, else the first score in [0,
    1] of ``eval.metrics`` (answer_length is none)."""
    if spec.gate.metric != HELDOUT_LOSS and spec.gate.metric in names:
        return spec.gate.metric
    return next((n for n in names if n != "answer_length"), None)


def _clusters(table: dict[str, dict[str, float]]) -> str:
    """How many clusters the table's intervals resampled (one figure for every metric; "-" for no metric)."""
    return next((str(int(row["clusters"])) for row in table.values() if "clusters" in row), "-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or " "


def side_by_side(
    spec: RunSpec,
    table: dict[str, dict[str, float]],
    candidate: list[dict[str, Any]],
    other: list[dict[str, Any]],
    other_label: str,
    reason: str = "",
) -> str:
    """The Markdown a reviewer reads: the metrics table (candidate, the other model, difference, interval), then the
    examples side by side, regressions on the primary metric first."""
    level = f"{CONFIDENCE:.0%}"
    lines = [
        f"# {spec.model_name}: the trained model beside {other_label}",
        "",
        f"{len(candidate)} evaluation prompts, greedy decoding, at most {spec.eval.max_new_tokens} new tokens. "
        f"Difference: candidate - {other_label}, with its {level} paired bootstrap interval "
        f"({BOOTSTRAP_SAMPLES} resamples of {_clusters(table)} clusters: the examples grouped by reference answer).",
    ]
    if reason:
        lines += ["", f"Gate: {reason}"]
    lines += ["", f"| metric | candidate | {other_label} | difference | {level} interval |", "|---|---|---|---|---|"]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['candidate']:.4f} | {row['other']:.4f} | {row['difference']:+.4f} | "
            f"[{row['low']:+.4f}, {row['high']:+.4f}] |"
        )
    primary = primary_metric(spec, list(table))
    n = len(candidate)

    def change(i: int) -> float:
        return candidate[i]["scores"][primary] - other[i]["scores"][primary] if primary else 0.0

    order = sorted(range(n), key=lambda i: (change(i), i))
    shown = order[: max(MIN_SHOWN, min(SHOWN, n))]
    regressions = sum(1 for i in range(n) if change(i) < 0)
    lines += [
        "",
        f"## Examples ({len(shown)} of {n}; ordered by {primary or 'index'}: {regressions} regressions first)",
        "",
        f"| # | prompt | reference | {other_label} | candidate | {primary or 'change'} change |",
        "|---|---|---|---|---|---|",
    ]
    for i in shown:
        c, o = candidate[i], other[i]
        lines.append(
            f"| {c['index']} | {_cell(c['prompt'])} | {_cell(c['reference'])} | {_cell(o['answer'])} | "
            f"{_cell(c['answer'])} | {change(i):+.2f} |"
        )
    return "\n".join(lines) + "\n"


def merged(candidate: list[dict[str, Any]], other: list[dict[str, Any]], other_label: str) -> str:
    """``eval/answers.jsonl``: each prompt, its reference, the candidate's answer and scores and the other model's."""
    rows = []
    for c, o in zip(candidate, other, strict=True):
        rows.append(
            {
                "index": c["index"],
                "prompt": c["prompt"],
                "reference": c["reference"],
                "answer": c["answer"],
                "scores": c["scores"],
                other_label: {"answer": o["answer"], "scores": o["scores"]},
            }
        )
    return "".join(json.dumps(r) + "\n" for r in rows)


def _job_file(ctx: RunContext, event: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job's ``answers`` event with ``uri``: its file where the pipeline's side reads it, when the event names a
    file in the ``eval/`` directory of the job's own output directory (``Platform.job_output_dir``), where
    ``trainers.generation`` writes; any other path (another run's prefix, an object elsewhere in the bucket, a file
    of this machine) is the pods' choice and is not read: the event is ``refused`` instead, saying why."""
    if not event or not event.get("path"):
        return event
    platform, path = get_platform(ctx.platform), str(event["path"])
    directory = posixpath.join(platform.job_output_dir(ctx), ANSWERS_DIR)
    if posixpath.normpath(path) != path or posixpath.dirname(path) != directory:
        return {**event, "refused": f"{path} is not a file of the job's answers directory {directory}/"}
    return {**event, "uri": platform.checkpoint_uri(ctx, path)}


def _keep(store: RunStore, which: str, rows: list[dict[str, Any]]) -> str:
    """``rows`` in the run's store as ``eval/answers-<which>.jsonl``: its uri, which a later run reads back."""
    return write_text(store, KEPT.format(which=which), _lines(rows), "application/jsonl")


def _rows(ctx: RunContext, answers: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
    """(the rows of an ``answers`` event or record, checked; or None and why they are not compared)."""
    if answers.get("refused"):
        return None, answers["refused"]
    if answers.get("rows"):  # a champion's record, checked when it was read (recorded_answers)
        return answers["rows"], ""
    uri = answers.get("uri")
    try:
        return checked(read(uri), ctx.spec, expected(ctx)), ""
    except Refused as exc:
        return None, f"{uri}: {exc}"
    except ValueError as exc:  # not JSON lines
        return None, f"{uri} is not readable: {exc}"


def task_figures(
    ctx: RunContext, candidate: dict[str, Any], other: dict[str, Any] | None, other_label: str, key_of: KeyOf
) -> dict[str, Any]:
    """What the evaluate stage records of the answers: each model's means (computed here from the rows, never the
    job's event's), the comparison table, where each set of answers is kept (``answers_uri``, ``other_uri``) and the
    run's two files (written to its store). ``candidate``, ``other``: ``answers`` events with their ``uri``
    (``_job_file``), or a champion's record (:func:`recorded_answers`); ``key_of``: the answers key of a generation
    key (``ray_stages.answers_key``). Answers refused (:func:`checked`, ``_job_file``) are neither kept nor
    compared: ``comparison_missing`` says why, and a gate on a task metric keeps the champion."""
    spec, store = ctx.spec, ctx.store
    rows, why = _rows(ctx, candidate)
    found: dict[str, Any] = {
        "generation_key": candidate.get("generation_key"),
        "answers_key": key_of(candidate.get("generation_key")),
        "metrics_after": means_of(rows) if rows is not None else None,
        "num_examples": len(rows) if rows is not None else None,
        "scorer": candidate.get("scorer"),  # where the job's eval.scorer resolved: module, file, package digest
    }
    if rows is not None:
        found["answers_uri"] = _keep(store, "after", rows)
    if other is None:
        if why:
            found["comparison_missing"] = why
        return found
    other_rows, other_why = _rows(ctx, other)
    found.update(against=other_label, metrics_other=means_of(other_rows) if other_rows is not None else None)
    if rows is None or other_rows is None:
        found["comparison_missing"] = why or other_why
        return found
    try:
        found["comparison"] = compare(rows, other_rows)
    except Refused as exc:
        found["comparison_missing"] = str(exc)
        return found
    found["other_uri"] = other["uri"] if other.get("recorded_by") else _keep(store, other["which"], other_rows)
    found["answers"] = write_text(store, ANSWERS, merged(rows, other_rows, other_label), "application/jsonl")
    found["side_by_side"] = write_text(
        store, SIDE_BY_SIDE, side_by_side(spec, found["comparison"], rows, other_rows, other_label), "text/markdown"
    )
    return found


def rewrite_with_reason(spec: RunSpec, store: RunStore, task: dict[str, Any], reason: str) -> None:
    """The side-by-side again with the gate's reason on top (the register stage decides after evaluate wrote it),
    from the answers evaluate kept."""
    if not task.get("comparison"):
        return
    rows, other = read(task.get("answers_uri")), read(task.get("other_uri"))
    if rows is None or other is None:
        return
    text = side_by_side(spec, task["comparison"], rows, other, task["against"], reason)
    write_text(store, SIDE_BY_SIDE, text, "text/markdown")


# ---------------------------------------------------------------- in the evaluate stage


def recorded_answers(ctx: RunContext, ref: str, key: str | None) -> dict[str, Any] | None:
    """The answers the registered version ``ref`` gave under the answers key ``key`` (``ray_stages.answers_key``), as
    the versions of its model record them, while the file kept is there and holds this run's prompts answered
    (:func:`checked`); None otherwise (it answers again). Its own record first (provenance ``answers_uri``,
    ``answers_key``); else a record of it as the champion a later version was compared with
    (``champion_answers_uri``, ``champion_answers_key``, with ``champion_measured`` naming it) only by a version that
    held the champion alias (``Registry.history``): a version kept beside its champion recorded what its own run's
    pods said the champion answered, and a run the gate did not promote decides nothing for later runs. A record that
    cannot be read (gone, denied, not answers to these prompts) is passed over with a warning naming the version: the
    champion answers again rather than every later run failing on it."""
    from google.api_core.exceptions import GoogleAPICallError

    from components.stages import gate

    if not key:
        return None
    name = ref.split("@", 1)[0]
    try:
        reg = gate.registry(ctx)
        versions, held = reg.versions(name), set(reg.history(name))
    except SpecError:
        return None
    own = [(v, "") for v in versions if v.ref == ref]
    promoted = [
        (v, "champion_") for v in versions if v.version in held and v.provenance.get("champion_measured") == ref
    ]
    for version, prefix in own + promoted:
        p = version.provenance
        uri = p.get(f"{prefix}answers_uri")
        if p.get(f"{prefix}answers_key") != key or not uri:
            continue
        try:
            rows = checked(read(uri), ctx.spec, expected(ctx))
        except (ValueError, OSError, GoogleAPICallError) as exc:  # a malformed, foreign or unreadable record
            log(f"evaluate: warning: {version.ref}'s record of {ref}'s answers ({uri}) is not read: {exc}")
            continue
        return {"which": CHAMPION, "uri": uri, "rows": rows, "means": means_of(rows), "recorded_by": version.ref}
    return None


def plan_champion(
    ctx: RunContext, train_result: dict[str, Any], champion: dict[str, Any], key_of: KeyOf
) -> tuple[dict[str, Any] | None, bool]:
    """(the champion's recorded answers, when given under this run's answers key; whether the evaluation job must
    have the champion answer instead). Nothing of either without the trained model's answers or a champion the
    evaluation measures."""
    candidate = (train_result.get("answers") or {}).get("after")
    if not candidate or not champion.get("path"):
        return None, False
    recorded = recorded_answers(ctx, champion["ref"], key_of(candidate.get("generation_key")))
    return recorded, recorded is None


def evaluate_answers(
    ctx: RunContext,
    train_result: dict[str, Any],
    champion: dict[str, Any],
    recorded: dict[str, Any] | None,
    job_records: list[Record],
    key_of: KeyOf,
) -> dict[str, Any]:
    """The task figures of the evaluate stage's result (``task_figures``): the trained model's answers beside the
    champion's (recorded, or given in this evaluation job: then kept, with their key, for the version's provenance),
    else beside the model's training started from."""
    answered = train_result.get("answers") or {}
    candidate = _job_file(ctx, answered.get("after"))
    if not candidate:
        return {}
    other, label, given_here = None, "", None
    if champion.get("path"):
        given_here = None if recorded else _job_file(ctx, from_records(job_records).get("champion"))
        if given_here and given_here.get("generation_key") != candidate.get("generation_key"):
            # other prompts, decoding or worker group than the candidate's: no like-for-like comparison, no record
            given_here = {
                **given_here,
                "refused": f"the champion answered under generation key {given_here.get('generation_key')}, the "
                f"trained model under {candidate.get('generation_key')}",
            }
        other, label = recorded or given_here, CHAMPION
    if other is None and answered.get("before"):
        other, label = _job_file(ctx, answered["before"]), "before training"
    found = task_figures(ctx, candidate, other, label, key_of)
    if label == "before training":
        found["metrics_before"] = found.get("metrics_other")
    elif answered.get("before"):  # shown beside the champion's: its means from its rows too
        before, _ = _rows(ctx, _job_file(ctx, answered["before"]) or {})
        found["metrics_before"] = means_of(before) if before is not None else None
    if other is not None and label == CHAMPION:
        found["champion_answers"] = "recorded by " + recorded["recorded_by"] if recorded else "answered in this job"
    if given_here and found.get("other_uri"):  # what the champion said, for the next run (recorded_answers)
        found["champion_answers_uri"] = found["other_uri"]
        found["champion_answers_key"] = key_of(given_here.get("generation_key"))
    return found


def line(task: dict[str, Any]) -> str:
    """The task figures in one line: each metric of the other model (champion, or before training) and the trained
    one's, with the difference's interval."""
    if task.get("metrics_after") is None:
        return f"evaluate: the trained model's answers not compared: {task.get('comparison_missing')}"
    after = task["metrics_after"]
    comparison = task.get("comparison") or {}
    label = task.get("against") or "before training"
    parts = []
    for name, value in after.items():
        row = comparison.get(name)
        if row:
            parts.append(
                f"{name} {row['other']:.3f} -> {value:.3f} ({row['difference']:+.3f}, "
                f"[{row['low']:+.3f}, {row['high']:+.3f}])"
            )
        else:
            parts.append(f"{name} {value:.3f}")
    return f"evaluate: {task.get('num_examples')} answers, {label} -> trained: " + "; ".join(parts)
