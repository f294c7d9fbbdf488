"""The Kubernetes emulator: a Kubernetes API server over HTTPS on 127.0.0.1 with what stands behind it on GKE, each
its own module with its own sources:

- ``apiserver``: the API server (its routes, objects, CRDs served from the vendored KubeRay CRDs, admission and
  validation, authentication, access reviews, the service proxy, injected 503s);
- ``kuberay``: the KubeRay operator (a RayCluster's pods, service, token Secret and status; the ``ray start`` of
  each pod, the TPU webhook's environment);
- ``kubelet``: the scheduler, the cluster autoscaler and the kubelet (placing pods on nodes, taints and tolerations,
  queued provisioning, pod phases and logs, volumes and the Cloud Storage FUSE mounts, a host lost mid-run);
- ``ray``: the local Ray clusters in the pods, whose dashboards (their Jobs API, or ``tests/emulators/rayjobs.py``
  without Ray) the product reaches through the proxy;
- ``objects``: what they share (the objects, the API's ``Status``).

``KubeEmulator`` is the one object the tests build: the API server composed with its parts, the parts' settings and
hands reachable on it as ever (``project.kube.scale_up_s = 1.5``, ``project.kube.lose_pod(...)``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from tests.emulators import provisioning
from tests.emulators.kube.apiserver import ApiServer
from tests.emulators.kube.kubelet import GCSFUSE_DRIVER, NOT_TRIGGERED, OUT_OF_RESOURCES, Kubelet
from tests.emulators.kube.kubelet import from_pods as _from_pods
from tests.emulators.kube.kubelet import into_pods as _into_pods
from tests.emulators.kube.kuberay import KubeRay, tpu_webhook_env
from tests.emulators.kube.ray import Ray

__all__ = ["GCSFUSE_DRIVER", "NOT_TRIGGERED", "OUT_OF_RESOURCES", "KubeEmulator", "_from_pods", "_into_pods"]


class _Part:
    """An attribute of one of the emulator's parts, read and set on the emulator itself."""

    def __init__(self, part: str, name: str = "") -> None:
        self.part, self.name = part, name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def __get__(self, emulator, owner=None):
        return self if emulator is None else getattr(getattr(emulator, self.part), self.name)

    def __set__(self, emulator, value) -> None:
        setattr(getattr(emulator, self.part), self.name, value)


class KubeEmulator(ApiServer):
    """The API server with its parts: the KubeRay operator, the scheduler, autoscaler and kubelet, Ray, and queued
    provisioning (``provisioner``), all over one set of objects. ``start()`` serves on 127.0.0.1; ``stop()`` stops
    every local Ray cluster it started."""

    # the scheduler, the cluster autoscaler and the kubelet's (kubelet.Kubelet)
    fault = _Part("kubelet")
    scale_up_s = _Part("kubelet")
    scale_up_failure = _Part("kubelet")
    stockouts = _Part("kubelet")
    scale_up_stockout = _Part("kubelet")
    autoscaler_place = _Part("kubelet")
    bucket_dir = _Part("kubelet")
    # Ray's (ray.Ray)
    ray_env = _Part("ray", "env")
    ready_without_ray = _Part("ray")
    ray_auth_off = _Part("ray", "auth_off")
    jobs = _Part("ray")
    clusters = _Part("ray")
    # KubeRay's (kuberay.KubeRay)
    ready_delay_s = _Part("kuberay")

    _tpu_webhook_env = staticmethod(tpu_webhook_env)

    def __init__(
        self,
        work_dir: Path,
        token: str,
        crd_validator,
        ray_env=None,
        fault: str = "",
        ready_delay_s: float = 0.0,
        scale_up_s: float = 2.0,
        bucket_dir: Callable[[str], Path] | None = None,
    ):
        work_dir = Path(work_dir)
        objects: dict[tuple[str, str, str], dict] = {}
        lock = threading.RLock()
        provisioner = provisioning.Provisioner(objects, lock)
        kubelet = Kubelet(objects, lock, provisioner, work_dir, bucket_dir, fault, scale_up_s)
        ray = Ray(work_dir, lock, ray_env)
        kuberay = KubeRay(objects, lock, kubelet, ray, ready_delay_s)
        kubelet.start_containers = kuberay.pods_started  # what starts in a RayCluster's placed pods: its Ray
        provisioner.lose_pod = kubelet.lose_pod  # CapacityRevoked: the request's nodes, and their pods, go
        super().__init__(work_dir, token, crd_validator, objects, lock, provisioner, kubelet, kuberay, ray)

    def lose_pod(self, namespace: str, name: str, grace_s: float = 0.5) -> None:
        """A host lost mid-run (``kubelet.Kubelet.lose_pod``)."""
        self.kubelet.lose_pod(namespace, name, grace_s)

    def stop_pods(self, namespace: str, name: str) -> None:
        """The RayCluster's pods, services and Ray gone (``kuberay.KubeRay.stop_pods``)."""
        self.kuberay.stop_pods(namespace, name)

    def job_status(self, submission_id: str) -> str:
        """A Ray job's status as the Ray running it reports it (``ray.Ray.job_status``)."""
        return self.ray.job_status(submission_id)

    def _fuse_mounts(self, namespace: str, cluster: str) -> dict[str, Path]:
        return self.kubelet.fuse_mounts(namespace, cluster)
