"""The pipeline's stages, each described once: a :class:`Stage` record per stage, in pipeline order (``TABLE``).

The rest is derived from it: what ``components.stages.runner.run_stage`` runs (``run``; the first stage checks the run
before anything is created; the exit task ignores Ctrl-C, runs after an interrupt, and writes the run's summary), what
``components.stages.component.run_component`` hands the stage and which typed artifacts it writes, and the pipeline's
wiring in ``pipelines.pipeline`` (which task takes which output and waits for which, the exit handler, the ``dsl.If``
of a gate, the retries of the stages that resume). The KFP components stay written functions, one per stage and named
as it, in ``components.definitions``: KFP reads each one's signature for its inputs and outputs and copies its source
into the compiled pipeline as the program its task runs. ``tests/unit/test_stage_table.py`` checks that they and
this table agree. A new stage is a record here, the function that runs it and its component.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.platforms import RunContext, get_platform
from components.stages import artifacts, dataset, ray_stages, registration

# What every component takes: the pipeline's parameters (``job_name`` is KFP's job name), from which a stage derives
# everything else (the spec, the run id, its resources' names, the run's store).
COMMON = ("preset", "platform", "overrides", "run_id", "job_name", "output_root", "project", "bucket", "dataset")
RESULT = "Output"  # a component's return value: its stage's result as JSON, or its ``output`` field


@dataclass(frozen=True)
class From:
    """An argument from an earlier stage: its result (``Output``) or one of its output artifacts."""

    stage: str
    output: str = RESULT


@dataclass(frozen=True)
class Gate:
    """The stages after the gating one (all but the exit task) run only when its output is ``value``: a ``dsl.If``
    named ``name`` around them."""

    value: str
    name: str


@dataclass(frozen=True)
class Stage:
    """One stage: the function that runs it and what the pipeline wires around it."""

    name: str  # its component in components.definitions; its record is stages/<name>.json
    run: Callable[..., dict[str, Any]]  # (context, upstream result as JSON, **facts) -> its result
    # Why it resumes safely when its task runs again after an attempt died mid-way (a lost machine, a killed process),
    # as Vertex AI does for a task whose spec asks for retries; None for a stage that would not. A stage that resumes
    # is retried on Vertex AI (``pipelines.pipeline.RETRY``).
    resumes: str | None
    inputs: Mapping[str, From] = field(default_factory=dict)  # its arguments taken from earlier stages' outputs
    after: tuple[str, ...] = ()  # earlier stages it waits for without taking anything of theirs
    params: tuple[str, ...] = ()  # pipeline parameters it takes beyond COMMON
    facts: Mapping[str, str] = field(default_factory=dict)  # a keyword argument of ``run`` -> the argument giving it
    output: str = ""  # the field of its result its component returns (what a gate reads); "" for the whole result
    # The fields of its result its component returns (``output`` ""; () for the whole result): what the stages after
    # it read. The task after it gets that as one command-line argument (the executor input, on kfp.local and in KFP
    # v2's launcher alike), and Linux refuses an argument over 128 KiB ("Argument list too long": MAX_ARG_STRLEN, 32
    # pages, in execve(2), https://man7.org/linux/man-pages/man2/execve.2.html, "Limits on size of arguments and
    # environment"); what grows with the run (a record per step or per epoch) stays in its record, where the summary
    # and the goodput ledger read it.
    passes_on: tuple[str, ...] = ()
    gates: Gate | None = None
    writes: Callable[[RunContext, dict[str, Any]], None] | None = None  # its typed artifacts (``artifacts``)
    job: bool = False  # it runs a Ray job: its log is logs/<name>.log
    exit: bool = False  # the exit task: it runs last, whatever happened to the others (teardown)

    @property
    def upstream(self) -> str:
        """The argument carrying an earlier stage's result, which ``run`` takes as its upstream; "" when none."""
        return next((arg for arg, source in self.inputs.items() if source.output == RESULT), "")

    @property
    def needs(self) -> tuple[str, ...]:
        """The earlier stages it waits for, by name."""
        return tuple(dict.fromkeys([*(source.stage for source in self.inputs.values()), *self.after]))


