"""NetworkPolicy egress as a Kubernetes network plugin enforces it, for the connections a pod would open: whether a
pod may send to a destination (another pod, or an address and port) under the policies of its cluster.

The semantics are the Kubernetes NetworkPolicy spec's (https://kubernetes.io/docs/concepts/services-networking/
network-policies/, and the API reference of networking.k8s.io/v1 NetworkPolicySpec, NetworkPolicyEgressRule,
NetworkPolicyPeer, NetworkPolicyPort, IPBlock):

- a policy selects pods of its own namespace by ``podSelector`` (empty: all of them), and is an egress policy when
  ``policyTypes`` names Egress (or, without ``policyTypes``, when it has ``egress`` rules);
- a pod no egress policy selects may send anything ("non-isolated for egress");
- a pod that some egress policy selects may send only what some rule of some policy selecting it allows: policies are
  additive, they never deny;
- a rule allows a connection when one of its ``to`` peers matches the destination (no ``to``: every destination) and
  one of its ``ports`` matches the port and protocol (no ``ports``: every port); a port's protocol is TCP unless named,
  ``endPort`` makes it a range;
- a peer is a ``podSelector`` (pods of the policy's namespace), a ``namespaceSelector`` (every pod of the namespaces it
  matches), both (the pods that match in the namespaces that match), or an ``ipBlock`` (a CIDR less its ``except``
  ranges), which the spec means for addresses outside the cluster: a pod is matched by selectors, and a pod on its
  node's network (hostNetwork) by its address, as NodeLocal DNSCache's is.

Named ports are not modelled (the run's policies name none).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Destination:
    """Where a connection goes: a pod of the cluster (``pod``), else an address outside it (``ip``)."""

    port: int
    protocol: str = "TCP"
    pod: Pod | None = None
    ip: str = ""


def _selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions' In, NotIn, Exists, DoesNotExist) against labels; an empty
    selector selects everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _namespace_labels(name: str) -> dict[str, str]:
    """Every namespace carries ``kubernetes.io/metadata.name`` with its name (set by the API server since 1.22:
    https://kubernetes.io/docs/reference/labels-annotations-taints/#kubernetes-io-metadata-name)."""
    return {"kubernetes.io/metadata.name": name}


def _peer(peer: dict[str, Any], policy_ns: str, dest: Destination) -> bool:
    if "ipBlock" in peer:
        if dest.pod is not None or not dest.ip:
            return False
        address = ipaddress.ip_address(dest.ip)
        block = peer["ipBlock"]
        if address not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(address in ipaddress.ip_network(e) for e in block.get("except") or [])
    if dest.pod is None:
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], _namespace_labels(dest.pod.namespace)):
            return False
    elif dest.pod.namespace != policy_ns:
        return False
    return "podSelector" not in peer or _selects(peer["podSelector"], dest.pod.labels)


def _port(port: dict[str, Any], dest: Destination) -> bool:
    if port.get("protocol", "TCP") != dest.protocol:
        return False
    if "port" not in port:
        return True
    low = int(port["port"])
    return low <= dest.port <= int(port.get("endPort", low))


def _egress_policy(policy: dict[str, Any]) -> bool:
    spec = policy["spec"]
    types = spec.get("policyTypes")
    return "Egress" in types if types else "egress" in spec


def egress_allowed(policies: list[dict[str, Any]], source: Pod, dest: Destination) -> bool:
    """Whether ``source`` may open a connection to ``dest`` under ``policies`` (NetworkPolicy objects)."""
    selecting = [
        p
        for p in policies
        if _egress_policy(p)
        and p["metadata"].get("namespace", source.namespace) == source.namespace
        and _selects(p["spec"].get("podSelector"), source.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        ns = policy["metadata"].get("namespace", source.namespace)
        for rule in policy["spec"].get("egress") or []:
            to, ports = rule.get("to"), rule.get("ports")
            if (not to or any(_peer(peer, ns, dest) for peer in to)) and (
                not ports or any(_port(port, dest) for port in ports)
            ):
                return True
    return False
