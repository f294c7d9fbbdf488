"""The gemma4 presets survive a lost host: Ray Train may restart their worker group, and their resume points hold the
optimizer state; the plan says what that costs in the run's storage (``components.workload.fsdp_checkpoints``)."""

from __future__ import annotations

import pytest

from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import text
from components.spec import presets
from components.workload import fsdp_checkpoints, resolve

GEMMA4 = [name for name in presets.PRESETS if name.startswith("gemma4-")]


@pytest.mark.parametrize("name", GEMMA4)
def test_the_gemma4_presets_allow_failures_and_checkpoint_the_optimizer(name):
    spec = resolve(name)
    assert spec.train.max_failures > 0 and spec.train.checkpoint_optimizer


@pytest.mark.parametrize("name", GEMMA4)
def test_the_plan_says_what_the_optimizer_state_costs_in_each_checkpoint(name):
    entry = plan.build(resolve(name), "r")["training"]["fsdp_checkpoints"]
    trained = fsdp_checkpoints.TRAINED_PARAMETERS["google/gemma-4-E2B-it"]
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
    entry = fsdp_checkpoints.plan_entry(spec)["fsdp_checkpoints"]
    assert entry["bytes_each"] is None and entry["final_bytes"] is None and entry["optimizer"]
    assert "unknown size each at most" in "\n".join(fsdp_checkpoints.plan_lines(entry))
