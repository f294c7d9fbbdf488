"""The stage table (``components.stages.table``) and what is written beside it agree: one KFP component per stage in
``components.definitions``, named as it and in its order, each a thin shell over ``run_component`` that takes what the
record says; every dependency names an earlier stage; one exit task, last; the function of each stage takes what the
record hands it."""

import ast
import inspect
import textwrap

import pytest
from kfp.dsl.base_component import BaseComponent

from components import definitions
from components.stages import jobs
from components.stages.table import COMMON, RESULT, STAGES, TABLE, named


def components() -> dict[str, BaseComponent]:
    return {name: value for name, value in vars(definitions).items() if isinstance(value, BaseComponent)}


def test_one_component_per_stage_in_the_order_of_the_table():
    assert tuple(components()) == STAGES


@pytest.mark.parametrize("stage", TABLE, ids=STAGES)
def test_each_component_is_a_thin_shell_over_run_component_of_its_stage(stage):
    (func,) = ast.parse(textwrap.dedent(inspect.getsource(components()[stage.name].python_func))).body
    docstring, imported, call = func.body
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)
    assert ast.unparse(imported) == "from components.stages.component import run_component"
    assert ast.unparse(call) == f"return run_component({stage.name!r}, locals())"


@pytest.mark.parametrize("stage", TABLE, ids=STAGES)
def test_each_component_takes_the_common_parameters_then_its_parameters_then_its_inputs(stage):
    spec = components()[stage.name].component_spec
    assert list(spec.inputs) == [*COMMON, *stage.params, *stage.inputs]
    assert set(stage.facts.values()) <= set(spec.inputs)


@pytest.mark.parametrize("stage", TABLE, ids=STAGES)
def test_a_component_outputs_typed_artifacts_exactly_when_its_stage_writes_them(stage):
    outputs = components()[stage.name].component_spec.outputs
    assert RESULT in outputs
    assert (set(outputs) != {RESULT}) == (stage.writes is not None)


@pytest.mark.parametrize("stage", TABLE, ids=STAGES)
def test_a_stage_takes_only_outputs_of_earlier_stages_that_have_them(stage):
    earlier = STAGES[: STAGES.index(stage.name)]
    assert set(stage.needs) <= set(earlier) - {s.name for s in TABLE if s.exit}
    for source in stage.inputs.values():
        assert source.output in components()[source.stage].component_spec.outputs
    assert sum(source.output == RESULT for source in stage.inputs.values()) <= 1  # its one upstream


@pytest.mark.parametrize("stage", TABLE, ids=STAGES)
def test_the_function_of_a_stage_takes_its_upstream_and_its_facts(stage):
    inspect.signature(stage.run).bind(None, "", **dict.fromkeys(stage.facts, ""))


def test_one_exit_task_last_needing_nothing_and_gating_nothing():
    exits = [stage for stage in TABLE if stage.exit]
    assert exits == [TABLE[-1]]
    assert not exits[0].needs and not exits[0].gates


def test_a_gate_has_stages_after_it_to_gate():
    for i, stage in enumerate(TABLE):
        if stage.gates:
            assert any(not later.exit for later in TABLE[i + 1 :]), stage.name


def test_the_budget_watch_reads_the_stages_the_run_starts_with():
    """``jobs.watch`` counts the run's start from the stages that start it: those that wait for no other stage and
    sit under no gate (a gating stage itself starts the run)."""
    starting = []
    for stage in TABLE:
        if not stage.needs and not stage.exit:
            starting.append(stage.name)
        if stage.gates:
            break
    assert jobs.FIRST_STAGES == tuple(starting)


def test_an_unknown_stage_is_refused_naming_the_stages():
    assert named("train").name == "train"
    with pytest.raises(ValueError, match="unknown stage 'trian' \\(valid: snapshot_data, provision, build_image, "):
        named("trian")


def test_a_long_runs_train_result_passes_on_within_one_command_line_argument():
    """The train stage's result as its component returns it to evaluate (one command-line argument of the next task:
    at most 128 KiB, MAX_ARG_STRLEN) holds no per-step record, however many steps the run had; its record keeps them."""
    import json

    from components.stages.component import passed_on

    steps = [{"step": s, "time": 1796663725.0 + s, "loss": 1.234567, "group": 12345} for s in range(20_000)]
    result = {
        "checkpoint": "/runs/r/final",
        "heldout": {"eval_loss_after": 1.0},
        "steps": steps,
        "timeline": {"steps": steps, "compile_cache": {"hits": 3}},
        "history": steps,  # MaxText's: a row per step
        "losses": [s["loss"] for s in steps],
    }
    passed = passed_on(named("train"), json.dumps(result))
    assert len(passed.encode()) < 128 * 1024 < len(json.dumps(result).encode())
    assert json.loads(passed) == {"checkpoint": "/runs/r/final", "heldout": {"eval_loss_after": 1.0}}
    assert passed_on(named("evaluate"), json.dumps(result)) == json.dumps(result)  # the others: the whole result
    gate = named("snapshot_data")
    assert passed_on(gate, json.dumps({gate.output: "true", "steps": steps})) == "true"


def test_the_train_stage_passes_on_every_field_of_its_result_the_stages_read_from_it():
    """Every field of the upstream ``train_result`` that evaluate's code reads (``ray_stages.evaluate`` and the answers'
    functions it hands it to) is one the train stage passes on."""
    import re

    from components.stages import answers, ray_stages

    source = inspect.getsource(ray_stages) + inspect.getsource(answers)
    read = set(re.findall(r'train_result(?:\.get\(|\[)"([a-z_]+)"', source))
    assert "checkpoint" in read and read <= set(named("train").passes_on), read - set(named("train").passes_on)
