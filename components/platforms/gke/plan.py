"""`tpupipe plan`: every resource a gke run would create and what it would cost, before anything is created.

``build(spec, run_id)`` derives the whole plan as one JSON-able document (the shape is documented in README.md,
section "tpupipe plan"); ``render_text`` and ``to_json`` print it; ``manifest_files`` gives the Kubernetes objects
the run would apply, one YAML file each. No credentials and no network: everything comes from the spec, the TPU
catalogue and the price table. The plan's size grows with the number of slices (one node pool each) and not
with the number of chips: the RayCluster has one worker group whatever the size.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from components.platforms.gke import features
from components.platforms.gke import manifests as m
from components.platforms.gke import resources as r
from components.spec import RunSpec, SpecError, names, ready_limits
from components.tpu import catalogue, pricing
from components.workload import derive as d

PLAN_VERSION = 1


def check_plannable(spec: RunSpec) -> None:
    """A plan describes the gke platform's TPU resources; the cpu accelerator runs on the local platform."""
    if not d.is_tpu(spec):
        raise SpecError(
            "cluster.accelerator",
            f"preset {spec.name!r} emulates cpu hosts on the local platform; a plan describes TPU slices on gke",
            list(catalogue.FAMILIES),
        )


# The stage that creates each kind of resource; a stage walks the plan's records of its own kinds, in plan order.
STAGE_OF_KIND = {
    "vpc-network": "provision",
    "subnetwork": "provision",
    "firewall-rule": "provision",
    "workload-policy": "provision",
    "gcs-bucket": "provision",
    "iam-binding": "provision",
    "gke-cluster": "provision",
    "node-pool": "provision",
    "autopilot-tpu-nodes": "provision",
    "artifact-repository": "build_image",
    "build-source": "build_image",
    "container-image": "build_image",
    "k8s/Namespace": "deploy_raycluster",
    "k8s/ServiceAccount": "deploy_raycluster",
    "k8s/ResourceClaimTemplate": "deploy_raycluster",
    "k8s/Secret": "deploy_raycluster",
    "k8s/RayCluster": "deploy_raycluster",
}


# The api of a resource created as part of another's request: the Ray head's CPU pool, in the cluster's body.
WITH_THE_CLUSTER = "container.clusters.create (in the cluster's body)"


@dataclass(frozen=True)
class Resource:
    """One resource of the plan: what the gke platform creates (or uses), in creation order.

    ``api`` is the call that creates (or gets) it and ``path`` the resource name that call takes; ``stage`` is the
    stage that walks it (``STAGE_OF_KIND``). The gke platform applies each record through its kind's handler, and
    ``tpupipe run --dry-run`` prints the same walk."""

    kind: str
    name: str
    action: str  # create | use | get-or-create
    summary: str
    api: str = ""
    path: str = ""
    body: Any = None
    labels: dict[str, str] = field(default_factory=dict)
    deleted_by_teardown: bool = True
    price: tuple[str, str, str, int] | None = None  # (category, item, capacity, quantity) in the price table

    @property
    def stage(self) -> str:
        return STAGE_OF_KIND[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "action": self.action,
            "stage": self.stage,
            "labels": self.labels,
            "deleted_by_teardown": self.deleted_by_teardown,
            "summary": self.summary,
            "api": self.api,
            "path": self.path,
            "body": self.body,
        }


def _capacity_text(spec: RunSpec) -> str:
    c = spec.cluster
    return f"reservation {c.reservation}" if c.capacity == "reservation" else c.capacity


def _slice_doc(spec: RunSpec) -> dict[str, Any]:
    shape = d.slice_shape(spec)
    c = spec.cluster
    return {
        "family": shape.family.name,
        "topology": shape.topology,
        "num_slices": c.num_slices,
        "chips_per_slice": shape.num_chips,
        "hosts_per_slice": shape.num_hosts,
        "chips_per_host": shape.chips_per_host,
        "logical_devices_per_host": shape.logical_devices_per_host,
        "machine_type": shape.machine_type,
        "gke_accelerator": shape.family.gke_accelerator,
        "ray_accelerator_type": shape.family.ray_accelerator_type,
        "pod_type": shape.pod_type,
        "multi_host": shape.multi_host,
        "total_chips": shape.num_chips * c.num_slices,
        "total_hosts": shape.num_hosts * c.num_slices,
        "capacity": c.capacity,
    }


