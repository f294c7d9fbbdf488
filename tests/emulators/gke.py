"""An in-process GKE ClusterManager: the real ``google.container.v1.ClusterManager`` gRPC service, served from the
request and response messages google-cloud-container ships (its gRPC transport names the methods; the messages
serialise themselves), so ``ClusterManagerClient`` talks real gRPC to it.

Clusters and node pools are created by long-running operations that finish after ``polls_to_done`` GetOperation
calls. Faults are injected per method: a gRPC status for the next N calls (UNAVAILABLE, RESOURCE_EXHAUSTED,
ALREADY_EXISTS, ...), or a stockout, where the create call succeeds and its operation ends in the error GKE reports
when a zone has no capacity. A cluster's endpoints and CA certificate are those of the Kubernetes API emulator
given to the server, as GKE's are those of the cluster's control plane (``_endpoints``): its DNS-based endpoint the
emulator by name (``localhost:PORT``, whose certificate chains to the emulator's CA, not to public roots: the clients
are told that CA by ``TPUPIPE_GKE_EMULATOR_DNS_CA``), taking user traffic only when the cluster asked; its IP
endpoint the emulator's address, or, for a cluster whose only IP endpoint is private, an address nothing answers at
(``PRIVATE_ENDPOINT``), as no client outside the cluster's VPC reaches a private endpoint. UpdateCluster's
``desired_control_plane_endpoints_config`` turns the DNS-based endpoint's user traffic on or off in place (what
``gcloud container clusters update --enable-dns-access`` sends).

A created cluster runs the version its ``initialClusterVersion`` names, resolved as GKE resolves it against the
versions its release channel offers (``channels``; empty: ``default_version``; ``latest``: the newest; ``1.36``: the
newest 1.36), or INVALID_ARGUMENT when none matches; its node pools run its version. ``GetServerConfig`` reports the
same offer as GKE's ``ServerConfig`` documents it (google-cloud-container's
``container_v1/types/cluster_service.py``): per channel a ``ReleaseChannelConfig`` with its ``default_version``
("The default version for newly created clusters on the channel") and ``valid_versions`` ("List of valid versions
for the channel"), and ``valid_master_versions`` and ``valid_node_versions`` "in descending order". A cluster
created without ``releaseChannel`` is enrolled in REGULAR (GKE docs, "Release channels": Standard clusters are
enrolled in a channel by default, https://cloud.google.com/kubernetes-engine/docs/how-to/release-channels); on a
channel, a node pool whose ``management`` turns auto-upgrade off is refused with GKE's 400 (the ``ReleaseChannel``
message's comment in google-cloud-container: "Node auto-upgrade defaults to true and cannot be disabled"), and one
without ``management`` gets auto-upgrade and auto-repair on (GKE docs, "Node auto-upgrades": on by default). It
reports Pod and Service ranges: those its ``ipAllocationPolicy`` pins, else ``default_pod_range`` and
``default_service_range`` (what GKE picked). A cluster's private nodes are refused as GKE refuses them
(``_private_nodes_refusal``: both spellings at once, or a cluster that is not VPC-native), and, with a Compute Engine
emulator, the subnetwork it names must exist there and cannot be deleted while the cluster uses it.
"""

from __future__ import annotations

import base64
import itertools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import grpc
from google.cloud import container_v1 as c
from google.rpc import status_pb2

from tests.emulators import GrpcEmulator, provisioning, serve_grpc, take_fault

