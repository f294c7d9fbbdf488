"""The evaluate stage measures each figure once per model and evaluation key (components.stages.ray_stages.evaluate,
gate.known_figure, trainers.heldout.eval_key), without a Ray cluster: the train job's own figures and a registered
version's recorded figure with the same key are used as they are and no evaluation job starts; a figure of another
key, or none, is what an evaluation job would measure; an evaluation the gate cannot use starts nothing. A stage that
did try a job here would fail: the run has no cluster."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest

from components.platforms import RunContext
from components.platforms.store import LocalStore
from components.spec import InfraError
from components.stages import gate, ray_stages, registration, runner
from components.workload import resolve
from tests.unit.test_gate import _records
from trainers import evaluate, heldout

KEY = "sha256:" + "e1" * 32
NO_CLUSTER = "no cluster recorded for run {}: provision did not run"  # the local platform's, for a job it cannot start
OTHER_KEY = "sha256:" + "e2" * 32


def _run(root, run_id: str, overrides: str = "", build: dict | None = None) -> RunContext:
    """A run of local-fsdp whose build_image stage recorded ``build`` (the trainer image), as evaluate finds it."""
    ctx = RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(root / run_id), platform="local"
    )
    runner.record(ctx.store, "build_image", status="succeeded", result=build or _records()["build_image"])
    return ctx


def _train_result(root, run_id: str, **heldout_figures) -> dict:
    """A train stage's result as the run records it, its checkpoint on disk, with the train job's own figures."""
    checkpoint = root / run_id / "train" / "checkpoint_000003"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    return {
        **_records()["train"],
        "checkpoint": str(checkpoint),
        "checkpoint_uri": str(checkpoint),
        "device": "cpu",
        "num_workers": 2,
        "heldout": heldout_figures,
    }


def _registered(ctx: RunContext, train: dict, evaluation: dict) -> dict:
    """The run registered (and promoted when the gate says so), as the pipeline does after evaluate."""
    runner.record(ctx.store, "build_image", status="succeeded", result=_records()["build_image"])
    runner.record(ctx.store, "train", status="succeeded", result=train)
    result = registration.register(ctx, json.dumps(evaluation))
    runner.record(ctx.store, "register", status="succeeded", result=result)
    if result["decision"] == gate.PROMOTE:
        registration.promote(ctx, gate.PROMOTE)
    return result


def test_a_recurring_run_reuses_the_champions_recorded_figure_and_starts_no_evaluation_job(tmp_path):
    first = _run(tmp_path, "run-1")
    train = _train_result(
        tmp_path, "run-1", eval_loss_before=4.6, eval_loss_after=1.5, eval_key=KEY, num_eval_examples=128, seconds=0.4
    )
    evaluation = ray_stages.evaluate(first, json.dumps(train))  # no champion: before and after from the train job
    assert "job" not in evaluation
    assert (evaluation["eval_loss_before"], evaluation["eval_loss_after"], evaluation["eval_key"]) == (4.6, 1.5, KEY)
    assert evaluation["measured_by"] == {"before": "the train job", "after": "the train job"}
    assert evaluation["perplexity_after"] == pytest.approx(math.exp(1.5))
    assert _registered(first, train, evaluation)["decision"] == gate.PROMOTE
    assert gate.registry(first).get("local-fsdp", "1").provenance["eval_key"] == KEY

    # From the champion, on the same held-out examples: "before" and the champion are local-fsdp@1, whose own
    # record has its figure with this key; "after" is the train job's.
    second = _run(tmp_path, "run-2", "train.init_from=champion")
    start = gate.starting_point(second)
    train = _train_result(tmp_path, "run-2", eval_loss_after=1.2, eval_key=KEY, num_eval_examples=128)
    evaluation = ray_stages.evaluate(second, json.dumps({**train, "init_from": start}))
    assert "job" not in evaluation
    assert (evaluation["eval_loss_before"], evaluation["eval_loss_after"], evaluation["champion_loss"]) == (
        1.5,
        1.2,
        1.5,
    )
    assert evaluation["measured_by"] == {
        "after": "the train job",
        "before": "local-fsdp@1's record",
        "champion": "local-fsdp@1's record",
    }
    result = _registered(second, {**train, "init_from": start}, evaluation)
    assert result["decision"] == gate.PROMOTE and result["champion_loss"] == 1.5
    version = gate.registry(second).get("local-fsdp", "2")
    assert (version.provenance["champion_measured"], version.provenance["eval_key"]) == ("local-fsdp@1", KEY)

    # A champion a later version recorded as measured beside it is found in that version's record, not only in its
    # own: local-fsdp@1's figure as local-fsdp@2 records it; the model started from as the version that started.
    like = ray_stages.figure_key(second, KEY)
    assert gate.known_figure(second, "local-fsdp@2", like) == (1.2, "local-fsdp@2")
    assert gate.known_figure(second, "local-fsdp@1", like) == (1.5, "local-fsdp@1")


def test_a_figure_of_another_key_or_none_is_measured_by_an_evaluation_job(tmp_path):
    first = _run(tmp_path, "run-1")
    train = _train_result(
        tmp_path, "run-1", eval_loss_before=4.6, eval_loss_after=1.5, eval_key=KEY, num_eval_examples=128
    )
    _registered(first, train, ray_stages.evaluate(first, json.dumps(train)))
    second = _run(tmp_path, "run-2", "train.init_from=champion")
    start = gate.starting_point(second)
    champion = gate.champion_to_measure(second)
    # Other held-out examples (or another tokenizer, length, dtype or device: another key): nothing recorded stands.
    other = _train_result(tmp_path, "run-2", eval_loss_after=1.2, eval_key=OTHER_KEY)
    known = ray_stages.known_figures(second, other, start, champion)
    assert known == {"after": (1.2, "the train job")}
    assert gate.known_figure(second, "local-fsdp@1", ray_stages.figure_key(second, OTHER_KEY)) is None
    # A train job that measured nothing in itself (testing.fail_eval, or an earlier epoch's checkpoint returned, or
    # MaxText): no key, so every figure is the evaluation job's, as before.
    assert ray_stages.known_figures(second, {**other, "heldout": {}}, start, champion) == {}
    assert gate.known_figure(second, "local-fsdp@1", None) is None
    with pytest.raises(InfraError, match=NO_CLUSTER.format("run-2")):  # the job it would start has no cluster here
        ray_stages.evaluate(second, json.dumps({**other, "init_from": start}))


def test_a_champion_figure_of_another_image_or_accelerator_is_measured_again_not_reused(tmp_path):
    """The same held-out examples the same way (one evaluation key) measured under another trainer image digest (a
    local environment's content hash here) or on another accelerator is not a like run's figure: the champion's
    recorded figure is not reused, and its evaluation is measured again."""
    first = _run(tmp_path, "run-1")
    train = _train_result(
        tmp_path, "run-1", eval_loss_before=4.6, eval_loss_after=1.5, eval_key=KEY, num_eval_examples=128
    )
    evaluation = ray_stages.evaluate(first, json.dumps(train))
    _registered(first, train, evaluation)
    recorded = gate.registry(first).get("local-fsdp", "1").provenance["figure_key"]
    assert recorded == evaluation["figure_key"] == ray_stages.figure_key(first, KEY)

    def champion_known(ctx: RunContext) -> bool:
        start, champion = gate.starting_point(ctx), gate.champion_to_measure(ctx)
        later = _train_result(tmp_path, ctx.run_id, eval_loss_after=1.2, eval_key=KEY)
        known = ray_stages.known_figures(ctx, later, start, champion)
        return "champion" in known and "before" in known

    assert champion_known(_run(tmp_path, "like", "train.init_from=champion"))  # a like run reuses it
    other_image = {**_records()["build_image"], "digest": "sha256:" + "ab" * 32}
    by_image = _run(tmp_path, "image", "train.init_from=champion", build=other_image)
    assert ray_stages.figure_key(by_image, KEY) != recorded and not champion_known(by_image)
    with pytest.raises(InfraError, match=NO_CLUSTER.format("image")):  # it measures the champion again: a job
        ray_stages.evaluate(by_image, json.dumps({**train, "init_from": gate.starting_point(by_image)}))
    for accelerator in ("v6e", "tpu7x", "v5e"):
        on_chip = _run(tmp_path, f"on-{accelerator}", "train.init_from=champion")
        cluster = dataclasses.replace(on_chip.spec.cluster, accelerator=accelerator)
        on_chip = dataclasses.replace(on_chip, spec=dataclasses.replace(on_chip.spec, cluster=cluster))
        assert ray_stages.figure_key(on_chip, KEY) != recorded and not champion_known(on_chip), accelerator
    assert len({ray_stages.figure_key(_run(tmp_path, f"v-{a}"), KEY) for a in "ab"}) == 1  # one key, like runs
    unpinned = _run(tmp_path, "tag", "train.init_from=champion", build={"image": "local/torch:latest"})
    assert ray_stages.figure_key(unpinned, KEY) is None and not champion_known(unpinned)  # a tag pins nothing


def test_an_evaluation_the_gate_cannot_use_starts_no_job(tmp_path):
    """A synthetic MaxText evaluation reads the training batch (gate.not_held_out), and register never promotes on it
    (registration.register's not_held_out branch): its three MaxText start-ups are skipped."""
    ctx = RunContext(
        spec=resolve("local-maxtext", "maxtext.dataset_type=synthetic eval.generate_examples=0"),
        run_id="mx-1",
        store=LocalStore(tmp_path / "mx-1"),
        platform="local",
    )
    train = _train_result(tmp_path, "mx-1")
    evaluation = ray_stages.evaluate(ctx, json.dumps(train))
    assert "job" not in evaluation and "eval_loss_after" not in evaluation and evaluation["measured_by"] == {}
    result = _registered(ctx, train, evaluation)
    assert (result["decision"], result["held_out"], result["eval_loss"]) == (gate.KEEP, False, None)


def test_the_evaluation_key_changes_with_what_a_held_out_figure_depends_on():
    spec = resolve("local-fsdp")
    base = heldout.eval_key(spec, "sha256:aa", "cpu", 2)
    assert base == heldout.eval_key(resolve("local-fsdp", "epochs=1 train.learning_rate=0"), "sha256:aa", "cpu", 2)
    assert base != heldout.eval_key(spec, "sha256:ab", "cpu", 2)  # other examples
    assert base != heldout.eval_key(resolve("local-fsdp", "max_length=32"), "sha256:aa", "cpu", 2)
    assert base != heldout.eval_key(spec, "sha256:aa", "tpu", 2)  # bf16 compute on TPU
    assert base != heldout.eval_key(spec, "sha256:aa", "cpu", 4)  # other batches, summed in another order
    tpu = heldout.eval_key(spec, "sha256:aa", "tpu", 2)
    assert tpu != heldout.eval_key(resolve("local-fsdp", "train.precision=bf16"), "sha256:aa", "tpu", 2)


def test_the_evaluation_job_measures_only_what_it_is_asked():
    config = {"checkpoint": "/ck", "init_from": "/start", "champion": "/start"}
    assert evaluate.models_to_measure(config) == [("before", "/start"), ("after", "/ck"), ("champion", "/start")]
    assert evaluate.models_to_measure({**config, "measure": ["champion"]}) == [("champion", "/start")]
    assert evaluate.measure_list("before,champion") == ("before", "champion")
    with pytest.raises(argparse.ArgumentTypeError, match="a comma-separated list of before, after, champion"):
        evaluate.measure_list("after,tomorrow")
    found = evaluate.measured({"eval_loss_champion": 1.5, "eval_key": KEY, "device": "cpu"}, "heldout")
    assert found == {"champion_loss": 1.5, "eval_key": KEY, "device": "cpu", "eval_split": "heldout"}


def test_the_train_jobs_own_evaluation_is_evaluation_in_the_goodput_ledger():
    """The model as built measured before the first step, the trained one after the last (``eval`` events with their
    seconds): evaluation, not trainer start; the train stage's figures carry both and their seconds."""
    from components.stages import goodput

    def event(**p):
        return ("event", p)

    records = [
        event(event="worker_group_started", time=100.0),
        event(
            event="eval", which="before", eval_loss=4.6, eval_key=KEY, num_eval_examples=128, seconds=3.0, time=110.0
        ),
        event(event="step", step=1, time=112.0),
        event(event="step", step=2, time=113.0),
        event(event="eval", which="after", eval_loss=1.5, eval_key=KEY, num_eval_examples=128, seconds=2.0, time=116.0),
        event(event="checkpoint", step=2, seconds=1.0, time=117.0),
    ]
    timeline = goodput.timeline(records + records[1:2])  # a line Ray forwarded twice counts once
    assert timeline["evaluations"] == [{"time": 110.0, "seconds": 3.0}, {"time": 116.0, "seconds": 2.0}]
    intervals = goodput.train_intervals((100.0, 120.0), timeline)
    evaluation = sorted((a, b) for a, b, category in intervals if category == "evaluation")
    assert evaluation == [(107.0, 110.0), (114.0, 116.0)]
    seconds = {}
    for a, b, category in intervals:
        seconds[category] = seconds.get(category, 0.0) + b - a
    assert seconds == {"trainer start": 13.0, "productive steps": 1.0, "evaluation": 5.0, "checkpoint saves": 1.0}
    figures = ray_stages.in_job_figures(
        {"heldout": {"eval_loss_after": 1.5, "eval_key": KEY, "num_eval_examples": 128}}, records
    )
    assert figures == {
        "eval_loss_after": 1.5,
        "eval_loss_before": 4.6,
        "eval_key": KEY,
        "num_eval_examples": 128,
        "seconds": 5.0,
    }


def test_the_evaluation_jobs_command_names_what_it_measures_for_both_workloads():
    import shlex

    from components.workload.derive import job_command
    from trainers import maxtext_train

    fsdp = shlex.split(
        job_command(resolve("local-fsdp"), "eval", "/out", "r", "/ck", champion="/c", measure=("champion",))
    )
    assert fsdp[fsdp.index("--measure") + 1] == "champion"
    assert evaluate.parse_args(fsdp[3:]).measure == ("champion",)
    assert "--measure" not in job_command(resolve("local-fsdp"), "eval", "/out", "r", "/ck")  # all, as before
    assert "--measure" not in job_command(resolve("local-fsdp"), "train", "/out", "r", measure=("after",))
    maxtext = shlex.split(
        job_command(resolve("local-maxtext"), "eval", "/out", "r", "/ck", measure=("before", "after"))
    )
    assert maxtext.index("--measure") < maxtext.index("--")
    args, _ = maxtext_train.parse_args(maxtext[3:])
    assert (args.mode, args.measure, args.generate) == ("eval", ("before", "after"), ())
    answering = shlex.split(
        job_command(resolve("local-maxtext"), "eval", "/out", "r", "/ck", champion="/c", generate=("champion",))
    )
    args, _ = maxtext_train.parse_args(answering[3:])  # MaxText's evaluation job answers with its champion too
    assert (args.champion, args.generate) == ("/c", ("champion",))


def _maxtext_run(root, run_id: str, overrides: str = "", build: dict | None = None) -> RunContext:
    ctx = RunContext(
        spec=resolve("local-maxtext", overrides), run_id=run_id, store=LocalStore(root / run_id), platform="local"
    )
    runner.record(ctx.store, "build_image", status="succeeded", result=build or _records()["build_image"])
    return ctx


def test_maxtexts_model_as_initialised_is_measured_once_per_key_and_reused_by_a_recurring_run(tmp_path):
    """MaxText's train job measures only the model it trained; the model as initialised is the evaluation job's. Its
    figure, recorded with its key (``initial_key``) when the first run registers, is the recurring run's "before":
    no evaluation job, and the same numbers for the gate."""
    first = _maxtext_run(tmp_path, "mx-1")
    train = _train_result(tmp_path, "mx-1", eval_loss_after=7.25, eval_key=KEY, num_eval_examples=128)
    with pytest.raises(InfraError, match=NO_CLUSTER.format("mx-1")):  # nothing recorded yet: it would start a job
        ray_stages.evaluate(first, json.dumps(train))
    initial = ray_stages.initial_model_key(first, KEY)
    assert initial and initial.startswith("sha256:")
    # What the first run's evaluate stage returns once its evaluation job measured "before" (ray_stages.evaluate).
    like = ray_stages.figure_key(first, KEY)
    measured = {"eval_loss_before": 10.375, "eval_loss_after": 7.25, "eval_key": KEY, "initial_key": initial}
    measured[ray_stages.MEASURED] = ray_stages.pin_checkpoint(first, train)
    measured["figure_key"] = like
    assert _registered(first, train, {**measured, "eval_split": "heldout"})["decision"] == gate.PROMOTE
    assert gate.registry(first).get("local-maxtext", "1").provenance["initial_key"] == initial

    second = _maxtext_run(tmp_path, "mx-2", "maxtext.steps=12 maxtext.learning_rate=0.002")  # same model as built
    train = _train_result(tmp_path, "mx-2", eval_loss_after=7.0, eval_key=KEY, num_eval_examples=128)
    evaluation = ray_stages.evaluate(second, json.dumps(train))
    assert "job" not in evaluation
    assert (evaluation["eval_loss_before"], evaluation["eval_loss_after"], evaluation["champion_loss"]) == (
        10.375,
        7.0,
        7.25,
    )
    assert evaluation["measured_by"] == {
        "after": "the train job",
        "before": "local-maxtext@1's record",
        "champion": "local-maxtext@1's record",
    }
    assert evaluation["initial_key"] == initial
    result = _registered(second, train, evaluation)
    assert result["decision"] == gate.PROMOTE and result["champion_loss"] == 7.25


def test_the_initial_models_key_changes_with_what_its_figure_depends_on(tmp_path):
    ctx = _maxtext_run(tmp_path, "mx-1")
    base = ray_stages.initial_model_key(ctx, KEY)
    same = ("maxtext.steps=3", "maxtext.learning_rate=0.5", "maxtext.checkpoint_period=2")
    for overrides in same:
        assert ray_stages.initial_model_key(_maxtext_run(tmp_path, f"s-{len(overrides)}", overrides), KEY) == base
    assert ray_stages.initial_model_key(ctx, OTHER_KEY) != base  # other examples, tokenizer, batch, dtypes, device
    other = ("maxtext.max_target_length=64", "maxtext.per_device_batch_size=3", "maxtext.model_name=llama3-8b")
    for index, overrides in enumerate(other):
        assert ray_stages.initial_model_key(_maxtext_run(tmp_path, f"o-{index}", overrides), KEY) != base, overrides
    image = {**_records()["build_image"], "digest": "sha256:" + "ab" * 32}
    assert ray_stages.initial_model_key(_maxtext_run(tmp_path, "img", build=image), KEY) != base  # MaxText's code
    unpinned = {"image": "local/maxtext:latest"}  # a tag alone pins nothing: measured every time
    assert ray_stages.initial_model_key(_maxtext_run(tmp_path, "tag", build=unpinned), KEY) is None
    assert ray_stages.initial_model_key(_run(tmp_path, "fsdp"), KEY) is None  # its train job measures it itself
    assert ray_stages.initial_model_key(ctx, None) is None
