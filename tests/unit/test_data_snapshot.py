"""A run's data snapshot on local files (components/data/snapshot.py, components/stages/dataset.py): the shapes
``train.dataset`` takes and the errors that name the field before anything is created; what a snapshot pins; only
what is new since the champion; the held-out split; the first stage's result and the manifest it keeps; `tpupipe
data`. Cloud Storage and BigQuery sources have their own tests beside their emulators."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from components.data import snapshot
from components.platforms import RunContext
from components.platforms.store import LocalStore, read_json
from components.spec import SpecError, datasets
from components.stages import dataset
from components.workload import resolve

WHEN = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def _rows(seed: int, count: int = 30) -> list[dict]:
    return [{"instruction": f"Repeat w{seed}x{i} twice.", "response": f"w{seed}x{i} w{seed}x{i}"} for i in range(count)]


def _write(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def drops(tmp_path):
    _write(tmp_path / "sft" / "2026-12-01.jsonl", _rows(1))
    _write(tmp_path / "sft" / "2026-12-02.jsonl", _rows(2))
    (tmp_path / "sft" / "README.txt").write_text("not data")
    return tmp_path / "sft"


# ---------------------------------------------------------------- the shapes, checked before anything


@pytest.mark.parametrize(
    ("dataset", "kind"),
    [
        ("generated", "generated"),
        ("databricks/databricks-dolly-15k", "hub"),
        ("./sft/", "local"),
        ("/data/sft/*.jsonl", "local"),
        ("a.parquet", "local"),
        ("gs://my-bucket/sft/{date}/", "gcs"),
        ("gs://my-bucket/sft/*.jsonl", "gcs"),
        ("bq://my-project.sft.examples", "bigquery"),
    ],
)
def test_a_dataset_is_read_by_its_shape(dataset, kind):
    assert datasets.kind(dataset) == kind
    assert datasets.snapshotted(dataset) == (kind in ("local", "gcs", "bigquery", "hub"))  # a hub one: data.hub
    assert datasets.is_drop(dataset) == (kind in ("local", "gcs", "bigquery"))


def test_a_cloud_storage_prefix_with_the_schedules_date_validates_without_a_call():
    spec = resolve("gemma4-e2b-v6e-16", "train.dataset=gs://my-bucket/sft/{date}/*.jsonl")
    assert datasets.render(spec.train.dataset, WHEN) == "gs://my-bucket/sft/2026-12-02/*.jsonl"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("train.dataset=gs://my-bucket/sft/{day}/", "train.dataset: unknown placeholder {day}"),
        ("train.dataset=s3://bucket/sft/", "train.dataset: s3:// is not a source tpupipe reads"),
        ("train.dataset=gs://B/sft/", "train.dataset: not a Cloud Storage URI"),
        ("train.dataset=bq://my-project.sft", "train.dataset: not a BigQuery table"),
        ("train.dataset=/no/such/dir/", "train.dataset: file not found: /no/such/dir/"),
        ("train.eval_dataset=databricks/databricks-dolly-15k", "train.eval_dataset: a fixed evaluation set is"),
        ("train.dataset_filter=x>1", "train.dataset_filter: applies to a bq:// train.dataset only"),
        # A filter is COLUMN=VALUE pairs, never SQL: a subquery (another table) is refused before anything runs.
        (
            "train.dataset=bq://my-project.sft.examples train.dataset_filter=EXISTS(SELECT(secret)FROM(p.d.t))",
            "train.dataset_filter: 'EXISTS(SELECT(secret)FROM(p.d.t))' is not COLUMN=VALUE",
        ),
        (
            "train.dataset=bq://my-project.sft.examples train.dataset_filter=lang=en,(SELECT(1))=1",
            "train.dataset_filter: '(SELECT(1))=1' is not COLUMN=VALUE",
        ),
        ("train.data_since=champion", "train.data_since: needs a snapshotted drop (local files, gs://, bq://)"),
        ("train.data_since=yesterday", "train.data_since: unknown value 'yesterday'"),
        (
            "train.dataset=bq://my-project.sft.examples train.data_since=champion",
            "train.data_since: a bq:// dataset needs train.dataset_time_column",
        ),
        (
            "train.dataset=gs://my-bucket/sft/ train.data_since=champion",
            "train.data_since: trains only on what the champion has not seen, so it continues from the champion: it "
            "needs train.init_from=champion",
        ),
        (
            "train.dataset=gs://my-bucket/sft/ train.data_since=champion train.init_from=local-fsdp@3",
            "train.data_since: trains only on what the champion has not seen, so it continues from the champion: it "
            "needs train.init_from=champion (got train.init_from='local-fsdp@3')",
        ),
    ],
)
def test_a_bad_dataset_is_refused_naming_its_field(overrides, message):
    with pytest.raises(SpecError) as err:
        resolve("local-fsdp", overrides)
    assert str(err.value).startswith(message)


def test_validate_refuses_data_since_without_init_from_naming_both_exit_2(capsys):
    """`tpupipe validate` (and every command that resolves a spec): data_since=champion alone would train the base on
    one day's data yet record all the champion saw as seen."""
    from pipelines.cli.main import main

    argv = ["validate", "local-fsdp", "--set", "train.dataset=gs://my-bucket/sft/ train.data_since=champion"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("tpupipe: error: train.data_since: ") and "train.init_from=champion" in line, line
    assert main([*argv[:-1], argv[-1] + " train.init_from=champion"]) == 0


# ---------------------------------------------------------------- what a snapshot pins


def test_a_directory_is_every_data_file_under_it_each_pinned_by_its_bytes(drops):
    spec = resolve("local-fsdp", f"train.dataset={drops}/")
    manifest, train, heldout = snapshot.take(spec, WHEN, log=lambda line: None)
    names = [item["uri"].rsplit("/", 1)[1] for item in manifest["train"]["items"]]
    assert names == ["2026-12-01.jsonl", "2026-12-02.jsonl"]  # the README is no data
    assert all(item["generation"].startswith("sha256:") for item in manifest["train"]["items"])
    assert len(train) + len(heldout) == 60 == manifest["num_train_examples"] + manifest["num_heldout_examples"]
    assert heldout and all(snapshot._heldout(e) for e in heldout) and not any(snapshot._heldout(e) for e in train)
    assert manifest["fields"] == ["instruction", "response"] and manifest["tokens_estimate"] > 0
    again, _, _ = snapshot.take(spec, WHEN, log=lambda line: None)
    assert again["digest"] == manifest["digest"]  # the same files: the same snapshot
    _write(drops / "2026-12-02.jsonl", _rows(2, count=31))
    changed, _, _ = snapshot.take(spec, WHEN, log=lambda line: None)
    assert changed["digest"] != manifest["digest"]  # a file changed: another snapshot


def test_a_glob_and_the_schedules_date_pick_one_drop(drops):
    spec = resolve("local-fsdp", f"train.dataset={drops}/{{date}}.jsonl")
    manifest, _, _ = snapshot.take(spec, WHEN, log=lambda line: None)
    assert manifest["dataset"] == f"{drops}/2026-12-02.jsonl"
    assert [i["num_examples"] for i in manifest["train"]["items"]] == [30]


def test_only_what_the_champion_has_not_seen(drops):
    spec = resolve("local-fsdp", f"train.dataset={drops}/ train.data_since=champion train.init_from=champion")
    first, _, _ = snapshot.take(spec, WHEN, None, "", log=lambda line: None)
    assert len(first["seen"]) == 2 and first["since"] is None  # no champion yet: everything is new
    nothing, train, heldout = snapshot.take(spec, WHEN, first, "local-fsdp@1", log=lambda line: None)
    assert nothing["skip"] == f"no examples since champion local-fsdp@1, snapshot {first['digest']}"
    assert (train, heldout) == ([], [])
    _write(drops / "2026-12-03.jsonl", _rows(3))
    third, train, heldout = snapshot.take(spec, WHEN, first, "local-fsdp@1", log=lambda line: None)
    assert [i["uri"].rsplit("/", 1)[1] for i in third["train"]["items"]] == ["2026-12-03.jsonl"]
    assert len(train) + len(heldout) == 30 and len(third["seen"]) == 3


def test_a_parquet_drop_is_read_row_by_row_and_a_file_that_is_not_parquet_is_named(tmp_path):
    pa = pytest.importorskip("pyarrow")  # in the components image and the dev environment (images/pipeline)
    import pyarrow.parquet as pq

    (tmp_path / "sft").mkdir()
    pq.write_table(pa.Table.from_pylist(_rows(4)), tmp_path / "sft" / "part-0.parquet")
    spec = resolve("local-fsdp", f"train.dataset={tmp_path}/sft/")
    manifest, train, heldout = snapshot.take(spec, WHEN, log=lambda line: None)
    assert [i["num_examples"] for i in manifest["train"]["items"]] == [30]
    assert sorted(e["instruction"] for e in [*train, *heldout]) == sorted(r["instruction"] for r in _rows(4))
    (tmp_path / "sft" / "part-1.parquet").write_bytes(b"PAR1 but not really")
    with pytest.raises(SpecError) as err:
        snapshot.take(spec, WHEN, log=lambda line: None)
    assert err.value.field == "train.dataset" and "part-1.parquet: not Parquet" in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"instruction": "a", "response": "b"}\n{not json\n', "a.jsonl, line 2: not JSON Lines"),
        ('{"instruction": "a"}\n', "a.jsonl, line 1: the example lacks response"),
        ('["a", "b"]\n', "a.jsonl, line 1: an example is a JSON object, got list"),
        ("\n\n", "a.jsonl: no examples"),
    ],
)
def test_bad_data_names_the_file_and_line(tmp_path, text, message):
    (tmp_path / "a.jsonl").write_text(text)
    spec = resolve("local-fsdp", f"train.dataset={tmp_path}/a.jsonl")
    with pytest.raises(SpecError) as err:
        snapshot.take(spec, WHEN, log=lambda line: None)
    assert err.value.field == "train.dataset" and message in str(err.value)


