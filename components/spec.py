"""The run spec: one typed, strict, read-only description of a tpupipe run.

Layers, like MaxText's config: field defaults -> preset -> overrides (``key=value``). Every layer goes through
the same strict parser: unknown keys are rejected, values are coerced to the field's type, and cross-field
checks run once on the result. Errors are :class:`SpecError` and name the field.

This module is pure standard library: it is imported by the components (pipeline image) and by the trainers
(trainer images) alike.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CAPACITY_TYPES = ("on-demand", "spot", "reservation", "flex-start")
WORKLOADS = ("fsdp",)
GENERATED_DATASET = "generated"
SCRATCH_PREFIX = "scratch:"


class SpecError(ValueError):
    """Bad input, found before anything is created. ``field`` is the dotted key at fault."""

    def __init__(self, field: str, message: str, valid: typing.Iterable[str] | None = None):
        self.field = field
        self.valid = list(valid) if valid is not None else None
        text = f"{field}: {message}"
        if self.valid:
            text += f" (valid: {', '.join(self.valid)})"
        super().__init__(text)


@dataclass(frozen=True)
class ClusterSpec:
    """Where the run trains: the hosts of the Ray cluster."""

    accelerator: str = "cpu"  # "cpu" (emulated hosts) or a TPU family: v5e, v5p, v6e, tpu7x
    topology: str = ""  # TPU slice topology, e.g. "4x4"; empty for cpu
    num_slices: int = 1
    num_hosts: int = 2  # hosts per slice (emulated raylets on the local platform)
    cpus_per_host: int = 1  # Ray CPUs each emulated host offers (local platform)
    capacity: str = "on-demand"
    reservation: str = ""  # required when capacity=reservation
    ready_timeout_s: float = 180.0  # how long deploy_raycluster waits for every host


@dataclass(frozen=True)
class TrainSpec:
    """What the run trains, and how."""

    workload: str = "fsdp"
    model_id: str = "scratch:gemma4-tiny"  # hub name, local directory, or scratch:<config> (random init)
    dataset: str = GENERATED_DATASET  # "generated", a local .json/.jsonl file, or a hub dataset name
    train_split: str = "train"
    eval_split: str = "heldout"
    num_train_examples: int = 1024  # size of the generated dataset's train split
    num_eval_examples: int = 128  # size of the generated dataset's held-out split
    max_length: int = 64  # tokens per example, padded
    batch_size: int = 8  # per worker
    epochs: int = 3
    learning_rate: float = 2e-5
    weight_decay: float = 0.01
    seed: int = 0
    num_workers: int = 0  # 0: one per host (cpu) or one per TPU device
    num_to_keep: int = 1  # checkpoints kept, best by loss
    max_failures: int = 0  # worker-group restarts Ray Train may make
    fail_at_step: int = 0  # testing aid: raise inside training at this global step (0: never)
    timeout_s: float = 3600.0  # the train job's deadline


@dataclass(frozen=True)
class RunSpec:
    name: str = "custom"
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    train: TrainSpec = field(default_factory=TrainSpec)

    # ---- derived facts (one place each) ----
    @property
    def total_hosts(self) -> int:
        return self.cluster.num_hosts * self.cluster.num_slices

    @property
    def num_workers(self) -> int:
        if self.train.num_workers:
            return self.train.num_workers
        return self.total_hosts

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return from_dict(json.loads(text))


SECTIONS: dict[str, type] = {"cluster": ClusterSpec, "train": TrainSpec}


def _field_types(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def all_keys() -> list[str]:
    """Every settable dotted key, in declaration order."""
    keys = ["name"]
    for section, cls in SECTIONS.items():
        keys += [f"{section}.{name}" for name in _field_types(cls)]
    return keys


def _canonical_key(key: str) -> str:
    """Accept a dotted key, or a leaf name that is unique across sections (``epochs`` -> ``train.epochs``)."""
    keys = all_keys()
    if key in keys:
        return key
    matches = [k for k in keys if k.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise SpecError(key, "ambiguous key; use the full name", matches)
    raise SpecError(key, "unknown key", keys)


def _coerce(key: str, value: Any, typ: type) -> Any:
    if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
        return value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            if typ is bool:
                lowered = text.lower()
                if lowered in ("true", "1", "yes", "on"):
                    return True
                if lowered in ("false", "0", "no", "off"):
                    return False
                raise ValueError(text)
            if typ is int:
                return int(text)
            if typ is float:
                return float(text)
            if typ is str:
                return value
        except ValueError:
            pass
    raise SpecError(key, f"expected {typ.__name__}, got {value!r}")


def from_dict(data: dict[str, Any]) -> RunSpec:
    """Build a validated spec from a nested dict (the JSON form). Unknown keys are errors."""
    if not isinstance(data, dict):
        raise SpecError("spec", f"expected an object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"name", *SECTIONS})
    if unknown:
        raise SpecError(unknown[0], "unknown key", ["name", *SECTIONS])
    sections = {}
    for section, cls in SECTIONS.items():
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            raise SpecError(section, f"expected an object, got {type(raw).__name__}")
        types = _field_types(cls)
        for key in raw:
            if key not in types:
                raise SpecError(f"{section}.{key}", "unknown key", [f"{section}.{k}" for k in types])
        sections[section] = cls(**{k: _coerce(f"{section}.{k}", v, types[k]) for k, v in raw.items()})
    name = _coerce("name", data.get("name", "custom"), str)
    spec = RunSpec(name=name, **sections)
    validate(spec)
    return spec


def parse_overrides(text: str | typing.Iterable[str]) -> dict[str, str]:
    """``"epochs=2 cluster.num_hosts=3"`` (or a list of ``key=value``) -> {canonical key: raw value}."""
    items = shlex.split(text) if isinstance(text, str) else list(text)
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(item, "an override must look like key=value")
        out[_canonical_key(key.strip())] = value
    return out


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Layer dotted-key overrides onto a nested spec dict (a copy)."""
    merged = json.loads(json.dumps(base))
    for key, value in overrides.items():
        key = _canonical_key(key)
        if "." in key:
            section, leaf = key.split(".", 1)
            merged.setdefault(section, {})[leaf] = value
        else:
            merged[key] = value
    return merged