SERVICE = "google.container.v1.ClusterManager"
# A node config's service account: "default" or an account's email (GKE refuses anything else).
SERVICE_ACCOUNT = re.compile(r"default|[a-z0-9-]+@[a-z0-9.-]+\.gserviceaccount\.com")
# The versions the emulated GKE offers: the presets' (1.35.2-gke.1842000, the managed DRANET floor 1.34.1-gke.1829001)
# and one older and one newer minor.
VERSIONS = ("1.33.5-gke.1080000", "1.34.1-gke.1829001", "1.35.2-gke.1842000", "1.36.1-gke.1012000")
DEFAULT_VERSION = "1.35.2-gke.1842000"
# What each release channel offers (oldest first): RAPID and REGULAR all of them, STABLE not the newest minor.
CHANNELS = {"RAPID": VERSIONS, "REGULAR": VERSIONS, "STABLE": VERSIONS[:-1]}
# GKE's answer (400 badRequest) to a node pool with auto-upgrade off in a cluster on a channel, as GKE users report it
# (e.g. https://github.com/terraform-google-modules/terraform-google-kubernetes-engine/pull/682).
AUTO_UPGRADE_MESSAGE = "Auto_upgrade cannot be false when release_channel {channel} is set."
# A private IP endpoint is reached from the cluster's VPC only
# (https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation): here a port nothing listens on, so a
# client outside meets what it meets there, no answer.
PRIVATE_ENDPOINT = "127.0.0.1:9"
# GKE's answer (400 failedPrecondition) to a change while an operation of its own holds the cluster, an auto-upgrade
# for one, as GKE users report it (https://github.com/hashicorp/terraform-provider-google/issues/3650: "Operation
# operation-... is currently upgrading cluster ... Please wait and try again once it is done."). GKE docs, "Standard
# cluster upgrades": during a zonal control plane's upgrade "you cannot ... make other changes to the cluster's
# configuration until the upgrade is complete" (https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-upgrades).
BUSY_MESSAGE = (
    "Operation {operation} is currently upgrading cluster {cluster}. Please wait and try again once it is done."
)
# GKE's answer (400 failedPrecondition) to a node-pool change while another node-pool operation runs on the cluster:
# "Operation operation-... is currently deleting a node pool for cluster default-cluster. Please wait and try again
# once it is done." (https://github.com/hashicorp/terraform-provider-google/issues/10366, a delete refused while
# another pool's delete ran); "... is currently creating a node pool for cluster prombench ..."
# (https://github.com/prometheus/test-infra/pull/84). GKE docs, "Troubleshoot concurrent operations": such errors
# come "because GKE limits the number of operations that can run at the same time", the message being "Operation
# OPERATION_NAME is currently ACTIONING cluster CLUSTER_NAME. Please wait and try again once it is done"
# (https://cloud.google.com/kubernetes-engine/docs/troubleshooting/concurrent-operations).
POOL_BUSY_MESSAGE = (
    "Operation {operation} is currently {acting} a node pool for cluster {cluster}. Please wait and try again once it "
    "is done."
)
POOL_ACTIONS = {c.Operation.Type.CREATE_NODE_POOL: "creating", c.Operation.Type.DELETE_NODE_POOL: "deleting"}
# An operation's targetLink: "a URI to the resource being modified (such as a cluster, node pool, or node)" (the
# Operation message's field docs, google-cloud-container's container_v1/types/cluster_service.py, whose selfLink
# example is https://container.googleapis.com/v1alpha1/projects/123/locations/us-central1/operations/operation-123);
# a zonal cluster's under zones/ (the v1 API's zonal paths, projects.zones.clusters.nodePools), as gcloud shows them.
API_URL = "https://container.googleapis.com/v1/"
# The TPU machine types' prefixes (Cloud TPU's, as the compute emulator's TPU_MACHINE_ZONES names them).
TPU_PREFIXES = ("ct5lp-", "ct5p-", "ct6e-", "tpu7x-")
# A node pool's statusMessage when its instance group could not create its instances for lack of resources in the zone,
# as GKE reported it (https://github.com/hashicorp/terraform-provider-google/issues/3304), for
# ``pools_running_with_error``.
IGM_STOCKOUT_MESSAGE = (
    "{zone}: Deploy error: Not all instances running in IGM after 45.677691201s. Expect 1. Current errors: "
    "[ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS]: Instance creation failed: The zone '{zone}' does not have enough "
    "resources available to fulfill the request.  '(resource type:compute)'."
)
STOCKOUT_MESSAGE = (
    "Google Compute Engine: The zone '{zone}' does not have enough resources available to fulfill "
    "the request. Try a different zone, or try again later. (ZONE_RESOURCE_POOL_EXHAUSTED)"
)


@dataclass
class Fault:
    method: str
    code: grpc.StatusCode | None  # None: a stockout (the operation fails, not the call)
    message: str
    times: int = 1
    when: Callable[[object], bool] = lambda request: True
    reason: str = ""  # the ErrorInfo reason the status carries, if any (``tests.emulators.rich_status``)


@dataclass
class _Op:
    op: c.Operation
    polls_left: int
    on_done: Callable[[], None]
    error: tuple[int, str] | None = None
    target: str = ""  # the resource's path (projects/P/locations/L/clusters/C[/nodePools/N]), what the URL names


@dataclass
class State:
    clusters: dict[str, c.Cluster] = field(default_factory=dict)  # full name -> cluster (node pools inside)
    operations: dict[str, _Op] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)  # method names, in order
    upgrades: dict[str, tuple[str, int]] = field(default_factory=dict)  # cluster -> (its operation, refusals left)


