"""`tpupipe plan`: every resource a gke run would create and what it would cost, before anything is created.

``build(spec, run_id)`` derives the whole plan as one JSON-able document (the shape is documented in README.md,
section "tpupipe plan"); ``render_text`` and ``to_json`` print it; ``manifest_files`` gives the Kubernetes objects
the run would apply, one YAML file each. No credentials and no network: everything comes from the spec, the TPU
catalogue and the price table. The plan's size grows with the number of slices (one node pool each) and not
with the number of chips: the RayCluster has one worker group whatever the size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components import catalogue, names, pricing
from components import derivations as d
from components import manifests as m
from components.spec import RunSpec, SpecError

PLAN_VERSION = 1


def check_plannable(spec: RunSpec) -> None:
    """A plan describes the gke platform's TPU resources; the cpu accelerator runs on the local platform."""
    if not d.is_tpu(spec):
        raise SpecError(
            "cluster.accelerator",
            f"preset {spec.name!r} emulates cpu hosts on the local platform; a plan describes TPU slices on gke",
            list(catalogue.FAMILIES),
        )


def _resource(kind: str, name: str, action: str, summary: str, *, run_id: str | None, body: Any = None,
              api: str = "", deleted_by_teardown: bool = True) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        "action": action,
        "labels": names.labels(run_id) if run_id else {},
        "deleted_by_teardown": deleted_by_teardown,
        "summary": summary,
        "api": api,
        "body": body,
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


