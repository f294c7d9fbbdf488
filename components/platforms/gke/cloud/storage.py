"""The checkpoint bucket and the run's access to it, through google-cloud-storage
(docs/architecture.md, "Cloud calls through the client libraries").

- the bucket (``gke.bucket``, default ``<project>-tpupipe``) is got or created (uniform bucket-level access, in the
  cluster's region) and kept after the run: it holds every run's checkpoints;
- the run's Kubernetes ServiceAccount gets ``roles/storage.objectUser`` on it through Workload Identity Federation
  (a ``principal://`` member naming the project *number*, looked up through Resource Manager); teardown removes
  that binding;
- the project's IAM policy is read (Resource Manager) to check what the nodes', Cloud Build's and the pipeline's
  service accounts are granted;
- IAM policy changes are read-modify-write with the policy's etag, retried when another writer got in between
  (HTTP 412).

Emulators are found the way the client libraries find them: ``STORAGE_EMULATOR_HOST`` (google-cloud-storage's own)
and ``TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST`` (host:port, plaintext gRPC). Cloud SDKs are imported inside functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.cloud.credentials import STORAGE_EMULATOR_HOST_ENV, google_client
from components.platforms.gke.cloud.cluster import Adapter
from components.spec import SpecError

RESOURCE_MANAGER_EMULATOR_HOST_ENV = "TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST"
IAM_POLICY_VERSION = 3


def projects_client(creds=None):
    """Resource Manager's ``ProjectsClient``: to the emulator named by $TPUPIPE_RESOURCE_MANAGER_EMULATOR_HOST, else to
    Google."""
    from google.cloud import resourcemanager_v3

    return google_client(resourcemanager_v3.ProjectsClient, RESOURCE_MANAGER_EMULATOR_HOST_ENV, creds=creds)


IAM_EMULATOR_HOST_ENV = "TPUPIPE_IAM_EMULATOR_HOST"


def may_act_as(account: str, creds=None) -> bool:
    """Whether the caller holds ``iam.serviceAccounts.actAs`` on the service account ``account`` itself (the IAM
    API's ``projects.serviceAccounts.testIamPermissions``, which needs no permission of its own:
    https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/testIamPermissions): a grant of
    roles/iam.serviceAccountUser on the account, which the project's testIamPermissions does not see."""
    from google.cloud import iam_admin_v1

    client = google_client(iam_admin_v1.IAMClient, IAM_EMULATOR_HOST_ENV, creds=creds)
    permission = "iam.serviceAccounts.actAs"
    answer = client.test_iam_permissions(
        request={"resource": f"projects/-/serviceAccounts/{account}", "permissions": [permission]}
    )
    return permission in answer.permissions


def account_members(account: str, role: str, creds=None) -> set[str]:
    """The members the service account ``account``'s own IAM policy grants ``role`` on it (the IAM API's
    ``projects.serviceAccounts.getIamPolicy``, https://cloud.google.com/iam/docs/reference/rest/v1/
    projects.serviceAccounts/getIamPolicy): who may act as it, or use it by Workload Identity."""
    from google.cloud import iam_admin_v1

    client = google_client(iam_admin_v1.IAMClient, IAM_EMULATOR_HOST_ENV, creds=creds)
    policy = client.get_iam_policy(request={"resource": f"projects/-/serviceAccounts/{account}"})
    return {who for binding in policy.bindings if binding.role == role for who in binding.members}


def project_number(project: str, creds=None) -> str:
    """The project's number (Workload Identity principals name it, not the id)."""
    return projects_client(creds).get_project(name=f"projects/{project}").name.removeprefix("projects/")


def project_grants(project: str, creds=None) -> dict[str, set[str]]:
    """Every member of the project's IAM policy and the roles it grants that member on the project itself (one
    ``getIamPolicy``)."""
    return policy_grants(projects_client(creds).get_iam_policy(request={"resource": f"projects/{project}"}))


