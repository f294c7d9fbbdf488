"""MaxText's eval loop inside the train job: the step it evaluates after, the evaluation key of its figure, and
rank 0's record of it (the ``eval`` event and the final report the evaluate stage reads)."""

import pytest

from components.spec import protocol
from components.stages.ray_stages import in_job_figures
from components.workload import maxtext as maxtext_args
from components.workload import resolve
from trainers import heldout, maxtext_eval, maxtext_log


def evaluated_after(argv: list[str], steps: int) -> list[int]:
    """The train steps MaxText evaluates after, by its own rule (maxtext/trainers/pre_train/train.py, ``ran_eval``)."""
    interval, start = int(maxtext_log.arg(argv, "eval_interval")), int(maxtext_log.arg(argv, "eval_start_step"))
    return [s for s in range(steps) if interval > 0 and s >= start and (s - start) % interval == 0]


@pytest.mark.parametrize("steps", [1, 5, 40])
def test_the_train_job_evaluates_the_trained_model_once_after_its_last_step(steps):
    spec = resolve("local-maxtext", f"maxtext.steps={steps}")
    train = maxtext_args.train_args(spec, "/o", "r")
    argv = [*train, *maxtext_eval.in_job_eval(spec, train)]
    assert {s: maxtext_log.eval_which(argv, s) for s in evaluated_after(argv, steps)} == {steps - 1: "after"}
    assert f"eval_steps={spec.maxtext.eval_steps}" in argv


def test_synthetic_data_is_not_evaluated_in_the_train_job():
    spec = resolve("local-maxtext", "maxtext.dataset_type=synthetic eval.generate_examples=0")
    assert maxtext_eval.in_job_eval(spec, maxtext_args.train_args(spec, "/o", "r")) == []


def _data(root, heldout="a\nb\n", vocab="abc"):
    (root / "tok").mkdir(exist_ok=True)
    (root / "tok" / "tokenizer.json").write_text(vocab)
    (root / "heldout.jsonl").write_text(heldout)
    return [
        "dataset_type=hf",
        f"hf_eval_files={root / 'heldout.jsonl'}",
        f"tokenizer_path={root / 'tok'}",
        "per_device_batch_size=2",
        "max_target_length=128",
        "eval_steps=4",
        "dtype=float32",
    ]


def test_the_evaluation_key_names_what_the_figure_was_measured_on(tmp_path):
    argv = _data(tmp_path)
    key, examples = maxtext_log.eval_key(argv, 4, "cpu")
    assert key.startswith("sha256:") and examples == 2
    assert maxtext_log.eval_key(list(argv), 4, "cpu") == (key, 2)  # the same examples the same way: one key
    others = {
        "another device count (eval batch)": maxtext_log.eval_key(argv, 2, "cpu"),
        "another platform": maxtext_log.eval_key(argv, 4, "tpu"),
        "more batches": maxtext_log.eval_key([*argv, "eval_steps=8"], 4, "cpu"),
        "longer sequences": maxtext_log.eval_key([*argv, "max_target_length=256"], 4, "cpu"),
        "another dtype": maxtext_log.eval_key([*argv, "dtype=bfloat16"], 4, "cpu"),
        "another eval batch": maxtext_log.eval_key([*argv, "eval_per_device_batch_size=1"], 4, "cpu"),
        # the libraries that computed it: another jax, libtpu or maxtext is another key
        **{
            f"another {name}": maxtext_log.eval_key(
                argv, 4, "cpu", {**maxtext_log.library_versions(), name: "0.0.0+other"}
            )
            for name in maxtext_log.FIGURE_LIBRARIES
        },
    }
    for what, other in others.items():
        assert other is not None and other[0] != key, what
    other_root = tmp_path / "other"
    other_root.mkdir()
    assert maxtext_log.eval_key(_data(other_root, heldout="a\nc\n"), 4, "cpu")[0] != key  # other examples
    assert maxtext_log.eval_key(_data(other_root, vocab="abd"), 4, "cpu")[0] != key  # another tokenizer
    assert maxtext_log.eval_key([*argv, "dataset_type=synthetic"], 4, "cpu") is None


def test_rank_zero_sends_the_trained_models_figure_at_full_precision_and_the_stage_reads_it(tmp_path, capsys):
    argv = [*_data(tmp_path), *maxtext_log.in_job_eval_args(30, 4), "steps=30"]
    key, examples = maxtext_log.eval_key(argv, 4, "cpu")
    record = maxtext_eval.InJobEval(argv, key, examples)
    record.started(3)
    record.finished(3, 5.5, precise=True)  # no eval MaxText runs in the train job: not a figure
    record.started(29)
    record.finished(29, 1.235, precise=False)  # the line's rounded figure: held until the metrics file has it
    assert "TPUPIPE" not in capsys.readouterr().out
    record.finished(29, 1.23456789, precise=True)
    record.finished(29, 1.23456789, precise=True)  # read again: sent once
    after = record.close()
    assert after == {"eval_loss": 1.23456789, "eval_key": key, "num_eval_examples": 2}
    records = list(protocol.parse(capsys.readouterr().out.splitlines()))
    events = [p for kind, p in records if kind == "event"]
    assert [(e["which"], e["eval_loss"], e["eval_key"]) for e in events] == [("after", 1.23456789, key)]
    assert events[0]["seconds"] >= 0
    unsent = maxtext_eval.InJobEval(argv, key, examples)
    unsent.finished(29, 1.235, precise=False)  # the run ends before the metrics file has it: the line's figure
    assert unsent.close()["eval_loss"] == 1.235
    capsys.readouterr()
    result = {"heldout": heldout.of_checkpoint(after)}  # the train job's result, from its final report
    found = in_job_figures(result, records)
    assert (found["eval_loss_after"], found["eval_key"]) == (1.23456789, key) and "eval_loss_before" not in found
    assert found["num_eval_examples"] == 2 and found["seconds"] >= 0
