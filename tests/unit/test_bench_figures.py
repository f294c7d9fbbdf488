"""bench/figures.py's alternated pairs and bench/run.py's results.json: what the benchmark figures rest on."""

import json

from bench import run
from bench.figures import Figure, alternated


def test_pairs_alternate_their_order_and_the_figure_is_the_median_ratio_with_its_spread():
    calls = []

    def side(name, values):
        return lambda i: calls.append((name, i)) or values[i]

    ratio, detail, a, b = alternated(side("A", [10, 9, 12]), side("B", [10, 10, 10]), float, pairs=3)
    assert calls == [("A", 0), ("B", 0), ("B", 1), ("A", 1), ("A", 2), ("B", 2)]
    assert (a, b) == ([10, 9, 12], [10, 10, 10])
    assert ratio == 1.0 and detail["ratios"] == [1.0, 0.9, 1.2] and detail["spread"] == [0.9, 1.2]


def test_a_subset_run_replaces_its_own_figures_and_keeps_the_others(tmp_path, monkeypatch):
    results = tmp_path / "results.json"
    results.write_text(
        json.dumps(
            {
                "bench_seconds": {"plan": 2.0, "scale": 60.0},
                "figures": [
                    {"bench": "plan", "name": "old plan figure", "value": 1},
                    {"bench": "scale", "name": "scale figure", "value": 2},
                ],
            }
        )
    )
    monkeypatch.setattr(run, "RESULTS", results)

    class Plan:  # the bench module run.main imports for "plan"
        @staticmethod
        def figures():
            return [Figure("new plan figure", 0.5, "s", "<= 1")]

    monkeypatch.setattr(run.importlib, "import_module", lambda name: Plan)
    assert run.main(["plan"]) == 0
    written = json.loads(results.read_text())
    assert [(f["bench"], f["name"]) for f in written["figures"]] == [
        ("plan", "new plan figure"),
        ("scale", "scale figure"),
    ]
    assert written["bench_seconds"]["scale"] == 60.0 and "commit" in written["figures"][0]


def test_the_maxtext_checkpoint_bench_pairs_each_save_with_its_write_once_and_leaves_out_the_last_steps():
    """Orbax's save events in order, a line Ray forwarded twice counted once, the save at the run's last step (which
    training waits for by design) left out."""
    from bench import bench_checkpoint

    def line(payload: dict) -> str:
        return "TPUPIPE[ab12] event " + json.dumps(payload)

    last = bench_checkpoint.MAXTEXT_STEPS - 1
    lines = [
        line({"event": "checkpoint", "seconds": 0.3, "start_sync_s": 0.02, "step": 0, "time": 1.0}),
        line({"event": "checkpoint_written", "seconds": 1.5, "time": 2.0}),
        line({"event": "checkpoint", "seconds": 0.06, "wait_previous_s": 0.0, "step": 3, "time": 3.0}),
        line({"event": "checkpoint", "seconds": 0.06, "wait_previous_s": 0.0, "step": 3, "time": 3.0}),
        line({"event": "checkpoint_written", "seconds": 0.8, "time": 4.0}),
        line({"event": "checkpoint", "seconds": 0.05, "step": last, "time": 5.0}),
        line({"event": "checkpoint_written", "seconds": 0.5, "time": 6.0}),
    ]
    assert bench_checkpoint.maxtext_saves("\n".join(lines)) == [
        {"step": 0, "waited_s": 0.3, "start_sync_s": 0.02, "whole_s": 1.5},
        {"step": 3, "waited_s": 0.06, "wait_previous_s": 0.0, "whole_s": 0.8},
    ]


def test_the_drain_bench_pairs_each_notice_with_its_save_and_the_restore_after_it_and_counts_repeats():
    from bench.bench_drain import per_drain

    def ev(event, t, **kw):
        return {"event": event, "time": t, **kw}

    found = [
        ev("worker_group_started", 0.0),
        *[ev("step", 1.0 + s / 10, step=s) for s in range(1, 31)],  # the first group trains to 30
        ev("preemption_checkpoint", 12.0, step=30),
        ev("worker_group_started", 30.0),
        ev("restored", 31.0, step=30),
        *[ev("step", 32.0 + s / 10, step=s) for s in range(31, 46)],
        ev("step", 36.0, step=46),  # the second notice (at 35) comes while step 46 trains: no save before restart
        ev("worker_group_started", 60.0),
        ev("restored", 61.0, step=40),
        ev("step", 62.0, step=41),
    ]
    first, second = per_drain(found, [10.0, 35.0])
    assert first["committed"] and first["saved_step"] == 30 and first["steps_repeated"] == 0
    assert first["notice_to_saved_s"] == 2.0 and first["notice_to_restart_s"] == 20.0
    assert not second["committed"] and second["saved_step"] is None and second["restored_step"] == 40
    assert second["last_step_before_restart"] == 46 and second["steps_repeated"] == 6


def test_the_drain_bench_reads_maxtexts_groups_and_metrics_and_its_saved_steps_unlogged_line_repeats_nothing():
    """MaxText's records: a group's restore in its ``worker_group_started``, its steps as metrics (a step's line
    written after the next step's, so a group that stopped at its save may never log the saved step)."""
    from bench.bench_drain import events, per_drain, restores
    from components.spec import protocol

    nonce = "a1b2c3d4e5f60718"

    def line(kind, payload):
        return "(RayTrainWorker pid=1) " + protocol.line(kind, payload, nonce)

    log = [
        line("event", {"event": "worker_group_started", "group": 1, "time": 0.0, "restore_step": None}),
        *[line("metric", {"step": s, "group": 1, "loss": 1.0, "time": 1.0 + s / 10}) for s in range(0, 15)],
        line("metric", {"step": 14, "group": 1, "loss": 0.9, "time": 1.0 + 14 / 10}),  # the precise one after
        line("event", {"event": "preemption_checkpoint", "step": 15, "time": 12.0}),
        line("event", {"event": "worker_group_started", "group": 2, "time": 30.0, "restore_step": 15}),
        *[line("metric", {"step": s, "group": 2, "loss": 0.5, "time": 32.0 + s / 10}) for s in range(16, 20)],
    ]
    found = events("\n".join(log))
    assert [r["step"] for r in restores(found)] == [15]
    (drain,) = per_drain(found, [10.0])
    assert drain["committed"] and drain["saved_step"] == drain["restored_step"] == 15
    assert drain["last_step_before_restart"] == 14 and drain["steps_repeated"] == 0


def test_the_drain_bench_counts_no_restore_where_the_next_group_trained_from_another_step():
    """The restore a group names is taken only where its first logged step is the one after it."""
    from bench.bench_drain import per_drain

    found = [
        {"event": "worker_group_started", "time": 0.0, "restore_step": None},
        *[{"event": "step", "step": s, "time": 1.0 + s / 10} for s in range(0, 15)],
        {"event": "preemption_checkpoint", "step": 15, "time": 12.0},
        {"event": "worker_group_started", "time": 30.0, "restore_step": 15},
        *[{"event": "step", "step": s, "time": 32.0 + s / 10} for s in range(1, 5)],  # trained from step 0 instead
    ]
    (drain,) = per_drain(found, [10.0])
    assert drain["resumed_from_step"] == 0 and drain["restored_step"] is None and not drain["committed"]
