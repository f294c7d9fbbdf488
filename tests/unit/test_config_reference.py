"""One reference for every setting: every run spec key has a meaning where it is defined, docs/config.md is generated
from them and current, and ``tpupipe validate --explain KEY`` prints one key's entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from components.spec import SpecError, all_keys, reference

REPO = Path(__file__).resolve().parents[2]


def test_every_key_has_a_meaning_a_default_and_allowed_values():
    found = reference.settings()
    assert [s.key for s in found] == all_keys()
    assert [s.key for s in found if not (s.meaning and s.default and s.allowed)] == []


def test_docs_config_md_is_generated_from_the_spec_and_current():
    """Regenerate with `make config-docs` when this fails."""
    assert (REPO / "docs" / "config.md").read_text() == reference.markdown()


def test_a_choice_key_lists_its_choices_and_a_leaf_name_finds_its_key():
    text = reference.explain("precision")
    assert text.splitlines()[0] == "train.precision"
    assert "allowed: mixed, bf16" in text
    assert "default: mixed" in text


def test_an_unknown_key_is_refused_naming_the_flag():
    with pytest.raises(SpecError) as err:
        reference.explain("train.epoch")
    assert err.value.field == "--explain"


def test_validate_explain_prints_the_entry_and_the_presets_value():
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli.main", "validate", "local-maxtext", "--explain", "maxtext.steps"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    lines = out.splitlines()
    assert lines[0] == "maxtext.steps"
    assert lines[2] == "  default: 100"
    assert lines[-1].startswith("  local-maxtext: ") and lines[-1] != "  local-maxtext: 100"
