"""A hub ``train.dataset`` snapshotted by the run's first stage on the pipeline's side (``components.data.hub``), from
the hub's Parquet conversion pinned by commit and each file's sha256, so that no pod of the run reads the hub for data;
against the emulated hub (tests/emulators/hfhub.py)."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.data import hub, snapshot
from components.spec import InfraError, SpecError, datasets
from components.workload import resolve
from tests.emulators.hfhub import HubEmulator

REPO = "org/sft"
WHEN = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def _parquet(first: int, count: int) -> bytes:
    rows = [
        {"instruction": f"Repeat w{i} twice.", "response": f"w{i} w{i}", "category": "open_qa"}
        for i in range(first, first + count)
    ]
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


@pytest.fixture
def emulated(monkeypatch):
    emulator = HubEmulator()
    repo = emulator.dataset(REPO)
    repo.push({"README.md": b"# sft\n", "data/train.jsonl": b"{}\n"})  # the repository's own files, never read
    files = {
        "default/train/0000.parquet": _parquet(0, 60),
        "default/train/0001.parquet": _parquet(60, 60),
        "default/test/0000.parquet": _parquet(1000, 12),
    }
    repo.push(files, ref=hub.CONVERTED)
    emulator.start()
    monkeypatch.setenv("HF_ENDPOINT", emulator.url)
    yield emulator
    emulator.stop()


def _take(overrides: str):
    spec = resolve("local-fsdp", f"train.dataset={REPO} {overrides}")
    return snapshot.take(spec, WHEN, log=lambda line: None)


def test_a_hub_dataset_is_snapshotted_from_its_parquet_files_pinned_by_commit_and_hash(emulated):
    assert datasets.snapshotted(REPO) and not datasets.is_drop(REPO)
    manifest, train, heldout = _take("train.train_split=train[:50] train.eval_split=test")
    assert len(train) == 50 and len(heldout) == 12
    assert [e["instruction"] for e in train][:2] == ["Repeat w0 twice.", "Repeat w1 twice."]
    commit = emulated.datasets[REPO].refs[hub.CONVERTED]
    assert manifest["train"]["commit"] == commit and manifest["eval"]["split"] == "test"
    (item,) = manifest["train"]["items"]  # the slice ends in the first file: the second is not downloaded
    assert item["uri"] == f"hf://datasets/{REPO}@{commit}/default/train/0000.parquet" and len(item["generation"]) == 64
    assert emulated.downloads == [
        f"/datasets/{REPO}/resolve/{commit}/default/train/0000.parquet",
        f"/datasets/{REPO}/resolve/{commit}/default/test/0000.parquet",
    ]
    again, *_ = _take("train.train_split=train[:50] train.eval_split=test")
    assert again["digest"] == manifest["digest"]
    other, *_ = _take("train.train_split=train[:51] train.eval_split=test")
    assert other["digest"] != manifest["digest"]  # the slice is part of what the run read


def test_a_conversion_between_the_listing_and_a_download_is_listed_again_the_hashes_being_the_pin(emulated):
    """The dataset viewer squashes ``refs/convert/parquet`` after each conversion: a commit listed a moment ago is gone
    (404), so the split is listed once more; the manifest's hashes are the same, the bytes being the same."""
    repo = emulated.datasets[REPO]
    files = {name: repo.commits[repo.refs[hub.CONVERTED]][name] for name in repo.commits[repo.refs[hub.CONVERTED]]}
    first, *_ = _take("train.train_split=train[:50] train.eval_split=test")
    listed = repo.refs[hub.CONVERTED]
    original = emulated._resolve
    converted = []

    def converting(repo_id, revision, name, method, headers, repos=None):  # a conversion lands after the listing
        if not converted:
            converted.append(repo.push(files, ref=hub.CONVERTED, squash=True))
        return original(repo_id, revision, name, method, headers, repos)

    emulated._resolve = converting  # type: ignore[method-assign]
    lines: list[str] = []
    spec = resolve("local-fsdp", f"train.dataset={REPO} train.train_split=train[:50] train.eval_split=test")
    manifest, train, _ = snapshot.take(spec, WHEN, log=lines.append)
    assert listed not in repo.commits and manifest["train"]["commit"] == converted[0] != listed
    assert any("listing it again" in line for line in lines) and len(train) == 50
    generations = [[i["generation"] for i in m["train"]["items"]] for m in (first, manifest)]
    assert generations[0] == generations[1]
    # a conversion at every download: the second 404 stops the snapshot naming the file
    converted.clear()

    def always(repo_id, revision, name, method, headers, repos=None):
        repo.push(files, ref=hub.CONVERTED, squash=True)
        return original(repo_id, revision, name, method, headers, repos)

    emulated._resolve = always  # type: ignore[method-assign]
    with pytest.raises(InfraError, match=r"^train\.dataset: default/train/0000\.parquet of org/sft@\w+ is no longer"):
        _take("train.train_split=train[:50] train.eval_split=test")


