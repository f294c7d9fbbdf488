"""The run spec's checks of its gke section: names and references (DNS labels, images, secrets, service accounts,
versions, address ranges), the capacity ladder and the zones, and a Kueue queue. Part of ``components.spec.checks``'
``validate``."""

from __future__ import annotations

import ipaddress
import re

from components.spec import names
from components.spec.errors import SpecError
from components.spec.run_spec import (
    GKE_CLUSTER_MODES,
    MULTISLICE_NETWORKS,
    GkeSpec,
    RunSpec,
)

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IMAGE_REF = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?"
    r"(@sha256:[0-9a-f]{64})?$"
)
SECRET_VERSION = re.compile(
    rf"^projects/{names.PROJECT_ID_PATTERN}/secrets/[A-Za-z0-9_-]{{1,255}}(/versions/(latest|[1-9][0-9]*))?$"
)
# A project's Compute Engine default service account: PROJECT_NUMBER-compute@developer.gserviceaccount.com
# (https://cloud.google.com/compute/docs/access/service-accounts#default_service_account).
DEFAULT_COMPUTE_ACCOUNT = re.compile(r"^[0-9]+-compute@developer\.gserviceaccount\.com$")
# The other default accounts of a project: the legacy Cloud Build service account, PROJECT_NUMBER@cloudbuild
# (https://cloud.google.com/build/docs/cloud-build-service-account-updates), and App Engine's default one,
# PROJECT_ID@appspot (IAM, "Default service accounts": https://cloud.google.com/iam/docs/service-account-types#default):
# both are granted the Editor role on the project where they were made with it.
DEFAULT_ACCOUNT = re.compile(
    rf"^[0-9]+@cloudbuild\.gserviceaccount\.com$|^{names.PROJECT_ID_PATTERN}@appspot\.gserviceaccount\.com$"
)
SERVICE_ACCOUNT = re.compile(  # an account id of 6 to 30 characters @ the project, or a default account of a project
    rf"^[a-z][a-z0-9-]{{4,28}}[a-z0-9]@{names.PROJECT_ID_PATTERN}\.iam\.gserviceaccount\.com$"
    rf"|{DEFAULT_COMPUTE_ACCOUNT.pattern}|{DEFAULT_ACCOUNT.pattern}"
)
GKE_VERSION = re.compile(r"^(latest|\d+\.\d+(\.\d+(-gke\.\d+)?)?)$")


