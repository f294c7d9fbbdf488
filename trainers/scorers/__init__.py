"""Teams' scorers of generated answers (``eval.scorer=MODULE:FUNCTION``), shipped with the trainers.

A scorer runs where the answers are scored: in the train job's rank-0 Ray worker (and in the evaluation job's, when
the champion answers again), in the trainer image, never in the pipeline's own process
(``trainers.generation.record``, ``trainers.metrics.scores``). Its module must therefore be one the trainer image
holds: every image copies the ``components``, ``pipelines`` and ``trainers`` packages and installs them
(images/torch/Dockerfile, images/maxtext/Dockerfile), so a module in this package is importable on every host as
``trainers.scorers.<module>``; so is a package added to the image's requirements (images/<image>/requirements.txt).
On the local platform the trainer environments install this checkout in editable mode
(components/platforms/local/envs.py), which resolves the same modules to the checkout's files.
"""
