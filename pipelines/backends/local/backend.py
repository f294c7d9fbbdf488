"""The local backend behind the ``Backend`` interface. A local run is no submission: ``tpupipe run`` runs the compiled
pipeline with kfp.local in its own process, to its end (``run``); Ctrl-C stops it and ``tpupipe teardown`` removes what
a lost run left. So it has none of the interface's operations, and each answers so (exit 2), naming what to use."""

from __future__ import annotations

from pipelines.backends.base import Backend


class LocalBackend(Backend):
    name = "local"
    instead = (
        "`tpupipe run` runs the pipeline here in its own process, to its end (Ctrl-C stops it, `tpupipe teardown "
        "RUN_ID` removes what a lost run left); submit, schedule and list runs on Vertex AI (--project) or on "
        "Kubeflow Pipelines (--kfp-host URL)"
    )
