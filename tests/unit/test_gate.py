"""The gate in front of a registered model's champion (components.stages.gate) and the stages around it, without a Ray
cluster: the spec's gate fields and train.init_from; the decision; the provenance every version records; then the
register and promote stages, train.init_from's resolution and the champion the evaluation measures, each called as
the pipeline calls them, on a real local registry, with the train, build and evaluate results a run records; and the
summary that says what the gate did."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from components.platforms import RunContext
from components.platforms.store import LocalStore, read_json
from components.registry import PROVENANCE_FIELDS, check_provenance, digest, open_registry
from components.spec import InfraError, SpecError
from components.spec.images import pinned_image
from components.stages import gate, jobs, ray_stages, registration, report, runner
from components.workload import resolve

# ---------------------------------------------------------------- the spec


def test_the_registered_model_is_named_after_the_preset_unless_gate_model_says():
    assert resolve("local-fsdp").model_name == "local-fsdp"
    assert resolve("gemma4-e2b-v6e-16").model_name == "gemma4-e2b-v6e-16"
    assert resolve("local-fsdp", "gate.model=gemma-ft").model_name == "gemma-ft"
    spec = resolve("local-fsdp")
    assert (spec.gate.register, spec.gate.min_improvement, spec.train.init_from) == (True, 0.0, "")


def test_init_from_names_a_model_and_a_version_or_alias():
    assert resolve("local-fsdp").init_from_ref is None
    assert resolve("local-fsdp", "train.init_from=champion").init_from_ref == ("local-fsdp", "champion")
    assert resolve("local-fsdp", "gate.model=g init_from=champion").init_from_ref == ("g", "champion")
    assert resolve("local-fsdp", "init_from=gemma-ft@3").init_from_ref == ("gemma-ft", "3")
    assert resolve("local-fsdp", "init_from=gemma-ft@champion").init_from_ref == ("gemma-ft", "champion")


def test_a_learning_rate_of_zero_is_a_run_that_trains_nothing():
    assert resolve("local-fsdp", "train.learning_rate=0").train.learning_rate == 0.0


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ("gate.model=Gemma", "gate.model", "'Gemma' is not a model name"),
        ("gate.model=9lives", "gate.model", "is not a model name"),
        ("gate.min_improvement=-0.1", "gate.min_improvement", "from 0 (any) to below 1, got -0.1"),
        ("gate.min_improvement=1", "gate.min_improvement", "got 1.0"),
        ("gate.register=maybe", "gate.register", "expected bool"),
        ("train.init_from=gemma-ft", "train.init_from", "'gemma-ft' names no registered version"),
        ("train.init_from=Gemma@3", "train.init_from", "names no registered version"),
        ("train.init_from=gemma-ft@", "train.init_from", "names no registered version"),
        ("train.init_from=gemma-ft@v/1", "train.init_from", "names no registered version"),
        ("train.learning_rate=-1e-4", "train.learning_rate", "must be 0 or more"),
    ],
)
def test_bad_gate_and_init_from_fields_are_named(overrides, field, message):
    with pytest.raises(SpecError) as info:
        resolve("local-fsdp", overrides)
    assert info.value.field == field and message in str(info.value)


def test_maxtext_does_not_start_from_a_registered_version():
    with pytest.raises(SpecError) as info:
        resolve("local-maxtext", "train.init_from=champion")
    assert info.value.field == "train.init_from" and "only the fsdp workload" in str(info.value)


def test_the_eval_job_gets_the_starting_checkpoint_and_the_champion_on_its_command_line():
    from components.workload.derive import job_command

    spec = resolve("local-fsdp")
    plain = job_command(spec, "eval", "/out", "r", "/ck")
    assert "--init-from" not in plain and "--champion" not in plain
    both = job_command(spec, "eval", "/out", "r", "/ck", init_from="/start", champion="/champ")
    assert both.endswith("--checkpoint /ck --init-from /start --champion /champ")
    train = job_command(spec, "train", "/out", "r", init_from="/start", champion="/champ")
    assert train.endswith("--init-from /start") and "--champion" not in train


def test_the_gke_dry_run_lists_the_registry_calls_of_the_stages_that_make_them(tmp_path):
    from components.platforms.gke import GkePlatform

    def walk(overrides: str) -> list[str]:
        spec = resolve("gemma4-e2b-v6e-16", "gke.project=my-project " + overrides)
        ctx = RunContext(spec=spec, run_id="r", store=LocalStore(tmp_path), platform="gke")
        return GkePlatform().dry_run(ctx, lambda mode: mode)

    lines = walk("train.init_from=champion gate.model=gemma-ft gke.zone=europe-west4-a")
    model = "projects/my-project/locations/europe-west4/models/gemma-ft"
    train, evaluate, register, promote = (lines.index(stage) for stage in ("train", "evaluate", "register", "promote"))
    # each stage's calls in order (train's first copies the hub dataset's snapshot where the jobs read it)
    assert f"  read          aiplatform.models.get {model}@champion (train.init_from)" in lines[train + 1 : evaluate]
    assert lines[evaluate + 1] == (
        f"  read          aiplatform.models.get {model}@champion (measured beside the new model)"
    )
    assert lines[register + 1].startswith("  copy          storage.objects.rewrite gs://my-project-tpupipe/runs/r/")
    assert lines[register + 2].startswith(f"  upload        aiplatform.models.upload {model} ")
    assert lines[promote + 1].startswith(f"  alias         aiplatform.models.mergeVersionAliases {model}@")
    off = walk("gate.register=false")
    assert "register" not in off and "promote" not in off and "aiplatform" not in "\n".join(off)


# ---------------------------------------------------------------- the decision


def test_the_first_version_is_promoted():
    d = gate.decide(1.25, None, 0.0, "m@1")
    assert d.decision == gate.PROMOTE and d.improvement is None
    assert d.reason == "promoted m@1 to champion: there was no champion yet (held-out 1.2500)"


def test_a_champion_at_zero_is_kept_with_no_infinite_improvement_to_record():
    """A held-out loss of 0 (no token measured) cannot be bettered; the decision is recorded as JSON, which has no
    infinity (protobuf's json_format refuses it), so the improvement is None, not -inf."""
    import json

    d = gate.decide(0.0, 0.0, 0.0, "m@2", "m@1")
    assert d.decision == gate.KEEP and d.improvement is None and "no loss is below 0" in d.reason
    json.dumps({"improvement": d.improvement}, allow_nan=False)


@pytest.mark.parametrize(
    ("new", "champion", "minimum", "decision", "reason"),
    [
        (
            1.5,
            2.0,
            0.0,
            "promote",
            "promoted m@2 to champion: held-out 1.5000 vs champion m@1 2.0000, 25.00% better "
            "(gate.min_improvement 0.00%)",
        ),
        (1.5, 2.0, 0.25, "promote", "25.00% better (gate.min_improvement 25.00%)"),  # exactly the threshold
        (
            1.5,
            2.0,
            0.5,
            "keep",
            "kept champion m@1: m@2 held-out 1.5000 vs champion m@1 2.0000, 25.00% better, short of "
            "gate.min_improvement 50.00%",
        ),
        (2.5, 2.0, 0.0, "keep", "kept champion m@1: m@2 held-out 2.5000 vs champion m@1 2.0000, 25.00% worse"),
        (2.0, 2.0, 0.0, "keep", "kept champion m@1: m@2 held-out 2.0000 vs champion m@1 2.0000, not better"),
    ],
)
def test_the_gate_promotes_only_a_large_enough_improvement(new, champion, minimum, decision, reason):
    d = gate.decide(new, champion, minimum, "m@2", "m@1")
    assert d.decision == decision and reason in d.reason
    assert d.improvement == pytest.approx((champion - new) / champion)


def test_a_loss_that_is_not_a_number_keeps_the_champion():
    d = gate.decide(math.nan, 2.0, 0.0, "m@2", "m@1")
    assert d.decision == gate.KEEP and "m@2's held-out loss is nan" in d.reason


# ---------------------------------------------------------------- provenance

LOCAL_BUILD = {"image": "local/torch@0123456789ab", "digest": "0123456789ab", "reused": True}
GKE_BUILD = {"image": "us-east5-docker.pkg.dev/p/tpupipe/torch:run-1", "built": True, "digest": "sha256:" + "ab" * 32}


@pytest.mark.parametrize(
    ("build", "pinned"),
    [
        (LOCAL_BUILD, "local/torch@sha256:0123456789ab"),  # a local environment's content hash
        (GKE_BUILD, "us-east5-docker.pkg.dev/p/tpupipe/torch:run-1@sha256:" + "ab" * 32),
        ({"image": "r/torch@sha256:" + "cd" * 32, "built": False}, "r/torch@sha256:" + "cd" * 32),
        ({"image": "r/torch:latest", "built": False}, None),  # gke.image by tag: a tag can move
        ({}, None),
    ],
)
def test_the_trainer_image_is_recorded_with_its_digest_or_not_at_all(build, pinned):
    assert pinned_image(build) == pinned


def _records(**train) -> dict:
    return {
        "build_image": LOCAL_BUILD,
        "train": {
            "checkpoint": "/runs/r/train/ck",
            "restarts": 1,
            "data_snapshot": "sha256:" + "d4" * 32,
            "history": [
                {"epoch": 1, "loss": 2.0, "tokens_seen": 16384},
                {"epoch": 2, "loss": 1.5, "tokens_seen": 32768},
            ],
            **train,
        },
        "evaluate": {
            "eval_loss_before": 4.6,
            "eval_loss_after": 1.4,
            "eval_split": "heldout",
            "champion": {"ref": "local-fsdp@1", "version": "1"},
            "champion_loss": 1.6,
        },
    }


def test_provenance_has_every_field_from_the_runs_records():
    spec = resolve("local-fsdp", "epochs=2")
    found = gate.provenance(spec, "run-7", _records(), "3f2a9c1e", "tpupipe-20261130", hosts_lost=0)
    check_provenance(found)  # the registry's own rules: every field, whole counts, a pinned image, JSON
    assert {k: found[k] for k in PROVENANCE_FIELDS} == {
        "preset": "local-fsdp",
        "spec_hash": digest(spec.to_dict()),
        "base_model": "scratch:gemma4-tiny",
        "data_snapshot": "sha256:" + "d4" * 32,
        "trainer_image": "local/torch@sha256:0123456789ab",
        "git_sha": "3f2a9c1e",
        "accelerator": "cpu",
        "topology": None,
        "slices": 1,
        "tokens_seen": 32768,
        "restarts": 1,
        "preemptions": 0,
        "eval_loss_before": 4.6,
        "eval_loss_after": 1.4,
        "pipeline_job": "tpupipe-20261130",
        "run_id": "run-7",
    }
    assert (found["model_id"], found["champion_measured"], found["champion_loss"]) == (
        "scratch:gemma4-tiny",
        "local-fsdp@1",
        1.6,
    )


def test_provenance_records_the_lineages_key_file_and_its_digest():
    """What the next run under train.data_since=champion checks the champion's key file against: the registry's record,
    not the manifest beside the file."""
    spec = resolve("local-fsdp", "epochs=2")
    keys = {"uri": "gs://b/state/run-7/data/keys.bin", "digest": "sha256:" + "0a" * 32, "count": 3}
    records = _records()
    records["snapshot_data"] = {**(records.get("snapshot_data") or {}), "keys": keys}
    found = gate.provenance(spec, "run-7", records, "3f2a9c1e", "tpupipe-20261130", hosts_lost=0)
    check_provenance(found)
    assert (found["data_keys"], found["data_keys_digest"]) == (keys["uri"], keys["digest"])
    assert gate.provenance(spec, "run-7", _records(), "", "", hosts_lost=0)["data_keys_digest"] is None


def test_provenance_names_the_registered_version_training_started_from_and_changes_with_the_spec():
    spec = resolve("local-fsdp", "init_from=champion")
    started = gate.provenance(spec, "r", _records(init_from={"ref": "local-fsdp@1", "path": "/x"}))
    assert started["base_model"] == "local-fsdp@1"
    assert started["git_sha"] is None and started["pipeline_job"] is None and started["preemptions"] is None
    assert started["spec_hash"] != gate.provenance(resolve("local-fsdp"), "r", _records())["spec_hash"]


def test_maxtext_tokens_seen_are_steps_times_the_global_batch():
    spec = resolve("local-maxtext")  # 2 hosts x 2 CPU devices, 2 sequences of 128 tokens each
    assert gate.tokens_seen(spec, [{"step": 0, "loss": 9.0}, {"step": 39, "loss": 3.0}]) == 40 * 2 * 4 * 128
    assert gate.tokens_seen(spec, []) is None


def test_maxtext_tokens_seen_follow_an_elastic_shrink_step_by_step():
    spec = resolve("local-maxtext")
    full, half = 2 * 4 * 128, 2 * 2 * 128  # the global batch of 4 devices, then of the 2 a shrunk group has
    history = [{"step": s, "loss": 3.0, "tokens": full if s < 20 else half} for s in range(40)]
    assert gate.tokens_seen(spec, history) == 20 * full + 20 * half


# ---------------------------------------------------------------- the stages, on a local registry


def _context(root, run_id: str, overrides: str = "") -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(root / run_id), platform="local"
    )


