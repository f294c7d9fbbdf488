"""The derivations from the TPU catalogue, pinned for every accelerator family: GKE node pools and cluster (parsed
by the real google-cloud-container client types), the RayCluster worker group, Ray's ScalingConfig, names."""

from __future__ import annotations

import json
import shlex

import pytest

from components.platforms.gke.plan import compute_resources as cr
from components.platforms.gke.plan import manifests as m
from components.platforms.gke.plan import network
from components.platforms.gke.plan import resources as r
from components.platforms.gke.plan import target as tg
from components.spec import names
from components.workload import cache, maxtext, resolve
from components.workload import derive as d

# family: (preset, overrides for one multi-host slice of the family)
FAMILY_SPECS = {
    "v5e": ("gemma4-e2b-v6e-16", "cluster.accelerator=v5e cluster.topology=4x4 cluster.num_hosts=4"),
    "v5p": (
        "gemma4-e2b-v6e-16",
        "cluster.accelerator=v5p cluster.topology=2x2x2 cluster.num_hosts=2 train.num_workers=0",
    ),
    "v6e": ("gemma4-e2b-v6e-16", ""),
    "tpu7x": ("gemma4-e2b-tpu7x-16", ""),
}

# family: machine type, hosts, chips per host, node label, Ray type, logical devices per host, placement,
# Ray TPU resources per host (worker group), TorchTPU workers (one per device)
FAMILY_FACTS = {
    "v5e": ("ct5lp-hightpu-4t", 4, 4, "tpu-v5-lite-podslice", "TPU-V5LITEPOD", 4, {"tpuTopology": "4x4"}, None, 16),
    "v5p": ("ct5p-hightpu-4t", 2, 4, "tpu-v5p-slice", "TPU-V5P", 4, {"tpuTopology": "2x2x2"}, None, 8),
    "v6e": ("ct6e-standard-4t", 4, 4, "tpu-v6e-slice", "TPU-V6E", 4, {"tpuTopology": "4x4"}, None, 16),
    "tpu7x": (
        "tpu7x-standard-4t",
        2,
        4,
        "tpu7x",
        "TPU-V7X",
        8,
        {"policyName": "gemma4-e2b-tpu7x-16-placement"},
        {"TPU": "8"},
        16,
    ),
}


def spec_and_target(preset: str, overrides: str = "", run_id: str = ""):
    spec = resolve(preset, overrides)
    return spec, tg.target(spec, run_id or preset)


def container_types():
    from google.cloud import container_v1

    return container_v1


@pytest.mark.parametrize("family", sorted(FAMILY_FACTS))
def test_node_pool_per_family(family):
    machine, hosts, per_host, label, _, _, placement, _, _ = FAMILY_FACTS[family]
    spec, t = spec_and_target(*FAMILY_SPECS[family])
    (pool,) = r.tpu_node_pools(spec, t)
    assert pool["config"]["machineType"] == machine
    assert pool["initialNodeCount"] == hosts
    assert pool["placementPolicy"] == placement
    assert pool["locations"] == [t.zone]
    assert pool["config"]["labels"][names.RUN_LABEL] == t.run_id
    assert pool["config"]["resourceLabels"] == {names.RUN_LABEL: t.run_id}
    assert pool["config"]["oauthScopes"] == [r.CLOUD_PLATFORM_SCOPE]
    assert "spot" not in pool["config"] and "reservationAffinity" not in pool["config"]
    container_types().NodePool.from_json(json.dumps(pool))  # the real client type takes it, unknown keys fail


# family: the node pool's advancedMachineFeatures (the GKE tutorial "Train an LLM such as Llama 3 70B on GKE with
# MaxText, Ray Train and multislice Trillium TPUs" sets 1 thread per core on v6e; neither that tutorial, "Fine-tune
# models on multi-host TPUs with Ray and TorchTPU" nor xpk sets it on TPU7x, v5e or v5p; docs/tutorials.md)
THREADS_PER_CORE = {"v5e": None, "v5p": None, "v6e": {"threadsPerCore": "1"}, "tpu7x": None}


@pytest.mark.parametrize("family", sorted(FAMILY_FACTS))
def test_node_settings_per_family_come_from_the_catalogue(family):
    spec, t = spec_and_target(*FAMILY_SPECS[family])
    (pool,) = r.tpu_node_pools(spec, t)
    assert pool["config"].get("advancedMachineFeatures") == THREADS_PER_CORE[family]