def policy_grants(policy) -> dict[str, set[str]]:
    """An IAM policy's members and the roles it grants each."""
    grants: dict[str, set[str]] = {}
    for binding in policy.bindings:
        for who in binding.members:
            grants.setdefault(who, set()).add(binding.role)
    return grants


def project_roles(project: str, member: str, creds=None) -> set[str]:
    """The roles the project's IAM policy grants ``member`` (``serviceAccount:EMAIL``) on the project itself."""
    return project_grants(project, creds).get(member, set())


def storage_client(project: str, creds=None):
    """A Cloud Storage ``Client``: to the emulator named by $STORAGE_EMULATOR_HOST (google-cloud-storage's own), else
    to Google."""
    from google.cloud import storage

    return google_client(storage.Client, STORAGE_EMULATOR_HOST_ENV, creds=creds, project=project)


def member(binding: dict[str, Any], number: str) -> str:
    """The binding's member with the project number filled in (the plan shows PROJECT_NUMBER)."""
    return binding["member"].replace("PROJECT_NUMBER", number)


def unreadable(name: str, why: str) -> SpecError:
    return SpecError(
        "gke.bucket",
        f"the bucket {name} exists but this identity cannot read it (another project's bucket, or no "
        f"storage.buckets.get): {why}",
        ["a bucket of this project", "a globally unique new name"],
    )


def without_uniform_access(bucket) -> SpecError | None:
    """The refusal of an existing bucket without uniform bucket-level access: the run's bindings on it are conditioned
    on its prefix, and "you must enable uniform bucket-level access on a bucket" to use IAM Conditions there
    (https://cloud.google.com/storage/docs/access-control/iam#conditions)."""
    if bucket.iam_configuration.uniform_bucket_level_access_enabled:
        return None
    return SpecError(
        "gke.bucket",
        f"the bucket {bucket.name} has no uniform bucket-level access: the run grants its pods access to the run's "
        'prefix only, with an IAM condition, which such a bucket refuses: turn it on (Cloud Storage, "Use uniform '
        'bucket-level access") or name another bucket',
        ["a bucket with uniform bucket-level access", "a new name (created with it)"],
    )