def _trained(ctx: RunContext, root) -> str:
    """A run that trained: its checkpoint directory, and the train and build_image records the run keeps."""
    checkpoint = root / ctx.run_id / "train" / "checkpoint_000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    records = _records(checkpoint=str(checkpoint), checkpoint_uri=str(checkpoint))
    for stage in ("build_image", "train"):
        runner.record(ctx.store, stage, status="succeeded", result=records[stage])
    return str(checkpoint)


def _registered(ctx: RunContext, eval_loss: float, champion: dict | None = None, champion_loss: float | None = None):
    ev = {"eval_loss_before": 4.6, "eval_loss_after": eval_loss, "eval_split": "heldout"}
    ev[ray_stages.MEASURED] = ray_stages.pin_checkpoint(ctx, read_json(ctx.store, "stages/train.json")["result"])
    if champion:
        ev.update(champion=champion, champion_loss=champion_loss)
    result = registration.register(ctx, json.dumps(ev), pipeline_job="tpupipe-job", source_version="3f2a9c1e")
    runner.record(ctx.store, "register", status="succeeded", result=result)
    return result


def test_first_run_promoted_a_worse_one_registered_but_kept_out_a_better_one_promoted(tmp_path):
    registry = open_registry(tmp_path)
    first = _context(tmp_path, "run-1")
    _trained(first, tmp_path)
    assert gate.champion_to_measure(first) is None  # no model yet: nothing to measure against
    result = _registered(first, 1.5)
    assert (result["ref"], result["decision"]) == ("local-fsdp@1", "promote")
    assert registry.champion("local-fsdp") is None  # registering moves no alias
    moved = registration.promote(first, "promote")
    assert moved["promoted"] and registry.champion("local-fsdp").version == "1"

    second = _context(tmp_path, "run-2", "train.learning_rate=0")
    checkpoint = _trained(second, tmp_path)
    measured = gate.champion_to_measure(second)
    assert measured == {"ref": "local-fsdp@1", "version": "1", "path": _kept(tmp_path, "run-1")}
    result = _registered(second, 4.6, {"ref": "local-fsdp@1", "version": "1"}, 1.5)
    assert (result["ref"], result["decision"]) == ("local-fsdp@2", "keep")
    assert result["reason"] == (
        "kept champion local-fsdp@1: local-fsdp@2 held-out 4.6000 vs champion local-fsdp@1 1.5000, 206.67% worse"
    )
    version = registry.get("local-fsdp", "2")
    assert version.artifact_uri == _kept(tmp_path, "run-2") and version.aliases == ()
    assert sorted(p.name for p in Path(_kept(tmp_path, "run-2")).iterdir()) == sorted(
        p.name for p in Path(checkpoint).iterdir()
    )
    assert version.provenance["eval_loss_after"] == 4.6 and version.provenance["champion_loss"] == 1.5
    assert version.provenance["git_sha"] == "3f2a9c1e" and version.provenance["pipeline_job"] == "tpupipe-job"
    with pytest.raises(jobs.JobFailed, match="the gate decided 'keep'"):
        registration.promote(second, "keep")
    assert registry.champion("local-fsdp").version == "1"

    third = _context(tmp_path, "run-3")
    _trained(third, tmp_path)
    result = _registered(third, 1.2, {"ref": "local-fsdp@1", "version": "1"}, 1.5)
    assert result["decision"] == "promote" and "held-out 1.2000 vs champion local-fsdp@1 1.5000" in result["reason"]
    assert registration.promote(third, "promote")["promoted"]
    assert registry.champion("local-fsdp").version == "3" and registry.history("local-fsdp") == ["1", "3"]
    assert registry.rollback("local-fsdp").version == "1"


