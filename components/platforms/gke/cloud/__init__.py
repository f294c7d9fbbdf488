"""The gke platform's own calls to Google Cloud and the cluster's Kubernetes API: GKE's clusters and node pools, Compute
Engine's networks, the control plane's endpoint, the Kubernetes API, Kueue's objects, the Ray Jobs API through the API
server's proxy, and a run's clients. What other platforms and backends share (Storage, Cloud Build, IAM, Secret
Manager, the KFP client, the client factory) is ``components.cloud``.

Imports ``plan`` only (the resource names, the run's target) of the gke platform; ``checks`` and ``run`` import it.
"""