def test_a_fixed_evaluation_set_is_snapshotted_apart_and_never_filtered(drops, tmp_path):
    _write(tmp_path / "eval" / "eval.jsonl", _rows(9, count=12))
    spec = resolve("local-fsdp", f"train.dataset={drops}/ train.eval_dataset={tmp_path}/eval/")
    manifest, train, heldout = snapshot.take(spec, WHEN, log=lambda line: None)
    assert len(train) == 60 and len(heldout) == 12  # every new example trains; the set evaluates
    assert manifest["eval"]["digest"].startswith("sha256:") and manifest["eval"]["num_examples"] == 12


def test_duplicates_are_dropped_and_counted_whitespace_aside(tmp_path):
    """An example whose prompt fields repeat an earlier one's, runs of whitespace aside, is dropped and counted;
    another column does not make it another example."""
    rows = _rows(1)
    again = [
        {"instruction": f"  {rows[0]['instruction']}\n", "response": rows[0]["response"].replace(" ", "\t ")},
        {**rows[1], "source": "another column"},
        rows[2],
    ]
    _write(tmp_path / "sft" / "a.jsonl", rows)
    _write(tmp_path / "sft" / "b.jsonl", again)
    lines: list[str] = []
    manifest, train, heldout = snapshot.take(
        resolve("local-fsdp", f"train.dataset={tmp_path}/sft/"), WHEN, log=lines.append
    )
    assert manifest["duplicates"] == 3 and manifest["eval_overlap"] == 0
    assert len(train) + len(heldout) == 30 and manifest["train"]["num_examples"] == 33
    assert (
        f"snapshot: {tmp_path}/sft/: 3 duplicate example(s) dropped (the same prompt fields as an earlier one)" in lines
    )


