"""The Compute Engine side of the gke platform, through google-cloud-compute
(docs/architecture.md, "Cloud calls through the client libraries"): the extra VPC networks, subnets and firewall
rules that carry DCN traffic between slices (``gke.multislice_network=dcn_networks``) and the workload policy that
places TPU7x multi-host slices (their bodies: ``compute_resources``), and the subnetwork of the private nodes of a
cluster the run creates with, when the run needs the internet, its Cloud Router and NAT gateway (``network``).

Same contract as the GKE adapter (``cluster``): get-or-create (what exists is reused, a
``409 alreadyExists`` is a reuse), the resource recorded before the run waits on it, the operation polled with
progress and a deadline, transient answers retried with backoff (``components.cloud.errors.is_transient``), Compute's
403 rate limit with a backoff past the minute its quota refills in, as is an operation that ended rate limited
(``OPERATION_RATE_CODES``: asked for again), quota errors a :class:`CapacityError`. Compute operations cannot be
cancelled: an interrupt (SIGINT, SIGTERM) stops the wait, and teardown deletes what the run recorded.

Every insert and delete carries a ``request_id``, one UUID per operation asked for, the same on each of its
tries: "Specify a unique request ID so that if you must retry your request, the server will know to ignore the request
if it has already been completed" (compute_v1's ``InsertNetworkRequest.request_id`` and the other Insert/Delete
requests, google/cloud/compute_v1/types/compute.py at 1.57.0). A try that took effect but whose answer was an error
(a ``504``, DEADLINE_EXCEEDED's HTTP mapping, "may be returned even if the operation has completed successfully":
google/rpc/code.proto) is asked again, and the retry gets that first operation back, which is waited on: not a
``409`` on a resource still being created, nor a ``404`` on one still being deleted.

Resources are named by path, ``projects/P/global/networks/N``, ``projects/P/regions/R/subnetworks/N``,
``projects/P/global/firewalls/N``, ``projects/P/regions/R/resourcePolicies/N``; the bodies are the REST JSON that
``compute_resources`` makes. ``google.cloud.compute_v1`` is imported inside functions.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from components.cloud.credentials import credentials, google_client
from components.cloud.errors import Adapter, CapacityError, GkeError, RateLimited, is_capacity_error
from components.platforms.interrupts import on_interrupt, signal_name

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

# The codes of a failed operation's errors (``Operation.error.errors[].code``) that a rate limit on the resource the
# operation works from ends: "operation operation-... failed (RESOURCE_OPERATION_RATE_EXCEEDED): Operation rate
# exceeded for resource '...'. Too frequent operations from the source resource." (an operation polled to its end:
# https://github.com/kubernetes-sigs/gcp-compute-persistent-disk-csi-driver/pull/1847, which maps it to
# ResourceExhausted; google-cloud-compute raises such an operation as a bare 403 FORBIDDEN, the code in the
# operation's errors only: https://github.com/googleapis/python-compute/issues/279). Nothing was done, and a new
# request may do it once the rate refills: the operation is asked for again (:class:`RateLimited`), with the adapter's
# rate-limit backoff.
OPERATION_RATE_CODES = frozenset({"RESOURCE_OPERATION_RATE_EXCEEDED"})
# The Compute Engine REST endpoint of an emulator (http://host:port); unset, the clients talk to
# compute.googleapis.com.
EMULATOR_HOST_ENV = "TPUPIPE_COMPUTE_EMULATOR_HOST"


@dataclass(frozen=True)
class Kind:
    client: str  # attribute of Clients
    message: str  # compute_v1 message type of the body
    field: str  # the request field that names the resource (``network=``) and, + "_resource", carries the body


KINDS = {
    "network": Kind("networks", "Network", "network"),
    "subnetwork": Kind("subnetworks", "Subnetwork", "subnetwork"),
    "resource_policy": Kind("resource_policies", "ResourcePolicy", "resource_policy"),
    "firewall": Kind("firewalls", "Firewall", "firewall"),
    "router": Kind("routers", "Router", "router"),  # a Cloud Router and its Cloud NAT gateway (plan.network)
}


@dataclass(frozen=True)
class Clients:
    networks: Any
    subnetworks: Any
    resource_policies: Any
    firewalls: Any
    global_operations: Any
    region_operations: Any
    routers: Any  # the Cloud Router and NAT gateway of ``network``


def client(name: str, creds: Credentials) -> Any:
    """One compute_v1 client (``RegionsClient``, ``ReservationsClient``, ``MachineTypesClient``, ...) at the endpoint
    the adapter uses: preflight's reads."""
    from google.cloud import compute_v1

    return google_client(getattr(compute_v1, name), EMULATOR_HOST_ENV, creds=creds)


