"""The run spec's parser: a nested dict (the JSON form), ``key=value`` overrides and a preset's layers, each
through the same strict rules: unknown keys are rejected, values are coerced to the field's type, and the spec's
checks (``checks``) run once on the result. Errors are :class:`SpecError` and name the field."""

from __future__ import annotations

import dataclasses
import json
import shlex
import typing
from typing import Any

from components.spec import presets
from components.spec.checks import validate
from components.spec.errors import SpecError
from components.spec.run_spec import SECTIONS, RunSpec

# The test aids' keys before the ``testing`` section held them: a spec recorded then (an earlier run's ledger, which
# ``tpupipe teardown`` and the janitor read back) is read with them in ``testing``; an override naming one is refused,
# naming the key it is now.
MOVED: dict[str, str] = {
    "cluster.slice_check_corrupt_rank": "testing.slice_check_corrupt_rank",
    "cluster.slice_check_slow_rank": "testing.slice_check_slow_rank",
    "cluster.host_start_delay_s": "testing.host_start_delay_s",
    "cluster.host_replace_delay_s": "testing.host_replace_delay_s",
    "cluster.drain_host_at_step": "testing.drain_host_at_step",
    "train.fail_at_step": "testing.fail_at_step",
    "train.fail_eval": "testing.fail_eval",
}


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
    if key in MOVED:
        raise SpecError(key, f"is {MOVED[key]} now (the test aids' section)", [MOVED[key]])
    matches = [k for k in keys if k.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise SpecError(key, "ambiguous key; use the full name", matches)
    raise SpecError(key, "unknown key", keys)


def _optional(typ: Any) -> type | None:
    """``X`` of a field typed ``X | None`` (a limit that may be unset), else None."""
    args = typing.get_args(typ)
    if len(args) == 2 and type(None) in args:
        inner: type = next(a for a in args if a is not type(None))
        return inner
    return None


def _coerce(key: str, value: Any, typ: Any) -> Any:
    inner = _optional(typ)
    if inner is not None:  # unset: JSON null, or an empty override (``run.deadline_h=``)
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        try:
            return _coerce(key, value, inner)
        except SpecError:
            raise SpecError(key, f"expected {inner.__name__} or empty (unset), got {value!r}") from None
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


def _recorded_before(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the keys an earlier layout recorded (``MOVED``) in their sections now (a copy, when any)."""
    out = data
    for old, new in MOVED.items():
        (section, leaf), (now, now_leaf) = old.split("."), new.split(".")
        raw = out.get(section)
        if not (isinstance(raw, dict) and leaf in raw):
            continue
        if out is data:
            out = {key: dict(value) if isinstance(value, dict) else value for key, value in data.items()}
        value = out[section].pop(leaf)
        target = out.setdefault(now, {})
        if isinstance(target, dict):  # else the section's own check refuses it
            target.setdefault(now_leaf, value)
    return out


def from_dict(data: dict[str, Any]) -> RunSpec:
    """Build a validated spec from a nested dict (the JSON form). Unknown keys are errors; a key an earlier layout
    recorded elsewhere (``MOVED``) is read where it is now."""
    if not isinstance(data, dict):
        raise SpecError("spec", f"expected an object, got {type(data).__name__}")
    data = _recorded_before(data)
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
    merged: dict[str, Any] = json.loads(json.dumps(base))
    for key, value in overrides.items():
        key = _canonical_key(key)
        if "." in key:
            section, leaf = key.split(".", 1)
            merged.setdefault(section, {})[leaf] = value
        else:
            merged[key] = value
    return merged


def layered(preset: str, overrides: str | typing.Iterable[str] | dict[str, Any] = "") -> RunSpec:
    """preset name + overrides -> a RunSpec that passed the spec's own checks. Callers that run anything use
    ``components.workload.resolve``, which adds the hardware checks."""
    if preset not in presets.PRESETS:
        raise SpecError("preset", f"unknown preset {preset!r}", sorted(presets.PRESETS))
    parsed = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    base = {"name": preset, **presets.PRESETS[preset]}
    return from_dict(apply_overrides(base, parsed))
