"""The evaluate and register stages over the answers to the evaluation prompts (components.stages.answers,
task_gate), without a Ray cluster: the train job's answers compared with the model's as built on a first run and kept
in the run's store; a recurring run reads its champion's kept answers back when their answers key is its own (no
evaluation job) and has the champion answer again when any part of the key changed (the job it would start has no
cluster here); the champion's answers given in an evaluation job are recorded with the version that run registers,
for the run after it; a failing guard keeps the champion and the decision names it."""

from __future__ import annotations

import dataclasses
import json
from functools import partial

import pytest

from components.platforms import RunContext
from components.spec import InfraError
from components.stages import answers, gate, ray_stages
from tests.unit.test_evaluation_reuse import KEY, NO_CLUSTER, OTHER_KEY, _registered, _train_result
from tests.unit.test_evaluation_reuse import _run as _a_run
from tests.unit.test_gate import _records
from trainers import generation

GENERATION = "sha256:" + "a1" * 32
OTHER_GENERATION = "sha256:" + "a2" * 32
ASKED = 20  # eval.generate_examples of these runs: the prompts each answers file answers
SCORED = "eval.metrics=exact_match,answer_length"  # what each answer is scored by in these files


def _run(root, run_id: str, overrides: str = "", build: dict | None = None) -> RunContext:
    """A run of local-fsdp asking for ``ASKED`` answers (test_evaluation_reuse's ``_run``)."""
    return _a_run(root, run_id, f"eval.generate_examples={ASKED} {SCORED} {overrides}", build)


