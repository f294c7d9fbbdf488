"""Where a gke run's nodes and pods may reach (``components.platforms.gke.plan.network``): a cluster the run creates has
private nodes on a subnetwork of its own with Private Google Access, a Cloud NAT gateway only when the run needs the
internet, and NetworkPolicies that limit what its pods send; the emulated GKE and Compute Engine refuse what the real
APIs refuse of them; an existing cluster with public nodes is a preflight warning naming the risk."""

from __future__ import annotations

import json

import pytest
from google.api_core import exceptions as gexc
from google.cloud import container_v1

from components.platforms.gke.cloud import compute as gke_compute
from components.platforms.gke.cloud.cluster import cluster_manager
from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import manifests, network, resources
from components.platforms.gke.plan.target import target
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT, PROJECT_NUMBER
from tests.gke.test_gke_platform import context, platform
from tests.gke.test_preflight import PARENT, SHARED, _team_cluster, preflight_cli

IN_REGISTRY = ONE_SLICE.replace("gke.image=local/torch", f"gke.image=us-east5-docker.pkg.dev/{PROJECT}/tpupipe/torch:1")


def _records(preset: str, overrides: str) -> dict[str, list]:
    spec = resolve(preset, f"gke.project={PROJECT} {overrides}")
    found: dict[str, list] = {}
    for res in plan.resources(spec, "r1"):
        found.setdefault(res.kind, []).append(res)
    return found


def test_the_plan_of_a_new_cluster_has_private_nodes_on_its_own_subnetwork_before_the_cluster():
    spec = resolve("gemma4-e2b-v6e-16", f"gke.project={PROJECT}")
    t = target(spec, "r1")
    body = resources.cluster(spec, t)
    assert body["networkConfig"]["defaultEnablePrivateNodes"] is True
    assert "privateClusterConfig" not in body  # the deprecated spelling: GKE refuses both at once
    assert body["ipAllocationPolicy"]["useIpAliases"] is True  # VPC-native, as private nodes need
    assert body["subnetwork"] == "r1-nodes"
    listed = plan.resources(spec, "r1")
    kinds = [(res.kind, res.name) for res in listed]
    assert kinds.index(("subnetwork", "r1-nodes")) < kinds.index(("gke-cluster", "tpupipe-r1"))
    (subnet,) = [res for res in listed if res.name == "r1-nodes"]
    assert subnet.body["privateIpGoogleAccess"] is True
    assert subnet.body["network"] == f"projects/{PROJECT}/global/networks/default"
    assert subnet.path == f"projects/{PROJECT}/regions/us-east5/subnetworks/r1-nodes" and subnet.deleted_by_teardown
    (cluster,) = [res for res in listed if res.kind == "gke-cluster"]
    assert "private nodes (no external addresses)" in cluster.summary
    autopilot = resources.cluster(*_spec_and_target("gemma4-e2b-v6e-16", "gke.cluster_mode=autopilot"))
    assert autopilot["networkConfig"] == {"defaultEnablePrivateNodes": True} and autopilot["subnetwork"] == "r1-nodes"


def _spec_and_target(preset: str, overrides: str):
    spec = resolve(preset, f"gke.project={PROJECT} {overrides}")
    return spec, target(spec, "r1")


