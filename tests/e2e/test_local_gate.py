"""`make run`'s run, then a recurring fine-tune after it, on the local platform: two `tpupipe run`s of local-fsdp with
one output root, so one local registry (``<root>/registry``, model ``local-fsdp``):

1. the default run (2 emulated hosts, the slice check, 4 epochs): the whole pipeline succeeds, fine-tuning lowers the
   held-out loss and lifts the exact match on the held-out prompts above the majority answer's share, the run
   directory holds what it should, nothing is left running; its model becomes the champion (there is none yet);
2. a run with ``train.init_from=champion`` starts from the champion's weights (its "before" held-out loss is the
   champion's "after"), trains further, and is promoted. Neither run starts an evaluation job: each train job measures
   the model it trained in itself (the first also the model as built), and the second's champion figure is the one
   the champion's own record holds for the same held-out examples (the same evaluation key). It is as small as its
   assertions allow: no slice check, one epoch.

Both runs score the answers with a team's scorer as well (``eval.scorer``: ``trainers.scorers.prefix``, a module of
the trainer image's code, imported and run in the train job's rank-0 Ray worker), and the second's gate holds a guard
on its figure (``gate.guards=scorer>=-0.2``): the figure is in the summary, the answers and the side-by-side page,
each version's provenance (with where the scorer resolved) and the gate's decision. The second run's real figures,
put through the gate's decision with a strict guard (``scorer>=0``), keep the champion and name the guard.

then `tpupipe models rollback` moves the champion back and `tpupipe models show` lists every provenance field. A run
that is registered and not promoted is the Vertex AI gate test's second job (tests/vertex/test_vertex_pipeline.py,
the same gate code over the other registry), and how a local run prints that decision,
tests/component/test_components_local.py."""

import collections
import json
import subprocess

import pytest

from components.platforms.local.processes import run_processes
from components.registry import PROVENANCE_FIELDS, open_registry
from components.stages import gate as gate_stage
from components.stages import task_gate
from components.stages.table import STAGES
from components.workload import resolve
from tests.helpers import (
    REPO,
    assert_goodput_accounts,
    assert_nothing_left,
    tpupipe_cmd,
    tpupipe_run,
    trainer_steps,
    unique_run_id,
)
from trainers import data, metrics

pytestmark = pytest.mark.e2e

MODEL = "local-fsdp"  # the registered model: the preset's name (gate.model is empty)
SCORER = "trainers.scorers.prefix:prefix_credit"  # a team's scorer in the trainer image's code (trainers/scorers/)
# The second run's partial credit falls while its exact match rises (measured, seed 0: 0.756 to 0.679 as 0.609 to
# 0.656): this loose guard holds, so the run is promoted as the recurring run it shows; the same figures under the
# strict guard keep the champion (test_a_strict_guard_on_the_real_figures_keeps_the_champion_and_names_itself).
GUARD = "scorer>=-0.2"
STRICT_GUARD = "scorer>=0"
RUNS = {  # run -> its overrides, in order (its run id: this test session's own, unique_run_id)
    # The default, `make run`'s, piped, with the team's scorer beside the built-in metrics: it scores the answers,
    # nothing of training changes.
    "gate-1": (f"eval.scorer={SCORER}",),
    # On a terminal, from the champion, on as many hosts as gate-1: the held-out figure's and the answers' keys hold
    # the worker group's size (which examples share a batch) and the scorer with its module's source, so the
    # champion's records are this run's to reuse.
    "gate-2": (
        "cluster.slice_check=false train.init_from=champion epochs=1",
        f"eval.scorer={SCORER} gate.guards={GUARD}",
    ),
}


