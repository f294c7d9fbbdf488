"""The nodes' side of the Kubernetes emulator: the scheduler, the cluster autoscaler and the kubelet, for the pods
KubeRay makes for a RayCluster (``Kubelet.place``, all of them together):

- node taints and pod tolerations (``taints``, Kubernetes' matching rules): the nodes a ProvisioningRequest brings
  carry GKE's queued provisioning taint (``provisioning.QUEUED_TAINT``), and a pod that does not tolerate it stays
  Pending, Unschedulable with the scheduler's ``untolerated taint`` message, while the nodes are up;
- ProvisioningRequests (``provisioning``): a request's pods wait until it is Provisioned, then are scheduled together;
  ``lose_pod`` loses a host mid-run;
- the scheduler's and the cluster autoscaler's core/v1 Events on the worker pods it cannot place (the API server
  lists them by ``fieldSelector``);
- a placed pod starts unless a Secret it names is missing (CreateContainerConfigError); what then runs in it is
  ``start_containers`` (KubeRay's Ray: ``kuberay.KubeRay.pods_started``); its emptyDir and Secret volumes are
  directories here (``volumes``) and its environment is resolved (``container_env``); its container's output is its
  log (``pod_log``, which the API server's ``pods/log`` answers);
- the pods' Cloud Storage FUSE volumes: a RayCluster's pods mount a bucket (``volumeAttributes.bucketName`` of a CSI
  volume of the ``gcsfuse.csi.storage.gke.io`` driver), or only a directory of it (the ``only-dir=D`` mount option),
  where their manifest says (the gke platform's: ``/data``), and the emulated pods are processes on this machine,
  which has no such mount; so the storage emulator's directory of that bucket (``bucket_dir(bucket)``, whose files
  are the bucket's objects: tests/emulators/storage.py), or its ``D`` under it, plays each mount: a path under a
  mount path in what a caller sends to the cluster through the proxy (a job's entrypoint) is the same path under that
  directory for the processes, and such a path in what the cluster answers (a job's log and records) is shown under
  the mount path again, as a pod prints it. A path under none of the mounts is left as it is (a pod cannot reach it,
  as on GKE). What the pods write there is in the bucket, and what is written to the bucket through the Cloud Storage
  API is there for the pods. The caller (a pipeline task, the stages) sees the pods' paths only, as on GKE, and needs
  no mount of its own.

Faults: ``unschedulable`` (pods stay Pending with the scheduler's reason), ``image_pull`` (ErrImagePull),
``scale_from_zero`` (the node pool starts with no nodes: the worker pods are Unschedulable with a TriggeredScaleUp
event for ``scale_up_s`` seconds, then the nodes come and the pods are scheduled as without the fault) and
``never_scales_up`` (Unschedulable, and the scale-up fails: ``scale_up_failure``, a FailedScaleUp after a
TriggeredScaleUp and ``scale_up_s``, or a NotTriggerScaleUp at once). ``stockouts`` (with ``scale_from_zero``): the
first that many scale-ups fail with a FailedScaleUp (GCE out of resources) and the autoscaler tries again after its
backoff (``scale_up_s`` here; 5 minutes at first, doubling up to 30, in the cluster autoscaler: its flags
initial-node-group-backoff-duration and max-node-group-backoff-duration,
https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md), a TriggeredScaleUp again, until the
nodes come. ``never_starts``: the pods are scheduled but their container stays waiting in ContainerCreating (the
kubelet's reason for a container not yet started, while its image is pulled: kubernetes/kubernetes,
pkg/kubelet/kubelet_pods.go), so the RayCluster never becomes ready.
"""

from __future__ import annotations

import base64
import copy
import re
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

from tests.emulators import provisioning, taints
from tests.emulators.kube.objects import Objects, cluster_pods, now, status

GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"  # Cloud Storage FUSE's CSI driver on GKE
UNSCHEDULABLE_MESSAGE = (
    "0/{n} nodes are available: {n} Insufficient google.com/tpu. preemption: 0/{n} nodes are "
    "available: {n} No preemption victims found for incoming pod."
)
# The cluster autoscaler's events on a pod it places by growing a pool (kubernetes/autoscaler FAQ, "What events are
# emitted by CA?"), the messages in GKE's words.
TRIGGERED_SCALE_UP = (
    "TriggeredScaleUp",
    "pod triggered scale-up: [{{https://www.googleapis.com/compute/v1/projects/"
    "{project}/zones/{zone}/instanceGroups/gke-{pool}-grp 0->{n} (max: {n})}}]",
)
OUT_OF_RESOURCES = (
    "FailedScaleUp",
    "Node scale up in zones {zone} associated with this pod failed: GCE out of "
    "resources. Pod is at risk of not being scheduled.",
)
NOT_TRIGGERED = ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached")
# After a failed scale-up the autoscaler keeps the node group in backoff until it may try again, and each loop meanwhile
# tells the pod so: a NotTriggerScaleUp naming the skipped reason "in backoff after failed scale-up"
# (kubernetes/autoscaler, cluster-autoscaler/core/scaleup/orchestrator/skippedreasons.go, ``BackoffReason``, at
# d610672804edab46a4931a26a9d11435cd698787; the event as GKE users see it: "pod didn't trigger scale-up: 1 in backoff
# after failed scale-up"). Recorded halfway through the backoff (``scale_up_s``), between the FailedScaleUp and the
# retry.
IN_BACKOFF = ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 in backoff after failed scale-up")


def into_pods(data: bytes, mounts: dict[str, Path]) -> bytes:
    """Paths at or under the pods' mounts (``/data/...``) as the emulated pods reach them: at or under the directory
    that plays each mount (``Kubelet.fuse_mounts``), the longest mount path that holds the path; a path under no mount
    stays as it is."""
    return _rewrite(data, {path: str(here) for path, here in mounts.items()})


def from_pods(data: bytes, mounts: dict[str, Path]) -> bytes:
    """Paths at or under the directories that play the pods' mounts as a pod shows them: at or under its mount path
    (wherever they are in the text, a ``file://`` URI's among them: those directories are this machine's own)."""
    return _rewrite(data, {str(here): path for path, here in mounts.items()}, start=b"")


# a path starts where no path's character is before it
PATH_START = rb"(?<![\w./-])"


def _rewrite(data: bytes, prefixes: dict[str, str], start: bytes = PATH_START) -> bytes:
    """``data`` with each path that is a key of ``prefixes``, or under one (the longest), starting with its value
    instead: where ``start`` matches before it, and followed by ``/`` or by no path's character."""
    if not (prefixes and data):
        return data
    keys = sorted(prefixes, key=len, reverse=True)
    alternatives = b"|".join(re.escape(key.encode()) for key in keys)
    pattern = re.compile(start + rb"(" + alternatives + rb")(?=/|(?![\w.-]))")
    return pattern.sub(lambda m: prefixes[m[1].decode()].encode(), data)


def running(container: dict) -> dict:
    """The kubelet's status of a container that started and runs: one entry per container of the pod's spec
    (PodStatus ``containerStatuses``; ContainerStatus ``state.running.startedAt``, ``ready``, ``restartCount``:
    https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus)."""
    return {
        "name": container["name"],
        "ready": True,
        "started": True,
        "image": container["image"],
        "imageID": container["image"],
        "restartCount": 0,
        "state": {"running": {"startedAt": now()}},
    }


def _waiting(pod: dict, reason: str, message: str = "") -> list[dict]:
    """The kubelet's status of a pod whose container has not started, ``reason`` (and ``message``) saying why."""
    container = pod["spec"]["containers"][0]
    return [
        {
            "name": container["name"],
            "ready": False,
            "image": container["image"],
            "imageID": "",
            "restartCount": 0,
            "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}},
        }
    ]