def test_a_retried_register_task_does_not_register_the_runs_model_twice(tmp_path):
    ctx = _context(tmp_path, "run-1")
    _trained(ctx, tmp_path)
    first, again = _registered(ctx, 1.5), _registered(ctx, 1.5)
    assert first["ref"] == again["ref"] == "local-fsdp@1"
    assert [v.version for v in open_registry(tmp_path).versions("local-fsdp")] == ["1"]


def test_only_the_bytes_the_evaluate_stage_measured_are_registered(tmp_path):
    """Register copies the checkpoint's files the evaluate stage pinned (``ray_stages.pin_checkpoint``: their sha256
    on this machine) and hashes what it copied: a file rewritten since, or an evaluation that pinned nothing, fails
    the registration naming why, with nothing registered; a file added since is not copied."""
    ctx = _context(tmp_path, "run-1")
    checkpoint = Path(_trained(ctx, tmp_path))
    ev = {"eval_loss_before": 4.6, "eval_loss_after": 1.5, "eval_split": "heldout"}
    with pytest.raises(jobs.JobFailed, match="the evaluate stage recorded no version of the files of checkpoint"):
        registration.register(ctx, json.dumps(ev))
    ev[ray_stages.MEASURED] = ray_stages.pin_checkpoint(ctx, read_json(ctx.store, "stages/train.json")["result"])
    (checkpoint / "model.safetensors").write_bytes(b"unevaluated")
    with pytest.raises(InfraError, match=r"changed after the evaluate stage measured it \(model.safetensors: rewr"):
        registration.register(ctx, json.dumps(ev))
    assert open_registry(tmp_path).models() == []
    (checkpoint / "model.safetensors").write_bytes(b"weights")  # the evaluated bytes again
    (checkpoint / "planted.py").write_bytes(b"import os")
    kept = Path(registration.register(ctx, json.dumps(ev))["artifact_uri"])
    assert sorted(p.name for p in kept.iterdir()) == ["model.safetensors"]


