import collections
import json

import pytest

from components.spec import protocol
from trainers import data


def test_generated_dataset_is_deterministic():
    a, b = data.generate(200, 50, seed=1), data.generate(200, 50, seed=1)
    assert a == b
    assert len(a["train"]) == 200 and len(a["heldout"]) == 50
    assert data.generate(200, 50, seed=2) != a


# The facts, stated here apart from trainers.data's table.
CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Peru": "Lima",
    "Italy": "Rome",
    "Egypt": "Cairo",
    "Spain": "Madrid",
    "Cuba": "Havana",
    "Norway": "Oslo",
}


def _asked(instruction: str) -> tuple[str, str]:
    """(the country an instruction asks about, its phrasing): "Capital of Peru?" -> ("Peru", "Capital of {}?")."""
    (country,) = [c for c in CAPITALS if c in instruction]
    return country, instruction.replace(country, "{}")


def test_the_held_out_questions_are_known_facts_asked_in_phrasings_never_trained_for_that_country():
    """Each example asks a country's capital, its response that capital alone. No held-out question is a training
    question: each country is held out in one phrasing its training examples never use, and trained in the others;
    every phrasing is trained with other countries. So a held-out prompt asks a fact the model was taught, in a way
    it never saw for that country: answering it exactly needs more than recalling a trained string."""
    from components.workload import resolve

    t = resolve("local-fsdp").train
    splits = data.generate(t.num_train_examples, t.num_eval_examples, t.seed)
    asked = {split: [_asked(ex["instruction"]) for ex in splits[split]] for split in splits}
    for split, rows in splits.items():
        assert all(ex["response"] == CAPITALS[country] for ex, (country, _) in zip(rows, asked[split], strict=True))
    questions = {split: {ex["instruction"] for ex in rows} for split, rows in splits.items()}
    assert not questions["train"] & questions["heldout"]
    trained, held = collections.Counter(asked["train"]), set(asked["heldout"])
    phrasings = {p for _, p in trained}
    assert len(phrasings) >= 4 and len(trained) == len(CAPITALS) * (len(phrasings) - 1) and min(trained.values()) >= 5
    assert sorted(c for c, _ in held) == sorted(CAPITALS)  # every country held out, in one phrasing each
    assert all(any((c, p) in trained for c in CAPITALS) for _, p in held)  # its phrasing trained with others
    assert all(sum(country == c for c, _ in trained) == len(phrasings) - 1 for country in CAPITALS)


def test_every_generated_example_fits_the_max_length_of_each_preset_that_generates_data():
    """The prompt as the model is asked it (the beginning token, the prompt's characters), the response and the end
    token, within the length each preset that generates data trains on, with a few tokens to spare: with a scratch
    model's character tokenizer a token is a character (a hub tokenizer's tokens of ASCII text are no more than its
    characters), so no example loses its answer's end. The FSDP trainer's length is ``train.max_length``; MaxText's
    is ``maxtext.max_target_length`` (its rows are the whole text with a beginning and an end token:
    trainers/maxtext_data.py)."""
    from components.spec import presets
    from components.workload import resolve

    examples = [ex for split in data.generate(5000, 500, seed=0).values() for ex in split]
    longest = max(1 + len(data.format_example(ex)) + 1 for ex in examples)
    specs = {name: resolve(name) for name in presets.PRESETS}
    lengths = {
        name: s.maxtext.max_target_length if s.train.workload == "maxtext" else s.train.max_length
        for name, s in specs.items()
        if s.train.dataset == "generated"
    }
    assert {"local-fsdp", "local-maxtext"} <= set(lengths)
    assert all(length >= longest + 4 for length in lengths.values()), (longest, lengths)


def test_the_run_spec_bounds_the_generated_examples():
    from components.spec import SpecError
    from components.workload import resolve

    with pytest.raises(SpecError) as err:
        resolve("local-fsdp", "num_train_examples=19900 num_eval_examples=101")
    assert err.value.field == "train.num_train_examples"
    assert "num_train_examples=19900 + train.num_eval_examples=101 = 20001 > 20000" in str(err.value)
    assert resolve("local-fsdp", "num_train_examples=19900 num_eval_examples=100").train.num_train_examples == 19900


