"""The pipeline's stages as plain functions over the platform interface (``runner``), the Ray jobs they submit
and follow (``jobs``), the gate in front of the registered model's champion (``gate``), and the run's report
(``report``). A KFP component (``components.definitions``) is a thin shell over
:func:`components.stages.runner.run_stage`.
"""

# The stages in pipeline order; promote runs only when the gate says so; teardown runs last, whatever happened.
STAGES = (
    "provision",
    "build_image",
    "deploy_raycluster",
    "check_slice",
    "train",
    "evaluate",
    "register",
    "promote",
    "teardown",
)