def answered(right: int) -> str:
    """The answers file of a job that answered 20 prompts, ``right`` of them exactly (JSON lines)."""
    rows = [
        {
            "index": i,
            "prompt": f"Instruction: Reverse the word w{i}.\nResponse: ",
            "reference": f"{i}w",
            "answer": f"{i}w" if i < right else "x",
            "scores": {"exact_match": float(i < right), "answer_length": 1.0},
        }
        for i in range(ASKED)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def _answers(root, run_id: str, which: str, right: int, key: str = GENERATION) -> dict:
    """A job's ``answers`` event for 20 prompts, ``right`` of them answered exactly, its file where the job writes."""
    path = root / run_id / "train" / "eval" / f"answers-{which}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(answered(right))
    means = {"exact_match": right / 20, "answer_length": 1.0}
    return {"which": which, "path": str(path), "means": means, "generation_key": key, "num_examples": 20}


def _plan(ctx: RunContext, train: dict, champion: dict | None) -> tuple[dict | None, bool]:
    """What the evaluate stage plans for the champion's answers: (recorded, whether it answers again)."""
    return answers.plan_champion(ctx, train, champion or {}, partial(ray_stages.answers_key, ctx))


def _first_run(tmp_path, overrides: str = "", key: str = GENERATION) -> dict:
    first = _run(tmp_path, "run-1", overrides)
    train = _train_result(tmp_path, "run-1", eval_loss_before=4.6, eval_loss_after=1.5, eval_key=KEY)
    train["answers"] = {
        "before": _answers(tmp_path, "run-1", "before", 0, key),
        "after": _answers(tmp_path, "run-1", "after", 12, key),
    }
    evaluation = ray_stages.evaluate(first, json.dumps(train))
    return {"ctx": first, "evaluation": evaluation, "registered": _registered(first, train, evaluation)}


def _later(tmp_path, run_id: str, right: int, key: str = GENERATION, overrides: str = "", build=None):
    """A run from the champion whose train job answered ``right`` of 20 under ``key``: (context, train result)."""
    ctx = _run(tmp_path, run_id, "train.init_from=champion " + overrides, build)
    train = {
        **_train_result(tmp_path, run_id, eval_loss_after=1.2, eval_key=KEY),
        "init_from": gate.starting_point(ctx),
    }
    train["answers"] = {"after": _answers(tmp_path, run_id, "after", right, key)}
    return ctx, train


def test_a_first_run_compares_its_answers_with_the_model_as_built_and_keeps_them_in_its_store(tmp_path):
    run = _first_run(tmp_path)
    task = run["evaluation"]["task"]
    assert task["against"] == "before training"
    assert (task["metrics_before"]["exact_match"], task["metrics_after"]["exact_match"]) == (0.0, 0.6)
    assert task["comparison"]["exact_match"]["difference"] == pytest.approx(0.6)
    page = (tmp_path / "run-1" / answers.SIDE_BY_SIDE).read_text()
    assert "Gate: promoted local-fsdp@1 to champion" in page and page.count("| Instruction: ") == 20
    provenance = gate.registry(run["ctx"]).get("local-fsdp", "1").provenance
    assert provenance["generation_key"] == GENERATION and provenance["task_metrics"]["exact_match"] == 0.6
    # Kept by the stage in the run's store, not where the job wrote (the run's pods may write there).
    kept = tmp_path / "run-1" / "eval" / "answers-after.jsonl"
    assert provenance["answers_uri"] == task["answers_uri"] == str(kept)
    assert kept.read_text() == (tmp_path / "run-1" / "train" / "eval" / "answers-after.jsonl").read_text()
    assert provenance["answers_key"] == ray_stages.answers_key(run["ctx"], GENERATION) != GENERATION
    assert provenance["champion_answers_uri"] is None  # there was no champion to answer
    assert (provenance["scorer"], provenance["scorer_file"], provenance["scorer_digest"]) == (None, None, None)


def test_the_champions_answers_are_reused_under_the_same_key_and_asked_again_under_another(tmp_path):
    _first_run(tmp_path)
    second, train = _later(tmp_path, "run-2", 10, overrides="gate.guards=exact_match>=0")
    assert _plan(second, train, gate.champion_to_measure(second))[1] is False
    (tmp_path / "run-1" / "train" / "eval" / "answers-after.jsonl").write_text("")  # the job's file: not what is read
    evaluation = ray_stages.evaluate(second, json.dumps(train))
    assert "job" not in evaluation  # the champion's loss and answers are both its record's
    task = evaluation["task"]
    assert task["against"] == "champion" and task["champion_answers"] == "recorded by local-fsdp@1"
    assert task["other_uri"] == str(tmp_path / "run-1" / "eval" / "answers-after.jsonl")
    assert task["comparison"]["exact_match"]["difference"] == pytest.approx(-0.1)
    assert task["metrics_other"]["exact_match"] == pytest.approx(0.6)
    # A lower loss would promote it; the guard on exact match keeps the champion, and the decision says which.
    result = _registered(second, train, evaluation)
    assert result["decision"] == gate.KEEP and result["guard_failed"] == "exact_match>=0"
    assert "guard exact_match>=0 failed (local-fsdp@2 - champion = -0.1000)" in result["reason"]
    assert "Gate: kept champion local-fsdp@1" in (tmp_path / "run-2" / answers.SIDE_BY_SIDE).read_text()

    third, train = _later(tmp_path, "run-3", 14, OTHER_GENERATION)
    assert _plan(third, train, gate.champion_to_measure(third)) == (None, True)
    with pytest.raises(InfraError, match=NO_CLUSTER.format("run-3")):  # the job where the champion answers again
        ray_stages.evaluate(third, json.dumps(train))


def test_the_answers_key_changes_with_each_part_of_what_decides_the_answers_and_their_scores(tmp_path):
    """The champion's answers are reused only under the answers key they were given under: the trainer's generation
    key (trainers.generation.generation_key, computed here from each run's spec as the train job computes it) with
    the image and the accelerator (answers.answers_key). Each part changed on its own asks the champion again; the
    same key, in another run, reuses them; another model (version) has none of them."""
    _first_run(tmp_path, key=generation.generation_key(KEY, _run(tmp_path, "probe").spec))

    def asks_again(run_id: str, overrides: str = "", eval_key: str = KEY, build=None, accelerator="") -> bool:
        ctx, train = _later(tmp_path, run_id, 10, overrides=overrides, build=build)
        if accelerator:
            cluster = dataclasses.replace(ctx.spec.cluster, accelerator=accelerator)
            ctx = dataclasses.replace(ctx, spec=dataclasses.replace(ctx.spec, cluster=cluster))
        train["answers"]["after"]["generation_key"] = generation.generation_key(eval_key, ctx.spec)
        recorded, again = _plan(ctx, train, gate.champion_to_measure(ctx))
        assert again is (recorded is None)
        return again

    assert not asks_again("same")  # an unchanged key: reused
    assert asks_again("prompts", eval_key=OTHER_KEY)  # other examples, tokenizer, lengths, dtypes or device
    assert asks_again("how-many", "eval.generate_examples=32")
    assert asks_again("decode", "eval.max_new_tokens=24")
    assert asks_again("metrics", "eval.metrics=exact_match,answer_length,json_valid")
    assert not asks_again("reordered", "eval.metrics=answer_length,exact_match")  # the same metrics: reused
    assert asks_again("scorer", "eval.scorer=trainers.scorers.prefix:prefix_credit")
    other_image = {**_records()["build_image"], "digest": "sha256:" + "ab" * 32}
    assert asks_again("image", build=other_image)
    assert asks_again("chip", accelerator="v6e")
    # The scorer's code, not only its name, is in the key: its whole package's digest (another source of the same
    # MODULE:FUNCTION, or of a helper it imports, is another key: tests/unit/test_task_metrics.py).
    # Another model: the answers recorded are local-fsdp@1's, no other version's.
    same = ray_stages.answers_key(_run(tmp_path, "again"), generation.generation_key(KEY, _run(tmp_path, "p2").spec))
    assert answers.recorded_answers(_run(tmp_path, "again"), "local-fsdp@1", same)["recorded_by"] == "local-fsdp@1"
    assert answers.recorded_answers(_run(tmp_path, "again"), "local-fsdp@2", same) is None


def _champion_answered_in_the_job(tmp_path, loss_after: float) -> tuple[dict, str]:
    """run-2, whose champion (local-fsdp@1) answered under another key than this run's in its evaluation job, its
    answers kept in run-2's store, registered with a held-out loss of ``loss_after`` against the champion's 1.5:
    (the register stage's result, where the champion's answers are kept)."""
    _first_run(tmp_path)
    second, train = _later(tmp_path, "run-2", 10, OTHER_GENERATION)
    champion = gate.champion_to_measure(second) or {}
    recorded, again = _plan(second, train, champion)
    assert (recorded, again) == (None, True)
    with pytest.raises(InfraError, match=NO_CLUSTER.format("run-2")):
        ray_stages.evaluate(second, json.dumps(train))
    # What the evaluation job would report: the champion's answers event, its file in the job's directory.
    given = _answers(tmp_path, "run-2", "champion", 11, OTHER_GENERATION)
    events = [("event", {"event": "answers", **given})]
    task = answers.evaluate_answers(second, train, champion, recorded, events, partial(ray_stages.answers_key, second))
    assert task["champion_answers"] == "answered in this job"
    kept = tmp_path / "run-2" / "eval" / "answers-champion.jsonl"
    assert task["champion_answers_uri"] == task["other_uri"] == str(kept) and kept.is_file()
    assert task["champion_answers_key"] == ray_stages.answers_key(second, OTHER_GENERATION)
    evaluation = {  # the evaluate stage's result with the figures known (ray_stages.evaluate)
        "eval_loss_after": loss_after,
        "champion_loss": 1.5,
        "eval_key": KEY,
        "eval_split": "heldout",
        "champion": {k: v for k, v in champion.items() if k != "path"},
        "task": task,
        ray_stages.MEASURED: ray_stages.pin_checkpoint(second, train),
    }
    result = _registered(second, train, evaluation)
    provenance = gate.registry(second).get("local-fsdp", "2").provenance
    assert provenance["champion_measured"] == "local-fsdp@1"
    assert provenance["champion_answers_uri"] == str(kept)
    return result, str(kept)


def test_the_champions_answers_given_in_an_evaluation_job_are_recorded_and_reused_by_the_next_run(tmp_path):
    """The champion (local-fsdp@1) answered under another key than this run's: the evaluation job has it answer again,
    the stage keeps those answers in the run's store and the version it registers records them beside the champion
    it measured; a later run with that key whose champion local-fsdp@1 is again reads them from there, while the
    version that recorded them is in the champion alias's history."""
    result, kept = _champion_answered_in_the_job(tmp_path, loss_after=1.2)
    assert result["decision"] == gate.PROMOTE  # a lower loss, and no task metric chosen
    reg = gate.registry(_run(tmp_path, "run-2"))

    # Rolled back, local-fsdp@2 leaves the alias's history (its marker goes): its record of local-fsdp@1 is not taken.
    reg.rollback("local-fsdp")
    third, train = _later(tmp_path, "run-3", 13, OTHER_GENERATION)
    assert _plan(third, train, gate.champion_to_measure(third)) == (None, True)
    # Promoted again, then local-fsdp@1 set back by hand: local-fsdp@2 held the alias, and its record is taken.
    reg.promote("local-fsdp", "2")
    reg.promote("local-fsdp", "1")
    recorded, again = _plan(third, train, gate.champion_to_measure(third))
    assert not again and recorded["recorded_by"] == "local-fsdp@2" and recorded["uri"] == kept
    assert recorded["means"]["exact_match"] == pytest.approx(11 / 20)


def test_a_kept_versions_record_of_the_champions_answers_is_not_taken(tmp_path):
    """A version the gate kept beside its champion records what its run's pods said the champion answered; the next
    run does not compare against that: the champion answers again (docs/registry.md)."""
    result, _ = _champion_answered_in_the_job(tmp_path, loss_after=1.9)
    assert result["decision"] == gate.KEEP
    third, train = _later(tmp_path, "run-3", 13, OTHER_GENERATION)
    assert _plan(third, train, gate.champion_to_measure(third)) == (None, True)


def _first_answers(tmp_path, after: dict, before: dict | None = None) -> dict:
    """The evaluate stage's task figures of a first run (no champion) whose train job reported ``after``."""
    ctx = _run(tmp_path, "run-1")
    train = {"answers": {"after": after, "before": before or _answers(tmp_path, "run-1", "before", 0)}}
    return answers.evaluate_answers(ctx, train, {}, None, [], partial(ray_stages.answers_key, ctx))


@pytest.mark.parametrize(
    "where",
    [
        "run-0/train/eval/answers-after.jsonl",  # another run's answers
        "run-1/train/eval/../../run-0/train/eval/answers-after.jsonl",  # out of the directory by ..
        "run-1/train/elsewhere/answers-after.jsonl",  # the job's directory, not its answers'
        "gs://another-bucket/runs/run-1/eval/answers-after.jsonl",  # an object the pipeline's identity could read
    ],
)
def test_answers_the_job_names_outside_its_own_eval_directory_are_not_read(tmp_path, where):
    theirs = _answers(tmp_path, "run-0", "after", 20)  # a file that exists, all answered right
    path = where if where.startswith("gs://") else str(tmp_path / where)
    task = _first_answers(tmp_path, {**theirs, "path": path})
    assert (
        f"is not a file of the job's answers directory {tmp_path / 'run-1' / 'train' / 'eval'}/"
        in (task["comparison_missing"])
    )
    assert "comparison" not in task and "answers_uri" not in task and task["metrics_after"] is None
    assert not (tmp_path / "run-1" / answers.SIDE_BY_SIDE).exists()


def _rewritten(tmp_path, change) -> dict:
    """run-1's answers event (12 of 20 right), its file rewritten by ``change(rows)``."""
    event = _answers(tmp_path, "run-1", "after", 12)
    rows = [json.loads(line) for line in answered(12).splitlines()]
    change(rows)
    (tmp_path / "run-1" / "train" / "eval" / "answers-after.jsonl").write_text(answers._lines(rows))
    return event


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda rows: rows.pop(), "19 answers, eval.generate_examples asks for 20"),
        (lambda rows: rows.append({**rows[0], "index": 20}), "21 answers, eval.generate_examples asks for 20"),
        (lambda rows: rows.reverse(), "row 0 is not the answer to prompt 0 (index 19)"),
        (lambda rows: rows[3]["scores"].update(exact_match=1.5), "row 3's exact_match score 1.5 is not a number in"),
        (lambda rows: rows[4]["scores"].update(exact_match=float("nan")), "row 4's exact_match score nan is not a"),
        (lambda rows: rows[5]["scores"].update(answer_length=-1), "row 5's answer_length score -1 is not a number"),
        (lambda rows: rows[6]["scores"].pop("answer_length"), "row 6 is scored by ['exact_match'], this run's"),
        (lambda rows: rows[7].pop("answer"), "row 7 has no answer text"),
    ],
)
def test_answers_that_are_not_this_runs_prompts_answered_and_scored_are_not_compared(tmp_path, change, why):
    task = _first_answers(tmp_path, _rewritten(tmp_path, change))
    assert why in task["comparison_missing"] and "comparison" not in task and task["metrics_after"] is None


