"""local-maxtext's data: MaxText trains on the generated dataset's train split and evaluates on its held-out split,
two files whose examples (ids and texts) do not meet, and its arguments point at exactly those files."""

import json

from components.workload import maxtext as maxtext_args
from components.workload import resolve
from trainers import maxtext_data, maxtext_eval, maxtext_log, maxtext_train


def _arg(argv, key):
    return next(a.split("=", 1)[1] for a in argv if a.startswith(f"{key}="))


def test_maxtext_reads_the_train_split_and_evaluates_on_the_disjoint_held_out_split(tmp_path):
    spec = resolve("local-maxtext")
    out = str(tmp_path / "train")
    train = maxtext_args.train_args(spec, out, "run")
    paths = maxtext_args.data_paths(out)
    assert _arg(train, "dataset_type") == "hf" and _arg(train, "hf_path") == "json"
    assert (_arg(train, "hf_train_files"), _arg(train, "hf_eval_files")) == (paths["train"], paths["eval"])
    assert _arg(train, "tokenizer_path") == paths["tokenizer"]
    evaluation = maxtext_log.eval_args(train, "run-eval-after", 4, "/ck/39/items")  # the eval job's arguments
    assert (_arg(evaluation, "hf_train_files"), _arg(evaluation, "hf_eval_files")) == (paths["train"], paths["eval"])

    t = spec.train
    counts = maxtext_data.write_dataset(paths["train"], paths["eval"], t.num_train_examples, t.num_eval_examples, 0)
    assert counts == {"train": t.num_train_examples, "heldout": t.num_eval_examples}
    train_ids, eval_ids = maxtext_data.read_ids(paths["train"]), maxtext_data.read_ids(paths["eval"])
    assert len(set(train_ids)) == len(train_ids) == t.num_train_examples
    assert len(set(eval_ids)) == len(eval_ids) == t.num_eval_examples
    assert not set(train_ids) & set(eval_ids)
    texts = {split: [json.loads(line)["text"] for line in open(paths[split])] for split in ("train", "eval")}
    assert not set(texts["train"]) & set(texts["eval"])
    assert texts["train"][0].startswith("Instruction: ") and "\nResponse: " in texts["train"][0]
    before = open(paths["train"]).read()  # the eval job writes the same bytes again
    maxtext_data.write_dataset(paths["train"], paths["eval"], t.num_train_examples, t.num_eval_examples, 0)
    assert open(paths["train"]).read() == before
    assert all(ord(c) < 128 for text in texts["train"] for c in text)  # the character tokenizer covers them


def test_the_eval_split_says_what_was_evaluated():
    spec = resolve("local-maxtext")
    held_out = maxtext_eval.eval_split(spec, maxtext_args.train_args(spec, "/o", "r"))
    assert held_out.startswith("the generated dataset's held-out split (128 examples, /o/maxtext-data/heldout.jsonl")
    synthetic = resolve("local-maxtext", "maxtext.dataset_type=synthetic eval.generate_examples=0")
    text = maxtext_eval.eval_split(synthetic, maxtext_args.train_args(synthetic, "/o", "r"))
    assert text == "synthetic (4 batches): the training batch, not held out"
    assert not any(a.startswith(("hf_", "tokenizer_")) for a in maxtext_args.train_args(synthetic, "/o", "r"))


def test_maxtext_reads_the_runs_data_snapshot_through_its_hugging_face_pipeline(tmp_path):
    """With a snapshotted train.dataset, the driver writes MaxText's rows from the snapshot's two files the train
    stage put under the jobs' directory, not the generated examples; synthetic data with a snapshot is refused."""
    import pytest

    from components.spec import SpecError

    drops = tmp_path / "sft"
    drops.mkdir()
    (drops / "a.jsonl").write_text(
        "".join(json.dumps({"instruction": f"Say {i}.", "response": str(i)}) + "\n" for i in range(5))
    )
    spec = resolve("local-maxtext", f"train.dataset={drops}/")
    out = tmp_path / "train"
    (out / "data").mkdir(parents=True)
    snapshot = {
        "train": [{"instruction": "Say 1.", "response": "1"}],
        "heldout": [{"instruction": "Say 2.", "response": "2"}],
    }
    for split, rows in snapshot.items():
        (out / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = maxtext_args.train_args(spec, str(out), "run")
    files = (_arg(args, "hf_train_files"), _arg(args, "hf_eval_files"))
    assert maxtext_data.write_splits(*files, maxtext_train.examples(spec, out)) == {"train": 1, "heldout": 1}
    rows = [json.loads(line) for line in open(_arg(args, "hf_train_files"))]
    first = maxtext_data.example_id(snapshot["train"][0], 0)
    assert rows == [{"id": first, "text": "Instruction: Say 1.\nResponse: 1"}]
    assert maxtext_eval.eval_split(spec, args).startswith("the run's data snapshot's held-out examples")
    with pytest.raises(SpecError, match="^maxtext.dataset_type: MaxText reads the run's data snapshot"):
        resolve("local-maxtext", f"train.dataset={drops}/ maxtext.dataset_type=synthetic")
