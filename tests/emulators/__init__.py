"""In-process emulators of the cloud APIs the gke platform calls, served over the real protocols so that the real
client libraries run against them (docs/architecture.md, "Tests exercise the real client code"):

- ``gke``: the GKE ``google.container.v1.ClusterManager`` gRPC service, with clusters (created, updated one change
  at a time, listed in one location or all), node pools and long-running operations that progress over polls, and
  injectable faults;
- ``compute``: the Compute Engine v1 REST API's networks, subnetworks, resource policies and operations, over
  HTTP, with bodies checked against compute_v1's message types, and injectable faults; regions (their quotas) and
  reservations, read;
- ``storage``: Cloud Storage's JSON API for buckets, their IAM policies and objects (multipart, media and resumable
  uploads, downloads, server-side copies and rewrites), over HTTP (found by google-cloud-storage through
  ``STORAGE_EMULATOR_HOST``); with a ``root``, a bucket's objects are files there, the ones the emulated pods'
  Cloud Storage FUSE mounts reach;
- ``cloudbuild``: Cloud Build's ``google.devtools.cloudbuild.v1.CloudBuild`` gRPC service, builds that progress over
  polls, fail or are cancelled, with their source checked against the storage emulator;
- ``artifactregistry``: Artifact Registry's GetRepository and CreateRepository (gRPC, with its operations);
- ``bigquery_storage``: BigQuery's Storage Read API (``BigQueryRead``: read sessions and their streams, gRPC) over
  the ``bigquery`` emulator's tables;
- ``resourcemanager``: Resource Manager's ``Projects.GetProject`` (the project number) and ``TestIamPermissions``
  gRPC service;
- ``serviceusage``: Service Usage's ``GetService`` and ``BatchGetServices`` (which APIs a project has enabled);
- ``models``: Vertex AI Model Registry's ``ModelService`` over REST (models, versions, aliases, the upload's
  operation), with injectable faults;
- ``http``: what the HTTP emulators share (Google's error shape, faults, the server);
- ``kube``: a Kubernetes API server over HTTPS (its own CA) for namespaces, secrets, service accounts, pods,
  services, events, ResourceClaimTemplates and RayClusters; it validates RayClusters against the vendored KubeRay
  RayCluster CRD (tests/contract/kuberay_schema.py; there is no RayJob: the stages submit their jobs through the Ray
  Jobs API), serves that CRD as a given KubeRay release installs it, plays the KubeRay operator's part with a local
  Ray cluster of the manifest's shape, and serves the head service's proxy path, where each path under a pod's Cloud
  Storage FUSE mount (the bucket, or the ``only-dir`` of it the volume mounts) is the storage emulator's file; a
  package of one module per part (``apiserver``, ``kuberay``, ``kubelet``: the scheduler, autoscaler and kubelet,
  ``ray``), composed by ``KubeEmulator``;
- ``vertex``: Vertex AI Pipelines' PipelineService and ScheduleService over REST, running each task of a compiled
  pipeline in its own process; ``secretmanager``: Secret Manager's AccessSecretVersion (gRPC);
- ``project``: the emulated project, all of them started together, and the environment that points tpupipe at them.

Each emulator's own tests are beside it (``test_*_emulator.py``).
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


def serve_grpc(services: dict[str, dict[str, tuple]], streaming: frozenset[str] = frozenset()):
    """Serve ``{service: {method: (deserialize, serialize, handler)}}`` on 127.0.0.1 (plaintext, as Google's
    emulators do); (the started server, its host:port). A method named in ``streaming`` answers a stream (its
    handler a generator of responses: server streaming)."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    for service, methods in services.items():
        handlers = {
            name: (grpc.unary_stream_rpc_method_handler if name in streaming else grpc.unary_unary_rpc_method_handler)(
                fn, request_deserializer=deserialize, response_serializer=serialize
            )
            for name, (deserialize, serialize, fn) in methods.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def rich_status(code, message: str, reason: str, domain: str = "googleapis.com"):
    """A gRPC status carrying a ``google.rpc.ErrorInfo`` detail, as Google's APIs answer errors
    (https://google.aip.dev/193): google-api-core reads its ``reason`` into the exception's ``reason``."""
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2
    from grpc_status import rpc_status

    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=domain))
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=[detail]))


class GrpcEmulator:
    """Base of a gRPC emulator with ``state.calls``, ``faults`` and ``_lock``: ``_wrap(method, fn)`` records each
    call, answers an injected fault's status code, else runs ``fn`` under the lock (``fn(request, context, fault)``
    with ``pass_fault``, for faults that change the answer rather than fail the call). A fault whose ``lost`` is set
    fails the call after it took effect: ``fn`` runs, and its answer is replaced by the fault's status, as a client
    whose reply is lost sees it (``UNAVAILABLE`` when "Some data transmitted ... before connection breaks",
    ``DEADLINE_EXCEEDED`` when no response is received in time, which "may be returned even if the operation has
    completed successfully": https://grpc.io/docs/guides/status-codes)."""

    _server = None

    def stop(self) -> None:
        if self._server:
            self._server.stop(grace=None)

    def _wrap(self, method: str, fn, pass_fault: bool = False):
        def handler(request, context):
            with self._lock:
                self.state.calls.append(method)
            fault = take_fault(self.faults, self._lock, method, request)
            if fault is not None and getattr(fault, "lost", False):
                with self._lock:
                    fn(request, context, None) if pass_fault else fn(request, context)
                context.abort(fault.code, fault.message)
            if fault is not None and fault.code is not None:
                reason = getattr(fault, "reason", "")
                if reason:  # with the google.rpc.ErrorInfo Google's APIs attach (its ``reason``: AIP-193)
                    context.abort_with_status(rich_status(fault.code, fault.message, reason))
                context.abort(fault.code, fault.message)
            with self._lock:  # the answer is built under the lock
                return fn(request, context, fault) if pass_fault else fn(request, context)

        return handler
