"""What a gke run creates in Compute Engine, derived from the run spec: for multislice with
``gke.multislice_network=dcn_networks``, one extra VPC network per DCN NIC, each with its subnet and the firewall rule
that lets the other slices' traffic in (the multislice Ray Train tutorial's way,
https://docs.cloud.google.com/kubernetes-engine/docs/tutorials/multi-slice-training-ray); for TPU7x multi-host
slices, the workload policy that places each slice
(https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood). Compute Engine networks and firewall
rules take no labels: the run id is in their descriptions and their names.

Also the check that the cluster's Pod and Service ranges overlap none of the DCN subnets. Pure functions of
(spec, target) that return Compute Engine REST bodies; nothing here talks to a cloud.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from components.platforms.gke.plan import paths
from components.platforms.gke.plan.target import Target
from components.spec import RunSpec, SpecError, names
from components.workload.derive import has_dcn_nics, slice_shape

DCN_SUBNET_RANGES = ("10.50.0.0/16", "10.60.0.0/16")  # one extra VPC network (and subnet) per range
DCN_MTU = 8896
# A new VPC network denies all ingress (https://cloud.google.com/firewall/docs/firewalls#default_firewall_rules):
# each DCN network gets a rule that allows what comes from its own subnet (the other slices' NICs), every port of TCP,
# UDP and ICMP, as xpk does for each extra network (https://github.com/AI-Hypercomputer/xpk, src/xpk/core/network.py).
DCN_FIREWALL_PROTOCOLS = ("tcp", "udp", "icmp")

# Plan kinds of the Compute Engine resources -> the kind the Compute adapter and the ledger use.
COMPUTE_KINDS = {
    "vpc-network": "network",
    "subnetwork": "subnetwork",
    "firewall-rule": "firewall",
    "workload-policy": "resource_policy",
    "cloud-nat": "router",
}


def compute_path(kind: str, t: Target, name: str) -> str:
    """The path of the run's Compute Engine resource ``name`` of the ledger's ``kind`` (``paths.compute_path``)."""
    return paths.compute_path(kind, t.project, t.region, name)


def workload_policy(spec: RunSpec, t: Target) -> dict[str, Any] | None:
    """The Compute Engine ``ResourcePolicy`` that places TPU7x multi-host slices (standard mode)."""
    shape = slice_shape(spec)
    if t.autopilot or shape.family.name != "tpu7x" or not shape.multi_host:
        return None
    return {
        "name": names.workload_policy(t.run_id),
        "region": t.region,
        "description": f"{names.RUN_LABEL}={t.run_id}",
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": shape.topology},
    }


def dcn_networks(spec: RunSpec, t: Target) -> list[dict[str, Any]]:
    """The extra VPC networks (custom subnets, jumbo MTU), their subnets and the firewall rules that let the slices'
    traffic in, one network per DCN NIC: the tutorial's way. Compute Engine networks and firewall rules take no
    labels: the run id is in the description and the name."""
    if not has_dcn_nics(spec) or spec.gke.multislice_network != "dcn_networks" or t.autopilot:
        return []
    out = []
    for index, cidr in enumerate(DCN_SUBNET_RANGES):
        network = names.dcn_network(t.run_id, index)
        out.append(
            {
                "network": {
                    "name": network,
                    "autoCreateSubnetworks": False,
                    "mtu": DCN_MTU,
                    "description": f"{names.RUN_LABEL}={t.run_id}",
                },
                "subnetwork": {
                    "name": names.dcn_subnet(t.run_id, index),
                    "network": compute_path("network", t, network),
                    "region": t.region,
                    "ipCidrRange": cidr,
                    "description": f"{names.RUN_LABEL}={t.run_id}",
                },
                "firewall": {
                    "name": names.dcn_firewall(t.run_id, index),
                    "network": compute_path("network", t, network),
                    "direction": "INGRESS",
                    "priority": 1000,
                    "sourceRanges": [cidr],
                    "allowed": [{"IPProtocol": protocol} for protocol in DCN_FIREWALL_PROTOCOLS],
                    "description": f"{names.RUN_LABEL}={t.run_id}",
                },
            }
        )
    return out


def dcn_range_overlap(spec: RunSpec, t: Target, ranges: dict[str, str]) -> tuple[str, str, str] | None:
    """The first of the cluster's ``ranges`` (field -> CIDR, e.g. its Pod and Service ranges) that overlaps a DCN
    subnet of the run, as (field, range, DCN range); None when none does (or the run makes no DCN networks)."""
    dcn = [net["subnetwork"]["ipCidrRange"] for net in dcn_networks(spec, t)]
    for key, value in ranges.items():
        for cidr in dcn if value else ():
            if ipaddress.ip_network(value, strict=False).overlaps(ipaddress.ip_network(cidr)):
                return key, value, cidr
    return None


def check_ranges(spec: RunSpec, t: Target) -> None:
    """The Pod and Service ranges the spec pins must not overlap the DCN subnets: a SpecError naming the field."""
    overlap = dcn_range_overlap(
        spec, t, {"gke.pod_range": spec.gke.pod_range, "gke.service_range": spec.gke.service_range}
    )
    if overlap:
        key, value, cidr = overlap
        raise SpecError(
            key,
            f"{value} overlaps the DCN subnet {cidr} (gke.multislice_network=dcn_networks makes "
            f"{', '.join(DCN_SUBNET_RANGES)})",
            ["a range that overlaps none of them"],
        )
