"""``tpupipe publish --kfp-host``: the pipeline ``publish`` pinned to its image's digest, uploaded to Kubeflow Pipelines
as a version, and with ``--janitor-schedule`` the janitor pipeline and its recurring run there (docs/kubeflow.md)."""

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.pipeline import Target, compile_pipeline
from pipelines.publish.vertex import Published

if TYPE_CHECKING:
    from pipelines.backends.kfp.jobs import Place

# Kubeflow Pipelines' API server as a pod in the cluster reaches it: the ml-pipeline Service of a standard install, in
# the kubeflow namespace, on its HTTP port (the KFP "Connect the Pipelines SDK to Kubeflow Pipelines" guide,
# https://www.kubeflow.org/docs/components/pipelines/user-guides/core-functions/connect-api/).
KFP_IN_CLUSTER_HOST = "http://ml-pipeline.kubeflow:8888"
KFP_JANITOR_CRON = "0 */15 * * * *"  # KFP's 6 fields, seconds first: every 15 minutes, as on Vertex AI


def publish_kfp(
    target: Target, published: Published, place: "Place", janitor: bool, log: Callable[[str], None] = print
) -> str:
    """The pipeline, as ``publish`` pinned it, uploaded to Kubeflow Pipelines as a version named after the source
    version; with ``janitor``, the janitor pipeline too, and its recurring run every 15 minutes in the experiment
    (replaced when it runs another version). The version's name."""
    from pipelines.backends.kfp import jobs as kfp
    from pipelines.janitor import janitor_pipeline

    digest = published.image.rsplit("@", 1)[1]
    client = kfp.client(place)
    with tempfile.TemporaryDirectory() as tmp:
        path = compile_pipeline(str(Path(tmp) / "tpupipe.yaml"), target, digest=digest)
        kfp.upload(client, path, place.namespace)
        version = kfp.version_name(path)
        log(f"publish: pipeline {kfp.PIPELINE} version {version} on Kubeflow Pipelines at {place.host}")
        if not janitor:
            return version
        sweep = compile_pipeline(str(Path(tmp) / "janitor.yaml"), target, janitor_pipeline, digest=digest)
        pipeline_id, version_id = kfp.upload(client, sweep, place.namespace, kfp.JANITOR_PIPELINE)
    for existing in kfp.recurring_runs(client, place):
        if existing["display_name"] == kfp.JANITOR_PIPELINE:
            if (existing.get("pipeline_version_reference") or {}).get("pipeline_version_id") == version_id:
                log(f"publish: the janitor's recurring run {kfp.JANITOR_PIPELINE} exists already")
                return version
            kfp.schedule_action(client, place, kfp.JANITOR_PIPELINE, "delete")
    kfp.call(
        "the janitor's recurring run",
        client.create_recurring_run,
        experiment_id=kfp.experiment_id(client, place),
        job_name=kfp.JANITOR_PIPELINE,
        cron_expression=KFP_JANITOR_CRON,
        max_concurrency=1,
        no_catchup=True,
        params={"kfp_host": KFP_IN_CLUSTER_HOST, "kfp_namespace": place.namespace},
        pipeline_id=pipeline_id,
        version_id=version_id,
        pipeline_root=target.pipeline_root,
    )
    log(f"publish: the janitor sweeps every 15 minutes: recurring run {kfp.JANITOR_PIPELINE} on Kubeflow Pipelines")
    return version
