"""The gke platform.

- What a run is, as data: where it goes and who it runs as (``target``); the API bodies derived from the spec and the
  catalogue, GKE and Cloud Build (``resources``) and Compute Engine (``compute_resources``); the Kubernetes objects
  (``manifests``); the resource names the APIs take (``paths``).
- The plan: its typed records in creation order (``records``, ``k8s_records``), their cost and the printed plan
  (``plan``); what the run needs of its project (``needs``), checked before anything is created (``preflight``, its
  checks against what the location offers in ``offers``, the GKE version resolved in ``versions``, what it finds in
  ``findings``).
- The platform (``platform``) that walks those records (``walk``) through the creation handlers (``handlers``,
  ``deploy``) in a stage's session (``session``, ``clients``), tears a run down (``teardown``), prints its dry run
  (``dry_run``), waits for its RayCluster (``readiness``); the janitor of what runs left (``janitor``).
- One adapter per API it calls: ``cluster`` (GKE's ClusterManager), ``compute`` (Compute Engine), ``storage`` (Cloud
  Storage, Resource Manager), ``build`` (Cloud Build, Artifact Registry), ``secrets`` (Secret Manager) and ``kube``
  (Kubernetes, and the Ray Jobs API through its service proxy); ``features`` (what an existing cluster has).
"""