@pytest.mark.parametrize("family", sorted(FAMILY_FACTS))
def test_worker_group_per_family(family):
    _, hosts, per_host, label, _, _, _, ray_resources, _ = FAMILY_FACTS[family]
    spec, t = spec_and_target(*FAMILY_SPECS[family])
    (group,) = m.raycluster(spec, t)["spec"]["workerGroupSpecs"]
    assert (group["replicas"], group["numOfHosts"]) == (1, hosts)
    container = group["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"][r.TPU_RESOURCE] == str(per_host)
    assert container["resources"]["limits"][r.TPU_RESOURCE] == str(per_host)
    selector = group["template"]["spec"]["nodeSelector"]
    assert selector[r.NODE_LABEL_ACCELERATOR] == label
    assert selector[r.NODE_LABEL_TOPOLOGY] == spec.cluster.topology
    assert group.get("resources") == ray_resources
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    head_env = {
        e["name"]: e.get("value")
        for e in m.raycluster(spec, t)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    if family == "tpu7x":
        assert env["RAY_TPU_RESOURCE_PER_CHIP"] == head_env["RAY_TPU_RESOURCE_PER_CHIP"] == "2"
    else:
        assert "RAY_TPU_RESOURCE_PER_CHIP" not in env and "RAY_TPU_RESOURCE_PER_CHIP" not in head_env


@pytest.mark.parametrize("family", sorted(FAMILY_FACTS))
def test_scaling_config_per_family(family):
    _, hosts, _, _, ray_type, devices_per_host, _, _, torch_workers = FAMILY_FACTS[family]
    preset, overrides = FAMILY_SPECS[family]
    spec = resolve(preset, overrides)
    assert d.scaling_config_args(spec) == {
        "num_workers": torch_workers,  # TorchTPU: one worker per device
        "use_tpu": True,
        "topology": spec.cluster.topology,
        "accelerator_type": ray_type,
        "resources_per_worker": {"TPU": 1},
    }
    assert torch_workers == devices_per_host * hosts
    jax = resolve(
        preset,
        overrides + " train.workload=maxtext train.num_workers=0 maxtext.dataset_type=hf "
        "maxtext.ici_fsdp_parallelism=-1 maxtext.ici_tensor_parallelism=1",
    )
    assert d.scaling_config_args(jax) == {
        "num_workers": hosts,  # JAX: one worker per host, holding all its devices
        "use_tpu": True,
        "topology": spec.cluster.topology,
        "accelerator_type": ray_type,
        "resources_per_worker": {"TPU": devices_per_host},
        "placement_strategy": "SPREAD",
    }


def test_scaling_config_on_cpu_is_what_the_trainer_always_used():
    from trainers import job_args

    spec = resolve("local-fsdp", "cluster.num_hosts=3 cluster.cpus_per_host=2")
    expected = {"num_workers": 3, "resources_per_worker": {"CPU": 2}, "placement_strategy": "SPREAD"}
    assert d.scaling_config_args(spec) == expected
    # The trainer gets exactly this on its command line (the job command the stages submit and the plan prints).
    for s in (spec, resolve("gemma4-e2b-tpu7x-16"), resolve("llama3-8b-v6e-elastic-spot")):
        argv = shlex.split(d.job_command(s, "train", "/out", "run"))
        assert job_args.scaling_config(argv[argv.index("--scaling-config") + 1]) == d.scaling_config_args(s)


def test_seed_a_scaling_config_and_elastic_range():
    assert d.scaling_config_args(resolve("llama3-8b-v6e-16x2")) == {
        "num_workers": 8,
        "use_tpu": True,
        "topology": "4x4",
        "accelerator_type": "TPU-V6E",
        "resources_per_worker": {"TPU": 4},
        "placement_strategy": "SPREAD",
    }
    elastic = resolve("llama3-8b-v6e-elastic-spot")
    assert d.scaling_config_args(elastic)["num_workers"] == (4, 8)
    assert d.run_config_args(elastic) == {"failure_config": {"max_failures": 3}}
    group = m.raycluster(elastic, tg.target(elastic, "r"))["spec"]["workerGroupSpecs"][0]
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 2, 2)


@pytest.mark.parametrize("topology, hosts", [("2x2", 1), ("2x4", 1), ("1x1", 1)])
def test_single_host_slices_have_no_tpu_topology(topology, hosts):
    spec, t = spec_and_target(
        "gemma4-e2b-v6e-16", f"cluster.topology={topology} cluster.num_hosts={hosts} train.num_workers=0"
    )
    (pool,) = r.tpu_node_pools(spec, t)
    assert "placementPolicy" not in pool
    assert cr.workload_policy(spec, t) is None


