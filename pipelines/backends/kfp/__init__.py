"""The open-source Kubeflow Pipelines backend (``--kfp-host``), through ``kfp.Client``: runs, recurring runs and their
states (``jobs``), and the identity a task calls Google Cloud with there (``identity``)."""