def test_the_means_are_the_rows_not_the_jobs_event_and_sets_of_other_lengths_are_refused(tmp_path):
    # A length is a count, not a fraction: answer_length may pass 1.
    event = _rewritten(tmp_path, lambda rows: rows[0]["scores"].update(answer_length=7.0))
    task = _first_answers(tmp_path, {**event, "means": {"exact_match": 1.0, "answer_length": 1.0}})
    assert task["metrics_after"] == {"exact_match": 0.6, "answer_length": pytest.approx(1.3)}
    assert task["comparison"]["exact_match"]["candidate"] == 0.6
    before = _answers(tmp_path, "run-1", "before", 0)
    before["means"] = {"exact_match": 0.9, "answer_length": 1.0}
    assert _first_answers(tmp_path, event, before)["metrics_before"]["exact_match"] == 0.0

    rows = [json.loads(line) for line in answered(12).splitlines()]
    with pytest.raises(answers.Refused, match="20 answers beside 19: not one set of prompts"):
        answers.compare(rows, rows[:19])


def test_the_champions_answers_given_under_another_generation_key_than_the_candidates_are_not_compared(tmp_path):
    _first_run(tmp_path)
    second, train = _later(tmp_path, "run-2", 10, OTHER_GENERATION)
    champion = gate.champion_to_measure(second) or {}
    given = _answers(tmp_path, "run-2", "champion", 11, GENERATION)  # the job's key, not the train job's
    events = [("event", {"event": "answers", **given})]
    task = answers.evaluate_answers(second, train, champion, None, events, partial(ray_stages.answers_key, second))
    assert task["comparison_missing"] == (
        f"the champion answered under generation key {GENERATION}, the trained model under {OTHER_GENERATION}"
    )
    assert "comparison" not in task and "champion_answers_uri" not in task and "other_uri" not in task


