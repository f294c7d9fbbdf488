"""The Vertex AI Pipelines backend, through google-cloud-aiplatform: pipeline jobs (``jobs``), schedules
(``schedules``), what keeps a stopped run from billing (``stopping``), and the service account a job runs as
(``service_account``)."""