class ClusterManagerEmulator(GrpcEmulator):
    """The service; ``start()`` serves it on 127.0.0.1 (plaintext, as Google's emulators do)."""

    def __init__(
        self, kube_endpoint: str = "127.0.0.1:1", kube_ca_pem: bytes = b"", polls_to_done: int = 2, compute=None
    ):
        self.state = State()
        self.channels, self.default_version = dict(CHANNELS), DEFAULT_VERSION
        self.default_pod_range, self.default_service_range = "10.52.0.0/14", "34.118.224.0/20"
        # The project's Compute Engine (tests.emulators.compute), when there is one: node pools must name networks,
        # subnets and workload policies that exist there, and hold them while they exist, as GKE's do.
        self.compute = compute
        if compute is not None:
            compute.in_use = self._user_of
        self.faults: list[Fault] = []
        self.flex_start_out: set[str] = set()  # zones with no flex-start TPU capacity (``flex_start_stocked_out``)
        self.pool_errors: list[tuple[Callable[[c.NodePool], bool], str]] = []  # ``pools_running_with_error``
        # GKE's refusal of a node-pool change while another node-pool operation runs on the cluster (POOL_BUSY_MESSAGE),
        # as older GKE gave it and as a cluster-level operation (an upgrade, a repair) still gives it. Off by default:
        # GKE now lets "you ... create, update, or delete a node pool while another node pool is already being
        # created, updated, or deleted" (https://cloud.google.com/kubernetes-engine/docs/how-to/node-pools); a test
        # turns it on to show the delete path through the refusal.
        self.serial_node_pool_operations = False
        # Called with each cluster once its deletion is done: its Kubernetes objects and pods go with it ("Deleting a
        # cluster ... deletes ... all workloads", https://cloud.google.com/kubernetes-engine/docs/how-to/deleting-a-cluster).
        self.on_cluster_deleted: list[Callable[[c.Cluster], None]] = []
        self.kube_endpoint = kube_endpoint
        self.kube_ca_pem = kube_ca_pem
        self.polls_to_done = polls_to_done
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._server = None
        self.address = ""

    # ------------------------------------------------------------------ faults and inspection
    def fail(
        self,
        method: str,
        code: grpc.StatusCode,
        message: str = "",
        times: int = 1,
        when: Callable[[object], bool] = lambda r: True,
        reason: str = "",
    ) -> None:
        self.faults.append(Fault(method, code, message or f"injected {code.name}", times, when, reason))

    def stockout(self, when: Callable[[object], bool] = lambda r: True, times: int = 1) -> None:
        """The next CreateNodePool matching ``when`` starts, and its operation fails for lack of capacity."""
        self.faults.append(Fault("CreateNodePool", None, STOCKOUT_MESSAGE, times, when))

    def zone_stocked_out(self, zone: str, times: int = 100) -> None:
        """``zone`` has no TPU capacity: every TPU node pool created there (its ``locations``) fails as above, for
        whichever capacity type; a CPU pool (no TPU machine type) is still made."""

        def tpu_in_zone(request) -> bool:
            pool = request.node_pool
            return pool.config.machine_type.startswith(TPU_PREFIXES) and zone in (list(pool.locations) or [zone])

        self.stockout(when=tpu_in_zone, times=times)

    def flex_start_stocked_out(self, zone: str) -> None:
        """Dynamic Workload Scheduler has no flex-start TPUs in ``zone``. A flex-start pool is still created there:
        it autoscales from zero nodes and is given its nodes only when pods ask for them (GKE docs, "About GPU and
        TPU provisioning with flex-start", https://cloud.google.com/kubernetes-engine/docs/concepts/dws), so the
        stockout is the cluster autoscaler's: each scale-up of the pool fails with a FailedScaleUp on the pods, in
        the words GKE gives a zone out of resources (GKE docs, "Troubleshoot the cluster autoscaler not scaling up",
        https://cloud.google.com/kubernetes-engine/docs/troubleshooting/cluster-autoscaler-scale-up), retried after
        the autoscaler's backoff for as long as the pods ask (``scale_up_stockout``, asked by the Kubernetes
        emulator). Fixed pools (on-demand, spot, reservation) are not flex-start capacity and are made as before."""
        with self._lock:
            self.flex_start_out.add(zone)

    def pools_running_with_error(self, message: str, when: Callable[[c.NodePool], bool] = lambda p: True) -> None:
        """Every node pool matching ``when``, those there now and those created from now, is RUNNING_WITH_ERROR with
        ``message`` as its statusMessage ("{zone}" filled with its zone): the status container v1's NodePool.Status
        defines as "created and is partially usable. Some error state has occurred and some functionality may be
        impaired" (google/container/v1/cluster_service.proto), as GKE reported a pool whose instances a zone had no
        resources for, "Deploy error: Not all instances running in IGM ... [ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS]"
        (https://github.com/hashicorp/terraform-provider-google/issues/3304)."""
        with self._lock:
            self.pool_errors.append((when, message))
            for cl in self.state.clusters.values():
                for p in cl.node_pools:
                    if p.status == c.NodePool.Status.RUNNING:
                        self._pool_error(cl, p)

    def _pool_error(self, cluster: c.Cluster, pool: c.NodePool) -> None:
        """``pools_running_with_error``'s rule for a RUNNING ``pool``, if one matches it."""
        for when, message in self.pool_errors:
            if when(pool):
                zone = (list(pool.locations) or [cluster.location])[0]
                pool.status, pool.status_message = c.NodePool.Status.RUNNING_WITH_ERROR, message.format(zone=zone)
                return

    def scale_up_stockout(self, selector: dict) -> str | None:
        """The zone of a flex-start TPU pool a pod with nodeSelector ``selector`` would land on (its nodes' labels,
        ``provisioning.node_labels``, carry every label the selector names: ``provisioning.selects``) where
        ``flex_start_stocked_out`` holds, else None."""
        with self._lock:
            for cl in self.state.clusters.values():
                for p in cl.node_pools:
                    if not (p.config.flex_start and p.config.machine_type.startswith(TPU_PREFIXES)):
                        continue
                    zone = (list(p.locations) or [cl.location])[0]
                    if zone in self.flex_start_out and provisioning.selects(selector, provisioning.node_labels(p)):
                        return zone
        return None

    def upgrading(self, cluster_name: str, refusals: int) -> None:
        """GKE starts an upgrade of ``cluster_name`` (a path) on its own: the cluster is RECONCILING and the next
        ``refusals`` changes to it (node pool create or delete, cluster delete or update) are refused with
        ``BUSY_MESSAGE`` (a GetCluster counts as one too, unrefused); then the upgrade is done and the cluster
        RUNNING again."""
        with self._lock:
            self.state.clusters[cluster_name].status = c.Cluster.Status.RECONCILING
            self.state.upgrades[cluster_name] = (f"operation-upgrade-{next(self._ids)}", refusals)

    def _refuse_while_upgrading(self, cluster_name: str, context, refuse: bool = True) -> None:
        with self._lock:
            if cluster_name not in self.state.upgrades:
                return
            operation, left = self.state.upgrades[cluster_name]
            if left <= 0:
                del self.state.upgrades[cluster_name]
                self.state.clusters[cluster_name].status = c.Cluster.Status.RUNNING
                return
            self.state.upgrades[cluster_name] = (operation, left - 1)
        if not refuse:
            return
        short = cluster_name.rsplit("/", 1)[-1]
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, BUSY_MESSAGE.format(operation=operation, cluster=short))

    def _refuse_while_deleting(self, deleting: bool, name: str, what: str, context) -> None:
        """A second delete of what a delete under way is deleting: GKE's failedPrecondition, the operation named
        ("Operation operation-... is currently deleting a node pool for cluster default-cluster. Please wait and try
        again once it is done.": https://github.com/hashicorp/terraform-provider-google/issues/10366)."""
        if not deleting:
            return
        cluster = name.split("/clusters/")[1].split("/")[0]
        operation = next(
            (
                e.op.name
                for e in self.state.operations.values()
                if e.target == name and e.op.status != c.Operation.Status.DONE
            ),
            "operation-unknown",
        )
        message = (
            f"Operation {operation} is currently deleting {what} {cluster}. Please wait and try again once it is done."
        )
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)

    def _refuse_while_pool_operation(self, cluster_name: str, context) -> None:
        """With ``serial_node_pool_operations``: a node-pool create or delete while another node-pool operation of
        the cluster runs is refused (POOL_BUSY_MESSAGE), the running operation named."""
        if not self.serial_node_pool_operations:
            return
        running = [
            e
            for e in self.state.operations.values()
            if e.op.operation_type in POOL_ACTIONS
            and e.op.status != c.Operation.Status.DONE
            and e.target.startswith(cluster_name + "/nodePools/")
        ]
        if running:
            op = running[0].op
            message = POOL_BUSY_MESSAGE.format(
                operation=op.name, acting=POOL_ACTIONS[op.operation_type], cluster=cluster_name.rsplit("/", 1)[-1]
            )
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)

    def add_cluster(self, parent: str, body: dict) -> str:
        """A RUNNING cluster created outside the run (``body`` in the REST JSON form), as a team's shared cluster is."""
        import json

        cluster = c.Cluster.from_json(json.dumps(body))
        name = f"{parent}/clusters/{cluster.name}"
        cluster.status, cluster.location, cluster.self_link = c.Cluster.Status.RUNNING, parent.rsplit("/", 1)[-1], name
        self._endpoints(cluster)
        cluster.master_auth = c.MasterAuth(cluster_ca_certificate=base64.b64encode(self.kube_ca_pem).decode())
        with self._lock:
            self.state.clusters[name] = cluster
        return name

    def _endpoints(self, cluster: c.Cluster) -> None:
        """The control plane's endpoints, as google-cloud-container's ``ControlPlaneEndpointsConfig`` describes them
        (``container_v1/types/cluster_service.py``). The DNS-based one: ``endpoint`` "Always present, but the behavior
        may change according to the value of [DNSEndpointConfig.allow_external_traffic]", which "Controls whether
        user traffic is allowed over this endpoint"; the proto gives no default, so the emulator takes the closed one
        (off unless asked), and a client that wants the endpoint must ask for it. The IP one (``Cluster.endpoint``):
        private when ``PrivateClusterConfig.enable_private_endpoint`` ("Whether the master's internal IP address is
        used as the cluster endpoint") or ``IPEndpointsConfig.enable_public_endpoint`` is false ("the value of
        enable_public_endpoint is reversed")."""
        config = cluster.control_plane_endpoints_config
        config.dns_endpoint_config.endpoint = self.kube_endpoint.replace("127.0.0.1", "localhost", 1)
        ip = config.ip_endpoints_config
        private = cluster.private_cluster_config.enable_private_endpoint or (
            "enable_public_endpoint" in ip and not ip.enable_public_endpoint
        )
        ip.private_endpoint = PRIVATE_ENDPOINT
        ip.public_endpoint = "" if private else self.kube_endpoint
        cluster.endpoint = PRIVATE_ENDPOINT if private else self.kube_endpoint

    def _fault(self, method: str, request) -> Fault | None:
        return take_fault(self.faults, self._lock, method, request)

    def clusters_labelled(self, key: str, value: str) -> list[str]:
        with self._lock:
            return [name for name, cl in self.state.clusters.items() if cl.resource_labels.get(key) == value]

    def pools_labelled(self, key: str, value: str) -> list[str]:
        with self._lock:
            return [
                f"{name}/nodePools/{p.name}"
                for name, cl in self.state.clusters.items()
                for p in cl.node_pools
                if p.config.resource_labels.get(key) == value or p.config.labels.get(key) == value
            ]

    def queued_pools(self) -> list[dict]:
        """The node pools with queued provisioning on, of every cluster, as the cluster autoscaler sees them: name,
        node labels (``provisioning.node_labels``) and maximum size."""
        with self._lock:
            return [
                {
                    "name": p.name,
                    "labels": provisioning.node_labels(p),
                    "max_nodes": p.autoscaling.max_node_count,
                }
                for cl in self.state.clusters.values()
                for p in cl.node_pools
                if p.queued_provisioning.enabled
            ]

    # ------------------------------------------------------------------ serving
    def start(self) -> str:
        handlers = {
            "CreateCluster": (c.CreateClusterRequest, c.Operation, self.create_cluster),
            "GetCluster": (c.GetClusterRequest, c.Cluster, self.get_cluster),
            "ListClusters": (c.ListClustersRequest, c.ListClustersResponse, self.list_clusters),
            "DeleteCluster": (c.DeleteClusterRequest, c.Operation, self.delete_cluster),
            "UpdateCluster": (c.UpdateClusterRequest, c.Operation, self.update_cluster),
            "CreateNodePool": (c.CreateNodePoolRequest, c.Operation, self.create_node_pool),
            "GetNodePool": (c.GetNodePoolRequest, c.NodePool, self.get_node_pool),
            "ListNodePools": (c.ListNodePoolsRequest, c.ListNodePoolsResponse, self.list_node_pools),
            "DeleteNodePool": (c.DeleteNodePoolRequest, c.Operation, self.delete_node_pool),
            "GetOperation": (c.GetOperationRequest, c.Operation, self.get_operation),
            "CancelOperation": (c.CancelOperationRequest, None, self.cancel_operation),
            "GetServerConfig": (c.GetServerConfigRequest, c.ServerConfig, self.get_server_config),
        }
        self._server, self.address = serve_grpc(
            {
                SERVICE: {
                    name: (
                        req.deserialize,
                        resp.serialize if resp else lambda _: b"",
                        self._wrap(name, fn, pass_fault=True),
                    )
                    for name, (req, resp, fn) in handlers.items()
                }
            }
        )
        return self.address

    # ------------------------------------------------------------------ helpers
    def _op(
        self,
        location_path: str,
        kind: c.Operation.Type,
        target: str,
        on_done: Callable[[], None],
        error: tuple[int, str] | None = None,
    ) -> c.Operation:
        op_id = f"operation-{next(self._ids)}"
        op = c.Operation(
            name=op_id,
            operation_type=kind,
            status=c.Operation.Status.RUNNING,
            self_link=_url(f"{location_path}/operations/{op_id}"),
            target_link=_url(target),
            location=location_path.rsplit("/", 1)[-1],
        )
        entry = _Op(op, self.polls_to_done, on_done, error, target)
        self.state.operations[f"{location_path}/operations/{op_id}"] = entry
        return op

    def _cluster(self, name: str, context) -> c.Cluster:
        cluster = self.state.clusters.get(name)
        if cluster is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Not found: {name}.")
        return cluster

    def _pool(self, name: str, context) -> tuple[c.Cluster, c.NodePool]:
        cluster_name, _, pool_name = name.partition("/nodePools/")
        cluster = self._cluster(cluster_name, context)
        for pool in cluster.node_pools:
            if pool.name == pool_name:
                return cluster, pool
        context.abort(grpc.StatusCode.NOT_FOUND, f"Not found: {name}.")

    # ------------------------------------------------------------------ clusters
    @staticmethod
    def _check_service_account(account: str, context) -> None:
        if account and not SERVICE_ACCOUNT.fullmatch(account):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f'Service account "{account}" does not exist.')

    def _offered(self, channel: c.ReleaseChannel.Channel) -> tuple[str, ...]:
        """The versions a channel offers, oldest first (no channel: every version of any)."""
        if channel == c.ReleaseChannel.Channel.UNSPECIFIED:
            return tuple(sorted({v for vs in self.channels.values() for v in vs}, key=_version_key))
        return tuple(self.channels.get(channel.name, ()))

    def _version(self, asked: str, channel: c.ReleaseChannel.Channel, context) -> str:
        """``asked`` resolved against the versions the channel offers, as GKE resolves a cluster version."""
        offered = self._offered(channel)
        if not asked:
            return self.default_version if self.default_version in offered else offered[-1]
        matching = [
            v
            for v in offered
            if asked == "latest" or v == asked or v.startswith(f"{asked}.") or v.startswith(f"{asked}-")
        ]
        if not matching:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f'Master version "{asked}" is unsupported.')
        return matching[-1]

    def get_server_config(self, request: c.GetServerConfigRequest, context, stockout=None) -> c.ServerConfig:
        every = self._offered(c.ReleaseChannel.Channel.UNSPECIFIED)[::-1]
        channels = []
        for name, offered in self.channels.items():
            newest_first = list(offered)[::-1]
            default = self.default_version if self.default_version in offered else newest_first[0]
            channels.append(
                c.ServerConfig.ReleaseChannelConfig(
                    channel=c.ReleaseChannel.Channel[name], default_version=default, valid_versions=newest_first
                )
            )
        return c.ServerConfig(
            default_cluster_version=self.default_version,
            valid_master_versions=every,
            valid_node_versions=every,
            channels=channels,
        )

    @staticmethod
    def _check_management(cluster: c.Cluster, pool: c.NodePool, context) -> None:
        """A pool's node management as the cluster's release channel allows it (defaults filled in)."""
        channel = cluster.release_channel.channel
        if "management" not in pool:
            pool.management = c.NodeManagement(auto_upgrade=True, auto_repair=True)
        elif channel != c.ReleaseChannel.Channel.UNSPECIFIED and not pool.management.auto_upgrade:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, AUTO_UPGRADE_MESSAGE.format(channel=channel.name))

    def create_cluster(self, request: c.CreateClusterRequest, context, stockout=None) -> c.Operation:
        name = f"{request.parent}/clusters/{request.cluster.name}"
        if name in self.state.clusters:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Already exists: {name}.")
        cluster = c.Cluster(request.cluster)
        if "release_channel" not in cluster:
            cluster.release_channel = c.ReleaseChannel(channel=c.ReleaseChannel.Channel.REGULAR)
        for pool in cluster.node_pools:
            self._check_management(cluster, pool, context)
        refusal = _private_nodes_refusal(request.cluster) or self._missing_subnetwork(name, request.cluster)
        if refusal:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
        for config in [p.config for p in request.cluster.node_pools] + [
            request.cluster.autoscaling.autoprovisioning_node_pool_defaults
        ]:
            self._check_service_account(config.service_account, context)
        cluster.status = c.Cluster.Status.PROVISIONING
        cluster.location = request.parent.rsplit("/", 1)[-1]
        cluster.self_link = name
        cluster.current_master_version = cluster.current_node_version = self._version(
            request.cluster.initial_cluster_version, cluster.release_channel.channel, context
        )
        ips = cluster.ip_allocation_policy
        ips.cluster_ipv4_cidr_block = cluster.cluster_ipv4_cidr = ips.cluster_ipv4_cidr_block or self.default_pod_range
        ips.services_ipv4_cidr_block = cluster.services_ipv4_cidr = (
            ips.services_ipv4_cidr_block or self.default_service_range
        )
        cluster.create_time = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        for pool in cluster.node_pools:
            pool.status = c.NodePool.Status.PROVISIONING
            pool.version = cluster.current_node_version
        self.state.clusters[name] = cluster

        def done():
            cluster.status = c.Cluster.Status.RUNNING
            self._endpoints(cluster)
            cluster.master_auth = c.MasterAuth(cluster_ca_certificate=base64.b64encode(self.kube_ca_pem).decode())
            for pool in cluster.node_pools:
                pool.status = c.NodePool.Status.RUNNING

        return self._op(request.parent, c.Operation.Type.CREATE_CLUSTER, name, done)

    def get_cluster(self, request: c.GetClusterRequest, context, stockout=None) -> c.Cluster:
        self._advance_ops_on(request.name)
        cluster = self._cluster(request.name, context)
        self._refuse_while_upgrading(request.name, context, refuse=False)
        return cluster

    def list_clusters(self, request: c.ListClustersRequest, context, stockout=None) -> c.ListClustersResponse:
        """The clusters of a location, or of every location with ``-``."""
        prefix = request.parent + "/clusters/"
        if request.parent.endswith("/locations/-"):
            prefix = request.parent.removesuffix("-")
        return c.ListClustersResponse(clusters=[cl for n, cl in self.state.clusters.items() if n.startswith(prefix)])

    def delete_cluster(self, request: c.DeleteClusterRequest, context, stockout=None) -> c.Operation:
        self._advance_ops_on(request.name)  # a delete under way goes on while the caller asks again
        cluster = self._cluster(request.name, context)
        self._refuse_while_upgrading(request.name, context)
        self._refuse_while_deleting(cluster.status == c.Cluster.Status.STOPPING, request.name, "cluster", context)
        cluster.status = c.Cluster.Status.STOPPING
        return self._op(
            request.name.rsplit("/clusters/", 1)[0],
            c.Operation.Type.DELETE_CLUSTER,
            request.name,
            lambda: self._deleted(request.name),
        )

    def _deleted(self, name: str) -> None:
        cluster = self.state.clusters.pop(name, None)
        for listener in self.on_cluster_deleted if cluster is not None else ():
            listener(cluster)

    def update_cluster(self, request: c.UpdateClusterRequest, context, stockout=None) -> c.Operation:
        """One change per request, as GKE takes them; applied when the operation is done. Multi-networking needs
        Dataplane V2; Dataplane V2 itself is chosen when a cluster is created."""
        cluster = self._cluster(request.name, context)
        self._refuse_while_upgrading(request.name, context)
        changes = [f.name for f, _ in c.ClusterUpdate.pb(request.update).ListFields()]
        if len(changes) != 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Exactly one update can be made at a time; got {changes}.")
        if cluster.status != c.Cluster.Status.RUNNING:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"Cluster {cluster.name} is running an incompatible operation."
            )
        (change,) = changes
        update = request.update
        if change == "desired_datapath_provider":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Dataplane V2 can only be set when a cluster is created.")
        if (
            change == "desired_enable_multi_networking"
            and cluster.network_config.datapath_provider != c.DatapathProvider.ADVANCED_DATAPATH
        ):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "Multi-networking requires Dataplane V2.")
        if change not in (
            "desired_addons_config",
            "desired_workload_identity_config",
            "desired_enable_multi_networking",
            "desired_control_plane_endpoints_config",
        ):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"The emulator does not update {change}.")
        cluster.status = c.Cluster.Status.RECONCILING

        def done():
            if change == "desired_addons_config":  # the add-ons the update names; the others are kept
                for addon, _ in c.AddonsConfig.pb(update.desired_addons_config).ListFields():
                    setattr(cluster.addons_config, addon.name, getattr(update.desired_addons_config, addon.name))
            elif change == "desired_workload_identity_config":
                cluster.workload_identity_config = update.desired_workload_identity_config
            elif change == "desired_control_plane_endpoints_config":  # the DNS-based endpoint's user traffic
                dns = update.desired_control_plane_endpoints_config.dns_endpoint_config
                if "allow_external_traffic" in dns:
                    cluster.control_plane_endpoints_config.dns_endpoint_config.allow_external_traffic = (
                        dns.allow_external_traffic
                    )
                self._endpoints(cluster)
            else:
                cluster.network_config.enable_multi_networking = update.desired_enable_multi_networking
            cluster.status = c.Cluster.Status.RUNNING

        return self._op(request.name.rsplit("/clusters/", 1)[0], c.Operation.Type.UPDATE_CLUSTER, request.name, done)

    # ------------------------------------------------------------------ node pools
    def create_node_pool(self, request: c.CreateNodePoolRequest, context, stockout=None) -> c.Operation:
        cluster = self._cluster(request.parent, context)
        self._refuse_while_upgrading(request.parent, context)
        if cluster.status != c.Cluster.Status.RUNNING:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"Cluster {cluster.name} is not running.")
        if any(p.name == request.node_pool.name for p in cluster.node_pools):
            context.abort(
                grpc.StatusCode.ALREADY_EXISTS, f"Already exists: {request.parent}/nodePools/{request.node_pool.name}."
            )
        self._check_service_account(request.node_pool.config.service_account, context)
        missing = self._missing_references(request.parent, request.node_pool)
        if missing:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Node pool {request.node_pool.name}: {missing} not found.")
        pool = c.NodePool(request.node_pool)
        self._check_management(cluster, pool, context)
        refusal = provisioning.node_pool_refusal(pool)  # queued provisioning's settings
        if refusal:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Node pool {pool.name}: {refusal}.")
        # A request is checked before it waits its turn: an invalid one is refused as such, busy cluster or not.
        self._refuse_while_pool_operation(request.parent, context)
        pool.status = c.NodePool.Status.PROVISIONING
        pool.version = pool.version or cluster.current_node_version
        cluster.node_pools.append(pool)
        name = f"{request.parent}/nodePools/{pool.name}"
        error = None
        if stockout is not None:
            zone = (list(pool.locations) or [cluster.location])[0]
            error = (8, stockout.message.format(zone=zone))

        def done():
            for p in cluster.node_pools:
                if p.name == pool.name:
                    p.status = c.NodePool.Status.ERROR if error else c.NodePool.Status.RUNNING
                    p.status_message = error[1] if error else ""
                    if not error:
                        self._pool_error(cluster, p)

        return self._op(request.parent.rsplit("/clusters/", 1)[0], c.Operation.Type.CREATE_NODE_POOL, name, done, error)

    def get_node_pool(self, request: c.GetNodePoolRequest, context, stockout=None) -> c.NodePool:
        self._advance_ops_on(request.name)
        return self._pool(request.name, context)[1]

    def list_node_pools(self, request: c.ListNodePoolsRequest, context, stockout=None) -> c.ListNodePoolsResponse:
        return c.ListNodePoolsResponse(node_pools=list(self._cluster(request.parent, context).node_pools))

    def delete_node_pool(self, request: c.DeleteNodePoolRequest, context, stockout=None) -> c.Operation:
        self._advance_ops_on(request.name)
        cluster, pool = self._pool(request.name, context)
        self._refuse_while_upgrading(request.name.split("/nodePools/")[0], context)
        stopping = pool.status == c.NodePool.Status.STOPPING
        self._refuse_while_deleting(stopping, request.name, "a node pool for cluster", context)
        self._refuse_while_pool_operation(request.name.split("/nodePools/")[0], context)
        pool.status = c.NodePool.Status.STOPPING

        def done():
            kept = [p for p in cluster.node_pools if p.name != pool.name]
            del cluster.node_pools[:]
            cluster.node_pools.extend(kept)

        return self._op(request.name.rsplit("/clusters/", 1)[0], c.Operation.Type.DELETE_NODE_POOL, request.name, done)

    # ------------------------------------------------------------------ Compute Engine references
    def _references(self, cluster_name: str, pool: c.NodePool) -> list[str]:
        """The Compute Engine resources a node pool names, as paths."""
        project = cluster_name.split("/")[1]
        location = cluster_name.split("/")[3]
        region = location.rsplit("-", 1)[0] if location.count("-") == 2 else location
        out = []
        for extra in pool.network_config.additional_node_network_configs:
            out.append(f"projects/{project}/global/networks/{extra.network.rsplit('/', 1)[-1]}")
            out.append(f"projects/{project}/regions/{region}/subnetworks/{extra.subnetwork.rsplit('/', 1)[-1]}")
        if pool.placement_policy.policy_name:
            out.append(
                f"projects/{project}/regions/{region}/resourcePolicies/"
                f"{pool.placement_policy.policy_name.rsplit('/', 1)[-1]}"
            )
        return out

    def _missing_references(self, cluster_name: str, pool: c.NodePool) -> str:
        if self.compute is None:
            return ""
        missing = [ref for ref in self._references(cluster_name, pool) if not self.compute.exists(ref)]
        return ", ".join(missing)

    def _cluster_subnetwork(self, cluster_name: str, cluster: c.Cluster) -> str:
        """The path of the subnetwork a cluster's body names ("" for the network's default one)."""
        if not cluster.subnetwork:
            return ""
        project, location = cluster_name.split("/")[1], cluster_name.split("/")[3]
        region = location.rsplit("-", 1)[0] if location.count("-") == 2 else location
        return f"projects/{project}/regions/{region}/subnetworks/{cluster.subnetwork.rsplit('/', 1)[-1]}"

    def _missing_subnetwork(self, cluster_name: str, cluster: c.Cluster) -> str:
        """GKE places the nodes in the subnetwork ``Cluster.subnetwork`` names, which must exist in the cluster's
        region (google-cloud-container's ``Cluster.subnetwork``: "The name of the Google Compute Engine subnetwork to
        which the cluster is connected")."""
        path = self._cluster_subnetwork(cluster_name, cluster)
        if self.compute is None or not path or self.compute.exists(path):
            return ""
        return f"Subnetwork {path} not found."

    def _user_of(self, kind: str, path: str) -> str | None:
        """The cluster or node pool that uses the Compute Engine resource at ``path``, if any (it cannot be deleted
        then)."""
        with self._lock:
            for name, cluster in self.state.clusters.items():
                if path == self._cluster_subnetwork(name, cluster):
                    return name
                for pool in cluster.node_pools:
                    if path in self._references(name, pool):
                        return f"{name}/nodePools/{pool.name}"
        return None

    # ------------------------------------------------------------------ operations
    def get_operation(self, request: c.GetOperationRequest, context, stockout=None) -> c.Operation:
        entry = self.state.operations.get(request.name)
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Not found: {request.name}.")
        return self._advance(entry)

    def _advance_ops_on(self, target: str) -> None:
        """GKE's operations go on whether or not anyone polls them (a client that died mid-create leaves its cluster
        to finish provisioning): here an operation advances when it is polled, and when what it works on is read."""
        for entry in list(self.state.operations.values()):
            if entry.target == target and entry.op.status != c.Operation.Status.DONE:
                self._advance(entry)

    def _advance(self, entry: _Op) -> c.Operation:
        if entry.op.status != c.Operation.Status.DONE:
            entry.polls_left -= 1
            entry.op.progress = c.OperationProgress(
                metrics=[c.OperationProgress.Metric(name="polls", int_value=self.polls_to_done - entry.polls_left)]
            )
            if entry.polls_left <= 0:
                entry.on_done()
                entry.op.status = c.Operation.Status.DONE
                if entry.error:
                    code, message = entry.error
                    entry.op.error = status_pb2.Status(code=code, message=message)
                    entry.op.status_message = message
        return entry.op

    def cancel_operation(self, request: c.CancelOperationRequest, context, stockout=None):
        entry = self.state.operations.get(request.name)
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Not found: {request.name}.")
        if entry.op.status != c.Operation.Status.DONE:
            entry.op.status = c.Operation.Status.ABORTING
        return None


