"""An in-process Compute Engine: the part of the v1 REST API that network provisioning uses (global networks and
firewall rules, regional subnetworks, resource policies and Cloud Routers with their NAT gateways, global and regional
operations), served over plain HTTP by
``http.server``, so that the real ``google.cloud.compute_v1`` clients (REST is their only transport) talk to it.

Request bodies are parsed into compute_v1's own message types with unknown fields refused, then checked as Compute
checks them (resource names, MTU range, custom mode, the network a subnetwork or firewall rule names, subnetwork CIDRs
and their overlap, the region, workload policy types, a firewall rule's direction, sources, protocols and ports, a
NAT gateway's options and the subnetworks it serves, one gateway per subnetwork). The project's ``default`` network
is there for a subnetwork or router to name, as Compute made it with the project.
Errors come back in Google's JSON error shape, so the clients raise the ``google.api_core.exceptions`` they raise
against Compute (NotFound, Conflict, BadRequest, ...).

Inserts and deletes answer an Operation (PENDING, then RUNNING) that is DONE after ``polls_to_done`` polls of
``globalOperations.get`` / ``regionOperations.get`` (the call compute_v1's ExtendedOperation polls with; ``wait``
is served too); only then does the change take effect. As in Compute, a resource whose insert is running is 404 to
GET but its name is taken (a second insert is 409), one whose delete is running stays readable, and a network cannot
be deleted while a subnetwork or firewall rule names it. Links
(``selfLink``, ``targetLink``, a subnetwork's ``network``) are the ``https://www.googleapis.com/compute/v1/...``
URLs Compute writes.

Preflight's reads are served too: ``regions.get`` with the region's quotas (every TPU metric roomy until
``set_quota`` says otherwise), ``reservations.get`` of the zonal reservations ``add_reservation`` (specific) and
``add_aggregate_reservation`` made, ``reservationBlocks.get`` of the blocks ``add_reservation_block`` made,
``reservationSubBlocks.get`` of the sub-blocks ``add_reservation_sub_block`` made, ``machineTypes.get`` per zone,
and ``networks.get`` of the project's ``default`` network. A TPU machine type is offered only in the zones Cloud
TPU's "TPU regions and zones" lists for its version
(https://cloud.google.com/tpu/docs/regions-zones; ``TPU_MACHINE_ZONES``), else 404 as for any unknown machine type;
a CPU machine type is offered unless its series is one a zone's region lacks (Compute Engine's "Regions and zones",
the machine series of each zone: https://cloud.google.com/compute/docs/regions-zones#available; ``CPU_SERIES_ABSENT``)
or ``withhold_machine_type`` says otherwise. Every project has the auto-mode ``default`` network
Compute makes with a new project (VPC docs, "Default network": https://cloud.google.com/vpc/docs/vpc#default-network)
unless ``skip_default_network`` says the organisation skips it (``constraints/compute.skipDefaultNetworkCreation``).

Faults are injected per method ("networks.insert", "subnetworks.delete", "globalOperations.get", ...): an HTTP
error for the next N matching calls (``fail``), before the call takes effect; a rate limit (``rate_limit``) as Compute
answers one, HTTP 403 with the reason ``rateLimitExceeded`` ("If your project exceeds a rate quota, you receive a 403
error with the reason rateLimitExceeded": https://cloud.google.com/compute/api-quota); a rate quota
(``limit_rate``): N requests of a quota group a minute, counted per project in the synchronized minutes of the
emulator's ``clock`` (Compute "enforces rate quotas at a per-minute interval for each group ... if a project reaches a
quota limit at 10:00:15, the quota refills at the start of the next synchronized interval, such as 10:01:00": the same
page), each further request of that minute refused as ``rate_limit`` refuses it; an operation that ends in Compute's
RESOURCE_OPERATION_RATE_EXCEEDED (``operation_rate``); a lost answer (``lose``): the
call takes effect and its answer is an error, a 504 by default (DEADLINE_EXCEEDED's HTTP mapping, which "may be
returned even if the operation has completed successfully": google/rpc/code.proto); or a quota failure, where the
insert is accepted and its operation ends DONE with the QUOTA_EXCEEDED error Compute reports. ``in_use`` lets another
emulator say that something outside Compute (a GKE node pool, say) still uses a network or resource policy, which then
cannot be deleted.

An insert or delete may carry a ``requestId`` (compute_v1's ``Insert*Request.request_id``/``Delete*Request.request_id``,
google/cloud/compute_v1/types/compute.py at 1.57.0): "Specify a unique request ID so that if you must retry your
request, the server will know to ignore the request if it has already been completed ... If you make the request again
with the same request ID, the server can check if original operation with the same request ID was received, and if so,
will ignore the second request"; it "must be a valid UUID with the exception that zero UUID is not supported" (400
otherwise). A request whose id the project has seen takes no effect and is answered that first operation, as it is
now; the operation carries the id as ``clientOperationId`` ("The value of requestId if you provided it in the request":
``Operation.client_operation_id``, the same file). Compute documents no window after which an id is forgotten: the
emulator remembers each for its lifetime.

Pointing the clients here: ``ClientOptions(api_endpoint="http://127.0.0.1:PORT")``, for every client, the
operations clients included (the one an ExtendedOperation polls with internally is built from the credentials
alone and goes to compute.googleapis.com: poll with your own ``GlobalOperationsClient``/``RegionOperationsClient``).
"""

from __future__ import annotations

import copy
import ipaddress
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl, urlsplit

from google.cloud import compute_v1
from google.protobuf import json_format

from tests.emulators import take_fault
from tests.emulators.http import REASONS, Fault, HttpEmulator, HttpError
from tests.emulators.tokens import authorized

