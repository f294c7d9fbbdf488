"""`tpupipe show` and `tpupipe logs` read a run's records from its store (pipelines/cli/runs.py)."""

import json

from components.platforms.store import LocalStore, write_json, write_text
from pipelines.cli import runs as cli_runs
from pipelines.cli.main import main


def _failed_run(root):
    store = LocalStore(root / "r1")
    write_json(store, "stages/provision.json", {"status": "succeeded", "started": 1.0, "seconds": 2.0})
    write_json(
        store, "stages/train.json", {"status": "failed", "started": 3.0, "seconds": 4.0, "error": "train: job FAILED"}
    )
    write_text(store, "logs/train.log", "".join(f"line {n}\n" for n in range(30)) + "InjectedFailure: step 1\n")
    return store


def test_logs_of_a_stage_print_its_whole_log_and_its_error(tmp_path, capsys):
    _failed_run(tmp_path)
    assert main(["logs", "r1", "--output-root", str(tmp_path), "--stage", "train"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("line 0\n") and "InjectedFailure: step 1\n== train: failed, 4.0s\ntrain: job FAILED" in out


def test_logs_of_a_run_list_every_stage_recorded_with_the_last_lines_of_each_job_log(tmp_path, capsys):
    _failed_run(tmp_path)
    assert main(["logs", str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out
    assert "== provision: succeeded, 2.0s" in out and "== train: failed, 4.0s\ntrain: job FAILED" in out
    assert "-- last 20 of 31 lines of " in out and "line 10\n" not in out and "line 11\n" in out
    assert "evaluate" not in out  # it left no record


def test_logs_follow_a_running_stage_until_it_ends(tmp_path, capsys):
    store = LocalStore(tmp_path / "r2")
    write_json(store, "stages/train.json", {"status": "running", "started": 1.0})
    write_text(store, "logs/train.log", "step 1\n")
    reads = []

    def sleep(_s):  # the job goes on between two reads: a line more, then it ends
        reads.append(1)
        if len(reads) == 1:
            write_text(store, "logs/train.log", "step 1\nstep 2\n")
        else:
            write_json(store, "stages/train.json", {"status": "succeeded", "started": 1.0, "seconds": 5.0})

    assert cli_runs._stage_log(store, "train", follow=True, sleep=sleep) == 0
    assert capsys.readouterr().out == "step 1\nstep 2\n== train: succeeded, 5.0s\n"


def test_show_prints_the_summary_and_a_run_without_one_is_a_clear_error(tmp_path, capsys):
    store = _failed_run(tmp_path)
    assert main(["show", "r1", "--output-root", str(tmp_path)]) == 2
    assert "run: no summary.json in " in capsys.readouterr().err
    summary = {"run_id": "r1", "preset": "p", "platform": "local", "status": "failed", "stages": [], "history": []}
    summary |= {"run_dir": str(tmp_path / "r1"), "deleted": []}
    write_text(store, "summary.json", json.dumps(summary))
    assert main(["show", str(tmp_path / "r1")]) == 0
    assert capsys.readouterr().out.startswith("tpupipe run r1  preset p  platform local")
    assert main(["show", str(tmp_path / "r1"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "r1"


def test_follow_without_a_stage_is_refused(tmp_path, capsys):
    _failed_run(tmp_path)
    assert main(["logs", "r1", "--output-root", str(tmp_path), "--follow"]) == 2
    assert "--follow: follows one stage's log" in capsys.readouterr().err


def test_a_post_mortem_file_keeps_its_tail_within_the_cap(tmp_path):
    from components.platforms import postmortem

    node = tmp_path / "head" / "session_latest" / "logs"
    node.mkdir(parents=True)
    (node / "raylet.out").write_bytes(b"".join(b"line %d\n" % n for n in range(10000)))
    (node / "empty.err").write_bytes(b"")
    store = LocalStore(tmp_path / "run")
    assert postmortem.ray_session_logs(store, {"head": tmp_path / "head"}, cap=1000) == ["logs/ray/head/raylet.out"]
    kept = (tmp_path / "run" / "logs" / "ray" / "head" / "raylet.out").read_bytes()
    assert kept.startswith(b"[... ") and kept.endswith(b"line 9999\n") and len(kept) < 1100


def _answers(answers):
    rows = [
        {"index": i, "prompt": f"Instruction: Reverse the word {w}.\nResponse: ", "reference": w[::-1], "answer": a}
        for i, (w, a) in enumerate(zip(["abc", "dog", "sun"], answers, strict=True))
    ]
    for row in rows:
        row["scores"] = {"exact_match": float(row["answer"] == row["reference"])}
    return rows


def test_show_answers_prints_the_runs_side_by_side_page_and_a_run_without_answers_is_a_clear_error(tmp_path, capsys):
    from components.platforms.store import write_text
    from components.stages import answers
    from components.workload import resolve

    store = LocalStore(tmp_path / "r3")
    assert main(["show", "r3", "--output-root", str(tmp_path), "--answers"]) == 2
    assert "--answers: no eval/side_by_side.md in " in capsys.readouterr().err
    candidate = _answers(["cba", "dog", "nus"])  # the second a regression
    champion = _answers(["cba", "god", "x"])
    spec = resolve("local-fsdp", "eval.metrics=exact_match")
    page = answers.side_by_side(spec, answers.compare(candidate, champion), candidate, champion, "champion")
    write_text(store, answers.SIDE_BY_SIDE, page, "text/markdown")  # as the evaluate stage writes it
    assert main(["show", "r3", "--output-root", str(tmp_path), "--answers"]) == 0
    out = capsys.readouterr().out
    assert out == page
    table, examples = out.index("| exact_match | 0.6667 | 0.6667 | +0.0000 |"), out.index("## Examples (3 of 3")
    assert table < examples < out.index("| 1 | Instruction: Reverse the word dog.<br>Response:  | god | god | dog |")
    assert out.index("| 1 | Instruction") < out.index("| 0 | Instruction") < out.index("| 2 | Instruction")
