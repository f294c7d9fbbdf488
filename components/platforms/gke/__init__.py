"""The gke platform: GKE, KubeRay and Cloud Build, in four layers; a module's folder says whether it makes calls.

- ``plan/``: what a run creates, derived from the run spec with no call made: where it goes (``target``), the API
  bodies (``resources``, ``compute_resources``, ``manifests``), their records in creation order (``records``,
  ``k8s_records``), the plan with its cost (``document``), what it needs of the project (``needs``), the dry run.
- ``cloud/``: the calls, one adapter per API (``cluster``, ``compute``, ``storage``, ``build``, ``secrets``,
  ``kube``, ``ray_jobs``), the control-plane endpoint, transient errors, and a run's clients (``clients``).
- ``checks/``: read-only checks before anything is spent: ``preflight``, what the location offers, Kubernetes access.
- ``run/``: the stages as walks of the plan (``platform``, ``walk``, ``handlers``, ``deploy``), the RayCluster's
  readiness, ``teardown`` and the ``janitor``.

Imports point down that list's reverse order only: ``run`` may import ``checks``, ``cloud`` and ``plan``; ``checks``
``cloud`` and ``plan``; ``cloud`` ``plan``; ``plan`` none of them (``tests/unit/test_architecture.py``).
"""