def _compute_resources(spec: RunSpec, t: r.Target) -> list[Resource]:
    """The DCN networks, each with its subnet and the firewall rule that lets the slices' traffic in (multislice
    ``dcn_networks``), then the TPU7x workload policy: Compute Engine resources the node pools reference, so they
    come first (and teardown, walking them newest first, deletes each rule before its network). They take no
    labels: their names derive from the run id."""
    out = []
    labels = names.labels(t.run_id)
    for net in r.dcn_networks(spec, t):
        n, s, f = net["network"], net["subnetwork"], net["firewall"]
        out.append(
            Resource(
                "vpc-network",
                n["name"],
                "create",
                f"DCN network, custom subnets, MTU {n['mtu']} (run id in its description: networks take no labels)",
                labels=labels,
                body=n,
                api="compute.networks.insert",
                path=r.compute_path("network", t, n["name"]),
            )
        )
        out.append(
            Resource(
                "subnetwork",
                s["name"],
                "create",
                f"{s['ipCidrRange']} in {s['region']}",
                labels=labels,
                body=s,
                api="compute.subnetworks.insert",
                path=r.compute_path("subnetwork", t, s["name"]),
            )
        )
        protocols = ", ".join(a["IPProtocol"] for a in f["allowed"])
        out.append(
            Resource(
                "firewall-rule",
                f["name"],
                "create",
                f"allows ingress to {n['name']} from "
                f"{', '.join(f['sourceRanges'])} (the slices' DCN traffic): all ports of {protocols}",
                labels=labels,
                body=f,
                api="compute.firewalls.insert",
                path=r.compute_path("firewall", t, f["name"]),
            )
        )
    policy = r.workload_policy(spec, t)
    if policy:
        out.append(
            Resource(
                "workload-policy",
                policy["name"],
                "create",
                "Compute Engine workload policy HIGH_THROUGHPUT, accelerator "
                f"topology {d.slice_shape(spec).topology} (places each TPU7x slice)",
                labels=labels,
                body=policy,
                api="compute.resourcePolicies.insert",
                path=r.compute_path("resource_policy", t, policy["name"]),
            )
        )
    return out


def _storage_resources(t: r.Target) -> list[Resource]:
    """The checkpoint bucket (shared by runs, kept) and the run's Workload Identity binding on it."""
    binding = r.bucket_binding(t)
    prefix = f"gs://{t.bucket}/{names.run_prefix(t.run_id)}/"
    return [
        Resource(
            "gcs-bucket",
            f"gs://{t.bucket}",
            "get-or-create",
            f"checkpoints and results under {prefix}, mounted "
            f"at {r.MOUNT_PATH} in every pod (GCS FUSE); kept after the run",
            api="storage.buckets.get",
            path=t.bucket,
            deleted_by_teardown=False,
        ),
        Resource(
            "iam-binding",
            f"{binding['role']} on gs://{t.bucket}",
            "create",
            f"for Kubernetes ServiceAccount {t.namespace}/{t.service_account} (Workload Identity principal)",
            labels=names.labels(t.run_id),
            body=binding,
            api="storage.buckets.setIamPolicy",
            path=t.bucket,
        ),
    ]


def _cluster_features(spec: RunSpec, owns_cluster: bool) -> list[str]:
    """What the cluster has: created with it, or, for a cluster the spec names, checked before anything is created
    and enabled in place or refused (``features``)."""
    return [f.name if owns_cluster else f.promise() for f in features.needed(spec)]