def test_training_examples_also_in_the_evaluation_set_are_dropped_with_a_warning(tmp_path):
    """A training example that is also in the fixed evaluation set (whitespace aside) is left out of training, and
    the count recorded and said in one warning line; the evaluation set itself is kept whole."""
    evaluation = _rows(9, 12)
    _write(tmp_path / "eval.jsonl", evaluation)
    leaked = [evaluation[0], {**evaluation[1], "instruction": evaluation[1]["instruction"] + "  "}]
    _write(tmp_path / "sft" / "a.jsonl", _rows(1) + leaked)
    lines: list[str] = []
    spec = resolve("local-fsdp", f"train.dataset={tmp_path}/sft/ train.eval_dataset={tmp_path}/eval.jsonl")
    manifest, train, heldout = snapshot.take(spec, WHEN, log=lines.append)
    assert manifest["eval_overlap"] == 2 and manifest["num_train_examples"] == len(train) == 30
    assert len(heldout) == 12 and not {e["instruction"].strip() for e in train} & {e["instruction"] for e in evaluation}
    assert [line for line in lines if "warning" in line] == [
        f"snapshot: warning: {tmp_path}/sft/: 2 training example(s) also in the evaluation set "
        f"({tmp_path}/eval.jsonl) dropped from training"
    ]
    _write(tmp_path / "sft" / "a.jsonl", evaluation)  # nothing left to train on
    with pytest.raises(SpecError, match="^train.dataset: .*every one of its examples is also in the evaluation set"):
        snapshot.take(spec, WHEN, log=lambda line: None)


