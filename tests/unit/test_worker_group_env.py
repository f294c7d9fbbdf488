"""The multislice environment belongs to each worker group: the worker pods carry no MEGASCALE_* (so the KubeRay TPU
webhook adds none, tests/emulators/kube/kuberay.py's rule) and a group of one slice starts with none; Ray Train sets
them on a group that spans several slices (components/platforms/gke/plan/manifests.py cites both)."""

from __future__ import annotations

import pytest

from components.platforms.gke.plan import manifests as m
from components.platforms.gke.plan import target as tg
from components.workload import resolve
from tests.emulators.kube import KubeEmulator

MULTISLICE_PRESETS = ("llama3-8b-v6e-16x2", "llama3-70b-v6e-16x2", "llama3-8b-v6e-elastic-spot")


def _worker_pods(preset: str, overrides: str = ""):
    """Each worker pod of the preset's RayCluster as the KubeRay operator creates it, with what the TPU webhook
    injects into it: (spec env, injected env) per pod."""
    spec = resolve(preset, overrides)
    cluster = m.raycluster(spec, tg.target(spec, "run-1"))
    (group,) = cluster["spec"]["workerGroupSpecs"]
    name = cluster["metadata"]["name"]
    for replica in range(group["replicas"]):
        for host in range(group["numOfHosts"]):
            pod = {
                "metadata": {
                    "name": f"{name}-{group['groupName']}-{replica}-{host}",
                    "labels": {"ray.io/cluster": name, "ray.io/group": group["groupName"]},
                },
                "spec": group["template"]["spec"],
            }
            spec_env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            yield spec_env, KubeEmulator._tpu_webhook_env(pod, group)


@pytest.mark.parametrize("preset", MULTISLICE_PRESETS)
def test_a_worker_pod_starts_with_no_megascale_variable_so_a_group_of_one_slice_gets_none(preset):
    pods = list(_worker_pods(preset))
    assert len(pods) > 1
    for spec_env, injected in pods:
        assert not [k for k in spec_env | injected if k.startswith("MEGASCALE_")], (spec_env, injected)
        assert injected["TPU_NAME"]  # the webhook did run on it


def test_the_webhooks_rule_would_add_the_slice_to_a_pod_naming_the_slice_count():
    """What the manifests used to do, through the same rule: the count in the pod's spec makes the webhook add the
    replica's slice id, a coordinator and a port, which a group shrunk to one slice would keep."""
    spec = resolve("llama3-8b-v6e-16x2")
    cluster = m.raycluster(spec, tg.target(spec, "run-1"))
    (group,) = cluster["spec"]["workerGroupSpecs"]
    container = group["template"]["spec"]["containers"][0]
    container["env"] = [*container.get("env", []), {"name": "MEGASCALE_NUM_SLICES", "value": "2"}]
    pod = {
        "metadata": {"name": f"rc-{group['groupName']}-1-0", "labels": {"ray.io/cluster": "rc"}},
        "spec": group["template"]["spec"],
    }
    injected = KubeEmulator._tpu_webhook_env(pod, group)
    assert {k: v for k, v in injected.items() if k.startswith("MEGASCALE_")} == {
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1",
        "MEGASCALE_PORT": "8081",
    }
