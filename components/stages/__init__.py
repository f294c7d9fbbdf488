"""The pipeline's stages: each described once in ``table`` (its function, what it takes from which earlier stage,
why it resumes safely, what it writes), in pipeline order. Their functions are the platform's own methods, the Ray
jobs of ``ray_stages`` (check_slice, train, evaluate, which submit and follow the jobs of ``jobs``) and the register
and promote stages (``registration``), with the gate in front of the registered model's champion (``gate``). One runs
with its record kept by ``runner``; the run's report is ``report`` (its loss curve ``loss_curve``). A KFP component
(``components.definitions``) is a thin shell over :func:`components.stages.component.run_component`, which runs its
stage (:func:`components.stages.runner.run_stage`) and writes the stage's typed artifacts (``artifacts``).
"""