def test_the_stage_records_what_it_dropped_and_the_summary_shows_it(tmp_path):
    from components.stages import report

    rows = _rows(1)
    _write(tmp_path / "sft" / "a.jsonl", rows + rows[:4])
    _write(tmp_path / "eval.jsonl", _rows(9, 12) + rows[5:7])
    ctx = _ctx(tmp_path / "runs", f"train.dataset={tmp_path}/sft/ train.eval_dataset={tmp_path}/eval.jsonl")
    result = dataset.snapshot_data(ctx)
    assert (result["duplicates"], result["eval_overlap"], result["num_examples"]) == (4, 2, 28)
    manifest = read_json(ctx.store, dataset.MANIFEST)
    assert (manifest["duplicates"], manifest["eval_overlap"]) == (4, 2)
    summary = {"run_id": "r1", "preset": "p", "platform": "local", "stages": [], "status": "succeeded"}
    summary |= {"history": [], "interrupted": None, "run_dir": ctx.store.uri, "warning": None, "data": result}
    assert "  dropped              4 duplicate(s), 2 also in the evaluation set" in report.format_table(summary)


# ---------------------------------------------------------------- the first stage


def _ctx(tmp_path, overrides: str, run_id: str = "r1") -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="local"
    )


def test_the_first_stage_keeps_the_manifest_and_the_examples_and_a_retry_reads_them(drops, tmp_path):
    ctx = _ctx(tmp_path / "runs", f"train.dataset={drops}/")
    result = dataset.snapshot_data(ctx)
    manifest = read_json(ctx.store, dataset.MANIFEST)
    assert result["proceed"] == "train" and result["snapshot"] == manifest["digest"]
    assert result["manifest"] == f"{ctx.store.uri}/data/manifest.json"
    lines = (ctx.store.local() / "data" / "train.jsonl").read_text().splitlines()
    assert len(lines) == manifest["num_train_examples"]
    _write(drops / "2026-12-04.jsonl", _rows(4))  # arrives after the snapshot: a retried task still reads the first
    assert dataset.snapshot_data(ctx)["snapshot"] == manifest["digest"]
    dataset.stage_files(ctx)  # the train stage's copy to where the jobs read
    jobs = ctx.run_dir / "train" / "data"
    assert (jobs / "train.jsonl").read_text() == (ctx.store.local() / "data" / "train.jsonl").read_text()


