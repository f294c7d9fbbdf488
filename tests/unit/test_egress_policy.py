"""The run's planned NetworkPolicies (``components.platforms.gke.plan.network.egress_rules``) evaluated as a network
plugin enforces them (tests/emulators/netpol.py, the Kubernetes NetworkPolicy spec's semantics), against the
connections each stage's pods open and some they have no business opening: each needed one is allowed, each other one
refused."""

from __future__ import annotations

import pytest

from components.platforms.gke.plan import manifests
from components.platforms.gke.plan.target import target
from components.workload import resolve
from tests.emulators.netpol import Destination, Pod, egress_allowed

PROJECT = "tpupipe-emulated"
SPEC = resolve("gemma4-e2b-v6e-16", f"gke.project={PROJECT}")
T = target(SPEC, "r1")
POLICIES = manifests.network_policies(T)
HEAD = Pod(T.namespace, {"tpupipe-run": "r1", "ray.io/node-type": "head"})
WORKER = Pod(T.namespace, {"tpupipe-run": "r1", "ray.io/node-type": "worker"})
KUBE_DNS = Pod("kube-system", {"k8s-app": "kube-dns"})

NEEDED = {
    # every stage's pods: names resolved by kube-dns, NodeLocal DNSCache (hostNetwork, by its address) or Cloud DNS
    "kube-dns, UDP": Destination(53, "UDP", pod=KUBE_DNS),
    "kube-dns, TCP": Destination(53, "TCP", pod=KUBE_DNS),
    "NodeLocal DNSCache": Destination(53, "UDP", ip="169.254.20.10"),
    "Cloud DNS for GKE at the metadata server": Destination(53, "UDP", ip="169.254.169.254"),
    # Workload Identity's tokens for the bucket's FUSE mount and the trainers' Cloud Storage calls
    "the metadata server": Destination(80, ip="169.254.169.254"),
    "the GKE metadata server (Workload Identity)": Destination(988, ip="169.254.169.252"),
    # Cloud Storage, Artifact Registry: Google's APIs over HTTPS, by a public address or private.googleapis.com
    "storage.googleapis.com": Destination(443, ip="142.250.72.123"),
    "private.googleapis.com": Destination(443, ip="199.36.153.9"),
    # Ray between the run's own pods: GCS, raylets, object transfers, the collectives (any port)
    "the head's GCS": Destination(6379, pod=HEAD),
    "a worker's raylet": Destination(10002, pod=WORKER),
    "a collective between workers": Destination(8476, pod=WORKER),
}
REFUSED = {
    "another run's head": Destination(6379, pod=Pod(T.namespace, {"tpupipe-run": "r2", "ray.io/node-type": "head"})),
    "a pod of another namespace": Destination(8265, pod=Pod("team", {"app": "dashboard"})),
    "a kube-system pod that is no resolver": Destination(443, pod=Pod("kube-system", {"k8s-app": "metrics-server"})),
    "a VM of the VPC over HTTPS": Destination(443, ip="10.128.0.5"),
    "a node of another run over SSH": Destination(22, ip="172.20.4.9"),
    "plain HTTP out": Destination(80, ip="93.184.215.14"),
    "SMTP out": Destination(25, ip="93.184.215.14"),
    "SSH out": Destination(22, ip="93.184.215.14"),
    "a resolver on the internet": Destination(53, "UDP", ip="8.8.8.8"),
    "the metadata server on another port": Destination(8080, ip="169.254.169.254"),
    "a link-local address over HTTPS": Destination(443, ip="169.254.10.1"),
    "HTTPS over UDP (QUIC)": Destination(443, "UDP", ip="142.250.72.123"),
}


@pytest.mark.parametrize("source", [HEAD, WORKER], ids=["head", "worker"])
@pytest.mark.parametrize("what", sorted(NEEDED))
def test_every_connection_a_stage_needs_is_allowed(source, what):
    assert egress_allowed(POLICIES, source, NEEDED[what]), what


@pytest.mark.parametrize("source", [HEAD, WORKER], ids=["head", "worker"])
@pytest.mark.parametrize("what", sorted(REFUSED))
def test_a_connection_the_run_does_not_need_is_refused(source, what):
    assert not egress_allowed(POLICIES, source, REFUSED[what]), what


def test_without_the_egress_policy_every_one_of_them_would_go_out():
    """The refusals are the egress policy's: the ingress policies alone leave a pod non-isolated for egress."""
    ingress_only = [p for p in POLICIES if "Egress" not in p["spec"]["policyTypes"]]
    assert len(ingress_only) == len(POLICIES) - 1
    assert all(egress_allowed(ingress_only, WORKER, dest) for dest in REFUSED.values())
    # a pod the policy does not select (another run's) is not held by it
    assert egress_allowed(POLICIES, Pod(T.namespace, {"tpupipe-run": "r2"}), REFUSED["SMTP out"])