def _private_nodes_refusal(cluster: c.Cluster) -> str:
    """What GKE refuses of a cluster's private nodes: both spellings at once (google-cloud-container's
    ``NetworkConfig.default_enable_private_nodes``: "It is invalid to specify both [PrivateClusterConfig.
    enablePrivateNodes][] and this field at the same time"), and private nodes in a cluster that is not VPC-native
    ("Private clusters must be VPC-native clusters", GKE docs, "Creating a private cluster", Restrictions and
    limitations: https://cloud.google.com/kubernetes-engine/docs/how-to/legacy/network-isolation; Autopilot clusters
    always are: https://cloud.google.com/kubernetes-engine/docs/concepts/autopilot-overview)."""
    legacy = "enable_private_nodes" in cluster.private_cluster_config
    current = "default_enable_private_nodes" in cluster.network_config
    if legacy and current:
        return (
            "Cannot specify both private_cluster_config.enable_private_nodes and "
            "network_config.default_enable_private_nodes."
        )
    private = cluster.private_cluster_config.enable_private_nodes or cluster.network_config.default_enable_private_nodes
    if private and not (cluster.ip_allocation_policy.use_ip_aliases or cluster.autopilot.enabled):
        return "Private nodes require a VPC-native cluster: set ip_allocation_policy.use_ip_aliases."
    return ""


def _url(path: str) -> str:
    """A resource's path as the URL GKE's operations name it by (API_URL): a zone's under zones/."""
    project, location, rest = re.match(r"projects/([^/]+)/locations/([^/]+)/?(.*)$", path).groups()
    scope = "zones" if location.count("-") == 2 else "locations"
    return f"{API_URL}projects/{project}/{scope}/{location}" + (f"/{rest}" if rest else "")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))
