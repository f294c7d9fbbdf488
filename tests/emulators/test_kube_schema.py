"""The emulated API server checks built-in objects against the Kubernetes schema the client's models carry: the
run's NetworkPolicies pass; an unknown field, a mistyped one or a missing required one is refused (422) through the
real kubernetes client, as the API server refuses them."""

from __future__ import annotations

import copy
import json

import pytest

from components.platforms.gke.plan import manifests as m
from components.platforms.gke.plan import target as tg
from components.workload import resolve
from tests.emulators import kube_schema


def _policies():
    spec = resolve("gemma4-e2b-v6e-16", "gke.project=my-project")
    return m.network_policies(tg.target(spec, "schema"))


def test_the_runs_network_policies_are_valid():
    for policy in _policies():
        assert kube_schema.errors(policy, "V1NetworkPolicy") == []


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda p: p["spec"].update(podSelectr={}), '.spec.podSelectr: unknown field "podSelectr"'),
        (
            lambda p: p["spec"]["ingress"][0].update(ports=[{"port": True}]),
            ".spec.ingress[0].ports[0].port: int or string",
        ),
        (lambda p: p["spec"].pop("podSelector"), "Invalid value for `pod_selector`, must not be `None`"),
        (lambda p: p["spec"].update(policyTypes="Ingress"), ".spec.policyTypes: expected a list"),
    ],
)
def test_a_bad_network_policy_is_refused(change, error):
    policy = copy.deepcopy(_policies()[0])
    change(policy)
    assert any(error in e for e in kube_schema.errors(policy, "V1NetworkPolicy")), kube_schema.errors(
        policy, "V1NetworkPolicy"
    )


def test_the_api_server_refuses_an_invalid_network_policy_through_the_client(tmp_path, project_factory):
    from kubernetes.client.exceptions import ApiException

    from tests.gke.test_gke_platform import provisioned_kube

    project = project_factory()
    gke, ctx, kube = provisioned_kube(tmp_path, "netpol")
    good, bad = _policies()[0], copy.deepcopy(_policies()[0])
    bad["spec"]["ingres"] = bad["spec"].pop("ingress")
    assert kube.ensure(good) is True
    with pytest.raises(ApiException) as caught:
        kube.ensure(bad | {"metadata": {**bad["metadata"], "name": "bad"}})
    message = json.loads(caught.value.body)["message"]
    assert caught.value.status == 422
    assert message == 'NetworkPolicy "bad" is invalid: .spec.ingres: unknown field "ingres"'
    assert [n for (p, _, n) in project.kube.objects if p == "networkpolicies"] == ["schema-isolate"]
    gke.teardown(ctx)
