"""A run id is used once, ever (``pipelines.run_ids``): ``tpupipe run --run-id`` of an id that has had a ledger
under the output root, torn down or not, exits 2 naming ``--run-id`` before anything is checked or started, and
leaves the old run's directory as it was. (Vertex AI: tests/vertex/test_vertex_service.py; KFP:
tests/kfp/test_kfp_backend.py.)"""

from __future__ import annotations

import pytest

from components.platforms import ledger as ledgers
from components.platforms.store import LocalStore


@pytest.mark.parametrize("torn_down", [False, True])
def test_a_local_run_under_a_run_id_that_had_a_ledger_exits_2(tmp_path, capsys, torn_down):
    from pipelines.cli.main import main

    store = LocalStore(tmp_path / "used")
    ledgers.replace(store, {"run_id": "used", "platform": "local", "created": [], "torn_down": torn_down})
    (tmp_path / "used" / "train" / "ray_results" / "used").mkdir(parents=True)  # its checkpoints: never resumed
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["run", "local-fsdp", "--run-id", "used", "--output-root", str(tmp_path)]) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpupipe: error:")]
    assert f"--run-id: 'used' was used already: a run under it has a ledger ({tmp_path / 'used'}/ledger.json)" in error
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
