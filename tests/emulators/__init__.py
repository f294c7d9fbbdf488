"""In-process emulators of the cloud APIs the gke platform calls, served over the real protocols so that the real
client libraries run against them (architecture decision 9):

- ``gke``: the GKE ``google.container.v1.ClusterManager`` gRPC service, with clusters, node pools and long-running
  operations that progress over polls, and injectable faults;
- ``kube``: a Kubernetes API server over HTTPS (its own CA) that validates RayCluster and RayJob objects against
  the KubeRay CRD schemas, plays the KubeRay operator's part with a local Ray cluster of the manifest's shape, and
  serves the head service's proxy path.
"""
