"""IAM allow policies, evaluated as Google Cloud evaluates them for Cloud Storage: a member is allowed a permission on a
resource when some binding of the policy names the member, its role grants the permission, and its condition (if it
has one) holds for the resource (https://cloud.google.com/iam/docs/policies#structure,
https://cloud.google.com/iam/docs/conditions-overview).

- ``ROLES``: the Cloud Storage permissions each predefined Cloud Storage role grants (the ``storage.buckets.*`` and
  ``storage.objects.*`` ones, which are all the storage emulator checks);
- ``condition(expression)``: an IAM Condition's CEL expression, compiled to a function of the resource's attributes
  (``resource.name``, ``resource.type``). Only a subset of CEL is read: those two attributes, string literals,
  ``.startsWith(...)``, ``==``, ``!``, ``&&``, ``||`` and parentheses. Any other expression raises
  :class:`UnsupportedCondition`: the emulator refuses what it cannot evaluate rather than guess what it grants;
- ``allows(bindings, member, permission, attributes)``: the decision. Members are matched by their exact name, or
  for a GKE pod's federated identity (:class:`Workload`, ``workload``) by any of the identifiers IAM knows it by:
  its Kubernetes ServiceAccount by namespace and name or by UID, its namespace's and its cluster's principal sets;
  groups, domains, other ``principalSet://`` sets, ``allUsers`` and ``allAuthenticatedUsers`` match no one here, and
  nothing is inherited from the project or organization (a deliberate limit: such a grant is refused).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

# the attributes Cloud Storage gives a condition (https://cloud.google.com/iam/docs/conditions-resource-attributes)
ATTRIBUTES = ("resource.name", "resource.type")
SUBSET = "resource.name and resource.type with startsWith, ==, !, &&, || and parentheses"  # what condition() reads
BUCKET_TYPE, OBJECT_TYPE = "storage.googleapis.com/Bucket", "storage.googleapis.com/Object"

_VIEWER = frozenset({"storage.objects.get", "storage.objects.list"})
_USER = _VIEWER | {
    "storage.objects.create",
    "storage.objects.delete",
    "storage.objects.restore",
    "storage.objects.update",
}
_OBJECT_ADMIN = _USER | {"storage.objects.getIamPolicy", "storage.objects.setIamPolicy"}
_BUCKET_READER = frozenset({"storage.buckets.get", "storage.objects.list"})
_BUCKET_WRITER = _BUCKET_READER | {"storage.objects.create", "storage.objects.delete", "storage.objects.restore"}
# role -> the storage.buckets.* and storage.objects.* permissions it grants
# (https://cloud.google.com/storage/docs/access-control/iam-roles)
ROLES: dict[str, frozenset[str]] = {
    "roles/storage.objectViewer": _VIEWER,
    "roles/storage.objectCreator": frozenset({"storage.objects.create"}),
    "roles/storage.objectUser": _USER,
    "roles/storage.objectAdmin": _OBJECT_ADMIN,
    "roles/storage.admin": _OBJECT_ADMIN
    | {
        "storage.buckets.create",
        "storage.buckets.delete",
        "storage.buckets.get",
        "storage.buckets.getIamPolicy",
        "storage.buckets.list",
        "storage.buckets.setIamPolicy",
        "storage.buckets.update",
    },
    "roles/storage.legacyBucketReader": _BUCKET_READER,
    "roles/storage.legacyBucketWriter": _BUCKET_WRITER,
    "roles/storage.legacyBucketOwner": _BUCKET_WRITER
    | {"storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy", "storage.buckets.update"},
    "roles/storage.legacyObjectReader": frozenset({"storage.objects.get"}),
    "roles/storage.legacyObjectOwner": frozenset(
        {
            "storage.objects.get",
            "storage.objects.getIamPolicy",
            "storage.objects.setIamPolicy",
            "storage.objects.update",
        }
    ),
}


class Workload(str):
    """A GKE pod's identity in its project's workload identity pool: the string is its Kubernetes ServiceAccount's
    principal by namespace and name; ``identifiers`` every principal identifier that names it."""

    identifiers: frozenset[str]


def workload(number: str, project: str, cluster: str, namespace: str, name: str, uid: str) -> Workload:
    """The identity of the pods of cluster ``cluster`` (``projects/P/locations/L/clusters/C``) that run as the
    Kubernetes ServiceAccount ``namespace/name`` whose UID is ``uid``, in the pool ``PROJECT.svc.id.goog`` of project
    number ``number``: the identifiers IAM's table of principal identifiers gives GKE pods
    (https://cloud.google.com/iam/docs/principal-identifiers, "All GKE Pods that use a specific Kubernetes service
    account" by name, by service account ID and in the legacy format, "All GKE Pods in a Kubernetes namespace,
    regardless of service account or cluster", "All GKE Pods in a specific cluster"; the same as
    https://cloud.google.com/kubernetes-engine/docs/concepts/workload-identity#principal-id-examples). The name forms
    hold in every cluster of the pool ("Identity sameness", same page); the UID is the object's own."""
    pool = f"iam.googleapis.com/projects/{number}/locations/global/workloadIdentityPools/{project}.svc.id.goog"
    identity = Workload(f"principal://{pool}/subject/ns/{namespace}/sa/{name}")
    identity.identifiers = frozenset(
        {
            str(identity),
            f"principal://{pool}/kubernetes.serviceaccount.uid/{uid}",
            f"serviceAccount:{project}.svc.id.goog[{namespace}/{name}]",
            f"principalSet://{pool}/namespace/{namespace}",
            f"principalSet://{pool}/kubernetes.cluster/https://container.googleapis.com/v1/{cluster}",
        }
    )
    return identity


class UnsupportedCondition(ValueError):
    """A condition expression outside the CEL subset this emulator evaluates."""


Evaluator = Callable[[Mapping[str, str]], object]
Typed = tuple[type, Evaluator]  # what an expression evaluates to (str or bool), and how

# CEL's tokens that the subset uses (https://github.com/google/cel-spec/blob/master/doc/langdef.md#syntax): a
# dotted name reads an attribute or names its startsWith method; a string literal, single- or double-quoted
_TOKEN = re.compile(
    r"""\s*(?:(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
    r"""|(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)|(?P<symbol>&&|\|\||==|!|\(|\)))"""
)
_ESCAPES = {"\\": "\\", '"': '"', "'": "'"}
# the binary logical operators, loosest first (CEL's precedence): each combines its operands as any/all does
_LOGICAL = (("||", any), ("&&", all))
STARTS_WITH = ".startsWith"


def condition(expression: object) -> Callable[[Mapping[str, str]], bool]:
    """The condition ``expression`` compiled: a function of the resource's attributes (``ATTRIBUTES``) that says
    whether it holds. Raises :class:`UnsupportedCondition` for an expression outside the subset."""
    if not isinstance(expression, str) or not expression.strip():
        raise UnsupportedCondition("a condition needs a non-empty expression")
    return _Compiler(expression).compile()


class _Compiler:
    """A recursive-descent reading of the subset, each rule answering a :data:`Typed`; types are checked as they are
    read, so that ``!resource.name == "x"`` (``!`` of a string, as CEL's precedence reads it) is refused."""

    def __init__(self, expression: str):
        self.tokens: list[tuple[str, str]] = []
        rest = expression.rstrip()
        at = 0
        while at < len(rest):
            match = _TOKEN.match(rest, at)
            if not match:
                raise UnsupportedCondition(f"cannot read {rest[at:].strip()!r}")
            kind = match.lastgroup or ""
            self.tokens.append((kind, _literal(match[kind]) if kind == "string" else match[kind]))
            at = match.end()
        self.at = 0

    def compile(self) -> Callable[[Mapping[str, str]], bool]:
        evaluate = self._expect_type(self._logical(0), bool, "the expression")
        if self.at < len(self.tokens):
            raise UnsupportedCondition(f"unexpected {self.tokens[self.at][1]!r}")
        return lambda attributes: bool(evaluate(attributes))

    def _peek(self) -> tuple[str, str]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "")

    def _accept(self, symbol: str) -> bool:
        if self._peek() == ("symbol", symbol):
            self.at += 1
            return True
        return False

    def _require(self, symbol: str) -> None:
        if not self._accept(symbol):
            raise UnsupportedCondition(f"expected {symbol!r} where {self._peek()[1] or 'the end'!r} is")

    def _expect_type(self, typed: Typed, wanted: type, what: str) -> Evaluator:
        if typed[0] is not wanted:
            raise UnsupportedCondition(f"{what} must be a {wanted.__name__}, not a {typed[0].__name__}")
        return typed[1]

    def _logical(self, level: int) -> Typed:
        if level == len(_LOGICAL):
            return self._equality()
        symbol, combine = _LOGICAL[level]
        first = self._logical(level + 1)
        operands = [first]
        while self._accept(symbol):
            operands.append(self._logical(level + 1))
        if len(operands) == 1:
            return first
        checked = [self._expect_type(operand, bool, f"an operand of {symbol}") for operand in operands]
        return bool, lambda attributes: combine(evaluate(attributes) for evaluate in checked)

    def _equality(self) -> Typed:
        left = self._unary()
        if not self._accept("=="):
            return left
        right = self._unary()
        lhs, rhs = (self._expect_type(side, str, "an operand of ==") for side in (left, right))
        return bool, lambda attributes: lhs(attributes) == rhs(attributes)

    def _unary(self) -> Typed:
        if self._accept("!"):
            operand = self._expect_type(self._unary(), bool, "the operand of !")
            return bool, lambda attributes: not operand(attributes)
        return self._primary()

    def _primary(self) -> Typed:
        kind, value = self._peek()
        self.at += 1
        if (kind, value) == ("symbol", "("):
            inner = self._logical(0)
            self._require(")")
            return inner
        if kind == "string":
            return str, lambda attributes: value
        if kind == "name" and value in ATTRIBUTES:
            return str, lambda attributes: attributes[value]
        attribute = value.removesuffix(STARTS_WITH)
        if kind == "name" and value.endswith(STARTS_WITH) and attribute in ATTRIBUTES:
            self._require("(")
            prefix = self._expect_type(self._logical(0), str, "the argument of startsWith")
            self._require(")")
            return bool, lambda attributes: attributes[attribute].startswith(prefix(attributes))
        raise UnsupportedCondition(f"{value or 'the end'!r} is not in the subset")


def _literal(token: str) -> str:
    """A CEL string literal's value; escapes other than ``\\\\``, ``\\"`` and ``\\'`` are outside the subset."""

    def unescape(match: re.Match) -> str:
        if match[1] not in _ESCAPES:
            raise UnsupportedCondition(f"the escape \\{match[1]} is not in the subset")
        return _ESCAPES[match[1]]

    return re.sub(r"\\(.)", unescape, token[1:-1])


def allows(bindings: list[dict], member: str, permission: str, attributes: Mapping[str, str]) -> bool:
    """Whether a policy's ``bindings`` allow ``member`` ``permission`` on the resource ``attributes`` describe. A
    condition that cannot be evaluated grants nothing."""
    known = getattr(member, "identifiers", frozenset({member}))
    for binding in bindings:
        if known.isdisjoint(binding.get("members", ())) or permission not in ROLES.get(binding.get("role"), ()):
            continue
        when = binding.get("condition")
        if not when:
            return True
        try:
            if condition(when.get("expression") if isinstance(when, dict) else None)(attributes):
                return True
        except UnsupportedCondition:
            continue
    return False
