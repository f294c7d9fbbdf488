"""kfp.local itself fails mid-run (it raises instead of running a task: here the OSError Linux gives a task whose
command line is over its limits, injected into kfp.local's subprocess launcher, the library's code): its exit task,
teardown, never runs, so `tpupipe run`'s driver tears down what the run created itself, says so, and exits 1; nothing
of the run is left in the emulated project."""

from __future__ import annotations

import errno

from kfp.local import subprocess_task_handler

from pipelines.cli import main as cli
from tests.emulators.project import ONE_SLICE
from tests.helpers import unique_run_id


def test_a_run_whose_kfp_local_fails_to_start_a_task_is_torn_down_by_the_driver(
    project_factory, tmp_path, capsys, monkeypatch
):
    project = project_factory(polls_to_done=1)
    real = subprocess_task_handler.run_local_subprocess

    def launch(full_command, env_vars=None):
        if any("deploy_raycluster" in part for part in full_command):  # after provision created the cluster
            raise OSError(errno.E2BIG, "Argument list too long", "sh")
        return real(full_command=full_command, env_vars=env_vars)

    monkeypatch.setattr(subprocess_task_handler, "run_local_subprocess", launch)
    run_id = unique_run_id("crash")
    sets = ONE_SLICE + " cluster.slice_check=false"
    code = cli.main(
        ["run", "--platform", "gke", "--run-id", run_id, "--output-root", str(tmp_path / "runs"), "--set", sets]
    )
    out = capsys.readouterr().out
    assert code == 1, out[-5000:]
    assert "kfp.local failed: OSError: [Errno 7] Argument list too long: 'sh'" in out and "tearing down" in out
    assert f"`tpupipe teardown {run_id} --platform gke --output-root {tmp_path / 'runs'}` finishes it" in out
    assert f"tpupipe teardown {run_id} (gke): deleted " in out
    assert project.gke.state.calls.count("CreateCluster") == 1  # provision ran: there was something to delete
    assert not project.leftovers(run_id)
