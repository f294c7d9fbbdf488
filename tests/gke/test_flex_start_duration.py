"""Flex-start's seven days: a run with a flex-start or queued rung whose deadline (the ProvisioningRequest's
``maxRunDurationSeconds``) is longer is refused at validate, naming run.deadline_h; the emulated GKE fails a request
asking for more, and provisions one of exactly seven days."""

from __future__ import annotations

import threading

import pytest

from components.platforms.gke.plan import queued
from components.spec import SpecError
from components.workload import resolve
from tests.emulators import provisioning

SHAPE = "gke.project=my-project cluster.num_slices=1"  # queued provisioning is for one slice


@pytest.mark.parametrize("capacity", ["flex-start", "queued", "spot,flex-start"])
def test_a_deadline_past_flex_starts_seven_days_is_refused_at_validate_naming_the_field(capacity):
    with pytest.raises(SpecError) as refused:
        resolve("llama3-8b-v6e-16x2", f"{SHAPE} cluster.capacity={capacity} run.deadline_h=169")
    assert refused.value.field == "run.deadline_h" and refused.value.exit_code == 2
    assert "flex-start nodes run for at most seven days (168 hours" in str(refused.value)
    resolve("llama3-8b-v6e-16x2", f"{SHAPE} cluster.capacity={capacity} run.deadline_h=168")
    resolve("llama3-8b-v6e-16x2", f"{SHAPE} cluster.capacity=spot run.deadline_h=400")  # spot has no such limit


@pytest.mark.parametrize("hours, outcome", [(168, "Provisioned"), (169, "Failed")])
def test_the_emulated_gke_fails_a_request_longer_than_seven_days(hours, outcome):
    objects: dict = {}
    provisioner = provisioning.Provisioner(objects, threading.Lock())
    provisioner.provision_s = 0.0
    done = threading.Event()
    provisioner.listeners.append(lambda namespace, name, kind: done.set())
    objects[("podtemplates", "ns", "workers")] = {"template": {"spec": {}}}
    request = {
        "metadata": {"name": "req", "namespace": "ns"},
        "spec": {
            "provisioningClassName": queued.CLASS_NAME,
            "podSets": [{"podTemplateRef": {"name": "workers"}, "count": 1}],
            "parameters": {queued.MAX_RUN_PARAMETER: str(hours * 3600)},
        },
    }
    objects[(provisioning.PLURAL, "ns", "req")] = request
    provisioner.created("ns", request)
    assert done.wait(10)
    assert provisioner.decided == [("ns", "req", outcome)]
