"""The goodput ledger (components/stages/goodput.py): every second and every billed chip-second in one category."""

import pytest

from components.stages import goodput


def _stage(started, seconds, status="succeeded", result=None):
    return {"started": started, "seconds": seconds, "status": status, "result": result or {}}


def _categories(g):
    return {c["name"]: c for c in g["categories"]}


def test_a_run_with_a_restart_accounts_every_second_and_counts_repeated_steps_as_lost():
    # Worker group 0 starts at 1010 and ends steps 1-4 (its step 3 and 4 are never kept: group 1 restores from the
    # checkpoint of step 2 and runs them again); group 1 starts at 1030.
    steps = [{"step": n, "time": t} for n, t in ((1, 1012), (2, 1014), (3, 1016), (4, 1018))]
    steps += [{"step": n, "time": t} for n, t in ((3, 1034), (4, 1036), (5, 1038))]
    timeline = {"groups": [1010, 1030], "steps": steps, "checkpoints": [{"time": 1015, "seconds": 0.5}]}
    records = {
        "build_image": _stage(990, 20),  # side by side with provision: each instant counts once
        "provision": _stage(1000, 5),
        "deploy_raycluster": _stage(1006, 2),  # a second idle before it
        "train": _stage(1008, 32, result={"timeline": timeline}),
        "evaluate": _stage(1040, 5),
        "register": _stage(1045, 1),
        "promote": {"status": "skipped"},
        "teardown": _stage(1046, 4),
    }
    g = goodput.ledger(records, chips=16, usd_per_hour=36.0)
    c = _categories(g)
    assert g["wall_s"] == 60
    assert sum(x["seconds"] for x in g["categories"]) == pytest.approx(g["wall_s"])
    # Billed from provision's end (1005) to teardown's end (1050).
    assert g["billed_s"] == 45 and g["billed_chip_s"] == 45 * 16
    assert sum(x["chip_s"] for x in g["categories"]) == pytest.approx(g["billed_chip_s"])
    # Provision outranks the image build beside it; the build alone before and after it, and in the gap at 1005.
    assert c["provisioning"]["seconds"] == 5 and c["image build"]["seconds"] == 10 + 1
    assert c["image build"]["chip_s"] == 1 * 16  # 1005-1006: after provision ended, billed
    assert c["idle between stages"]["seconds"] == 0  # the build ran through the gap
    assert c["trainer start"]["seconds"] == pytest.approx(4 + 2)  # 1008 to the first step's end, the last's to 1040
    assert c["productive steps"]["seconds"] == pytest.approx(2 + 2 + 2)  # step 2, then group 1's steps 4 and 5
    assert c["checkpoint saves"]["seconds"] == pytest.approx(0.5)  # 1014.5-1015, inside group 0's step 3
    # Steps 3 and 4 of group 0 (1014-1018, less the save), the restart through group 1's first step (1018-1034).
    assert c["lost to failures"]["seconds"] == pytest.approx(4 - 0.5 + 16)
    assert g["goodput"] == pytest.approx(6 / 45, abs=1e-4)
    assert c["evaluation"]["usd"] == pytest.approx(5 * 36.0 / 3600)
    assert g["usd"] == pytest.approx(45 * 36.0 / 3600)


def test_pods_waiting_for_nodes_are_wall_time_waiting_for_capacity_and_bill_no_chip():
    # Flex-start: the pools exist at provision's end (10) with no nodes; the pods wait for them 12-40, then start.
    records = {
        "provision": _stage(0, 10),
        "deploy_raycluster": _stage(10, 35, result={"capacity_wait": [12.0, 40.0]}),
        "train": _stage(45, 10, status="failed"),
        "teardown": _stage(55, 5),
    }
    g = goodput.ledger(records, chips=4, usd_per_hour=8.0)
    c = _categories(g)
    assert c["waiting for capacity"]["seconds"] == 28 and c["waiting for capacity"]["chip_s"] == 0
    assert c["cluster start"]["seconds"] == 2 + 5 and c["cluster start"]["chip_s"] == 7 * 4
    assert g["wall_s"] == 60 and sum(x["seconds"] for x in g["categories"]) == pytest.approx(60)
    assert g["billed_s"] == 50 - 28 and sum(x["chip_s"] for x in g["categories"]) == pytest.approx(22 * 4)
    assert g["usd"] == pytest.approx(22 * 8.0 / 3600, abs=1e-4)


def test_unknown_prices_are_unknown_and_a_failed_train_is_lost():
    records = {
        "provision": _stage(0, 10),
        "train": _stage(10, 30, status="failed"),
        "teardown": _stage(40, 10),
    }
    g = goodput.ledger(records, chips=8, usd_per_hour=None)
    c = _categories(g)
    assert g["usd"] is None and all(x["usd"] is None for x in g["categories"])
    assert c["lost to failures"]["chip_s"] == 30 * 8 and g["goodput"] == 0
    assert goodput.ledger({"provision": {"status": "skipped"}}, chips=8, usd_per_hour=1.0) is None


