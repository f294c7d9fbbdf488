"""Where a compiled pipeline runs: ``local`` (kfp.local on this machine: ``tpupipe run``), ``vertex`` (Vertex AI
Pipelines) and ``kfp`` (open-source Kubeflow Pipelines, ``--kfp-host``). Each submits runs, schedules them, lists them
and cancels them (``Backend``); no backend imports another's modules except through this interface."""
