"""The Google Cloud layer every platform and backend shares: one adapter per Google API used by more than one of
them, and the one factory of their clients (``credentials.google_client``, ``credentials.storage_client``).

- ``credentials``: Application Default Credentials (or the emulators' token), the client factory, the user's access
  errors;
- ``errors``: what an API's error means (transient, capacity, busy) and :class:`errors.Adapter`, the base of every
  adapter (retries, progress, injected clock);
- ``storage``: the run bucket and the run's access to it; ``iam``: Resource Manager's and IAM's reads;
- ``build``: Cloud Build and Artifact Registry (the trainer images, the components image);
- ``secrets``: Secret Manager; ``kfp``: the Kubeflow Pipelines API client.

What only GKE needs (clusters, node pools, Compute Engine networks, the cluster's Kubernetes API, Kueue, the Ray Jobs
API through the API server's proxy) stays in ``components.platforms.gke.cloud``. This package imports from the project
only ``components.spec`` and the platform-neutral process helpers ``components.platforms.waiting`` and
``components.platforms.interrupts`` (tests/unit/test_architecture.py). Cloud SDKs are imported inside functions.
"""