def test_a_champion_that_moved_since_the_evaluation_is_not_replaced(tmp_path):
    registry = open_registry(tmp_path)
    for run in ("run-1", "run-2"):
        ctx = _context(tmp_path, run)
        _trained(ctx, tmp_path)
        _registered(ctx, 1.5)  # both measured with no champion: both say promote
    registry.promote("local-fsdp", "1")  # run-1 got there first
    result = registration.promote(ctx, "promote")
    assert result["promoted"] is False
    assert result["reason"] == (
        "not promoted: local-fsdp@2 was measured against no champion, and the champion is "
        "local-fsdp@1 now; the next run measures against it"
    )
    assert registry.champion("local-fsdp").version == "1"


def test_the_gate_off_registers_nothing_and_measures_no_champion(tmp_path):
    ctx = _context(tmp_path, "run-1", "gate.register=false")
    _trained(ctx, tmp_path)
    assert registration.register(ctx, json.dumps({"eval_loss_after": 1.0}))["decision"] == gate.OFF
    assert open_registry(tmp_path).models() == []
    assert gate.champion_to_measure(ctx) is None


def test_init_from_champion_resolves_to_the_champions_checkpoint_at_train_time(tmp_path):
    ctx = _context(tmp_path, "run-2", "init_from=champion")
    # No model yet, then a model with no champion: a schedule's first run, whose settings are its every run's, starts
    # from the preset's base.
    assert gate.starting_point(ctx) is None
    assert gate.bootstrap(ctx.spec).startswith("local-fsdp has no champion yet (its first run): training from")
    first = _context(tmp_path, "run-1")
    _trained(first, tmp_path)
    _registered(first, 1.5)
    checkpoint = _kept(tmp_path, "run-1")
    assert gate.starting_point(ctx) is None
    other = _context(tmp_path, "run-5", "init_from=other-model@champion")  # another model's champion is no start
    with pytest.raises(SpecError, match="train.init_from: other-model@champion: name: no model 'other-model'"):
        gate.starting_point(other)
    open_registry(tmp_path).promote("local-fsdp", "1")
    assert gate.starting_point(ctx) == {
        "ref": "local-fsdp@1",
        "artifact_uri": checkpoint,
        "path": checkpoint,
        "eval_loss": 1.5,
    }
    pinned = _context(tmp_path, "run-3", "init_from=local-fsdp@1")
    assert gate.starting_point(pinned)["ref"] == "local-fsdp@1"
    with pytest.raises(SpecError, match="train.init_from: local-fsdp@7: version: model 'local-fsdp' has no version"):
        gate.starting_point(_context(tmp_path, "run-4", "init_from=local-fsdp@7"))


