"""Where a gke run's nodes and pods may reach: private nodes, the way out they get, and the egress of the run's pods.

- A cluster the run creates has private nodes: internal addresses only, nothing on the internet reaches them and they
  reach it only through a Cloud NAT gateway (GKE docs, "About network isolation in GKE", private nodes:
  https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation). The container v1 API names it
  ``Cluster.network_config.default_enable_private_nodes`` (google-cloud-container's
  ``container_v1/types/cluster_service.py``, ``NetworkConfig``: "Controls whether by default nodes have private IP
  addresses only"; ``PrivateClusterConfig.enable_private_nodes`` is the deprecated spelling, and setting both is
  invalid). Private clusters are VPC-native (GKE docs, "Creating a private cluster", Restrictions:
  https://cloud.google.com/kubernetes-engine/docs/how-to/legacy/network-isolation), as the run's always are.
- Their nodes take their addresses from a subnetwork of the project's ``default`` network that the run creates
  (``node_subnet``) with Private Google Access on (``Subnetwork.privateIpGoogleAccess``: "VMs in this subnet can access
  Google services without assigned external IP addresses", https://cloud.google.com/vpc/docs/private-google-access):
  Cloud Storage, Artifact Registry, the metadata server's tokens, and, as the same page's Specifications say, the
  external addresses App Engine serves, third parties' App Engine apps included; no route to anything else.
- No pod of a run needs the internet for what the pipeline's own stages can fetch: a hub ``train.dataset`` is
  snapshotted by the first stage into the run's prefix (``components.data.hub``), and a hub model's base weights are
  copied and checked by the train stage into the cache (``components.stages.base_weights``); MaxText builds its model
  from ``maxtext.model_name`` and reads no hub file. Only two cases need more than Google's APIs (``internet_needs``):
  the Hugging Face token only the pods hold (``gke.hf_secret`` without ``gke.hf_token_secret``), with which they read
  a gated model the train stage could not; and a trainer image outside Google's registries, which the nodes pull.
  Then the run creates a Cloud Router with a Cloud NAT gateway (``cloud_nat``) that serves the run's subnetwork
  alone (``LIST_OF_SUBNETWORKS``: https://cloud.google.com/nat/docs/set-up-manage-network-address-translation;
  Compute's ``RouterNat`` in google-cloud-compute's ``compute_v1/types/compute.py``), so one run's gateway never
  serves another run's nodes. Teardown deletes both after the cluster (they are Compute resources of the run's plan).
  A network has at most 5 Cloud Routers in a region, whatever the quota (``ROUTERS_PER_NETWORK``): preflight refuses
  a run that needs a sixth before anything is created. A gateway already there that serves every subnetwork of the
  network serves the run's too, and Compute takes no other gateway beside it: the run uses it and creates none, and
  a run that needs no NAT is warned that its pods reach the internet through it (``network_wide_nat_risk``).
- The run's pods may send only what the run needs (``egress_policy``): DNS, the metadata server, HTTPS to addresses
  outside the private ranges, and anything to the run's own pods (Ray). Kubernetes NetworkPolicy is by address and
  port, not by host name (https://kubernetes.io/docs/concepts/services-networking/network-policies/), and Google's
  APIs answer on many public addresses, so HTTPS out is one rule: with no NAT, a packet from a node without an
  external address leaves the VPC only to Google's APIs and services (Private Google Access,
  https://cloud.google.com/vpc/docs/private-google-access), so that rule reaches those and no other host. They are not
  only the run's own: "Private Google Access also allows access to the external IP addresses used by App Engine,
  including third-party App Engine-based services" (https://cloud.google.com/vpc/docs/configure-private-google-access,
  Specifications), so a pod can send to anyone's App Engine app, as it can write to another project's bucket.
  What closes both is the restricted VIP, ``restricted.googleapis.com`` (199.36.153.4/30), which serves only the APIs
  VPC Service Controls supports, with a Cloud DNS private zone mapping ``*.googleapis.com`` to it and egress to other
  addresses refused (this rule narrowed to that range, or the network's default route replaced by one to it), inside
  a VPC Service Controls perimeter (https://cloud.google.com/vpc-service-controls/docs/private-connectivity,
  https://cloud.google.com/vpc-service-controls/docs/overview). The zone is bound to the whole network and changes
  where every VM of the shared ``default`` network resolves Google's APIs
  (https://cloud.google.com/vpc/docs/configure-private-google-access, DNS configuration), and the perimeter is an
  organisation's: the run makes neither.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import TYPE_CHECKING, Any

from components.platforms.gke.plan import paths
from components.platforms.gke.plan.target import Target
from components.spec import RunSpec, names

if TYPE_CHECKING:  # the message preflight reads a cluster as; this layer imports no client
    from google.cloud.container_v1 import Cluster

# The nodes' subnetwork: a /22 (1,020 nodes) of NODE_RANGES picked by the run id, outside the default network's
# auto-mode subnets (10.128.0.0/9: https://cloud.google.com/vpc/docs/subnets#ip-ranges) and the 10.0.0.0/8 ranges
# GKE picks Pod and Service ranges from. Two runs that draw the same block meet Compute's overlap refusal at insert.
NODE_RANGES = ipaddress.ip_network("172.20.0.0/14")
NODE_PREFIX = 22
DEFAULT_NETWORK = "default"
# The registries whose images private nodes pull with Private Google Access alone (Artifact Registry and Container
# Registry are Google APIs: https://cloud.google.com/vpc/docs/private-google-access#pga-supported).
GOOGLE_REGISTRIES = ("-docker.pkg.dev/", "gcr.io/")
# Private and link-local ranges (RFC 1918, RFC 6598's shared space, link-local): HTTPS to these is not "out" but
# another workload of the VPC or the node, which a run's pods have no business with.
INTERNAL_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16")
# The GKE metadata server as pods see it with Workload Identity Federation for GKE: 169.254.169.254 port 80, and on
# GKE 1.21.0-gke.1000 and later 169.254.169.252 port 988 (GKE docs, "Control communication between Pods and Services
# using network policies", Requirements and limitations:
# https://cloud.google.com/kubernetes-engine/docs/how-to/network-policy). DNS: kube-dns in kube-system (GKE labels its
# pods k8s-app=kube-dns), or, with Cloud DNS for GKE, the metadata server's address on port 53
# (https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-dns).
# NodeLocal DNSCache (on by default on Autopilot, and on Standard from 1.34.1-gke.3720000:
# https://cloud.google.com/kubernetes-engine/docs/how-to/nodelocal-dns-cache) answers pods' DNS from a DaemonSet's
# pods labelled k8s-app=node-local-dns in kube-system (Kubernetes' cluster/addons/dns/nodelocaldns/nodelocaldns.yaml)
# that run with hostNetwork and listen on the link-local 169.254.20.10; a pod selector alone may not match a
# hostNetwork pod, so the address is allowed by an ipBlock too (cluster/addons/dns/nodelocaldns/README.md, "Network
# policy and DNS connectivity": https://github.com/kubernetes/kubernetes/tree/v1.34.0/cluster/addons/dns/nodelocaldns).
# Named resolvers on port 53, not any destination: port 53 is no channel to an arbitrary host.
NODE_LOCAL_DNS = "169.254.20.10/32"
DNS_PODS = ("kube-dns", "node-local-dns")
DNS_PORTS = (("UDP", 53), ("TCP", 53))
METADATA = (
    ("169.254.169.254/32", (("TCP", 80), *DNS_PORTS)),
    ("169.254.169.252/32", (("TCP", 988),)),
    (NODE_LOCAL_DNS, DNS_PORTS),
)
HTTPS = 443
# Cloud Routers per VPC network per region: 5, a system limit that no quota raises (Cloud Router, "Quotas and
# limits": https://cloud.google.com/network-connectivity/docs/router/quotas).
ROUTERS_PER_NETWORK = 5
PRIVATE_NODES_DOC = "https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation"


def node_range(run_id: str) -> str:
    """The nodes' subnetwork range of the run: a block of ``NODE_RANGES`` drawn from the run id's hash."""
    blocks = 2 ** (NODE_PREFIX - NODE_RANGES.prefixlen)
    index = int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % blocks
    return str(list(NODE_RANGES.subnets(new_prefix=NODE_PREFIX))[index])


def internet_needs(spec: RunSpec, t: Target) -> list[str]:
    """Why the run's nodes or pods need the internet (a Cloud NAT gateway); empty: Google's APIs are all they reach.
    Only the FSDP trainer reads a hub model (MaxText builds its own), and its pods read it from the hub themselves
    only where they alone hold the Hugging Face token (``gke.hf_secret`` without ``gke.hf_token_secret``: the train
    stage cannot copy a gated model then). Every dataset is snapshotted on the pipeline's side."""
    from components.workload.weights import is_hub_name

    out = []
    pods_hold_token = spec.gke.hf_secret and not spec.gke.hf_token_secret  # else the components' side fetches
    if spec.train.workload != "maxtext" and is_hub_name(spec.train.model_id) and pods_hold_token:
        out.append(
            f"the pods may read {spec.train.model_id} from the Hugging Face hub with the token only they hold "
            f"(gke.hf_secret={spec.gke.hf_secret} without gke.hf_token_secret)"
        )
    if not any(registry in t.image for registry in GOOGLE_REGISTRIES):
        out.append(f"the nodes pull {t.image} from a registry outside Google")
    return out


