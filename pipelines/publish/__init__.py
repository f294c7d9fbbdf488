"""``tpupipe publish``: the compiled pipeline pinned to its components image's digest and made startable, on Vertex AI
(``vertex``) or uploaded to Kubeflow Pipelines (``kfp``)."""