def _cluster_resources(spec: RunSpec, t: r.Target) -> list[Resource]:
    """The GKE cluster (created, or the existing one used), the Ray head's CPU pool, one TPU pool per slice, or the
    TPU nodes Autopilot makes."""
    shape, c, labels = d.slice_shape(spec), spec.cluster, names.labels(t.run_id)
    body = r.cluster(spec, t)
    has = _cluster_features(spec, t.owns_cluster)
    mode = "autopilot" if t.autopilot else "standard"
    cluster_path = f"{t.parent}/clusters/{t.cluster}"
    if t.owns_cluster:
        out = [
            Resource(
                "gke-cluster",
                t.cluster,
                "create",
                f"{mode} cluster in {t.location}: "
                + ", ".join(has)
                + f"; GKE {spec.gke.cluster_version or 'of the release channel'}; nodes run as "
                f"{t.node_service_account}",
                labels=labels,
                body=body,
                api="container.clusters.create",
                path=cluster_path,
                price=("gke", "cluster", "any", 1),
            )
        ]
    else:
        out = [
            Resource(
                "gke-cluster",
                t.cluster,
                "use",
                f"existing {mode} cluster in {t.location}, checked before "
                "anything is created; it must have: " + ", ".join(has),
                api="container.clusters.get (container.clusters.update for a feature enabled in place)",
                path=cluster_path,
                deleted_by_teardown=False,
            )
        ]
    cpu_pool = r.cpu_node_pool(spec, t)
    if cpu_pool:
        with_cluster = t.owns_cluster
        out.append(
            Resource(
                "node-pool",
                cpu_pool["name"],
                "create",
                f"{spec.gke.cpu_machine_type} x 1 for the Ray head"
                + (" (created with the cluster)" if with_cluster else ""),
                labels=labels,
                body=cpu_pool,
                api=WITH_THE_CLUSTER if with_cluster else "container.nodePools.create",
                path=f"{cluster_path}/nodePools/{cpu_pool['name']}",
                price=("machine", spec.gke.cpu_machine_type, "on-demand", 1),
            )
        )
    network_text = (
        {
            "dcn_networks": "additional node networks (DRANET NICs)",
            "accelerator_network_profile": "accelerator network profile auto (DRANET NICs)",
            "none": "default network only",
        }[spec.gke.multislice_network]
        if d.is_multislice(spec)
        else ""
    )
    for index, pool in enumerate(r.tpu_node_pools(spec, t)):
        placement = pool.get("placementPolicy", {})
        where = (
            f"topology {placement['tpuTopology']}"
            if "tpuTopology" in placement
            else f"placement {placement['policyName']}"
            if placement
            else f"topology {shape.topology} (single host)"
        )
        out.append(
            Resource(
                "node-pool",
                pool["name"],
                "create",
                f"slice {index}: {shape.machine_type} x {shape.num_hosts}, {where}, "
                f"{_capacity_text(spec)}" + (f", {network_text}" if network_text else ""),
                labels=labels,
                body=pool,
                api="container.nodePools.create",
                path=f"{cluster_path}/nodePools/{pool['name']}",
                price=("tpu", shape.family.name, c.capacity, shape.num_chips),
            )
        )
    if t.autopilot:
        out.append(
            Resource(
                "autopilot-tpu-nodes",
                names.worker_group(shape.pod_type),
                "create",
                f"{c.num_slices} x {shape.num_hosts} {shape.machine_type} nodes made by Autopilot for the worker pods "
                f"({_capacity_text(spec)})",
                labels=labels,
                api="by GKE Autopilot, from the pods' node selectors",
                price=("tpu", shape.family.name, c.capacity, shape.num_chips * c.num_slices),
            )
        )
    return out


def _image_resources(spec: RunSpec, t: r.Target) -> list[Resource]:
    """The trainer image: named by gke.image, or built by Cloud Build into the Artifact Registry repository."""
    image = d.trainer_image(spec)
    if spec.gke.image:
        return [
            Resource(
                "container-image",
                t.image,
                "use",
                f"trainer image ({image}), named by gke.image",
                deleted_by_teardown=False,
            )
        ]
    repository = f"projects/{t.project}/locations/{t.region}/repositories/{spec.gke.artifact_repository}"
    return [
        Resource(
            "artifact-repository",
            repository,
            "get-or-create",
            "the Docker repository the trainer images go to",
            api="artifactregistry.repositories.create",
            path=repository,
            deleted_by_teardown=False,
        ),
        Resource(
            "build-source",
            f"gs://{t.bucket}/{names.build_source(t.run_id)}",
            "create",
            f"the build context (images/{image}/ and the tpupipe sources), for Cloud Build",
            api="storage.objects.insert",
            path=f"{t.bucket}/{names.build_source(t.run_id)}",
            deleted_by_teardown=False,
        ),
        Resource(
            "container-image",
            t.image,
            "create",
            f"trainer image ({image}), built by Cloud Build and pushed to "
            f"Artifact Registry repository {spec.gke.artifact_repository}",
            labels=names.labels(t.run_id),
            body=r.cloud_build(spec, t),
            api="cloudbuild.builds.create",
            path=f"projects/{t.project}/locations/{t.region}",
            deleted_by_teardown=False,
        ),
    ]