class Kubelet:
    """The scheduler, the cluster autoscaler and the kubelet over the API server's ``objects`` (guarded by ``lock``),
    with the ProvisioningRequests of ``provisioner``; a pod's files are under ``work_dir``."""

    def __init__(
        self,
        objects: Objects,
        lock,
        provisioner: provisioning.Provisioner,
        work_dir: Path,
        bucket_dir: Callable[[str], Path] | None = None,
        fault: str = "",
        scale_up_s: float = 2.0,
    ):
        self.objects, self.lock, self.provisioner, self.work_dir = objects, lock, provisioner, work_dir
        # a bucket's name -> the directory whose files are its objects, which plays the pods' mounts of it (the
        # storage emulator's bucket_dir); None: no mount is played (paths under the mounts are sent as they are)
        self.bucket_dir = bucket_dir
        self.fault = fault
        self.scale_up_s = scale_up_s  # scale_from_zero / never_scales_up: how long the nodes take to come (or fail)
        self.scale_up_failure = OUT_OF_RESOURCES  # never_scales_up: the autoscaler's event, or NOT_TRIGGERED
        self.stockouts = 0  # scale_from_zero: how many scale-ups fail (FailedScaleUp) before the nodes come
        # The GKE behind this API server (its ``scale_up_stockout``): given a worker pod's nodeSelector, the zone whose
        # TPU pools for it the autoscaler cannot grow (no flex-start capacity there), else None. Such pods scale from
        # zero and every scale-up fails (FailedScaleUp), retried after the backoff, for as long as the pods ask.
        self.scale_up_stockout: Callable[[dict], str | None] | None = None
        self.autoscaler_place = {"project": "tpupipe-emulated", "zone": "us-east5-b"}  # in the autoscaler's messages
        # what runs in a RayCluster's pods once they are placed and start: (namespace, RayCluster, its pods)
        self.start_containers: Callable[[str, dict, list[dict]], None] = lambda namespace, cluster, pods: None

    # ------------------------------------------------------------------ the scheduler
    def place(self, namespace: str, obj: dict, pods: list[dict]) -> None:
        """RayCluster ``obj``'s new ``pods`` (the head first) placed on nodes, together: at once, or once their
        ProvisioningRequest is Provisioned, or once the autoscaler has grown their pool; or never (the faults)."""
        if self.fault == "unschedulable":
            for pod in pods[1:]:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": UNSCHEDULABLE_MESSAGE.format(n=2),
                    }
                ]
            return
        if self.fault == "image_pull":
            for pod in pods:
                image = pod["spec"]["containers"][0]["image"]
                pod["status"]["containerStatuses"] = _waiting(
                    pod, "ErrImagePull", f'failed to pull image "{image}": not found'
                )
            return
        name = obj["metadata"]["name"]
        if self.provisioner.holds(namespace, pods, lambda: self._provisioned(namespace, name)):
            return  # its workers wait for their ProvisioningRequest
        if self.fault in ("scale_from_zero", "never_scales_up") or self._stocked_out(pods):
            return self._scale_from_zero(namespace, obj, pods)
        if self.fault == "never_starts":
            for pod in pods:
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                pod["status"]["containerStatuses"] = _waiting(pod, "ContainerCreating")
            return
        self._schedule(namespace, obj, pods)

    def _schedule(self, namespace: str, obj: dict, pods: list[dict]) -> None:
        """The pods are placed: they start (or cannot, for a Secret they lack), and Ray starts in them; unless a pod
        does not tolerate its nodes' taints (``_refused_by_taints``), when the pods stay as they are and Ray does not
        start."""
        if self._refused_by_taints(namespace, pods):
            return
        missing = self._missing_secrets(namespace, pods)
        if missing:
            for pod in pods:
                pod["status"]["containerStatuses"] = _waiting(
                    pod, "CreateContainerConfigError", f'secret "{missing}" not found'
                )
            return
        for pod in pods:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        self.start_containers(namespace, obj, pods)

    def _refused_by_taints(self, namespace: str, pods: list[dict]) -> bool:
        """The scheduler's taint filter (``taints``): a pod that does not tolerate a NoSchedule or NoExecute taint of
        the nodes it would land on (``provisioning.node_taints``: a queued provisioning pool's) is not scheduled; it
        stays Pending, Unschedulable with the scheduler's message, and a FailedScheduling event is recorded for it,
        while the nodes stay up (and bill). True when some pod is refused (the RayCluster then never gets ready)."""
        refused = {}
        for pod in pods:
            taint = taints.untolerated(pod["spec"], provisioning.node_taints(pod))
            if taint is not None:
                refused[pod["metadata"]["name"]] = taint
        if not refused:
            return False
        nodes = sum(1 for pod in pods if provisioning.node_taints(pod))  # one node per TPU host pod
        for pod in pods:
            taint = refused.get(pod["metadata"]["name"])
            if taint is None:
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                continue
            message = taints.refusal(taint, nodes)
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ]
            self._event(namespace, pod["metadata"]["name"], "FailedScheduling", message, "default-scheduler")
        return True

    def _missing_secrets(self, namespace: str, pods: list[dict]) -> str:
        """The first Secret a pod names (an env var's secretKeyRef, a secret volume) that the namespace lacks: the
        kubelet cannot start its containers (CreateContainerConfigError, or the volume's mount fails)."""
        for pod in pods:
            named = [v["secret"]["secretName"] for v in pod["spec"].get("volumes", []) if "secret" in v]
            for container in pod["spec"]["containers"]:
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        named.append(ref["name"])
            for name in named:
                if ("secrets", namespace, name) not in self.objects:
                    return name
        return ""

    # ------------------------------------------------------------------ the cluster autoscaler
    def _event(self, namespace: str, pod: str, reason: str, message: str, component: str) -> None:
        """A core/v1 Event about pod ``pod``, as the scheduler or the cluster autoscaler records it."""
        at = now()
        name = f"{pod}.{secrets.token_hex(8)}"
        self.objects[("events", namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace, "uid": secrets.token_hex(8), "creationTimestamp": at},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod},
            "reason": reason,
            "message": message,
            "type": "Normal" if reason == "TriggeredScaleUp" else "Warning",
            "source": {"component": component},
            "reportingComponent": component,
            "count": 1,
            "firstTimestamp": at,
            "lastTimestamp": at,
        }

    def _scale_from_zero(self, namespace: str, obj: dict, pods: list[dict]) -> None:
        """The TPU pool has no nodes: the worker pods are Unschedulable and the autoscaler grows the pool (after
        ``scale_up_s`` the nodes come and the pods are scheduled), or, for ``never_scales_up``, cannot."""
        workers = pods[1:]
        group = obj["spec"]["workerGroupSpecs"][0]["groupName"]
        triggered = TRIGGERED_SCALE_UP[1].format(pool=group, n=len(workers), **self.autoscaler_place)
        failure = self.fault == "never_scales_up" and self.scale_up_failure
        pods[0]["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]  # the head: on the CPU pool
        for pod in workers:
            message = UNSCHEDULABLE_MESSAGE.format(n=1)
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ]
            self._event(namespace, pod["metadata"]["name"], "FailedScheduling", message, "default-scheduler")
            if failure and failure[0] == NOT_TRIGGERED[0]:
                self._event(namespace, pod["metadata"]["name"], *failure, "cluster-autoscaler")
            else:
                self._event(namespace, pod["metadata"]["name"], TRIGGERED_SCALE_UP[0], triggered, "cluster-autoscaler")
        if failure and failure[0] == NOT_TRIGGERED[0]:
            return
        args = (namespace, obj["metadata"]["name"], failure, obj["metadata"].get("uid", ""))
        timer = threading.Timer(self.scale_up_s, self._nodes_came, args=args)
        timer.daemon = True
        timer.start()

    def _stocked_out(self, pods: list[dict]) -> str | None:
        """The zone where the GKE behind this server cannot grow the TPU pools the worker pods select
        (``scale_up_stockout``), else None."""
        workers = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
        if self.scale_up_stockout is None or not workers:
            return None
        return self.scale_up_stockout(workers[0]["spec"].get("nodeSelector") or {})

    def _nodes_came(self, namespace: str, name: str, failure, uid: str = "") -> None:
        with self.lock:
            obj = self.objects.get(("rayclusters", namespace, name))
            if obj is None or (uid and obj["metadata"].get("uid") != uid):  # deleted (or made anew) meanwhile
                return
            pods = cluster_pods(self.objects, namespace, name)
            workers = [p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
            zone = None if failure else self._stocked_out(pods)
            stockout = not failure and (zone is not None or self.stockouts > 0)
            if failure or stockout:
                reason, message = failure or OUT_OF_RESOURCES
                place = {**self.autoscaler_place, **({"zone": zone} if zone else {})}
                for pod in workers:
                    self._event(
                        namespace, pod["metadata"]["name"], reason, message.format(**place), "cluster-autoscaler"
                    )
                if stockout:  # in backoff (said halfway through it), then the autoscaler tries again
                    self.stockouts -= 0 if zone else 1
                    args = (namespace, name, workers, obj["metadata"].get("uid", ""))
                    for delay, then in (
                        (self.scale_up_s / 2, self._in_backoff),
                        (self.scale_up_s, self._retry_scale_up),
                    ):
                        timer = threading.Timer(delay, then, args=args)
                        timer.daemon = True
                        timer.start()
                return
            self._schedule(namespace, obj, pods)

    def _provisioned(self, namespace: str, name: str) -> None:
        """A ProvisioningRequest the RayCluster's workers consume is Provisioned: once every one they consume is, all
        its pods are placed (meanwhile those of the provisioned ones are PodScheduled)."""
        with self.lock:
            if self.provisioner.holds(namespace, cluster_pods(self.objects, namespace, name)):
                return
        self._nodes_came(namespace, name, None)

    def _live(self, namespace: str, name: str, uid: str) -> dict:
        """The RayCluster ``name`` when it is still the one the autoscaler acted for (``uid``), else {}."""
        obj = self.objects.get(("rayclusters", namespace, name)) or {}
        return obj if obj and not (uid and obj["metadata"].get("uid") != uid) else {}

    def _in_backoff(self, namespace: str, name: str, workers: list[dict], uid: str = "") -> None:
        with self.lock:
            if self._live(namespace, name, uid):
                for pod in workers:
                    self._event(namespace, pod["metadata"]["name"], *IN_BACKOFF, "cluster-autoscaler")

    def _retry_scale_up(self, namespace: str, name: str, workers: list[dict], uid: str = "") -> None:
        with self.lock:
            obj = self._live(namespace, name, uid)
            group = obj.get("spec", {})
            if not group:
                return
            pool = group["workerGroupSpecs"][0]["groupName"]
            triggered = TRIGGERED_SCALE_UP[1].format(pool=pool, n=len(workers), **self.autoscaler_place)
            for pod in workers:
                self._event(namespace, pod["metadata"]["name"], TRIGGERED_SCALE_UP[0], triggered, "cluster-autoscaler")
        timer = threading.Timer(self.scale_up_s, self._nodes_came, args=(namespace, name, None, uid))
        timer.daemon = True
        timer.start()

    # ------------------------------------------------------------------ the kubelet
    def volumes(self, namespace: str, pod: dict) -> dict[str, str]:
        """The pod's emptyDir and Secret volumes as directories here, by the container's mount path: a Secret's keys
        are files with the volume's mode (https://kubernetes.io/docs/concepts/configuration/secret/#using-secrets-as-
        files-from-a-pod). The processes of a pod see its paths there (``container_env``)."""
        root = self.work_dir / "pods" / namespace / pod["metadata"]["name"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        out = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            if "emptyDir" not in volume and "secret" not in volume:
                continue
            where = root / mount["name"]
            where.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                data = self.objects[("secrets", namespace, volume["secret"]["secretName"])].get("data", {})
                for item in volume["secret"].get("items") or [{"key": k, "path": k} for k in data]:
                    path = where / item["path"]
                    path.write_bytes(base64.b64decode(data[item["key"]]))
                    path.chmod(volume["secret"].get("defaultMode", 0o644))
            out[mount["mountPath"]] = str(where)
        return out

    def container_env(self, namespace: str, container: dict, mounts: dict[str, str] | None = None) -> dict[str, str]:
        out = {}
        for env in container.get("env", []):
            if "value" in env:
                value = env["value"]
                for path, here in (mounts or {}).items():  # a path in one of the pod's volumes: where it is here
                    if value == path or value.startswith(path + "/"):
                        value = here + value[len(path) :]
                out[env["name"]] = value
            elif "secretKeyRef" in env.get("valueFrom", {}):
                ref = env["valueFrom"]["secretKeyRef"]
                secret = self.objects[("secrets", namespace, ref["name"])]
                out[env["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        return out

    def log_file(self, cluster: str, pod: str) -> Path:
        """Where the output of RayCluster ``cluster``'s pod ``pod`` (its container's process) is kept."""
        return self.work_dir / "ray" / cluster / f"{pod}.out"

    def pods_running(self, namespace: str, cluster: str) -> None:
        """Every pod of RayCluster ``cluster`` runs, its containers started and ready."""
        for pod in cluster_pods(self.objects, namespace, cluster):
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [running(c) for c in pod["spec"]["containers"]],
            }

    def lose_pod(self, namespace: str, name: str, grace_s: float = 0.5) -> None:
        """A host lost while the run runs (its node preempted or shut down): the pod is terminated with the
        kubelet's words for a node shutdown (status.reason Terminated, "Pod was terminated in response to imminent
        node shutdown.": https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/) and is being
        deleted for ``grace_s``, then it is gone and KubeRay makes another in its place (same name, a new uid), as
        it keeps a worker group's replicas."""
        with self.lock:
            pod = self.objects[("pods", namespace, name)]
            pod["metadata"]["deletionTimestamp"] = now()
            pod["status"].update(
                phase="Failed",
                reason="Terminated",
                message="Pod was terminated in response to imminent node shutdown.",
            )
            for cs in pod["status"].get("containerStatuses") or []:
                cs["state"] = {"terminated": {"exitCode": 137, "reason": "Error"}}

        def replaced() -> None:
            with self.lock:
                old = self.objects.pop(("pods", namespace, name), None)
                if old is None:
                    return
                fresh = copy.deepcopy(old)
                fresh["metadata"] = {k: v for k, v in old["metadata"].items() if k != "deletionTimestamp"}
                fresh["metadata"]["uid"] = secrets.token_hex(8)
                fresh["status"] = {
                    "phase": "Running",
                    "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                    "containerStatuses": [running(c) for c in fresh["spec"]["containers"]],
                }
                self.objects[("pods", namespace, name)] = fresh

        timer = threading.Timer(grace_s, replaced)
        timer.daemon = True
        timer.start()

    def pod_log(self, namespace: str, name: str, query: dict) -> tuple[int, object]:
        """``GET /api/v1/namespaces/{ns}/pods/{name}/log``: the container's output, as the kubelet keeps it; its
        parameters ``container`` (needed when the pod has several), ``previous``, ``tailLines`` and ``limitBytes``
        (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#read-log-of-the-specified-pod).
        An emulated Ray pod's container is its ``ray start --block`` process, whose output is the pod's log. A
        container name missing or wrong is a 400 with the API server's message (kubernetes/kubernetes,
        pkg/registry/core/pod/strategy.go, ``LogLocation``); a container not yet started, or a ``previous`` one that
        never ended, a 400 with the kubelet's (pkg/kubelet/kubelet_pods.go, ``validateContainerLogStatus``)."""
        with self.lock:
            pod = self.objects.get(("pods", namespace, name))
        if pod is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found')
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container") or (containers[0] if len(containers) == 1 else "")
        if container not in containers:
            message = f"a container name must be specified for pod {name}, choose one of: {containers}"
            if query.get("container"):
                message = f"container {container} is not valid for pod {name}"
            return 400, status(400, "BadRequest", message)
        found = next((c for c in pod["status"].get("containerStatuses") or [] if c["name"] == container), {})
        state = found.get("state") or {}
        if query.get("previous") == "true":
            if not found.get("restartCount"):
                return 400, status(
                    400, "BadRequest", f'previous terminated container "{container}" in pod "{name}" not found'
                )
            return 200, b""  # the emulated pods restart in place: the output before is in the one file
        if not (state.get("running") or state.get("terminated")):
            reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            return 400, status(
                400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        out = self.log_file(pod["metadata"]["labels"]["ray.io/cluster"], name)
        data = out.read_bytes() if out.exists() else b""
        if query.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else b""
        if query.get("limitBytes"):
            data = data[: int(query["limitBytes"])]
        return 200, data

    def fuse_mounts(self, namespace: str, cluster: str) -> dict[str, Path]:
        """Where the RayCluster's head pod mounts Cloud Storage FUSE volumes (CSI ephemeral volumes of the
        ``gcsfuse.csi.storage.gke.io`` driver, https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-
        volumes/cloud-storage-fuse-csi-driver), each mount path (no trailing ``/``) -> the directory here that plays
        it: the bucket's directory (``bucket_dir(volumeAttributes.bucketName)``), or, with the ``only-dir=D`` mount
        option (``volumeAttributes.mountOptions``, comma-separated), its ``D``: "mount only a specific directory
        within a bucket" (https://cloud.google.com/storage/docs/cloud-storage-fuse/cli-options, --only-dir). Empty
        when it mounts none, or no ``bucket_dir`` plays them."""
        if self.bucket_dir is None:
            return {}
        with self.lock:
            obj = self.objects.get(("rayclusters", namespace, cluster)) or {}
        pod = obj.get("spec", {}).get("headGroupSpec", {}).get("template", {}).get("spec", {})
        volumes = {
            v["name"]: v["csi"].get("volumeAttributes", {})
            for v in pod.get("volumes", [])
            if v.get("csi", {}).get("driver") == GCSFUSE_DRIVER
        }
        mounts = {}
        for mount in (m for c in pod.get("containers", []) for m in c.get("volumeMounts", [])):
            attributes = volumes.get(mount["name"])
            if attributes is None:
                continue
            options = dict(o.strip().partition("=")[::2] for o in attributes.get("mountOptions", "").split(","))
            only = [part for part in options.get("only-dir", "").split("/") if part]
            here = self.bucket_dir(attributes["bucketName"]).joinpath(*only)
            here.mkdir(parents=True, exist_ok=True)  # a mount point is there, objects under it or not
            mounts[mount["mountPath"].rstrip("/")] = here
        return mounts