LINK = "https://www.googleapis.com/compute/v1/"
KINDS = {
    "networks": compute_v1.Network,
    "subnetworks": compute_v1.Subnetwork,
    "resourcePolicies": compute_v1.ResourcePolicy,
    "firewalls": compute_v1.Firewall,
    "routers": compute_v1.Router,
}
GLOBAL_KINDS = ("networks", "firewalls")
OUTPUT_ONLY_REGION = ("routers",)  # kinds whose ``region`` the API sets and never reads (``_validate``)
SINGULAR = {
    "networks": "network",
    "subnetworks": "subnetwork",
    "resourcePolicies": "resourcePolicy",
    "firewalls": "firewall",
    "routers": "router",
}
QUOTA_METRIC = {
    "networks": "NETWORKS",
    "subnetworks": "SUBNETWORKS",
    "resourcePolicies": "RESOURCE_POLICIES",
    "firewalls": "FIREWALLS",
    "routers": "ROUTERS",
}
# A Cloud NAT gateway's choices, as Compute's RouterNat enumerates them (google-cloud-compute's
# compute_v1/types/compute.py: RouterNat.NatIpAllocateOption, .SourceSubnetworkIpRangesToNat; and
# RouterNatSubnetworkToNat.SourceIpRangesToNat).
NAT_IP_OPTIONS = ("AUTO_ONLY", "MANUAL_ONLY")
NAT_SOURCES = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES", "LIST_OF_SUBNETWORKS")
NAT_SUBNET_RANGES = ("ALL_IP_RANGES", "LIST_OF_SECONDARY_IP_RANGES", "PRIMARY_IP_RANGE")
# A firewall rule's protocols by name (or an IP protocol number), and those that take ports.
FIREWALL_PROTOCOLS = ("tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all")
PORT_PROTOCOLS = ("tcp", "udp", "sctp")
PORTS = re.compile(r"(?P<low>\d{1,5})(?:-(?P<high>\d{1,5}))?")
POLICY_TYPES = {t.name for t in compute_v1.ResourcePolicyWorkloadPolicy.Type} - {"UNDEFINED_TYPE"}
NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
PATH = re.compile(
    r"/compute/v1/projects/(?P<project>[^/]+)/(?:global|regions/(?P<region>[^/]+))/(?P<kind>\w+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<verb>wait))?"
)
# What preflight reads: a region (its quotas) and a zonal reservation.
REGION_PATH = re.compile(r"/compute/v1/projects/(?P<project>[^/]+)/regions/(?P<region>[^/]+)")
RESERVATION_PATH = re.compile(
    r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/reservations/"
    r"(?P<name>[^/]+)"
)
BLOCK_PATH = re.compile(
    r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/reservations/"
    r"(?P<name>[^/]+)/reservationBlocks/(?P<block>[^/]+)"
)
SUB_BLOCK_PATH = re.compile(
    r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/reservations/"
    r"(?P<name>[^/]+)/reservationBlocks/(?P<block>[^/]+)/reservationSubBlocks/(?P<sub_block>[^/]+)"
)
MACHINE_TYPE_PATH = re.compile(
    r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/machineTypes/(?P<name>[^/]+)"
)
# TPU machine types (by prefix) and the zones that offer them, North America and Europe, from Cloud TPU's "TPU
# regions and zones" (https://cloud.google.com/tpu/docs/regions-zones): v5e, v5p, v6e and TPU7x.
TPU_MACHINE_ZONES = {
    "ct5lp-hightpu-": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    "ct5p-hightpu-": ("us-central1-a", "us-east5-a"),
    "ct6e-standard-": ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
    "tpu7x-standard-": ("us-central1-c",),
}
# The vCPUs and memory (MB) a machine type reports (``MachineType.guestCpus``, ``memoryMb``). TPU machine types from
# GKE's "Plan TPUs in GKE" tables (https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus); the 4-chip
# ones the catalogue uses, v5e's 1- and 8-chip too. CPU machine types by their series' rule (vCPUs from the name; memory
# per vCPU: N2 and E2 standard 4 GB, N1 standard 3.75 GB: https://cloud.google.com/compute/docs/general-purpose-machines).
TPU_MACHINE_SIZES = {
    "ct5lp-hightpu-1t": (24, 48 * 1024),
    "ct5lp-hightpu-4t": (112, 192 * 1024),
    "ct5lp-hightpu-8t": (224, 384 * 1024),
    "ct5p-hightpu-4t": (208, 448 * 1024),
    "ct6e-standard-1t": (44, 176 * 1024),
    "ct6e-standard-4t": (180, 720 * 1024),
    "ct6e-standard-8t": (180, 1440 * 1024),
    "tpu7x-standard-4t": (224, 960 * 1024),
}
# CPU machine series a region's zones do not offer, of the regions of the catalogue's TPU zones, from Compute Engine's
# "Available regions and zones" table (https://cloud.google.com/compute/docs/regions-zones#available, its machine
# series per zone): us-east5 (Columbus) lists E2, N2, N2D and the newer series, no N1. The other regions' series are
# not modelled (every CPU machine type offered).
CPU_SERIES_ABSENT = {"us-east5": ("n1-",)}
GB_PER_VCPU = {"n2-standard-": 4.0, "e2-standard-": 4.0, "n1-standard-": 3.75}
# Every region's quotas until a test sets them: room for any TPU slice of the catalogue (chips).
DEFAULT_TPU_QUOTA = 4096.0
# The regional TPU quota metrics Compute Engine reports, as google-cloud-compute's ``Quota.Metric`` enum names them
# (compute_v1/types/compute.py); it names none for v5p, v6e or TPU7x, and neither does the emulated region.
TPU_METRICS = (
    "TPU_PODSLICE_V4",
    "PREEMPTIBLE_TPU_PODSLICE_V4",
    "TPU_LITE_DEVICE_V5",
    "PREEMPTIBLE_TPU_LITE_DEVICE_V5",
    "TPU_LITE_PODSLICE_V5",
    "PREEMPTIBLE_TPU_LITE_PODSLICE_V5",
)
# Compute's rate quota groups (metric, limit) by metric name: "Rate quotas for global metrics" at
# https://cloud.google.com/compute/api-quota (1,500 requests a minute each by default).
QUOTA_GROUPS = {
    name: (f"compute.googleapis.com/{name}", limit)
    for name, limit in (
        ("default", "defaultPerMinutePerProject"),
        ("read_requests", "ReadRequestsPerMinutePerProject"),
        ("list_requests", "ListRequestsPerMinutePerProject"),
        ("operation_read_requests", "OperationReadRequestsPerMinutePerProject"),
    )
}
# The code of a failed operation's error when operations on one resource come too often (``operation_rate``).
OPERATION_RATE_EXCEEDED = "RESOURCE_OPERATION_RATE_EXCEEDED"
NETWORK_REF = re.compile(r"(?:.*/compute/v1/)?(?:projects/(?P<project>[^/]+)/)?global/networks/(?P<name>[^/]+)")