@pytest.mark.parametrize(
    ("preset", "overrides", "why"),
    [
        # the token only in the pods (gke.hf_secret, the default): they read a gated model the train stage cannot
        ("gemma4-e2b-v6e-16", "", "the pods may read google/gemma-4-E2B-it from the Hugging Face hub with the token"),
        (
            "gemma4-e2b-v6e-16",
            f"gke.hf_token_secret=projects/{PROJECT}/secrets/hf gke.image=docker.io/me/torch:1",
            "the nodes pull docker.io/me/torch:1 from a registry",
        ),
    ],
)
def test_a_cloud_nat_gateway_is_planned_only_when_the_run_needs_the_internet_and_serves_its_subnetwork_alone(
    preset, overrides, why
):
    found = _records(preset, overrides)
    (nat,) = found["cloud-nat"]
    assert why in nat.summary and nat.api == "compute.routers.insert" and nat.deleted_by_teardown
    assert nat.path == f"projects/{PROJECT}/regions/us-east5/routers/r1-nat"
    assert "region" not in nat.body  # output only in a Router: the request path's region
    (gateway,) = nat.body["nats"]
    assert gateway["sourceSubnetworkIpRangesToNat"] == "LIST_OF_SUBNETWORKS"
    assert gateway["subnetworks"] == [
        {"name": f"projects/{PROJECT}/regions/us-east5/subnetworks/r1-nodes", "sourceIpRangesToNat": ["ALL_IP_RANGES"]}
    ]


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        # FSDP: the weights fetched on the components' side (the token from Secret Manager), the hub dataset
        # snapshotted by the first stage (components.data.hub), the image in Artifact Registry
        ("gemma4-e2b-v6e-16", f"gke.hf_token_secret=projects/{PROJECT}/secrets/hf"),
        ("gemma4-e2b-v6e-16", f"gke.hf_token_secret=projects/{PROJECT}/secrets/hf train.dataset=generated"),
        # MaxText builds its model from maxtext.model_name: train.model_id names no file its pods read
        ("llama3-8b-v6e-16x2", ""),
        # a model built from a config reads nothing, whoever holds the token
        ("gemma4-e2b-v6e-16", "train.model_id=scratch:gemma4-tiny"),
    ],
)
def test_no_nat_when_google_apis_are_all_the_run_reaches_and_nothing_for_an_existing_cluster(preset, overrides):
    found = _records(preset, overrides)
    assert "cloud-nat" not in found and "r1-nodes" in [r.name for r in found["subnetwork"]]
    (cluster,) = found["gke-cluster"]
    assert "Private Google Access only: no route out but to Google's APIs and services (App Engine" in cluster.summary
    shared = _records(preset, f"{overrides} gke.cluster_name=team")
    assert "cloud-nat" not in shared and "r1-nodes" not in [r.name for r in shared.get("subnetwork", [])]


