"""A Ray dashboard's Jobs API without Ray, for the fast tier: the RayCluster the emulated KubeRay makes ready
without Ray (``KubeEmulator.ready_without_ray``) answers through the API server's service proxy with this, so that
the stages' job client runs — submit, status, logs, stop — against the wire it meets on GKE, in seconds.

The REST surface is Ray's (https://docs.ray.io/en/latest/cluster/running-applications/job-submission/rest.html):
``GET /api/version``, ``GET /api/jobs/`` (every job's ``JobDetails``, a list), ``POST /api/jobs/``
(``{"submission_id", "job_id"}``), ``GET /api/jobs/{id}`` (the
``JobDetails`` of ray/dashboard/modules/job/pydantic_models.py; 404 for an unknown job), ``GET
/api/jobs/{id}/logs`` (``{"logs"}``) and ``POST /api/jobs/{id}/stop`` (``{"stopped"}``); with Ray token
authentication on, a request without the cluster's token in ``X-Ray-Authorization`` (the header Ray reads behind a
proxy that consumes ``Authorization``: ray/_private/authentication/authentication_constants.py) is refused with 401.

No entrypoint runs: a job is RUNNING for ``duration_s`` seconds of ``clock`` (``time.time``, which a test moves
with time-machine) from its submission, then SUCCEEDED with ``log`` as its whole log (a test gives the ``TPUPIPE``
records the stage expects, with the job's nonce when ``log`` is a function of its environment); stopped, it is
STOPPED at once. ``lost_answers``: submissions that are taken but answered 502, as when the answer is lost between
the dashboard and the client (the client, retrying, meets its own job).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable

from tests.emulators.http import HttpEmulator

RAY_VERSION = "2.60.0"


class RayJobsEmulator(HttpEmulator):
    def __init__(self, duration_s: float = 0.0, log: str = "", clock: Callable[[], float] = time.time):
        super().__init__()
        self.duration_s, self.log, self.clock = duration_s, log, clock
        self.token = ""  # the Ray token the cluster was started with ('' : no token authentication)
        self.jobs: dict[str, dict] = {}
        self.lost_answers = 0  # submissions taken whose answer is lost (a 502 from the proxy in between), this many
        self.calls: list[str] = []  # "METHOD path" of every request
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def _details(self, job: dict) -> dict:
        now = self.clock()
        if job["status"] == "RUNNING" and now - job["start"] >= self.duration_s:
            job.update(status="SUCCEEDED", message="Job finished successfully.", end=now)
        return {
            "type": "SUBMISSION",
            "job_id": job["job_id"],
            "submission_id": job["submission_id"],
            "status": job["status"],
            "entrypoint": job["entrypoint"],
            "message": job["message"],
            "start_time": int(job["start"] * 1000),
            "end_time": int(job["end"] * 1000) if job["end"] else None,
            "metadata": job["metadata"],
            "runtime_env": job["runtime_env"],
        }

    def _log(self, job: dict) -> str:
        """The job's whole log: ``log`` as given, or ``log(env_vars)`` of the job's runtime environment (what a job's
        process reads from its environment, the record nonce among it: ``components.spec.protocol``)."""
        return self.log(job["runtime_env"].get("env_vars", {})) if callable(self.log) else self.log

    def _serve(self, http, body: bytes) -> tuple:
        path = urllib.parse.urlsplit(http.path).path.rstrip("/")
        with self._lock:
            self.calls.append(f"{http.command} {path}")
            if self.token and http.headers.get("X-Ray-Authorization") != f"Bearer {self.token}":
                return 401, {"error": "Unauthorized: missing or invalid authentication token"}
            if path == "/api/version":
                return 200, {"version": "4", "ray_version": RAY_VERSION, "ray_commit": "emulated"}
            if http.command == "GET" and path == "/api/jobs":
                return 200, [self._details(job) for job in self.jobs.values()]
            if http.command == "POST" and path == "/api/jobs":
                request = json.loads(body or b"{}")
                sid = request.get("submission_id") or f"raysubmit_{len(self.jobs)}"
                if sid in self.jobs:
                    return 400, {"error": f"Job with submission_id {sid} already exists."}
                self.jobs[sid] = {
                    "job_id": f"{len(self.jobs) + 1:02d}000000",
                    "submission_id": sid,
                    "status": "RUNNING",
                    "entrypoint": request.get("entrypoint", ""),
                    "message": "Job is currently running.",
                    "start": self.clock(),
                    "end": None,
                    "metadata": request.get("metadata") or {},
                    "runtime_env": request.get("runtime_env") or {},
                }
                if self.lost_answers > 0:
                    self.lost_answers -= 1
                    return 502, {"error": "Bad Gateway: the answer was lost on its way back"}
                return 200, {"job_id": self.jobs[sid]["job_id"], "submission_id": sid}
            parts = path.removeprefix("/api/jobs/").split("/")
            job = self.jobs.get(parts[0]) if path.startswith("/api/jobs/") else None
            if job is None:
                return 404, {"error": f"Job {parts[0]} does not exist"}
            details = self._details(job)
            if http.command == "GET" and len(parts) == 1:
                return 200, details
            if http.command == "GET" and parts[1:] == ["logs"]:
                done = details["status"] == "SUCCEEDED"
                return 200, {"logs": self._log(job) if done else ""}
            if http.command == "POST" and parts[1:] == ["stop"]:
                stopped = job["status"] == "RUNNING"
                if stopped:
                    job.update(status="STOPPED", message="Job was intentionally stopped.", end=self.clock())
                return 200, {"stopped": stopped}
            return 404, {"error": f"no route {http.command} {path}"}