def check_gke_fields(spec: RunSpec) -> None:
    """The gke section's own fields: names Google Cloud and Kubernetes accept. (The version floors of the
    hardware are checked with the TPU catalogue, in ``components.workload.checks``.)"""
    g = spec.gke
    if g.cluster_mode not in GKE_CLUSTER_MODES:
        raise SpecError("gke.cluster_mode", f"unknown cluster mode {g.cluster_mode!r}", GKE_CLUSTER_MODES)
    if g.multislice_network not in MULTISLICE_NETWORKS:
        raise SpecError("gke.multislice_network", f"unknown network mode {g.multislice_network!r}", MULTISLICE_NETWORKS)
    if spec.cluster.capacity == "queued" and g.cluster_mode == "autopilot":
        # Queued provisioning here is node pools the run creates with it enabled (docs/gke.md, "Queued provisioning");
        # Autopilot makes its own nodes.
        raise SpecError(
            "cluster.capacity",
            "queued provisioning needs node pools the run creates: gke.cluster_mode=standard",
            ["flex-start", "spot", "on-demand", "reservation"],
        )
    if g.project:
        names.check_project("gke.project", g.project)
    _check_zones(spec)
    checks = [
        ("gke.zone", g.zone, re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$"), "a zone such as us-east5-b"),
        (
            "gke.cluster_name",
            g.cluster_name,
            re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"),
            "1 to 40 lowercase letters, digits and hyphens, starting with a letter",
        ),
        ("gke.namespace", g.namespace, _DNS_LABEL, "a DNS label of at most 63 characters"),
        (
            "gke.bucket",
            g.bucket,
            re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$"),
            "3 to 63 lowercase letters, digits, '-', '_' and '.'",
        ),
        ("gke.artifact_repository", g.artifact_repository, _DNS_LABEL, "lowercase letters, digits and hyphens"),
        (
            "gke.cpu_machine_type",
            g.cpu_machine_type,
            re.compile(r"^[a-z][a-z0-9]*-[a-z0-9-]+$"),
            "a Compute Engine machine type such as n2-standard-8",
        ),
        ("gke.hf_secret", g.hf_secret, _DNS_LABEL, "a Secret name, or empty for none"),
    ]
    for key, value, default in (
        ("gke.node_service_account", g.node_service_account, "the project's default Compute Engine service account"),
        ("gke.build_service_account", g.build_service_account, "the project's default Cloud Build service account"),
    ):
        if value and not SERVICE_ACCOUNT.match(value):
            raise SpecError(
                key,
                f"{value!r} is not a service account email",
                [
                    "NAME@PROJECT.iam.gserviceaccount.com",
                    "PROJECT_NUMBER-compute@developer.gserviceaccount.com",
                    f"empty: {default}",
                ],
            )
    if g.hf_token_secret and not SECRET_VERSION.match(g.hf_token_secret):
        raise SpecError(
            "gke.hf_token_secret",
            f"{g.hf_token_secret!r} is not a Secret Manager secret",
            ["projects/PROJECT/secrets/NAME", "projects/PROJECT/secrets/NAME/versions/VERSION"],
        )
    if g.hf_token_secret and not g.hf_secret:
        raise SpecError(
            "gke.hf_token_secret",
            "the token goes into the Secret gke.hf_secret names, which is empty",
            ["", "gke.hf_secret=hf-secret"],
        )
    for key, value in (("gke.image", g.image), ("gke.torch_tpu_base", g.torch_tpu_base)):
        if value and not _IMAGE_REF.match(value):
            raise SpecError(key, f"{value!r} is not an image reference", ["REGISTRY/PATH/NAME:TAG"])
    for key, value, pattern, what in checks:
        if value and (len(value) > 63 or not pattern.match(value)):
            raise SpecError(key, f"{value!r} is not valid", [what])
    for key, value in (
        ("gke.namespace", g.namespace),
        ("gke.artifact_repository", g.artifact_repository),
        ("gke.cpu_machine_type", g.cpu_machine_type),
    ):
        if not value:
            raise SpecError(key, "must not be empty")
    for key, value in (("gke.pod_range", g.pod_range), ("gke.service_range", g.service_range)):
        if not value:
            continue
        if g.cluster_name:
            raise SpecError(
                key, f"applies to a cluster the run creates; gke.cluster_name={g.cluster_name} is an existing one", [""]
            )
        try:
            ipaddress.IPv4Network(value)
        except ValueError:
            raise SpecError(key, f"{value!r} is not an IPv4 range", ["10.4.0.0/14", "empty: GKE picks one"]) from None
    _check_queue(g)
    if g.cluster_version:  # with gke.cluster_name not applied: the existing cluster's own version is checked
        if not GKE_VERSION.match(g.cluster_version):
            raise SpecError(
                "gke.cluster_version",
                f"{g.cluster_version!r} is not a GKE version",
                ["latest", "1.35", "1.35.2-gke.1842000"],
            )


def _check_queue(g: GkeSpec) -> None:
    """gke.queue names a LocalQueue of an existing cluster; gke.priority_class goes with it. Both are label values
    (Kueue reads them from the labels kueue.x-k8s.io/queue-name and kueue.x-k8s.io/priority-class:
    https://kueue.sigs.k8s.io/docs/tasks/run/rayclusters/) and object names: DNS-1123 labels here."""
    for key, value in (("gke.queue", g.queue), ("gke.priority_class", g.priority_class)):
        if value and (len(value) > 63 or not _DNS_LABEL.match(value)):
            raise SpecError(key, f"{value!r} is not a Kueue object name", ["a DNS label of at most 63 characters"])
    if g.queue and not g.cluster_name:
        raise SpecError(
            "gke.queue",
            "a Kueue LocalQueue is in an existing, shared cluster: gke.cluster_name must name it",
            ["gke.cluster_name=CLUSTER", "empty: the run's own cluster and node pools"],
        )
    if g.priority_class and not g.queue:
        raise SpecError("gke.priority_class", "applies to a run queued in Kueue: gke.queue is empty", [""])


_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$")


def _check_zones(spec: RunSpec) -> None:
    """gke.zones: zones of one region, each once, gke.zone (when set) the first; one zone alone with an existing
    cluster (its zone) or Autopilot (GKE places the nodes in the region)."""
    g = spec.gke
    if not g.zones:
        return
    zones = g.zone_choices
    bad = next((z for z in zones if not _ZONE.match(z)), None)
    if bad is not None:
        raise SpecError("gke.zones", f"{bad!r} is not a zone", ["zones such as us-east5-b,us-east5-a"])
    if len(set(zones)) < len(zones):
        raise SpecError("gke.zones", f"names a zone twice: {g.zones!r}")
    regions = sorted({z.rsplit("-", 1)[0] for z in zones})
    if len(regions) > 1:
        raise SpecError(
            "gke.zones",
            f"zones of {len(regions)} regions ({', '.join(regions)}): the run's image repository, bucket and DCN "
            "subnets are in one region",
            [f"zones of {zones[0].rsplit('-', 1)[0]}"],
        )
    if g.zone and g.zone != zones[0]:
        raise SpecError("gke.zones", f"starts with {zones[0]}, but gke.zone={g.zone}", [f"{g.zone},...", "gke.zone="])
    if len(zones) > 1 and (g.cluster_name or g.cluster_mode == "autopilot"):
        why = f"gke.cluster_name={g.cluster_name} is in one zone" if g.cluster_name else "Autopilot places the nodes"
        raise SpecError("gke.zones", f"{why}: only one zone", [zones[0]])
