"""What a gke run's stages do in its cluster's Kubernetes API, as data: deploy_raycluster gets or creates the
namespace, the ServiceAccount, the Secrets (the Hugging Face token's, the Ray token's), the ResourceClaimTemplate
(multislice over DCN), reads the RayCluster CRD (``check_kuberay``) and applies the RayCluster (server-side apply:
``patch``), then reads its pods and their events; the jobs go through the head Service's ``proxy`` subresource;
teardown lists and deletes by the run's label.

Preflight asks an existing cluster's API server about each action (``checks.k8s_access``); for a cluster the run
creates there is no RBAC binding yet and IAM alone decides, so the same actions become IAM permissions
(``iam_permissions``) checked with the project's others (``needs``).
"""

from __future__ import annotations

# (verb, API group, resource, subresource, what needs it); a namespaced resource is asked in the run's namespace.
ALWAYS = (
    ("create", "", "namespaces", "", "deploy_raycluster creates the run's namespace when there is none"),
    ("get", "apiextensions.k8s.io", "customresourcedefinitions", "", "deploy_raycluster checks KubeRay's CRD"),
    ("get", "", "secrets", "", "deploy_raycluster reads the Hugging Face and Ray token Secrets"),
    ("create", "", "secrets", "", "deploy_raycluster creates the token Secrets"),
    ("create", "", "serviceaccounts", "", "deploy_raycluster creates the run's ServiceAccount"),
    ("create", "networking.k8s.io", "networkpolicies", "", "deploy_raycluster creates the run's NetworkPolicies"),
    ("get", "ray.io", "rayclusters", "", "deploy_raycluster waits for the RayCluster"),
    ("patch", "ray.io", "rayclusters", "", "deploy_raycluster applies the RayCluster (server-side apply)"),
    ("list", "", "pods", "", "deploy_raycluster reads the RayCluster's pods"),
    ("list", "", "events", "", "deploy_raycluster reads the pods' scheduling events"),
    ("get", "", "services", "proxy", "the jobs read their status and logs through the head Service's proxy"),
    ("create", "", "services", "proxy", "the jobs are submitted through the head Service's proxy"),
    ("list", "ray.io", "rayclusters", "", "teardown finds the run's RayCluster by its label"),
    ("delete", "ray.io", "rayclusters", "", "teardown deletes the run's RayCluster"),
    ("list", "", "secrets", "", "teardown finds the run's Secrets by its label"),
    ("delete", "", "secrets", "", "teardown deletes the run's Secrets"),
    ("list", "", "serviceaccounts", "", "teardown finds the run's ServiceAccount by its label"),
    ("delete", "", "serviceaccounts", "", "teardown deletes the run's ServiceAccount"),
    ("list", "networking.k8s.io", "networkpolicies", "", "teardown finds the run's NetworkPolicies by its label"),
    ("delete", "networking.k8s.io", "networkpolicies", "", "teardown deletes the run's NetworkPolicies"),
)
CLAIMS = tuple(
    (verb, "resource.k8s.io", "resourceclaimtemplates", "", why)
    for verb, why in (
        ("create", "deploy_raycluster creates the DCN ResourceClaimTemplate"),
        ("list", "teardown finds the run's ResourceClaimTemplate"),
        ("delete", "teardown deletes the run's ResourceClaimTemplate"),
    )
)

PROVISIONING = (
    ("create", "", "podtemplates", "", "deploy_raycluster creates the workers' PodTemplate (queued provisioning)"),
    ("create", "autoscaling.x-k8s.io", "provisioningrequests", "", "deploy_raycluster requests the slices"),
    ("get", "autoscaling.x-k8s.io", "provisioningrequests", "", "deploy_raycluster waits for the request"),
    ("list", "autoscaling.x-k8s.io", "provisioningrequests", "", "teardown finds the run's ProvisioningRequest"),
    ("delete", "autoscaling.x-k8s.io", "provisioningrequests", "", "teardown deletes the run's ProvisioningRequest"),
    ("list", "", "podtemplates", "", "teardown finds the run's PodTemplate"),
    ("delete", "", "podtemplates", "", "teardown deletes the run's PodTemplate"),
)


# A run queued in Kueue (gke.queue, the plan's ``kueue-queue``) reads its queue, its Workload and its place in the
# queue (Kueue's visibility API: the ``pendingworkloads`` subresource of a LocalQueue).
KUEUE = (
    ("get", "kueue.x-k8s.io", "localqueues", "", "preflight reads the LocalQueue gke.queue names"),
    ("list", "kueue.x-k8s.io", "workloads", "", "deploy_raycluster finds the RayCluster's Workload, for its admission"),
    ("get", "kueue.x-k8s.io", "workloads", "", "deploy_raycluster reads the workloads ahead of the run's"),
    (
        "get",
        "visibility.kueue.x-k8s.io",
        "localqueues",
        "pendingworkloads",
        "deploy_raycluster reads the run's place in the queue",
    ),
)


def actions(kinds: tuple[str, ...]) -> tuple[tuple[str, str, str, str, str], ...]:
    """What the run does in the cluster, by the Kubernetes kinds of its plan (``k8s/ResourceClaimTemplate``...)."""
    return (
        ALWAYS
        + (CLAIMS if "k8s/ResourceClaimTemplate" in kinds else ())
        + (PROVISIONING if "k8s/ProvisioningRequest" in kinds else ())
        + (KUEUE if "kueue-queue" in kinds else ())
    )


# GKE's IAM permissions for Kubernetes objects: ``container.<resource>.<verb>`` for the built-in kinds, the custom
# resources (RayCluster) as ``container.thirdPartyObjects.<verb>``, a Service's proxy as ``container.services.proxy``,
# a patch as ``update`` (GKE docs, "Create IAM allow policies", the predefined roles' permissions:
# https://cloud.google.com/kubernetes-engine/docs/how-to/iam#predefined). Reaching the API server through the
# DNS-based endpoint takes ``container.clusters.connect`` (GKE docs, "About network isolation", DNS-based endpoint:
# https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation#dns-based_endpoint).
CONNECT = "container.clusters.connect"
IAM_RESOURCE = {
    "namespaces": "namespaces",
    "customresourcedefinitions": "customResourceDefinitions",
    "secrets": "secrets",
    "serviceaccounts": "serviceAccounts",
    "networkpolicies": "networkPolicies",
    "pods": "pods",
    "events": "events",
    "podtemplates": "podTemplates",
}
IAM_VERB = {"create": "create", "get": "get", "list": "list", "delete": "delete", "patch": "update"}
UNMAPPED_GROUPS = ("resource.k8s.io",)  # DRA's kinds: no IAM permission for them is documented there


def iam_permissions(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The IAM permissions a caller needs to do ``actions(kinds)`` in a cluster where IAM alone decides."""
    out = [CONNECT]
    for verb, group, resource, subresource, _why in actions(kinds):
        if group in UNMAPPED_GROUPS:
            continue
        if subresource == "proxy":
            out.append("container.services.proxy")
        elif group in ("ray.io", "autoscaling.x-k8s.io"):  # custom resources
            out.append(f"container.thirdPartyObjects.{IAM_VERB[verb]}")
        else:
            out.append(f"container.{IAM_RESOURCE[resource]}.{IAM_VERB[verb]}")
    return tuple(dict.fromkeys(out))
