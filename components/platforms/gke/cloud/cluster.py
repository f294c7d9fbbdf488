"""The GKE side of the gke platform: the cluster and its node pools through google-cloud-container's
``ClusterManagerClient`` (docs/architecture.md, "Cloud calls through the client libraries").

Get-or-create, resumable and cancellable: every create first looks for what exists (a re-run provision
re-attaches, an ``ALREADY_EXISTS`` is a reuse), records what it started before it waits, waits on the
long-running operation with progress and a deadline, and cancels that operation on SIGINT or SIGTERM. Status codes
map to meanings (``google_errors``): ``UNAVAILABLE`` and ``DEADLINE_EXCEEDED`` are transient (retried with backoff);
``RESOURCE_EXHAUSTED`` and stockouts are :class:`CapacityError`, a user error that names zone, accelerator and count,
unless it is a rate limit; a change refused while another operation holds the cluster is asked again.

``google.cloud.container_v1`` is imported inside functions: ``components`` imports in milliseconds.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# EMULATOR_HOST_ENV: the ClusterManager endpoint of an emulator (host:port, plaintext gRPC), as Google's emulators
# are found (PUBSUB_EMULATOR_HOST and the like); unset, the client talks to container.googleapis.com.
from components.cloud.credentials import EMULATOR_HOST_ENV, credentials, google_client
from components.cloud.errors import (
    BUSY_MARKERS,
    RATE_LIMITED,
    RESOURCE_EXHAUSTED,
    STOCKOUT_MARKERS,
    Adapter,
    CapacityError,
    GkeError,
    RetryPolicy,
    call_with_retry,
    is_busy,
    is_capacity_error,
    is_rate_limit,
    progress_every,
)
from components.platforms.gke.plan import paths
from components.platforms.interrupts import on_interrupt, signal_name
from components.platforms.waiting import DeadlineExceeded

if TYPE_CHECKING:  # for the type checker only: the client libraries are imported inside functions
    from google.auth.credentials import Credentials
    from google.cloud.container_v1 import Cluster, ClusterManagerClient, NodePool, Operation

    from components.platforms.gke.plan.features import Feature

# How long a delete that is not waited on (a stopped task's, in its grace period) asks again while GKE refuses it for
# another operation on the cluster; past it the janitor deletes what is left.
START_TIMEOUT_S = 20.0
# The operation a refusal names: "Operation operation-1533161820212-e0451fc6 is currently creating a node pool for
# cluster prombench. Please wait and try again once it is done." (https://github.com/prometheus/test-infra/pull/84).
OPERATION_NAME = re.compile(r"\boperation-[0-9a-z-]+")
# GKE's Operation.Type values that delete (google-cloud-container's container_v1/types/cluster_service.py).
DELETES = ("DELETE_CLUSTER", "DELETE_NODE_POOL")


def targets(op: Operation, name: str) -> bool:
    """Whether the operation ``op`` works on the resource ``name`` (``projects/P/locations/L/clusters/C``, with
    ``/nodePools/N`` for a pool). Its ``targetLink`` is "a URI to the resource being modified" (the Operation
    message's field docs, google-cloud-container's container_v1/types/cluster_service.py), not the path: it may name
    the project by number and a zone under ``zones/`` (the API's zonal form), so the location and the
    ``clusters/C[/nodePools/N]`` that follow it are compared, exactly: a pool's operation is not its cluster's."""
    link = re.search(r"/(?:locations|zones)/([^/]+)/(clusters/.+?)/?$", op.target_link or "")
    mine = re.search(r"/locations/([^/]+)/(clusters/.+)$", name)
    return link is not None and mine is not None and link.groups() == mine.groups()


def cluster_manager(creds: Credentials | None = None) -> ClusterManagerClient:
    """A ``ClusterManagerClient``: to the emulator named by $TPUPIPE_GKE_EMULATOR_HOST, else to Google."""
    from google.cloud import container_v1

    return google_client(container_v1.ClusterManagerClient, EMULATOR_HOST_ENV, creds=creds)


class Gke(Adapter["ClusterManagerClient"]):
    """Get-or-create, wait, delete for the run's cluster and node pools. ``record`` is called with every resource
    this run starts creating, before anything waits on it (the ledger)."""

    def get_cluster(self, name: str) -> Cluster | None:
        from google.api_core import exceptions as gexc

        try:
            return self.call(f"get cluster {name}", lambda: self.client.get_cluster(name=name))
        except gexc.NotFound:
            return None

    def get_node_pool(self, name: str) -> NodePool | None:
        from google.api_core import exceptions as gexc

        try:
            return self.call(f"get node pool {name}", lambda: self.client.get_node_pool(name=name))
        except gexc.NotFound:
            return None

    # -- operations
    def wait(self, location_path: str, op: Operation, what: str) -> None:
        """Poll the operation until DONE, with progress, a deadline, and an interrupt cancelling it."""
        from google.cloud import container_v1

        name = f"{location_path}/operations/{op.name}"
        started = self.clock()

        def cancel(signum: int) -> None:
            if op.operation_type.name in DELETES:  # a delete is what a stop wants: it goes on
                self.log(f"  {what}: {signal_name(signum)}: operation {op.name} goes on")
                return
            self.log(f"  {what}: {signal_name(signum)}: cancelling operation {op.name}")
            self.client.cancel_operation(name=name)

        def poll() -> Operation | None:
            current: Operation = self.call(f"get operation {op.name}", lambda: self.client.get_operation(name=name))
            return current if current.status == container_v1.Operation.Status.DONE else None

        with on_interrupt(cancel, log=self.log):
            done = self.poll_until(poll, f"{what} (operation {op.name})", every_s=30, running=what)
        if done.error and done.error.code:
            message = done.error.message or done.status_message
            if done.error.code == RESOURCE_EXHAUSTED or is_capacity_error(message):
                raise CapacityError(message)
            raise GkeError(f"{what}: operation {op.name} failed: {message}")
        self.log(f"  {what}: done in {self.clock() - started:.1f}s")

    # -- get-or-create
    def ensure_cluster(self, parent: str, body: dict[str, Any], record: Callable[[str, str], None]) -> Any:
        """The cluster ``body`` names: reused if it exists (waiting while it provisions), else created."""
        from google.cloud import container_v1

        name = paths.cluster_path(parent, body["name"])
        cluster = self.get_cluster(name)
        if cluster is None:
            record("cluster", name)
            self._create(
                "cluster",
                name,
                parent,
                lambda: self.client.create_cluster(
                    parent=parent, cluster=container_v1.Cluster.from_json(json.dumps(body))
                ),
            )
            cluster = self.get_cluster(name)
        else:
            self.log(f"GKE cluster {name} exists ({cluster.status.name}): reusing it")
        self._wait_running(name, lambda: self.get_cluster(name), container_v1.Cluster.Status, what="cluster")
        return self.get_cluster(name)

    def ensure_node_pool(
        self, cluster_name: str, body: dict[str, Any], record: Callable[[str, str], None], slice_pool: bool = False
    ) -> Any:
        """Get or create the node pool ``body`` in ``cluster_name`` and wait for it to run. ``slice_pool``: it holds a
        TPU slice, which trains only with every host (RUNNING_WITH_ERROR is then a failure, not a partial pool). A
        pool made without nodes (flex-start, queued: ``initialNodeCount`` 0) gets them later, and what GKE says of
        them is readiness's to read (run/readiness.py, POOL_WITH_ERROR), not this wait's."""
        from google.cloud import container_v1

        name = paths.node_pool_path(cluster_name, body["name"])
        location_path = paths.cluster_parent(cluster_name)
        pool = self.get_node_pool(name)
        if pool is None:
            record("node_pool", name)
            self._create(
                f"node pool ({body['config']['machineType']} x {body.get('initialNodeCount', 0)})",
                name,
                location_path,
                lambda: self.client.create_node_pool(
                    parent=cluster_name, node_pool=container_v1.NodePool.from_json(json.dumps(body))
                ),
            )
        else:
            self.log(f"node pool {name} exists ({pool.status.name}): reusing it")
        return self._wait_running(
            name,
            lambda: self.get_node_pool(name),
            container_v1.NodePool.Status,
            what="node pool",
            whole=slice_pool,
            with_nodes=bool(body.get("initialNodeCount")),
        )

    def _create(self, kind: str, name: str, location_path: str, rpc: Callable[[], Any]) -> None:
        """Create and wait; ALREADY_EXISTS is a reuse, quota or stockout one CapacityError."""
        from google.api_core import exceptions as gexc

        short = name.rsplit("/", 1)[-1]
        try:
            op = self.change(f"create {kind} {short}", rpc)
            self.log(f"creating {kind} {name}")
            self.wait(location_path, op, f"create {kind} {short}")
        except gexc.AlreadyExists:
            self.log(f"{kind} {name} already exists: reusing it")
        except gexc.ResourceExhausted as exc:
            raise CapacityError(exc.message) from exc

    def _wait_running(
        self, name: str, get: Callable[[], Any], statuses: Any, what: str, whole: bool = False, with_nodes: bool = True
    ) -> Any:
        """Poll ``get`` until the resource is RUNNING. ``whole``: a pool usable only with all of its nodes (a TPU
        slice), refused when GKE reports it only partially usable. ``with_nodes``: a pool made with its nodes (else
        RUNNING_WITH_ERROR is only said: its nodes come later, ``ensure_node_pool``)."""

        def poll() -> Any:
            current = get()
            if current is None:
                raise GkeError(f"{what} {name} disappeared while the run waited for it")
            if current.status == statuses.RUNNING:
                return current
            if current.status == statuses.ERROR:
                message = current.status_message
                if is_capacity_error(message):
                    raise CapacityError(message)
                raise GkeError(f"{what} {name} is in ERROR: {message}")
            # A node pool "created and ... partially usable" (container v1 NodePool.Status RUNNING_WITH_ERROR), made
            # with its nodes: a stockout when its message names one (GKE so reports a pool created with nodes whose
            # instances a zone had no resources for: run/readiness.py, POOL_WITH_ERROR). Otherwise a TPU slice's pool
            # is refused: GKE deploys a multi-host slice's hosts as one atomic unit, none of them when one cannot be
            # (https://cloud.google.com/tpu/docs/tpus-in-gke, "Multi-host TPU slice node pools";
            # https://cloud.google.com/kubernetes-engine/docs/concepts/tpus), so a slice pool created in error will
            # not train as it is and may start billing once GKE's retries succeed (the Terraform provider likewise
            # marks a pool created RUNNING_WITH_ERROR for replacement, whatever its message:
            # https://github.com/GoogleCloudPlatform/magic-modules/pull/3114); any other pool is usable as it is, said.
            if current.status == getattr(statuses, "RUNNING_WITH_ERROR", None) and not with_nodes:
                self.log(f"{what} {name} is RUNNING_WITH_ERROR before its nodes come: {current.status_message}")
                return current
            if current.status == getattr(statuses, "RUNNING_WITH_ERROR", None):
                if is_capacity_error(current.status_message):
                    raise CapacityError(current.status_message)
                if whole:
                    raise GkeError(
                        f"{what} {name} is RUNNING_WITH_ERROR, only partly usable, and a TPU slice trains only on "
                        f"all of its hosts: {current.status_message or '(no statusMessage)'}"
                    )
                self.log(f"warning: {what} {name} is RUNNING_WITH_ERROR: {current.status_message}")
                return current
            if current.status in (statuses.STOPPING,):
                raise GkeError(f"{what} {name} is being deleted")
            return None

        return self.poll_until(poll, f"{what} {name} to be RUNNING")

    # -- an existing cluster's features
    def enable(self, name: str, features: list[Feature], project: str) -> list[str]:
        """Turn on each of ``features`` (``features.Feature`` rows GKE enables in place) in the cluster ``name``: one
        UpdateCluster each (GKE takes one change per update, one operation at a time), waited on. The names of what
        was enabled."""
        from google.cloud import container_v1

        location_path = paths.cluster_parent(name)
        for feature in features:
            if feature.update is None:  # features.to_enable gives only those GKE enables in place
                raise ValueError(f"the {feature.name} is not enabled in place: {feature.refused_because}")
            update = container_v1.ClusterUpdate.from_json(json.dumps(feature.update(project)))
            short = name.rsplit("/", 1)[-1]
            op = self.change(
                f"enable {feature.name} in {short}",
                functools.partial(self.client.update_cluster, name=name, update=update),
            )
            self.log(f"cluster {short}: enabling the {feature.name} (kept after the run)")
            self.wait(location_path, op, f"enable {feature.name} in {short}")
            self._wait_running(name, lambda: self.get_cluster(name), container_v1.Cluster.Status, what="cluster")
        return [f.name for f in features]

    # -- delete (not found is success)
    def delete_node_pool(self, name: str, wait: bool = True, start_by: float | None = None) -> bool:
        return self._delete("node pool", name, self.client.delete_node_pool, wait, start_by)

    def delete_cluster(self, name: str, wait: bool = True, start_by: float | None = None) -> bool:
        return self._delete("cluster", name, self.client.delete_cluster, wait, start_by)

    def _delete(
        self, kind: str, name: str, rpc: Callable[..., Any], wait: bool = True, start_by: float | None = None
    ) -> bool:
        """Delete and wait (unless not ``wait``: the operation started is enough); False when it was already gone,
        or, not waiting, when GKE would not start it by ``start_by`` (on ``clock``; default ``START_TIMEOUT_S`` from
        now: several deletes share one such instant, so they all fit in one grace period).

        GKE refuses a change while another operation runs on the cluster, naming that operation (``is_busy``: an
        upgrade, another pool's create or delete, a delete of this very resource). The refusal is this resource's
        delete only when the operation it names targets this resource (its ``targetLink``, ``targets``) and deletes:
        then that operation is the one waited on (or, not waiting, the delete is under way). Any other operation is
        polled until it ends and the delete asked again, so a second pool's delete is never taken for started
        because the first pool's is."""
        from google.api_core import exceptions as gexc

        location = paths.cluster_parent(name)
        deadline = self.clock() + self.operation_timeout_s if wait else start_by or self.clock() + START_TIMEOUT_S
        what = f"delete {kind} {name.rsplit('/', 1)[-1]}"
        told = False
        while True:
            try:
                op = self.call(f"delete {kind} {name}", lambda: rpc(name=name))
                self.log(f"deleting {kind} {name}")
                break
            except gexc.NotFound:
                return False
            except gexc.FailedPrecondition as exc:
                message = exc.message or ""
                if not is_busy(message):
                    raise
                holder = self._operation_named(location, message)
                if holder is not None and targets(holder, name) and holder.operation_type.name in DELETES:
                    self.log(f"  {what}: under way already (operation {holder.name})")
                    op = holder
                    break
                if self.clock() >= deadline:
                    if wait:
                        raise GkeError(f"{what}: the cluster stayed busy with another operation: {message}") from exc
                    self.log(f"  {what}: not started, the cluster busy ({message}): the janitor deletes it")
                    return False
                if not told:
                    self.log(f"  {what}: the cluster is busy ({message}); asking again every {self.poll_s:.0f}s")
                    told = True
                self.sleep(self.poll_s)
        if wait:
            self.wait(location, op, what)
        return True

    def _operation_named(self, location_path: str, message: str) -> Operation | None:
        """The operation a busy refusal names (``operation-...``), as GKE reports it now (each read of it is also
        what moves a wait on it along), or None when the message names none or it cannot be read."""
        from google.api_core import exceptions as gexc

        found = OPERATION_NAME.search(message)
        if found is None:
            return None
        try:
            return self.call(
                f"get operation {found[0]}",
                lambda: self.client.get_operation(name=f"{location_path}/operations/{found[0]}"),
            )
        except gexc.NotFound:
            return None

    def clusters_with_label(self, parent: str, key: str, value: str) -> list[str]:
        response = self.call("list clusters", lambda: self.client.list_clusters(parent=parent))
        return [paths.cluster_path(parent, cl.name) for cl in response.clusters if cl.resource_labels.get(key) == value]

    def labelled(self, project: str, key: str) -> list[tuple[str, str, str, str]]:
        """Every cluster of ``project`` (all locations) and every node pool of another cluster that carries the label
        ``key``: (its value, "cluster" or "node_pool", the resource's name, the cluster's create time)."""
        parent = paths.location_path(project, "-")
        response = self.call("list clusters", lambda: self.client.list_clusters(parent=parent))
        found = []
        for cl in response.clusters:
            name = paths.cluster_path(paths.location_path(project, cl.location), cl.name)
            if key in cl.resource_labels:
                found.append((cl.resource_labels[key], "cluster", name, cl.create_time))
                continue
            found += [
                (p.config.resource_labels[key], "node_pool", paths.node_pool_path(name, p.name), cl.create_time)
                for p in cl.node_pools
                if key in p.config.resource_labels
            ]
        return found

    def pools_with_label(self, cluster_name: str, key: str, value: str) -> list[str]:
        from google.api_core import exceptions as gexc

        try:
            response = self.call("list node pools", lambda: self.client.list_node_pools(parent=cluster_name))
        except gexc.NotFound:
            return []
        return [
            paths.node_pool_path(cluster_name, p.name)
            for p in response.node_pools
            if p.config.resource_labels.get(key) == value
        ]


__all__ = [
    "BUSY_MARKERS",
    "RATE_LIMITED",
    "RESOURCE_EXHAUSTED",
    "STOCKOUT_MARKERS",
    "is_busy",
    "is_capacity_error",
    "is_rate_limit",
    "Adapter",
    "CapacityError",
    "DeadlineExceeded",
    "Gke",
    "GkeError",
    "RetryPolicy",
    "call_with_retry",
    "cluster_manager",
    "credentials",
    "progress_every",
]