def test_the_data_card_says_what_the_run_learns_from_and_the_summary_links_it(tmp_path):
    """The card: the source, each file's pinned generation, when, the counts, duplicates and overlap dropped, what
    was not read, the fields, a token estimate, the run's own copy with its digest, and a few sample rows; the
    stage's result (and so the run's summary) names it."""
    from components.stages import report

    rows = _rows(1)
    _write(tmp_path / "sft" / "a.jsonl", rows + rows[:3])
    _write(tmp_path / "sft" / "b.jsonl", [])  # an empty shard: not read, said so
    _write(tmp_path / "eval.jsonl", _rows(9, 12) + rows[4:5])
    ctx = _ctx(tmp_path / "runs", f"train.dataset={tmp_path}/sft/ train.eval_dataset={tmp_path}/eval.jsonl")
    result = dataset.snapshot_data(ctx)
    assert result["card"] == f"{ctx.store.uri}/data/card.md"
    card = (ctx.store.local() / "data" / "card.md").read_text()
    manifest = read_json(ctx.store, dataset.MANIFEST)
    generation = manifest["train"]["items"][0]["generation"]
    for expected in (
        f"# Data card: `{tmp_path}/sft/`",
        f"Snapshot `{manifest['digest']}`, taken as of {manifest['taken']}.",
        f"| `{tmp_path}/sft/a.jsonl` | `{generation}` | ",
        f"- evaluation set `{tmp_path}/eval.jsonl`: 13 examples, content `{manifest['eval']['digest']}`",
        "| read | 33 |",
        "| trained on | 29 |",
        "| duplicates dropped | 3 |",
        "| also in the evaluation set, dropped from training | 1 |",
        f"- warning: {tmp_path}/sft/b.jsonl: no examples, skipped",
        "| fields | `instruction`, `response` |",
        f"- train: `{ctx.store.uri}/data/train.jsonl` (`{manifest['copies']['train']['digest']}`)",
        json.dumps(rows[0]),
    ):
        assert expected in card, expected
    summary = {"run_id": "r1", "preset": "p", "platform": "local", "stages": [], "status": "succeeded"}
    summary |= {"history": [], "interrupted": None, "run_dir": ctx.store.uri, "warning": None, "data": result}
    assert f"  data card            {ctx.store.uri}/data/card.md" in report.format_table(summary)
    assert "card" in report.DATA_FIGURES


def test_a_generated_dataset_has_nothing_to_snapshot(tmp_path):
    result = dataset.snapshot_data(_ctx(tmp_path, ""))
    assert result == {"proceed": "train", "dataset": "generated", "snapshot": None}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2026-12-02T03:00:00Z", WHEN),
        ("2026-12-02T04:00:00+01:00", WHEN),
        ("{{$.pipeline_job_schedule_time_utc}}", None),  # a runner without schedules leaves it as it is
        ("", None),
    ],
)
def test_the_schedules_time_or_the_runs_start(given, expected):
    started = datetime(2026, 12, 4, tzinfo=UTC)
    assert dataset.scheduled(given, started) == (expected or started)


CREATED = datetime(2026, 12, 3, 9, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule_time", "create_time", "expected", "source"),
    [
        ("2026-12-02T03:00:00Z", "2026-12-03T09:30:00Z", WHEN, "the schedule time"),  # KFP 2.17, Vertex AI
        ("", "2026-12-03T09:30:00Z", CREATED, "create time"),  # no schedule started it
        ("1970-01-01T00:00:00Z", "2026-12-03T09:30:00Z", CREATED, "create time"),  # an epoch is no schedule
        ("", "", None, "this task's start"),  # KFP 2.16: both empty
        ("{{$.pipeline_job_schedule_time_utc}}", "{{$.pipeline_job_create_time_utc}}", None, "this task's start"),
    ],
)
def test_the_date_comes_from_the_schedule_then_the_create_time_then_the_start(
    schedule_time, create_time, expected, source
):
    started = datetime(2026, 12, 4, tzinfo=UTC)
    when, said = dataset.run_time(schedule_time, create_time, started)
    assert when == (expected or started) and source in said


