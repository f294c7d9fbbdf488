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

# Why each stage resumes safely when its task runs again after an attempt died mid-way (a lost machine, a killed
# process), as Vertex AI does for a task whose spec asks for retries; None for a stage that would not. Every stage
# that resumes is retried on Vertex AI (pipelines/pipeline.py).
RESUMES: dict[str, str | None] = {
    "provision": "every create first looks for what exists; the ledger, written before anything waits, says what "
    "the run created, so a retry finds the cluster and pools the first attempt made",
    "build_image": "the image's tag is the hash of its build context and its build carries the run's tag: a built "
    "image is reused, a running build re-attached to",
    "deploy_raycluster": "get-or-create and server-side apply: the same objects applied again change nothing",
    "check_slice": "its Ray job's submission id derives from the run id: a retry re-attaches to it",
    "train": "its Ray job's submission id derives from the run id: a retry re-attaches to the job the lost attempt "
    "submitted, which went on training, instead of starting a second one",
    "evaluate": "its Ray job's submission id derives from the run id: a retry re-attaches to it",
    "register": "register_once: the version this run registered (same run id and checkpoint) is found, not "
    "registered twice",
    "promote": "moving champion to the version it already names changes nothing",
    "teardown": "not found is success: what an earlier attempt deleted is skipped",
}
assert tuple(RESUMES) == STAGES
