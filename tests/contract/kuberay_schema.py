"""Validation of rendered objects against the real KubeRay CRDs, the way a Kubernetes API server does it.

The CRDs' ``openAPIV3Schema`` is a Kubernetes *structural* schema: OpenAPI v3 plus ``x-kubernetes-*``
extensions. It is converted to JSON Schema and checked with ``jsonschema``:

- unknown fields are rejected (``additionalProperties: false`` on every object with ``properties``, unless
  ``x-kubernetes-preserve-unknown-fields``), as the API server does with strict field validation
  (kubectl's default);
- ``x-kubernetes-int-or-string`` accepts an integer or a string; ``nullable`` adds null;
- ``format: int32`` / ``int64`` bound integers;
- ``x-kubernetes-list-type: set`` needs unique items, ``map`` unique ``x-kubernetes-list-map-keys`` tuples;
- ``x-kubernetes-validations`` (CEL): rules with ``oldSelf`` apply to updates only and are skipped; the form
  ``self in [...]`` is evaluated; any other rule reached by an object fails the check as not evaluated, so a
  manifest never passes a rule this test cannot check;
- ``metadata`` (a bare object in CRDs; the server checks ObjectMeta itself): name, namespace and labels as the
  API server and KubeRay check them.

The schema is vendored in ``tests/contract/crds/kuberay-v1.7.0/`` (its SOURCE.md says where it comes from);
``$TPUPIPE_KUBERAY_SCHEMAS`` points the tests at another directory holding the same file (another KubeRay
version, say). Kueue's CRDs (``tests/contract/crds/kueue-v0.19.2/``) are checked the same way (``KUEUE_CRD_FILES``),
their CEL rules evaluated where ``CEL_RULES`` holds a Python reading of the rule's exact text.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

SCHEMA_ENV = "TPUPIPE_KUBERAY_SCHEMAS"
DEFAULT_SCHEMA_DIR = Path(__file__).resolve().parent / "crds" / "kuberay-v1.7.0"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml"}
KUEUE_SCHEMA_DIR = Path(__file__).resolve().parent / "crds" / "kueue-v0.19.2"
KUEUE_CRD_FILES = {
    kind: f"kueue.x-k8s.io_{plural}.yaml"
    for kind, plural in (
        ("Workload", "workloads"),
        ("LocalQueue", "localqueues"),
        ("ClusterQueue", "clusterqueues"),
        ("ResourceFlavor", "resourceflavors"),
        ("AdmissionCheck", "admissionchecks"),
        ("ProvisioningRequestConfig", "provisioningrequestconfigs"),
        ("WorkloadPriorityClass", "workloadpriorityclasses"),
    )
}

DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# KubeRay's limit (ray-operator/controllers/ray/utils/constant.go): it appends suffixes to the name.
NAME_LIMITS = {"RayCluster": 53}


def schema_dir() -> Path:
    return Path(os.environ.get(SCHEMA_ENV, str(DEFAULT_SCHEMA_DIR)))


def _convert(node):
    """One structural-schema node -> a JSON Schema node (x-kubernetes-* keywords kept for the validator)."""
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "description":
            continue
        if key == "properties":
            out[key] = {name: _convert(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = _convert(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_convert(sub) for sub in value]
        else:
            out[key] = value
    if isinstance(out.get("pattern"), str) and out["pattern"].startswith("^(?i)"):
        # RE2 (the API server's regexps) takes a flag group after ^; Python's re only at the very start
        out["pattern"] = "(?i)^" + out["pattern"][len("^(?i)") :]
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if node.get("format") == "int32":
        out.setdefault("minimum", -(2**31))
        out.setdefault("maximum", 2**31 - 1)
    elif node.get("format") == "int64":
        out.setdefault("minimum", -(2**63))
        out.setdefault("maximum", 2**63 - 1)
    return out


def _list_type(validator, list_type, instance, schema):
    from jsonschema.exceptions import ValidationError

    if not isinstance(instance, list):
        return
    if list_type == "set":
        seen = []
        for item in instance:
            if item in seen:
                yield ValidationError(f"duplicate item {item!r} in a set list")
            seen.append(item)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        item_properties = schema.get("items", {}).get("properties", {})
        defaults = {k: item_properties.get(k, {}).get("default") for k in keys}  # applied before the check
        seen = set()
        for item in instance:
            if not isinstance(item, dict):
                continue
            ident = tuple(repr(item.get(k, defaults[k])) for k in keys)
            if ident in seen:
                yield ValidationError(f"duplicate entry for keys {keys} = {ident} in a map list")
            seen.add(ident)


_IN_LIST = re.compile(r"^self in (\[.*\])$")


def _has(node, *path) -> bool:
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _quota_reserved(obj) -> bool:
    return any(c.get("type") == "QuotaReserved" and c.get("status") == "True" for c in _conditions(obj))


def _conditions(obj) -> list:
    return obj.get("status", {}).get("conditions", []) if isinstance(obj.get("status"), dict) else []


# The CEL rules of Kueue's CRDs that the objects here reach, each read into Python from its exact text (Kueue v0.19.2,
# config/components/crd/bases/): a rule missing here still fails the check as not evaluated.
CEL_RULES = {
    # ClusterQueue .spec: no borrowing limit without a cohort
    "!has(self.cohortName) && has(self.resourceGroups) ? self.resourceGroups.all(rg, rg.flavors.all(f, "
    "f.resources.all(r, !has(r.borrowingLimit)))) : true": lambda s: (
        _has(s, "cohortName")
        or not _has(s, "resourceGroups")
        or all("borrowingLimit" not in r for rg in s["resourceGroups"] for f in rg["flavors"] for r in f["resources"])
    ),
    # ClusterQueue .spec.resourceGroups[]: each flavor lists every covered resource
    "self.flavors.all(x, size(x.resources) == size(self.coveredResources))": lambda s: all(
        len(x.get("resources", [])) == len(s.get("coveredResources", [])) for x in s.get("flavors", [])
    ),
    # ClusterQueue .spec.preemption
    "!(self.reclaimWithinCohort == 'Never' && has(self.borrowWithinCohort) && self.borrowWithinCohort.policy != "
    "'Never')": lambda s: (
        not (
            s.get("reclaimWithinCohort") == "Never"
            and "borrowWithinCohort" in s
            and s["borrowWithinCohort"].get("policy") != "Never"
        )
    ),
    # ResourceFlavor .spec: a topology needs node labels
    "!has(self.topologyName) || self.nodeLabels.size() >= 1": lambda s: (
        "topologyName" not in s or len(s.get("nodeLabels", {})) >= 1
    ),
    # ResourceFlavor .spec.tolerations: each toleration as Kubernetes' own validation takes it
    "self.all(x, !has(x.key) ? x.operator == 'Exists' : true)": lambda s: all(
        "key" in x or x.get("operator") == "Exists" for x in s
    ),
    "self.all(x, has(x.tolerationSeconds) ? x.effect == 'NoExecute' : true)": lambda s: all(
        "tolerationSeconds" not in x or x.get("effect") == "NoExecute" for x in s
    ),
    "self.all(x, !has(x.operator) || x.operator in ['Equal', 'Exists'])": lambda s: all(
        x.get("operator", "Equal") in ("Equal", "Exists") for x in s
    ),
    "self.all(x, has(x.operator) && x.operator == 'Exists' ? !has(x.value) : true)": lambda s: all(
        x.get("operator") != "Exists" or "value" not in x for x in s
    ),
    "self.all(x, !has(x.effect) || x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])": lambda s: all(
        x.get("effect", "NoSchedule") in ("NoSchedule", "PreferNoSchedule", "NoExecute") for x in s
    ),
    # Workload: as many podSetAssignments as podSets once quota is reserved
    "has(self.status) && has(self.status.conditions) && self.status.conditions.exists(c, c.type == 'QuotaReserved' "
    "&& c.status == 'True') && has(self.status.admission) ? size(self.spec.podSets) == "
    "size(self.status.admission.podSetAssignments) : true": lambda s: (
        not (_quota_reserved(s) and _has(s, "status", "admission"))
        or len(s["spec"]["podSets"]) == len(s["status"]["admission"].get("podSetAssignments", []))
    ),
    # Workload .spec: a priority class reference comes with its priority
    "!has(self.priorityClassRef) || has(self.priority)": lambda s: "priorityClassRef" not in s or "priority" in s,
    "(self.group == 'scheduling.k8s.io') ? self.kind == 'PriorityClass' : true": lambda s: (
        s.get("group") != "scheduling.k8s.io" or s.get("kind") == "PriorityClass"
    ),
    "(self.group == 'kueue.x-k8s.io') ? self.kind == 'WorkloadPriorityClass' : true": lambda s: (
        s.get("group") != "kueue.x-k8s.io" or s.get("kind") == "WorkloadPriorityClass"
    ),
    "has(self.minCount) ? self.minCount <= self.count : true": lambda s: (
        s.get("minCount", 0) <= s.get("count", 0) or "minCount" not in s
    ),
    "!has(self.clusterName) || (!has(self.nominatedClusterNames) || (has(self.nominatedClusterNames) && "
    "size(self.nominatedClusterNames) == 0))": lambda s: "clusterName" not in s or not s.get("nominatedClusterNames"),
}


def _cel_rules(validator, rules, instance, schema):
    from jsonschema.exceptions import ValidationError

    for rule in rules:
        text = rule["rule"]
        if "oldSelf" in text:
            continue  # a transition rule: checked on update only
        known = CEL_RULES.get(" ".join(text.split()))
        if known is not None:
            if not known(instance):
                yield ValidationError(rule.get("message", f"{instance!r} fails {text}"))
            continue
        match = _IN_LIST.match(text)
        if match:
            if instance not in ast.literal_eval(match.group(1)):
                yield ValidationError(rule.get("message", f"{instance!r} fails {text}"))
            continue
        yield ValidationError(f"CEL rule not evaluated by this test, and the object reaches it: {text}")


def _metadata_errors(obj: dict) -> list[str]:
    errors = []
    meta = obj.get("metadata", {})
    name = meta.get("name", "")
    kind = obj.get("kind", "")
    if not name or not DNS1035_LABEL.match(name):
        errors.append(f"metadata.name {name!r} is not a DNS-1035 label")
    if kind in NAME_LIMITS and len(name) > NAME_LIMITS[kind]:
        errors.append(f"metadata.name {name!r} is longer than KubeRay's {NAME_LIMITS[kind]} for a {kind}")
    namespace = meta.get("namespace", "")
    if namespace and (len(namespace) > 63 or not DNS1123_LABEL.match(namespace)):
        errors.append(f"metadata.namespace {namespace!r} is not a DNS-1123 label")
    errors += _label_errors(obj)
    return errors


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.match(name))


def _label_errors(node, path="") -> list[str]:
    """Every ``labels`` and ``nodeSelector`` map anywhere in the object: label keys and values."""
    errors = []
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            if key in ("labels", "nodeSelector") and isinstance(value, dict):
                for k, v in value.items():
                    if not _label_key_ok(k):
                        errors.append(f"{where}: bad label key {k!r}")
                    if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
                        errors.append(f"{where}: bad label value {v!r} for {k!r}")
            else:
                errors += _label_errors(value, where)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            errors += _label_errors(item, f"{path}[{i}]")
    return errors


class CrdValidator:
    """Validates objects of the CRDs' kinds against their served, stored version: KubeRay's from ``directory`` (or the
    ``files`` named there), and Kueue's from ``kueue_directory`` when given."""

    def __init__(self, directory: Path, kueue_directory: Path | None = None, files: dict[str, str] = CRD_FILES):
        import yaml
        from jsonschema import Draft7Validator, validators

        checker = validators.extend(
            Draft7Validator,
            {"x-kubernetes-list-type": _list_type, "x-kubernetes-validations": _cel_rules},
        )
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the Workload CRD is 1.4 MB
        self.validators = {}
        self.crds: dict[str, dict] = {}  # by name (rayclusters.ray.io), as read
        sources = [(directory, files)] + ([(kueue_directory, KUEUE_CRD_FILES)] if kueue_directory else [])
        for where, files in sources:
            for kind, filename in files.items():
                crd = yaml.load((where / filename).read_text(), Loader=loader)
                assert crd["spec"]["names"]["kind"] == kind
                self.crds[crd["metadata"]["name"]] = crd
                version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
                schema = _convert(version["schema"]["openAPIV3Schema"])
                self.validators[(f"{crd['spec']['group']}/{version['name']}", kind)] = checker(schema)

    def errors(self, obj: dict) -> list[str]:
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key not in self.validators:
            return [f"no CRD for {key}"]
        found = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in self.validators[key].iter_errors(obj)
        ]
        return found + _metadata_errors(obj)
