"""In-process emulators of the cloud APIs the gke platform calls, served over the real protocols so that the real
client libraries run against them (architecture decision 9):

- ``gke``: the GKE ``google.container.v1.ClusterManager`` gRPC service, with clusters, node pools and long-running
  operations that progress over polls, and injectable faults;
- ``compute``: the Compute Engine v1 REST API's networks, subnetworks, resource policies and operations, over
  HTTP, with bodies checked against compute_v1's message types, and injectable faults;
- ``storage``: Cloud Storage's JSON API for buckets and their IAM policies, over HTTP (found by google-cloud-storage
  through ``STORAGE_EMULATOR_HOST``);
- ``resourcemanager``: Resource Manager's ``Projects.GetProject`` gRPC service (the project number);
- ``http``: what the HTTP emulators share (Google's error shape, faults, the server);
- ``kube``: a Kubernetes API server over HTTPS (its own CA) that validates RayCluster and RayJob objects against
  the KubeRay CRD schemas, plays the KubeRay operator's part with a local Ray cluster of the manifest's shape, and
  serves the head service's proxy path.
"""


def take_fault(faults: list, lock, method: str, request):
    """The first injected fault for ``method`` that matches ``request`` and has uses left (one use taken), or None.
    A fault has ``method``, ``times`` and ``when(request)``."""
    with lock:
        for fault in faults:
            if fault.method == method and fault.times > 0 and fault.when(request):
                fault.times -= 1
                return fault
    return None
