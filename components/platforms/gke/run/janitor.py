"""The janitor: what gke runs left behind when nothing tore them down (a lost Vertex worker, a SIGKILLed driver),
found and deleted through the same teardown every run uses.

A run is found two ways:
- by its ledger in the output root (``gs://BUCKET/state/<run id>/ledger.json``, or a local directory), which every
  provision writes before it creates anything: the run's spec, start time and what it created;
- by the ``tpupipe-run`` label on clusters, and on node pools in clusters a run did not create, in the projects of
  those ledgers and the ones named: a labelled cluster whose run left no ledger under the output root is reported
  and kept (its ledger may be under another output root: a workstation run's is in its ``./runs``), and adopted
  only with ``adopt`` (``tpupipe janitor --adopt``: a ledger is written for it, with a stand-in spec whose derived
  names cover the DCN networks and subnets of a multislice run) once its cluster is older than the limit.

A run that ran on Vertex AI Pipelines has its pipeline job in its ledger (``pipeline_job``, written by its first
task, with the job's full resource name): the janitor asks Vertex AI for that job's state where the job is, whatever
project or region it ran in (a ledger with the bare id alone, from before the name was recorded: in the run's project
and the janitor's region). A job that ended (cancelled from the UI, by a schedule's owner, failed, succeeded) whose run
still has resources is collected at once, whatever its age: a cancelled job's exit handler never ran its teardown
("cancels all the remaining tasks in the pipeline", https://cloud.google.com/vertex-ai/docs/pipelines/cancel-pipeline-runs).
A run whose job is still pending or running is left alone, whatever its age; so is a run whose driver's heartbeat
is fresh (``components.platforms.heartbeat``: a stage of it is working now), even past ``older_than_s``. The run's
own pods can write its ledger, so a ledger that names another run, or a project outside the ones the sweep was given,
is reported and kept, never obeyed.

Any other run is collected when it is finished (its summary written, yet something of it remains) or older than its
limit: ``older_than_s`` when given (a person's say, over every run's own), else the run's own (:func:`limit_s`: its
``run.deadline_h`` and a grace, or the longest its stages may wait); so is a
Vertex AI run whose job's state cannot be read (not found in the region, no permission). A run already torn down is
skipped. Each collected run goes through ``GkePlatform.teardown`` (newest first, not found is success),
so a second sweep finds nothing; a dry run lists everything and deletes nothing.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from components.cloud.credentials import pipeline_job_state
from components.platforms import RunContext, heartbeat
from components.platforms import ledger as ledgers
from components.platforms.gke.plan import paths
from components.platforms.store import open_store, runs_with
from components.spec import RunSpec, SpecError, names, ready_limits

if TYPE_CHECKING:
    from components.platforms.gke.run.platform import GkePlatform

# The stand-in preset of a run found by its label alone: a multislice run with DCN networks, so teardown's names
# derived from the run id cover its networks and subnets too.
ADOPT_PRESET = "llama3-8b-v6e-16x2"
# A run found without a ledger has no spec to derive its limit from.
DEFAULT_LIMIT_S = 6 * 3600.0
# Provisioning and the image build, beyond the deadlines the spec gives the stages that wait.
PROVISION_AND_BUILD_S = 3600.0
# A run past its run.deadline_h stops its stage and tears down: the time that may take (a stage's stop, then the
# deletion of its node pools or cluster) before a run still there is taken for one that lost its driver.
STOP_GRACE_S = 1800.0
# PipelineJob.state values of a job that ended (google.cloud.aiplatform_v1.types.PipelineState).
JOB_ENDED = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")
AGE = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<unit>[smhd]?)")
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float:
    """``6h``, ``90m``, ``2d``, ``45s`` or seconds: SpecError naming ``--older-than`` otherwise."""
    m = AGE.fullmatch(text.strip())
    if not m:
        raise SpecError("--older-than", f"{text!r} is not an age", ["6h", "90m", "2d", "0"])
    return float(m["number"]) * UNITS[m["unit"]]


def limit_s(spec: RunSpec) -> float:
    """How long the run may take at most. With ``run.deadline_h``, what the run was allowed: its deadline, past which
    its stages stop it themselves (``components.workload.budget``), and its teardown's time (``STOP_GRACE_S``), longer
    or shorter than its stages' sum alike (a run allowed 48 h is not swept at 24 h; one allowed 2 h is swept after
    2 h and the grace); a run queued in Kueue waits in its queue within that deadline too. Without one, the longest
    its stages may wait: provisioning and the build, a Kueue queue's wait (gke.queue: ``deploy.QUEUE_WAIT_DEFAULT_H``;
    past it the run is withdrawn from the queue, its RayCluster and Workload deleted by teardown), the cluster's
    start, the slice check, the compile job, the train and evaluate jobs (each bounded by its deadline)."""
    from components.platforms.gke.run.deploy import QUEUE_WAIT_DEFAULT_H
    from components.workload.cache_trust import compile_timeout_s

    if spec.run.deadline_h is not None:
        return spec.run.deadline_h * 3600 + STOP_GRACE_S
    c = spec.cluster
    queued = QUEUE_WAIT_DEFAULT_H * 3600 if spec.gke.queue else 0.0
    return (
        PROVISION_AND_BUILD_S
        + queued
        + ready_limits(spec).deadline_s
        + (3 * c.slice_check_timeout_s if c.slice_check else 0)
        + 2 * spec.train.timeout_s
        + compile_timeout_s(spec)  # the compile job before the training job (components.stages.compile_cache)
    )


@dataclass
class Found:
    run_id: str
    reason: str  # why it is collected ("finished", "started 7.1 h ago, its limit is 3.2 h", ...)
    has: list[str]  # what of it is there, as its ledger (or the labels) say
    ctx: RunContext
    adopt: dict[str, Any] | None = None  # the ledger written for a run found by its label alone


@dataclass
class Sweep:
    collected: list[Found] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # runs found and left, with why
    deleted: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class Janitor:
    def __init__(
        self,
        output_root: str,
        projects: tuple[str, ...] = (),
        older_than_s: float | None = None,
        log: Callable[[str], None] = print,
        now: Callable[[], float] = time.time,
        platform: GkePlatform | None = None,
        region: str = "",
        adopt: bool = False,
        kfp: tuple[str, str] = ("", ""),
    ) -> None:
        from components.platforms.gke.run.platform import GkePlatform

        self.output_root, self.projects, self.older_than_s = output_root, projects, older_than_s
        self.adopt = adopt  # collect labelled clusters whose run left no ledger under the output root
        self.log, self.now, self.region = log, now, region  # region: Vertex AI's, where the runs' jobs are
        self.platform = platform or GkePlatform(log=log)
        self.kfp = kfp  # a Kubeflow Pipelines API server and namespace whose runs' states are asked, when given
        self._kfp_states: dict[str, tuple[str, str]] | None = None
        self._kfp_problem = ""

    # ---------------------------------------------------------------- finding
    def find(self) -> Sweep:
        sweep = Sweep()
        projects, known = set(self.projects), set()
        for run_id in runs_with(self.output_root, ledgers.KEY):
            store = open_store(self.output_root, run_id)
            ledger = ledgers.load(store) or {}
            if ledger.get("platform") != "gke":
                continue
            known.add(run_id)
            spec = RunSpec.from_json(json.dumps(ledger["spec"])) if ledger.get("spec") else None
            if spec is None or ledger.get("torn_down"):
                continue
            doubt = self._doubt(run_id, ledger, spec)
            if doubt:  # the run's own pods can write its ledger: one that names another run or project is not obeyed
                sweep.kept.append(f"{run_id}: kept: {doubt}; left to a person")
                continue
            projects.add(spec.gke.project)
            ctx = RunContext(spec=spec, run_id=run_id, store=store, platform="gke")
            has = self.platform.remaining(ctx)
            if not has:
                continue
            reason, unknown = self._job_reason(ledger.get("pipeline_job"), spec.gke.project)
            if not reason and not unknown and self.kfp[0]:
                reason, unknown = self._kfp_reason(run_id)
            beat = heartbeat.fresh(store, self.now()) if not reason else None
            if beat is not None:
                reason = f"kept: its driver's heartbeat is {beat:.0f} s old (a stage of it is working)"
            if not reason:
                reason = self._reason(store.exists("summary.json"), ledger.get("started"), limit_s(spec)) + unknown
            if reason.startswith("kept"):
                sweep.kept.append(f"{run_id}: {reason}")
            else:
                sweep.collected.append(Found(run_id, reason, has, ctx))
        for project in sorted(p for p in projects if p):
            self._find_labelled(project, known, sweep)
        return sweep

    def _doubt(self, run_id: str, ledger: dict[str, Any], spec: RunSpec) -> str:
        """Why a ledger is not to be acted on: it names another run than the one it is filed under, or a project
        outside the ones this janitor was given (it runs as the pipeline's service account, which may reach more)."""
        if ledger.get("run_id", run_id) != run_id:
            return f"its ledger names run {ledger['run_id']!r}, not the run it is filed under"
        if self.projects and spec.gke.project not in self.projects:
            given = ", ".join(self.projects)
            return f"its ledger names project {spec.gke.project!r}, not one of this sweep's ({given})"
        return ""

    def _job_reason(self, job: dict[str, Any] | None, project: str) -> tuple[str, str]:
        """Why a Vertex AI run is collected or kept, from its pipeline job's state; else '' and, when the state
        could not be read, why (said beside the age limit's reason)."""
        if not job or not (job.get("name") or self.region):
            return "", ""
        # The job's full resource name, as its first task recorded it, finds it in its own project and region; a
        # ledger written before the name was recorded has the bare id: the job is looked for in the janitor's region.
        name = job.get("name") or f"projects/{project}/locations/{self.region}/pipelineJobs/{job['id']}"
        state, problem = pipeline_job_state(name)
        if state is None:
            return "", f" (the state of its pipeline job {name} is unknown: {problem})"
        shown = state.removeprefix("PIPELINE_STATE_").lower()
        if state in JOB_ENDED:
            return f"its pipeline job {job['id']} is {shown}", ""
        return f"kept: its pipeline job {job['id']} is {shown}", ""

    def _kfp_reason(self, run_id: str) -> tuple[str, str]:
        """Why a run on Kubeflow Pipelines is collected (its KFP run has ended: a terminated run's exit handler never
        runs its teardown on KFP's Argo backend, kubeflow/pipelines#6101) or kept (it runs); '' and why not known
        when the server cannot say."""
        from components.cloud import kfp as kfp_runs

        if self._kfp_states is None:
            try:
                self._kfp_states = kfp_runs.run_states(kfp_runs.in_cluster_client(*self.kfp), self.kfp[1])
            except Exception as exc:  # noqa: BLE001 - the age limit decides; the report says why
                self._kfp_states = {}
                self._kfp_problem = f" (the runs on Kubeflow Pipelines at {self.kfp[0]} are unknown: {exc})"
        if run_id not in self._kfp_states:
            return "", self._kfp_problem
        kfp_run, state = self._kfp_states[run_id]
        if state in kfp_runs.ENDED:
            return f"its Kubeflow Pipelines run {kfp_run} is {state.lower()}", ""
        return f"kept: its Kubeflow Pipelines run {kfp_run} is {state.lower()}", ""

    def _reason(self, finished: bool, started: float | None, own_limit: float) -> str:
        limit = self.older_than_s if self.older_than_s is not None else own_limit
        if finished:
            return "finished"
        if started is None:
            return "kept: its ledger has no start time"
        age = self.now() - started
        if age >= limit:
            return f"started {age / 3600:.1f} h ago, older than {limit / 3600:.1f} h"
        return f"kept: running for {age / 3600:.1f} h, within {limit / 3600:.1f} h"

    def _find_labelled(self, project: str, known: set[str], sweep: Sweep) -> None:
        """Clusters and node pools labelled with a run that has no ledger under the output root."""
        orphans: dict[str, list[tuple[str, str, str]]] = {}
        for run_id, kind, path, created in self.platform.clients.gke().labelled(project, names.RUN_LABEL):
            if run_id not in known:
                orphans.setdefault(run_id, []).append((kind, path, created))
        for run_id, found in sorted(orphans.items()):
            kind, path, created = found[0]
            cluster = paths.node_pool_cluster(path)
            if kind == "node_pool":
                sweep.kept.append(
                    f"{run_id}: kept: node pools {', '.join(p.rsplit('/', 1)[-1] for _, p, _ in found)}"
                    f" carry its label but it left no ledger and a node pool has no creation time; "
                    f"`tpupipe teardown {run_id} --platform gke --preset PRESET --set "
                    f"gke.project={project} gke.cluster_name={cluster.rsplit('/', 1)[-1]}` removes them"
                )
                continue
            if not self.adopt:
                sweep.kept.append(
                    f"{run_id}: kept: cluster {path.rsplit('/', 1)[-1]} carries its label but its run left no ledger "
                    f"under {self.output_root} (it may be under another output root, a workstation's ./runs); "
                    f"`tpupipe janitor --adopt` collects it"
                )
                continue
            age = self.now() - datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() if created else None
            limit = self.older_than_s if self.older_than_s is not None else DEFAULT_LIMIT_S
            if age is None or age < limit:
                sweep.kept.append(
                    f"{run_id}: kept: cluster {path.rsplit('/', 1)[-1]} carries its label, no ledger; "
                    f"created {'at an unknown time' if age is None else f'{age / 3600:.1f} h ago'}"
                )
                continue
            sweep.collected.append(self._adopt(project, run_id, path, age))

    def _adopt(self, project: str, run_id: str, cluster: str, age: float) -> Found:
        from components.workload import resolve

        location = paths.cluster_location(cluster)
        regional = location.count("-") == 1
        spec = resolve(
            ADOPT_PRESET,
            f"gke.project={project} gke.zone={location + '-a' if regional else location}"
            + (" gke.cluster_mode=autopilot" if regional else ""),
        )
        store = open_store(self.output_root, run_id)
        parent = paths.cluster_parent(cluster)
        ledger = {
            "run_id": run_id,
            "platform": "gke",
            "parent": parent,
            "cluster": cluster,
            "owns_cluster": True,
            "created": [{"kind": "cluster", "name": cluster}],
            "adopted_by": "janitor",
            "spec": spec.to_dict(),
        }
        ctx = RunContext(spec=spec, run_id=run_id, store=store, platform="gke")
        return Found(
            run_id,
            f"no ledger; its cluster was created {age / 3600:.1f} h ago",
            [f"cluster {cluster.rsplit('/', 1)[-1]} (labelled {names.RUN_LABEL}={run_id})"],
            ctx,
            ledger,
        )

    # ---------------------------------------------------------------- deleting
    def sweep(self, dry_run: bool = False) -> Sweep:
        """Find, then (unless ``dry_run``) tear down every collected run; a run whose teardown fails is reported and
        the others go on."""
        sweep = self.find()
        if dry_run:
            return sweep
        for found in sweep.collected:
            if found.adopt is not None:
                ledgers.update(found.ctx.store, partial(_adopted, found.adopt))
            try:
                sweep.deleted[found.run_id] = self.platform.teardown(found.ctx)["deleted"]
            except Exception as exc:  # noqa: BLE001 - the other runs are still swept; the report names this one
                sweep.failed[found.run_id] = str(exc)
        return sweep


def render(sweep: Sweep, dry_run: bool) -> str:
    """The sweep as text: what was (or would be) deleted, run by run, and what was left and why."""
    verb = "would delete" if dry_run else "deleted"
    lines = []
    for found in sweep.collected:
        lines.append(f"{found.run_id} ({found.reason}):")
        if dry_run:
            lines += [f"  {verb} {what}" for what in found.has]
        elif found.run_id in sweep.failed:
            lines.append(f"  failed: {sweep.failed[found.run_id]}")
        else:
            done = sweep.deleted.get(found.run_id) or []
            lines += [f"  {verb} {what}" for what in done] or ["  nothing was left to delete"]
    lines += [f"{line}" for line in sweep.kept]
    head = (
        f"tpupipe janitor{' --dry-run' if dry_run else ''}: {len(sweep.collected)} run"
        f"{'s' if len(sweep.collected) != 1 else ''} to clean up" + ("" if sweep.collected else "; nothing found")
    )
    return "\n".join([head, *lines]) + "\n"


def run_component(
    output_root: str,
    project: str,
    older_than: str,
    dry_run: bool,
    report_path: str,
    region: str = "",
    kfp: tuple[str, str] = ("", ""),
) -> str:
    """What the janitor pipeline's component calls: one sweep, its report as Markdown at ``report_path``, and a JSON
    summary (the runs deleted, kept and failed) as its output. A failed teardown fails the task, after the report."""
    from pathlib import Path

    janitor = Janitor(
        output_root,
        tuple(p for p in project.split(",") if p),
        parse_age(older_than) if older_than else None,
        region=region,
        kfp=kfp,
    )
    sweep = janitor.sweep(dry_run)
    text = render(sweep, dry_run)
    print(text, end="")
    Path(report_path).parent.mkdir(parents=True, exist_ok=True)
    Path(report_path).write_text("```\n" + text + "```\n")
    if sweep.failed:
        from components.spec import InfraError

        raise InfraError("janitor: could not tear down " + "; ".join(f"{k}: {v}" for k, v in sweep.failed.items()))
    return json.dumps(
        {
            "collected": [f.run_id for f in sweep.collected],
            "deleted": sweep.deleted,
            "kept": sweep.kept,
            "dry_run": dry_run,
        }
    )


def _adopted(new: dict[str, Any], recorded: dict[str, Any]) -> bool:
    """The adopted cluster's ledger, unless the run wrote one of its own since the sweep looked."""
    if recorded:
        return False
    recorded.update(new)
    return True
