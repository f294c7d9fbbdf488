"""An in-process Cloud Storage: the part of the JSON API (``/storage/v1``) that bucket provisioning uses (buckets.get,
buckets.insert, buckets.getIamPolicy, buckets.setIamPolicy), served over plain HTTP by ``http.server``, so that the
real ``google.cloud.storage.Client`` talks to it.

Requests are checked as Cloud Storage checks them: bucket names (3-63 characters of lowercase letters, digits,
``-``, ``_`` and ``.``, starting and ending with a letter or digit, no ``goog`` prefix), unknown body fields, the
project a bucket is created in, IAM roles and members (a workload identity ``principal://`` member must name its
project by number), and the policy etag a set is conditional on. A bucket is created in a project of ``projects``
(project id -> project number), whose number the bucket resource then carries; a project not there is 400
``Unknown project id`` (what Cloud Storage answers for a project id that does not exist). A new bucket starts with
Cloud Storage's default policy (the project's owners and editors as legacyBucketOwner, its viewers as
legacyBucketReader). As in Cloud Storage, the policy is bucket metadata: each set bumps the bucket's
metageneration, and the policy's etag encodes it ("CAE=" for a new bucket). A policy is answered at version 3 when
it has conditional bindings (which need ``optionsRequestedPolicyVersion=3``), else at version 1. Errors come back
in Google's JSON error shape, so the client raises the ``google.api_core.exceptions`` it raises against Cloud
Storage (NotFound, Conflict, BadRequest, PreconditionFailed, ...).

Faults are injected per method ("buckets.get", "buckets.insert", "buckets.getIamPolicy", "buckets.setIamPolicy"):
an HTTP error for the next N matching calls, before the call takes effect.

Pointing the client here: set ``STORAGE_EMULATOR_HOST`` to the endpoint ``start()`` returns (scheme included); the
client then sends the credentials it is given, or none at all (anonymous) when it is given none.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.emulators import take_fault
from tests.emulators.http import REASONS, Fault, HttpEmulator, HttpError

STORAGE_REASONS = {**REASONS, 409: "conflict"}
PATH = re.compile(r"/storage/v1/b(?:/(?P<bucket>[^/]+)(?P<iam>/iam)?)?")
ROUTES = {("POST", False, False): "buckets.insert", ("GET", True, False): "buckets.get",
          ("GET", True, True): "buckets.getIamPolicy", ("PUT", True, True): "buckets.setIamPolicy"}
BUCKET_NAME = re.compile(r"[a-z0-9][-a-z0-9_.]{1,61}[a-z0-9]")
# the bucket resource's fields; output-only ones are accepted in an insert and overwritten
BUCKET_FIELDS = {"kind", "id", "selfLink", "name", "projectNumber", "metageneration", "etag", "timeCreated", "updated",
                 "location", "locationType", "storageClass", "labels", "iamConfiguration", "versioning", "lifecycle",
                 "cors", "logging", "website", "encryption", "billing", "retentionPolicy", "defaultEventBasedHold",
                 "autoclass", "hierarchicalNamespace", "softDeletePolicy", "customPlacementConfig", "rpo", "acl",
                 "defaultObjectAcl", "objectRetention", "ipFilter", "owner"}
POLICY_FIELDS = {"kind", "resourceId", "version", "etag", "bindings"}
MULTI_REGIONS = {"US", "EU", "ASIA"}
ROLE = re.compile(r"(?:roles|(?:projects|organizations)/[^/]+/roles)/[\w.]+")
MEMBER = re.compile(r"(?:deleted:)?(?:user|serviceAccount|group):[^@\s]+@\S+|domain:\S+"
                    r"|project(?:Owner|Editor|Viewer):\S+|allUsers|allAuthenticatedUsers"
                    r"|principal(?:Set)?://iam\.googleapis\.com/\S+")
POOL_MEMBER = re.compile(r"principal(?:Set)?://iam\.googleapis\.com/projects/(?P<project>[^/]+)/locations/global/"
                         r"workloadIdentityPools/.+")


@dataclass
class State:
    buckets: dict[str, dict] = field(default_factory=dict)  # bucket name -> bucket resource JSON
    policies: dict[str, dict] = field(default_factory=dict)  # bucket name -> {"version": V, "bindings": [...]}
    owners: dict[str, str] = field(default_factory=dict)  # bucket name -> project id it was created in
    calls: list[str] = field(default_factory=list)  # method names ("buckets.get", ...), in order


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _etag(metageneration: int) -> str:
    """Cloud Storage's etag of bucket metadata: the metageneration as a protobuf varint field 1, in base64."""
    data, n = bytearray([8]), metageneration
    while n > 0x7F:
        data.append(n & 0x7F | 0x80)
        n >>= 7
    return base64.b64encode(bytes([*data, n])).decode()