def test_an_unreadable_schedule_time_is_refused():
    with pytest.raises(SpecError, match="^schedule_time: not an RFC 3339 time"):
        dataset.scheduled("yesterday")


def test_tpupipe_data_prints_the_snapshot_and_creates_nothing(drops, tmp_path, capsys):
    from pipelines.cli.main import main

    root = tmp_path / "runs"
    assert main(["data", "local-fsdp", "--output-root", str(root), "--set", f"train.dataset={drops}/"]) == 0
    out = capsys.readouterr().out
    assert "2 files:" in out and "fields               instruction, response" in out
    assert "snapshot             sha256:" in out and not root.exists()
    assert main(["data", "local-fsdp", "--set", f"train.dataset={drops}/nothing-*.jsonl"]) == 2
    assert "train.dataset: no .jsonl, .json, .parquet or .jsonl.gz file under" in capsys.readouterr().err


def test_tpupipe_data_date_is_the_day_every_date_form_is_taken_from(drops, tmp_path, capsys):
    """``--date`` is the schedule's day: ``{date-1}`` reads the day before's drop, ``{date:%d}`` that day in its
    format; a date that is not one, or a form that names a time, is exit 2 naming the flag or the field."""
    from pipelines.cli.main import main

    sets = ["data", "local-fsdp", "--output", "json", "--set"]
    assert main([*sets, f"train.dataset={drops}/{{date-1}}.jsonl", "--date", "2026-12-02"]) == 0
    assert json.loads(capsys.readouterr().out)["dataset"] == f"{drops}/2026-12-01.jsonl"
    assert main([*sets, f"train.dataset={drops}/2026-12-{{date-1:%d}}.jsonl", "--date", "2026-12-03"]) == 0
    assert json.loads(capsys.readouterr().out)["dataset"] == f"{drops}/2026-12-02.jsonl"
    assert main([*sets, f"train.dataset={drops}/{{date}}.jsonl", "--date", "2 December"]) == 2
    assert "--date: not a date: '2 December'" in capsys.readouterr().err
    assert main([*sets, f"train.dataset={drops}/{{date:%H}}.jsonl", "--date", "2026-12-02"]) == 2
    assert "train.dataset: {date:%H}: %H is not a date directive" in capsys.readouterr().err


def test_tpupipe_run_with_bad_data_exits_2_before_anything_starts(tmp_path, capsys):
    from pipelines.cli.main import main

    (tmp_path / "bad.jsonl").write_text('{"instruction": "only"}\n')
    root = tmp_path / "runs"
    code = main(["run", "--output-root", str(root), "--run-id", "bad", "--set", f"train.dataset={tmp_path}/bad.jsonl"])
    assert code == 2
    assert "train.dataset: " in capsys.readouterr().err
    ledger = json.loads((root / "bad" / "ledger.json").read_text())  # the run id claimed before the snapshot, no more
    assert not ledger.get("created") and not (root / "bad" / "data").exists()


def _champion(root, **provenance) -> None:
    """A registered, promoted version of local-fsdp in the local registry under ``root``."""
    from components.registry import PROVENANCE_FIELDS, open_registry

    fields = {name: None for name in PROVENANCE_FIELDS} | {"run_id": "r0", "preset": "local-fsdp"} | provenance
    registry = open_registry(root)
    version = registry.register("local-fsdp", str(root / "r0" / "train" / "ck"), fields)
    registry.promote("local-fsdp", version.version)


