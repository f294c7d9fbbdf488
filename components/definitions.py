"""One KFP component per stage of ``components.stages.table``, named as it and in its order: thin shells that hand
their arguments to ``components.stages.component.run_component``. They are written out because KFP reads each one's
signature for its inputs and outputs and copies its source into the compiled pipeline as the program its task runs;
``tests/unit/test_stage_table.py`` checks that each takes what its stage's record says.

Every component gets the same few parameters and derives everything else (spec, run id, resource names, the run's
store) from them. Results travel as JSON strings between stages; what a person looks at comes out as typed
artifacts (Metrics, HTML, Markdown, Model) that the Vertex AI UI shows, and the model goes from evaluate to
register as an artifact, so the run's lineage reaches the version register creates (a google.VertexModel). They
run in the pipeline image, which has this package; ``pipelines.pipeline.compile_pipeline`` sets that image's
registry path.
"""

from collections.abc import Callable
from typing import Any

from kfp import dsl

from components.artifact_types import VertexModel

# The image tasks run in until compile_pipeline names the content-addressed one in Artifact Registry.
PIPELINE_IMAGE = "tpupipe-pipeline"
# What makes each stage's component of its function (whose result, JSON, is a str): kfp's decorator with the image
# (https://www.kubeflow.org/docs/components/pipelines/user-guides/components/lightweight-python-components/). What it
# makes is Any here: kfp ships no type information.
component: Callable[[Callable[..., str]], Any] = dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)


@component
def snapshot_data(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
    schedule_time: str,
    create_time: str,
    data: dsl.Output[dsl.Dataset],
    card: dsl.Output[dsl.Markdown],
) -> str:
    """Resolve the run's data to an immutable snapshot before anything is created; its output, train or skip (nothing
    new since the champion), gates every stage after it. The run's copy of its data as a Dataset, its data card as
    Markdown."""
    from components.stages.component import run_component

    return run_component("snapshot_data", locals())


@component
def provision(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
) -> str:
    """Create the cluster the run trains on (local: a Ray head and N emulated hosts)."""
    from components.stages.component import run_component

    return run_component("provision", locals())


@component
def build_image(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
) -> str:
    """Build or reuse the trainer image (local: the torch environment, by content hash), beside provision: it needs
    nothing of it."""
    from components.stages.component import run_component

    return run_component("build_image", locals())


@component
def deploy_raycluster(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
    image: str,
) -> str:
    """Deploy the RayCluster and wait until every host is alive."""
    from components.stages.component import run_component

    return run_component("deploy_raycluster", locals())


@component
def check_slice(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
    raycluster: str,
) -> str:
    """Check every device of the slice before training (collectives, tensor-parallel parity), as a Ray job."""
    from components.stages.component import run_component

    return run_component("check_slice", locals())


@component
def train(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
    raycluster: str,
    metrics: dsl.Output[dsl.Metrics],
    loss_curve: dsl.Output[dsl.HTML],
) -> str:
    """Submit the trainer as a Ray job, stream its log; its metrics and loss curve as artifacts."""
    from components.stages.component import run_component

    return run_component("train", locals())


@component
def evaluate(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
    source_version: str,
    train_result: str,
    metrics: dsl.Output[dsl.Metrics],
    summary: dsl.Output[dsl.Markdown],
    model: dsl.Output[dsl.Model],
) -> str:
    """Held-out loss and perplexity, untrained vs trained, as a Ray job; the trained model as an artifact."""
    from components.stages.component import run_component

    return run_component("evaluate", locals())


@component
def register(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
    source_version: str,
    eval_result: str,
    model: dsl.Input[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    gate: dsl.Output[dsl.Markdown],
    registered: dsl.Output[VertexModel],
) -> str:
    """Register the trained model (evaluate's Model artifact) with its provenance and decide the gate: its output is
    the decision (promote, keep, off), with both held-out figures as Metrics, a Markdown table, and the registered
    version as a google.VertexModel artifact, the run's link to it in Vertex AI Model Registry."""
    from components.stages.component import run_component

    return run_component("register", locals())


@component
def promote(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
    decision: str,
) -> str:
    """Make the registered version the champion: it beat the champion on the same held-out examples."""
    from components.stages.component import run_component

    return run_component("promote", locals())


@component
def teardown(
    preset: str,
    platform: str,
    overrides: str,
    run_id: str,
    job_name: str,
    output_root: str,
    project: str,
    bucket: str,
    dataset: str,
    deleted: dsl.Output[dsl.Markdown],
    goodput: dsl.Output[dsl.Metrics],
    timeline: dsl.Output[dsl.HTML],
) -> str:
    """Delete everything the run created (found from the run id alone) and write the run summary; the run's goodput
    ledger (Metrics) and timeline (HTML)."""
    from components.stages.component import run_component

    return run_component("teardown", locals())
