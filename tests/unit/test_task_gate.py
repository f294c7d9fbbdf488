"""The gate on a task metric and its guards (components.stages.task_gate), over the paired comparison of the
candidate's and the champion's answers (components.stages.answers): the decision names the figure that decided and the
guard that failed."""

from __future__ import annotations

import json

import pytest

from components.platforms import RunContext
from components.platforms.store import LocalStore
from components.stages import answers, task_gate
from components.stages.gate import KEEP, PROMOTE, decide
from components.workload import resolve


def _rows(scores: list[dict[str, float]], answer: str) -> list[dict]:
    return [
        {
            "index": i,
            "prompt": f"Instruction: {i}\nResponse: ",
            "reference": f"x{i}",
            "answer": f"{answer}{i}",
            "scores": s,
        }
        for i, s in enumerate(scores)
    ]


def _task(candidate: list[dict[str, float]], champion: list[dict[str, float]]) -> dict:
    return {"against": "champion", "comparison": answers.compare(_rows(candidate, "new"), _rows(champion, "old"))}


# 40 examples: the candidate gets 30 right where the champion got 10 (exact match +0.5), but its answers are
# 3 words longer each and its ROUGE-L is 0.1 lower on every one.
CANDIDATE = [{"exact_match": float(i < 30), "rouge_l": 0.5, "answer_length": 5.0} for i in range(40)]
CHAMPION = [{"exact_match": float(i < 10), "rouge_l": 0.6, "answer_length": 2.0} for i in range(40)]
LOSS_PROMOTES = decide(1.0, 2.0, 0.0, "m@2", "m@1")


def test_a_task_metric_decides_and_the_decision_names_it():
    spec = resolve("local-fsdp", "gate.metric=exact_match")
    decision, detail = task_gate.decide(
        spec, decide(2.0, 1.0, 0.0, "m@2", "m@1"), _task(CANDIDATE, CHAMPION), "m@2", "m@1"
    )
    assert decision.decision == PROMOTE  # the loss would have kept the champion; exact match decides
    assert "exact_match 0.7500 vs champion m@1 0.2500 (+0.5000" in decision.reason
    assert detail["decided_by"] == "exact_match" and detail["guard_failed"] is None


def test_a_failing_guard_blocks_promotion_and_the_decision_names_it():
    spec = resolve("local-fsdp", "gate.metric=exact_match gate.guards=exact_match>=-0.02,rouge_l>=-0.05")
    decision, detail = task_gate.decide(spec, LOSS_PROMOTES, _task(CANDIDATE, CHAMPION), "m@2", "m@1")
    assert decision.decision == KEEP
    assert "guard rouge_l>=-0.05 failed" in decision.reason and "-0.1000" in decision.reason
    assert detail["guard_failed"] == "rouge_l>=-0.05"
    assert [g["held"] for g in detail["guards"]] == [True, False]


def test_a_guard_on_length_bounds_its_growth():
    spec = resolve("local-fsdp", "gate.guards=answer_length<=2")
    decision, detail = task_gate.decide(spec, LOSS_PROMOTES, _task(CANDIDATE, CHAMPION), "m@2", "m@1")
    assert (decision.decision, detail["guard_failed"], detail["decided_by"]) == (KEEP, "answer_length<=2", "eval_loss")


def test_an_improvement_inside_the_interval_is_kept_when_significance_is_required():
    # +1 right answer in 40: the interval of the difference reaches 0
    candidate = [{"exact_match": float(i < 11)} for i in range(40)]
    champion = [{"exact_match": float(i < 10)} for i in range(40)]
    spec = resolve("local-fsdp", "gate.metric=exact_match gate.require_significance=true")
    decision, _ = task_gate.decide(spec, LOSS_PROMOTES, _task(candidate, champion), "m@2", "m@1")
    assert decision.decision == KEEP and "inside the interval" in decision.reason
    plain = resolve("local-fsdp", "gate.metric=exact_match")
    assert task_gate.decide(plain, LOSS_PROMOTES, _task(candidate, champion), "m@2", "m@1")[0].decision == PROMOTE


def test_without_the_champions_answers_a_guard_keeps_the_champion():
    spec = resolve("local-fsdp", "gate.guards=exact_match>=-0.02")
    task = {"against": "before training", "comparison": {}, "comparison_missing": "no file"}
    decision, detail = task_gate.decide(spec, LOSS_PROMOTES, task, "m@2", "m@1")
    assert decision.decision == KEEP and "exact_match has no figure beside it" in decision.reason


