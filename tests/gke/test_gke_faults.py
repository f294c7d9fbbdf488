"""A fault in each stage in turn of `tpupipe run --platform gke` against the emulated project: provision half done
(a stockout on the second slice's node pool, after the DCN networks, the cluster and the first slice exist), the image
build failed (Cloud Build ends the build in FAILURE), deploy past its deadline (the RayCluster never gets ready), train
crashed (the real trainer process raises: ``testing.fail_at_step``), and a delete in teardown failing once
(DeleteCluster answers UNAVAILABLE, on top of a deploy past its deadline). Each run exits 1, its summary names the
failing stage and its error, and teardown leaves nothing in any emulator and no process of the run.

The faults are injected at the wire (the emulators) or are a real crash of the real trainer; only the train case needs
the Ray-backed emulated cluster (e2e): without Ray, the kube emulator starts no process and the RayCluster never gets
ready. A crash in the evaluation job goes through the same stage code (components/stages/jobs.py): it is shown on the
local platform, after a train that resumed (tests/e2e/test_local_pipeline.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.emulators.project import ONE_SLICE, Project, start_project
from tests.gke.test_gke_pipeline import _env, assert_secrets_kept
from tests.gke.test_gke_platform import DCN_SLICES
from tests.helpers import tpupipe_cmd, unique_run_id, wait_until

# Trains for seconds: 64 examples, one epoch, no slice check (the first job the run submits is the train job).
TINY = " train.epochs=1 train.num_train_examples=64 train.num_eval_examples=16 cluster.slice_check=false"
NEVER_READY = ONE_SLICE + " cluster.ready_timeout_s=5"
# The trainer image built by (emulated) Cloud Build from images/torch, FROM a TorchTPU base.
BUILT = ONE_SLICE.replace("gke.image=local/torch", "gke.torch_tpu_base=us-docker.pkg.dev/tpupipe-emulated/base/tt:2")


def _nothing(project: Project) -> None:
    pass


@dataclass(frozen=True)
class Fault:
    run_id: str  # this test session's own (unique_run_id)
    stage: str  # the stage the fault fails
    error: str  # what that stage's error says ({run_id}: the run's id)
    sets: str  # the run's spec overrides
    inject: Callable[[Project], None] = _nothing
    ray: bool = False  # the emulated cluster runs Ray (the jobs run)
    after: Callable[[Project, str], None] = lambda project, out: None  # what else the fault must have caused


def _stockout_on_the_second_slice(project: Project) -> None:
    project.gke.stockout(when=lambda request: request.node_pool.name.endswith("-s1"))


def _half_done(project: Project, out: str) -> None:
    """The stockout came when the DCN networks, the cluster and the first slice's pool had been created."""
    assert project.compute.mutations().count("networks.insert") == 2
    assert [c for c in project.gke.state.calls if c.startswith("Create")] == ["CreateCluster"] + ["CreateNodePool"] * 2


def _a_subnet_delete_unavailable_once(project: Project) -> None:
    project.compute.fail("subnetworks.delete", 503, times=1)


def _the_delete_was_retried(project: Project, out: str) -> None:
    # three subnets (the two DCN networks' and the nodes' own), one of them twice
    assert project.compute.state.calls.count("subnetworks.delete") == 4
    assert "delete subnetwork projects/" in out and "ServiceUnavailable" in out and "retrying in" in out


FAULTS = [
    pytest.param(
        Fault(
            unique_run_id("f-provision"),
            "provision",
            "no capacity for 2 x 16 v6e chips",
            DCN_SLICES,
            _stockout_on_the_second_slice,
            after=_half_done,
        ),
        id="provision-half-done",
    ),
    pytest.param(
        Fault(unique_run_id("f-build"), "build_image", "ended FAILURE", BUILT, lambda p: p.cloudbuild.build_fails()),
        id="image-build-failed",
    ),
    pytest.param(
        Fault(
            unique_run_id("f-deploy"),
            "deploy_raycluster",
            "timed out after 5s waiting for RayCluster {run_id}",
            NEVER_READY,
        ),
        id="deploy-past-its-deadline",
    ),
    pytest.param(
        Fault(
            unique_run_id("f-train"),
            "train",
            "injected failure at step 1 (testing.fail_at_step)",
            ONE_SLICE + TINY + " testing.fail_at_step=1",
            ray=True,
        ),
        id="train-crashed",
        marks=pytest.mark.e2e,
    ),
    pytest.param(
        Fault(
            unique_run_id("f-teardown"),
            "deploy_raycluster",
            "timed out after 5s waiting for RayCluster {run_id}",
            DCN_SLICES + " cluster.ready_timeout_s=5",
            _a_subnet_delete_unavailable_once,
            after=_the_delete_was_retried,
        ),
        id="a-delete-in-teardown-fails-once",
    ),
]