class Storage(Adapter):
    def ensure_bucket(self, name: str, location: str):
        """The bucket: reused if the project can read it (with uniform bucket-level access), else created in
        ``location``."""
        from google.api_core import exceptions as gexc

        try:
            bucket = self.call(f"get bucket {name}", lambda: self.client.get_bucket(name))
            refusal = without_uniform_access(bucket)
            if refusal:
                raise refusal
            self.log(f"bucket gs://{name} exists ({bucket.location}): using it")
            return bucket
        except gexc.NotFound:
            pass
        except gexc.Forbidden as exc:
            raise unreadable(name, exc.message) from None
        bucket = self.client.bucket(name)
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        try:
            bucket = self.call(f"create bucket {name}", lambda: self.client.create_bucket(bucket, location=location))
        except gexc.Conflict as exc:  # created since the get, or another project's name
            try:
                return self.call(f"get bucket {name}", lambda: self.client.get_bucket(name))
            except (gexc.NotFound, gexc.Forbidden):
                raise SpecError(
                    "gke.bucket",
                    f"the bucket name {name} is taken by another project: {exc.message}",
                    ["a bucket of this project", "a globally unique new name"],
                ) from None
        self.log(f"created bucket gs://{name} in {location} (kept after the run)")
        return bucket

    def upload(self, name: str, path: str, data: bytes, content_type: str = "application/octet-stream") -> int:
        """Write ``data`` to ``gs://name/path``; the object's generation (what a build pins its source to)."""
        blob = self.client.bucket(name).blob(path)
        self.call(f"upload gs://{name}/{path}", lambda: blob.upload_from_string(data, content_type=content_type))
        self.log(f"uploaded gs://{name}/{path} ({len(data) / 1024:.0f} KiB)")
        return int(blob.generation)

    def copy_prefix(self, name: str, source: str, destination: str) -> tuple[int, int, int]:
        """Copy every object under ``source/`` to the same name under ``destination/`` in the bucket, server-side
        (objects.rewrite, repeated until done: https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite);
        an object already there with the same size and MD5 is kept (a retried copy resumes). (objects copied,
        objects in all, bytes copied); (0, 0, 0) when ``source/`` holds nothing."""
        bucket = self.client.bucket(name)

        def listed(prefix: str) -> list:
            under = f"{prefix}/"
            return self.call(f"list gs://{name}/{under}", lambda: list(self.client.list_blobs(name, prefix=under)))

        found, have = listed(source), {b.name: (b.size, b.md5_hash) for b in listed(destination)}
        copied = size = 0
        for blob in found:
            target = f"{destination}/{blob.name.removeprefix(f'{source}/')}"
            if have.get(target) == (blob.size, blob.md5_hash):
                continue
            token = None
            while True:
                token, _, _ = self.call(
                    f"copy gs://{name}/{blob.name}", lambda t=token, b=blob, n=target: bucket.blob(n).rewrite(b, t)
                )
                if token is None:
                    break
            copied, size = copied + 1, size + (blob.size or 0)
        return copied, len(found), size

    def _update_policy(self, name: str, change: Callable[[Any], bool]) -> bool:
        """Read the bucket's IAM policy, ``change`` it in place, write it back with its etag; again when another
        writer got in between. False when ``change`` had nothing to do."""
        from google.api_core import exceptions as gexc

        bucket = self.client.bucket(name)
        for attempt in range(1, self.retry.attempts + 1):
            policy = self.call(
                f"get IAM policy of {name}", lambda: bucket.get_iam_policy(requested_policy_version=IAM_POLICY_VERSION)
            )
            if not change(policy):
                return False
            try:
                self.call(f"set IAM policy of {name}", lambda p=policy: bucket.set_iam_policy(p))
                return True
            except gexc.PreconditionFailed:
                if attempt == self.retry.attempts:
                    raise
                self.log(f"  IAM policy of gs://{name} changed meanwhile: reading it again")
        raise AssertionError("unreachable")

    def add_binding(self, name: str, role: str, who: str, condition: dict[str, str] | None = None) -> bool:
        """Grant ``who`` ``role`` on the bucket, under ``condition`` (an IAM condition: title, description,
        expression) when given; a policy with a conditional binding is written at version 3
        (https://cloud.google.com/iam/docs/policies#versions)."""

        def add(policy) -> bool:
            for binding in policy.bindings:
                if binding["role"] == role and binding.get("condition") == condition:
                    if who in binding["members"]:
                        return False
                    binding["members"] = set(binding["members"]) | {who}
                    return True
            policy.bindings.append({"role": role, "members": {who}, **({"condition": condition} if condition else {})})
            policy.version = IAM_POLICY_VERSION
            return True

        added = self._update_policy(name, add)
        self.log(f"{role} on gs://{name} for {who}: " + ("granted" if added else "already granted"))
        return added

    def remove_binding(self, name: str, role: str, who: str) -> bool:
        """Remove ``who`` from ``role`` on the bucket; False when it was not there (or the bucket is gone)."""
        from google.api_core import exceptions as gexc

        def remove(policy) -> bool:
            changed = False
            for binding in policy.bindings:
                if binding["role"] == role and who in binding["members"]:
                    binding["members"] = set(binding["members"]) - {who}
                    changed = True
            policy.bindings[:] = [b for b in policy.bindings if b["members"]]
            return changed

        try:
            return self._update_policy(name, remove)
        except gexc.NotFound:
            return False


__all__ = [
    "Storage",
    "member",
    "project_grants",
    "project_number",
    "project_roles",
    "projects_client",
    "storage_client",
]
