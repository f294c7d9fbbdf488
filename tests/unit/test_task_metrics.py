"""The task metrics of generated answers (trainers.metrics): each metric's score, a team's scorer and how it fails,
run in the pipeline environment (no ROUGE there: the
generation test scores ROUGE-L in the trainer's)."""

from __future__ import annotations

import sys
import types

import pytest

from trainers import metrics
from trainers.metrics import Example, ScorerError


def _examples(*pairs: tuple[str, str]) -> list[Example]:
    return [Example(f"prompt {i}", reference, answer) for i, (reference, answer) in enumerate(pairs)]


def test_normalisation_drops_case_punctuation_articles_and_extra_spaces():
    assert metrics.normalize("  The  Cat, sat on AN mat! ") == "cat sat on mat"
    assert metrics.normalize("theatre") == "theatre"  # an article only as a word


def test_built_in_metrics_score_each_example():
    examples = _examples(("olleh", "olleh"), ("Paris", "paris."), ('{"a": 1}', '{"a": 1'), ("x y", "x  y z"))
    found = metrics.scores(["exact_match", "normalized_exact_match", "json_valid", "answer_length"], examples)
    assert found["exact_match"] == [1.0, 0.0, 0.0, 0.0]
    assert found["normalized_exact_match"] == [1.0, 1.0, 1.0, 0.0]  # punctuation aside, the same words
    assert found["json_valid"] == [0.0, 0.0, 0.0, 0.0]
    assert found["answer_length"] == [1.0, 1.0, 2.0, 3.0]
    assert metrics.means(found)["normalized_exact_match"] == 0.75
    assert metrics.scores(["json_valid"], _examples(("", '{"a": [1, 2]}')))["json_valid"] == [1.0]


@pytest.fixture
def scorer_module(monkeypatch):
    """A team's scorer module, importable as ``team_scoring`` (a module of the test's own, not of the project)."""
    module = types.ModuleType("team_scoring")

    def contains(prompt, reference, answer):
        return float(reference in answer)

    def raises(prompt, reference, answer):
        if answer == "boom":
            raise KeyError("no such field")
        return 1.0

    def out_of_range(prompt, reference, answer):
        return 1.5 if answer == "big" else 0.0

    module.contains, module.raises, module.out_of_range = contains, raises, out_of_range
    module.not_a_function = 3
    monkeypatch.setitem(sys.modules, "team_scoring", module)
    return module


def test_a_team_scorer_scores_each_example(scorer_module):
    found = metrics.scores(["exact_match", "scorer"], _examples(("ab", "xaby"), ("cd", "c")), "team_scoring:contains")
    assert found["scorer"] == [1.0, 0.0]


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        ("team_scoring:raises", "eval.scorer team_scoring:raises: raised on example 2: KeyError"),
        ("team_scoring:out_of_range", "eval.scorer team_scoring:out_of_range: returned 1.5 on example 2"),
        ("team_scoring:not_a_function", "is not a function"),
        ("team_scoring:missing", "cannot be imported"),
        ("no_such_team_module:score", "cannot be imported"),
    ],
)
def test_a_scorer_that_fails_is_named_with_the_example(scorer_module, ref, words):
    examples = _examples(("a", "a"), ("b", "b"), ("c", "boom" if "raises" in ref else "big"))
    with pytest.raises(ScorerError, match=words):
        metrics.scores(["scorer"], examples, ref)


def test_a_scorer_returning_no_number_fails(scorer_module):
    scorer_module.text = lambda prompt, reference, answer: "1"
    with pytest.raises(ScorerError, match="returned '1' on example 0"):
        metrics.scores(["scorer"], _examples(("a", "a")), "team_scoring:text")


def test_the_shipped_prefix_scorer_gives_the_characters_right_from_the_start():
    """trainers.scorers.prefix:prefix_credit, the scorer the local gate's e2e runs name: loaded by its reference as the
    trainer loads a team's, each score the shared prefix over the longer of answer and reference."""
    examples = _examples(
        ("Havana", "Havana"), ("Havana", " Hava "), ("Lima", "Limaxx"), ("Oslo", "Paris"), ("Rome", ""), ("", "")
    )
    found = metrics.scores(["exact_match", "scorer"], examples, "trainers.scorers.prefix:prefix_credit")
    assert found["scorer"] == pytest.approx([1.0, 4 / 6, 4 / 6, 0.0, 0.0, 0.0])
    assert found["exact_match"] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
