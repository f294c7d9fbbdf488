"""The plan's records of the Kubernetes objects a gke run applies (``manifests`` builds them), in apply order: the
namespace, the ServiceAccount and the run's bindings on the bucket that name it, the DCN claim template, the Secrets
(the Hugging Face token, the Ray token), then the RayCluster, each with a one-line summary of what it is for. Pure
functions of (spec, target).
"""

from __future__ import annotations

from typing import Any

from components.platforms.gke.plan import manifests as m
from components.platforms.gke.plan import resources as r
from components.platforms.gke.plan.records import Resource, binding_records
from components.platforms.gke.plan.target import Target
from components.spec import RunSpec, names, ready_limits


def kubernetes_records(spec: RunSpec, t: Target) -> list[Resource]:
    """The Kubernetes objects, in apply order: namespace, ServiceAccount (then the run's bindings on the bucket, which
    name it), the DCN claim template, the Secrets (the
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
        if obj["kind"] == "ServiceAccount":
            out += binding_records(t)  # they name it by the UID its creation gives it
    if spec.gke.hf_secret:
        source = spec.gke.hf_token_secret or "$HF_TOKEN"
        hf = names.hf_token_secret(t.run_id)
        out.append(
            Resource(
                "k8s/Secret",
                hf,
                "create",
                f"the run's Hugging Face token (key {m.HF_TOKEN_KEY}), mounted read-only as a file in the pods: "
                f"copied from the namespace's Secret {spec.gke.hf_secret} when it has one (never changed or deleted "
                f"by a run), else made from {source}; deleted by the run's teardown; its value never printed",
                labels=names.labels(t.run_id),
                api="kubernetes apply v1",
                path=f"namespaces/{t.namespace}/secrets/{hf}",
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
    kind = obj["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
    return (
        f"namespaces/{meta['name']}"
        if obj["kind"] == "Namespace"
        else f"namespaces/{meta['namespace']}/{plural}/{meta['name']}"
    )


def _k8s_summary(spec: RunSpec, obj: dict[str, Any]) -> str:
    kind: str = obj["kind"]
    if kind == "Namespace":
        return "shared by runs; created if missing, kept"
    if kind == "ServiceAccount":
        return "the pods' identity (Workload Identity)"
    if kind == "NetworkPolicy" and "egress" in obj["spec"]:
        return (
            "egress: the run's pods send only to one another, DNS, the metadata server and HTTPS outside the private "
            "ranges"
        )
    if kind == "NetworkPolicy":
        rule = obj["spec"]["ingress"][0]
        if "ports" in rule:
            return f"the head's Jobs API port {rule['ports'][0]['port']} open to the cluster (the API server's proxy)"
        return "default deny: the run's pods take traffic only from one another"
    if kind == "ResourceClaimTemplate":
        req = obj["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        count = req["count"] if req["allocationMode"] == "ExactCount" else "all the"
        return f"{count} NICs of device class {req['deviceClassName']} per worker pod"
    if kind == "PodTemplate":
        pool = obj["template"]["spec"]["nodeSelector"].get(r.NODE_LABEL_NODE_POOL, "")
        return (
            f"the worker pods of node pool {pool} as its ProvisioningRequest asks capacity for them (queued "
            "provisioning), tolerating the pool's cloud.google.com/gke-queued taint"
        )
    if kind == "ProvisioningRequest":
        podset = obj["spec"]["podSets"][0]
        limit = obj["spec"].get("parameters", {}).get("maxRunDurationSeconds")
        return (
            f"class {obj['spec']['provisioningClassName']}: the {podset['count']} hosts of one slice's node pool "
            f"(one request per pool, {spec.cluster.num_slices} in all), provisioned all at once or not at all; the "
            "run starts once every one is; maximum run "
            + (f"{limit} s (run.deadline_h)" if limit else "GKE's default (no run.deadline_h)")
        )
    if kind == "RayCluster":
        head = obj["spec"]["headGroupSpec"]
        head_res = head["template"]["spec"]["containers"][0]["resources"]["requests"]
        groups = obj["spec"]["workerGroupSpecs"]
        group = groups[0]
        res = group["template"]["spec"]["containers"][0]["resources"]["requests"]
        replicas = sum(g["replicas"] for g in groups)
        pods = replicas * group["numOfHosts"]
        named = (
            f"1 worker group {group['groupName']}"
            if len(groups) == 1
            else f"{len(groups)} worker groups {', '.join(g['groupName'] for g in groups)} (one per slice's pool)"
        )
        text = (
            f"head {head_res['cpu']} CPU {head_res['memory']}"
            + (f" num-cpus {head['rayStartParams']['num-cpus']}" if "num-cpus" in head["rayStartParams"] else "")
            + f"; {named}: {replicas} replicas x {group['numOfHosts']} hosts"
            f" = {pods} pods, each {r.TPU_RESOURCE} {res[r.TPU_RESOURCE]}, {res['cpu']} CPU, {res['memory']}"
        )
        low, high = sum(g["minReplicas"] for g in groups), sum(g["maxReplicas"] for g in groups)
        if low != high:
            text += f"; replicas {low}..{high}"
        if "resources" in group:
            text += f"; Ray resources {group['resources']}"
        return text
    return kind
