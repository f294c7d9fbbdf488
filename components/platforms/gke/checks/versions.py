"""The GKE version of a cluster the run creates: ``gke.cluster_version`` resolved against the versions GKE offers on
the most stable release channel that offers it (``choose``), as ClusterManager ``getServerConfig`` reports them for
the cluster's location; the cluster is created on that channel. Pinned patch versions retire (a cluster cannot be
created at one GKE no longer offers), so preflight resolves the pin before anything is created, and provision creates
the cluster at the version resolved.

The fields read, as google-cloud-container's ``ServerConfig`` documents them (``container_v1/types/
cluster_service.py``): ``channels`` ("List of release channel configurations"), each a ``ReleaseChannelConfig`` with
``channel``, ``default_version`` ("The default version for newly created clusters on the channel") and
``valid_versions`` ("List of valid versions for the channel").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.workload.derive import parse_gke_version

if TYPE_CHECKING:
    from google.cloud.container_v1 import ServerConfig


@dataclass(frozen=True)
class Offered:
    channel: str
    default: str
    versions: tuple[str, ...]  # newest first


def offered(server_config: ServerConfig, channel: str) -> Offered:
    """The channel's default and valid versions from a ``ServerConfig``; none when it lists no such channel."""
    for config in server_config.channels:
        if config.channel.name == channel:
            versions = sorted(config.valid_versions, key=_key, reverse=True)
            return Offered(channel, config.default_version, tuple(versions))
    return Offered(channel, "", ())


# The channels from the most stable to the newest (GKE docs, "Release channels": Rapid gets versions first, then
# Regular, then Stable: https://cloud.google.com/kubernetes-engine/docs/concepts/release-channels); a cluster created
# without one is enrolled in REGULAR, the default.
CHANNELS = ("STABLE", "REGULAR", "RAPID")
DEFAULT_CHANNEL = "REGULAR"


def choose(asked: str, server_config: ServerConfig) -> tuple[str, str, Offered]:
    """(version, channel, the default channel's offer): ``asked`` resolved on the most stable channel that offers it,
    so a version that has reached only Rapid is created on Rapid; an empty ``asked`` is the default channel's
    default. The version is "" when no channel offers it."""
    default = offered(server_config, DEFAULT_CHANNEL)
    if not asked:
        return resolve(asked, default) or "", DEFAULT_CHANNEL, default
    for channel in CHANNELS:
        version = resolve(asked, offered(server_config, channel))
        if version:
            return version, channel, default
    return "", DEFAULT_CHANNEL, default


def resolve(asked: str, offer: Offered) -> str | None:
    """``asked`` as a version on offer: empty, the channel's default; ``latest``, the newest; a minor (``1.35``) or a
    patch (``1.35.2``), the newest offered version in it; a full version, itself when offered. None: not offered."""
    if not asked:
        return offer.default or (offer.versions[0] if offer.versions else None)
    if asked == "latest":
        return offer.versions[0] if offer.versions else None
    matching = [v for v in offer.versions if v == asked or v.startswith((f"{asked}.", f"{asked}-"))]
    return matching[0] if matching else None


def _key(version: str) -> tuple[float, ...]:
    return parse_gke_version(version) or (0.0,)
