import json

from components.spec import protocol
from trainers import data


def test_generated_dataset_is_deterministic_and_heldout_is_disjoint():
    a, b = data.generate(200, 50, seed=1), data.generate(200, 50, seed=1)
    assert a == b
    assert len(a["train"]) == 200 and len(a["heldout"]) == 50
    train_prompts = {ex["instruction"] for ex in a["train"]}
    assert not train_prompts & {ex["instruction"] for ex in a["heldout"]}
    assert data.generate(200, 50, seed=2) != a


def test_generated_answers_are_correct():
    for ex in data.generate(300, 0)["train"]:
        words = ex["instruction"].rstrip(".").split()
        if ex["instruction"].startswith("Add"):
            assert int(ex["response"]) == int(words[1]) + int(words[3])
        elif ex["instruction"].startswith("Reverse"):
            assert ex["response"] == words[-1][::-1]


def test_prompt_format_is_the_seed_format():
    text = data.format_example({"instruction": "Add 1 and 2.", "response": "3"})
    assert text == "Instruction: Add 1 and 2.\nResponse: 3"


def test_write_generated_writes_jsonl(tmp_path):
    files = data.write_generated(tmp_path, 10, 5)
    rows = [json.loads(line) for line in open(files["heldout"])]
    assert len(rows) == 5 and set(rows[0]) == {"instruction", "response"}


def test_protocol_round_trip_through_ray_log_prefixes():
    lines = [
        "(RayTrainWorker pid=123, ip=127.0.0.1) " + protocol.line("metric", {"epoch": 1, "loss": 2.5}),
        "unrelated output",
        "TPUPIPE metric {not json",
        protocol.line("result", {"checkpoint": "/x"}),
    ]
    assert list(protocol.parse(lines)) == [("metric", {"epoch": 1, "loss": 2.5}), ("result", {"checkpoint": "/x"})]
    assert protocol.last_result(lines) == {"checkpoint": "/x"}


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