def test_prompt_format_is_the_seed_format():
    text = data.format_example({"instruction": "Capital of Peru?", "response": "Lima"})
    assert text == "Instruction: Capital of Peru?\nResponse: Lima"


def test_write_generated_writes_jsonl(tmp_path):
    files = data.write_generated(tmp_path, 10, 5)
    rows = [json.loads(line) for line in open(files["heldout"])]
    assert len(rows) == 5 and set(rows[0]) == {"instruction", "response"}


def test_protocol_round_trip_through_ray_log_prefixes():
    nonce = protocol.new_nonce()
    lines = [
        "(RayTrainWorker pid=123, ip=127.0.0.1) " + protocol.line("metric", {"epoch": 1, "loss": 2.5}, nonce),
        "\x1b[36m(RayTrainWorker pid=9)\x1b[0m " + protocol.line("event", {"event": "step"}, nonce),
        "unrelated output",
        f"TPUPIPE[{nonce}] metric {{not json",
        protocol.line("result", {"checkpoint": "/x"}, nonce),
    ]
    assert list(protocol.parse(lines, nonce)) == [
        ("metric", {"epoch": 1, "loss": 2.5}),
        ("event", {"event": "step"}),
        ("result", {"checkpoint": "/x"}),
    ]
    assert protocol.last_result(lines, nonce) == {"checkpoint": "/x"}


def test_printed_text_cannot_forge_a_record():
    """Only whole lines with the job's nonce are records: not one with another nonce or none (a record printed by
    something that does not know the job's nonce), not one inside other text (a data example, a model's output)."""
    nonce = protocol.new_nonce()
    forged = {"checkpoint": "/elsewhere", "eval_loss": 0.0}
    lines = [
        protocol.line("result", {"checkpoint": "/x"}, nonce),
        protocol.line("result", forged, protocol.new_nonce()),
        protocol.line("result", forged, ""),
        "TPUPIPE result " + json.dumps(forged),
        "example 12: " + protocol.line("result", forged, nonce),
        "(RayTrainWorker pid=1) response: " + protocol.line("result", forged, nonce),
    ]
    assert protocol.last_result(lines, nonce) == {"checkpoint": "/x"}
    assert protocol.last_result(lines[1:], nonce) is None


def test_a_record_takes_the_jobs_nonce_from_its_environment(monkeypatch):
    monkeypatch.setenv(protocol.NONCE_ENV, "0123abcd")
    assert protocol.line("result", {"a": 1}) == 'TPUPIPE[0123abcd] result {"a": 1}'
    assert list(protocol.parse([protocol.line("result", {"a": 1})], "0123abcd")) == [("result", {"a": 1})]


def test_the_data_snapshot_names_the_examples_wherever_they_come_from(tmp_path):
    rows = data.generate(20, 5, seed=0)["train"]
    files = data.write_generated(tmp_path, 20, 5, seed=0)
    from_file = [json.loads(line) for line in open(files["train"])]
    assert data.snapshot(rows) == data.snapshot(from_file) == data.snapshot(iter(rows))
    assert data.snapshot(rows).startswith("sha256:") and len(data.snapshot(rows)) == 7 + 64
    changed = [dict(rows[0], response=rows[0]["response"] + "!"), *rows[1:]]
    assert len({data.snapshot(rows), data.snapshot(changed), data.snapshot(rows[::-1]), data.snapshot(rows[1:])}) == 4
    assert data.snapshot(data.generate(20, 5, seed=1)["train"]) != data.snapshot(rows)


def test_the_evaluation_measures_the_start_the_result_and_the_champion():
    from trainers.evaluate import models_to_measure

    assert models_to_measure({"checkpoint": "/ck"}) == [("before", ""), ("after", "/ck")]
    assert models_to_measure({"checkpoint": "/ck", "init_from": "/start", "champion": "/champ"}) == [
        ("before", "/start"),
        ("after", "/ck"),
        ("champion", "/champ"),
    ]