def test_slices_by_row_and_percent_read_what_datasets_reads(emulated):
    _, train, heldout = _take("train.train_split=train[-10:] train.eval_split=train[:10%]")
    assert [e["instruction"] for e in train] == [f"Repeat w{i} twice." for i in range(110, 120)]
    assert [e["instruction"] for e in heldout] == [f"Repeat w{i} twice." for i in range(12)]  # 10% of 120
    _, train, _ = _take("train.train_split=train[55:65] train.eval_split=test")  # across the two files
    assert [e["instruction"] for e in train] == [f"Repeat w{i} twice." for i in range(55, 65)]


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ("train.train_split=validation", SpecError, "train.train_split: org/sft has no split 'validation' (its splits"),
        ("train.train_split=train+test", SpecError, "train.train_split: 'train+test' is not a split of a hub dataset"),
        ("train.eval_split=heldout", SpecError, "train.eval_split: org/sft has no split 'heldout'"),
    ],
)
def test_a_split_the_hub_does_not_have_is_refused_naming_its_field(emulated, overrides, error, message):
    with pytest.raises(error) as err:
        _take(overrides)
    assert str(err.value).startswith(message)


def test_a_split_converted_only_in_part_is_refused_rather_than_trained_on_in_part(emulated):
    emulated.datasets[REPO].push({"default/partial-train/0000.parquet": _parquet(0, 5)}, ref=hub.CONVERTED)
    with pytest.raises(SpecError, match=r"train\.train_split: org/sft: the hub converted only part of its split"):
        _take("train.eval_split=test")


def test_a_dataset_not_on_the_hub_or_a_gated_one_without_the_token_stops_the_snapshot(emulated):
    with pytest.raises(InfraError, match=r"train\.dataset: org/none at 'refs/convert/parquet' is not on the hub"):
        snapshot.take(resolve("local-fsdp", "train.dataset=org/none train.eval_split=test"), WHEN, log=print)
    # a gated dataset: the hub lists its Parquet files to anyone and refuses the files without a token
    emulated.datasets[REPO].gated = True
    refused = r"^train\.dataset: default/\w+/0000\.parquet of org/sft@\w+: the hub answered 401"
    with pytest.raises(SpecError, match=refused) as err:
        _take("train.eval_split=test")
    assert "gke.hf_token_secret" in str(err.value) and "$HF_TOKEN" in str(err.value)
    assert f"{emulated.url}/datasets/{REPO}" in str(err.value)
    manifest, train, _ = snapshot.take(
        resolve("local-fsdp", f"train.dataset={REPO} train.eval_split=test"), WHEN, log=print, hub_token=emulated.token
    )
    assert len(train) == 120 and manifest["train"]["kind"] == "hub"


def test_a_hub_dataset_whose_eval_split_is_its_train_split_is_refused_before_anything():
    with pytest.raises(SpecError, match=r"^train\.eval_split: is train\.train_split \('train'\)"):
        resolve("local-fsdp", f"train.dataset={REPO} train.train_split=train train.eval_split=train")


def test_a_split_of_more_than_ten_thousand_files_is_read_across_its_part_directories_in_order():
    """The dataset viewer writes such a split to ``{split}-part0/`` .. ``{split}-part9/``, 10,000 files each
    (``ParquetFile.path_in_repo`` in its parquet_and_info.py)."""
    names = ["default/train-part1/0000.parquet", "default/train-part0/9999.parquet", "default/train-part0/0000.parquet"]
    listing = {"files": [{"name": n} for n in [*names, "default/test/0000.parquet", ".gitattributes"]]}
    assert [e["name"] for e in hub.files(REPO, "train", "train.train_split", listing)] == sorted(names)
    with pytest.raises(SpecError, match=r"has no split 'valid' \(its splits: test, train\)"):
        hub.files(REPO, "valid", "train.eval_split", listing)
