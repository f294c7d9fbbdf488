"""The run spec's test aids, its ``testing`` section: one check per key, whose error names ``testing.KEY`` (a bad
value of each: tests/unit/test_spec.py, test_bad_input_names_the_field); a key set by its name alone; a TPU slice
keeps the aids it took before the section and refuses the emulated hosts' ones; a former key refused in an override
naming its key now, and read in its place now from a spec recorded before."""

from __future__ import annotations

import dataclasses
import json

import pytest

from components.spec import SpecError, from_dict, parse_overrides, validate
from components.spec.checks import TESTING_CHECKS
from components.spec.parsing import MOVED
from components.spec.run_spec import TestingSpec
from components.workload import resolve

SET = {
    "slice_check_corrupt_rank": "1",
    "slice_check_slow_rank": "0",
    "host_start_delay_s": "5",
    "host_replace_delay_s": "5",
    "drain_host_at_step": "20",
    "fail_at_step": "10",
    "fail_eval": "true",
}


def test_each_test_aid_has_one_check_and_every_former_key_a_key_now():
    fields = [f.name for f in dataclasses.fields(TestingSpec)]
    assert list(TESTING_CHECKS) == fields == list(SET)
    assert sorted(MOVED.values()) == sorted(f"testing.{name}" for name in fields)


@pytest.mark.parametrize("name", list(SET))
def test_a_test_aid_is_set_by_its_key_or_by_its_name_alone(name):
    by_key = resolve("local-fsdp", f"testing.{name}={SET[name]}")
    assert by_key == resolve("local-fsdp", f"{name}={SET[name]}")
    assert getattr(by_key.testing, name) != getattr(TestingSpec(), name)


def test_each_check_holds_a_spec_built_in_code_too():
    spec = resolve("local-fsdp")
    for name, wrong in {"fail_eval": "yes", "fail_at_step": -3, "slice_check_slow_rank": 1.5}.items():
        with pytest.raises(SpecError) as err:
            validate(dataclasses.replace(spec, testing=dataclasses.replace(spec.testing, **{name: wrong})))
        assert err.value.field == f"testing.{name}"


def test_a_tpu_slice_takes_the_slice_checks_aids_and_the_trainers_faults_as_before():
    spec = resolve("smoke", "testing.slice_check_corrupt_rank=0 testing.fail_at_step=1 testing.fail_eval=true")
    assert (spec.testing.slice_check_corrupt_rank, spec.testing.fail_at_step, spec.testing.fail_eval) == (0, 1, True)
    with pytest.raises(SpecError) as err:  # smoke's slice check has one rank
        resolve("smoke", "testing.slice_check_slow_rank=1")
    assert err.value.field == "testing.slice_check_slow_rank"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_override_of_a_former_key_is_refused_naming_its_key_now(old):
    with pytest.raises(SpecError) as err:
        parse_overrides(f"{old}=1")
    assert err.value.field == old and err.value.valid == [MOVED[old]]


def test_a_spec_recorded_before_the_section_is_read_with_its_test_aids_in_it():
    """An earlier run's ledger (``tpupipe teardown RUN_ID``, the janitor) holds every key where it was then."""
    spec = resolve("local-fsdp", " ".join(f"testing.{name}={value}" for name, value in SET.items()))
    earlier = json.loads(spec.to_json())
    for old in MOVED:
        section, name = old.split(".")
        earlier[section][name] = earlier["testing"].pop(name)
    assert earlier.pop("testing") == {}
    assert from_dict(earlier) == spec
    assert "fail_at_step" in earlier["train"]  # the record itself is left as it was
