"""The janitor pipeline: one task that sweeps what gke runs left behind (``components.platforms.gke.run.janitor``),
to put on a schedule in Vertex AI Pipelines beside the training pipeline. Compiled like it (``tpupipe compile --pipeline
janitor``): the same components image, the project, bucket and run root as defaults."""

from kfp import dsl

from components.definitions import PIPELINE_IMAGE

PIPELINE_NAME = "tpupipe-janitor"


# kfp ships no type information: its decorators are untyped to mypy
@dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def janitor(
    output_root: str,
    project: str,
    region: str,
    older_than: str,
    dry_run: bool,
    kfp_host: str,
    kfp_namespace: str,
    report: dsl.Output[dsl.Markdown],
) -> str:
    """Tear down every gke run under the output root whose pipeline job has ended, or that is finished or older than
    its limit, and clusters labelled with a run that left no ledger; the report as Markdown."""
    from components.platforms.gke.run.janitor import run_component

    return run_component(output_root, project, older_than, dry_run, report.path, region, (kfp_host, kfp_namespace))


@dsl.pipeline(  # type: ignore[untyped-decorator]
    name=PIPELINE_NAME,
    description="Delete what gke runs left behind: runs whose pipeline job has ended (a Stop), or that are finished "
    "or older than their limit, found by their ledgers and the tpupipe-run label; the same teardown every run uses.",
)
def janitor_pipeline(
    project: str = "",
    region: str = "",
    output_root: str = "",
    older_than: str = "",
    dry_run: bool = False,
    kfp_host: str = "",
    kfp_namespace: str = "kubeflow",
) -> None:
    """Sweep what gke runs left behind.

    Args:
        project: Projects to search for clusters labelled tpupipe-run, comma-separated; the projects of the runs'
            ledgers are searched too.
        region: The Vertex AI region of the runs' pipeline jobs: a run whose job has ended (a Stop in the UI) is
            collected at once, one whose job still runs is left alone.
        output_root: Where the runs' directories (and ledgers) are: gs://BUCKET/state.
        older_than: Collect a run older than this (6h, 90m, 2d); empty: each run's own limit, from its spec.
        dry_run: List what would be deleted and delete nothing.
        kfp_host: On Kubeflow Pipelines: its API server (http://ml-pipeline.kubeflow:8888 in the cluster), asked for
            the state of each run it started, so a terminated run is collected at once. Empty on Vertex AI.
        kfp_namespace: On Kubeflow Pipelines: the namespace of the runs.
    """
    janitor(
        output_root=output_root,
        project=project,
        region=region,
        older_than=older_than,
        dry_run=dry_run,
        kfp_host=kfp_host,
        kfp_namespace=kfp_namespace,
    ).set_display_name("janitor").set_caching_options(False)
