"""Preflight's checks against what the run's location offers (``preflight`` runs them with its own): the GKE version
a cluster the run creates gets, on its release channel (``versions``).

Each check is ``check(needs, spec, creds, report)``: read-only calls, problems and findings added to the report.
"""

from __future__ import annotations

from components.platforms.gke import versions
from components.platforms.gke.findings import Problem, Report
from components.platforms.gke.needs import Needs
from components.platforms.gke.resources import RELEASE_CHANNEL
from components.spec import RunSpec


def version(n: Needs, spec: RunSpec, creds, report: Report) -> None:
    """The version a cluster the run creates gets: ``gke.cluster_version`` resolved against the channel's offered
    versions (ClusterManager ``getServerConfig``); a pin GKE no longer offers is a problem naming those it does."""
    if not n.location:
        return
    from components.platforms.gke.cluster import cluster_manager

    config = cluster_manager(creds).get_server_config(name=f"projects/{n.project}/locations/{n.location}")
    offer = versions.offered(config, RELEASE_CHANNEL)
    resolved = versions.resolve(n.cluster_version, offer)
    if resolved is None:
        report.problems.append(
            Problem(
                "gke.cluster_version",
                f"GKE {n.cluster_version or 'default'} is not offered on the {RELEASE_CHANNEL} release channel in "
                f"{n.location} (a pinned version retires); offered: {', '.join(offer.versions) or 'none'}: pin one, "
                "or a minor (e.g. 1.35) for its newest patch",
            )
        )
        return
    report.version = resolved
    asked = f"gke.cluster_version={n.cluster_version}" if n.cluster_version else "the channel's default"
    report.checked.append(f"GKE {resolved} on the {RELEASE_CHANNEL} channel in {n.location} ({asked})")