class StorageEmulator(HttpEmulator):
    """The service; ``start()`` serves it on 127.0.0.1 over plain HTTP and returns the endpoint."""

    def __init__(self, projects: dict[str, str], token: str = ""):
        super().__init__()
        self.projects = projects  # project id -> project number (a string of digits)
        self.token = token  # when set, requests must carry "Authorization: Bearer <token>"
        self.state = State()
        self.faults: list[Fault] = []
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ faults and inspection
    def fail(self, method: str, status: int, reason: str = "", message: str = "", times: int = 1,
             when: Callable[[dict], bool] = lambda request: True) -> None:
        """The next ``times`` calls of ``method`` matching ``when`` answer HTTP ``status``. ``when`` gets
        ``{"bucket": name, "query": {...}, "body": {...}}`` (an insert's bucket name is the body's)."""
        self.faults.append(Fault(method, status, reason or STORAGE_REASONS.get(status, "error"),
                                 message or f"Injected HTTP {status} for {method}.", times, when))

    def members(self, bucket: str, role: str) -> list[str]:
        """The members ``bucket``'s policy grants ``role`` (in any binding), sorted."""
        with self._lock:
            bindings = self.state.policies.get(bucket, {}).get("bindings", [])
            return sorted({m for b in bindings if b["role"] == role for m in b["members"]})

    # ------------------------------------------------------------------ serving
    def _serve(self, http: BaseHTTPRequestHandler, text: str) -> tuple[int, dict]:
        url = urlsplit(http.path)
        m = PATH.fullmatch(url.path)
        method = m and ROUTES.get((http.command, bool(m["bucket"]), bool(m["iam"])))
        if not method:
            raise HttpError(404, f"The emulator does not serve {http.command} {url.path}.")
        with self._lock:
            self.state.calls.append(method)
        auth = http.headers.get("Authorization")
        if self.token and auth != f"Bearer {self.token}":
            permission = "storage." + method.replace("insert", "create")
            raise HttpError(401, "Invalid Credentials" if auth else f"Anonymous caller does not have {permission} "
                            "access to the Google Cloud Storage bucket.", "authError" if auth else "required")
        try:
            body = json.loads(text) if http.command in ("POST", "PUT") else {}
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise HttpError(400, "Invalid JSON payload received.", "parseError")
        bucket = unquote(m["bucket"]) if m["bucket"] else str(body.get("name", ""))
        request = {"bucket": bucket, "query": dict(parse_qsl(url.query)), "body": body}
        fault = take_fault(self.faults, self._lock, method, request)
        if fault:
            raise HttpError(fault.status, fault.message, fault.reason)
        with self._lock:  # serialised under the lock: the answer may be a stored resource
            return 200, copy.deepcopy(getattr(self, "_" + method.split(".")[1])(**request))

    # ------------------------------------------------------------------ buckets
    def _bucket(self, bucket: str) -> dict:
        if bucket not in self.state.buckets:
            raise HttpError(404, "The specified bucket does not exist.")
        return self.state.buckets[bucket]

    def _get(self, bucket: str, query: dict, body: dict) -> dict:
        return self._bucket(bucket)

    def _insert(self, bucket: str, query: dict, body: dict) -> dict:
        project = query.get("project")
        if not project:
            raise HttpError(400, "Required parameter: project", "required")
        unknown = sorted(set(body) - BUCKET_FIELDS)
        if unknown:
            raise HttpError(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        if not BUCKET_NAME.fullmatch(bucket) or bucket.startswith("goog") or ".." in bucket:
            raise HttpError(400, f"Invalid bucket name: '{bucket}'")
        if project not in self.projects:
            raise HttpError(400, f"Unknown project id: {project}")
        if bucket in self.state.buckets:
            raise HttpError(409, "Your previous request to create the named bucket succeeded and you already own it."
                            if self.state.owners[bucket] == project else "The requested bucket name is not available. "
                            "The bucket namespace is shared by all users of the system. Please select a different "
                            "name and try again.", "conflict")
        now, number = _now(), self.projects[project]
        location = str(body.get("location", "US")).upper()
        iam = body.get("iamConfiguration", {})
        ubla = bool(iam.get("uniformBucketLevelAccess", iam.get("bucketPolicyOnly", {})).get("enabled"))
        access = {"enabled": ubla}
        if ubla:
            locked = datetime.now(UTC) + timedelta(days=90)
            access["lockedTime"] = locked.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self.state.buckets[bucket] = {
            **body, "kind": "storage#bucket", "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket}",
            "id": bucket, "name": bucket, "projectNumber": number, "metageneration": "1", "location": location,
            "locationType": "multi-region" if location in MULTI_REGIONS else "region",
            "storageClass": body.get("storageClass", "STANDARD"), "timeCreated": now, "updated": now,
            "iamConfiguration": {"bucketPolicyOnly": access, "uniformBucketLevelAccess": access,
                                 "publicAccessPrevention": iam.get("publicAccessPrevention", "inherited")},
            "rpo": body.get("rpo", "DEFAULT"), "etag": _etag(1)}
        self.state.owners[bucket] = project
        self.state.policies[bucket] = {"version": 1, "bindings": [
            {"role": "roles/storage.legacyBucketOwner", "members": [f"projectEditor:{project}",
                                                                     f"projectOwner:{project}"]},
            {"role": "roles/storage.legacyBucketReader", "members": [f"projectViewer:{project}"]}]}
        return self.state.buckets[bucket]

    # ------------------------------------------------------------------ IAM
    def _policy(self, bucket: str) -> dict:
        policy = self.state.policies[bucket]
        return {"kind": "storage#policy", "resourceId": f"projects/_/buckets/{bucket}", "version": policy["version"],
                "etag": self._bucket(bucket)["etag"], "bindings": copy.deepcopy(policy["bindings"])}

    def _getIamPolicy(self, bucket: str, query: dict, body: dict) -> dict:
        self._bucket(bucket)
        requested = query.get("optionsRequestedPolicyVersion", "1")
        if requested not in ("1", "2", "3"):
            raise HttpError(400, f"Invalid argument: optionsRequestedPolicyVersion '{requested}'.")
        if self.state.policies[bucket]["version"] > int(requested):
            raise HttpError(400, "The policy has conditional role bindings: request it with "
                                 "optionsRequestedPolicyVersion=3.")
        return self._policy(bucket)

    def _setIamPolicy(self, bucket: str, query: dict, body: dict) -> dict:
        resource = self._bucket(bucket)
        unknown = sorted(set(body) - POLICY_FIELDS)
        if unknown:
            raise HttpError(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        if "etag" in body and body["etag"] != resource["etag"]:
            raise HttpError(412, "At least one of the pre-conditions you specified did not hold.", "conditionNotMet")
        bindings = body.get("bindings") or []
        if not isinstance(bindings, list) or not all(isinstance(b, dict) for b in bindings):
            raise HttpError(400, "Invalid JSON payload received. Invalid value at 'bindings'.")
        conditional = any(b.get("condition") for b in bindings)
        if conditional and body.get("version") != 3:
            raise HttpError(400, "Conditional role bindings need a policy of version 3.")
        for binding in bindings:
            role, members = binding.get("role", ""), binding.get("members")
            if not isinstance(role, str) or not ROLE.fullmatch(role):
                raise HttpError(400, f"Role ({role}) does not exist in the resource's hierarchy.")
            if not isinstance(members, list) or not members:
                raise HttpError(400, f"Invalid argument: the binding of role {role} has no members.")
            for member in members:
                pool = POOL_MEMBER.fullmatch(str(member))
                if not MEMBER.fullmatch(str(member)) or (pool and not pool["project"].isdigit()):
                    raise HttpError(400, f"Invalid argument: invalid member '{member}' in the binding of role {role}"
                                    + (": the project must be given by its number." if pool else "."))
        metageneration = int(resource["metageneration"]) + 1
        resource.update(metageneration=str(metageneration), etag=_etag(metageneration), updated=_now())
        self.state.policies[bucket] = {"version": 3 if conditional else 1, "bindings": [
            {k: copy.deepcopy(v) for k, v in b.items() if k in ("role", "members", "condition")} for b in bindings]}
        return self._policy(bucket)
