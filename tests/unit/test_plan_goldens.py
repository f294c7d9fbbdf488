"""The committed plans of the tutorial presets (tests/goldens/<preset>/: plan.json, manifests/*.yaml, and dry-run.txt,
the transcript of `tpupipe run --platform gke --dry-run`) are what tpupipe gives today, and those of a preset with
settings (the Makefile's GOLDEN_VARIANTS: tests/goldens/<preset>+<variant>/, its plan made with the same settings). A
change to a plan is made on purpose: `make goldens`, then review the diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.platforms.gke.plan import document as plan
from components.spec import presets
from components.workload import resolve

GOLDENS = Path(__file__).resolve().parents[1] / "goldens"
TPU_PRESETS = sorted(n for n, p in presets.PRESETS.items() if p.get("cluster", {}).get("accelerator", "cpu") != "cpu")
HINT = "the plan changed: run `make goldens` and review the diff of tests/goldens/"


def _makefile_value(name: str) -> str:
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    return next(line for line in makefile.splitlines() if line.startswith(f"{name} :=")).split(":=", 1)[1].strip()


def _variants() -> dict[str, tuple[str, str]]:
    """tests/goldens/ directory -> (preset, the settings of its plan and dry run)."""
    out = {preset: (preset, "") for preset in TPU_PRESETS}
    for variant in _makefile_value("GOLDEN_VARIANTS").split():
        preset, *settings = _makefile_value(f"GOLDEN_VARIANT_{variant}").split()
        out[f"{preset}+{variant}"] = (preset, " ".join(settings))
    return out


GOLDEN_DIRS = sorted(_variants())


def _document(directory: str):
    preset, settings = _variants()[directory]
    return plan.build(resolve(preset, settings), preset)


def test_every_tpu_preset_has_goldens_and_no_other():
    assert sorted(p.name for p in GOLDENS.iterdir() if p.is_dir()) == GOLDEN_DIRS, HINT
    assert sorted(_makefile_value("GOLDEN_PRESETS").split()) == TPU_PRESETS, "GOLDEN_PRESETS in the Makefile"


@pytest.mark.parametrize("directory", GOLDEN_DIRS)
def test_plan_json_matches_the_golden(directory):
    assert plan.to_json(_document(directory)) == (GOLDENS / directory / "plan.json").read_text(), HINT


@pytest.mark.parametrize("directory", GOLDEN_DIRS)
def test_manifests_match_the_goldens(directory):
    on_disk = {p.name: p.read_text() for p in sorted((GOLDENS / directory / "manifests").glob("*.yaml"))}
    assert on_disk == plan.manifest_files(_document(directory)), HINT


@pytest.mark.parametrize("directory", GOLDEN_DIRS)
def test_dry_run_matches_the_golden(directory, capsys):
    from pipelines.cli import main

    preset, settings = _variants()[directory]
    assert (
        main(
            [
                "run",
                preset,
                "--platform",
                "gke",
                "--dry-run",
                "--run-id",
                preset,
                "--set",
                settings or _makefile_value("GOLDEN_DRY_RUN_SET"),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == (GOLDENS / directory / "dry-run.txt").read_text(), HINT


@pytest.mark.parametrize("directory", GOLDEN_DIRS)
def test_the_dry_run_lists_exactly_the_planned_resources(directory):
    """Nothing is listed that is not created: every resource of the plan is walked by its stage in the dry run, and
    the dry run walks nothing else."""
    document = _document(directory)
    walked = [
        line.split()[-1]
        for line in (GOLDENS / directory / "dry-run.txt").read_text().splitlines()
        if line.startswith(("  create", "  get-or-create", "  use"))
    ]
    listed = [res["path"] or res["name"] for res in document["resources"]]
    assert walked == [p.replace("PROJECT_ID", "my-project") for p in listed]