def test_init_from_refuses_weights_of_another_architecture_and_a_checkpoint_that_is_gone(tmp_path):
    import shutil

    first = _context(tmp_path, "run-1")
    _trained(first, tmp_path)
    _registered(first, 1.5)
    checkpoint = _kept(tmp_path, "run-1")
    open_registry(tmp_path).promote("local-fsdp", "1")
    other = _context(tmp_path, "run-2", "init_from=champion model_id=google/gemma-4-E2B-it")
    with pytest.raises(SpecError, match="trained over train.model_id=scratch:gemma4-tiny; this run's"):
        gate.starting_point(other)
    shutil.rmtree(checkpoint)
    with pytest.raises(SpecError, match=f"checkpoint {checkpoint} of the registered version is gone"):
        gate.starting_point(_context(tmp_path, "run-3", "init_from=champion"))


def _kept(tmp_path, run_id: str) -> str:
    """Where registration keeps the checkpoint run ``run_id`` registered: out of every run's directory."""
    return str(tmp_path / "_models" / "local-fsdp" / run_id)


def _champion_over_scratch(tmp_path) -> None:
    """A first run over the preset's scratch model, registered and promoted: the champion of local-fsdp."""
    first = _context(tmp_path, "run-1")
    _trained(first, tmp_path)
    _registered(first, 1.5)
    open_registry(tmp_path).promote("local-fsdp", "1")