def _kubernetes_resources(spec: RunSpec, t: r.Target) -> list[Resource]:
    """The Kubernetes objects, in apply order: namespace, ServiceAccount, the DCN claim template, the Secrets (the
    Hugging Face token when the namespace lacks it, the Ray token), then the RayCluster."""
    out = []
    objects = m.all_objects(spec, t)
    raycluster = objects.pop()
    for obj in objects:
        shared = obj["kind"] == "Namespace"
        out.append(
            Resource(
                f"k8s/{obj['kind']}",
                obj["metadata"]["name"],
                "get-or-create" if shared else "create",
                _k8s_summary(spec, obj),
                labels={} if shared else names.labels(t.run_id),
                body=obj,
                api=f"kubernetes apply {obj['apiVersion']}",
                path=_k8s_path(obj),
                deleted_by_teardown=not shared,
            )
        )
    if spec.gke.hf_secret:
        source = spec.gke.hf_token_secret or "$HF_TOKEN"
        out.append(
            Resource(
                "k8s/Secret",
                spec.gke.hf_secret,
                "get-or-create",
                "the Hugging Face token (key "
                f"{m.HF_TOKEN_KEY}): used when the namespace has it, else created from {source} "
                "(labelled with the run, deleted by its teardown); its value never printed",
                labels=names.labels(t.run_id),
                api="kubernetes apply v1",
                path=f"namespaces/{t.namespace}/secrets/{spec.gke.hf_secret}",
            )
        )
    token = names.ray_token_secret(t.run_id)
    out.append(
        Resource(
            "k8s/Secret",
            token,
            "create",
            "the Ray cluster's token (Ray token authentication on; generated at deploy, its value never printed)",
            labels=names.labels(t.run_id),
            api="kubernetes apply v1",
            path=f"namespaces/{t.namespace}/secrets/{token}",
        )
    )
    limits = ready_limits(spec)
    ready = (
        f"; ready within {limits.deadline_s:.0f}s ({limits.by}), pods unschedulable with no scale-up under way "
        f"fail it after {limits.unschedulable_grace_s:.0f}s"
    )
    out.append(
        Resource(
            "k8s/RayCluster",
            raycluster["metadata"]["name"],
            "create",
            _k8s_summary(spec, raycluster) + ready,
            labels=names.labels(t.run_id),
            body=raycluster,
            api=f"kubernetes apply {raycluster['apiVersion']}",
            path=_k8s_path(raycluster),
        )
    )
    return out


def _k8s_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    plural = obj["kind"].lower() + "s"
    return (
        f"namespaces/{meta['name']}"
        if obj["kind"] == "Namespace"
        else f"namespaces/{meta['namespace']}/{plural}/{meta['name']}"
    )


def resources(spec: RunSpec, run_id: str) -> list[Resource]:
    """Every resource the run creates or uses, in the order the stages create them."""
    check_plannable(spec)
    t = r.target(spec, run_id)
    r.check_ranges(spec, t)
    return [
        *_compute_resources(spec, t),
        *_storage_resources(t),
        *_cluster_resources(spec, t),
        *_image_resources(spec, t),
        *_kubernetes_resources(spec, t),
    ]


