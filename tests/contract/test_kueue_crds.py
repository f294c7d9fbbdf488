"""Kueue's objects against the real Kueue v0.19.2 CRDs (tests/contract/crds/kueue-v0.19.2/): the setup docs/gke.md
gives platform teams validates, and its Role grants every action a queued run takes in its namespace; the CRDs' own
rules refuse what Kueue's API server would (a flavor that leaves a covered resource out, an unknown field); and the
RayCluster of a queued run's plan passes KubeRay's CRD with Kueue's labels on it."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import k8s_actions
from components.platforms.gke.plan.needs import needs
from components.workload import resolve
from tests.contract.kuberay_schema import KUEUE_SCHEMA_DIR, CrdValidator, schema_dir

DOCS = Path(__file__).resolve().parents[2] / "docs" / "gke.md"
QUEUED = "gke.project=my-project gke.cluster_name=shared gke.queue=team-a gke.priority_class=high"


@pytest.fixture(scope="module")
def validator() -> CrdValidator:
    return CrdValidator(schema_dir(), KUEUE_SCHEMA_DIR)


def _documented() -> list[dict]:
    """Every object of the YAML blocks of docs/gke.md's Kueue section."""
    text = DOCS.read_text()
    section = text[text.index("## Shared clusters: Kueue") :]
    section = section[: section.index("\n## ", 1)]
    return [o for block in re.findall(r"```yaml\n(.*?)```", section, re.S) for o in yaml.safe_load_all(block) if o]


def test_the_documented_kueue_setup_is_valid(validator):
    kueue = [o for o in _documented() if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert {o["kind"] for o in kueue} == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
    for obj in kueue:
        assert validator.errors(obj) == [], obj["metadata"]["name"]


def test_the_documented_role_grants_what_a_queued_run_does_in_its_namespace():
    role = next(o for o in _documented() if o["kind"] == "Role")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    kinds = needs(resolve("gemma4-e2b-v6e-16", QUEUED), "docs").k8s_kinds
    cluster_scoped = {"namespaces", "customresourcedefinitions"}  # the docs name them apart (a ClusterRole)
    wanted = {
        (group, f"{resource}/{sub}" if sub else resource, verb)
        for verb, group, resource, sub, _ in k8s_actions.actions(kinds)
        if resource not in cluster_scoped
    }
    assert ("kueue.x-k8s.io", "workloads", "list") in wanted
    assert wanted - granted == set()


def test_kueues_own_rules_refuse_what_its_api_server_would(validator):
    cq = copy.deepcopy(next(o for o in _documented() if o["kind"] == "ClusterQueue"))
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop()  # memory left out of a group covering it
    assert any("flavors" in e for e in validator.errors(cq)), validator.errors(cq)
    lq = copy.deepcopy(next(o for o in _documented() if o["kind"] == "LocalQueue"))
    lq["spec"]["clusterQueu"] = "typo"
    assert any("clusterQueu" in e for e in validator.errors(lq))
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "t"}}
    assert any("topology" in e for e in validator.errors({**flavor, "spec": {"topologyName": "t"}}))


def test_a_queued_runs_raycluster_passes_kuberay_with_kueues_labels(validator):
    document = plan.build(resolve("gemma4-e2b-v6e-16", QUEUED), "gemma4-e2b-v6e-16")
    raycluster = next(r["body"] for r in document["resources"] if r["kind"] == "k8s/RayCluster")
    assert raycluster["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert raycluster["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert raycluster["spec"]["suspend"] is True
    assert validator.errors(raycluster) == []
    assert not [r for r in document["resources"] if r["kind"] == "node-pool"]
