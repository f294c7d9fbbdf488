"""The evaluate and register stages over the answers to the evaluation prompts (components.stages.answers,
task_gate), without a Ray cluster: the train job's answers compared with the model's as built on a first run; a
recurring run reads its champion's recorded answers back when their generation key is its own (no evaluation job) and
has the champion answer again when the key changed (the job it would start has no cluster here); a failing guard keeps
the champion and the decision names it."""

from __future__ import annotations

import json

import pytest

from components.stages import answers, gate, ray_stages
from tests.unit.test_evaluation_reuse import KEY, _registered, _run, _train_result

GENERATION = "sha256:" + "a1" * 32
OTHER_GENERATION = "sha256:" + "a2" * 32


def _answers(root, run_id: str, which: str, right: int, key: str = GENERATION) -> dict:
    """A job's ``answers`` event for 20 prompts, ``right`` of them answered exactly, its file on disk."""
    path = root / run_id / "train" / "eval" / f"answers-{which}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "index": i,
            "prompt": f"Instruction: Reverse the word w{i}.\nResponse: ",
            "reference": f"{i}w",
            "answer": f"{i}w" if i < right else "x",
            "scores": {"exact_match": float(i < right), "answer_length": 1.0},
        }
        for i in range(20)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    means = {"exact_match": right / 20, "answer_length": 1.0}
    return {"which": which, "path": str(path), "means": means, "generation_key": key, "num_examples": 20}


def _first_run(tmp_path, overrides: str = "") -> dict:
    first = _run(tmp_path, "run-1", overrides)
    train = _train_result(tmp_path, "run-1", eval_loss_before=4.6, eval_loss_after=1.5, eval_key=KEY)
    train["answers"] = {
        "before": _answers(tmp_path, "run-1", "before", 0),
        "after": _answers(tmp_path, "run-1", "after", 12),
    }
    evaluation = ray_stages.evaluate(first, json.dumps(train))
    return {"ctx": first, "evaluation": evaluation, "registered": _registered(first, train, evaluation)}


def test_a_first_run_compares_its_answers_with_the_model_as_built_and_records_them(tmp_path):
    run = _first_run(tmp_path)
    task = run["evaluation"]["task"]
    assert task["against"] == "before training"
    assert (task["metrics_before"]["exact_match"], task["metrics_after"]["exact_match"]) == (0.0, 0.6)
    assert task["comparison"]["exact_match"]["difference"] == pytest.approx(0.6)
    page = (tmp_path / "run-1" / answers.SIDE_BY_SIDE).read_text()
    assert "Gate: promoted local-fsdp@1 to champion" in page and page.count("| Instruction: ") == 20
    provenance = gate.registry(run["ctx"]).get("local-fsdp", "1").provenance
    assert provenance["generation_key"] == GENERATION and provenance["task_metrics"]["exact_match"] == 0.6
    assert provenance["answers_path"] == str(tmp_path / "run-1" / "train" / "eval" / "answers-after.jsonl")


def test_the_champions_answers_are_reused_under_the_same_key_and_asked_again_under_another(tmp_path):
    _first_run(tmp_path)
    second = _run(tmp_path, "run-2", "train.init_from=champion gate.guards=exact_match>=0")
    start = gate.starting_point(second)
    train = {**_train_result(tmp_path, "run-2", eval_loss_after=1.2, eval_key=KEY), "init_from": start}
    train["answers"] = {"after": _answers(tmp_path, "run-2", "after", 10)}
    assert answers.plan_champion(second, train, gate.champion_to_measure(second))[1] is False
    evaluation = ray_stages.evaluate(second, json.dumps(train))
    assert "job" not in evaluation  # the champion's loss and answers are both its record's
    task = evaluation["task"]
    assert task["against"] == "champion" and task["champion_answers"] == "recorded by local-fsdp@1"
    assert task["comparison"]["exact_match"]["difference"] == pytest.approx(-0.1)
    # A lower loss would promote it; the guard on exact match keeps the champion, and the decision says which.
    result = _registered(second, train, evaluation)
    assert result["decision"] == gate.KEEP and result["guard_failed"] == "exact_match>=0"
    assert "guard exact_match>=0 failed (local-fsdp@2 - champion = -0.1000)" in result["reason"]

    third = _run(tmp_path, "run-3", "train.init_from=champion")
    start = gate.starting_point(third)
    train = {**_train_result(tmp_path, "run-3", eval_loss_after=1.1, eval_key=KEY), "init_from": start}
    train["answers"] = {"after": _answers(tmp_path, "run-3", "after", 14, OTHER_GENERATION)}
    assert answers.plan_champion(third, train, gate.champion_to_measure(third)) == (None, True)
    with pytest.raises(Exception):  # noqa: B017  the evaluation job it would start for the champion has no cluster
        ray_stages.evaluate(third, json.dumps(train))