def test_the_run_pods_egress_is_dns_the_metadata_server_https_out_and_one_another():
    spec, t = _spec_and_target("gemma4-e2b-v6e-16", "")
    (egress,) = [p for p in manifests.network_policies(t) if "Egress" in p["spec"]["policyTypes"]]
    assert egress["metadata"]["name"] == "r1-egress" and egress["metadata"]["labels"] == {"tpupipe-run": "r1"}
    assert egress["spec"]["podSelector"] == {"matchLabels": {"tpupipe-run": "r1"}}
    rules = egress["spec"]["egress"]
    assert rules[0] == {"to": [{"podSelector": {"matchLabels": {"tpupipe-run": "r1"}}}]}  # Ray, every port
    allowed = {
        (json.dumps(rule["to"], sort_keys=True), p["protocol"], p["port"]) for rule in rules[1:] for p in rule["ports"]
    }
    system = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
    dns_pods = json.dumps(
        [{**system, "podSelector": {"matchLabels": {"k8s-app": app}}} for app in ("kube-dns", "node-local-dns")],
        sort_keys=True,
    )
    metadata = json.dumps([{"ipBlock": {"cidr": "169.254.169.254/32"}}], sort_keys=True)
    wi = json.dumps([{"ipBlock": {"cidr": "169.254.169.252/32"}}], sort_keys=True)
    # NodeLocal DNSCache (default on Autopilot, and on Standard from 1.34.1-gke.3720000) answers at 169.254.20.10
    node_local = json.dumps([{"ipBlock": {"cidr": "169.254.20.10/32"}}], sort_keys=True)
    dns = {(to, proto, 53) for to in (dns_pods, metadata, node_local) for proto in ("UDP", "TCP")}
    assert dns | {(metadata, "TCP", 80), (wi, "TCP", 988)} <= allowed
    (https,) = [rule for rule in rules if rule.get("ports") == [{"protocol": "TCP", "port": 443}]]
    block = https["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0" and {"10.0.0.0/8", "172.16.0.0/12", "169.254.0.0/16"} <= set(block["except"])
    assert {p for _, _, p in allowed} == {53, 80, 988, 443}  # nothing else leaves the run
    objects = manifests.all_objects(spec, t)
    kinds = [o["kind"] for o in objects]
    assert kinds.count("NetworkPolicy") == 3 and kinds.index("NetworkPolicy") < kinds.index("RayCluster")


# ---------------------------------------------------------------- against the emulated project

LOCATION = f"projects/{PROJECT}/locations/us-east5-b"


def _create(client, body: dict):
    return client.create_cluster(parent=LOCATION, cluster=container_v1.Cluster.from_json(json.dumps(body)))


def test_the_emulated_gke_refuses_what_gke_refuses_of_private_nodes(project_factory):
    project_factory()
    client = cluster_manager()
    spec = resolve("local-fsdp", IN_REGISTRY)
    t = target(spec, "r1")
    body = json.loads(json.dumps(resources.cluster(spec, t)).replace("PROJECT_NUMBER", PROJECT_NUMBER))
    with pytest.raises(gexc.InvalidArgument, match="subnetworks/r1-nodes not found"):
        _create(client, body)  # the run's subnetwork must exist first: provision makes it before the cluster
    body.pop("subnetwork")
    both = {**body, "privateClusterConfig": {"enablePrivateNodes": True}}
    with pytest.raises(gexc.InvalidArgument, match="Cannot specify both"):
        _create(client, both)
    not_native = {**body, "ipAllocationPolicy": {"useIpAliases": False}}
    with pytest.raises(gexc.InvalidArgument, match="VPC-native"):
        _create(client, not_native)
    _create(client, body)  # the plan's body, on the default subnetwork: accepted


def test_provision_makes_the_subnetwork_and_nat_before_the_cluster_and_teardown_deletes_them(tmp_path, project_factory):
    project = project_factory()
    ctx = context(tmp_path, "pn")  # gke.image=local/torch: a registry outside Google, so the run needs the NAT
    platform().provision(ctx)
    subnet = f"projects/{PROJECT}/regions/us-east5/subnetworks/pn-nodes"
    router = f"projects/{PROJECT}/regions/us-east5/routers/pn-nat"
    assert project.compute.state.subnetworks[subnet]["privateIpGoogleAccess"] is True
    assert project.compute.state.subnetworks[subnet]["ipCidrRange"] == network.node_range("pn")
    (gateway,) = project.compute.state.routers[router]["nats"]
    assert gateway["subnetworks"][0]["name"] == subnet
    calls = project.compute.state.calls
    assert calls.index("subnetworks.insert") < calls.index("routers.insert")
    cluster = project.gke.state.clusters[project.clusters("pn")[0]]
    assert cluster.network_config.default_enable_private_nodes and cluster.subnetwork == "pn-nodes"
    # Compute refuses a second gateway for the same subnetwork, and deleting a subnetwork a cluster or gateway uses
    compute = gke_compute.Compute(gke_compute.clients(), log=lambda m: None, poll_s=0.01)
    other = {**project.compute.state.routers[router], "name": "other"}
    other = {k: v for k, v in other.items() if k in ("name", "network", "region", "nats")}
    with pytest.raises(gexc.BadRequest, match="already being used by NAT"):
        compute.ensure("router", f"projects/{PROJECT}/regions/us-east5/routers/other", other, lambda k, n: None)
    with pytest.raises(gexc.BadRequest, match="already being used"):
        compute.delete("subnetwork", subnet)
    result = platform().teardown(ctx)
    assert router in result["deleted"] and subnet in result["deleted"]
    assert result["deleted"].index(router) < result["deleted"].index(subnet)  # the gateway holds its subnetwork
    assert project.compute.state.routers == {} and subnet not in project.compute.state.subnetworks
    assert project.leftovers("pn") == {}


def test_the_emulated_compute_reads_no_region_from_a_router_body_as_it_is_output_only(project_factory):
    project = project_factory()
    compute = gke_compute.Compute(gke_compute.clients(), log=lambda m: None, poll_s=0.01)
    path = f"projects/{PROJECT}/regions/us-east5/routers/elsewhere"
    body = {"name": "elsewhere", "network": f"projects/{PROJECT}/global/networks/default", "region": "europe-west4"}
    compute.ensure("router", path, body, lambda k, n: None)  # accepted: the value sent is not read
    assert project.compute.state.routers[path]["region"].endswith(f"projects/{PROJECT}/regions/us-east5")


def test_an_existing_cluster_without_private_nodes_is_a_warning_naming_the_risk(project_factory, capsys):
    project = project_factory()
    _team_cluster(project)
    code, text = preflight_cli(SHARED, capsys)
    assert code == 0, text
    assert "warning: cluster team does not have private nodes: its nodes have external IP addresses" in text
    assert "--enable-private-nodes" in text and "leave gke.cluster_name empty" in text
    project.gke.state.clusters.clear()
    _team_cluster(project, networkConfig={"datapathProvider": "ADVANCED_DATAPATH", "defaultEnablePrivateNodes": True})
    code, text = preflight_cli(SHARED, capsys)
    assert code == 0 and "does not have private nodes" not in text, text
    assert PARENT == LOCATION


def test_the_dry_runs_teardown_deletes_the_nat_router_after_the_cluster_and_before_its_subnetwork(tmp_path):
    from components.platforms import RunContext
    from components.platforms.gke import GkePlatform
    from components.platforms.store import LocalStore

    spec = resolve("gemma4-e2b-v6e-16", f"gke.project={PROJECT}")  # the token in the pods alone: the run gets a NAT
    ctx = RunContext(spec=spec, run_id="r1", store=LocalStore(tmp_path), platform="gke")
    deletes = [line.split()[1] for line in GkePlatform().dry_run(ctx, lambda mode: mode) if "delete " in line]
    cluster, router = deletes.index("container.clusters.delete"), deletes.index("compute.routers.delete")
    assert cluster < router < deletes.index("compute.subnetworks.delete")


# ---------------------------------------------------------------- the network's routers: one NAT per subnet, 5 routers

REGION = f"projects/{PROJECT}/regions/us-east5"
NETWORK = f"projects/{PROJECT}/global/networks/default"


def _router(name: str, nats: list[dict] | None = None) -> None:
    compute = gke_compute.Compute(gke_compute.clients(), log=lambda m: None, poll_s=0.01)
    compute.ensure("router", f"{REGION}/routers/{name}", {"name": name, "network": NETWORK, "nats": nats or []}, print)


WIDE = [
    {
        "name": "all",
        "natIpAllocateOption": "AUTO_ONLY",
        "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
    }
]


def test_a_nat_that_serves_every_subnetwork_is_used_not_duplicated_and_left_by_teardown(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    _router("team", WIDE)
    with pytest.raises(gexc.BadRequest, match="no other NAT may be configured"):  # Compute's rule, the emulator's too
        _router("other", [{**WIDE[0], "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES"}])
    code, text = preflight_cli(ONE_SLICE, capsys)  # a registry outside Google: the run needs a NAT
    assert code == 0 and "Cloud NAT team/all serves every subnetwork of the default network: the run uses it" in text
    ctx = context(tmp_path, "pn")
    platform().provision(ctx)
    assert sorted(project.compute.state.routers) == [f"{REGION}/routers/team"]  # no pn-nat beside it
    assert platform().teardown(ctx)["deleted"] and f"{REGION}/routers/team" in project.compute.state.routers
    assert project.leftovers("pn") == {}


def test_a_run_that_needs_no_nat_is_warned_that_a_network_wide_nat_lets_its_pods_out(project_factory, capsys):
    project_factory()
    _router("team", WIDE)
    no_nat = ONE_SLICE.replace("gke.image=local/torch", f"gke.image=us-east5-docker.pkg.dev/{PROJECT}/tpupipe/torch:1")
    code, text = preflight_cli(no_nat, capsys)
    assert code == 0, text
    assert (
        "warning: Cloud NAT team/all serves every subnetwork of the default network in us-east5, the run's too" in text
    )
    assert "LIST_OF_SUBNETWORKS" in text


def test_a_run_that_needs_a_sixth_router_on_the_network_is_refused_before_anything(tmp_path, project_factory, capsys):
    from components.platforms.gke.checks.preflight import PreflightFailed

    project = project_factory()
    for i in range(network.ROUTERS_PER_NETWORK):
        _router(f"vpn{i}")  # routers without NAT (Cloud VPN, Interconnect) count as well
    code, text = preflight_cli(ONE_SLICE, capsys)
    assert code == 2, text
    assert "VPC network default: the default network has 5 Cloud Routers in us-east5" in text
    assert "router/quotas" in text and "gke.image" in text and "gke.hf_token_secret" in text
    before = project.mutations()
    with pytest.raises(PreflightFailed, match="5 Cloud Routers"):
        platform().provision(context(tmp_path, "pre"))
    assert project.mutations() == before and project.leftovers("pre") == {}  # provision's first step: nothing made
    project.compute.state.routers.pop(f"{REGION}/routers/vpn0")
    code, text = preflight_cli(ONE_SLICE, capsys)
    assert code == 0 and "routers of the default network in us-east5: 4, room for pre-nat" in text