def tpupipe(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([*tpupipe_cmd(), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two runs, in order, each with its process, summary and the registry as it left it."""
    root = tmp_path_factory.mktemp("runs")
    out = {"root": root}
    for name, overrides in RUNS.items():
        run_id = unique_run_id(name)
        proc = tpupipe_run(root, run_id, *overrides, tty=name == "gate-2")
        summary_file = root / run_id / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
        registry = open_registry(root)
        champion = registry.champion(MODEL) if MODEL in registry.models() else None
        out[name] = {
            "run_id": run_id,
            "run_dir": root / run_id,
            "proc": proc,
            "summary": summary,
            "champion": champion.version if champion else None,
        }
    return out


def _ok(run: dict) -> dict:
    proc = run["proc"]
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert run["summary"]["status"] == "succeeded"
    return run["summary"]


def test_the_first_run_becomes_the_champion(runs):
    summary = _ok(runs["gate-1"])
    gate = summary["gate"]
    assert (gate["ref"], gate["decision"], gate["promoted"]) == (f"{MODEL}@1", "promote", True)
    assert gate["champion_loss"] is None  # nothing to measure against
    assert runs["gate-1"]["champion"] == "1"
    stages = {s["name"]: s["status"] for s in summary["stages"]}
    assert stages["register"] == stages["promote"] == "succeeded"
    assert f"gate: promoted {MODEL}@1 to champion: there was no champion yet" in runs["gate-1"]["proc"].stdout


def test_pipeline_succeeds_and_fine_tuning_lowers_heldout_loss(runs):
    run_dir, proc = runs["gate-1"]["run_dir"], runs["gate-1"]["proc"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded"
    assert [s["name"] for s in summary["stages"]] == list(STAGES)
    assert all(s["status"] == "succeeded" and s["seconds"] >= 0 for s in summary["stages"])
    losses = summary["train_losses"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    # the held-out loss is over the responses alone (trainers.data.LABELS): the capitals asked in phrasings never
    # trained for their country. Measured on this setup, seed 0: 4.64 to 0.34 (0.07x) in the 128 steps; the bound
    # leaves room for other threads and hosts.
    assert summary["eval_loss_after"] < 0.3 * summary["eval_loss_before"]
    assert summary["tokens_per_s"] > 0
    # The terminal (here a pipe) got the stages' progress and the summary; kfp.local's whole output is in the log.
    shown, log = proc.stdout.splitlines(), (run_dir / "logs" / "pipeline.log").read_text()
    # `make run`'s at most 70 lines (docs/local.md), the task metrics' included: this run's less the line its
    # scorer adds to the summary (the default run has no scorer; the "evaluate:" line holds its figure too)
    default = [line for line in shown if not line.startswith("  scorer   ")]
    assert len(default) == len(shown) - 1 and len(default) <= 70, proc.stdout
    assert "KFP Executor" in log and "[train] " in log and "KFP Executor" not in proc.stdout
    assert all(f"== {stage} (" in proc.stdout for stage in STAGES), proc.stdout
    assert "train: succeeded (" in proc.stdout and "progress train [" in proc.stdout, proc.stdout
    assert "] 128/128 steps  loss " in proc.stdout, proc.stdout
    # The train job measured both figures in itself: no evaluation job, its seconds the ledger's evaluation.
    evaluation = json.loads((run_dir / "stages" / "evaluate.json").read_text())["result"]
    assert "job" not in evaluation and "] 8/8 batches" not in proc.stdout, proc.stdout
    assert evaluation["measured_by"] == {"before": "the train job", "after": "the train job"}
    assert "evaluate: no evaluation job: every figure is known" in proc.stdout
    categories = {c["name"]: c for c in summary["goodput"]["categories"]}
    assert categories["evaluation"]["seconds"] > 0
    # On a terminal a bar is drawn in place: each of its updates a line of the run's log, one line of the terminal.
    terminal, log = runs["gate-2"]["proc"].stdout, (runs["gate-2"]["run_dir"] / "logs" / "pipeline.log").read_text()
    assert terminal.count("\n") <= 70 and "\r\x1b[2K    progress train [" in terminal, terminal
    bars = [line for line in terminal.split("\n") if "progress train [" in line]
    assert len(bars) == 1 and log.count("progress train [") == bars[0].count("progress train [") > 1, terminal


def test_the_run_accounts_for_every_chip_second_and_every_step(runs):
    """The goodput ledger sums to the run's wall time and its billed chip-seconds; the summary has one record per
    step of the trainer's log (the loss plot's points); the timeline page is self-contained; `tpupipe show` prints
    the summary again, goodput included."""
    run_dir, proc = runs["gate-1"]["run_dir"], runs["gate-1"]["proc"]
    summary = json.loads((run_dir / "summary.json").read_text())
    categories = assert_goodput_accounts(summary)
    assert summary["goodput"]["usd"] == 0.0 and summary["goodput"]["chip_kind"] == "emulated host"
    assert categories["lost to failures"]["seconds"] == 0 and categories["checkpoint saves"]["seconds"] > 0
    assert "  goodput              " in proc.stdout and "host-minutes billed ($0.00); most to " in proc.stdout
    steps = trainer_steps((run_dir / "logs" / "train.log").read_text())
    assert steps == list(range(1, 129))  # 512 examples / (8 x 2 workers) = 32 steps an epoch, 4 epochs
    assert [s["step"] for s in summary["steps"]] == steps and all(s["loss"] > 0 for s in summary["steps"])
    page = (run_dir / "timeline.html").read_text()
    assert "<svg" in page and "train" in page and "Goodput" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing to fetch
    shown = subprocess.run(
        [*tpupipe_cmd(), "show", str(run_dir)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert shown.splitlines()[0].startswith(f"tpupipe run {summary['run_id']}") and "  goodput  " in shown
    # What the Ray processes logged, kept from the session directories teardown deleted (each file's tail, bounded).
    kept = run_dir / "logs" / "ray"
    assert (kept / "head" / "gcs_server.out").is_file() and list(kept.glob("host*/raylet.out"))
    assert all(f.stat().st_size <= 129 * 1024 for f in kept.rglob("*"))


def test_slice_check_runs_before_training_with_its_figures_in_the_summary(runs):
    run_dir, proc = runs["gate-1"]["run_dir"], runs["gate-1"]["proc"]
    check = json.loads((run_dir / "summary.json").read_text())["slice_check"]
    assert check["ok"] and (check["device"], check["backend"]) == ("cpu", "gloo")
    assert (check["num_ranks"], check["num_hosts"], check["ranks_verified"]) == (2, 2, 2)
    assert check["all_reduce"] == check["expected_all_reduce"] == 3
    assert 0 <= check["max_abs_diff"] < 1e-2 and check["seconds"] > 0 and check["bad"] == []
    assert check["devices_checked"] == 2  # each device computed the block alone first
    # A 32 MiB all-reduce timed on every rank, above the local floor (stated as CPU gloo's, not a TPU figure).
    assert check["bandwidth_bytes"] == 32 * 2**20 and check["floor_gbytes_per_s"] == 0.02
    assert check["gbytes_per_s"] >= check["floor_gbytes_per_s"] and "CPU gloo" in check["floor_source"]
    assert "slice check          2/2 ranks verified" in proc.stdout
    assert "slice bandwidth      all-reduce of 32 MiB: " in proc.stdout


def test_run_directory_holds_checkpoint_plots_and_summary(runs):
    run_dir, proc = runs["gate-1"]["run_dir"], runs["gate-1"]["proc"]
    checkpoint = run_dir / "checkpoint"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
    assert (run_dir / "loss.png").read_bytes()[:4] == b"\x89PNG"
    # The datasets cache was each host's own (its temporary directory, gone with the run), not the shared run dir;
    # the run's own copy of the cache kept across runs (components.workload.cache_trust) is its only cache there.
    own = run_dir / "cache"
    assert [p for p in run_dir.rglob("*") if "cache" in p.name and p != own and own not in p.parents] == []
    assert "data:image/png;base64," in (run_dir / "loss.html").read_text()  # self-contained: the PNG inline
    assert proc.stdout.rstrip().splitlines()[-1] == str(run_dir)
    for needle in ("held-out loss", "untrained", "trained", "tokens/s", "deploy_raycluster"):
        assert needle in proc.stdout


def test_successful_run_leaves_no_process_and_no_port(runs):
    run_dir = runs["gate-1"]["run_dir"]
    assert_nothing_left(run_dir, run_dir.name)


def test_a_run_from_the_champion_starts_at_its_figure_trains_better_and_is_promoted(runs):
    summary = _ok(runs["gate-2"])
    registry = open_registry(runs["root"])
    first = registry.get(MODEL, "1")
    # init_from=champion: the weights training started from are the champion's, so the held-out loss "before" is the
    # champion's "after".
    assert summary["init_from"] == f"{MODEL}@1"
    assert summary["eval_loss_before"] == pytest.approx(first.provenance["eval_loss_after"], rel=1e-5)
    gate = summary["gate"]
    assert gate["champion_loss"] == pytest.approx(summary["eval_loss_before"], rel=1e-6)
    assert (gate["ref"], gate["decision"], gate["promoted"]) == (f"{MODEL}@2", "promote", True)
    assert gate["eval_loss"] < gate["champion_loss"]
    assert runs["gate-2"]["champion"] == "2" and registry.history(MODEL)[-2:] == ["1", "2"]
    # The slice check switched off: the summary says so.
    assert summary["slice_check"] == {"skipped": True, "reason": "cluster.slice_check=false"}
    assert "slice check          off (cluster.slice_check=false)" in runs["gate-2"]["proc"].stdout
    second = registry.get(MODEL, "2")
    assert second.provenance["base_model"] == f"{MODEL}@1" and second.provenance["eval_loss_before"] == pytest.approx(
        summary["eval_loss_before"]
    )
    assert second.provenance["champion_measured"] == f"{MODEL}@1"
    # Measured once: the champion's figure (and the "before" model's, the same version) is its own record's.
    evaluation = json.loads((runs["gate-2"]["run_dir"] / "stages" / "evaluate.json").read_text())["result"]
    assert "job" not in evaluation and gate["champion_loss"] == first.provenance["eval_loss_after"]
    assert evaluation["measured_by"]["champion"] == evaluation["measured_by"]["before"] == f"{MODEL}@1's record"
    assert second.provenance["eval_key"] == first.provenance["eval_key"] == evaluation["eval_key"]
    assert second.provenance["eval_loss_after"] == pytest.approx(gate["eval_loss"])
    out = runs["gate-2"]["proc"].stdout
    assert f"  started from         {MODEL}@1" in out and f"gate: promoted {MODEL}@2 to champion" in out
    assert run_processes(runs["gate-2"]["run_id"]) == []


def _paired_mean(rows: list[dict], metric: str, other: str) -> float:
    """The mean of (candidate - ``other``) in ``metric`` over the merged answers file's rows."""
    return sum(r["scores"][metric] - r[other]["scores"][metric] for r in rows) / len(rows)


def test_the_default_run_answers_the_prompts_before_and_after_training_side_by_side(runs):
    """The default run's train job answers the first 64 held-out prompts before and after training; the summary
    prints each task metric before and after and the gate's reason, and the run directory holds the answers and the
    side-by-side page with at least 16 examples, and the majority answer's share of them (what answering the most
    common capital to every prompt scores) is what the exact match is read against. The generated task's held-out
    prompts ask the taught facts in phrasings never trained for their country (trainers/data.py); the preset's 128
    steps carry the facts to them: the exact match is clearly above the majority answer's share.

    What carries weight is per question, not per row: the 64 prompts ask only 8 questions (one per country, 6 to 10
    phrasings each), so the test asks for at least 3 of the 8 countries answered right (most of their prompts
    exactly), and the interval resamples the 8 countries, not the 64 rows (components/stages/answers.py). The "before"
    figure is 0 on every row, so an interval above 0 says little by itself. The preset's batch and epochs (8 x 4) were
    chosen by measuring this very held-out split with one seed (seed 0; docs/local.md, "The generated data"): the
    figures are tuned on the split they are reported on, not an estimate on new data. Measured on this setup, seed 0
    (2 CPU hosts, 2 shared cores), the same in two runs: exact match 0.000 untrained and 0.609 trained (five
    countries of eight) against a majority share of 0.156, the rise's interval over the 8 countries [+0.275, +0.884];
    with seed 1, once, 0.125 (one country), under its majority share of 0.156."""
    summary, run_dir = _ok(runs["gate-1"]), runs["gate-1"]["run_dir"]
    task = summary["task"]
    assert task["num_examples"] == 64 and task["against"] == "before training"
    assert set(task["comparison"]) == set(task["metrics_after"]) == set(task["metrics_before"])
    out = runs["gate-1"]["proc"].stdout
    before, after = task["metrics_before"]["exact_match"], task["metrics_after"]["exact_match"]
    rows = [json.loads(line) for line in (run_dir / "eval" / "answers.jsonl").read_text().splitlines()]
    majority = max(collections.Counter(r["reference"] for r in rows).values()) / len(rows)
    assert 0 < majority < 0.5 and {r["reference"] for r in rows} <= {capital for _, capital in data.CAPITALS}
    exact = task["comparison"]["exact_match"]
    assert [exact["candidate"], exact["other"], exact["difference"]] == pytest.approx([after, before, after - before])
    assert exact["difference"] == pytest.approx(_paired_mean(rows, "exact_match", "before training"))
    assert after >= majority + 0.25, (task["metrics_after"], majority)
    # Per question: the countries answered right (most of their prompts exactly), at least 3 of the 8.
    asked = collections.defaultdict(list)
    for r in rows:
        asked[r["reference"]].append(r["scores"]["exact_match"])
    right = sorted(capital for capital, scores in asked.items() if sum(scores) > len(scores) / 2)
    assert len(asked) == 8 and len(right) >= 3, (right, dict(asked))
    # The interval resampled the 8 questions (clusters by reference answer), not the 64 rows.
    assert exact["clusters"] == 8 and exact["low"] > 0, exact
    assert f"  exact_match          untrained {before:.3f}   trained {after:.3f}" in out, out
    assert "  gate: promoted" in out
    page = (run_dir / "eval" / "side_by_side.md").read_text()
    assert page.count("| Instruction: ") >= 16 and "| exact_match |" in page and "Gate: promoted" in page
    assert len(rows) == 64 and {"prompt", "reference", "answer", "before training"} <= set(rows[0])
    first = open_registry(runs["root"]).get(MODEL, "1").provenance
    assert first["task_metrics"] == task["metrics_after"] and first["generation_key"] == task["generation_key"]


def test_a_recurring_run_reuses_the_champions_answers_under_the_same_key(runs):
    """The second run's champion answered the same prompts under the same generation key in the first run: its
    recorded answers are read back, no evaluation job starts, and the trained model is compared with them. Its 32
    further steps (160 in all) keep its exact match clearly above the majority answer's share; the champion is there
    already, so what one more epoch adds is within the paired interval, which is not asserted above 0. Measured on
    this setup, seed 0: 0.656 against the champion's 0.609 and the majority share of 0.156. Each difference is the
    mean of the candidate's scores less the champion's over the merged answers file's rows."""
    _ok(runs["gate-2"])
    evaluation = json.loads((runs["gate-2"]["run_dir"] / "stages" / "evaluate.json").read_text())["result"]
    task = evaluation["task"]
    assert "job" not in evaluation
    assert task["against"] == "champion" and task["champion_answers"] == f"recorded by {MODEL}@1"
    first = open_registry(runs["root"]).get(MODEL, "1").provenance
    assert task["generation_key"] == first["generation_key"] and task["metrics_other"] == first["task_metrics"]
    assert set(task["comparison"]) == set(first["task_metrics"])
    answers = runs["gate-2"]["run_dir"] / "eval" / "answers.jsonl"
    rows = [json.loads(line) for line in answers.read_text().splitlines()]
    majority = max(collections.Counter(r["reference"] for r in rows).values()) / len(rows)
    assert task["metrics_after"]["exact_match"] >= majority + 0.25, (task["metrics_after"], majority)
    exact = task["comparison"]["exact_match"]
    assert exact["other"] == first["task_metrics"]["exact_match"]
    champion_rows = (runs["gate-1"]["run_dir"] / "eval" / "answers.jsonl").read_text().splitlines()
    assert [r["champion"]["scores"] for r in rows] == [json.loads(line)["scores"] for line in champion_rows]
    for metric, row in task["comparison"].items():  # candidate less champion, row by row, as the files hold them
        assert row["difference"] == pytest.approx(_paired_mean(rows, metric, "champion")), metric


def test_a_team_scorer_runs_in_the_train_jobs_worker_and_its_figure_reaches_every_record(runs):
    """``eval.scorer`` names a module of the trainer image's code (trainers/scorers/prefix.py): the train job's
    rank-0 Ray worker imports it and scores every answer with it (trainers.generation.record; no stage of the
    pipeline's own process scores an answer), so each answer's ``scorer`` score is the function's value for that
    answer. The figure (the first run's before and after training, the second's beside the champion's) is in the
    summary and its printed table, on the side-by-side page and in each version's provenance; in the second run the
    gate's guard on it compares it with the champion's recorded figure, held, and the summary says so. Measured on
    this setup, seed 0: 0.000 to 0.756 in the first run (exact match 0.609); 0.679 in the second against the
    champion's 0.756, a difference of -0.077 within the guard's -0.2."""
    from trainers.scorers.prefix import prefix_credit

    for name in RUNS:
        summary, run_dir = _ok(runs[name]), runs[name]["run_dir"]
        task = summary["task"]
        rows = [json.loads(line) for line in (run_dir / "eval" / "answers.jsonl").read_text().splitlines()]
        credit = [prefix_credit(r["prompt"], r["reference"], r["answer"]) for r in rows]
        assert [r["scores"]["scorer"] for r in rows] == pytest.approx(credit)
        assert task["metrics_after"]["scorer"] == pytest.approx(sum(credit) / len(credit))
        # partial credit: at least exact match's figure, and the trained answers earn it
        assert task["metrics_after"]["scorer"] >= task["metrics_after"]["exact_match"] > 0
        after = task["metrics_after"]["scorer"]
        shown = (
            f"trained {after:.3f}   champion {task['metrics_other']['scorer']:.3f}"
            if name == "gate-2"
            else f"untrained {task['metrics_before']['scorer']:.3f}   trained {after:.3f}"
        )
        assert f"  scorer               {shown}   [" in runs[name]["proc"].stdout, runs[name]["proc"].stdout
        assert "| scorer |" in (run_dir / "eval" / "side_by_side.md").read_text()
        version = summary["gate"]["ref"].split("@")[1]
        assert open_registry(runs["root"]).get(MODEL, version).provenance["task_metrics"] == task["metrics_after"]
    assert runs["gate-1"]["summary"]["gate"]["guards"] == []  # no champion: nothing to guard against
    gate, task = runs["gate-2"]["summary"]["gate"], runs["gate-2"]["summary"]["task"]
    difference = task["comparison"]["scorer"]["difference"]
    assert task["metrics_other"]["scorer"] == runs["gate-1"]["summary"]["task"]["metrics_after"]["scorer"]
    assert (gate["decided_by"], gate["guard_failed"], gate["decision"]) == ("eval_loss", None, "promote")
    assert gate["guards"] == [{"guard": GUARD, "difference": pytest.approx(difference), "held": True}]
    assert f"  gate guard           {GUARD} held (difference {difference:+.4f})" in runs["gate-2"]["proc"].stdout
    # Where the scorer resolved, in each version's provenance: its file in the trainer's scorers package and the
    # digest of every Python file there (trainers.metrics.resolve_scorer, run in the train job).
    for version in ("1", "2"):
        provenance = open_registry(runs["root"]).get(MODEL, version).provenance
        assert (provenance["scorer"], provenance["scorer_file"]) == (SCORER, "trainers/scorers/prefix.py")
        assert provenance["scorer_digest"] == metrics.package_digest(REPO / "trainers" / "scorers")


def test_a_strict_guard_on_the_real_figures_keeps_the_champion_and_names_itself(runs):
    """The second run's real comparison with its champion, put through the gate's own decision (the held-out loss's,
    then the task gate's, as the register stage calls them) with ``gate.guards=scorer>=0``: its loss alone promotes
    it, and its partial credit fell (measured, seed 0: -0.077), so the guard fails, the champion is kept and the
    decision names the guard. No run of its own: the figures are the run's."""
    summary = _ok(runs["gate-2"])
    evaluation = json.loads((runs["gate-2"]["run_dir"] / "stages" / "evaluate.json").read_text())["result"]
    task, new_ref, champion_ref = evaluation["task"], summary["gate"]["ref"], f"{MODEL}@1"
    difference = task["comparison"]["scorer"]["difference"]
    assert difference < 0, task["comparison"]["scorer"]  # what a strict guard is there to catch
    spec = resolve("local-fsdp", f"{RUNS['gate-2'][0]} eval.scorer={SCORER} gate.guards={STRICT_GUARD}")
    on_loss = gate_stage.decide(
        evaluation["eval_loss_after"], evaluation["champion_loss"], spec.gate.min_improvement, new_ref, champion_ref
    )
    assert on_loss.decision == gate_stage.PROMOTE == summary["gate"]["decision"]
    decision, detail = task_gate.decide(spec, on_loss, task, new_ref, champion_ref)
    assert (decision.decision, detail["guard_failed"], detail["decided_by"]) == (
        gate_stage.KEEP,
        STRICT_GUARD,
        "eval_loss",
    )
    assert f"kept champion {champion_ref}: guard {STRICT_GUARD} failed ({new_ref} - champion = {difference:+.4f})" in (
        decision.reason
    )
    assert detail["guards"] == [{"guard": STRICT_GUARD, "difference": difference, "held": False}]


def test_rollback_moves_the_champion_back_and_show_lists_the_provenance(runs):
    root = str(runs["root"])
    shown = tpupipe("models", "show", f"{MODEL}@2", "--output-root", root, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = {
        line.split()[0]: line.split(None, 1)[1] if len(line.split()) > 1 else ""
        for line in shown.stdout.splitlines()
        if line.startswith("    ")
    }
    assert set(PROVENANCE_FIELDS) <= set(lines)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    second = open_registry(root).get(MODEL, "2").provenance
    assert (
        lines["preset"] == "local-fsdp"
        and lines["run_id"] == runs["gate-2"]["run_id"]
        and lines["base_model"] == f"{MODEL}@1"
    )
    assert lines["git_sha"] == head and lines["accelerator"] == "cpu" and lines["slices"] == "1"
    assert lines["spec_hash"].startswith("sha256:") and lines["data_snapshot"].startswith("sha256:")
    assert lines["trainer_image"].startswith("local/torch@sha256:")
    assert int(lines["tokens_seen"]) == second["tokens_seen"] > 0
    assert (lines["restarts"], lines["preemptions"], lines["topology"]) == ("0", "0", "-")
    assert lines["pipeline_job"] != "-" and float(lines["eval_loss_after"]) == pytest.approx(
        runs["gate-2"]["summary"]["eval_loss_after"]
    )
    # Same examples in every run: one data snapshot.
    snapshots = {v.provenance["data_snapshot"] for v in open_registry(root).versions(MODEL)}
    assert len(snapshots) == 1

    back = tpupipe("models", "rollback", MODEL, "--output-root", root, timeout=120)
    assert back.returncode == 0, back.stderr
    assert back.stdout == f"{MODEL}: champion moved back to version 1 (from 2)\n"
    assert open_registry(root).champion(MODEL).version == "1"
    listed = tpupipe("models", "list", MODEL, "--output-root", root, timeout=120)
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("1", "champion"), ("2", "-")]