@dataclass
class _Op:
    op: dict
    polls_left: int
    on_done: Callable[[], None]
    error: dict | None = None  # error, httpErrorStatusCode, httpErrorMessage of a failed operation


@dataclass
class State:
    networks: dict[str, dict] = field(default_factory=dict)  # "projects/P/global/networks/N" -> resource JSON
    subnetworks: dict[str, dict] = field(default_factory=dict)  # "projects/P/regions/R/subnetworks/N" -> ...
    resource_policies: dict[str, dict] = field(default_factory=dict)  # "projects/P/regions/R/resourcePolicies/N"
    firewalls: dict[str, dict] = field(default_factory=dict)  # "projects/P/global/firewalls/N"
    routers: dict[str, dict] = field(default_factory=dict)  # "projects/P/regions/R/routers/N"
    creating: dict[str, dict] = field(default_factory=dict)  # path -> resource whose insert is running
    deleting: set[str] = field(default_factory=set)  # paths whose delete is running
    operations: dict[str, _Op] = field(default_factory=dict)  # "projects/P/{global,regions/R}/operations/O"
    calls: list[str] = field(default_factory=list)  # method names ("networks.insert", ...), in order
    quotas: dict[tuple[str, str], dict[str, dict]] = field(default_factory=dict)  # (project, region) -> metric -> ...
    reservations: dict[str, dict] = field(default_factory=dict)  # "projects/P/zones/Z/reservations/N" -> resource
    blocks: dict[str, dict] = field(default_factory=dict)  # ".../reservations/N/reservationBlocks/B" -> resource
    withheld: set[tuple[str, str]] = field(default_factory=set)  # (zone, machine type) not offered there
    no_default_network: set[str] = field(default_factory=set)  # projects made without the default network
    requests: dict[tuple[str, str], str] = field(default_factory=dict)  # (project, requestId) -> its operation's path
    rate_limits: dict[str, int] = field(default_factory=dict)  # quota metric ("default", ...) -> requests a minute
    metered: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (project, metric, minute) -> requests


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _scope(params: dict) -> str:
    return f"projects/{params['project']}/" + (f"regions/{params['region']}" if params["region"] else "global")