def test_a_fixed_evaluation_set_other_than_the_champions_is_refused_before_anything(drops, tmp_path):
    root = tmp_path / "runs"
    _write(tmp_path / "eval" / "eval.jsonl", _rows(9, count=12))
    _champion(root, eval_snapshot="sha256:" + "ab" * 32)
    ctx = _ctx(root, f"train.dataset={drops}/ train.eval_dataset={tmp_path}/eval/eval.jsonl")
    with pytest.raises(SpecError) as err:
        dataset.snapshot_data(ctx)
    assert err.value.field == "train.eval_dataset"
    assert "is not the fixed evaluation set champion local-fsdp@1 was judged on" in str(err.value)
    assert read_json(ctx.store, dataset.MANIFEST) is None  # nothing kept: the run never started


def test_only_what_is_new_needs_a_champion_that_recorded_its_data(drops, tmp_path):
    root = tmp_path / "runs"
    _champion(root)  # registered before data snapshots: no data_manifest
    with pytest.raises(SpecError, match=r"^train.data_since: champion local-fsdp@1 records no data manifest"):
        dataset.snapshot_data(_ctx(root, f"train.dataset={drops}/ train.data_since=champion train.init_from=champion"))


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ("train.dataset={dir}/bad.jsonl", "train.dataset: {dir}/bad.jsonl, line 1: not JSON Lines"),
        ("train.dataset={dir}/nofields.jsonl", "train.dataset: {dir}/nofields.jsonl, line 1: the example lacks"),
        ("train.dataset={dir}/empty/", "train.dataset: no .jsonl, .json, .parquet or .jsonl.gz file under {dir}/empty"),
        ("train.dataset={dir}/sft/{{week}}/", "train.dataset: unknown placeholder {{week}}"),
        ("train.dataset={dir}/nothing.jsonl", "train.dataset: file not found: {dir}/nothing.jsonl"),
        ("train.dataset={dir}/sft/ train.eval_dataset={dir}/bad.jsonl", "train.eval_dataset: {dir}/bad.jsonl, line"),
    ],
)
def test_tpupipe_data_exits_2_naming_the_field_for_bad_data(tmp_path, capsys, sets, message):
    from pipelines.cli.main import main

    _write(tmp_path / "sft" / "a.jsonl", _rows(1))
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    (tmp_path / "nofields.jsonl").write_text('{"prompt": "a"}\n')
    (tmp_path / "empty").mkdir()
    assert main(["data", "local-fsdp", "--set", sets.format(dir=tmp_path)]) == 2
    assert message.format(dir=tmp_path) in capsys.readouterr().err


def test_the_lineage_key_file_is_a_streamed_merge_of_two_sorted_runs_each_key_once(tmp_path, monkeypatch):
    """The champion's keys and this run's, merged a chunk at a time into the file (its digest and count as written),
    sorted and each once; a lookup finds every key and no other, at either end of the file too."""
    from components.data import snapshot

    monkeypatch.setattr(snapshot, "LINEAGE_CHUNK", 3)  # several chunks out of a few keys
    theirs = [{"instruction": f"Say {n}.", "response": str(n)} for n in range(0, 20, 2)]
    mine = [{"instruction": f"Say {n}.", "response": str(n)} for n in range(0, 20, 3)] * 2  # a repeat, an overlap
    path = tmp_path / "champion.bin"
    snapshot.lineage(None, theirs, str(path))
    seen = snapshot.Keys(path.read_bytes())
    digest, count = snapshot.lineage(seen, mine, str(tmp_path / "keys.bin"))
    merged = (tmp_path / "keys.bin").read_bytes()
    expected = sorted({snapshot.example_key(e) for e in theirs + mine})
    assert merged == b"".join(expected) and count == len(expected) == 13
    assert digest == snapshot.file_digest(merged) and len(merged) == 16 * count
    keys = snapshot.Keys(merged)
    assert all(key in keys for key in expected)
    others = [snapshot.example_key({"instruction": f"Say {n}.", "response": str(n)}) for n in (1, 5, 7, 11)]
    assert not any(key in keys for key in others) and b"" not in keys and b"\xff" * 16 not in keys
