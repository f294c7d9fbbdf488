"""The tpupipe pipeline: provision and build image side by side -> deploy RayCluster -> check the slice -> train ->
evaluate -> register, then promote when the gate says the new model beats the champion, inside an exit handler whose
task, teardown, runs whatever happens to them, wired from the stages' records (``components.stages.table``); and its
compilation for Vertex AI Pipelines."""

import subprocess
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kfp import compiler, dsl

from components import definitions as c
from components.spec import names
from components.stages.table import RESULT, TABLE, Stage

if TYPE_CHECKING:  # kfp ships no type information: its names are Any to mypy
    from kfp.dsl.graph_component import GraphComponent

PIPELINE_NAME = "tpupipe"
# A stage that resumes is retried once, 30 s after a failed attempt: a lost machine's task runs again, and a stage
# that fails for good fails the run one attempt later (each attempt of a failing provision creates and deletes).
RETRY = dict(num_retries=1, backoff_duration="30s", backoff_factor=2.0, backoff_max_duration="600s")
PIPELINE_IMAGE = "pipeline"  # images/pipeline: the components image
# kfp.local fills in the job's name, not its resource name (kfp/local/placeholder_utils.py): a local task gets the name.
LOCAL_JOB_NAME = {dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER: dsl.PIPELINE_JOB_NAME_PLACEHOLDER}


def wire(common: dict[str, Any], params: dict[str, Any]) -> None:
    """The stages' tasks as their records say (``components.stages.table``): the exit task first, then the others in
    order inside its exit handler, each taking the outputs it names and waiting for the stages it names, a gating
    stage's ``dsl.If`` around every stage after it; no task cached, every stage that resumes retried."""
    (exit_stage,) = [stage for stage in TABLE if stage.exit]
    tasks = {exit_stage.name: _task(exit_stage, common, params, {})}
    with dsl.ExitHandler(tasks[exit_stage.name], name="run"), ExitStack() as gates:
        for stage in TABLE:
            if stage.exit:
                continue
            tasks[stage.name] = task = _task(stage, common, params, tasks)
            if stage.gates:
                # The condition reads the stage's single output: kfp.local resolves a condition's task output only
                # when it is a component's "Output" (a named output reads as a parent input there, and the branch
                # never runs).
                gates.enter_context(dsl.If(task.outputs[RESULT] == stage.gates.value, name=stage.gates.name))
    for stage in TABLE:
        tasks[stage.name].set_caching_options(False)
        # A task whose attempt failed (its machine lost mid-way) runs again when its spec asks, after the backoff
        # (https://cloud.google.com/vertex-ai/docs/pipelines/configure-retries): every stage that resumes safely asks.
        if stage.resumes:
            tasks[stage.name].set_retry(**RETRY)


def _task(
    stage: Stage, common: dict[str, Any], params: dict[str, Any], tasks: dict[str, dsl.PipelineTask]
) -> dsl.PipelineTask:
    """The stage's task: its component (``components.definitions``, named as the stage) given the common parameters,
    the pipeline parameters it takes, and the outputs of earlier tasks it names; after the stages it waits for."""
    arguments = {
        **common,
        **{name: params[name] for name in stage.params},
        **{arg: tasks[source.stage].outputs[source.output] for arg, source in stage.inputs.items()},
    }
    return getattr(c, stage.name)(**arguments).after(*(tasks[name] for name in stage.after))


