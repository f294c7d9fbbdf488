"""A run's data: where ``train.dataset`` and ``train.eval_dataset`` point (generated, a hub name, local files, Cloud
Storage objects, a BigQuery table), resolved once per run to an immutable snapshot that every later stage reads.

Imports from the project only ``components.spec`` and ``components.cloud.credentials`` (Google credentials and
the clients' endpoints), as the registry does; the stages and the command line import it.
"""
