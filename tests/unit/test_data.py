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