@dsl.pipeline(  # type: ignore[untyped-decorator]  # kfp ships no type information
    name=PIPELINE_NAME,
    description="Train or fine-tune an LLM on a Ray cluster (TPU slices on GKE, or emulated hosts locally), "
    "evaluate it, and tear everything down.",
)
def tpupipe_pipeline(
    preset: str = "gemma4-e2b-v6e-16",
    platform: str = "gke",
    overrides: str = "",
    run_id: str = "",
    project: str = "",
    bucket: str = "",
    output_root: str = "",
    source_version: str = "",
    dataset: str = "",
) -> None:
    """Train or fine-tune an LLM, evaluate it, and tear down what the run created.

    Args:
        preset: A named workload: smoke (one v6e chip, a tiny model: a first run that costs little),
            gemma4-e2b-v6e-16, gemma4-e2b-tpu7x-16 (Gemma 4 fine-tunes), llama3-8b-v6e-16x2,
            llama3-70b-v6e-16x2, llama3-8b-v6e-elastic-spot (MaxText pretraining); local-fsdp and local-maxtext run
            only on the local platform.
        platform: Where the run's cluster lives: gke (TPU slices on GKE) or local (emulated hosts on one machine).
        overrides: Space-separated key=value run spec fields, e.g. "train.epochs=2 gke.zone=us-east5-b". Leave empty
            for the preset as it is.
        run_id: Names every resource of the run. Leave empty: each pipeline job gets its own, from its job name.
        project: The Google Cloud project the run creates its cluster in (gke.project).
        bucket: The Cloud Storage bucket for checkpoints and the run's state (gke.bucket).
        output_root: Where run directories go: gs://BUCKET/state on Vertex AI, or a local directory.
        source_version: The tpupipe source (git commit) this pipeline was compiled from, recorded with the model.
        dataset: The examples to train on, instead of the preset's: gs://BUCKET/PREFIX/ (every .jsonl, .json and
            .parquet object under it), gs://BUCKET/PATH/*.jsonl, or bq://PROJECT.DATASET.TABLE; {date} in it is the
            schedule's date (YYYY-MM-DD, UTC), {date-1} the day before, {date:%Y%m%d} in that format
            (docs/recurring.md). Leave empty for the preset's dataset.
    """
    common = dict(
        preset=preset,
        platform=platform,
        overrides=overrides,
        run_id=run_id,
        # The job's full resource name (projects/P/locations/L/pipelineJobs/ID): the run id derives from its id, and a
        # task asks Vertex AI for the job's state where the job is (a SIGTERM, the janitor).
        job_name=dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER,
        output_root=output_root,
        project=project,
        bucket=bucket,
        dataset=dataset,
    )
    wire(
        common,
        {
            "source_version": source_version,
            # {date}'s time: the schedule's, else the job's creation (components.stages.dataset.run_time)
            "schedule_time": dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER,
            "create_time": dsl.PIPELINE_JOB_CREATE_TIME_UTC_PLACEHOLDER,
        },
    )


@dataclass(frozen=True)
class Target:
    """Where the compiled pipeline runs: the components image's registry and the defaults a Vertex AI run starts
    with, so a person picks a preset and nothing else."""

    project: str
    region: str
    repository: str = "tpupipe"  # the Artifact Registry Docker repository of the components image
    bucket: str = ""  # default: <project>-tpupipe

    @property
    def run_bucket(self) -> str:
        return self.bucket or f"{self.project}-tpupipe"

    @property
    def pipeline_root(self) -> str:
        """Where Vertex AI writes the runs' artifacts when a run names no pipeline root."""
        return f"gs://{self.run_bucket}/pipeline-root"

    def image(self, tag: str) -> str:
        return f"{self.region}-docker.pkg.dev/{self.project}/{self.repository}/{PIPELINE_IMAGE}:{tag}"

    def components_image(self, digest: str | None = None) -> str:
        """The components image of this source tree, by its content tag, pinned (``NAME:TAG@sha256:HEX``) with a
        ``digest``: what every task of a compiled pipeline runs in."""
        from components.cloud.build import image_tag

        return self.image(image_tag(PIPELINE_IMAGE)) + (f"@{digest}" if digest else "")


