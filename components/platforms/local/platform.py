"""The local platform: :class:`LocalPlatform`, the ``Platform`` interface (``components.platforms``) over a real
multi-node Ray cluster of processes on this machine (``cluster``).

Provision checks the spec and the disk, builds or reuses the trainer image's environment (``envs``) and starts the
cluster, or re-attaches to the run's running one; deploy_raycluster waits until the head and every host are alive;
the jobs reach the head's dashboard with the run's Ray token (``auth``); checkpoints and the registry stay on this
machine; teardown stops exactly what the run's ledger and marker name. ``components.platforms.get_platform("local")``
makes one.
"""

from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.platforms import Platform, RunContext, changed_since_evaluated, procs
from components.platforms import ledger as ledgers
from components.platforms.local import auth, cluster, envs
from components.platforms.local.processes import RUN_MARKER, carries_marker, run_processes
from components.platforms.waiting import wait_for
from components.spec import InfraError, SpecError, ready_limits
from components.workload.cache import CACHE_PREFIX
from components.workload.derive import trainer_image

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from components.workload.cache_trust import Places

MODELS_DIR = "_models"  # under the output root, beside the runs: not a run id (run ids are DNS labels: no underscore)


class LocalPlatform(Platform):
    name = "local"

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.log = log

    def check_access(self, ctx: RunContext) -> None:
        """Nothing to find: the local platform keeps its runs on this machine and calls no cloud."""

    def check(self, ctx: RunContext) -> None:
        if ctx.spec.cluster.accelerator != "cpu":
            raise SpecError(
                "cluster.accelerator",
                f"the local platform emulates CPU hosts; preset {ctx.spec.name!r} asks for "
                f"{ctx.spec.cluster.accelerator!r}: run it with platform=gke, or set cluster.accelerator=cpu",
                ["cpu"],
            )
        if ctx.store.local() is None:
            raise SpecError(
                "output_root",
                f"the local platform keeps its runs on this machine, not in {ctx.store.uri}",
                ["a local directory (default ./runs)"],
            )
        model_id = ctx.spec.train.model_id
        if model_id.startswith(("/", "./", "../", "~")) and not Path(model_id).expanduser().is_dir():
            # Local hosts share this machine's files, so a model directory must be here (on GKE it is a path the
            # pods see, such as the bucket under /data).
            raise SpecError(
                "train.model_id",
                f"directory not found: {model_id}",
                ["a hub name", "a local directory (config, weights, tokenizer)", "scratch:<config>"],
            )

    # -- provision: start the head and the worker raylets
    def provision(self, ctx: RunContext) -> dict[str, Any]:
        self.check(ctx)
        ledger = _cluster_ledger(ctx)
        if (
            ledger
            and ledger["processes"]
            and procs.alive(ledger["processes"][0]["pid"])
            and not ledger.get("processes_stopped")
            and not ledger.get("teardown_started")
        ):
            self.log(f"re-attaching to the running cluster of {ctx.run_id} ({ledger['dashboard_url']})")
            return cluster.describe(ledger)
        if ledger:  # a previous attempt died half-way: clear what it left before starting again
            cluster.stop(ctx, ledger, self.log)
        cluster.check_disk(Path(tempfile.gettempdir()))
        env = envs.ensure_env(trainer_image(ctx.spec), log=self.log)
        ledger = cluster.new_ledger(ctx, env)
        ledgers.replace(ctx.store, ledger)
        cluster.start(ctx, ledger, env, self.log)
        return cluster.describe(ledger)

    # -- build_image: the trainer image's environment, by content hash
    def build_image(self, ctx: RunContext) -> dict[str, Any]:
        env = envs.ensure_env(trainer_image(ctx.spec), log=self.log)
        return {**env.to_dict(), "image": f"local/{env.image}@{env.digest}"}

    # -- deploy_raycluster: wait until the head and every host are alive
    def deploy_raycluster(self, ctx: RunContext) -> dict[str, Any]:
        ledger = _cluster_ledger(ctx)
        if not ledger:
            raise InfraError(f"no cluster recorded for run {ctx.run_id}: provision did not run")
        want = ledger["num_hosts"] + 1

        def alive_nodes() -> int | None:
            cluster.raise_if_dead(ledgers.load(ctx.store) or ledger)
            try:
                alive = auth.alive_nodes(ledger["dashboard_url"], ledger["auth_token_path"])
            except Exception:  # noqa: BLE001 - the dashboard is still starting
                return None
            return alive if alive >= want else None

        started = time.monotonic()
        seen = wait_for(
            alive_nodes,
            timeout_s=ready_limits(ctx.spec).deadline_s,
            interval_s=1.0,
            what=f"{want} Ray nodes (head + {want - 1} hosts) to be alive",
            progress=lambda s: self.log(f"  waiting for {want} nodes ... {s:.0f}s") if int(s) % 10 == 0 else None,
        )
        self.log(f"Ray cluster ready: {seen} nodes alive after {time.monotonic() - started:.1f}s")
        return {"nodes_alive": seen, "dashboard_url": ledger["dashboard_url"]}

    def job_client(self, ctx: RunContext, deadline: float | None = None) -> JobSubmissionClient:
        from ray.job_submission import JobSubmissionClient

        ledger = _cluster_ledger(ctx)
        if not ledger:
            raise InfraError(f"no cluster recorded for run {ctx.run_id}: provision did not run")
        return JobSubmissionClient(ledger["dashboard_url"], headers=auth.headers(ledger["auth_token_path"]))

    def job_output_dir(self, ctx: RunContext) -> str:
        return str(ctx.run_dir / "train")

    def compile_cache_root(self, ctx: RunContext) -> str:
        return str(ctx.run_dir.parent / CACHE_PREFIX)  # beside the runs, under the output root

    def run_cache_root(self, ctx: RunContext) -> str:
        from components.workload.cache_trust import RUN_CACHE_DIR

        return str(ctx.run_dir / RUN_CACHE_DIR)

    def compile_job_root(self, ctx: RunContext) -> str:
        from components.workload.cache_trust import COMPILE_DIR

        return str(ctx.run_dir / COMPILE_DIR)

    def cache_places(self, ctx: RunContext) -> Places:
        """This machine's directories: the pipeline's side (the stage) writes the cache and the manifests beside the
        runs, the Ray workers (this run's pods) only their run's directories (``components.workload.cache_trust``)."""
        from components.workload.cache_trust import MANIFESTS_PREFIX, LocalPlace, Places

        return Places(
            LocalPlace(Path(self.compile_cache_root(ctx))),
            LocalPlace(Path(self.run_cache_root(ctx))),
            LocalPlace(ctx.run_dir.parent / MANIFESTS_PREFIX),
            LocalPlace(Path(self.compile_job_root(ctx))),
        )

    def checkpoint_uri(self, ctx: RunContext, path: str) -> str:
        return path  # the jobs write on this machine

    def checkpoint_path(self, ctx: RunContext, uri: str) -> str:
        if "://" in uri:
            raise SpecError(
                "train.init_from",
                f"the local platform reads checkpoints on this machine; {uri} is not "
                "one (a model of the Vertex AI registry)",
            )
        if not Path(uri).is_dir():
            raise SpecError("train.init_from", f"checkpoint {uri} of the registered version is gone from this machine")
        return uri

    def checkpoint_versions(self, ctx: RunContext, uri: str) -> dict[str, str]:
        """The sha256 of every file under the checkpoint directory: a file here has no generation to pin."""
        root = Path(uri)
        if not root.is_dir():
            raise InfraError(f"checkpoint {uri} is not a directory on this machine")
        return {p.relative_to(root).as_posix(): _sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}

    def keep_registered(self, ctx: RunContext, uri: str, model: str, versions: dict[str, str]) -> str:
        """A copy under ``<output root>/_models/<model>/<run id>/``, beside the runs and in none of their directories,
        its files read-only; made whole, each copied file's bytes hashed against ``versions``, then renamed into
        place. This machine has one identity: what keeps a later run's jobs from it is that none is given a path
        there (they write their own run's directory)."""
        import os
        import shutil
        import stat

        kept = ctx.run_dir.parent / MODELS_DIR / model / ctx.run_id
        if kept.is_dir():  # a retried register: the copy its first attempt made (and checked)
            return str(kept)
        partial = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        shutil.rmtree(partial, ignore_errors=True)
        changed = []
        for name, version in versions.items():
            source, copy = Path(uri) / name, partial / name
            copy.parent.mkdir(parents=True, exist_ok=True)
            if not source.is_file():
                changed.append(name)
                continue
            shutil.copyfile(source, copy)
            copy.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            if _sha256(copy) != version:  # the bytes copied, not the source again: nothing can change in between
                changed.append(name)
        if changed:
            shutil.rmtree(partial, ignore_errors=True)
            raise changed_since_evaluated(uri, changed)
        partial.rename(kept)
        self.log(f"register: the checkpoint kept at {kept}, out of every run's directory")
        return str(kept)

    def registry_place(self, ctx: RunContext) -> dict[str, str]:
        return {"output_root": str(ctx.run_dir.parent)}  # <output root>/registry, beside the runs

    def hosts_lost(self, ctx: RunContext) -> int | None:
        """The hosts the keeper replaced, as the ledger records them."""
        ledger = ledgers.load(ctx.store) or {}
        lost: int = sum(p.get("replacements", 0) for p in ledger.get("processes", []) if p["role"].startswith("host-"))
        return lost

    # -- teardown: stop exactly what this run started, free its ports, keep its outputs
    def teardown(self, ctx: RunContext) -> dict[str, Any]:
        ledger = _cluster_ledger(ctx)
        if not ledger:
            leftover = run_processes(ctx.run_id)
            for pid in leftover:
                procs.signal_process(pid, signal.SIGKILL)
            return {
                "stopped_groups": 0,
                "strays": len(leftover),
                "note": "no cluster was recorded",
                "deleted": [f"process {pid}" for pid in leftover],
            }
        return cluster.stop(ctx, ledger, self.log)

    def remaining(self, ctx: RunContext) -> list[str]:
        """What of the run is still running, found from its ledger and its marker (read here, no call made)."""
        ledger = _cluster_ledger(ctx) or {"processes": []}
        live = [p for p in ledger["processes"] if carries_marker(p["pid"], ctx.run_id)]
        recorded = {p["pid"] for p in live}
        others = [pid for pid in run_processes(ctx.run_id) if pid not in recorded]
        return [f"{p['role']} (pid {p['pid']})" for p in live] + (
            [f"{len(others)} more processes carrying {RUN_MARKER}={ctx.run_id}"] if others else []
        )


def _cluster_ledger(ctx: RunContext) -> dict[str, Any] | None:
    """The run's ledger once provision recorded a cluster in it; None before (none, or only the run's claim on its id:
    ``components.stages.claims``)."""
    ledger = ledgers.load(ctx.store)
    return ledger if ledger and "processes" in ledger else None


def _sha256(path: Path) -> str:
    import hashlib

    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