def node_subnet(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """The ``Subnetwork`` body of the nodes' subnetwork of a cluster the run creates (None for an existing one)."""
    if not t.owns_cluster:
        return None
    return {
        "name": names.node_subnet(t.run_id),
        "network": paths.compute_path("network", t.project, t.region, DEFAULT_NETWORK),
        "region": t.region,
        "ipCidrRange": node_range(t.run_id),
        "privateIpGoogleAccess": True,
        "description": f"{names.RUN_LABEL}={t.run_id}",
    }


def cloud_nat(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """The ``Router`` body, with its one Cloud NAT gateway, of a cluster the run creates whose run needs the internet
    (``internet_needs``): automatically allocated addresses, serving the nodes' subnetwork (every range of it: node
    and Pod addresses) and nothing else. No ``region``: a Router's is output only, the request path's
    (https://cloud.google.com/compute/docs/reference/rest/v1/routers). None when the run needs none."""
    if not t.owns_cluster or not internet_needs(spec, t):
        return None
    subnet = paths.compute_path("subnetwork", t.project, t.region, names.node_subnet(t.run_id))
    return {
        "name": names.nat_router(t.run_id),
        "network": paths.compute_path("network", t.project, t.region, DEFAULT_NETWORK),
        "description": f"{names.RUN_LABEL}={t.run_id}",
        "nats": [
            {
                "name": names.nat_router(t.run_id),
                "natIpAllocateOption": "AUTO_ONLY",
                "sourceSubnetworkIpRangesToNat": "LIST_OF_SUBNETWORKS",
                "subnetworks": [{"name": subnet, "sourceIpRangesToNat": ["ALL_IP_RANGES"]}],
            }
        ],
    }


def no_internet(spec: RunSpec, t: Target) -> str | None:
    """Why the run's pods cannot reach the internet (a cluster the run creates, given no Cloud NAT: ``cloud_nat``);
    None where they may (an existing cluster is the user's to route)."""
    if not t.owns_cluster or cloud_nat(spec, t) is not None:
        return None
    return (
        f"the run's cluster has private nodes and no Cloud NAT (it needs none by its spec: {summary(spec, t)}), so its "
        f"pods have no route to any host outside Google's, the hub's among them ({PRIVATE_NODES_DOC})"
    )


def network_wide_nat_risk(gateway: str, region: str) -> str:
    """Preflight's warning for a run that needs no NAT on a network whose NAT ``gateway`` serves every subnetwork."""
    return (
        f"Cloud NAT {gateway} serves every subnetwork of the default network in {region}, the run's too: its pods "
        "reach any host on the internet over HTTPS, not only Google's APIs; to keep them off it, serve a list of "
        "subnetworks with that gateway (sourceSubnetworkIpRangesToNat=LIST_OF_SUBNETWORKS: "
        "https://cloud.google.com/nat/docs/set-up-manage-network-address-translation)"
    )


def routers_full(routers: list[str], region: str) -> str:
    """Preflight's refusal of a run that needs a Cloud Router of its own where the network has no room for one."""
    return (
        f"the default network has {len(routers)} Cloud Routers in {region} ({', '.join(sorted(routers))}), the most "
        f"a network may have in a region ({ROUTERS_PER_NETWORK}, whatever the quota: "
        "https://cloud.google.com/network-connectivity/docs/router/quotas), and the run needs one for its Cloud NAT: "
        "put the trainer image in Artifact Registry (gke.image), give the pipeline the Hugging Face token "
        "(gke.hf_token_secret), or delete a router (or end a run that holds one)"
    )


def private_nodes(body: dict[str, Any], t: Target) -> None:
    """Private nodes, on the run's subnetwork, in the ``Cluster`` body of a cluster the run creates."""
    body["subnetwork"] = names.node_subnet(t.run_id)
    body.setdefault("networkConfig", {})["defaultEnablePrivateNodes"] = True


def has_private_nodes(cluster: Cluster) -> bool:
    """Whether an existing cluster (a ``container_v1.Cluster``) gives its nodes internal addresses only, by either
    spelling of the API."""
    return bool(
        cluster.network_config.default_enable_private_nodes or cluster.private_cluster_config.enable_private_nodes
    )


def public_nodes_risk(short: str) -> str:
    """Preflight's warning for an existing cluster ``short`` whose nodes have external addresses."""
    return (
        f"cluster {short} does not have private nodes: its nodes have external IP addresses, so each is reachable "
        "from the internet where a firewall rule lets traffic in, and a pod that escapes the run's NetworkPolicies "
        f"reaches any host on the internet ({PRIVATE_NODES_DOC}); "
        "use a cluster with private nodes (gcloud container clusters create --enable-private-nodes), or leave "
        "gke.cluster_name empty and the run creates one"
    )


def _port(protocol: str, port: int) -> dict[str, Any]:
    return {"protocol": protocol, "port": port}


def egress_rules(t: Target) -> list[dict[str, Any]]:
    """What the run's pods may send: to one another (every port: Ray's GCS, raylets, object transfers, collectives),
    DNS (kube-dns, NodeLocal DNSCache, Cloud DNS at the metadata server), the metadata server, and HTTPS to addresses
    outside ``INTERNAL_RANGES``."""
    run = names.labels(t.run_id)
    dns_pods = [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": app}},
        }
        for app in DNS_PODS
    ]
    rules: list[dict[str, Any]] = [
        {"to": [{"podSelector": {"matchLabels": dict(run)}}]},
        {"to": dns_pods, "ports": [_port(p, n) for p, n in DNS_PORTS]},
    ]
    rules += [
        {"to": [{"ipBlock": {"cidr": cidr}}], "ports": [_port(p, n) for p, n in ports]} for cidr, ports in METADATA
    ]
    rules.append(
        {
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(INTERNAL_RANGES)}}],
            "ports": [_port("TCP", HTTPS)],
        }
    )
    return rules


def egress_policy(t: Target, meta: dict[str, Any]) -> dict[str, Any]:
    """The NetworkPolicy that limits what the run's pods send (``egress_rules``); ``meta`` its metadata."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": names.labels(t.run_id)},
            "policyTypes": ["Egress"],
            "egress": egress_rules(t),
        },
    }


def summary(spec: RunSpec, t: Target) -> str:
    """The plan's words for the way out of a cluster the run creates."""
    needs = internet_needs(spec, t)
    if not needs:
        return (
            "private nodes (no external addresses), Private Google Access only: no route out but to Google's APIs and "
            "services (App Engine apps included)"
        )
    return f"private nodes (no external addresses), Private Google Access, and Cloud NAT because {'; '.join(needs)}"