def source_version(root: Path | None = None) -> str:
    """The git commit of the source tree, or '' outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root or Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


# How kfp's lightweight component ends the shell script its command is: the executor started as a child of the shell
# (kfp/dsl/component_factory.py writes `sh -ec '... python3 -m kfp.dsl.executor_main ...'`).
EXECUTOR_LAUNCH = "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main"


def exec_executor(command: list[str]) -> list[str]:
    """A task's ``command`` with its shell replaced by the executor (``exec``), so that the SIGTERM that ends the task
    reaches the stage. A pod's end sends SIGTERM to the container's first process alone ("the kubelet triggers the
    container runtime to send a TERM signal to process 1 inside each container",
    https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination); as that first process, the
    shell ignores it (process 1 gets only the signals it installed a handler for: kill(2)), and the executor, its child,
    never hears of it (kubeflow/pipelines#7903 reports it: python components cannot handle SIGTERM). With ``exec``,
    the stage is that first process, and a Stop's SIGTERM runs its cancellation
    (pipelines/backends/vertex/stopping.py)."""
    script = command[2] if command[:2] == ["sh", "-ec"] and len(command) > 2 else ""
    if EXECUTOR_LAUNCH not in script:
        raise RuntimeError(f"kfp's component command changed: no {EXECUTOR_LAUNCH!r} to exec in {command[:3]}")
    execs = script.replace(EXECUTOR_LAUNCH, EXECUTOR_LAUNCH.replace("true ", "true exec "), 1)
    return [*command[:2], execs, *command[3:]]


def compile_pipeline(
    path: str,
    target: Target | None = None,
    pipeline: "GraphComponent | None" = None,
    retries: bool = True,
    digest: str | None = None,
) -> str:
    """Compile ``pipeline`` (default: the tpupipe pipeline; ``pipelines.janitor.janitor_pipeline`` too) to ``path``.
    With a ``target``, every task runs in the components image of this exact source (its tag a hash of the image's
    build context) in the target's Artifact Registry, and the parameters the pipeline has default to a gke run in the
    target's project and bucket; with its ``digest`` (``sha256:HEX``, what ``publish`` built or found), the image is
    pinned to it (``NAME:TAG@sha256:HEX``). Without ``retries``, no task asks to be retried: what a local run
    (kfp.local, which honours ``retryPolicy`` too: kfp/local/orchestrator/task_executor.py) runs, where the driver
    stops a stage on Ctrl-C and a retry would start it again; nor does any task read the schedule's or the create
    time, which kfp.local cannot fill in (``kfp/local/placeholder_utils.py`` substitutes the job's and task's names
    and ids and the pipeline root, and takes any other ``{{$...}}`` for an artifact's path and fails): a local run is
    never scheduled, and its snapshot takes the run's start; nor the job's resource name (the same file's
    placeholders): a local task is given the job's name instead. Every parameter's description is one line, as the
    Vertex AI run form shows it (kfp keeps the docstring's line breaks). Deterministic: the same tree gives the same
    bytes."""
    pipeline = pipeline or tpupipe_pipeline
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "pipeline.yaml"
        compiler.Compiler().compile(pipeline, package_path=str(raw))
        spec = yaml.safe_load(raw.read_text())
    for component in [spec["root"], *spec.get("components", {}).values()]:
        for parameter in component.get("inputDefinitions", {}).get("parameters", {}).values():
            if "description" in parameter:
                parameter["description"] = " ".join(parameter["description"].split())
    for executor in spec["deploymentSpec"]["executors"].values():
        executor["container"]["command"] = exec_executor(executor["container"]["command"])
    if not retries:
        local = {
            dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER: "",
            dsl.PIPELINE_JOB_CREATE_TIME_UTC_PLACEHOLDER: "",  # kfp.local fills neither time
            **LOCAL_JOB_NAME,
        }
        for component in [spec["root"], *spec.get("components", {}).values()]:
            for task in component.get("dag", {}).get("tasks", {}).values():
                task.pop("retryPolicy", None)
                for binding in task.get("inputs", {}).get("parameters", {}).values():
                    constant = binding.get("runtimeValue", {}).get("constant")
                    if isinstance(constant, str) and constant in local:
                        binding["runtimeValue"]["constant"] = local[constant]
    if target is None:
        Path(path).write_text(yaml.safe_dump(spec, sort_keys=True))
        return path
    image = target.components_image(digest)
    for executor in spec["deploymentSpec"]["executors"].values():
        executor["container"]["image"] = image
    defaults = {
        "project": target.project,
        "bucket": target.run_bucket,
        "output_root": names.state_root(target.run_bucket),
        "source_version": source_version(),
        "region": target.region,  # the janitor pipeline's: where the runs' pipeline jobs are
    }
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    for name, value in defaults.items():
        if name in parameters:
            parameters[name]["defaultValue"] = value
    # The pipeline root a run takes when it names none: what kfp writes from @dsl.pipeline(pipeline_root=...)
    # (kfp/dsl/graph_component.py), what the SDK falls back to (PipelineJob's "defaultPipelineRoot") and the Vertex
    # UI's run form offers, so that form needs only the preset.
    spec["defaultPipelineRoot"] = target.pipeline_root
    Path(path).write_text(yaml.safe_dump(spec, sort_keys=True))
    return path