def _cost(spec: RunSpec, records: list[Resource], table: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The hourly price of the run's billed resources (the records that carry a price: the cluster, the CPU pool,
    the TPU chips)."""
    lines = [pricing.line(table, res.kind, res.name, *res.price) for res in records if res.price]
    return pricing.summarize(lines, spec.cluster.expected_hours, table)


def _warnings(spec: RunSpec, t: r.Target, cost: dict[str, Any]) -> list[str]:
    shape, c = d.slice_shape(spec), spec.cluster
    warnings = []
    if not spec.gke.project:
        warnings.append(
            f"gke.project is empty: names show {names.PLACEHOLDER_PROJECT}; set gke.project=... for a real run"
        )
    if not t.owns_cluster:
        warnings.append(
            f"gke.cluster_name={t.cluster}: the run uses an existing cluster; provisioning checks that "
            "it has " + ", ".join(_cluster_features(spec, False)) + " before it creates anything, and "
            "that the GKE version it runs reaches the slice's floors (gke.cluster_version is not applied)"
        )
    if t.autopilot:
        warnings.append("autopilot: the Ray head pod is billed by Autopilot's pod prices, not in the table")
    documented = catalogue.zones(shape.family.name)
    if t.zone not in documented:
        warnings.append(
            f"gke.zone={t.zone}: not among the zones documented for {shape.family.name} ({', '.join(documented)})"
        )
    if d.is_elastic(spec):
        warnings.append(f"elastic: the cost assumes all {c.num_slices} slices run for the whole duration")
    if cost["missing_prices"]:
        warnings.append(
            "no price in the table for "
            + ", ".join(cost["missing_prices"])
            + ": the totals are unknown; give them with --prices FILE"
        )
    return warnings


def _training(spec: RunSpec, t: r.Target) -> dict[str, Any]:
    scaling = d.scaling_config_args(spec)
    return {
        "submission_id": names.job_submission_id(t.run_id, "train"),
        "entrypoint": r.entrypoint(spec, t),
        "scaling_config": {**scaling, "num_workers": _jsonable(scaling["num_workers"])},
        "run_config": d.run_config_args(spec),
        "elastic": d.is_elastic(spec),
        "timeout_s": spec.train.timeout_s,
        "output_dir": t.run_dir,
    }


def build(spec: RunSpec, run_id: str, prices: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The plan of ``spec`` under ``run_id`` (names derive from it) priced from ``prices`` (default table)."""
    records = resources(spec, run_id)
    t = r.target(spec, run_id)
    cost = _cost(spec, records, prices if prices is not None else pricing.load())
    return {
        "plan_version": PLAN_VERSION,
        "run_id": t.run_id,
        "preset": spec.name,
        "platform": "gke",
        "label": names.labels(t.run_id),
        "project": t.project,
        "zone": t.zone,
        "region": t.region,
        "cluster": {
            "name": t.cluster,
            "mode": "autopilot" if t.autopilot else "standard",
            "location": t.location,
            "created_by_run": t.owns_cluster,
        },
        "slice": _slice_doc(spec),
        "resources": [res.to_dict() for res in records],
        "readiness": asdict(ready_limits(spec)),
        "training": _training(spec, t),
        "cost": cost,
        "warnings": _warnings(spec, t, cost),
        "spec": spec.to_dict(),
    }


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _k8s_summary(spec: RunSpec, obj: dict[str, Any]) -> str:
    kind = obj["kind"]
    if kind == "Namespace":
        return "shared by runs; created if missing, kept"
    if kind == "ServiceAccount":
        return "the pods' identity (Workload Identity)"
    if kind == "ResourceClaimTemplate":
        req = obj["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        count = req["count"] if req["allocationMode"] == "ExactCount" else "all the"
        return f"{count} NICs of device class {req['deviceClassName']} per worker pod"
    if kind == "RayCluster":
        head = obj["spec"]["headGroupSpec"]
        head_res = head["template"]["spec"]["containers"][0]["resources"]["requests"]
        group = obj["spec"]["workerGroupSpecs"][0]
        res = group["template"]["spec"]["containers"][0]["resources"]["requests"]
        pods = group["replicas"] * group["numOfHosts"]
        text = (
            f"head {head_res['cpu']} CPU {head_res['memory']}"
            + (f" num-cpus {head['rayStartParams']['num-cpus']}" if "num-cpus" in head["rayStartParams"] else "")
            + f"; 1 worker group {group['groupName']}: {group['replicas']} replicas x {group['numOfHosts']} hosts"
            f" = {pods} pods, each {r.TPU_RESOURCE} {res[r.TPU_RESOURCE]}, {res['cpu']} CPU, {res['memory']}"
        )
        if group["minReplicas"] != group["maxReplicas"]:
            text += f"; replicas {group['minReplicas']}..{group['maxReplicas']}"
        if "resources" in group:
            text += f"; Ray resources {group['resources']}"
        return text
    return kind


def to_json(plan: dict[str, Any]) -> str:
    return json.dumps(plan, indent=2) + "\n"


def kubernetes_objects(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [res["body"] for res in plan["resources"] if res["kind"].startswith("k8s/") and res["body"] is not None]


def manifest_files(plan: dict[str, Any]) -> dict[str, str]:
    """``NN-kind-name.yaml`` -> YAML text of each Kubernetes object, in apply order."""
    import yaml

    files = {}
    for index, obj in enumerate(kubernetes_objects(plan)):
        filename = f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        files[filename] = yaml.safe_dump(obj, sort_keys=False, width=100)
    return files


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def render_text(plan: dict[str, Any]) -> str:
    s = plan["slice"]
    out = [
        f"tpupipe plan {plan['preset']} (gke): creates nothing. Run id {plan['run_id']}: every name below derives "
        "from it (a pipeline run uses its own).",
        f"slice      {s['family']} {s['topology']} x {s['num_slices']}: {s['chips_per_slice']} chips on "
        f"{s['hosts_per_slice']} x {s['machine_type']} ({s['chips_per_host']} chips each) per slice; "
        f"{s['total_chips']} chips, {s['total_hosts']} hosts in all; {s['capacity']}",
        f"where      project {plan['project']}, zone {plan['zone']}, cluster {plan['cluster']['name']} "
        f"({plan['cluster']['mode']})",
        "",
        *_render_resources(plan),
        "",
        *_render_training(plan["training"]),
        "",
        *_render_cost(plan["cost"]),
    ]
    if plan["warnings"]:
        out += ["", "warnings"] + [f"  - {w}" for w in plan["warnings"]]
    return "\n".join(out) + "\n"


def _render_resources(plan: dict[str, Any]) -> list[str]:
    label = f"{names.RUN_LABEL}={plan['run_id']}"
    costs = {(ln["kind"], ln["resource"]): ln for ln in plan["cost"]["lines"]}
    out = ["resources"]
    for res in plan["resources"]:
        tag = label if res["labels"] else "shared: no run label"
        kept = "" if res["deleted_by_teardown"] else "; kept after the run"
        price = ""
        ln = costs.get((res["kind"], res["name"]))
        if ln:
            price = f"  {_usd(ln['usd_per_hour'])}/h" if ln["usd_per_hour"] is not None else "  price unknown"
        out.append(f"  {res['action']:<13} {res['kind']:<25} {res['name']}{price}")
        out.append(f"  {'':<13} {'':<25} {res['summary']}  [{tag}{kept}]")
    return out


def _render_training(tr: dict[str, Any]) -> list[str]:
    """The train job: its submission id, its command line (the spec abbreviated), Ray Train's configs."""
    scaling = ", ".join(f"{k}={tuple(v) if isinstance(v, list) else v!r}" for k, v in tr["scaling_config"].items())
    words = shlex.split(tr["entrypoint"])
    words[words.index("--spec") + 1] = "<the run spec, JSON>"
    command = " ".join(w if w.startswith("<") else shlex.quote(w) for w in words)
    return [
        "training",
        f"  ray job     submission id {tr['submission_id']} (Ray Jobs API), deadline {tr['timeout_s']:g} s",
        f"  entrypoint  {command}",
        f"  scaling     ScalingConfig({scaling})",
        f"  failures    {tr['run_config']['failure_config']}" + ("  (elastic)" if tr["elastic"] else ""),
    ]


def _render_cost(cost: dict[str, Any]) -> list[str]:
    out = [
        f"cost ({cost['currency']}, list prices)",
        f"  per hour                      {_usd(cost['usd_per_hour'])}",
        f"  {'for ' + format(cost['expected_hours'], 'g') + ' h expected':<29} "
        f"{_usd(cost['usd_for_expected_duration'])}",
    ]
    if "upper_bound_usd_per_hour" in cost:
        out.append(
            f"  at most (on-demand prices)    {_usd(cost['upper_bound_usd_per_hour'])}/h, "
            f"{_usd(cost['upper_bound_usd_for_expected_duration'])} for {cost['expected_hours']:g} h"
        )
    for key, src in cost["sources"].items():
        out.append(f"  price {key}: {src['source']} ({src['date']})")
    return out
