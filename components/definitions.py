"""The seven KFP components: thin shells that hand the pipeline parameters to ``components.stages``.

Every component gets the same few parameters and derives everything else (spec, run id, resource names)
from them; results travel as JSON strings. They run in the pipeline image, which has this package.
"""

import os

from kfp import dsl

PIPELINE_IMAGE = os.environ.get("TPUPIPE_PIPELINE_IMAGE", "tpupipe/pipeline-python3.12:0.1.0")


@dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
def provision(preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str) -> str:
    """Create the cluster the run trains on (local: a Ray head and N emulated hosts)."""
    from components.stages.runner import run_stage

    return run_stage("provision", preset, platform, overrides, run_id, job_name, output_root)


@dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
def build_image(preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str,
                cluster: str) -> str:
    """Build or reuse the trainer image (local: the torch environment, by content hash)."""
    from components.stages.runner import run_stage

    return run_stage("build_image", preset, platform, overrides, run_id, job_name, output_root, cluster)


@dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
def deploy_raycluster(preset: str, platform: str, overrides: str, run_id: str, job_name: str,
                      output_root: str, image: str) -> str:
    """Deploy the RayCluster and wait until every host is alive."""
    from components.stages.runner import run_stage

    return run_stage("deploy_raycluster", preset, platform, overrides, run_id, job_name, output_root, image)


@dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
def check_slice(preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str,
                raycluster: str) -> str:
    """Check every device of the slice before training (collectives, tensor-parallel parity), as a Ray job."""
    from components.stages.runner import run_stage

    return run_stage("check_slice", preset, platform, overrides, run_id, job_name, output_root, raycluster)


@dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
def train(preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str,
          raycluster: str) -> str:
    """Submit the trainer as a Ray job, stream its log, return its metrics and checkpoint."""
    from components.stages.runner import run_stage

    return run_stage("train", preset, platform, overrides, run_id, job_name, output_root, raycluster)


@dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
def evaluate(preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str,
             train_result: str) -> str:
    """Held-out loss and perplexity, untrained vs fine-tuned, as a Ray job."""
    from components.stages.runner import run_stage

    return run_stage("evaluate", preset, platform, overrides, run_id, job_name, output_root, train_result)


@dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False)
def teardown(preset: str, platform: str, overrides: str, run_id: str, job_name: str, output_root: str) -> str:
    """Delete everything the run created (found from the run id alone) and write the run summary."""
    from components.stages.runner import run_stage

    return run_stage("teardown", preset, platform, overrides, run_id, job_name, output_root)
