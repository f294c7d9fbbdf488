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


def _variant(text: str) -> tuple[str, tuple[str, str]]:
    """NAME=PRESET:SETTINGS (the Makefile's GOLDEN_VARIANTS, settings separated by commas) -> (NAME, (PRESET,
    SETTINGS))."""
    name, rest = text.split("=", 1)
    preset, settings = rest.split(":", 1)
    return name, (preset, settings.replace(",", " "))


# The goldens' directory (and run id) -> (preset, its --set): every TPU preset as it is, and the variants.
GOLDEN_RUNS = {p: (p, "") for p in TPU_PRESETS} | dict(map(_variant, _makefile_value("GOLDEN_VARIANTS").split()))


def _document(name: str) -> dict:
    preset, settings = GOLDEN_RUNS[name]
    return plan.build(resolve(preset, settings), name)


def test_every_tpu_preset_has_goldens_and_no_other():
    assert sorted(p.name for p in GOLDENS.iterdir() if p.is_dir()) == sorted(GOLDEN_RUNS), HINT
    assert sorted(_makefile_value("GOLDEN_PRESETS").split()) == TPU_PRESETS, "GOLDEN_PRESETS in the Makefile"


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
def test_plan_json_matches_the_golden(name):
    assert plan.to_json(_document(name)) == (GOLDENS / name / "plan.json").read_text(), HINT


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
def test_manifests_match_the_goldens(name):
    directory = GOLDENS / name / "manifests"
    on_disk = {p.name: p.read_text() for p in sorted(directory.glob("*.yaml"))}
    assert on_disk == plan.manifest_files(_document(name)), HINT


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
def test_dry_run_matches_the_golden(name, capsys):
    from pipelines.cli.main import main

    preset, settings = GOLDEN_RUNS[name]
    argv = ["run", preset, "--platform", "gke", "--dry-run", "--run-id", name]
    assert main([*argv, "--set", f"{_makefile_value('GOLDEN_DRY_RUN_SET')} {settings}".strip()]) == 0
    assert capsys.readouterr().out == (GOLDENS / name / "dry-run.txt").read_text(), HINT


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
def test_the_dry_run_lists_exactly_the_planned_resources(name):
    """Nothing is listed that is not created: every resource of the plan is walked by its stage in the dry run, and
    the dry run walks nothing else."""
    document = _document(name)
    walked = [
        line.split()[-1]
        for line in (GOLDENS / name / "dry-run.txt").read_text().splitlines()
        if line.startswith(("  create", "  get-or-create", "  use"))
    ]
    listed = [res["path"] or res["name"] for res in document["resources"]]
    assert walked == [p.replace("PROJECT_ID", "my-project") for p in listed]