def test_tpu7x_multi_host_slices_are_placed_by_a_workload_policy():
    spec, t = spec_and_target(
        "gemma4-e2b-tpu7x-16", "cluster.topology=4x4x4 cluster.num_hosts=16 cluster.num_slices=2 train.num_workers=0"
    )
    policy = cr.workload_policy(spec, t)
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "4x4x4"}
    assert policy["region"] == "us-central1"
    pools = r.tpu_node_pools(spec, t)
    assert [p["placementPolicy"] for p in pools] == [{"policyName": policy["name"]}] * 2
    single, ts = spec_and_target(
        "gemma4-e2b-tpu7x-16", "cluster.topology=2x2x1 cluster.num_hosts=1 train.num_workers=0"
    )
    assert cr.workload_policy(single, ts) is None


def test_one_node_pool_per_slice_with_distinct_names():
    spec, t = spec_and_target(
        "llama3-8b-v6e-16x2",
        "cluster.topology=16x16 cluster.num_hosts=64 cluster.num_slices=64 maxtext.ici_fsdp_parallelism=-1",
    )
    pools = r.tpu_node_pools(spec, t)
    assert len(pools) == 64 and len({p["name"] for p in pools}) == 64
    assert {p["config"]["labels"][names.SLICE_LABEL] for p in pools} == {str(i) for i in range(64)}
    assert all(p["initialNodeCount"] == 64 for p in pools)
    (group,) = m.raycluster(spec, t)["spec"]["workerGroupSpecs"]  # one group, whatever the size
    assert (group["replicas"], group["numOfHosts"]) == (64, 64)


