"""The Compute Engine emulator through the real google-cloud-compute clients (REST over HTTP): networks, subnetworks,
firewall rules and resource policies with their operations, Compute's validation and error shapes, injected faults."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exceptions
from google.cloud import compute_v1
from google.oauth2.credentials import Credentials

from tests.emulators.compute import LINK, ComputeEmulator

PROJECT, REGION, TOKEN = "tpupipe-emulated", "us-east5", "t0ken"
NET = f"projects/{PROJECT}/global/networks/net-a"


def wire_operations(client, credentials, client_options) -> None:
    """Point the operations client that ``client``'s ExtendedOperations poll with at ``client_options``' endpoint
    (the transport builds it from the credentials alone), so ``op.result()`` works against the emulator here."""
    services = client.transport._extended_operations_services
    for key, cls in (
        ("global_operations", compute_v1.GlobalOperationsClient),
        ("region_operations", compute_v1.RegionOperationsClient),
    ):
        services[key] = cls(credentials=credentials, client_options=client_options)


class Clients:
    def __init__(self, endpoint: str, credentials):
        opts = ClientOptions(api_endpoint=endpoint)
        self.networks = compute_v1.NetworksClient(credentials=credentials, client_options=opts)
        self.subnets = compute_v1.SubnetworksClient(credentials=credentials, client_options=opts)
        self.policies = compute_v1.ResourcePoliciesClient(credentials=credentials, client_options=opts)
        self.firewalls = compute_v1.FirewallsClient(credentials=credentials, client_options=opts)
        for client in (self.networks, self.subnets, self.policies, self.firewalls):
            wire_operations(client, credentials, opts)

    def network(self, name: str = "net-a", **fields):
        body = compute_v1.Network(name=name, auto_create_subnetworks=False, **fields)
        return self.networks.insert(project=PROJECT, network_resource=body)

    def subnet(self, name: str = "sub-a", cidr: str = "10.0.0.0/24", network: str = NET):
        body = compute_v1.Subnetwork(name=name, network=network, ip_cidr_range=cidr, region=REGION)
        return self.subnets.insert(project=PROJECT, region=REGION, subnetwork_resource=body)

    def firewall(self, name: str = "fw-a", network: str = NET, **fields):
        fields.setdefault("allowed", [compute_v1.Allowed(I_p_protocol="tcp")])
        body = compute_v1.Firewall(name=name, network=network, **fields)
        return self.firewalls.insert(project=PROJECT, firewall_resource=body)

    def policy(self, name: str = "pol-a", kind: str = "HIGH_THROUGHPUT"):
        body = compute_v1.ResourcePolicy(
            name=name, workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_=kind, accelerator_topology="2x2x2")
        )
        return self.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=body)


@pytest.fixture
def compute():
    emulator = ComputeEmulator(token=TOKEN)
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture
def clients(compute):
    return Clients(compute.endpoint, Credentials(token=TOKEN))


def test_network_and_subnetwork_lifecycle(compute, clients):
    op = clients.network(mtu=8896)
    assert op.status == compute_v1.Operation.Status.PENDING and op.operation_type == "insert"
    with pytest.raises(exceptions.NotFound):  # not there until the insert is done
        clients.networks.get(project=PROJECT, network="net-a")
    op.result(timeout=10)
    assert op.done() and op.status == compute_v1.Operation.Status.DONE
    network = clients.networks.get(project=PROJECT, network="net-a")
    assert network.mtu == 8896 and network.self_link == LINK + NET and network.id

    op = clients.subnet(network=LINK + NET)
    assert op.region == f"{LINK}projects/{PROJECT}/regions/{REGION}"
    op.result(timeout=10)
    subnet = clients.subnets.get(project=PROJECT, region=REGION, subnetwork="sub-a")
    assert subnet.network == LINK + NET and subnet.ip_cidr_range == "10.0.0.0/24"
    assert subnet.gateway_address == "10.0.0.1" and subnet.state == "READY"
    assert clients.networks.get(project=PROJECT, network="net-a").subnetworks == [subnet.self_link]

    with pytest.raises(exceptions.BadRequest, match="sub-a") as info:
        clients.networks.delete(project=PROJECT, network="net-a")
    assert info.value.errors[0]["reason"] == "resourceInUseByAnotherResource"

    clients.subnets.delete(project=PROJECT, region=REGION, subnetwork="sub-a").result(timeout=10)
    op = clients.networks.delete(project=PROJECT, network="net-a")
    assert clients.networks.get(project=PROJECT, network="net-a").name == "net-a"  # readable while deleting
    op.result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        clients.networks.get(project=PROJECT, network="net-a")
    assert compute.names("networks") == [] and compute.names("subnetworks") == []
    assert compute.state.calls[:3] == ["networks.insert", "networks.get", "globalOperations.get"]
    assert "regionOperations.get" in compute.state.calls


def test_validation_and_error_classes(compute, clients):
    clients.network().result(timeout=10)
    with pytest.raises(exceptions.Conflict) as info:
        clients.network()
    assert info.value.errors[0]["reason"] == "alreadyExists"
    pending = clients.network("net-b")
    with pytest.raises(exceptions.Conflict):  # the name is taken while the insert runs
        clients.network("net-b")
    pending.result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        clients.networks.get(project=PROJECT, network="nope")
    with pytest.raises(exceptions.BadRequest, match="mtu"):
        clients.network("net-c", mtu=9000)
    with pytest.raises(exceptions.BadRequest, match="name"):
        clients.network("Net_C")
    with pytest.raises(exceptions.BadRequest, match="autoCreateSubnetworks"):
        clients.networks.insert(
            project=PROJECT, network_resource=compute_v1.Network(name="net-c", auto_create_subnetworks=True)
        )

    raw = requests.post(
        f"{compute.endpoint}/compute/v1/projects/{PROJECT}/global/networks",
        json={"name": "net-c", "autoCreateSubnetworks": False, "bogusField": 1},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert raw.status_code == 400 and raw.json()["error"]["errors"][0]["reason"] == "invalid"
    assert "bogusField" in raw.json()["error"]["message"]

    clients.subnet(network=f"projects/{PROJECT}/global/networks/net-a").result(timeout=10)
    with pytest.raises(exceptions.BadRequest, match="conflicts with existing subnetwork 'sub-a'"):
        clients.subnet("sub-b", cidr="10.0.0.128/25", network="global/networks/net-a")
    clients.subnet("sub-b", cidr="10.0.0.0/24", network="global/networks/net-b").result(timeout=10)  # other network
    with pytest.raises(exceptions.BadRequest, match="ipCidrRange"):
        clients.subnet("sub-c", cidr="10.1.0.1/24")
    with pytest.raises(exceptions.NotFound):
        clients.subnet("sub-c", cidr="10.1.0.0/24", network="global/networks/missing")
    with pytest.raises(exceptions.BadRequest, match="region"):
        clients.subnets.insert(
            project=PROJECT,
            region="europe-west4",
            subnetwork_resource=compute_v1.Subnetwork(
                name="sub-c", network=NET, ip_cidr_range="10.1.0.0/24", region=REGION
            ),
        )
    assert compute.names("subnetworks") == ["sub-a", "sub-b"]


def test_firewall_rules_are_global_checked_as_compute_checks_them_and_hold_their_network(compute, clients):
    clients.network().result(timeout=10)
    op = clients.firewall(
        source_ranges=["10.50.0.0/16"], allowed=[compute_v1.Allowed(I_p_protocol=p) for p in ("tcp", "udp", "icmp")]
    )
    assert op.operation_type == "insert" and not op.region  # a global operation
    op.result(timeout=10)
    rule = clients.firewalls.get(project=PROJECT, firewall="fw-a")
    assert rule.network == LINK + NET and rule.direction == "INGRESS" and rule.priority == 1000
    assert list(rule.source_ranges) == ["10.50.0.0/16"] and [a.I_p_protocol for a in rule.allowed] == [
        "tcp",
        "udp",
        "icmp",
    ]
    assert rule.self_link == f"{LINK}projects/{PROJECT}/global/firewalls/fw-a"
    assert "globalOperations.get" in compute.state.calls and "regionOperations.get" not in compute.state.calls
    with pytest.raises(exceptions.Conflict):
        clients.firewall()

    bad = [
        (dict(allowed=[], denied=[]), "Exactly one of"),
        (dict(denied=[compute_v1.Denied(I_p_protocol="tcp")]), "Exactly one of"),  # with the default allowed
        (dict(allowed=[compute_v1.Allowed(I_p_protocol="tcpx")]), "allowed\\[0\\].IPProtocol"),
        (dict(allowed=[compute_v1.Allowed(I_p_protocol="icmp", ports=["80"])]), "ports"),
        (dict(allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["70000"])]), "ports"),
        (dict(direction="SIDEWAYS"), "direction"),
        (dict(direction="EGRESS", source_ranges=["10.0.0.0/8"]), "INGRESS firewall rules only"),
        (dict(source_ranges=["10.50.0.1/16"]), "sourceRanges"),
        (dict(priority=70000), "priority"),
    ]
    for fields, message in bad:
        with pytest.raises(exceptions.BadRequest, match=message):
            clients.firewall("fw-b", **fields)
    with pytest.raises(exceptions.NotFound):
        clients.firewall("fw-b", network=f"projects/{PROJECT}/global/networks/missing")

    with pytest.raises(exceptions.BadRequest, match="fw-a") as info:  # the rule holds its network
        clients.networks.delete(project=PROJECT, network="net-a")
    assert info.value.errors[0]["reason"] == "resourceInUseByAnotherResource"
    clients.firewalls.delete(project=PROJECT, firewall="fw-a").result(timeout=10)
    clients.networks.delete(project=PROJECT, network="net-a").result(timeout=10)
    assert compute.names("firewalls") == [] and compute.names("networks") == []

    compute.quota("firewalls.insert")
    clients.network().result(timeout=10)
    with pytest.raises(exceptions.Forbidden) as info:
        clients.firewall().result(timeout=10)
    assert info.value.errors[0].message == "Quota 'FIREWALLS' exceeded.  Limit: 0.0 globally."


def test_resource_policies_and_the_in_use_hook(compute, clients):
    op = clients.policy()
    waited = requests.post(
        f"{compute.endpoint}/compute/v1/projects/{PROJECT}/regions/{REGION}/operations/{op.name}/wait",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert waited.json()["status"] == "RUNNING" and compute.state.calls[-1] == "regionOperations.wait"
    op.result(timeout=10)
    policy = clients.policies.get(project=PROJECT, region=REGION, resource_policy="pol-a")
    assert policy.workload_policy.type_ == "HIGH_THROUGHPUT" and policy.workload_policy.accelerator_topology == "2x2x2"
    assert policy.status == "READY"
    with pytest.raises(exceptions.BadRequest, match="workloadPolicy.type"):
        clients.policy("pol-b", kind="LOW_LATENCY")

    path = f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/pol-a"
    compute.in_use = lambda kind, p: "node pool np-1" if (kind, p) == ("resourcePolicy", path) else None
    with pytest.raises(exceptions.BadRequest, match="node pool np-1") as info:
        clients.policies.delete(project=PROJECT, region=REGION, resource_policy="pol-a")
    assert info.value.errors[0]["reason"] == "resourceInUseByAnotherResource"
    compute.in_use = lambda kind, p: None
    clients.policies.delete(project=PROJECT, region=REGION, resource_policy="pol-a").result(timeout=10)
    assert compute.names("resourcePolicies") == []


def test_injected_http_errors_are_not_retried_on_insert(compute, clients):
    compute.fail("networks.insert", 503, times=2)
    for _ in range(2):
        with pytest.raises(exceptions.ServiceUnavailable):
            clients.network()
    clients.network().result(timeout=10)
    assert compute.state.calls.count("networks.insert") == 3

    compute.fail("networks.get", 503, times=1)  # get is retried by the client on 503
    assert clients.networks.get(project=PROJECT, network="net-a").name == "net-a"
    assert compute.state.calls.count("networks.get") == 2

    compute.fail(
        "subnetworks.delete",
        403,
        message="Required 'compute.subnetworks.delete' permission",
        when=lambda request: request["name"] == "sub-x",
    )
    with pytest.raises(exceptions.Forbidden, match="compute.subnetworks.delete"):
        clients.subnets.delete(project=PROJECT, region=REGION, subnetwork="sub-x")


def test_quota_failure_ends_the_operation(compute, clients):
    clients.network().result(timeout=10)
    compute.quota("subnetworks.insert")
    op = clients.subnet()
    with pytest.raises(exceptions.Forbidden, match="FORBIDDEN") as info:
        op.result(timeout=10)
    assert op.done() and op.error_code == 403 and op.error_message == "FORBIDDEN"
    assert op.error.errors[0].code == "QUOTA_EXCEEDED"
    assert op.error.errors[0].message == f"Quota 'SUBNETWORKS' exceeded.  Limit: 0.0 in region {REGION}."
    assert info.value.errors[0].code == "QUOTA_EXCEEDED"
    assert compute.names("subnetworks") == []
    clients.subnet().result(timeout=10)  # the quota fault was used up
    assert compute.names("subnetworks") == ["sub-a"]


class StaleCredentials(Credentials):
    """Credentials whose refresh keeps the same (wrong) token."""

    def refresh(self, request):
        pass


def test_token_is_required(compute):
    with pytest.raises(auth_exceptions.RefreshError):  # static-token credentials cannot refresh after the 401
        Clients(compute.endpoint, Credentials(token="wrong")).networks.get(project=PROJECT, network="net-a")
    with pytest.raises(exceptions.Unauthorized):
        Clients(compute.endpoint, StaleCredentials(token="wrong")).networks.get(project=PROJECT, network="net-a")
    raw = requests.get(f"{compute.endpoint}/compute/v1/projects/{PROJECT}/global/networks/net-a", timeout=10)
    assert raw.status_code == 401 and raw.json()["error"]["errors"][0]["reason"] == "authError"


def test_a_rate_limit_is_a_403_with_its_reasons_and_takes_no_effect(compute, clients):
    """Compute's rate limit: HTTP 403, reason rateLimitExceeded, the ErrorInfo of a rate quota; api_core raises it as
    Forbidden with the JSON's errors and the ErrorInfo's reason."""
    compute.rate_limit("networks.insert")
    with pytest.raises(exceptions.Forbidden) as refused:
        clients.network()
    assert refused.value.errors[0]["reason"] == "rateLimitExceeded"
    assert refused.value.reason == "RATE_LIMIT_EXCEEDED" and refused.value.domain == "googleapis.com"
    assert refused.value.metadata["quota_metric"] == "compute.googleapis.com/default"
    assert compute.state.operations == {} and compute.names("networks") == []
    clients.network().result(timeout=10)  # the fault was used up
    assert compute.names("networks") == ["net-a"]


def insert_network(clients, request_id: str):
    body = compute_v1.Network(name="net-a", auto_create_subnetworks=False)
    return clients.networks.insert(request={"project": PROJECT, "network_resource": body, "request_id": request_id})


def test_a_repeated_request_id_answers_the_first_operation_and_takes_no_effect(compute, clients):
    import uuid

    request_id = str(uuid.uuid4())
    first = insert_network(clients, request_id)
    again = insert_network(clients, request_id)  # no 409: the same request, ignored
    assert again.name == first.name and compute.mutations() == ["networks.insert", "networks.insert"]
    assert len(compute.state.operations) == 1
    assert again.client_operation_id == request_id
    again.result(timeout=10)
    assert insert_network(clients, request_id).status == compute_v1.Operation.Status.DONE  # as the operation is now
    with pytest.raises(exceptions.Conflict):  # another request id: another request, refused
        insert_network(clients, str(uuid.uuid4()))
    for invalid in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(exceptions.BadRequest, match="requestId"):
            insert_network(clients, invalid)
    assert compute.names("networks") == ["net-a"] and len(compute.state.operations) == 1


def test_a_lost_answer_took_effect_and_a_retry_with_its_request_id_finds_its_operation(compute, clients):
    import uuid

    request_id = str(uuid.uuid4())
    compute.lose("networks.insert")
    with pytest.raises(exceptions.GatewayTimeout):
        insert_network(clients, request_id)
    assert compute.state.creating  # it took effect: the network is being created
    op = insert_network(clients, request_id)
    op.result(timeout=10)
    assert compute.names("networks") == ["net-a"] and len(compute.state.operations) == 1
    compute.lose("networks.delete", status=503)
    delete = {"project": PROJECT, "network": "net-a", "request_id": str(uuid.uuid4())}
    with pytest.raises(exceptions.ServiceUnavailable):
        clients.networks.delete(request=delete)
    gone = clients.networks.delete(request=delete)  # not 400 resourceNotReady: the delete it started
    assert gone.operation_type == "delete"
    gone.result(timeout=10)
    assert compute.names("networks") == []


def test_a_rate_quota_refuses_past_its_limit_until_the_next_synchronized_minute():
    """Compute counts each quota group's requests per minute and refills it at the start of the next minute
    (https://cloud.google.com/compute/api-quota): past the limit a request is refused as a rate limit and takes no
    effect; another group is counted apart; at the next minute the quota is whole again."""
    now = [60 * 1000 + 30.0]  # half a minute into a minute
    emulator = ComputeEmulator(token=TOKEN, clock=lambda: now[0])
    emulator.start()
    try:
        clients = Clients(emulator.endpoint, Credentials(token=TOKEN))
        emulator.limit_rate("default", 2)
        clients.network("net-a")
        clients.network("net-b")
        with pytest.raises(exceptions.Forbidden) as refused:
            clients.network("net-c")
        assert refused.value.errors[0]["reason"] == "rateLimitExceeded"
        assert refused.value.errors[0]["domain"] == "usageLimits"
        assert refused.value.reason == "RATE_LIMIT_EXCEEDED"
        assert refused.value.metadata["quota_limit"] == "defaultPerMinutePerProject"
        assert "net-c" not in str(emulator.state.creating) and len(emulator.state.operations) == 2
        clients.networks.get(project=PROJECT, network="default")  # read_requests: its own group
        now[0] += 29.0  # still the same minute
        with pytest.raises(exceptions.Forbidden):
            clients.network("net-c")
        now[0] += 1.0  # the next minute
        clients.network("net-c")
        assert len(emulator.state.operations) == 3
    finally:
        emulator.stop()


def test_an_operation_that_ends_rate_limited_made_nothing(compute, clients):
    compute.polls_to_done = 1
    compute.operation_rate("networks.insert")
    op = clients.network()
    with pytest.raises(exceptions.Forbidden):  # as google-cloud-compute raises it: the code is in the operation only
        op.result(timeout=10)
    done = clients.networks.transport._extended_operations_services["global_operations"].get(
        project=PROJECT, operation=op.name
    )
    assert [e.code for e in done.error.errors] == ["RESOURCE_OPERATION_RATE_EXCEEDED"]
    assert done.http_error_status_code == 403 and compute.names("networks") == []
    clients.network().result(timeout=10)
    assert compute.names("networks") == ["net-a"]
