"""What a KFP component calls: :func:`run_component` with the component's arguments (``components.definitions``) runs
its stage (``components.stages.runner.run_stage``) and writes the stage's typed artifacts
(``components.stages.artifacts``) from the records the stage left in the run's store."""

from __future__ import annotations

import json
from typing import Any

from components.stages import table
from components.stages.runner import run_stage, stage_context


def with_target(overrides: str, project: str, bucket: str, dataset: str = "") -> str:
    """The pipeline's ``project`` and ``bucket`` parameters (set when the pipeline was compiled) as spec overrides,
    before the user's own, which win; its ``dataset`` parameter (the run form's, empty for the preset's) after them:
    a field of the form is what the person asked for."""
    import shlex

    target = [f"gke.project={project}"] if project else []
    target += [f"gke.bucket={bucket}"] if bucket else []
    chosen = [f"train.dataset={dataset}"] if dataset else []
    return " ".join([*(shlex.quote(t) for t in target), overrides, *(shlex.quote(d) for d in chosen)]).strip()


def run_component(stage: str, args: dict[str, Any]) -> str:
    """What a KFP component calls with its arguments (its ``locals()``): the stage, then the stage's typed
    artifacts (``components.stages.artifacts``), written from the records the stage left in the run's store. What the
    stage takes and writes is its record's (``components.stages.table``); what it returns, the fields of its result
    the stages after it read (``Stage.passes_on``)."""
    this = table.named(stage)
    overrides = with_target(args["overrides"], args.get("project", ""), args.get("bucket", ""), args.get("dataset", ""))
    common = (args["preset"], args["platform"], overrides, args["run_id"], args["job_name"], args["output_root"])
    facts = {key: args[arg] for key, arg in this.facts.items()}
    result = run_stage(stage, *common, args.get(this.upstream, ""), **facts)
    ctx = stage_context(stage, *common)
    if this.writes:
        this.writes(ctx, args)
    return passed_on(this, result)


def passed_on(stage: table.Stage, result: str) -> str:
    """What a stage's component returns of its result (JSON): its ``output`` field, else the fields it passes on."""
    if stage.output:
        return str(json.loads(result)[stage.output])
    if not stage.passes_on:
        return result
    return json.dumps({key: value for key, value in json.loads(result).items() if key in stage.passes_on})
