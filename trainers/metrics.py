"""Task metrics of generated answers (``eval.metrics``, ``eval.scorer``): each example's score and each metric's mean
(the paired comparison of two models' scores is the evaluate stage's: ``components.stages.answers``).

Pure Python and numpy; ROUGE-L is Google's reference implementation, ``rouge-score`` (PyPI 0.1.2, imported where it
is used: the trainer image has it). Its default tokenizer lowercases and keeps only ``[a-z0-9]`` runs, so an answer
in another script scores 0 against any reference (rouge_score/tokenize.py, https://github.com/google-research/
google-research/blob/master/rouge/tokenize.py).

A team's scorer (``eval.scorer=trainers.scorers.MODULE:FUNCTION``) is ``(prompt, reference, answer) -> float`` in
[0, 1]; one that raises or returns anything else fails the evaluation, naming it and the example's index
(:class:`ScorerError`). It must be the trainer's own code: a function defined in a module of the ``trainers.scorers``
package beside this one (:func:`resolve_scorer` finds its file with ``importlib.util.find_spec``, which imports the
parent packages and not the module, and refuses a module that is not there), so a run picks a function the image
ships, never any callable an import path reaches (``PYTHONPATH`` included); its package's files are hashed
(:func:`package_digest`) into the answers' key and the version's provenance.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import os
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.spec.run_spec import SCORER, SCORER_REF, SCORERS_PACKAGE

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


@dataclass(frozen=True)
class Scorer:
    """Where ``eval.scorer`` resolved: its module, its file (``trainers/scorers/...``, relative to the directory that
    holds the ``trainers`` package) and the sha256 of its package's Python files (:func:`package_digest`)."""

    ref: str
    module: str
    file: str
    digest: str


def scorers_home() -> Path:
    """The ``trainers.scorers`` package's directory beside this module: the trainer's own code (the image's; on the
    local platform the checkout's, which the trainer environments install in editable mode)."""
    return Path(os.path.abspath(__file__)).parent.joinpath(*SCORERS_PACKAGE.split(".")[1:])


def package_digest(directory: Path) -> str:
    """``sha256:<hex>`` of every ``.py`` file under ``directory`` (its subpackages too), by relative path in sorted
    order, each path with its content's sha256: a change to any helper a scorer imports from its package, or a file
    added or removed, changes it; caches (``__pycache__``) and other files do not."""
    found = hashlib.sha256()
    for path in sorted(directory.rglob("*.py"), key=lambda p: p.relative_to(directory).as_posix()):
        if "__pycache__" in path.relative_to(directory).parts:
            continue
        content = hashlib.sha256(path.read_bytes()).hexdigest()
        found.update(f"{path.relative_to(directory).as_posix()}\0{content}\n".encode())
    return "sha256:" + found.hexdigest()


def resolve_scorer(ref: str) -> Scorer:
    """The module ``eval.scorer`` names, found (``importlib.util.find_spec``: its parent packages imported, not the
    module itself) as a Python file under this trainer's ``trainers/scorers/`` (:func:`scorers_home`), with its
    package's digest; :class:`ScorerError` naming the field otherwise: a reference of another shape, no such module,
    or one found elsewhere (a directory added to the package's search path)."""
    if not SCORER_REF.match(ref):
        raise ScorerError(f"eval.scorer {ref}: not {SCORERS_PACKAGE}.MODULE:FUNCTION, the trainer's own code")
    module = ref.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise ScorerError(f"eval.scorer {ref}: no module {module} in the trainer image ({exc})") from exc
    if spec is None or not spec.has_location or not spec.origin:
        raise ScorerError(f"eval.scorer {ref}: no module {module} in the trainer image")
    home, origin = scorers_home(), Path(os.path.abspath(spec.origin))
    if not origin.is_relative_to(home) or origin.suffix != ".py":
        raise ScorerError(
            f"eval.scorer {ref}: {module} is {origin}, not a Python file of the trainer's own {home}: a scorer is "
            f'the image\'s code (docs/registry.md, "Where a scorer lives")'
        )
    above = Path(os.path.abspath(__file__)).parents[1]  # the directory that holds the trainers package
    return Scorer(ref, module, origin.relative_to(above).as_posix(), package_digest(origin.parent))


def load_scorer(ref: str) -> Callable[[str, str, str], Any]:
    """The function ``trainers.scorers.MODULE:FUNCTION`` names (``eval.scorer``), resolved (:func:`resolve_scorer`)
    and imported now: a function defined in the scorers package (a name the module imported from elsewhere is not a
    scorer)."""
    module = resolve_scorer(ref).module
    name = ref.partition(":")[2]
    try:
        found: object = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ScorerError(f"eval.scorer {ref}: cannot be imported ({exc})") from exc
    if not callable(found):
        raise ScorerError(f"eval.scorer {ref}: is not a function")
    defined = getattr(found, "__module__", None) or ""
    if defined != module and not defined.startswith(SCORERS_PACKAGE + "."):
        raise ScorerError(f"eval.scorer {ref}: is {defined or 'no module'}'s, not a function of {SCORERS_PACKAGE}")
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


def scored_by(ref: str, scorer: Callable[[str, str, str], Any], examples: Sequence[Example]) -> list[float]:
    """Each example's score by the team's ``scorer`` (``eval.scorer`` ``ref``), checked: a number in [0, 1], or
    :class:`ScorerError` naming ``ref`` and the example."""
    return [_scored(ref, scorer, i, e) for i, e in enumerate(examples)]


def scores(names: Sequence[str], examples: Sequence[Example], scorer_ref: str = "") -> dict[str, list[float]]:
    """Each metric's score of each example, in the examples' order: the built-in ``names`` (``scorer``: the team's,
    ``scorer_ref``)."""
    found: dict[str, list[float]] = {}
    for name in names:
        if name == SCORER:
            found[name] = scored_by(scorer_ref, load_scorer(scorer_ref), examples)
        else:
            metric = BUILT_IN[name]()
            found[name] = [metric(e.reference, e.answer) for e in examples]
    return found


def means(per_example: dict[str, list[float]]) -> dict[str, float]:
    return {name: sum(values) / len(values) if values else math.nan for name, values in per_example.items()}
