"""The KubeRay operator's part in the Kubernetes emulator: for a RayCluster the API server has stored it makes the head
and worker pods and the head's service, hands the pods to the scheduler (``kubelet.Kubelet.place``), and once they
run, starts Ray in them (``ray.Ray``) the way KubeRay starts it: the head, and replicas x numOfHosts raylets with the
resources KubeRay gives them from the containers (CPU from the cpu limit, ``TPU`` from google.com/tpu, the group's
``resources``) and the environment the KubeRay TPU webhook injects into a TPU pod, with Ray token authentication on
(the token Secret KubeRay 1.5 generates); then it reports the status fields KubeRay reports. A suspended RayCluster
gets no pods, and stopping one (deleted, or suspended by Kueue) takes its pods, its service and its Ray with it.
"""

from __future__ import annotations

import base64
import secrets
import threading
import time

from tests.emulators.kube.kubelet import Kubelet
from tests.emulators.kube.objects import Objects, now
from tests.emulators.kube.ray import Node, Ray

# KubeRay's utils.CheckName, which names the generated token Secret after its RayCluster: the last 50 characters, a
# leading digit or punctuation replaced by "r" (ray-operator/controllers/ray/utils/util.go at tag ray-operator/v1.5.1).
CHECK_NAME_MAX = 50
TPU_RESOURCE = "google.com/tpu"


def check_name(name: str) -> str:
    name = name[-CHECK_NAME_MAX:]
    return "r" + name[1:] if name[0].isdigit() or not name[0].isalnum() else name


def tpu_webhook_env(pod: dict, group: dict) -> dict[str, str]:
    """What the KubeRay TPU webhook injects into a TPU worker pod (Ray reads it to label the host with its
    slice, worker id, topology and pod type). The chips are emulated: the raylet computes on CPU."""
    selector = pod["spec"].get("nodeSelector", {})
    topology = selector.get("cloud.google.com/gke-tpu-topology", "")
    version = selector.get("cloud.google.com/gke-tpu-accelerator", "").removeprefix("tpu-").split("-")[0]
    chips = 1
    for dim in topology.split("x"):
        chips *= int(dim)
    _, _, replica, host = pod["metadata"]["name"].rsplit("-", 3)
    slice_name = f"{pod['metadata']['labels']['ray.io/cluster']}-{group['groupName']}-{replica}"
    injected = {
        "TPU_ACCELERATOR_TYPE": f"{version}-{chips}",
        "TPU_TOPOLOGY": topology,
        "TPU_WORKER_ID": host,
        "TPU_NAME": slice_name,
        "TPU_WORKER_HOSTNAMES": ",".join(["127.0.0.1"] * group.get("numOfHosts", 1)),
    }
    # The multislice rule: a container whose spec names MEGASCALE_NUM_SLICES also gets its replica as
    # MEGASCALE_SLICE_ID, worker 0 of replica 0 as MEGASCALE_COORDINATOR_ADDRESS and port 8081, each unless set;
    # without it, no MEGASCALE_* at all (``mutatePod``, https://github.com/ai-on-gke/kuberay-tpu-webhook/blob/
    # main/main.go, ``megascalePortBase``).
    spec_env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}
    if "MEGASCALE_NUM_SLICES" in spec_env:
        multislice = {"MEGASCALE_SLICE_ID": replica, "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1"}
        injected |= {k: v for k, v in (multislice | {"MEGASCALE_PORT": "8081"}).items() if not spec_env.get(k)}
    return injected