class ComputeEmulator(HttpEmulator):
    """The service; ``start()`` serves it on 127.0.0.1 over plain HTTP and returns the endpoint."""

    def __init__(self, token: str = "", polls_to_done: int = 2, clock: Callable[[], float] = time.time):
        super().__init__()
        self.clock = clock  # seconds since the epoch: the rate quotas' minutes are its
        self.state = State()
        self.faults: list[Fault] = []
        self.token = token  # when set, requests must carry "Authorization: Bearer <token>"
        self.polls_to_done = polls_to_done
        # (kind "network" / "subnetwork" / "resourcePolicy", path) -> who else uses it, or None
        self.in_use: Callable[[str, str], str | None] = lambda kind, path: None
        self._lock = threading.RLock()
        self._ids = itertools.count(4_000_000_000_000_000_001)

    # ------------------------------------------------------------------ faults and inspection
    def fail(
        self,
        method: str,
        status: int,
        reason: str = "",
        message: str = "",
        times: int = 1,
        when: Callable[[dict], bool] = lambda body: True,
        info: dict | None = None,
    ) -> None:
        """The next ``times`` calls of ``method`` matching ``when`` answer HTTP ``status`` (with ``info``, a
        ``google.rpc.ErrorInfo`` in its details). ``when`` gets the body of an insert, else the URL's fields
        (project, region, kind, name)."""
        self.faults.append(
            Fault(
                method,
                status,
                reason or REASONS.get(status, "error"),
                message or f"Injected HTTP {status} for {method}.",
                times,
                when,
                info=info,
            )
        )

    def rate_limit(self, method: str, times: int = 1, when: Callable[[dict], bool] = lambda body: True) -> None:
        """The next ``times`` calls of ``method`` matching ``when`` are refused as over a rate quota, before they take
        effect, as Compute refuses them (``_rate_refusal``)."""
        error = self._rate_refusal(method)
        self.faults.append(Fault(method, 403, error.reason, error.message, times, when, info=error.info))

    def limit_rate(self, metric: str, per_minute: int) -> None:
        """At most ``per_minute`` requests of the quota group ``metric`` ("default", "read_requests",
        "list_requests", "operation_read_requests": ``QUOTA_GROUPS``) a project in each minute of ``clock``; the
        others of that minute are refused (``_rate_refusal``), before they take effect, and count for nothing."""
        with self._lock:
            self.state.rate_limits[metric] = per_minute

    @staticmethod
    def _quota_group(method: str) -> tuple[str, str]:
        """The rate quota (metric, limit) ``method`` counts against, as Compute's "Rate quotas for global metrics" table
        groups the methods (https://cloud.google.com/compute/api-quota): "Operation read requests" globalOperations.get,
        "Read requests" the other ``*.get``, "List requests" ``*.list``, and "Queries" (``default``) the mutation
        methods. The emulator counts regional methods in the same groups."""
        if method == "globalOperations.get":
            return QUOTA_GROUPS["operation_read_requests"]
        if method.endswith(".get"):
            return QUOTA_GROUPS["read_requests"]
        if method.endswith(".list"):
            return QUOTA_GROUPS["list_requests"]
        return QUOTA_GROUPS["default"]

    def _rate_refusal(self, method: str) -> HttpError:
        """Compute's answer to a request over a rate quota: HTTP 403, the reason ``rateLimitExceeded`` in the domain
        ``usageLimits`` ("Rate Limit Exceeded": https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-
        operation-limits), and the ErrorInfo of a rate quota (google/api/error_reason.proto, RATE_LIMIT_EXCEEDED: its
        service, quota metric and limit; "If the quota is a rate quota, then 403 RATE_LIMIT_EXCEEDED is returned":
        https://cloud.google.com/docs/quotas/troubleshoot). The message's words after the first are the emulator's."""
        metric, limit = self._quota_group(method)
        info = {
            "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {"service": "compute.googleapis.com", "quota_metric": metric, "quota_limit": limit},
        }
        message = f"Rate Limit Exceeded: quota metric '{metric}', limit '{limit}'."
        return HttpError(403, message, "rateLimitExceeded", info, domain="usageLimits")

    def _meter(self, method: str, project: str) -> None:
        """Count the request against its quota group's minute (``limit_rate``), or refuse it (under the lock)."""
        metric = self._quota_group(method)[0].removeprefix("compute.googleapis.com/")
        limit = self.state.rate_limits.get(metric)
        if limit is None:
            return
        key = (project, metric, int(self.clock() // 60))
        if self.state.metered.get(key, 0) >= limit:
            raise self._rate_refusal(method)
        self.state.metered[key] = self.state.metered.get(key, 0) + 1

    def operation_rate(self, method: str, when: Callable[[dict], bool] = lambda body: True, times: int = 1) -> None:
        """The next insert ``method`` matching ``when`` is accepted, and its operation ends DONE with the error Compute
        reports when operations on a resource come too often: the code RESOURCE_OPERATION_RATE_EXCEEDED, "Operation
        rate exceeded for resource '...'. Too frequent operations from the source resource."
        (https://github.com/kubernetes-sigs/gcp-compute-persistent-disk-csi-driver/pull/1847), and HTTP 403
        (https://github.com/googleapis/python-compute/issues/279); nothing is created."""
        self.faults.append(Fault(method, None, OPERATION_RATE_EXCEEDED, "", times, when))

    def lose(
        self, method: str, status: int = 504, times: int = 1, when: Callable[[dict], bool] = lambda body: True
    ) -> None:
        """The next ``times`` calls of ``method`` matching ``when`` take effect, and their answer is lost: the client
        gets HTTP ``status`` instead (a gateway's 504 by default, whose DEADLINE_EXCEEDED "may be returned even if the
        operation has completed successfully": google/rpc/code.proto)."""
        message = f"Injected HTTP {status} for {method}: the answer was lost."
        self.faults.append(Fault(method, status, REASONS.get(status, "error"), message, times, when, lost=True))

    def quota(self, method: str, when: Callable[[dict], bool] = lambda body: True, times: int = 1) -> None:
        """The next insert ``method`` matching ``when`` is accepted, and its operation fails with QUOTA_EXCEEDED."""
        self.faults.append(Fault(method, None, "QUOTA_EXCEEDED", "", times, when))

    def _fault(self, method: str, request: dict) -> Fault | None:
        return take_fault(self.faults, self._lock, method, request)

    def exists(self, path: str) -> bool:
        """Whether the resource at ``path`` (``projects/P/global/networks/N``, ...) exists. Takes no lock: another
        emulator calls it while holding its own."""
        kind = path.split("/")[-2]
        return kind in KINDS and path in self._table(kind)

    def names(self, kind: str) -> list[str]:
        """Names of the existing resources of ``kind`` ("networks", "subnetworks", "resourcePolicies", "firewalls")."""
        with self._lock:
            return sorted(path.rsplit("/", 1)[-1] for path in self._table(kind))

    def set_quota(self, project: str, region: str, metric: str, limit: float, usage: float = 0.0) -> None:
        """The region's quota ``metric`` (``TPU_LITE_PODSLICE_V5``, ...): its limit and what is in use."""
        with self._lock:
            self.state.quotas.setdefault((project, region), {})[metric] = {
                "metric": metric,
                "limit": float(limit),
                "usage": float(usage),
            }

    def hide_quota(self, project: str, region: str, metric: str) -> None:
        """The region lists no quota ``metric`` (one preflight looks for and cannot find)."""
        with self._lock:
            self.state.quotas.setdefault((project, region), {})[metric] = None

    def add_reservation(
        self, project: str, zone: str, name: str, machine_type: str, count: int, in_use: int = 0
    ) -> None:
        """A specific reservation of ``count`` VMs of ``machine_type`` in ``zone``, ``in_use`` of them taken."""
        specific = {
            "count": str(count),
            "inUseCount": str(in_use),
            "instanceProperties": {"machineType": machine_type},
        }
        self._reserve(project, zone, name, specificReservationRequired=True, specificReservation=specific)

    def _reserve(self, project: str, zone: str, name: str, **kind: object) -> None:
        """A READY zonal reservation ``name``, of the ``kind`` its fields say (specific or aggregate)."""
        path = f"projects/{project}/zones/{zone}/reservations/{name}"
        with self._lock:
            self.state.reservations[path] = {
                "kind": "compute#reservation",
                "id": str(next(self._ids)),
                "name": name,
                "selfLink": LINK + path,
                "zone": f"{LINK}projects/{project}/zones/{zone}",
                "creationTimestamp": _now(),
                "status": "READY",
                **kind,
            }

    def add_aggregate_reservation(
        self, project: str, zone: str, name: str, vm_family: str, chips: int, in_use: int = 0
    ) -> None:
        """An aggregate reservation of ``chips`` TPU chips of ``vm_family`` (``VM_FAMILY_CLOUD_TPU_...``), ``in_use`` of
        them taken: the shape of compute_v1's ``AllocationAggregateReservation`` (reserved and in-use resources as
        accelerator counts), the way Cloud TPU capacity is reserved."""
        aggregate = {
            "vmFamily": vm_family,
            "workloadType": "BATCH",
            "reservedResources": [{"accelerator": {"acceleratorCount": chips}}],
            "inUseResources": [{"accelerator": {"acceleratorCount": in_use}}] if in_use else [],
        }
        self._reserve(project, zone, name, aggregateReservation=aggregate)

    def add_reservation_block(self, project: str, zone: str, reservation: str, block: str, count: int, in_use: int = 0):
        """A block of ``count`` VMs in ``reservation`` (which must exist), ``in_use`` of them taken: compute_v1's
        ``ReservationBlock`` (``count``, ``inUseCount``), answered inside a ``ReservationBlocksGetResponse``."""
        parent = f"projects/{project}/zones/{zone}/reservations/{reservation}"
        with self._lock:
            assert parent in self.state.reservations, f"no reservation {parent}"
            self.state.blocks[f"{parent}/reservationBlocks/{block}"] = {
                "kind": "compute#reservationBlock",
                "id": str(next(self._ids)),
                "name": block,
                "selfLink": f"{LINK}{parent}/reservationBlocks/{block}",
                "count": count,
                "inUseCount": in_use,
            }

    def add_reservation_sub_block(
        self, project: str, zone: str, reservation: str, block: str, sub_block: str, count: int, in_use: int = 0
    ):
        """A sub-block of ``count`` VMs in ``block`` (which must exist), ``in_use`` taken: compute_v1's
        ``ReservationSubBlock`` (``count``, ``inUseCount``) in a ``ReservationSubBlocksGetResponse``, read at
        ``.../reservations/R/reservationBlocks/B/reservationSubBlocks/S``
        (https://cloud.google.com/compute/docs/reference/rest/v1/reservationSubBlocks/get)."""
        parent = f"projects/{project}/zones/{zone}/reservations/{reservation}/reservationBlocks/{block}"
        with self._lock:
            assert parent in self.state.blocks, f"no block {parent}"
            self.state.blocks[f"{parent}/reservationSubBlocks/{sub_block}"] = {
                "kind": "compute#reservationSubBlock",
                "id": str(next(self._ids)),
                "name": sub_block,
                "selfLink": f"{LINK}{parent}/reservationSubBlocks/{sub_block}",
                "count": count,
                "inUseCount": in_use,
            }

    def withhold_machine_type(self, zone: str, machine_type: str) -> None:
        """``zone`` does not offer ``machine_type`` (as a zone may lack a CPU series)."""
        with self._lock:
            self.state.withheld.add((zone, machine_type))

    def skip_default_network(self, project: str) -> None:
        """``project`` has no ``default`` network (its organisation skips creating it)."""
        with self._lock:
            self.state.no_default_network.add(project)

    def _machine_type(self, params: dict) -> dict:
        zone, name = params["zone"], params["name"]
        path = f"projects/{params['project']}/zones/{zone}/machineTypes/{name}"
        tpu_zones = next((zones for prefix, zones in TPU_MACHINE_ZONES.items() if name.startswith(prefix)), None)
        absent = CPU_SERIES_ABSENT.get(zone.rsplit("-", 1)[0], ())
        if (
            (zone, name) in self.state.withheld
            or (tpu_zones is not None and zone not in tpu_zones)
            or name.startswith(absent)
        ):
            raise HttpError(404, f"The resource '{path}' was not found")
        cpus, memory_mb = TPU_MACHINE_SIZES.get(name, (0, 0))
        series = next((prefix for prefix in GB_PER_VCPU if name.startswith(prefix)), None)
        if series and name.removeprefix(series).isdigit():
            cpus = int(name.removeprefix(series))
            memory_mb = int(cpus * GB_PER_VCPU[series] * 1024)
        return {
            "kind": "compute#machineType",
            "id": str(abs(hash(name)) % 10**12),
            "name": name,
            "zone": zone,
            "selfLink": LINK + path,
            **({"guestCpus": cpus, "memoryMb": memory_mb} if cpus else {}),
        }

    def _default_network(self, params: dict) -> dict:
        path = f"projects/{params['project']}/global/networks/default"
        if params["project"] in self.state.no_default_network:
            raise HttpError(404, f"The resource '{path}' was not found")
        return {
            "kind": "compute#network",
            "id": str(abs(hash(path)) % 10**12),
            "name": "default",
            "selfLink": LINK + path,
            "autoCreateSubnetworks": True,
            "routingConfig": {"routingMode": "REGIONAL"},
        }

    def mutations(self) -> list[str]:
        """The calls that change something (inserts and deletes), in order."""
        with self._lock:
            return [c for c in self.state.calls if c.endswith((".insert", ".delete"))]

    def _region(self, params: dict) -> dict:
        project, region = params["project"], params["region"]
        quotas = {m: {"metric": m, "limit": DEFAULT_TPU_QUOTA, "usage": 0.0} for m in TPU_METRICS}
        quotas.update(self.state.quotas.get((project, region), {}))
        quotas = {m: q for m, q in quotas.items() if q is not None}
        path = f"projects/{project}/regions/{region}"
        return {
            "kind": "compute#region",
            "id": str(abs(hash(path)) % 10**12),
            "name": region,
            "status": "UP",
            "selfLink": LINK + path,
            "zones": [f"{LINK}projects/{project}/zones/{region}-{z}" for z in "abc"],
            "quotas": list(quotas.values()),
        }

    def _reservation(self, params: dict) -> dict:
        path = f"projects/{params['project']}/zones/{params['zone']}/reservations/{params['name']}"
        if path not in self.state.reservations:
            raise HttpError(404, f"The resource '{path}' was not found")
        return self.state.reservations[path]

    def _block(self, params: dict) -> dict:
        path = (
            f"projects/{params['project']}/zones/{params['zone']}/reservations/{params['name']}"
            f"/reservationBlocks/{params['block']}"
        )
        if params.get("sub_block"):  # a sub-block, kept beside the blocks by its full path
            path += f"/reservationSubBlocks/{params['sub_block']}"
        if path not in self.state.blocks:
            raise HttpError(404, f"The resource '{path}' was not found")
        return {"resource": self.state.blocks[path]}

    def _table(self, kind: str) -> dict[str, dict]:
        return {
            "networks": self.state.networks,
            "subnetworks": self.state.subnetworks,
            "resourcePolicies": self.state.resource_policies,
            "firewalls": self.state.firewalls,
            "routers": self.state.routers,
        }[kind]

    # ------------------------------------------------------------------ serving
    def _serve(self, http: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict]:
        text = body.decode()
        url = urlsplit(http.path)
        method, params = self._route(http.command, url.path)
        with self._lock:
            self.state.calls.append(method)
        if self.token and not authorized(self.token, http.headers.get("Authorization")):
            raise HttpError(401, "Request had invalid authentication credentials.", "authError")
        with self._lock:
            self._meter(method, params["project"])
        try:
            request = json.loads(text) if method.endswith(".insert") else {}
        except ValueError as e:
            raise HttpError(400, f"Invalid JSON payload received. {e}") from None
        fault = self._fault(method, request if method.endswith(".insert") else params)
        if fault and fault.status is not None and not fault.lost:
            domain = "usageLimits" if fault.reason == "rateLimitExceeded" else "global"
            raise HttpError(fault.status, fault.message, fault.reason, fault.info, domain=domain)
        lost, fault = (fault, None) if fault and fault.lost else (None, fault)
        reads = {
            "regions.get": self._region,
            "reservations.get": self._reservation,
            "reservationBlocks.get": self._block,
            "reservationSubBlocks.get": self._block,
        }
        reads["machineTypes.get"] = self._machine_type
        default = method == "networks.get" and params.get("name") == "default" and not params.get("region")
        if default and f"{_scope(params)}/networks/default" not in self.state.networks:
            reads[method] = self._default_network
        if method in reads:
            with self._lock:
                answer = copy.deepcopy(reads[method](params))
        else:
            kind, action = method.split(".")
            handler = self._poll if kind.endswith("Operations") else getattr(self, f"_{action}")
            request_id = self._request_id(dict(parse_qsl(url.query))) if action in ("insert", "delete") else ""
            with self._lock:  # serialised under the lock: the answer may be a stored resource
                seen = self.state.requests.get((params["project"], request_id)) if request_id else None
                if seen:  # the same request again: it takes no effect, and its first operation answers
                    answer = copy.deepcopy(self.state.operations[seen].op)
                else:
                    answer = copy.deepcopy(handler(kind, params, request, fault))
                    if request_id:
                        self._remember(params["project"], request_id, answer)
        if lost:
            raise HttpError(lost.status, lost.message, lost.reason)
        return 200, answer

    @staticmethod
    def _request_id(query: dict) -> str:
        """An insert's or delete's ``requestId``, "a valid UUID with the exception that zero UUID is not supported"
        (compute_v1's ``request_id``), or "" when it has none."""
        value = query.get("requestId", "")
        try:
            valid = not value or uuid.UUID(value).int != 0
        except ValueError:
            valid = False
        if not valid:
            raise HttpError(400, f"Invalid value for field 'requestId': '{value}'. Must be a valid UUID.")
        return value

    def _remember(self, project: str, request_id: str, op: dict) -> None:
        """The operation a request with ``request_id`` started, found again by the id (under the lock)."""
        path = op["selfLink"].removeprefix(LINK)
        self.state.operations[path].op["clientOperationId"] = op["clientOperationId"] = request_id
        self.state.requests[(project, request_id)] = path

    def _route(self, verb: str, path: str) -> tuple[str, dict]:
        for method, pattern in (
            ("regions.get", REGION_PATH),
            ("reservations.get", RESERVATION_PATH),
            ("reservationBlocks.get", BLOCK_PATH),
            ("reservationSubBlocks.get", SUB_BLOCK_PATH),
            ("machineTypes.get", MACHINE_TYPE_PATH),
        ):
            read = pattern.fullmatch(path)
            if read and verb == "GET":
                return method, read.groupdict()
        m = PATH.fullmatch(path)
        kind, action = m and m["kind"], None
        if kind == "operations" and m["name"]:
            action = {("GET", None): "get", ("POST", "wait"): "wait"}.get((verb, m["verb"]))
            kind = "regionOperations" if m["region"] else "globalOperations"
        elif kind in KINDS and (m["region"] is None) == (kind in GLOBAL_KINDS) and not m["verb"]:
            action = {("POST", False): "insert", ("GET", True): "get", ("DELETE", True): "delete"}.get(
                (verb, bool(m["name"]))
            )
            if (verb, bool(m["name"]), kind) == ("GET", False, "routers"):
                action = "list"  # routers.list: a region's routers (https://cloud.google.com/compute/docs/reference/rest/v1/routers/list)
        if not action:
            raise HttpError(404, f"The emulator does not serve {verb} {path}.")
        return f"{kind}.{action}", m.groupdict()

    # ------------------------------------------------------------------ resources
    def _validate(self, kind: str, params: dict, request: dict) -> dict:
        try:
            message = KINDS[kind].from_json(json.dumps(request), ignore_unknown_fields=False)
        except (json_format.ParseError, ValueError, TypeError) as e:
            raise HttpError(400, f"Invalid JSON payload received. {e}") from None
        if not NAME.fullmatch(message.name):
            raise HttpError(
                400,
                f"Invalid value for field 'resource.name': '{message.name}'. Must be a match of "
                "regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
            )
        # A Router's ``region`` is "[Output Only] URI of the region where the router resides" (Compute Engine API,
        # routers resource: https://cloud.google.com/compute/docs/reference/rest/v1/routers): a value sent is not
        # read, the region is the request path's (``_created``); a subnetwork's is input, checked against the path.
        checked = kind not in GLOBAL_KINDS and kind not in OUTPUT_ONLY_REGION
        if checked and "region" in message and message.region.rsplit("/", 1)[-1] != params["region"]:
            raise HttpError(
                400, f"Invalid value for field 'resource.region': '{message.region}'. Must be '{params['region']}'."
            )
        if kind == "networks":
            if "auto_create_subnetworks" in message and message.auto_create_subnetworks:
                raise HttpError(
                    400,
                    "Invalid value for field 'resource.autoCreateSubnetworks': 'true'. "
                    "The emulator serves custom-mode networks only.",
                )
            if "mtu" in message and not 1300 <= message.mtu <= 8896:
                raise HttpError(
                    400, f"Invalid value for field 'resource.mtu': '{message.mtu}'. Must be in the range [1300, 8896]."
                )
        elif kind == "subnetworks":
            network = self._network(message.network, params)
            try:
                cidr = ipaddress.IPv4Network(message.ip_cidr_range)
                assert cidr.prefixlen <= 29
            except (ValueError, AssertionError):
                raise HttpError(
                    400,
                    f"Invalid value for field 'resource.ipCidrRange': '{message.ip_cidr_range}'. Invalid IPCidrRange.",
                ) from None
            for path, other in [*self.state.subnetworks.items(), *self.state.creating.items()]:
                if other.get("network") == LINK + network and cidr.overlaps(ipaddress.ip_network(other["ipCidrRange"])):
                    raise HttpError(
                        400,
                        f"Invalid IPCidrRange: {cidr} conflicts with existing subnetwork "
                        f"'{other['name']}' in region '{path.split('/')[3]}'.",
                    )
            request = {**request, "network": LINK + network}
        elif kind == "routers":
            network = self._network(message.network, params)
            self._validate_nats(request, network, params)
            request = {**request, "network": LINK + network}
        elif kind == "firewalls":
            network = self._network(message.network or "global/networks/default", params)
            self._validate_firewall(request)
            request = {**request, "network": LINK + network}
        elif "workload_policy" in message and message.workload_policy.type_ not in POLICY_TYPES:
            raise HttpError(
                400,
                "Invalid value for field 'resource.workloadPolicy.type': "
                f"'{message.workload_policy.type_}'. Must be one of {sorted(POLICY_TYPES)}.",
            )
        return request

    def _network(self, ref_text: str, params: dict) -> str:
        """The path of the existing network a subnetwork or firewall rule names (404 when there is none)."""
        ref = NETWORK_REF.fullmatch(ref_text)
        if not ref or (ref["project"] or params["project"]) != params["project"]:
            raise HttpError(400, f"Invalid value for field 'resource.network': '{ref_text}'.")
        network = f"projects/{params['project']}/global/networks/{ref['name']}"
        if ref["name"] == "default" and network not in self.state.networks:  # the project's own, made with it
            self._default_network(params)  # 404 where the organisation skips it
            return network
        if network not in self.state.networks:
            raise HttpError(404, f"The resource '{network}' was not found")
        return network

    def _validate_nats(self, router: dict, network: str, params: dict) -> None:
        """A router's Cloud NAT gateways as Compute checks them: known options; MANUAL_ONLY with addresses;
        LIST_OF_SUBNETWORKS with subnetworks, each an existing one of the router's network and region; and no
        subnetwork served by two gateways (a subnetwork's ranges are served by one Cloud NAT gateway at most: Cloud NAT
        overview, https://cloud.google.com/nat/docs/overview)."""

        def invalid(index: int, name: str, value) -> HttpError:
            return HttpError(400, f"Invalid value for field 'resource.nats[{index}].{name}': '{value}'.")

        region = params["region"]
        others = [
            other
            for path, other in self.state.routers.items()
            if other["network"] == LINK + network and path.split("/")[3] == region and other["name"] != router["name"]
        ]
        served = {
            s["name"].removeprefix(LINK): other["name"]
            for other in others
            for nat in other.get("nats", [])
            for s in nat.get("subnetworks", [])
        }
        # A gateway for every subnetwork of the network excludes any other NAT gateway of any router of that network
        # in that region (RouterNat.source_subnetwork_ip_ranges_to_nat: "if this field contains
        # ALL_SUBNETWORKS_ALL_IP_RANGES or ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES, then there should not be any other
        # Router.Nat section in any Router for this network in this region": google-cloud-compute's
        # compute_v1/types/compute.py). The refusal is the reference's; its words here are not documented.
        wide = [
            o["name"]
            for o in others
            for n in o.get("nats", [])
            if n.get("sourceSubnetworkIpRangesToNat") in NAT_SOURCES[:2]
        ]
        mine = router.get("nats", [])
        if mine and (
            wide
            or (
                others
                and any(n.get("sourceSubnetworkIpRangesToNat") in NAT_SOURCES[:2] for n in mine)
                and any(o.get("nats") for o in others)
            )
        ):
            holder = wide[0] if wide else next(o["name"] for o in others if o.get("nats"))
            raise HttpError(
                400,
                f"Router '{holder}' has a NAT for every subnetwork of network '{network}' in region '{region}': no "
                "other NAT may be configured there.",
            )
        for index, nat in enumerate(router.get("nats", [])):
            option = nat.get("natIpAllocateOption", "")
            if option not in NAT_IP_OPTIONS:
                raise invalid(index, "natIpAllocateOption", option)
            if option == "MANUAL_ONLY" and not nat.get("natIps"):
                raise invalid(index, "natIps", [])
            source = nat.get("sourceSubnetworkIpRangesToNat", "")
            if source not in NAT_SOURCES:
                raise invalid(index, "sourceSubnetworkIpRangesToNat", source)
            subnets = nat.get("subnetworks", [])
            if (source == "LIST_OF_SUBNETWORKS") != bool(subnets):
                raise invalid(index, "subnetworks", subnets)
            for entry in subnets:
                path = entry.get("name", "").removeprefix(LINK)
                subnet = self.state.subnetworks.get(path)
                if subnet is None or subnet["network"] != LINK + network or path.split("/")[3] != params["region"]:
                    raise HttpError(404, f"The resource '{path}' was not found")
                for ranges in entry.get("sourceIpRangesToNat", []):
                    if ranges not in NAT_SUBNET_RANGES:
                        raise invalid(index, "subnetworks.sourceIpRangesToNat", ranges)
                if path in served:
                    raise HttpError(
                        400,
                        f"Subnetwork '{path}' is already being used by NAT in router '{served[path]}'.",
                        "resourceInUseByAnotherResource",
                    )

    @staticmethod
    def _validate_firewall(rule: dict) -> None:
        """A firewall rule as Compute checks it: a direction, allowed or denied (not both), known protocols, ports
        only where the protocol has them and in range, sources only on ingress, CIDRs that parse, a priority."""

        def invalid(name: str, value) -> HttpError:
            return HttpError(400, f"Invalid value for field 'resource.{name}': '{value}'.")

        direction = rule.get("direction", "INGRESS")
        if direction not in ("INGRESS", "EGRESS"):
            raise invalid("direction", direction)
        if not 0 <= rule.get("priority", 1000) <= 65535:
            raise invalid("priority", rule["priority"])
        if bool(rule.get("allowed")) == bool(rule.get("denied")):
            raise HttpError(400, "Exactly one of 'resource.allowed' or 'resource.denied' must be specified.")
        action = "allowed" if rule.get("allowed") else "denied"
        for index, entry in enumerate(rule[action]):
            protocol = str(entry.get("IPProtocol", ""))
            if protocol.lower() not in FIREWALL_PROTOCOLS and not (protocol.isdigit() and int(protocol) <= 255):
                raise invalid(f"{action}[{index}].IPProtocol", protocol)
            for port in entry.get("ports", []):
                m = PORTS.fullmatch(port)
                if (
                    protocol.lower() not in (*PORT_PROTOCOLS, "all")
                    or not m
                    or int(m["low"]) > 65535
                    or int(m["high"] or m["low"]) > 65535
                    or int(m["high"] or m["low"]) < int(m["low"])
                ):
                    raise invalid(f"{action}[{index}].ports", port)
        if direction == "EGRESS" and (rule.get("sourceRanges") or rule.get("sourceTags")):
            raise HttpError(400, "Source ranges and source tags apply to INGRESS firewall rules only.")
        for key in ("sourceRanges", "destinationRanges"):
            for cidr in rule.get(key, []):
                try:
                    ipaddress.ip_network(cidr)
                except ValueError:
                    raise invalid(key, cidr) from None

    def _insert(self, kind: str, params: dict, request: dict, fault: Fault | None) -> dict:
        resource = self._validate(kind, params, request)
        path = f"{_scope(params)}/{kind}/{resource['name']}"
        if path in self._table(kind) or path in self.state.creating:
            raise HttpError(409, f"The resource '{path}' already exists", "alreadyExists")
        error = None
        if fault is not None and fault.reason == OPERATION_RATE_EXCEEDED:
            message = (
                f"Operation rate exceeded for resource '{path}'. Too frequent operations from the source resource."
            )
            error = {
                "error": {"errors": [{"code": OPERATION_RATE_EXCEEDED, "message": message}]},
                "httpErrorStatusCode": 403,
                "httpErrorMessage": "FORBIDDEN",
            }
        elif fault is not None:
            where = f"in region {params['region']}" if params["region"] else "globally"
            error = {
                "error": {
                    "errors": [
                        {
                            "code": "QUOTA_EXCEEDED",
                            "message": f"Quota '{QUOTA_METRIC[kind]}' exceeded.  Limit: 0.0 {where}.",
                        }
                    ]
                },
                "httpErrorStatusCode": 403,
                "httpErrorMessage": "FORBIDDEN",
            }
        self.state.creating[path] = resource

        def done():
            self.state.creating.pop(path, None)
            if error is None:
                self._created(kind, path, resource)

        return self._op(params, "insert", path, done, error)

    def _created(self, kind: str, path: str, resource: dict) -> None:
        resource.update(
            kind=f"compute#{SINGULAR[kind]}", id=str(next(self._ids)), selfLink=LINK + path, creationTimestamp=_now()
        )
        if kind not in GLOBAL_KINDS:
            resource["region"] = LINK + path.split(f"/{kind}/")[0]
        if kind == "firewalls":
            resource.setdefault("direction", "INGRESS")
            resource.setdefault("priority", 1000)
            resource.setdefault("disabled", False)
            resource.setdefault("logConfig", {"enable": False})
            if resource["direction"] == "INGRESS" and not resource.get("sourceTags"):
                resource.setdefault("sourceRanges", ["0.0.0.0/0"])
        if kind == "networks":
            resource.setdefault("mtu", 1460)
            resource.setdefault("routingConfig", {"routingMode": "REGIONAL"})
            resource.setdefault("networkFirewallPolicyEnforcementOrder", "AFTER_CLASSIC_FIREWALL")
            resource["subnetworks"] = []
        if kind == "subnetworks":
            cidr = ipaddress.IPv4Network(resource["ipCidrRange"])
            resource.update(
                gatewayAddress=str(cidr.network_address + 1),
                fingerprint=resource["id"][-8:],
                state="READY",
                stackType=resource.get("stackType", "IPV4_ONLY"),
            )
            resource.setdefault("privateIpGoogleAccess", False)
            network = self.state.networks.get(resource["network"].removeprefix(LINK))  # the default one: not stored
            if network is not None:
                network["subnetworks"].append(LINK + path)
        if kind == "resourcePolicies":
            resource["status"] = "READY"
        self._table(kind)[path] = resource

    def _list(self, kind: str, params: dict, request: dict, fault: Fault | None) -> dict:
        """A region's resources of ``kind``, as a list's ``items`` (RouterList: ``items``, no page token while they
        fit one page of the default 500)."""
        scope = f"{_scope(params)}/{kind}/"
        return {"items": [r for path, r in sorted(self._table(kind).items()) if path.startswith(scope)]}

    def _get(self, kind: str, params: dict, request: dict, fault: Fault | None) -> dict:
        path = f"{_scope(params)}/{kind}/{params['name']}"
        if path not in self._table(kind):
            raise HttpError(404, f"The resource '{path}' was not found")
        return self._table(kind)[path]

    def _delete(self, kind: str, params: dict, request: dict, fault: Fault | None) -> dict:
        resource = self._get(kind, params, request, fault)
        path = resource["selfLink"].removeprefix(LINK)
        if path in self.state.deleting:
            raise HttpError(400, f"The resource '{path}' is not ready", "resourceNotReady")
        users = [
            p
            for p, s in [*self.state.subnetworks.items(), *self.state.firewalls.items(), *self.state.creating.items()]
            if kind == "networks" and s.get("network") == LINK + path
        ]
        users += [  # a subnetwork a Cloud NAT gateway serves
            p
            for p, r in self.state.routers.items()
            if kind == "subnetworks"
            for nat in r.get("nats", [])
            if any(s.get("name", "").removeprefix(LINK) == path for s in nat.get("subnetworks", []))
        ]
        user = users[0] if users else self.in_use(SINGULAR[kind], path)
        if user:
            raise HttpError(
                400,
                f"The {SINGULAR[kind]} resource '{path}' is already being used by '{user}'",
                "resourceInUseByAnotherResource",
            )
        self.state.deleting.add(path)
        if kind == "resourcePolicies":
            resource["status"] = "DELETING"

        def done():
            self.state.deleting.discard(path)
            self._table(kind).pop(path, None)
            network = self.state.networks.get(resource.get("network", "").removeprefix(LINK))
            if kind == "subnetworks" and network:
                network["subnetworks"].remove(LINK + path)

        return self._op(params, "delete", path, done)

    # ------------------------------------------------------------------ operations
    def _op(
        self, params: dict, op_type: str, target: str, on_done: Callable[[], None], error: dict | None = None
    ) -> dict:
        op_id = str(next(self._ids))
        name = f"operation-{op_id}"
        path = f"{_scope(params)}/operations/{name}"
        op = {
            "kind": "compute#operation",
            "id": op_id,
            "name": name,
            "operationType": op_type,
            "targetLink": LINK + target,
            "status": "PENDING",
            "progress": 0,
            "insertTime": _now(),
            "selfLink": LINK + path,
        }
        if params["region"]:
            op["region"] = LINK + _scope(params)
        entry = self.state.operations[path] = _Op(op, self.polls_to_done, on_done, error)
        if entry.polls_left <= 0:
            self._finish(entry)
        return dict(op)

    def _finish(self, entry: _Op) -> None:
        entry.on_done()
        entry.op.update(status="DONE", progress=100, endTime=_now(), **(entry.error or {}))

    def _poll(self, kind: str, params: dict, request: dict, fault: Fault | None) -> dict:
        path = f"{_scope(params)}/operations/{params['name']}"
        entry = self.state.operations.get(path)
        if entry is None:
            raise HttpError(404, f"The resource '{path}' was not found")
        if entry.op["status"] != "DONE":
            entry.polls_left -= 1
            if entry.polls_left <= 0:
                self._finish(entry)
            else:
                entry.op.update(status="RUNNING", startTime=entry.op.get("startTime", _now()))
        return entry.op