def test_the_first_version_is_promoted_whatever_the_guards():
    spec = resolve("local-fsdp", "gate.guards=exact_match>=-0.02")
    first = decide(1.0, None, 0.0, "m@1")
    assert task_gate.decide(spec, first, {}, "m@1", "")[0] == first


def test_the_side_by_side_shows_the_table_then_regressions_first(tmp_path):
    spec = resolve("local-fsdp", "eval.generate_examples=20 eval.metrics=exact_match")
    candidate = [{"exact_match": float(i % 2 == 0)} for i in range(20)]
    champion = [{"exact_match": float(i % 3 == 0)} for i in range(20)]
    ctx = RunContext(spec=spec, run_id="r", store=LocalStore(tmp_path), platform="local")
    found = answers.task_figures(
        ctx,
        {"uri": _write(tmp_path / "a.jsonl", _rows(candidate, "new")), "means": {}, "num_examples": 20},
        {"uri": _write(tmp_path / "b.jsonl", _rows(champion, "old")), "which": "champion"},
        "champion",
        lambda generation_key: None,
    )
    page = (tmp_path / "eval" / "side_by_side.md").read_text()
    assert "| exact_match | 0.5000 | 0.3500 | +0.1500 |" in page
    examples = [line for line in page.splitlines() if line.startswith("| ") and "Instruction" in line]
    assert len(examples) == 20
    regressions = [i for i in range(20) if candidate[i]["exact_match"] < champion[i]["exact_match"]]
    assert [int(line.split("|")[1]) for line in examples[: len(regressions)]] == regressions
    merged = [json.loads(line) for line in (tmp_path / "eval" / "answers.jsonl").read_text().splitlines()]
    assert merged[3]["answer"] == "new3" and merged[3]["champion"]["answer"] == "old3"
    assert found["comparison"]["exact_match"]["difference"] == pytest.approx(0.15)


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_paired_bootstrap_interval_holds_the_difference_and_is_fixed_by_its_seed():
    candidate = [1.0] * 30 + [0.0] * 10
    champion = [0.0] * 20 + [1.0] * 10 + [0.0] * 10
    difference, low, high = answers.paired_bootstrap(candidate, champion)
    assert difference == pytest.approx(0.5)
    assert 0 < low < difference < high <= 1
    assert answers.paired_bootstrap(candidate, champion) == (difference, low, high)
    assert answers.paired_bootstrap([1.0, 0.0, 1.0], [1.0, 0.0, 1.0]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="paired"):
        answers.paired_bootstrap([1.0], [1.0, 0.0])


def test_examples_that_share_a_reference_are_resampled_as_one_cluster():
    """8 questions asked 8 times each (the local task's shape: one reference per question): the candidate knows 5,
    the other none. Resampled one by one the 64 rows would look like 64 independent examples; resampled by question
    the interval is as wide as 8 draws of a question allow, and a resample is the mean of the rows it drew."""
    references = [f"capital{q}" for q in range(8) for _ in range(8)]
    candidate = [float(r in {"capital0", "capital1", "capital2", "capital3", "capital4"}) for r in references]
    other = [0.0] * 64
    cluster_of, count = answers.clusters(references)
    assert count == 8 and cluster_of[:9] == [0] * 8 + [1]
    _, row_low, row_high = answers.paired_bootstrap(candidate, other)
    difference, low, high = answers.paired_bootstrap(candidate, other, cluster_of)
    assert difference == pytest.approx(5 / 8)
    assert low < row_low and high > row_high  # wider than the rows taken as independent
    assert 0 < low < difference < high <= 1
    # Every resample of 8 questions scores k/8 for the k known ones it drew: so does each end of the interval.
    assert (low * 8, high * 8) == (pytest.approx(round(low * 8)), pytest.approx(round(high * 8)))
    # One reference for every example tells no question from another: the examples are resampled one by one.
    assert answers.clusters(["yes"] * 5) == ([0, 1, 2, 3, 4], 5)
    table = answers.compare(
        [
            {"prompt": f"p{i}", "reference": r, "scores": {"exact_match": c}}
            for i, (r, c) in enumerate(zip(references, candidate, strict=True))
        ],
        [{"prompt": f"p{i}", "reference": r, "scores": {"exact_match": 0.0}} for i, r in enumerate(references)],
    )
    assert table["exact_match"] == {
        "candidate": pytest.approx(5 / 8),
        "other": 0.0,
        "difference": pytest.approx(5 / 8),
        "low": low,
        "high": high,
        "clusters": 8,
    }
    with pytest.raises(ValueError, match="one cluster per example"):
        answers.paired_bootstrap([1.0, 0.0], [0.0, 0.0], [0])
