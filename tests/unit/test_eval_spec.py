"""The evaluation's generation and task metrics, and the gate's figure and guards, as the run spec takes them: each
bad value is refused naming its key before anything is created."""

from __future__ import annotations

import pytest

from components.spec import SpecError
from components.workload import resolve


def test_the_local_preset_generates_64_examples_others_none_and_each_decides_on_the_held_out_loss():
    assert resolve("gemma4-e2b-v6e-16").eval.generate_examples == 0  # off on a slice until shown there
    spec = resolve("local-fsdp")
    assert spec.eval.generate_examples >= 16
    assert "exact_match" in spec.eval.metric_names
    assert (spec.gate.metric, spec.gate.guards, spec.gate.require_significance) == ("eval_loss", "", False)


def test_guards_parse_to_metric_comparison_and_bound():
    spec = resolve("local-fsdp", "gate.guards=exact_match>=-0.02,answer_length<=3 gate.metric=rouge_l")
    assert spec.gate.guard_list == (("exact_match", ">=", -0.02), ("answer_length", "<=", 3.0))


def test_a_scorer_is_a_metric_the_gate_can_decide_on():
    spec = resolve(
        "local-fsdp", "eval.scorer=trainers.scorers.my_team:score gate.metric=scorer gate.require_significance=true"
    )
    assert spec.eval.metric_names[-1] == "scorer"


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ("eval.generate_examples=8", "eval.generate_examples", "at least 16"),
        ("eval.generate_examples=-1", "eval.generate_examples", "at least 16"),
        ("eval.max_new_tokens=0", "eval.max_new_tokens", "at least 1"),
        ("eval.metrics=exact_match,bleu", "eval.metrics", "'bleu'"),
        ("eval.metrics=exact_match,exact_match", "eval.metrics", "twice"),
        ("eval.scorer=not-a-module", "eval.scorer", "is not trainers.scorers.MODULE:FUNCTION"),
        # any importable callable is no scorer: the module must be of the trainer image's own trainers/scorers/
        ("eval.scorer=numpy:save", "eval.scorer", "'numpy:save' is not trainers.scorers.MODULE:FUNCTION"),
        ("eval.scorer=my_team.scoring:score", "eval.scorer", "a module under trainers/scorers/"),
        ("eval.scorer=trainers.metrics:exact_match", "eval.scorer", "is not trainers.scorers.MODULE:FUNCTION"),
        ("eval.scorer=trainers.scorers:prefix", "eval.scorer", "is not trainers.scorers.MODULE:FUNCTION"),
        ("eval.scorer=trainers.scorersx.team:score", "eval.scorer", "is not trainers.scorers.MODULE:FUNCTION"),
        ("gate.metric=accuracy", "gate.metric", "'accuracy'"),
        ("gate.metric=answer_length", "gate.metric", "'answer_length'"),
        ("gate.metric=json_valid", "gate.metric", "not computed"),
        ("gate.metric=exact_match eval.generate_examples=0", "gate.metric", "not computed"),
        ("gate.metric=scorer", "gate.metric", "not computed"),
        ("gate.guards=exact_match>-0.02", "gate.guards", "METRIC>=BOUND"),
        ("gate.guards=json_valid>=0", "gate.guards", "not computed"),
        ("gate.require_significance=true", "gate.require_significance", "task metric"),
    ],
)
def test_a_bad_evaluation_or_gate_setting_names_its_key(overrides, key, words):
    with pytest.raises(SpecError) as raised:
        resolve("local-fsdp", overrides)
    assert raised.value.field == key
    assert words in str(raised.value)


def test_maxtext_computes_task_metrics_to_gate_on_only_when_it_answers():
    assert resolve("local-maxtext", "gate.metric=exact_match").gate.metric == "exact_match"
    with pytest.raises(SpecError) as raised:
        resolve("local-maxtext", "gate.metric=exact_match eval.generate_examples=0")
    assert raised.value.field == "gate.metric" and "not computed" in str(raised.value)
