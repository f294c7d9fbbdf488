"""What a stage's task knows of Vertex AI Pipelines when it runs there: the variable Vertex AI gives every task, the
refusal of a run that cannot work there, and what a SIGTERM means there (:func:`sigterm_stops`: a Stop of the run,
or a pod ended under a job that goes on). The run id's claim, on every backend: ``components.stages.claims``."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from components.platforms import VERTEX_TASK_ENV
from components.spec import SpecError

# The states of a pipeline job being stopped: "Vertex AI Pipelines sets the pipeline run state to CANCELLING" on a
# cancel, then CANCELLED (https://cloud.google.com/vertex-ai/docs/pipelines/cancel-pipeline-runs;
# google.cloud.aiplatform_v1.types.PipelineState).
STOPPING = ("PIPELINE_STATE_CANCELLING", "PIPELINE_STATE_CANCELLED")
# How long a SIGTERM'd task waits for its job's state: the pod's grace period is 30 s unless set
# (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination), and stopping comes after.
STATE_TIMEOUT_S = 5.0


def job_id(job_name: str) -> str:
    """The pipeline job's id: the last part of its resource name (``projects/P/locations/L/pipelineJobs/ID``, what
    the pipeline gives every task as ``job_name`` on Vertex AI), or the name itself (a local run's job name)."""
    return job_name.rsplit("/pipelineJobs/", 1)[-1]


def job_resource(job_name: str) -> str:
    """The pipeline job's full resource name when ``job_name`` is one, else ''."""
    return job_name if "/pipelineJobs/" in job_name else ""


class _Job:
    """This task's pipeline job (set by the runner before a stage runs) and its state once a SIGTERM read it."""

    resource: str = ""
    state: str | None = None
    problem: str = ""


_job = _Job()


def watch(job_name: str, environ: Mapping[str, str] | None = None) -> None:
    """This task's pipeline job: what :func:`sigterm_stops` asks Vertex AI about (on Vertex AI alone)."""
    on_vertex = VERTEX_TASK_ENV in (os.environ if environ is None else environ)
    _job.resource, _job.state, _job.problem = (job_resource(job_name) if on_vertex else ""), None, ""


def watched() -> str:
    """The full resource name of this task's pipeline job on Vertex AI; '' elsewhere."""
    return _job.resource


def sigterm_stops(log: Callable[[str], None] = print) -> bool:
    """Whether a SIGTERM is a stop of the run. Outside Vertex AI (a terminal's ``kill``, ``tpupipe run``, kfp.local)
    it always is. On Vertex AI a task gets SIGTERM when its run is cancelled, and also when its pod is ended under a
    job that goes on (evicted, its node drained for maintenance: a pod gets SIGTERM, then SIGKILL after its grace
    period, https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination), which its retry
    policy then runs again. So the job's state decides: a job CANCELLING or CANCELLED is a stop; any other state is
    not, and what the stage started (a Ray job training for hours) is left running for the retry to re-attach to. A
    state that cannot be read is not taken for a stop either: a retry still finds the training, and a run that was
    in fact stopped is collected by the janitor once its job ended (``components.platforms.gke.run.janitor``)."""
    if not _job.resource:
        return True
    if _job.state is None:
        from components.cloud.credentials import pipeline_job_state

        _job.state, _job.problem = pipeline_job_state(_job.resource, timeout_s=STATE_TIMEOUT_S)
    shown = (_job.state or "unknown").removeprefix("PIPELINE_STATE_")
    stops = _job.state in STOPPING
    why = f": {_job.problem}" if _job.problem else ""
    log(
        f"SIGTERM: pipeline job {job_id(_job.resource)} is {shown}{why}: "
        + ("the run is being stopped" if stops else "not a stop of the run; what runs is left for the task's retry")
    )
    return stops


def cancelling() -> bool:
    """Whether a SIGTERM this task took came with its pipeline job being cancelled (read by :func:`sigterm_stops`)."""
    return bool(_job.resource) and _job.state in STOPPING


# Set in the user container of every task pod Kubeflow Pipelines' Argo compiler makes (its ``commonEnvs``:
# https://github.com/kubeflow/pipelines/blob/2.4.0/backend/src/v2/compiler/argocompiler/container.go), not by
# kfp.local, which runs a task as a process on this machine.
KFP_POD_ENV = "KFP_POD_NAME"


def check_on_vertex(
    platform: str, output_root: str, environ: Mapping[str, str] | None = None, job_name: str = ""
) -> None:
    """On Vertex AI every task runs on a machine of its own: a run there is a gke run whose state is in Cloud
    Storage, else each task would keep the run's state (and a local cluster) on its own disk, lost when it ends.
    On Kubeflow Pipelines (``KFP_POD_NAME`` set, no ``tpupipe run`` driver) every task is a pod of its own: its
    state is in Cloud Storage too, else it is lost and the run id's claim (made in the state,
    ``components.stages.claims``) holds nothing. Refused (a SpecError naming the parameter) by every task, before
    anything is created."""
    from components.platforms import interrupts

    env = os.environ if environ is None else environ
    on_vertex = VERTEX_TASK_ENV in env
    if not on_vertex and not (KFP_POD_ENV in env and interrupts.DRIVER_ENV not in env):
        return
    where = (
        "on Vertex AI every task runs on a machine of its own"
        if on_vertex
        else f"on Kubeflow Pipelines every task of {job_name} runs in a pod of its own"
    )
    if on_vertex and platform != "gke":
        raise SpecError(
            "platform", f"{platform!r} is not a run for Vertex AI: {where}; a run there is a gke run", ["gke"]
        )
    if not output_root.startswith("gs://"):
        raise SpecError(
            "output_root",
            f"{output_root!r} is not a gs:// path: {where}, so a run's state lives in Cloud Storage",
            ["gs://BUCKET/state"],
        )
