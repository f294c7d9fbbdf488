"""The pipeline's stages as plain functions over the platform interface (``runner``), the Ray jobs they submit
and follow (``jobs``), and the run's report (``report``). A KFP component (``components.definitions``) is a thin
shell over :func:`components.stages.runner.run_stage`.
"""

# The stages in pipeline order; teardown runs last, whatever happened to the others.
STAGES = ("provision", "build_image", "deploy_raycluster", "check_slice", "train", "evaluate", "teardown")
