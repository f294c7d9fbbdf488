"""The gemma4 presets survive a lost host: Ray Train may restart their worker group, and their resume points hold the
optimizer state; the plan says what that costs in the run's storage (``components.workload.fsdp_plan``)."""

from __future__ import annotations

import pytest

from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import text
from components.spec import presets
from components.workload import fsdp_plan, resolve

GEMMA4 = [name for name in presets.PRESETS if name.startswith("gemma4-")]


@pytest.mark.parametrize("name", GEMMA4)
def test_the_gemma4_presets_allow_failures_and_checkpoint_the_optimizer(name):
    spec = resolve(name)
    assert spec.train.max_failures > 0 and spec.train.checkpoint_optimizer


@pytest.mark.parametrize("name", GEMMA4)
def test_the_plan_says_what_the_optimizer_state_costs_in_each_checkpoint(name):
    entry = plan.build(resolve(name), "r")["training"]["fsdp_checkpoints"]
    trained = fsdp_plan.TRAINED_PARAMETERS["google/gemma-4-E2B-it"]
    assert entry["trained_parameters_at_most"] == trained
    assert entry["final_bytes"] == trained * 4  # float32 weights (precision "mixed")
    assert entry["bytes_each"] == 3 * entry["final_bytes"]  # the weights and AdamW's two moments
    assert entry["bytes_kept"] == entry["bytes_each"] * resolve(name).train.num_to_keep
    without = plan.build(resolve(name, "train.checkpoint_optimizer=false"), "r")["training"]["fsdp_checkpoints"]
    assert without["bytes_each"] == entry["final_bytes"] and not without["optimizer"]
    bf16 = plan.build(resolve(name, "train.precision=bf16"), "r")["training"]["fsdp_checkpoints"]
    assert bf16["bytes_each"] == entry["bytes_each"] // 2
    lines = text.render_text(plan.build(resolve(name), "r"))
    assert f"{entry['bytes_each'] / 1e9:,.1f} GB each at most (weights and AdamW's two moments)" in lines, lines


def test_a_model_of_unknown_size_is_planned_as_unknown_not_guessed():
    spec = resolve("gemma4-e2b-v6e-16", "train.model_id=someone/other-model")
    entry = fsdp_plan.plan_entry(spec)["fsdp_checkpoints"]
    assert entry["bytes_each"] is None and entry["final_bytes"] is None and entry["optimizer"]
    assert "unknown size each at most" in "\n".join(fsdp_plan.plan_lines(fsdp_plan.plan_entry(spec)))


@pytest.mark.parametrize("name", GEMMA4)
def test_what_has_not_run_on_a_tpu_is_off_and_the_plan_says_how_to_turn_it_on(name):
    training = plan.build(resolve(name), "r")["training"]
    assert training["torch_tpu_cache"]["enabled"] is False
    lines = text.render_text(plan.build(resolve(name), "r"))
    assert "--set train.torch_tpu_compile_cache=true" in lines
    assert "train.checkpoint_staging=async turns it on" in lines  # sync on the TPU unless asked
    on = plan.build(resolve(name, "train.torch_tpu_compile_cache=true train.checkpoint_staging=async"), "r")
    assert on["training"]["torch_tpu_cache"]["enabled"] is True
    assert on["training"]["fsdp_checkpoints"]["staging"].startswith("async")
