"""The pipeline's stages as plain functions over the platform interface, and how one runs with its record kept
(``runner``), the register and promote stages (``registration``), the Ray jobs the stages submit and follow
(``jobs``), the gate in front of the registered model's champion (``gate``), and the run's report (``report``). A KFP
component (``components.definitions``) is a thin shell over :func:`components.stages.component.run_component`, which
runs its stage (:func:`components.stages.runner.run_stage`) and writes the stage's typed artifacts (``artifacts``).
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