def test_a_run_over_another_base_is_refused_before_anything_starts_naming_gate_model(tmp_path):
    _champion_over_scratch(tmp_path)
    gate.check_lineage(_context(tmp_path, "run-2"))  # the same base: measured against its champion
    other = _context(tmp_path, "run-2", "model_id=/ckpt/gemma4-tiny-composite")
    with pytest.raises(SpecError) as info:
        gate.check_lineage(other)
    assert info.value.field == "gate.model"
    assert str(info.value) == (
        "gate.model: local-fsdp: champion local-fsdp@1 was trained over scratch:gemma4-tiny, this run over "
        "/ckpt/gemma4-tiny-composite; their held-out losses do not compare, so the gate could not decide: register "
        "this base as a model of its own (gate.model=local-fsdp-gemma4-tiny-composite), or train over "
        "scratch:gemma4-tiny"
    )
    # The suggested new lineage has no champion yet, the gate off registers nothing: neither is refused.
    gate.check_lineage(_context(tmp_path, "run-2", "model_id=/ckpt/x gate.model=local-fsdp-gemma4-tiny-composite"))
    gate.check_lineage(_context(tmp_path, "run-2", "model_id=/ckpt/x gate.register=false"))
    gate.check_lineage(_context(tmp_path, "run-2", "model_id=/ckpt/x gate.model=never-registered"))


