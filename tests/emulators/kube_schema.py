"""Built-in Kubernetes objects checked as the API server checks them against its schema: every field known to the
kind's type and of its type, every required field present. The schema is the one the ``kubernetes`` client's models
are generated from (the Kubernetes API's OpenAPI spec: each model's ``openapi_types`` and ``attribute_map``, e.g.
``kubernetes/client/models/v1_network_policy.py``), so an object the real API server would refuse for an unknown or
mistyped field is refused here too (strict field validation, the default of ``kubectl apply`` since Kubernetes 1.27:
https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation)."""

from __future__ import annotations

from typing import Any

# The built-in kinds this API server checks by their model (plural -> the client's model class name).
MODELS = {"networkpolicies": "V1NetworkPolicy"}
SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str, "date": str}


def errors(obj: Any, model: str) -> list[str]:
    return _check(obj, model, "")


def _check(value: Any, type_name: str, path: str) -> list[str]:
    from kubernetes import client

    where = path or "."
    if type_name.startswith("list["):
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        return [e for i, item in enumerate(value) for e in _check(item, type_name[5:-1], f"{path}[{i}]")]
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        inner = type_name[type_name.index(",") + 1 : -1].strip()
        return [e for k, v in value.items() for e in _check(v, inner, f"{path}.{k}")]
    if type_name == "object":  # IntOrString and the like: either
        return [] if isinstance(value, (int, str)) and not isinstance(value, bool) else [f"{where}: int or string"]
    if type_name in SCALARS:
        wanted = SCALARS[type_name]
        ok = isinstance(value, wanted) and not (isinstance(value, bool) and type_name in ("int", "float"))
        return [] if ok else [f"{where}: expected {type_name}, got {type(value).__name__}"]
    cls = getattr(client, type_name)
    if not isinstance(value, dict):
        return [f"{where}: expected an object ({type_name})"]
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    out = []
    for key, item in value.items():
        if key not in by_json:
            out.append(f'{path}.{key}: unknown field "{key}"')
        elif item is not None:
            out += _check(item, cls.openapi_types[by_json[key]], f"{path}.{key}")
    if not out:
        try:  # the model's constructor refuses a required field left out
            cls(**{by_json[k]: v for k, v in value.items()})
        except ValueError as exc:
            out.append(f"{where}: {exc}")
    return out
