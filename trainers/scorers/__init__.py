"""Teams' scorers of generated answers (``eval.scorer=trainers.scorers.MODULE:FUNCTION``), shipped with the trainers.

A scorer runs where the answers are scored: in the train job's rank-0 Ray worker (and in the evaluation job's, when
the champion answers again), in the trainer image, never in the pipeline's own process
(``trainers.generation.record``, ``trainers.metrics.scores``). ``eval.scorer`` may name only a function defined in a
module of this package, found as a file of this directory (``trainers.metrics.resolve_scorer``): every image copies
the ``components``, ``pipelines`` and ``trainers`` packages and installs them (images/torch/Dockerfile,
images/maxtext/Dockerfile), so a module here is importable on every host as ``trainers.scorers.<module>``. A package
added to the image's requirements (images/<image>/requirements.txt) is called from such a module. On the local
platform the trainer environments install this checkout in editable mode (components/platforms/local/envs.py), which
resolves the same modules to the checkout's files. Every Python file here is hashed into the answers' key and the
version's provenance (``trainers.metrics.package_digest``).
"""
