"""Task metrics of generated answers (``eval.metrics``, ``eval.scorer``): each example's score and each metric's mean
(the paired comparison of two models' scores is the evaluate stage's: ``components.stages.answers``).

Pure Python and numpy; ROUGE-L is Google's reference implementation, ``rouge-score`` (PyPI 0.1.2, imported where it
is used: the trainer image has it). Its default tokenizer lowercases and keeps only ``[a-z0-9]`` runs, so an answer
in another script scores 0 against any reference (rouge_score/tokenize.py, https://github.com/google-research/
google-research/blob/master/rouge/tokenize.py).

A team's scorer (``eval.scorer=MODULE:FUNCTION``) is ``(prompt, reference, answer) -> float`` in [0, 1]; one that
raises or returns anything else fails the evaluation, naming it and the example's index (:class:`ScorerError`).
"""

from __future__ import annotations

import importlib
import json
import math
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from components.spec.run_spec import SCORER

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


class ScorerError(RuntimeError):
    """A scorer that raised, or returned no number in [0, 1], on one example."""


@dataclass(frozen=True)
class Example:
    prompt: str
    reference: str
    answer: str


def normalize(text: str) -> str:
    """Lowercase, without punctuation, without the articles a, an and the, with runs of whitespace made one space: the
    normalisation of SQuAD's evaluation (its ``normalize_answer``)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(reference: str, answer: str) -> float:
    return float(answer.strip() == reference.strip())


def normalized_exact_match(reference: str, answer: str) -> float:
    return float(normalize(answer) == normalize(reference))


def json_valid(reference: str, answer: str) -> float:
    """1 when the answer parses as JSON (whatever the reference)."""
    try:
        json.loads(answer)
    except ValueError:
        return 0.0
    return 1.0


def answer_length(reference: str, answer: str) -> float:
    """The answer's words (whitespace-separated): a length, not a score in [0, 1]."""
    return float(len(answer.split()))


def _rouge_l() -> Callable[[str, str], float]:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])

    def rouge_l(reference: str, answer: str) -> float:
        return float(scorer.score(reference, answer)["rougeL"].fmeasure)

    return rouge_l


BUILT_IN: dict[str, Callable[[], Callable[[str, str], float]]] = {
    "exact_match": lambda: exact_match,
    "normalized_exact_match": lambda: normalized_exact_match,
    "rouge_l": _rouge_l,
    "json_valid": lambda: json_valid,
    "answer_length": lambda: answer_length,
}


def load_scorer(ref: str) -> Callable[[str, str, str], Any]:
    """The function ``MODULE:FUNCTION`` names (``eval.scorer``), imported now."""
    module, _, name = ref.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ScorerError(f"eval.scorer {ref}: cannot be imported ({exc})") from exc
    if not callable(found):
        raise ScorerError(f"eval.scorer {ref}: is not a function")
    return found


def _scored(ref: str, scorer: Callable[[str, str, str], Any], index: int, example: Example) -> float:
    try:
        value = scorer(example.prompt, example.reference, example.answer)
    except Exception as exc:  # whatever a team's scorer raises, the evaluation names it and the example
        raise ScorerError(f"eval.scorer {ref}: raised on example {index}: {type(exc).__name__}: {exc}") from exc
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= 1
    if not ok:
        raise ScorerError(f"eval.scorer {ref}: returned {value!r} on example {index}, not a number in [0, 1]")
    return float(value)


def scores(names: Sequence[str], examples: Sequence[Example], scorer_ref: str = "") -> dict[str, list[float]]:
    """Each metric's score of each example, in the examples' order: the built-in ``names`` (``scorer``: the team's,
    ``scorer_ref``)."""
    found: dict[str, list[float]] = {}
    for name in names:
        if name == SCORER:
            scorer = load_scorer(scorer_ref)
            found[name] = [_scored(scorer_ref, scorer, i, e) for i, e in enumerate(examples)]
        else:
            metric = BUILT_IN[name]()
            found[name] = [metric(e.reference, e.answer) for e in examples]
    return found


def means(per_example: dict[str, list[float]]) -> dict[str, float]:
    return {name: sum(values) / len(values) if values else math.nan for name, values in per_example.items()}
