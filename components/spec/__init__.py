"""The run spec: what a run is, as data, and the names and records that follow from it.

Owns the typed, strict, read-only run spec: its fields (``run_spec``), its parser (``parsing``), its own checks
across fields (``checks``) and how long a run waits for its hosts (``readiness``); the named presets
(``presets``), the models the trainers build from a config (``models``), every resource name derived from a run id,
the Google Cloud project id rule and where the command line points when told nothing (``names``), the one error
hierarchy (``errors``) and the record protocol the trainers print and the stages parse (``protocol``).
Pure standard library; imports nothing else of the project, so the pipeline image and both trainer images
import it alike. See docs/architecture.md for the dependency rules.
"""

from components.spec.checks import validate
from components.spec.errors import InfraError, SpecError, TpupipeError
from components.spec.parsing import all_keys, apply_overrides, from_dict, layered, parse_overrides
from components.spec.readiness import READY_LIMITS_S, ReadyLimits, ready_limits
from components.spec.run_spec import (
    CAPACITY_TYPES,
    CHAMPION,
    GENERATED_DATASET,
    GKE_CLUSTER_MODES,
    MULTISLICE_NETWORKS,
    PRECISIONS,
    SCRATCH_PREFIX,
    SECTIONS,
    WORKLOADS,
    ClusterSpec,
    GateSpec,
    GkeSpec,
    MaxTextSpec,
    RunLimitsSpec,
    RunSpec,
    TrainSpec,
)

__all__ = [
    "CAPACITY_TYPES",
    "CHAMPION",
    "GENERATED_DATASET",
    "GKE_CLUSTER_MODES",
    "MULTISLICE_NETWORKS",
    "READY_LIMITS_S",
    "SCRATCH_PREFIX",
    "SECTIONS",
    "PRECISIONS",
    "WORKLOADS",
    "ClusterSpec",
    "GateSpec",
    "GkeSpec",
    "InfraError",
    "MaxTextSpec",
    "ReadyLimits",
    "RunLimitsSpec",
    "RunSpec",
    "SpecError",
    "TpupipeError",
    "TrainSpec",
    "all_keys",
    "apply_overrides",
    "from_dict",
    "layered",
    "parse_overrides",
    "ready_limits",
    "validate",
]