def test_tpupipe_run_over_another_base_exits_2_before_provisioning(tmp_path, capsys):
    from pipelines.cli.main import main

    _champion_over_scratch(tmp_path)
    base = tmp_path / "gemma4-tiny-composite"
    base.mkdir()  # the local platform checks that a model directory exists, and nothing reads it before the refusal
    code = main(["run", "--output-root", str(tmp_path), "--run-id", "second", "--set", f"model_id={base}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "gate.model: local-fsdp: champion local-fsdp@1 was trained over scratch:gemma4-tiny" in err
    assert "gate.model=local-fsdp-gemma4-tiny-composite" in err
    assert not (tmp_path / "second").exists()  # nothing started: no run directory, no ledger, no cluster


def test_the_pipelines_first_task_refuses_another_base_too(tmp_path):
    _champion_over_scratch(tmp_path)
    with pytest.raises(SpecError, match="^gate.model: local-fsdp: champion local-fsdp@1 was trained over"):
        runner.run_stage("snapshot_data", "local-fsdp", "local", "model_id=/ckpt/b", "late", "", str(tmp_path))
    record = runner.read_json(LocalStore(tmp_path / "late"), "stages/snapshot_data.json")
    assert record["status"] == "failed" and "ledger.json" not in {p.name for p in (tmp_path / "late").iterdir()}


def test_a_champion_over_another_base_promoted_after_the_check_is_not_measured_and_is_kept(tmp_path):
    _champion_over_scratch(tmp_path)
    ctx = _context(tmp_path, "run-2", "model_id=/ckpt/b")
    assert gate.champion_to_measure(ctx) == {
        "ref": "local-fsdp@1",
        "version": "1",
        "path": "",
        "not_compared": "champion local-fsdp@1 was trained over scratch:gemma4-tiny, this run over /ckpt/b",
    }
    _trained(ctx, tmp_path)
    champion = {k: v for k, v in gate.champion_to_measure(ctx).items() if k != "path"}
    result = _registered(ctx, 0.1, champion)
    assert result["decision"] == "keep"
    assert result["reason"] == (
        "kept champion local-fsdp@1: local-fsdp@2 not compared: champion local-fsdp@1 was trained over "
        "scratch:gemma4-tiny, this run over /ckpt/b"
    )
    assert open_registry(tmp_path).get("local-fsdp", "2").provenance["model_id"] == "/ckpt/b"


def test_an_evaluation_that_is_not_held_out_is_never_promoted_on_and_the_summary_says_why(tmp_path):
    assert gate.not_held_out(resolve("local-fsdp")) is None
    assert gate.not_held_out(resolve("local-maxtext")) is None  # hf: the generated dataset's held-out split
    synthetic = resolve("local-maxtext", "maxtext.dataset_type=synthetic eval.generate_examples=0")
    assert gate.not_held_out(synthetic) == (
        "maxtext.dataset_type=synthetic: MaxText evaluates on the same fixed batch it trains on"
    )
    assert "reads the training examples" in gate.not_held_out(resolve("local-fsdp", "train.eval_split=train"))
    ctx = RunContext(spec=synthetic, run_id="mx-1", store=LocalStore(tmp_path / "mx-1"), platform="local")
    _trained(ctx, tmp_path)
    result = _registered(ctx, 1.0)  # no champion yet: a held-out figure would promote
    assert (result["ref"], result["decision"], result["held_out"]) == ("local-maxtext@1", "keep", False)
    assert result["reason"] == (
        "not promoted: local-maxtext@1's evaluation is not held out (maxtext.dataset_type=synthetic: MaxText "
        "evaluates on the same fixed batch it trains on); no champion set"
    )
    assert open_registry(tmp_path).champion("local-maxtext") is None
    figures = {"eval_loss_before": 6.0, "eval_loss_after": 1.0, "perplexity_before": 403.4, "perplexity_after": 2.7}
    runner.record(ctx.store, "evaluate", status="succeeded", seconds=1.0, result=figures)
    summary = report.summarize(ctx)
    assert summary["eval_not_held_out"].startswith("maxtext.dataset_type=synthetic")
    text = report.format_table(summary)
    assert "not held out: maxtext.dataset_type=synthetic" in text and "held-out loss" not in text
    assert "  eval loss            untrained 6.0000   trained 1.0000" in text
    assert "gate: not promoted: local-maxtext@1's evaluation is not held out" in text


# ---------------------------------------------------------------- what the run says


def _summary(ctx: RunContext, promote_ran: bool) -> dict:
    stages = ("snapshot_data", "provision", "build_image", "deploy_raycluster", "check_slice", "train", "evaluate")
    for stage in (*stages, "teardown"):
        rec = runner.read_json(ctx.store, f"stages/{stage}.json") or {}
        runner.record(ctx.store, stage, status="succeeded", seconds=1.0, result=rec.get("result") or {})
    runner.record(
        ctx.store,
        "evaluate",
        result={"eval_loss_before": 4.6, "eval_loss_after": 4.6, "perplexity_before": 99.5, "perplexity_after": 99.5},
    )
    if promote_ran:
        runner.record(ctx.store, "promote", status="succeeded", seconds=1.0, result={"promoted": True})
    return report.summarize(ctx)


def test_the_summary_says_what_the_gate_did_with_both_figures(tmp_path):
    first = _context(tmp_path, "run-1")
    _trained(first, tmp_path)
    _registered(first, 1.5)
    registration.promote(first, "promote")
    summary = _summary(first, promote_ran=True)
    assert summary["status"] == "succeeded" and summary["gate"]["promoted"] is True
    assert "  gate: promoted local-fsdp@1 to champion" in report.format_table(summary)

    second = _context(tmp_path, "run-2", "train.learning_rate=0")
    _trained(second, tmp_path)
    _registered(second, 4.6, {"ref": "local-fsdp@1", "version": "1"}, 1.5)
    summary = _summary(second, promote_ran=False)
    promote = next(s for s in summary["stages"] if s["name"] == "promote")
    assert promote["status"] == "skipped" and promote["reason"].startswith("kept champion local-fsdp@1")
    assert summary["status"] == "succeeded"  # the gate keeping the champion is the run working
    assert summary["gate"]["decision"] == "keep" and summary["gate"]["champion_loss"] == 1.5
    table = report.format_table(summary)
    assert f"  registered           local-fsdp@2 in {tmp_path / 'registry'}" in table
    assert (
        "  gate: kept champion local-fsdp@1: local-fsdp@2 held-out 4.6000 vs champion local-fsdp@1 1.5000, "
        "206.67% worse"
    ) in table
    assert "champion 1.5000" in table


def test_a_promotion_the_gate_decided_but_that_never_ran_fails_the_run(tmp_path):
    ctx = _context(tmp_path, "run-1")
    _trained(ctx, tmp_path)
    _registered(ctx, 1.5)
    summary = _summary(ctx, promote_ran=False)
    assert summary["status"] == "failed"
    assert next(s for s in summary["stages"] if s["name"] == "promote")["status"] == "skipped"


def test_the_evaluation_and_gate_artifacts_show_the_champion_and_the_decision(tmp_path):
    from kfp import dsl

    from components.stages import artifacts

    first = _context(tmp_path, "run-1")
    _trained(first, tmp_path)
    _registered(first, 1.5)
    ctx = _context(tmp_path, "run-2", "init_from=champion")
    _trained(ctx, tmp_path)
    ev = {
        "eval_loss_before": 1.5,
        "eval_loss_after": 1.25,
        "perplexity_before": 4.48,
        "perplexity_after": 3.49,
        "champion": {"ref": "local-fsdp@1", "version": "1"},
        "champion_loss": 1.5,
        "perplexity_champion": 4.48,
        "init_from": "local-fsdp@1",
    }
    runner.record(ctx.store, "evaluate", status="succeeded", result=ev)
    metrics, summary, model = (
        dsl.Metrics(name="m", uri=str(tmp_path / "m")),
        dsl.Markdown(name="s", uri=str(tmp_path / "s.md")),
        dsl.Model(name="model", uri=""),
    )
    artifacts.evaluate(ctx.store, ctx.spec.to_dict(), metrics, summary, model, "3f2a9c1e")
    assert metrics.metadata["champion_loss"] == 1.5 and metrics.metadata["eval_loss_after"] == 1.25
    assert "Champion `local-fsdp@1`, measured in the same job: held-out loss 1.5000" in open(summary.path).read()
    assert model.metadata["base_model"] == "local-fsdp@1"

    _registered(ctx, 1.25, ev["champion"], 1.5)
    metrics, table = dsl.Metrics(name="m", uri=str(tmp_path / "m2")), dsl.Markdown(name="g", uri=str(tmp_path / "g"))
    artifacts.register(ctx.store, metrics, table)
    assert metrics.metadata == {
        "eval_loss": 1.25,
        "champion_loss": 1.5,
        "improvement": pytest.approx(1 / 6),
        "min_improvement": 0.0,
        "promote": 1.0,
        "version": 2.0,
    }
    text = open(table.path).read()
    assert text.startswith(
        "**Gate: promote** — promoted local-fsdp@2 to champion: held-out 1.2500 vs champion "
        "local-fsdp@1 1.5000, 16.67% better"
    )
    assert "| new: `local-fsdp@2` | 1.2500 |\n| champion: `local-fsdp@1` | 1.5000 |" in text
    assert "| base_model | `scratch:gemma4-tiny` |" in text  # the train record of this test names no init_from

    off = _context(tmp_path, "run-3", "gate.register=false")
    runner.record(off.store, "register", status="succeeded", result=registration.register(off, "{}"))
    metrics, table = dsl.Metrics(name="m", uri=str(tmp_path / "m3")), dsl.Markdown(name="g", uri=str(tmp_path / "g3"))
    artifacts.register(off.store, metrics, table)
    assert metrics.metadata == {} and open(table.path).read() == "Gate off: gate.register=false: nothing registered.\n"


def test_tpupipe_run_from_a_champion_that_does_not_exist_exits_2_before_anything_starts(tmp_path, capsys):
    from pipelines.cli.main import main

    root = tmp_path / "runs"
    # A pipeline file that is not there: were the check ever gone, the run would still start nothing.
    argv = [
        "run",
        "--run-id",
        "from-nothing",
        "--output-root",
        str(root),
        "--set",
        "train.init_from=other-model@champion",
        "--pipeline-file",
        str(tmp_path / "absent.yaml"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tpupipe: error: train.init_from: other-model@champion: name: no model 'other-model'"), err
    assert not (root / "from-nothing").exists()