def clients(creds: Credentials | None = None) -> Clients:
    """The compute_v1 clients: to the emulator named by $TPUPIPE_COMPUTE_EMULATOR_HOST, else to Google. Operations
    are polled with the operations clients made here (same endpoint), not through the ExtendedOperation an insert
    returns, whose own operations client always goes to Google's endpoint."""
    creds = creds or credentials()
    names = {
        "networks": "NetworksClient",
        "subnetworks": "SubnetworksClient",
        "resource_policies": "ResourcePoliciesClient",
        "firewalls": "FirewallsClient",
        "global_operations": "GlobalOperationsClient",
        "region_operations": "RegionOperationsClient",
        "routers": "RoutersClient",
    }
    return Clients(**{field: client(name, creds) for field, name in names.items()})


def _request(kind: str, resource_path: str) -> dict[str, str]:
    """``projects/P/regions/R/subnetworks/N`` -> {project: P, region: R, subnetwork: N}."""
    parts = resource_path.split("/")
    request = {"project": parts[1], KINDS[kind].field: parts[-1]}
    if parts[2] == "regions":
        request["region"] = parts[3]
    return request


class Compute(Adapter["Clients"]):
    """Get-or-create, wait, delete for the run's Compute Engine resources. ``record(kind, path)`` is called with
    every resource this run starts creating, before anything waits on it (the ledger)."""

    def __init__(self, clients: Clients, **options: Any) -> None:
        super().__init__(clients, **{"operation_timeout_s": 600.0, "poll_s": 2.0, **options})

    def _client(self, kind: str) -> Any:
        return getattr(self.client, KINDS[kind].client)

    def get(self, kind: str, resource_path: str) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return self.call(
                f"get {kind} {resource_path}", lambda: self._client(kind).get(**_request(kind, resource_path))
            )
        except gexc.NotFound:
            return None

    def ensure(self, kind: str, resource_path: str, body: dict[str, Any], record: Callable[[str, str], None]) -> None:
        """The resource ``body`` describes at ``resource_path``: reused if it exists, else created and waited on (the
        insert's ``request_id`` the same on every try: a retry gets the operation its first try started). An operation
        that ends in a rate limit (``OPERATION_RATE_CODES``) did nothing: a new insert, with a new ``request_id``, after
        the rate-limit backoff."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        if self.get(kind, resource_path) is not None:
            self.log(f"{kind} {resource_path} exists: reusing it")
            return
        record(kind, resource_path)
        request: dict[str, Any] = _request(kind, resource_path)
        request.pop(KINDS[kind].field)
        request[KINDS[kind].field + "_resource"] = getattr(compute_v1, KINDS[kind].message).from_json(json.dumps(body))
        short = resource_path.rsplit("/", 1)[-1]

        def create() -> None:
            try:
                op = self.call(
                    f"create {kind} {short}",
                    functools.partial(self._client(kind).insert, request={**request, "request_id": str(uuid.uuid4())}),
                )
            except gexc.Conflict:
                self.log(f"{kind} {resource_path} already exists: reusing it")
                return
            except (gexc.Forbidden, gexc.ResourceExhausted) as exc:
                if is_capacity_error(exc.message) or isinstance(exc, gexc.ResourceExhausted):
                    raise CapacityError(exc.message) from exc
                raise
            self.log(f"creating {kind} {resource_path}")
            self.wait(resource_path, op.name, f"create {kind} {short}")

        self.call(f"create {kind} {short}", create)  # again, a new request, when the operation ends rate limited

    def delete(self, kind: str, resource_path: str) -> bool:
        """Delete and wait (again, a new request, when the operation ends in a rate limit, as ``ensure``); False when it
        was already gone."""
        from google.api_core import exceptions as gexc

        def remove() -> bool:
            request = {**_request(kind, resource_path), "request_id": str(uuid.uuid4())}  # the same on every try
            try:
                op = self.call(
                    f"delete {kind} {resource_path}", functools.partial(self._client(kind).delete, request=request)
                )
            except gexc.NotFound:
                return False
            self.log(f"deleting {kind} {resource_path}")
            self.wait(resource_path, op.name, f"delete {kind} {resource_path.rsplit('/', 1)[-1]}")
            return True

        return self.call(f"delete {kind} {resource_path}", remove)  # again when the operation ends rate limited

    def wait(self, resource_path: str, operation: str, what: str) -> None:
        """Poll the operation (global or regional, as the resource is) until DONE, with progress and a deadline;
        its error mapped to a meaning."""
        from google.cloud import compute_v1

        parts = resource_path.split("/")
        if parts[2] == "regions":
            client, request = self.client.region_operations, {"project": parts[1], "region": parts[3]}
        else:
            client, request = self.client.global_operations, {"project": parts[1]}
        started = self.clock()

        def stop(signum: int) -> None:
            self.log(
                f"  {what}: {signal_name(signum)}: no longer waiting on operation {operation} (Compute operations "
                "cannot be cancelled; teardown deletes what the run recorded)"
            )

        def poll() -> Any:
            current = self.call(f"get operation {operation}", lambda: client.get(operation=operation, **request))
            return current if current.status == compute_v1.Operation.Status.DONE else None

        with on_interrupt(stop, log=self.log):
            done = self.poll_until(poll, f"{what} (operation {operation})", every_s=30, running=what)
        errors = "; ".join(f"{e.code}: {e.message}" for e in done.error.errors)
        if errors or done.http_error_status_code:
            message = f"{done.http_error_status_code} {done.http_error_message}: {errors}".strip()
            if is_capacity_error(message):
                raise CapacityError(message)
            if any(e.code in OPERATION_RATE_CODES for e in done.error.errors):
                raise RateLimited(f"{what}: operation {operation} failed: {message}")
            raise GkeError(f"{what}: operation {operation} failed: {message}")
        self.log(f"  {what}: done in {self.clock() - started:.1f}s")


# A Cloud NAT gateway that serves every subnetwork of its network in its region (Compute's
# RouterNat.SourceSubnetworkIpRangesToNat, google-cloud-compute's compute_v1/types/compute.py): it serves a run's
# subnetwork too, and no other gateway may be configured beside it there.
NETWORK_WIDE = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES")


def network_routers(routers: Any, project: str, region: str, network: str) -> list[Any]:
    """The Cloud Routers of ``network`` (its name) in ``region`` (``RoutersClient.list``, every page)."""
    return [
        r for r in routers.list(project=project, region=region) if r.network.endswith(f"/global/networks/{network}")
    ]


def network_wide_nat(routers: list[Any], other_than: str = "") -> str:
    """``router/gateway`` of a NAT gateway among ``routers`` (but the router ``other_than``) that serves every
    subnetwork of their network, or ""."""
    for router in routers:
        for nat in router.nats:
            if router.name != other_than and nat.source_subnetwork_ip_ranges_to_nat in NETWORK_WIDE:
                return f"{router.name}/{nat.name}"
    return ""


__all__ = [
    "KINDS",
    "NETWORK_WIDE",
    "OPERATION_RATE_CODES",
    "Clients",
    "Compute",
    "clients",
    "network_routers",
    "network_wide_nat",
]
