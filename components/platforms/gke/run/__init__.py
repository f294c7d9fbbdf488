"""The gke platform's stages as walks of the plan, the RayCluster's readiness, teardown and the janitor.

Imports ``checks``, ``cloud`` and ``plan``; none of them imports it (the pipeline and the command line do).
"""
