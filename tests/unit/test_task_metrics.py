"""The task metrics of generated answers (trainers.metrics): each metric's score, a team's scorer, where it may live
(a function of the trainer's own trainers/scorers/ package, which keys the answers) and how it fails, run in the
pipeline environment (no ROUGE there: the
generation test scores ROUGE-L in the trainer's)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

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


def contains(prompt, reference, answer):
    return float(reference in answer)


def raises(prompt, reference, answer):
    if answer == "boom":
        raise KeyError("no such field")
    return 1.0


def out_of_range(prompt, reference, answer):
    return 1.5 if answer == "big" else 0.0


TEAM = "trainers.scorers.team:score"  # the reference a scorer's failures are named by


def test_a_team_scorer_scores_each_example():
    assert metrics.scored_by(TEAM, contains, _examples(("ab", "xaby"), ("cd", "c"))) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("scorer", "words"),
    [
        (raises, f"eval.scorer {TEAM}: raised on example 2: KeyError"),
        (out_of_range, f"eval.scorer {TEAM}: returned 1.5 on example 2"),
        (lambda prompt, reference, answer: "1", f"eval.scorer {TEAM}: returned '1' on example 0"),
    ],
)
def test_a_scorer_that_fails_is_named_with_the_example(scorer, words):
    examples = _examples(("a", "a"), ("b", "b"), ("c", "boom" if scorer is raises else "big"))
    with pytest.raises(ScorerError, match=re.escape(words)):
        metrics.scored_by(TEAM, scorer, examples)


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        ("trainers.scorers.prefix:__doc__", "is not a function"),
        ("trainers.scorers.prefix:missing", "cannot be imported"),
        ("trainers.scorers.no_such_team:score", "no module trainers.scorers.no_such_team in the trainer image"),
        ("trainers.scorers.prefix.deeper:score", "no module trainers.scorers.prefix.deeper"),
        # importable here (this test's own module), and still no scorer: not a module of trainers.scorers
        (f"{__name__}:contains", "not trainers.scorers.MODULE:FUNCTION"),
        ("numpy:save", "not trainers.scorers.MODULE:FUNCTION"),
    ],
)
def test_a_scorer_is_a_function_of_the_trainers_own_scorers_package(ref, words):
    with pytest.raises(ScorerError, match=re.escape(f"eval.scorer {ref}: ") + ".*" + re.escape(words)):
        metrics.load_scorer(ref)


def test_a_module_found_outside_the_scorers_directory_is_refused(tmp_path, monkeypatch):
    """A directory added to the package's search path (as a ``.pth`` file or ``pkgutil.extend_path`` would) makes a
    module of another directory importable as ``trainers.scorers.<name>``: found there, it is no file of the trainer's
    own code and is refused before it is imported."""
    import trainers.scorers

    (tmp_path / "elsewhere.py").write_text(
        "import sys\nsys.IMPORTED_ELSEWHERE = True\ndef score(p, r, a):\n    return 1.0\n"
    )
    monkeypatch.setattr(trainers.scorers, "__path__", [*trainers.scorers.__path__, str(tmp_path)])
    with pytest.raises(ScorerError, match=r"trainers\.scorers\.elsewhere is .*elsewhere\.py, not a Python file of "):
        metrics.load_scorer("trainers.scorers.elsewhere:score")
    assert not hasattr(sys, "IMPORTED_ELSEWHERE") and "trainers.scorers.elsewhere" not in sys.modules


HELPER = "def first(text):\n    return text[:1]\n"
TEAM_SCORER = """from trainers.scorers.team_helpers import first
from numpy import isclose


def starts_alike(prompt, reference, answer):
    return float(first(answer) == first(reference))
"""
PROBE = """
import json, sys
from components.workload import resolve
from trainers import generation, metrics

ref = sys.argv[1]
try:
    function = metrics.load_scorer(ref)
except metrics.ScorerError as exc:
    print(json.dumps({"error": str(exc)}))
else:
    spec = resolve("local-fsdp", "eval.scorer=" + ref)
    print(json.dumps({
        "scores": metrics.scored_by(ref, function, [metrics.Example("p", "Lima", a) for a in ("Lome", "Oslo")]),
        "resolved": metrics.resolve_scorer(ref).__dict__,
        "key": generation.generation_key("sha256:eval", spec),
    }))
"""


def _probe(tree, ref: str) -> dict:
    from tests.helpers import REPO

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tree}:{REPO}", "HOME": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, ref], capture_output=True, text=True, env=env, cwd=tree, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_team_adds_its_scorer_to_the_package_and_its_whole_package_keys_the_answers(tmp_path):
    """A team's module under trainers/scorers/ (here a tree of this checkout's trainers with two modules added, first
    on the import path of another process: tests.helpers.scorers_tree) scores; the function must be defined in the
    package (a name its module imported from numpy is not a scorer); the answers' generation key holds the digest of
    every Python file of the scorer's package, so editing the helper it imports changes the key, and a cache file
    does not."""
    from tests.helpers import scorers_tree

    tree = scorers_tree(tmp_path, {"team_helpers": HELPER, "team": TEAM_SCORER})
    found = _probe(tree, "trainers.scorers.team:starts_alike")
    assert found["scores"] == [1.0, 0.0]
    resolved = found["resolved"]
    assert (resolved["module"], resolved["file"]) == ("trainers.scorers.team", "trainers/scorers/team.py")
    assert resolved["digest"] == metrics.package_digest(tree / "trainers" / "scorers")
    refused = _probe(tree, "trainers.scorers.team:isclose")["error"]
    assert refused == "eval.scorer trainers.scorers.team:isclose: is numpy's, not a function of trainers.scorers"
    (tree / "trainers" / "scorers" / "__pycache__").mkdir(exist_ok=True)
    (tree / "trainers" / "scorers" / "__pycache__" / "stale.py").write_text("# a cache, no code of the package\n")
    (tree / "trainers" / "scorers" / "notes.txt").write_text("not Python\n")
    assert _probe(tree, "trainers.scorers.team:starts_alike")["key"] == found["key"]
    (tree / "trainers" / "scorers" / "team_helpers.py").write_text(HELPER.replace("[:1]", "[:2]"))
    again = _probe(tree, "trainers.scorers.team:starts_alike")
    assert again["scores"] == [0.0, 0.0] and again["key"] != found["key"]
    assert again["resolved"]["digest"] != resolved["digest"]


def test_the_shipped_prefix_scorer_gives_the_characters_right_from_the_start():
    """trainers.scorers.prefix:prefix_credit, the scorer the local gate's e2e runs name: loaded by its reference as the
    trainer loads a team's, each score the shared prefix over the longer of answer and reference."""
    examples = _examples(
        ("Havana", "Havana"), ("Havana", " Hava "), ("Lima", "Limaxx"), ("Oslo", "Paris"), ("Rome", ""), ("", "")
    )
    found = metrics.scores(["exact_match", "scorer"], examples, "trainers.scorers.prefix:prefix_credit")
    assert found["scorer"] == pytest.approx([1.0, 4 / 6, 4 / 6, 0.0, 0.0, 0.0])
    assert found["exact_match"] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