@pytest.mark.parametrize(
    "spoil, why",
    [
        (lambda kept: kept.write_text("{not json\n"), "Expecting property name"),
        (lambda kept: kept.write_text(answered(12).replace('"index": 3', '"index": 4')), "row 3 is not the answer"),
        (lambda kept: kept.unlink(), "no such file"),
    ],
)
def test_a_recorded_answers_file_that_cannot_be_read_is_passed_over_naming_its_version(tmp_path, capsys, spoil, why):
    """The champion's kept answers spoiled: a later run warns, naming the version that records them, and has the
    champion answer again instead of failing its evaluate stage (and every later run's)."""
    _first_run(tmp_path)
    kept = tmp_path / "run-1" / "eval" / "answers-after.jsonl"
    spoil(kept)
    second, train = _later(tmp_path, "run-2", 10)
    capsys.readouterr()
    assert _plan(second, train, gate.champion_to_measure(second)) == (None, True)
    warned = capsys.readouterr().out
    assert f"evaluate: warning: local-fsdp@1's record of local-fsdp@1's answers ({kept}) is not read: " in warned
    assert why in warned


def test_an_evaluation_set_smaller_than_generate_examples_is_answered_whole_and_compared(tmp_path):
    """The trainer answers min(eval.generate_examples, held-out examples) prompts: a run whose snapshot (the
    pipeline's own manifest) holds 15 held-out examples has 15 answers compared, and 20 (more than it holds) refused."""
    from components.platforms.store import write_json
    from components.stages.dataset import MANIFEST

    def held_out_15(rows):
        del rows[15:]

    ctx = _run(tmp_path, "run-1")
    write_json(ctx.store, MANIFEST, {"num_heldout_examples": 15})
    assert answers.expected(ctx) == 15
    task = _first_answers(tmp_path, _rewritten(tmp_path, held_out_15), _rewritten_before(tmp_path, held_out_15))
    assert task["num_examples"] == 15 and "comparison" in task, task
    task = _first_answers(tmp_path, _rewritten(tmp_path, lambda rows: None))
    why = "20 answers, eval.generate_examples asks for 20 and the run's snapshot holds 15 held-out"
    assert why in task["comparison_missing"]


def _rewritten_before(tmp_path, change) -> dict:
    event = _answers(tmp_path, "run-1", "before", 0)
    rows = [json.loads(line) for line in answered(0).splitlines()]
    change(rows)
    (tmp_path / "run-1" / "train" / "eval" / "answers-before.jsonl").write_text(answers._lines(rows))
    return event