def _assert_postmortem(run_dir, pods: list[str]) -> None:
    """What teardown kept of the crashed run's cluster, besides the pods' statuses: each pod's own log (the Ray
    processes' output), the node pools GKE described, Ray's state with the dead actors, and the nodes' Ray logs."""
    logs = run_dir / "logs"
    print(sorted(str(p.relative_to(logs)) for p in logs.rglob("*") if p.is_file()))
    head = next(p for p in pods if "-head" in p)
    assert "Ray runtime started" in (logs / "pods" / f"{head}.log").read_text()
    assert {p.name for p in (logs / "pods").glob("*.log")} == {f"{p}.log" for p in pods}
    pools = json.loads((logs / "node_pools.json").read_text())
    assert pools and all(p["status"] and p["machine_type"] for p in pools), pools
    state = json.loads((logs / "ray_state.json").read_text())
    print(json.dumps(state["dead_actors"], indent=1)[:6000], json.dumps(state["failed_tasks"], indent=1)[:6000])
    assert len(state["nodes"]) == len(pods), state["nodes"]
    assert state["dead_actors"] and all(a["death_cause"] for a in state["dead_actors"]), state["dead_actors"]
    assert (logs / "ray" / "head" / "gcs_server.out").stat().st_size
    assert all(list((logs / "ray" / p).glob("raylet.*")) for p in pods if p != head)


def _nothing_left(project: Project, run_id: str, timeout_s: float = 60) -> None:
    """Nothing of the run in any emulator, once the Ray processes of a deleted RayCluster have had time to stop."""
    wait_until(
        lambda: not project.leftovers(run_id),
        timeout_s,
        f"run {run_id} to leave nothing in any emulator",
        interval_s=1,
        detail=lambda: project.leftovers(run_id),
    )


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_in_a_stage_fails_the_run_naming_it_and_teardown_leaves_nothing(tmp_path, fault):
    project = start_project(tmp_path, ray=fault.ray, polls_to_done=1)
    try:
        fault.inject(project)
        root = tmp_path / "runs"
        command = [
            *tpupipe_cmd(),
            "run",
            "--platform",
            "gke",
            "--preset",
            "local-fsdp",
            "--run-id",
            fault.run_id,
            "--output-root",
            str(root),
            "--set",
            fault.sets,
        ]
        proc = subprocess.run(
            command, env=_env(project), capture_output=True, text=True, timeout=1500 if fault.ray else 600
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out[-6000:]
        summary = json.loads((root / fault.run_id / "summary.json").read_text())
        stages = {s["name"]: s for s in summary["stages"]}
        assert summary["status"] == "failed" and summary["interrupted"] is None
        assert [name for name, s in stages.items() if s["status"] == "failed"] == [fault.stage], summary["stages"]
        error = fault.error.format(run_id=fault.run_id)
        assert error in stages[fault.stage]["error"], stages[fault.stage]["error"]
        assert f"{fault.stage} failed: " in proc.stdout and "status: failed" in proc.stdout
        assert stages["teardown"]["status"] == "succeeded"
        # After teardown, the run's store still has what failed: `tpupipe logs` prints the stage's error (and, for a
        # job's stage, the job's whole log, the trainer's own exception in it).
        logs = subprocess.run(
            [*tpupipe_cmd(), "logs", fault.run_id, "--output-root", str(root), "--stage", fault.stage],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert logs.returncode == 0 and f"== {fault.stage}: failed" in logs.stdout and error in logs.stdout, logs
        if fault.stage == "train":
            assert "InjectedFailure" in logs.stdout.split(f"== {fault.stage}: failed")[0]  # in the job's log
            # The pods' statuses and the RayCluster's, as the API server gave them before teardown deleted them.
            kept = json.loads((root / fault.run_id / "logs" / "kubernetes.json").read_text())
            assert kept["pods"] and all(p["phase"] for p in kept["pods"]), kept
            assert kept["raycluster"], kept
            _assert_postmortem(root / fault.run_id, [p["name"] for p in kept["pods"]])
        _nothing_left(project, fault.run_id)
        fault.after(project, out)
        assert_secrets_kept(project, fault.run_id, root / fault.run_id, out + logs.stdout + logs.stderr)
    finally:
        project.stop()
