"""The committed plans of the seed presets (tests/goldens/<preset>/: plan.json and manifests/*.yaml) are what
`tpupipe plan` gives today. A change to a plan is made on purpose: `make goldens`, then review the diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from components import plan, presets
from components.spec import resolve

GOLDENS = Path(__file__).resolve().parents[1] / "goldens"
TPU_PRESETS = sorted(n for n, p in presets.PRESETS.items() if p.get("cluster", {}).get("accelerator", "cpu") != "cpu")
HINT = "the plan changed: run `make goldens` and review the diff of tests/goldens/"


def test_every_tpu_preset_has_goldens_and_no_other():
    assert sorted(p.name for p in GOLDENS.iterdir() if p.is_dir()) == TPU_PRESETS, HINT
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    listed = next(line for line in makefile.splitlines() if line.startswith("GOLDEN_PRESETS :="))
    assert sorted(listed.split(":=", 1)[1].split()) == TPU_PRESETS, "GOLDEN_PRESETS in the Makefile"


@pytest.mark.parametrize("preset", TPU_PRESETS)
def test_plan_json_matches_the_golden(preset):
    document = plan.build(resolve(preset), preset)
    assert plan.to_json(document) == (GOLDENS / preset / "plan.json").read_text(), HINT


@pytest.mark.parametrize("preset", TPU_PRESETS)
def test_manifests_match_the_goldens(preset):
    document = plan.build(resolve(preset), preset)
    directory = GOLDENS / preset / "manifests"
    on_disk = {p.name: p.read_text() for p in sorted(directory.glob("*.yaml"))}
    assert on_disk == plan.manifest_files(document), HINT
