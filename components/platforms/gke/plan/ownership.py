"""What teardown (and the janitor, through it) may delete for a run: only what derives from the run's id and spec.

The ledger sits under the run's output root, which the run's own pods can write; teardown runs as the pipeline's
service account (container and compute admin). So a ledger entry is where to look (a location provision fell back to,
a resource not yet labelled), never an authority: an entry is deleted only when its project is the run's and its
name is one the run id derives (``components.spec.names``, through ``plan.resources``). A bucket binding entry (a
Kubernetes ServiceAccount's UID principal: ``plan.target.member``) only says that the run made its bindings: teardown
removes the bindings whose conditions carry the run's titles in the bucket's policy, which no pod can write, never a
member the ledger names (``Clients.revoke_bucket``). Anything else the ledger names is left alone and said.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.platforms import RunContext
from components.platforms.gke.plan import document as plan
from components.platforms.gke.plan import paths
from components.platforms.gke.plan.compute_resources import COMPUTE_KINDS
from components.platforms.gke.plan.target import Target, target

# Plan kinds of what a run creates -> the ledger's kind.
LEDGER_KINDS = {"gke-cluster": "cluster", "node-pool": "node_pool", **COMPUTE_KINDS}


def derived_names(ctx: RunContext) -> dict[str, set[str]]:
    """The ledger's kind -> the names of what the run creates of that kind."""
    found: dict[str, set[str]] = {}
    for res in plan.resources(ctx.spec, ctx.run_id):
        if res.kind in LEDGER_KINDS and res.action == "create":
            found.setdefault(LEDGER_KINDS[res.kind], set()).add(res.path.rsplit("/", 1)[-1])
    return found


def is_owned(t: Target, derived: dict[str, set[str]], kind: str, name: str) -> bool:
    """Whether the ledger's entry (``kind``, ``name``) is the run's own to delete: ``t`` its target, ``derived`` the
    names it creates (``derived_names``)."""
    if kind == "iam_binding":  # principal://iam.googleapis.com/projects/NUMBER/locations/global/... (target.member)
        pool = f"/workloadIdentityPools/{t.project}.svc.id.goog/"
        return (
            name.startswith("principal://iam.googleapis.com/projects/")
            and pool in name
            and name.rsplit(pool, 1)[1].startswith("kubernetes.serviceaccount.uid/")
        )
    if name.rsplit("/", 1)[-1] not in derived.get(kind, set()):
        return False
    if kind == "cluster":
        return t.owns_cluster and paths.is_cluster(name, t.project, t.cluster)
    if kind == "node_pool":
        return paths.is_cluster(paths.node_pool_cluster(name), t.project, t.cluster)
    return name.startswith(f"projects/{t.project}/")


def owned(ctx: RunContext, ledger: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """The ledger with only the ``created`` entries that are the run's own (in its order); each other one is logged."""
    t, derived, kept = target(ctx.spec, ctx.run_id), derived_names(ctx), []
    for entry in ledger.get("created", []):
        if is_owned(t, derived, entry["kind"], entry["name"]):
            kept.append(entry)
        else:
            log(
                f"teardown: left alone: the ledger names {entry['kind'].replace('_', ' ')} {entry['name']}, which is "
                f"not one run {ctx.run_id} creates (its names derive from the run id)"
            )
    return {**ledger, "created": kept}
