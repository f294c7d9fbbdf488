"""The tpupipe pipeline: provision -> build image -> deploy RayCluster -> check the slice -> train -> evaluate,
inside an exit handler whose task, teardown, runs whatever happens to them."""

from kfp import compiler, dsl

from components import definitions as c

PIPELINE_NAME = "tpupipe"


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Train or fine-tune an LLM on a Ray cluster (TPU slices on GKE, or emulated hosts locally), "
    "evaluate it, and tear everything down.",
)
def tpupipe_pipeline(
    preset: str = "local-fsdp",
    platform: str = "local",
    overrides: str = "",
    run_id: str = "",
    output_root: str = "",
):
    """preset: a named seed workload (`tpupipe presets`). platform: local or gke. overrides: space-separated
    key=value spec fields, e.g. "epochs=2 cluster.num_hosts=3". run_id: names every resource of the run;
    empty derives it from the pipeline job name. output_root: where run directories go (empty: ./runs)."""
    common = dict(preset=preset, platform=platform, overrides=overrides, run_id=run_id,
                  job_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, output_root=output_root)
    cleanup = c.teardown(**common).set_display_name("teardown")
    with dsl.ExitHandler(cleanup, name="run"):
        cluster = c.provision(**common)
        image = c.build_image(**common, cluster=cluster.output)
        ray = c.deploy_raycluster(**common, image=image.output)
        checked = c.check_slice(**common, raycluster=ray.output)
        trained = c.train(**common, raycluster=ray.output).after(checked)
        evaluated = c.evaluate(**common, train_result=trained.output)
    for task in (cleanup, cluster, image, ray, checked, trained, evaluated):
        task.set_caching_options(False)


def compile_pipeline(path: str) -> str:
    compiler.Compiler().compile(tpupipe_pipeline, package_path=path)
    return path