class KubeRay:
    """The RayCluster controller over the API server's ``objects`` (guarded by ``lock``): its pods go to
    ``kubelet``, its Ray runs in ``ray``; ``ready_delay_s``: how long after Ray is up the RayCluster is reported
    ready."""

    def __init__(self, objects: Objects, lock, kubelet: Kubelet, ray: Ray, ready_delay_s: float = 0.0):
        self.objects, self.lock, self.kubelet, self.ray = objects, lock, kubelet, ray
        self.ready_delay_s = ready_delay_s

    def created(self, namespace: str, obj: dict) -> None:
        """A new RayCluster (that Kueue does not hold)."""
        if obj["spec"].get("suspend"):
            # KubeRay makes no pods for a suspended RayCluster ("A suspended RayCluster will have head pods
            # and worker pods deleted": ray-project/kuberay v1.7.0, ray-operator/apis/ray/v1/
            # raycluster_types.go, ``Suspend``): it waits for whoever unsuspends it.
            obj["status"] = {"state": "suspended", "desiredWorkerReplicas": 0, "readyWorkerReplicas": 0}
        else:
            self.reconcile(namespace, obj)

    def _pod(self, namespace: str, cluster: str, name: str, group: dict, node_type: str) -> dict:
        template = group["template"]
        labels = {
            **template.get("metadata", {}).get("labels", {}),
            "ray.io/cluster": cluster,
            "ray.io/node-type": node_type,
            "ray.io/group": group.get("groupName", "headgroup"),
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": secrets.token_hex(8),
                "labels": labels,
                "annotations": dict(template.get("metadata", {}).get("annotations", {})),
            },
            "spec": template["spec"],
            "status": {"phase": "Pending", "conditions": []},
        }

    def reconcile(self, namespace: str, obj: dict) -> None:
        """An unsuspended RayCluster's pods, head service and status made; its pods handed to the scheduler."""
        name = obj["metadata"]["name"]
        spec = obj["spec"]
        self._generate_token_secret(namespace, obj)
        pods = [self._pod(namespace, name, f"{name}-head", spec["headGroupSpec"], "head")]
        for group in spec.get("workerGroupSpecs", []):
            for replica in range(group.get("replicas", 1)):
                for host in range(group.get("numOfHosts", 1)):
                    pods.append(
                        self._pod(namespace, name, f"{name}-{group['groupName']}-{replica}-{host}", group, "worker")
                    )
        for pod in pods:
            self.objects[("pods", namespace, pod["metadata"]["name"])] = pod
        self.objects[("services", namespace, f"{name}-head-svc")] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{name}-head-svc", "namespace": namespace, "labels": {"ray.io/cluster": name}},
            "spec": {"ports": [{"name": "dashboard", "port": 8265}]},
        }
        desired = sum(g.get("replicas", 1) * g.get("numOfHosts", 1) for g in spec.get("workerGroupSpecs", []))
        obj["status"] = {
            "desiredWorkerReplicas": desired,
            "availableWorkerReplicas": 0,
            "readyWorkerReplicas": 0,
            "state": "",
            "conditions": [],
        }
        self.kubelet.place(namespace, obj, pods)

    def _generate_token_secret(self, namespace: str, obj: dict) -> None:
        """KubeRay's reconcileAuthSecret for a RayCluster in token mode that names no Secret (all KubeRay 1.5 can
        do): unless it exists, a Secret named after the RayCluster (``check_name``), labelled ``ray.io/cluster``,
        owned by the RayCluster (so deleting it deletes the Secret:
        https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents), with a random token
        under ``auth_token`` (raycluster_controller.go createAuthSecret at tag ray-operator/v1.5.1: 32 random bytes,
        base64)."""
        auth = obj["spec"].get("authOptions", {})
        if auth.get("mode") != "token" or auth.get("secretName"):
            return
        name = obj["metadata"]["name"]
        key = ("secrets", namespace, check_name(name))
        if key in self.objects:
            return
        token = base64.b64encode(secrets.token_bytes(32)).decode()
        owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name, "uid": obj["metadata"]["uid"]}
        self.objects[key] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": key[2],
                "namespace": namespace,
                "labels": {"ray.io/cluster": name},
                "ownerReferences": [{**owner, "controller": True}],
            },
            "data": {"auth_token": base64.b64encode(token.encode()).decode()},
        }

    def _ray_token(self, namespace: str, obj: dict) -> str:
        """The token Ray runs with: '' when it runs without token authentication (``Ray.auth_off``, or a spec not in
        token mode)."""
        auth = obj["spec"].get("authOptions", {})
        if self.ray.auth_off or auth.get("mode") != "token":
            return ""
        secret_name = auth.get("secretName") or check_name(obj["metadata"]["name"])
        key = ("secrets", namespace, secret_name)
        if key not in self.objects:  # KubeRay generates the Secret when the spec names none
            self.objects[key] = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": namespace},
                "data": {"auth_token": base64.b64encode(secrets.token_hex(16).encode()).decode()},
            }
        return base64.b64decode(self.objects[key]["data"]["auth_token"]).decode()

    def pods_started(self, namespace: str, obj: dict, pods: list[dict]) -> None:
        """The RayCluster's pods are placed and start: Ray starts in them (in the background); or, with no Ray
        environment and ``Ray.ready_without_ray``, the emulated Jobs API stands for it and the cluster is ready."""
        if self.ray.env is not None:
            threading.Thread(target=self._start_ray, args=(namespace, obj, pods), daemon=True).start()
        elif self.ray.ready_without_ray:
            name = obj["metadata"]["name"]
            self.ray.serve_jobs((namespace, name), self._ray_token(namespace, obj))
            self.mark_ready(namespace, name, len(pods))

    def _start_ray(self, namespace: str, obj: dict, pods: list[dict]) -> None:
        from components.tpu import catalogue

        name = obj["metadata"]["name"]
        run_id = obj["metadata"].get("labels", {}).get("tpupipe-run", name)
        self.ray.wait_stopped((namespace, name))  # suspended (evicted), then admitted again: its old processes end
        with self.lock:
            token = self._ray_token(namespace, obj)
            head_group = obj["spec"]["headGroupSpec"]
            envs = {
                pod["metadata"]["name"]: self.kubelet.container_env(
                    namespace, pod["spec"]["containers"][0], self.kubelet.volumes(namespace, pod)
                )
                for pod in pods
            }
        head_cpus = head_group.get("rayStartParams", {}).get(
            "num-cpus", head_group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        )
        head = pods[0]["metadata"]["name"]
        nodes = [Node(head, head_cpus, envs[head], self.kubelet.log_file(name, head))]
        for pod in pods[1:]:
            container = pod["spec"]["containers"][0]
            limits = container["resources"]["limits"]
            resources = {"TPU": int(limits[TPU_RESOURCE])} if TPU_RESOURCE in limits else {}
            group = next(
                g
                for g in obj["spec"]["workerGroupSpecs"]
                if pod["metadata"]["labels"]["ray.io/group"] == g["groupName"]
            )
            resources |= {k: float(v) for k, v in group.get("resources", {}).items()}
            accelerator = pod["spec"].get("nodeSelector", {}).get("cloud.google.com/gke-tpu-accelerator")
            if resources.get("TPU") and accelerator:  # what Ray detects on a real TPU host
                resources[f"accelerator_type:{catalogue.family(accelerator).ray_accelerator_type}"] = 1
            webhook_env = tpu_webhook_env(pod, group) if resources.get("TPU") else {}
            pod_name = pod["metadata"]["name"]
            nodes.append(
                Node(
                    pod_name,
                    limits["cpu"],
                    envs[pod_name] | webhook_env,
                    self.kubelet.log_file(name, pod_name),
                    resources=resources,
                    labels={"tpupipe/host": pod_name},
                )
            )
        if self.ray.run((namespace, name), run_id, token, nodes):
            time.sleep(self.ready_delay_s)
            self.mark_ready(namespace, name, len(nodes))

    def mark_ready(self, namespace: str, name: str, want: int) -> None:
        """KubeRay's report of a RayCluster whose ``want`` pods (the head and the workers) all run and are ready."""
        with self.lock:
            obj = self.objects.get(("rayclusters", namespace, name))
            if obj is None:
                return
            self.kubelet.pods_running(namespace, name)
            status = obj["status"]
            status.update(
                {
                    "state": "ready",
                    "readyWorkerReplicas": want - 1,
                    "availableWorkerReplicas": want - 1,
                    "head": {"serviceName": f"{name}-head-svc", "podName": f"{name}-head"},
                    "conditions": [
                        {
                            "type": "HeadPodReady",
                            "status": "True",
                            "reason": "HeadPodRunningAndReady",
                            "lastTransitionTime": now(),
                        },
                        {
                            "type": "RayClusterProvisioned",
                            "status": "True",
                            "reason": "AllPodRunningAndReadyFirstTime",
                            "lastTransitionTime": now(),
                        },
                    ],
                }
            )

    def stop_pods(self, namespace: str, name: str) -> None:
        """The RayCluster's pods and services gone (deleted, or suspended: KubeRay makes no pods for a suspended
        RayCluster), its local Ray processes stopped."""
        for key in [
            k
            for k, o in self.objects.items()
            if k[0] in ("pods", "services")
            and k[1] == namespace
            and o["metadata"].get("labels", {}).get("ray.io/cluster") == name
        ]:
            self.objects.pop(key)
        self.ray.stop((namespace, name))