def test_the_timeline_reads_fsdp_and_maxtext_records_once_each():
    records = [
        ("event", {"event": "worker_group_started", "time": 5.0}),
        ("event", {"event": "worker_group_started", "time": 5.0}),  # Ray forwarded the line twice
        ("event", {"event": "step", "step": 1, "time": 7.0}),
        ("event", {"event": "step", "step": 1, "time": 7.0}),
        ("event", {"event": "step_losses", "first_step": 1, "losses": [2.5]}),
        ("event", {"event": "checkpoint", "step": 1, "time": 8.0, "seconds": 0.25}),
        ("metric", {"epoch": 1, "loss": 2.5, "time": 7.5}),  # per epoch: not a step
        ("metric", {"step": 2, "loss": 2.0, "step_s": 0.4, "time": 9.0}),  # MaxText's per-step figures
        ("event", {"event": "checkpoint", "step": 2, "time": 9.5}),  # MaxText's save: no seconds of its own
    ]
    t = goodput.timeline(records)
    assert t["groups"] == [5.0]
    assert [s["step"] for s in t["steps"]] == [1, 2]
    assert t["checkpoints"] == [
        {"time": 8.0, "seconds": 0.25, "step": 1},
        {"time": 9.5, "seconds": 0.5, "step": 2},
    ]
    assert goodput.step_records(records, t) == [
        {"step": 1, "loss": 2.5, "time": 7.0, "group": 0},
        {"step": 2, "loss": 2.0, "time": 9.0, "group": 0},
    ]


def test_the_summary_line_names_goodput_and_where_most_chip_seconds_went():
    records = {"provision": _stage(0, 10), "train": _stage(10, 30), "teardown": _stage(40, 10)}
    g = goodput.ledger(records, chips=4, usd_per_hour=0.0, chip_kind="emulated host")
    assert goodput.line(g) == (
        "  goodput              0.0% of 2.7 emulated host-minutes billed ($0.00); most to trainer start 75%, "
        "teardown 25%"
    )


def test_compiles_are_cut_out_of_trainer_start_and_the_cache_hits_are_counted():
    # The first step ends at 1020; the trainer compiled 1012-1016 before it and 1030.5-1031 inside step 3 (an eval
    # program, say); the cache served 40 of the 42 programs MaxText compiled.
    records_ = [
        ("event", {"event": "worker_group_started", "time": 1009.0}),
        ("event", {"event": "compiled", "seconds": 4.0, "hit": False, "time": 1016.0}),
        ("metric", {"step": 0, "loss": 3.0, "time": 1020.0}),
        ("metric", {"step": 1, "loss": 2.9, "time": 1025.0}),
        ("event", {"event": "compiled", "seconds": 0.5, "hit": True, "time": 1031.0}),
        ("event", {"event": "compiled", "seconds": 0.5, "hit": True, "time": 1031.0}),  # forwarded twice by Ray
        ("metric", {"step": 2, "loss": 2.8, "time": 1032.0}),
        ("event", {"event": "compile_cache", "compiles": 42, "hits": 40, "seconds": 5.1, "time": 1033.0}),
    ]
    timeline = goodput.timeline(records_)
    assert [c["time"] for c in timeline["compiles"]] == [1016.0, 1031.0]
    assert timeline["compile_cache"] == {"compiles": 42, "hits": 40, "seconds": 5.1}
    records = {
        "provision": _stage(1000, 5),
        "train": _stage(1008, 27, result={"timeline": timeline}),
        "teardown": _stage(1035, 1),
    }
    g = goodput.ledger(records, chips=4, usd_per_hour=0.0)
    c = _categories(g)
    assert c["compilation"]["seconds"] == pytest.approx(4 + 0.5)
    assert c["trainer start"]["seconds"] == pytest.approx(12 - 4 + 3)  # 1008-1020 less the compile, 1032-1035
    assert c["productive steps"]["seconds"] == pytest.approx(5 + 7 - 0.5)
    assert sum(x["seconds"] for x in g["categories"]) == pytest.approx(g["wall_s"])
    assert g["compile_cache"] == {"compiles": 42, "hits": 40, "seconds": 5.1}
    assert goodput.line(g).endswith("; compiling 5.1 s, 40 of 42 programs from the compile cache")


def test_a_save_is_the_seconds_it_blocked_training_however_long_it_wrote_in_the_background():
    records_ = [
        ("event", {"event": "worker_group_started", "time": 1009.0}),
        ("metric", {"step": 0, "loss": 3.0, "time": 1010.0}),
        ("metric", {"step": 1, "loss": 2.9, "time": 1015.0}),
        ("event", {"event": "checkpoint", "step": 1, "seconds": 0.25, "time": 1015.5}),
        ("event", {"event": "checkpoint_written", "seconds": 6.0, "time": 1021.0}),
        ("metric", {"step": 2, "loss": 2.8, "time": 1020.0}),
    ]
    timeline = goodput.timeline(records_)
    assert timeline["checkpoints"] == [{"time": 1015.5, "seconds": 0.25, "step": 1}]
    records = {"provision": _stage(1000, 5), "train": _stage(1008, 14, result={"timeline": timeline})}
    c = _categories(goodput.ledger(records, chips=4, usd_per_hour=0.0))
    assert c["checkpoint saves"]["seconds"] == pytest.approx(0.25)  # not the 6 s it wrote behind training
