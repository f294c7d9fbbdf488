"""The gke platform: the plan of a run on GKE (``resources``: API bodies from the spec and the catalogue;
``manifests``: the Kubernetes objects; ``plan``: the typed records in creation order, their cost, the printed plan),
the platform that walks those records (``platform``), and one adapter per API it calls: ``cluster`` (GKE's
ClusterManager), ``compute`` (Compute Engine), ``storage`` (Cloud Storage, Resource Manager), ``build`` (Cloud Build,
Artifact Registry) and ``kube`` (Kubernetes, and the Ray Jobs API through its service proxy)."""