def _is_local_file(dataset: str) -> bool:
    return dataset.endswith((".json", ".jsonl")) or dataset.startswith(("/", "./", "../", "~"))


def validate(spec: RunSpec) -> None:
    """Cross-field checks. Raises SpecError naming the first bad field."""
    c, t = spec.cluster, spec.train
    positive = {
        "cluster.num_slices": c.num_slices,
        "cluster.num_hosts": c.num_hosts,
        "cluster.cpus_per_host": c.cpus_per_host,
        "train.epochs": t.epochs,
        "train.batch_size": t.batch_size,
        "train.num_to_keep": t.num_to_keep,
        "train.num_train_examples": t.num_train_examples,
        "train.num_eval_examples": t.num_eval_examples,
    }
    for key, value in positive.items():
        if value < 1:
            raise SpecError(key, f"must be at least 1, got {value}")
    for key, value in {
        "train.num_workers": t.num_workers,
        "train.max_failures": t.max_failures,
        "train.fail_at_step": t.fail_at_step,
    }.items():
        if value < 0:
            raise SpecError(key, f"must be 0 or more, got {value}")
    if t.max_length < 8:
        raise SpecError("train.max_length", f"must be at least 8, got {t.max_length}")
    if not t.learning_rate > 0:
        raise SpecError("train.learning_rate", f"must be positive, got {t.learning_rate}")
    if t.weight_decay < 0:
        raise SpecError("train.weight_decay", f"must be 0 or more, got {t.weight_decay}")
    for key, value in {"cluster.ready_timeout_s": c.ready_timeout_s, "train.timeout_s": t.timeout_s}.items():
        if not value > 0:
            raise SpecError(key, f"must be positive, got {value}")
    if c.capacity not in CAPACITY_TYPES:
        raise SpecError("cluster.capacity", f"unknown capacity type {c.capacity!r}", CAPACITY_TYPES)
    if c.capacity == "reservation" and not c.reservation:
        raise SpecError("cluster.reservation", "required when cluster.capacity=reservation")
    if c.accelerator != "cpu" and not c.topology:
        raise SpecError("cluster.topology", f"required for accelerator {c.accelerator!r}")
    if t.workload not in WORKLOADS:
        raise SpecError("train.workload", f"unknown workload {t.workload!r}", WORKLOADS)
    if t.model_id.startswith(SCRATCH_PREFIX):
        from trainers import model_configs  # pure data, no torch

        config = t.model_id.removeprefix(SCRATCH_PREFIX)
        if config not in model_configs.SCRATCH_CONFIGS:
            raise SpecError(
                "train.model_id",
                f"unknown scratch config {config!r}",
                [SCRATCH_PREFIX + n for n in model_configs.SCRATCH_CONFIGS],
            )
    if not t.model_id:
        raise SpecError("train.model_id", "must not be empty")
    if t.dataset != GENERATED_DATASET and _is_local_file(t.dataset):
        if not Path(t.dataset).expanduser().is_file():
            raise SpecError("train.dataset", f"file not found: {t.dataset}")


def resolve(preset: str, overrides: str | typing.Iterable[str] | dict[str, Any] = "") -> RunSpec:
    """preset name + overrides -> validated RunSpec. The one entry point every caller uses."""
    from components import presets

    if preset not in presets.PRESETS:
        raise SpecError("preset", f"unknown preset {preset!r}", sorted(presets.PRESETS))
    parsed = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    base = {"name": preset, **presets.PRESETS[preset]}
    return from_dict(apply_overrides(base, parsed))