def build(spec: RunSpec, run_id: str, prices: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The plan of ``spec`` under ``run_id`` (names derive from it) priced from ``prices`` (default table)."""
    check_plannable(spec)
    table = prices if prices is not None else pricing.load()
    t = d.target(spec, run_id)
    shape = d.slice_shape(spec)
    c = spec.cluster
    rid = t.run_id
    resources: list[dict[str, Any]] = []
    cost_lines: list[dict[str, Any]] = []
    warnings: list[str] = []

    # --- GKE: the cluster, its CPU pool, one TPU node pool per slice -----------------------------------------
    cluster_body = d.cluster(spec, t)
    features = ["Ray Operator add-on", "GCS FUSE CSI driver", "Workload Identity", "Dataplane V2"]
    if cluster_body and cluster_body.get("networkConfig", {}).get("enableMultiNetworking"):
        features.append("multi-networking")
    mode = "autopilot" if t.autopilot else "standard"
    if t.owns_cluster:
        resources.append(_resource(
            "gke-cluster", t.cluster, "create", f"{mode} cluster in {t.location}: " + ", ".join(features),
            run_id=rid, body=cluster_body, api=f"container.clusters.create parent={t.parent}",
        ))
        cost_lines.append(pricing.line(table, "gke-cluster", t.cluster, "gke", "cluster", "any", 1))
    else:
        resources.append(_resource(
            "gke-cluster", t.cluster, "use", f"existing {mode} cluster in {t.location}; it must have: "
            + ", ".join(features), run_id=None, api=f"container.clusters.get {t.parent}/clusters/{t.cluster}",
            deleted_by_teardown=False,
        ))
        warnings.append(f"gke.cluster_name={t.cluster}: the run uses an existing cluster; provisioning checks that "
                        "it has " + ", ".join(features) + " before it creates anything")
    pool_api = f"container.nodePools.create parent={t.parent}/clusters/{t.cluster}"
    cpu_pool = d.cpu_node_pool(spec, t)
    if cpu_pool:
        resources.append(_resource(
            "node-pool", cpu_pool["name"], "create",
            f"{spec.gke.cpu_machine_type} x 1 for the Ray head"
            + (" (created with the cluster)" if t.owns_cluster else ""),
            run_id=rid, body=cpu_pool,
            api="with the cluster" if t.owns_cluster else pool_api,
        ))
        cost_lines.append(pricing.line(table, "node-pool", cpu_pool["name"], "machine", spec.gke.cpu_machine_type,
                                       "on-demand", 1))
    policy = d.workload_policy(spec, t)
    if policy:
        resources.append(_resource(
            "workload-policy", policy["name"], "create",
            f"Compute Engine workload policy HIGH_THROUGHPUT, accelerator topology {shape.topology} "
            "(places each TPU7x slice)", run_id=rid, body=policy,
            api=f"compute.resourcePolicies.insert project={t.project} region={t.region}",
        ))
    for net in d.dcn_networks(spec, t):
        n, s = net["network"], net["subnetwork"]
        resources.append(_resource(
            "vpc-network", n["name"], "create", f"DCN network, custom subnets, MTU {n['mtu']} (run id in its "
            "description: networks take no labels)", run_id=rid, body=n,
            api=f"compute.networks.insert project={t.project}",
        ))
        resources.append(_resource(
            "subnetwork", s["name"], "create", f"{s['ipCidrRange']} in {s['region']}", run_id=rid, body=s,
            api=f"compute.subnetworks.insert project={t.project} region={t.region}",
        ))
    network_text = {
        "dcn_networks": "additional node networks (DRANET NICs)",
        "accelerator_network_profile": "accelerator network profile auto (DRANET NICs)",
        "none": "default network only",
    }[spec.gke.multislice_network] if d.is_multislice(spec) else ""
    for index, pool in enumerate(d.tpu_node_pools(spec, t)):
        placement = pool.get("placementPolicy", {})
        where = (f"topology {placement['tpuTopology']}" if "tpuTopology" in placement else
                 f"placement {placement['policyName']}" if placement else f"topology {shape.topology} (single host)")
        resources.append(_resource(
            "node-pool", pool["name"], "create",
            f"slice {index}: {shape.machine_type} x {shape.num_hosts}, {where}, {_capacity_text(spec)}"
            + (f", {network_text}" if network_text else ""),
            run_id=rid, body=pool, api=pool_api,
        ))
        cost_lines.append(pricing.line(table, "node-pool", pool["name"], "tpu", shape.family.name, c.capacity,
                                       shape.num_chips))
    if t.autopilot:
        total_chips = shape.num_chips * c.num_slices
        resources.append(_resource(
            "autopilot-tpu-nodes", names.worker_group(shape.pod_type), "create",
            f"{c.num_slices} x {shape.num_hosts} {shape.machine_type} nodes made by Autopilot for the worker pods "
            f"({_capacity_text(spec)})", run_id=rid, api="by GKE Autopilot, from the pods' node selectors",
        ))
        cost_lines.append(pricing.line(table, "autopilot-tpu-nodes", names.worker_group(shape.pod_type),
                                       "tpu", shape.family.name, c.capacity, total_chips))
        warnings.append("autopilot: the Ray head pod is billed by Autopilot's pod prices, not in the table")

    # --- storage, identity, image ----------------------------------------------------------------------------
    prefix = f"gs://{t.bucket}/{names.run_prefix(rid)}/"
    resources.append(_resource(
        "gcs-bucket", f"gs://{t.bucket}", "use",
        f"checkpoints and results under {prefix}, mounted at {d.MOUNT_PATH} in every pod (GCS FUSE); kept after "
        "the run", run_id=None, deleted_by_teardown=False, api="storage.buckets.get (created if missing)",
    ))
    binding = d.bucket_binding(t)
    resources.append(_resource(
        "iam-binding", f"{binding['role']} on gs://{t.bucket}", "create",
        f"for Kubernetes ServiceAccount {t.namespace}/{t.service_account} (Workload Identity principal)",
        run_id=rid, body=binding, api="storage.buckets.setIamPolicy",
    ))
    if spec.gke.image:
        resources.append(_resource(
            "container-image", t.image, "use", f"trainer image ({d.WORKLOAD_IMAGES[spec.train.workload]}), named by "
            "gke.image", run_id=None, deleted_by_teardown=False, api="",
        ))
    else:
        if d.WORKLOAD_IMAGES[spec.train.workload] == "torch" and not spec.gke.torch_tpu_base:
            warnings.append("gke.torch_tpu_base is empty: the torch image for TPU hosts is built FROM the TorchTPU "
                            "base image; set it (or gke.image) before the run, which refuses to build without it")
        resources.append(_resource(
            "artifact-repository", f"projects/{t.project}/locations/{t.region}/repositories/"
            f"{spec.gke.artifact_repository}", "get-or-create", "the Docker repository the trainer images go to",
            run_id=None, deleted_by_teardown=False, api="artifactregistry.repositories.create",
        ))
        resources.append(_resource(
            "build-source", f"gs://{t.bucket}/{names.build_source(rid)}", "create", "the build context "
            f"(images/{d.WORKLOAD_IMAGES[spec.train.workload]}/ and the tpupipe sources), for Cloud Build",
            run_id=None, deleted_by_teardown=False, api="storage.objects.insert",
        ))
        resources.append(_resource(
            "container-image", t.image, "create", f"trainer image ({d.WORKLOAD_IMAGES[spec.train.workload]}), built "
            f"by Cloud Build and pushed to Artifact Registry repository {spec.gke.artifact_repository}", run_id=rid,
            body=d.cloud_build(spec, t), deleted_by_teardown=False,
            api="cloudbuild.builds.create",
        ))

    # --- Kubernetes objects ----------------------------------------------------------------------------------
    for obj in m.all_objects(spec, t):
        kind, meta = obj["kind"], obj["metadata"]
        shared = kind == "Namespace"
        resources.append(_resource(
            f"k8s/{kind}", meta["name"], "get-or-create" if shared else "create", _k8s_summary(spec, obj),
            run_id=None if shared else rid, body=obj, deleted_by_teardown=not shared,
            api=f"kubernetes apply {obj['apiVersion']}",
        ))

    resources.append(_resource(
        "k8s/Secret", names.ray_token_secret(rid), "create", "the Ray cluster's token (Ray token authentication "
        "on; generated at deploy, its value never printed)", run_id=rid, api="kubernetes apply v1",
    ))

    # --- warnings --------------------------------------------------------------------------------------------
    if not spec.gke.project:
        warnings.insert(0, f"gke.project is empty: names show {names.PLACEHOLDER_PROJECT}; set gke.project=... "
                           "for a real run")
    documented = catalogue.zones(shape.family.name)
    if t.zone not in documented:
        warnings.append(f"gke.zone={t.zone}: not among the zones documented for {shape.family.name} "
                        f"({', '.join(documented)})")
    if d.is_elastic(spec):
        warnings.append(f"elastic: the cost assumes all {c.num_slices} slices run for the whole duration")

    cost = pricing.summarize(cost_lines, c.expected_hours, table)
    if cost["missing_prices"]:
        warnings.append("no price in the table for " + ", ".join(cost["missing_prices"])
                        + ": the totals are unknown; give them with --prices FILE")
    scaling = d.scaling_config_args(spec)
    return {
        "plan_version": PLAN_VERSION,
        "run_id": rid,
        "preset": spec.name,
        "platform": "gke",
        "label": names.labels(rid),
        "project": t.project,
        "zone": t.zone,
        "region": t.region,
        "cluster": {"name": t.cluster, "mode": mode, "location": t.location, "created_by_run": t.owns_cluster},
        "slice": _slice_doc(spec),
        "resources": resources,
        "training": {
            "ray_job": names.rayjob(rid, "train"),
            "submission_id": names.rayjob(rid, "train"),
            "entrypoint": d.entrypoint(spec, t),
            "scaling_config": {**scaling, "num_workers": _jsonable(scaling["num_workers"])},
            "run_config": d.run_config_args(spec),
            "elastic": d.is_elastic(spec),
            "timeout_s": spec.train.timeout_s,
            "output_dir": t.run_dir,
        },
        "cost": cost,
        "warnings": warnings,
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
        return f"{req['count']} NICs of device class {req['deviceClassName']} per worker pod"
    if kind == "RayCluster":
        head = obj["spec"]["headGroupSpec"]
        head_res = head["template"]["spec"]["containers"][0]["resources"]["requests"]
        group = obj["spec"]["workerGroupSpecs"][0]
        res = group["template"]["spec"]["containers"][0]["resources"]["requests"]
        pods = group["replicas"] * group["numOfHosts"]
        text = (f"head {head_res['cpu']} CPU {head_res['memory']}"
                + (f" num-cpus {head['rayStartParams']['num-cpus']}" if "num-cpus" in head["rayStartParams"] else "")
                + f"; 1 worker group {group['groupName']}: {group['replicas']} replicas x {group['numOfHosts']} hosts"
                f" = {pods} pods, each {d.TPU_RESOURCE} {res[d.TPU_RESOURCE]}, {res['cpu']} CPU, {res['memory']}")
        if group["minReplicas"] != group["maxReplicas"]:
            text += f"; replicas {group['minReplicas']}..{group['maxReplicas']}"
        if "resources" in group:
            text += f"; Ray resources {group['resources']}"
        return text
    if kind == "RayJob":
        return (f"the train job on RayCluster {obj['spec']['clusterSelector']['ray.io/cluster']}, "
                f"deadline {obj['spec']['activeDeadlineSeconds']} s")
    return kind


def to_json(plan: dict[str, Any]) -> str:
    return json.dumps(plan, indent=2) + "\n"


def kubernetes_objects(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["body"] for r in plan["resources"] if r["kind"].startswith("k8s/") and r["body"] is not None]


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
    rid = plan["run_id"]
    label = f"{names.RUN_LABEL}={rid}"
    out = [
        f"tpupipe plan {plan['preset']} (gke): creates nothing. Run id {rid}: every name below derives from it "
        "(a pipeline run uses its own).",
        f"slice      {s['family']} {s['topology']} x {s['num_slices']}: {s['chips_per_slice']} chips on "
        f"{s['hosts_per_slice']} x {s['machine_type']} ({s['chips_per_host']} chips each) per slice; "
        f"{s['total_chips']} chips, {s['total_hosts']} hosts in all; {s['capacity']}",
        f"where      project {plan['project']}, zone {plan['zone']}, cluster {plan['cluster']['name']} "
        f"({plan['cluster']['mode']})",
        "",
        "resources",
    ]
    costs = {(ln["kind"], ln["resource"]): ln for ln in plan["cost"]["lines"]}
    for r in plan["resources"]:
        tag = label if r["labels"] else "shared: no run label"
        kept = "" if r["deleted_by_teardown"] else "; kept after the run"
        price = ""
        ln = costs.get((r["kind"], r["name"]))
        if ln:
            price = f"  {_usd(ln['usd_per_hour'])}/h" if ln["usd_per_hour"] is not None else "  price unknown"
        out.append(f"  {r['action']:<13} {r['kind']:<25} {r['name']}{price}")
        out.append(f"  {'':<13} {'':<25} {r['summary']}  [{tag}{kept}]")
    tr = plan["training"]
    sc = tr["scaling_config"]
    scaling = ", ".join(f"{k}={tuple(v) if isinstance(v, list) else v!r}" for k, v in sc.items())
    module = tr["entrypoint"].split(" --spec ", 1)[0]
    out += [
        "",
        "training",
        f"  ray job     {tr['ray_job']} (submission id {tr['submission_id']}), deadline {tr['timeout_s']:g} s",
        f"  entrypoint  {module} --spec <the run spec, JSON> --output-dir {tr['output_dir']} --run-name {rid}",
        f"  scaling     ScalingConfig({scaling})",
        f"  failures    {tr['run_config']['failure_config']}" + ("  (elastic)" if tr["elastic"] else ""),
        "",
    ]
    cost = plan["cost"]
    out.append(f"cost ({cost['currency']}, list prices)")
    out.append(f"  per hour                      {_usd(cost['usd_per_hour'])}")
    out.append(f"  {'for ' + format(cost['expected_hours'], 'g') + ' h expected':<29} "
               f"{_usd(cost['usd_for_expected_duration'])}")
    if "upper_bound_usd_per_hour" in cost:
        out.append(f"  at most (on-demand prices)    {_usd(cost['upper_bound_usd_per_hour'])}/h, "
                   f"{_usd(cost['upper_bound_usd_for_expected_duration'])} for {cost['expected_hours']:g} h")
    for key, src in cost["sources"].items():
        out.append(f"  price {key}: {src['source']} ({src['date']})")
    if plan["warnings"]:
        out += ["", "warnings"] + [f"  - {w}" for w in plan["warnings"]]
    return "\n".join(out) + "\n"