@pytest.mark.parametrize("capacity", ["on-demand", "spot", "reservation", "flex-start"])
def test_capacity_types(capacity):
    extra = " cluster.reservation=my-res" if capacity == "reservation" else ""
    spec, t = spec_and_target("llama3-8b-v6e-16x2", f"cluster.capacity={capacity}{extra}")
    for pool in r.tpu_node_pools(spec, t):
        config = pool["config"]
        assert config.get("spot", False) is (capacity == "spot")
        assert config.get("flexStart", False) is (capacity == "flex-start")
        if capacity == "reservation":
            assert config["reservationAffinity"] == {
                "consumeReservationType": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": ["my-res"],
            }
        if capacity == "flex-start":
            assert config["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
            assert pool["initialNodeCount"] == 0
            assert pool["autoscaling"] == {
                "enabled": True,
                "minNodeCount": 0,
                "maxNodeCount": 4,
                "locationPolicy": "ANY",
            }
            assert pool["management"] == {"autoRepair": False, "autoUpgrade": True}
        else:
            assert pool["initialNodeCount"] == 4 and "autoscaling" not in pool
        container_types().NodePool.from_json(json.dumps(pool))


def test_dcn_networking_the_tutorials_way():
    spec, t = spec_and_target("llama3-8b-v6e-16x2")
    nets = cr.dcn_networks(spec, t)
    assert [n["subnetwork"]["ipCidrRange"] for n in nets] == ["10.50.0.0/16", "10.60.0.0/16"]
    assert all(n["network"]["mtu"] == 8896 and n["network"]["autoCreateSubnetworks"] is False for n in nets)
    for pool in r.tpu_node_pools(spec, t):
        assert pool["networkConfig"]["additionalNodeNetworkConfigs"] == [
            {"network": n["network"]["name"], "subnetwork": n["subnetwork"]["name"]} for n in nets
        ]
        assert pool["config"]["labels"][r.DRA_NETWORKING_LABEL] == "true"
        assert pool["config"]["gvnic"] == {"enabled": True}
    assert r.cluster(spec, t)["networkConfig"] == {
        "datapathProvider": "ADVANCED_DATAPATH",
        "enableMultiNetworking": True,
        "defaultEnablePrivateNodes": True,
    }
    claim = m.dcn_claim_template(spec, t)
    assert claim["apiVersion"] == "resource.k8s.io/v1"
    assert claim["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "netdev.google.com",
        "allocationMode": "ExactCount",
        "count": 2,
    }
    worker = m.raycluster(spec, t)["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["resourceClaims"] == [{"name": "dcn-nics", "resourceClaimTemplateName": claim["metadata"]["name"]}]
    assert worker["containers"][0]["resources"]["claims"] == [{"name": "dcn-nics"}]
    env = {e["name"]: e["value"] for e in worker["containers"][0]["env"] if "value" in e}
    assert not [name for name in env if name.startswith("MEGASCALE_")]  # Ray Train's, per worker group
    assert env["JAX_PLATFORMS"] == "tpu,cpu" and env["ENABLE_PJRT_COMPATIBILITY"] == "true"
    assert env["LIBTPU_INIT_ARGS"].endswith("--megascale_grpc_interface_prefixes=eth1,eth2,lo")


def test_dcn_networking_with_the_accelerator_network_profile():
    spec, t = spec_and_target("llama3-8b-v6e-16x2", "gke.multislice_network=accelerator_network_profile")
    assert cr.dcn_networks(spec, t) == []
    for pool in r.tpu_node_pools(spec, t):
        assert pool["networkConfig"] == {"acceleratorNetworkProfile": "auto"}
        assert pool["config"]["labels"][r.DRA_NETWORKING_LABEL] == "true"
    # the cluster has multi-networking, and each pod claims all the NICs GKE attached (the samples' claim)
    assert r.cluster(spec, t)["networkConfig"]["enableMultiNetworking"] is True
    request = m.dcn_claim_template(spec, t)["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"] == {"deviceClassName": "netdev.google.com", "allocationMode": "All"}


def test_the_accelerator_network_profile_refuses_tpu7x():
    from components.spec import SpecError

    with pytest.raises(
        SpecError,
        match="^gke.multislice_network: the accelerator network profile does not support "
        "tpu7x.*valid: dcn_networks, none",
    ):
        resolve(
            "gemma4-e2b-tpu7x-16",
            "cluster.num_slices=2 train.num_workers=0 gke.multislice_network=accelerator_network_profile",
        )
    resolve("gemma4-e2b-tpu7x-16", "cluster.num_slices=2 train.num_workers=0 gke.multislice_network=dcn_networks")


def test_no_dcn_nics_for_one_slice_or_network_none():
    for preset, overrides in (("gemma4-e2b-v6e-16", ""), ("llama3-8b-v6e-16x2", "gke.multislice_network=none")):
        spec, t = spec_and_target(preset, overrides)
        assert cr.dcn_networks(spec, t) == [] and m.dcn_claim_template(spec, t) is None
        for pool in r.tpu_node_pools(spec, t):
            assert "networkConfig" not in pool and r.DRA_NETWORKING_LABEL not in pool["config"]["labels"]
        assert "megascale_grpc_interface_prefixes" not in r.libtpu_init_args(spec)


def test_standard_cluster():
    spec, t = spec_and_target("gemma4-e2b-v6e-16", "gke.project=my-project gke.cluster_version=1.35.2-gke.1842000")
    body = r.cluster(spec, t)
    assert body["addonsConfig"] == {"rayOperatorConfig": {"enabled": True}, "gcsFuseCsiDriverConfig": {"enabled": True}}
    assert body["workloadIdentityConfig"] == {"workloadPool": "my-project.svc.id.goog"}
    assert body["networkConfig"] == {"datapathProvider": "ADVANCED_DATAPATH", "defaultEnablePrivateNodes": True}
    assert body["initialClusterVersion"] == "1.35.2-gke.1842000"
    assert body["resourceLabels"] == {names.RUN_LABEL: "gemma4-e2b-v6e-16"}
    (cpu,) = body["nodePools"]
    assert cpu["config"]["machineType"] == "n2-standard-8" and cpu["initialNodeCount"] == 1
    # every pool runs as the nodes' account: the default Compute Engine one, its number filled in at provision
    for pool in (cpu, *r.tpu_node_pools(spec, t)):
        assert pool["config"]["serviceAccount"] == "PROJECT_NUMBER-compute@developer.gserviceaccount.com"
    account = "tpu-nodes@my-project.iam.gserviceaccount.com"
    named, tn = spec_and_target("gemma4-e2b-v6e-16", f"gke.node_service_account={account}")
    assert {p["config"]["serviceAccount"] for p in r.tpu_node_pools(named, tn)} == {account}
    assert t.parent == "projects/my-project/locations/us-east5-b"
    container_types().Cluster.from_json(json.dumps(body))
    head = m.raycluster(spec, t)["spec"]["headGroupSpec"]
    assert head["template"]["spec"]["nodeSelector"] == {r.NODE_LABEL_NODE_POOL: cpu["name"]}


def test_autopilot_cluster_and_capacity_selectors():
    spec, t = spec_and_target("gemma4-e2b-v6e-16", "gke.cluster_mode=autopilot cluster.capacity=spot")
    body = r.cluster(spec, t)
    assert body["autopilot"] == {"enabled": True} and "nodePools" not in body
    assert body["autoscaling"]["autoprovisioningNodePoolDefaults"]["serviceAccount"] == t.node_service_account
    assert t.location == "us-east5" and r.tpu_node_pools(spec, t) == [] and r.cpu_node_pool(spec, t) is None
    container_types().Cluster.from_json(json.dumps(body))
    selector = m.raycluster(spec, t)["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
    assert selector == {
        r.NODE_LABEL_ACCELERATOR: "tpu-v6e-slice",
        r.NODE_LABEL_TOPOLOGY: "4x4",
        "cloud.google.com/gke-spot": "true",
    }
    shared, ts = spec_and_target(
        "gemma4-e2b-v6e-16",
        "gke.cluster_mode=autopilot cluster.capacity=reservation "
        "cluster.reservation=projects/other-project/reservations/r1",
    )
    selector = m.raycluster(shared, ts)["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
    assert selector["cloud.google.com/reservation-name"] == "r1"
    assert selector["cloud.google.com/reservation-project"] == "other-project"
    assert selector["cloud.google.com/reservation-affinity"] == "specific"


def test_existing_cluster_is_used_not_created():
    spec, t = spec_and_target("llama3-8b-v6e-16x2", "gke.cluster_name=team-cluster")
    assert r.cluster(spec, t) is None and t.cluster == "team-cluster" and not t.owns_cluster
    assert r.cpu_node_pool(spec, t)["name"] == names.cpu_node_pool(t.run_id)


def test_on_a_cluster_the_run_does_not_create_the_plan_warns_that_the_namespace_fences_its_bucket_access():
    """The bucket binding's principal is the ServiceAccount's namespace and name: on an existing (shared) cluster,
    whoever may create pods there may run as it, which the plan says, naming gke.namespace."""
    from components.platforms.gke.plan import document as plan

    shared = plan.build(resolve("llama3-8b-v6e-16x2", "gke.cluster_name=team-cluster gke.namespace=ml"), "r1")
    (warning,) = [w for w in shared["warnings"] if w.startswith("gke.namespace=")]
    said = "gke.namespace=ml: whoever may create pods in that namespace of this cluster may run them as the run's "
    assert said + "ServiceAccount tpupipe-r1" in warning
    own = plan.build(resolve("llama3-8b-v6e-16x2"), "r1")
    assert not [w for w in own["warnings"] if w.startswith("gke.namespace=")]


def test_head_of_torchtpu_takes_no_work_and_worker_pod_sizes():
    spec, t = spec_and_target("gemma4-e2b-v6e-16")
    rc = m.raycluster(spec, t)["spec"]
    head = rc["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    ports = {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports == {6379, 8265}  # no Ray Client port 10001: nothing uses it
    assert head["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}
    worker = rc["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["containers"][0]["resources"]["requests"] == {"cpu": "64", "memory": "200Gi", r.TPU_RESOURCE: "4"}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "100Gi"}} in worker["volumes"]
    jax, tj = spec_and_target("llama3-8b-v6e-16x2")
    assert m.raycluster(jax, tj)["spec"]["headGroupSpec"]["rayStartParams"] == {}


def test_hugging_face_token_is_the_runs_own_secret_mounted_as_a_file_never_an_env_var():
    spec, t = spec_and_target("gemma4-e2b-v6e-16")
    rc = m.raycluster(spec, t)["spec"]
    own = names.hf_token_secret(t.run_id)
    assert own != spec.gke.hf_secret and t.run_id in own
    for group in (rc["headGroupSpec"], rc["workerGroupSpecs"][0]):
        pod = group["template"]["spec"]
        container = pod["containers"][0]
        assert [e for e in container["env"] if e["name"] == "HF_TOKEN"] == []
        assert "secretKeyRef" not in json.dumps(container["env"])
        assert {"name": "HF_TOKEN_PATH", "value": "/var/run/secrets/tpupipe/hf/token"} in container["env"]
        assert {"name": "hf-token", "mountPath": "/var/run/secrets/tpupipe/hf", "readOnly": True} in container[
            "volumeMounts"
        ]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "hf-token"]
        assert volume["secret"] == {
            "secretName": own,
            "items": [{"key": "hf_api_token", "path": "token"}],
            "defaultMode": 0o440,
        }
    none, tn = spec_and_target("gemma4-e2b-v6e-16", "gke.hf_secret=")
    assert "HF_TOKEN" not in json.dumps(m.raycluster(none, tn)) and "hf-token" not in json.dumps(m.raycluster(none, tn))


def test_checkpoint_bucket_is_mounted_with_gcs_fuse_and_the_pods_use_the_run_service_account():
    spec, t = spec_and_target("gemma4-e2b-v6e-16", "gke.project=my-project")
    assert t.bucket == "my-project-tpupipe"
    rc = m.raycluster(spec, t)["spec"]
    for group in (rc["headGroupSpec"], rc["workerGroupSpecs"][0]):
        pod = group["template"]
        # the sidecar's limits lifted, as the MaxText GKE tutorial's sample does for 70B checkpoints (docs/tutorials.md)
        assert pod["metadata"]["annotations"] == {
            "gke-gcsfuse/volumes": "true",
            "gke-gcsfuse/cpu-limit": "0",
            "gke-gcsfuse/memory-limit": "0",
            "gke-gcsfuse/ephemeral-storage-limit": "0",
        }
        assert pod["spec"]["serviceAccountName"] == t.service_account == names.service_account(t.run_id)
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints"]
        assert volume["csi"] == {
            "driver": "gcsfuse.csi.storage.gke.io",
            "volumeAttributes": {
                "bucketName": "my-project-tpupipe",
                "mountOptions": f"implicit-dirs,uid=1000,gid=1000,only-dir=runs/{t.run_id}",
            },
        }  # no file cache: there is no cache volume; the run's own directory alone
        assert not any(v["name"] == "gke-gcsfuse-cache" for v in pod["spec"]["volumes"])
        mount = {"name": volume["name"], "mountPath": f"/data/runs/{t.run_id}"}
        assert mount in pod["spec"]["containers"][0]["volumeMounts"] and t.run_dir == mount["mountPath"]
    # the workers alone also mount the bucket's cache/ prefix, read-only: what the pipeline's side keeps across runs
    worker, head = rc["workerGroupSpecs"][0]["template"]["spec"], rc["headGroupSpec"]["template"]["spec"]
    (cached,) = [v for v in worker["volumes"] if v["name"] == "compile-cache"]
    assert cached["csi"]["volumeAttributes"]["mountOptions"] == "implicit-dirs,uid=1000,gid=1000,only-dir=cache"
    assert cached["csi"]["readOnly"] is True
    assert {"name": "compile-cache", "mountPath": "/cache", "readOnly": True} in worker["containers"][0]["volumeMounts"]
    assert not [v for v in head["volumes"] if v["name"] == "compile-cache"]
    binding, reading = tg.bucket_binding(t), tg.cache_binding(t)
    assert binding["role"] == "roles/storage.objectUser" and reading["role"] == "roles/storage.objectViewer"
    assert binding["member"].endswith("my-project.svc.id.goog/kubernetes.serviceaccount.uid/SERVICEACCOUNT_UID")
    assert reading["member"] == binding["member"]
    assert binding["condition"]["expression"] == (
        f'resource.name.startsWith("projects/_/buckets/my-project-tpupipe/objects/runs/{t.run_id}/") '
        f'|| resource.name.startsWith("projects/_/buckets/my-project-tpupipe/folders/runs/{t.run_id}/") '
        '|| resource.type == "storage.googleapis.com/Bucket"'
    )
    assert reading["condition"]["expression"] == (
        'resource.name.startsWith("projects/_/buckets/my-project-tpupipe/objects/cache/") '
        '|| resource.name.startsWith("projects/_/buckets/my-project-tpupipe/folders/cache/")'
    )
    # evaluated as IAM evaluates it (the emulator's CEL subset): the run's own folders (an HNS bucket's directories,
    # which Cloud Storage FUSE creates and renames), never another run's or the cache's for writing
    from tests.emulators.iam import condition

    writes = condition(binding["condition"]["expression"])
    folder = "storage.googleapis.com/Folder"
    base = "projects/_/buckets/my-project-tpupipe/folders"
    assert writes({"resource.name": f"{base}/runs/{t.run_id}/checkpoints/3/", "resource.type": folder})
    assert not writes({"resource.name": f"{base}/runs/another-run/checkpoints/3/", "resource.type": folder})
    assert not writes({"resource.name": f"{base}/cache/compile/", "resource.type": folder})
    assert condition(reading["condition"]["expression"])({"resource.name": f"{base}/cache/x/", "resource.type": folder})


def test_the_train_job_command_carries_the_spec_and_the_stage_submission_id():
    spec, t = spec_and_target("gemma4-e2b-v6e-16")
    command = r.entrypoint(spec, t)
    assert command.startswith("python -m trainers.fsdp --spec ")
    argv = shlex.split(command)
    assert json.loads(argv[argv.index("--spec") + 1]) == spec.to_dict()
    assert argv[argv.index("--output-dir") + 1] == f"/data/runs/{t.run_id}"
    assert names.job_submission_id(t.run_id, "train") == f"{t.run_id}-train"  # what components.stages submits
    assert d.JOB_RUNTIME_ENV["env_vars"]["PYTHONUNBUFFERED"] == "1"


def test_the_maxtext_job_command_ends_with_the_exact_maxtext_arguments():
    spec, t = spec_and_target("llama3-8b-v6e-16x2")
    argv = shlex.split(r.entrypoint(spec, t))
    # the run's own verified copy of the compile cache (the build gives the digest)
    compiled = f"/data/runs/{t.run_id}/cache/compile/llama3-8b/v6e-4x4-2-slice/{cache.UNKNOWN_IMAGE}"
    assert argv[argv.index("--") + 1 :] == maxtext.train_args(spec, t.run_dir, t.run_id, compiled)
    assert "model_name=llama3-8b" in argv and "ici_tensor_parallelism=4" in argv


def test_every_created_object_carries_the_run_label():
    spec, t = spec_and_target("llama3-70b-v6e-16x2")
    for obj in m.all_objects(spec, t):
        if obj["kind"] != "Namespace":  # shared by runs, never deleted by one
            assert obj["metadata"]["labels"] == {names.RUN_LABEL: t.run_id}
    for pool in [*r.tpu_node_pools(spec, t), r.cpu_node_pool(spec, t)]:
        assert pool["config"]["resourceLabels"] == {names.RUN_LABEL: t.run_id}


def test_names_derive_from_the_run_id_and_fit_their_limits():
    run_id = "r" + "x" * 39  # the longest run id
    assert len(names.gke_cluster(run_id)) <= 40
    assert len(names.tpu_node_pool(run_id, 63)) <= 40 and names.tpu_node_pool(run_id, 63).endswith("-s63")
    assert len(names.cpu_node_pool(run_id)) <= 40
    assert len(names.raycluster(run_id)) <= 53
    assert len(names.dcn_subnet(run_id, 1)) <= 63
    assert names.tpu_node_pool(run_id, 0) != names.tpu_node_pool(run_id + "y", 0)
    assert names.fit("short", 10) == "short"
    cut = names.fit("a" * 50, 40)
    assert len(cut) == 40 and cut == names.fit("a" * 50, 40) and cut != names.fit("a" * 49 + "b", 40)
    spec = resolve("llama3-8b-v6e-16x2")
    assert tg.target(spec, "same-id") == tg.target(spec, "same-id")


def test_zone_default_and_image():
    spec, t = spec_and_target("gemma4-e2b-tpu7x-16")
    assert (t.zone, t.region) == ("us-central1-c", "us-central1")
    assert t.image == "us-central1-docker.pkg.dev/PROJECT_ID/tpupipe/torch:gemma4-e2b-tpu7x-16"
    spec, t = spec_and_target("llama3-8b-v6e-16x2", "gke.zone=europe-west4-a gke.project=p-123456")
    assert t.image == "europe-west4-docker.pkg.dev/p-123456/tpupipe/maxtext:llama3-8b-v6e-16x2"


def test_gke_versions():
    assert d.version_at_least("1.35.2-gke.1842000", "1.35.2-gke.1842000")
    assert not d.version_at_least("1.35.2-gke.1841999", "1.35.2-gke.1842000")
    assert d.version_at_least("1.36", "1.35.2-gke.1842000") and d.version_at_least("latest", "1.35.2-gke.1842000")
    assert not d.version_at_least("1.34", "1.35.2-gke.1842000")
    assert d.parse_gke_version("1.35.x") is None


def test_llama3_presets_are_seed_a():
    for name in ("llama3-8b-v6e-16x2", "llama3-70b-v6e-16x2", "llama3-8b-v6e-elastic-spot"):
        spec, t = spec_and_target(name)
        c = spec.cluster
        assert (c.accelerator, c.topology, c.num_hosts, c.num_slices) == ("v6e", "4x4", 4, 2)
        assert spec.train.workload == "maxtext" and spec.gke.cpu_machine_type == "n2-standard-16"
        rc = m.raycluster(spec, t)["spec"]
        head = rc["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert head == {"cpu": "8", "memory": "16Gi"}
        worker = rc["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert worker == {"cpu": "8", "memory": "200Gi", r.TPU_RESOURCE: "4"}
        assert [p["name"] for p in r.tpu_node_pools(spec, t)] == [f"{name}-s0", f"{name}-s1"]
    elastic = resolve("llama3-8b-v6e-elastic-spot")
    assert (elastic.train.min_workers, elastic.train.max_workers, elastic.train.max_failures) == (4, 8, 3)
    assert elastic.cluster.capacity == "spot"


def test_documented_zones():
    from components.tpu import catalogue

    assert catalogue.zones("v6e")[0] == "us-east5-b" and "europe-west4-a" in catalogue.zones("trillium")
    assert catalogue.zones("tpu7x") == ["us-central1-c"]
    assert all(catalogue.zones(f) for f in catalogue.FAMILIES)
    spec, t = spec_and_target("gemma4-e2b-v6e-16", "gke.zone=us-west1-a")
    from components.platforms.gke.plan import document as plan

    assert any("gke.zone=us-west1-a" in w for w in plan.build(spec, "r")["warnings"])


@pytest.mark.parametrize("preset", ["gemma4-e2b-v6e-16", "llama3-8b-v6e-16x2"])
@pytest.mark.parametrize("non_root", [False, True])
def test_every_pod_runs_unprivileged_and_the_run_is_fenced_by_network_policies(preset, non_root):
    """Unprivileged, no escalation, the runtime's seccomp profile; the head (no TPU chips) always as uid/gid 1000 with
    every capability dropped, the TPU workers so with gke.run_as_non_root (the TPU device files handed to them by the
    runtime), by default as the image's root (no GKE source says its TPU nodes hand the device files to another
    uid, and containerd's default configuration does not)."""
    spec, t = spec_and_target(preset, "gke.run_as_non_root=true" if non_root else "")
    objects = m.all_objects(spec, t)
    rc = objects[-1]["spec"]
    for group in (rc["headGroupSpec"], *rc["workerGroupSpecs"]):
        tpu = group is not rc["headGroupSpec"]
        user = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000} if non_root or not tpu else {}
        dropped = {"capabilities": {"drop": ["ALL"]}} if non_root or not tpu else {}
        pod = group["template"]["spec"]
        assert pod["securityContext"] == {**user, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
        for container in pod["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "readOnlyRootFilesystem": True,
                **dropped,
            }
            assert {"name": "HOME", "value": "/home/tpupipe"} in container["env"]
            # The root filesystem read-only: everything written has a volume (HOME, /tmp, the bucket, /dev/shm).
            mounted = {v["mountPath"]: v["name"] for v in container["volumeMounts"]}
            assert mounted["/home/tpupipe"] == "home" and mounted["/tmp"] == "tmp" and mounted[t.run_dir]
            assert 10001 not in [p["containerPort"] for p in container.get("ports", [])]
        assert {"name": "home", "emptyDir": {}} in pod["volumes"] and {"name": "tmp", "emptyDir": {}} in pod["volumes"]
    assert "10001" not in json.dumps(objects)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    kinds = [o["kind"] for o in objects]
    assert kinds.index("NetworkPolicy") < kinds.index("RayCluster")  # in force before any pod starts
    run = {"tpupipe-run": t.run_id}
    assert [p["spec"] for p in policies] == [
        {
            "podSelector": {"matchLabels": run},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": run}}]}],
        },
        {
            "podSelector": {"matchLabels": {**run, "ray.io/node-type": "head"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": 8265}]}],
        },
        {  # what the pods may send (tests/gke/test_private_nodes.py pins its rules)
            "podSelector": {"matchLabels": run},
            "policyTypes": ["Egress"],
            "egress": network.egress_rules(t),
        },
    ]
    assert all(p["metadata"]["labels"] == run for p in policies)  # teardown deletes them by the label


def test_gke_read_only_root_false_leaves_the_containers_root_filesystem_writable():
    spec, t = spec_and_target("gemma4-e2b-v6e-16", "gke.read_only_root=false")
    rc = m.all_objects(spec, t)[-1]["spec"]
    for group in (rc["headGroupSpec"], *rc["workerGroupSpecs"]):
        (container,) = group["template"]["spec"]["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is False


@pytest.mark.parametrize("preset", ["gemma4-e2b-v6e-16", "llama3-8b-v6e-16x2", "gemma4-e2b-tpu7x-16"])
def test_every_node_pool_the_run_creates_is_shielded_with_secure_boot(preset):
    from google.cloud import container_v1

    spec, t = spec_and_target(preset)
    pools = [*r.tpu_node_pools(spec, t), r.cpu_node_pool(spec, t)]
    for pool in pools:
        parsed = container_v1.NodePool.from_json(json.dumps(pool))  # GKE's own message: the field is real
        assert parsed.config.shielded_instance_config.enable_secure_boot is True
        assert parsed.config.shielded_instance_config.enable_integrity_monitoring is True