def on_platform(name: str) -> Callable[[RunContext, str], dict[str, Any]]:
    """A stage that is the platform's own method of the same name (provision, build_image, ...)."""

    def run(ctx: RunContext, _upstream: str) -> dict[str, Any]:
        method: Callable[[RunContext], dict[str, Any]] = getattr(get_platform(ctx.platform), name)
        return method(ctx)

    run.__name__ = name
    return run


RAY_JOB_RESUMES = "its Ray job's submission id derives from the run id: a retry re-attaches to it"

# In pipeline order; the data snapshot first: it gates everything after it (a run with nothing new to learn ends there,
# nothing created); provision and build_image start side by side (the image builds while the slices come up: Cloud
# Build may take up to an hour, and every chip bills from its node pool's creation), deploy needs both; promote runs
# only when register's gate says so; teardown runs last, whatever happened.
TABLE: tuple[Stage, ...] = (
    Stage(
        "snapshot_data",
        dataset.snapshot_data,
        resumes="the manifest its first attempt wrote is what a retry reads: the same objects, generations and rows",
        params=("schedule_time", "create_time"),
        facts={"schedule_time": "schedule_time", "create_time": "create_time"},
        output="proceed",
        gates=Gate(dataset.PROCEED, "new-data"),
        writes=artifacts.for_snapshot_data,
    ),
    Stage(
        "provision",
        on_platform("provision"),
        resumes="every create first looks for what exists; the ledger, written before anything waits, says what "
        "the run created, so a retry finds the cluster and pools the first attempt made",
    ),
    Stage(
        "build_image",
        on_platform("build_image"),
        resumes="the image's tag is the hash of its build context and its build carries the run's tag: a built "
        "image is reused, a running build re-attached to",
    ),
    Stage(
        "deploy_raycluster",
        on_platform("deploy_raycluster"),
        resumes="get-or-create and server-side apply: the same objects applied again change nothing",
        inputs={"image": From("build_image")},
        after=("provision",),
    ),
    Stage(
        "check_slice",
        ray_stages.check_slice,
        resumes=RAY_JOB_RESUMES,
        inputs={"raycluster": From("deploy_raycluster")},
        job=True,
    ),
    Stage(
        "train",
        ray_stages.train,
        resumes="its Ray job's submission id derives from the run id: a retry re-attaches to the job the lost attempt "
        "submitted, which went on training, instead of starting a second one",
        inputs={"raycluster": From("deploy_raycluster")},
        after=("check_slice",),
        # what evaluate reads (ray_stages.evaluate): the whole result holds per-step records (404 KB at 1,728 FSDP
        # steps; MaxText's history and losses too)
        passes_on=("checkpoint", "checkpoint_uri", "init_from", "heldout", "device", "num_workers", "answers"),
        writes=artifacts.for_train,
        job=True,
    ),
    Stage(
        "evaluate",
        ray_stages.evaluate,
        resumes=RAY_JOB_RESUMES,
        inputs={"train_result": From("train")},
        params=("source_version",),
        writes=artifacts.for_evaluate,
        job=True,
    ),
    Stage(
        "register",
        registration.register,
        resumes="register_once: the version this run registered (same run id and checkpoint) is found, not "
        "registered twice",
        inputs={"eval_result": From("evaluate"), "model": From("evaluate", "model")},
        params=("source_version",),
        facts={"pipeline_job": "job_name", "source_version": "source_version"},
        output="decision",
        gates=Gate("promote", "gate-promotes"),
        writes=artifacts.for_register,
    ),
    Stage(
        "promote",
        registration.promote,
        resumes="moving champion to the version it already names changes nothing",
        inputs={"decision": From("register")},
    ),
    Stage(
        "teardown",
        on_platform("teardown"),
        resumes="not found is success: what an earlier attempt deleted is skipped",
        writes=artifacts.for_teardown,
        exit=True,
    ),
)
STAGES = tuple(stage.name for stage in TABLE)
_BY_NAME = {stage.name: stage for stage in TABLE}


def named(name: str) -> Stage:
    """The stage called ``name``; a ValueError naming the stages for any other."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"stage: unknown stage {name!r} (valid: {', '.join(STAGES)})") from None
