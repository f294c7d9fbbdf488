"""The compile cache has one trusted producer and one trusted writer (``components.workload.cache_trust``), on the
local platform as on gke: a compile job writes its programs in its own directory, the train stage (the pipeline's
side) hashes and records them in the cache kept across runs before the training job starts, and stages into the
training job's own directory only the entries whose bytes hash to the trusted manifest. What the training job writes
is never promoted. A planted entry (its bytes changed, its manifest line changed, or its bytes changed with a forged
manifest beside them in the cache) is not staged: the stage says so in one warning line, the next compile job
compiles it again and the run succeeds. With a real JAX compile in the maxtext environment: JAX reads only the
training job's directory, so what it loads is what passed the check."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from components.platforms import RunContext, get_platform
from components.platforms.store import LocalStore, write_json
from components.spec import protocol
from components.stages import ray_stages
from components.workload import cache, cache_trust, derive, resolve

IMAGE = f"local/maxtext@sha256:{'cd' * 32}"
PLANTED = b"\x7fELF a program nobody compiled for this run" * 4
CONFIG = "sha256:config"
NONCE = "0f" * 16  # the compile job attempt's directory (the stage makes a random one: cache_trust.new_nonce)


def run_ctx(root: Path, run_id: str) -> RunContext:
    """A local run of the local-maxtext preset whose build recorded the pinned image: its compile cache is keyed."""
    spec, store = resolve("local-maxtext", ""), LocalStore(root / run_id)
    ctx = RunContext(spec=spec, run_id=run_id, store=store, platform="local")
    write_json(ctx.store, "stages/build_image.json", {"result": {"image": IMAGE}})
    return ctx


def job_dir(ctx: RunContext) -> Path:
    """The directory the training job is given (its ``jax_cache_dir``): the run's own copy."""
    path = cache.directory(get_platform("local").run_cache_root(ctx), ctx.spec, IMAGE)
    assert f"jax_cache_dir={path}" in ray_stages.entrypoint(ctx, "train")
    return Path(path)


def compile_dir(ctx: RunContext) -> Path:
    """The directory the compile job attempt writes (``components.stages.compile_cache``)."""
    return Path(cache.directory(f"{get_platform('local').compile_job_root(ctx)}/{NONCE}", ctx.spec, IMAGE))


def record(ctx: RunContext, config: str, staged: list[str], log, reported: dict[str, str] | None = None) -> dict:
    """The stage's record of the compile job's attempt: what the job reported (by default its report of everything
    it wrote: ``protocol.job_entries``, as the trainer makes it) read from the attempt's directory."""
    places = get_platform("local").cache_places(ctx)
    reported = protocol.job_entries(compile_dir(ctx)) if reported is None else reported
    return cache_trust.record(places, key_of(ctx), ctx.run_id, config, staged, reported, f"{NONCE}/{key_of(ctx)}", log)


def warnings_of(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("WARNING")]


def key_of(ctx: RunContext) -> str:
    return cache.key(ctx.spec, IMAGE)


def stage(ctx: RunContext) -> tuple[dict, list[str]]:
    lines: list[str] = []
    places = get_platform("local").cache_places(ctx)
    return cache_trust.stage_in(places.shared, places.run, places.manifests, key_of(ctx), lines.append), lines


def compile_job(ctx: RunContext, staged: dict, entries: dict[str, bytes], config: str = CONFIG) -> dict:
    """What a compile job leaves in its directory, recorded by the stage."""
    for name, data in entries.items():
        (compile_dir(ctx) / name).parent.mkdir(parents=True, exist_ok=True)
        (compile_dir(ctx) / name).write_bytes(data)
    return record(ctx, config, staged["names"], lambda line: None)


def first_run(root: Path, entries: dict[str, bytes]) -> tuple[Path, Path]:
    """A run whose compile job compiled ``entries``, recorded: (the shared entry directory, its manifest)."""
    ctx = run_ctx(root, "first")
    result, lines = stage(ctx)
    assert result["staged"] == 0 and result["compiled"] == [] and not warnings_of(lines)
    assert compile_job(ctx, result, entries)["recorded"] == len(entries)
    return root / cache.CACHE_PREFIX / key_of(ctx), root / cache_trust.MANIFESTS_PREFIX / f"{key_of(ctx)}.json"


def plant(how: str, shared: Path, manifest: Path, name: str) -> None:
    """Change a recorded entry as an attacker outside the pipeline's identity would."""
    doc = json.loads(manifest.read_text())
    if how in ("bytes", "both"):
        (shared / name).write_bytes(PLANTED)
    if how == "manifest":
        doc["entries"][name]["sha256"] = cache_trust.sha256(PLANTED)
        manifest.write_text(json.dumps(doc))
    if how == "both":  # a manifest that vouches for the planted bytes, where the cache's writer keeps its files
        forged = {"entries": {name: {"sha256": cache_trust.sha256(PLANTED), "size": len(PLANTED)}}}
        (shared / "manifest.json").write_text(json.dumps(forged))


def test_the_compile_jobs_entries_are_recorded_before_training_and_staged_for_every_later_run(tmp_path):
    shared, manifest = first_run(tmp_path, {"jit_f-cache": b"program f", "sub/jit_g-cache": b"g"})
    doc = json.loads(manifest.read_text())
    assert doc["entries"]["jit_f-cache"] == {
        "sha256": cache_trust.sha256(b"program f"),
        "size": 9,
        "run": "first",
        "by": "compile job",
    }
    assert doc["compiled"] == {CONFIG: {"run": "first", "entries": 2}} and doc["format"] == cache_trust.MANIFEST_FORMAT
    assert (shared / "jit_f-cache").read_bytes() == b"program f"
    # the run's own training job finds them too: the record copies them into its directory before it starts
    assert (job_dir(run_ctx(tmp_path, "first")) / "sub" / "jit_g-cache").read_bytes() == b"g"
    second = run_ctx(tmp_path, "second")
    result, lines = stage(second)
    assert result["staged"] == 2 and result["refused"] == [] and not warnings_of(lines)
    assert result["compiled"] == [CONFIG]  # this configuration needs no compile job
    assert (job_dir(second) / "jit_f-cache").read_bytes() == b"program f"
    assert str(shared) not in ray_stages.entrypoint(second, "train")  # the job never reads the shared directory


def test_what_the_training_job_writes_in_its_own_directory_reaches_no_other_run(tmp_path):
    """The HIGH this closes: a training job that ran hostile data or code plants a program under the name a later
    run will look up, and rewrites a staged one; nothing of it is ever copied out of its run."""
    shared, manifest = first_run(tmp_path, {"jit_f-cache": b"program f"})
    hostile = run_ctx(tmp_path, "hostile")
    result, _ = stage(hostile)
    (job_dir(hostile) / "jit_f-cache").write_bytes(PLANTED)  # its own copy: its pods may write there
    (job_dir(hostile) / "jit_new-cache").write_bytes(PLANTED)  # a program for a name no run has compiled yet
    # the next run's compile job (a new configuration) records only what it wrote itself
    nxt = run_ctx(tmp_path, "next")
    staged, lines = stage(nxt)
    assert compile_job(nxt, staged, {"jit_h-cache": b"program h"}, "sha256:other")["recorded"] == 1
    assert sorted(p.name for p in shared.iterdir()) == ["jit_f-cache", "jit_h-cache"]
    assert (shared / "jit_f-cache").read_bytes() == b"program f"
    assert set(json.loads(manifest.read_text())["entries"]) == {"jit_f-cache", "jit_h-cache"}
    assert not (job_dir(nxt) / "jit_new-cache").exists() and (job_dir(nxt) / "jit_f-cache").read_bytes() == b"program f"


@pytest.mark.parametrize("how", ["bytes", "manifest", "both"])
def test_a_planted_entry_is_not_staged_the_stage_says_so_in_one_line_and_the_compile_job_repairs_it(tmp_path, how):
    shared, manifest = first_run(tmp_path, {"jit_f-cache": b"program f", "jit_g-cache": b"program g"})
    plant(how, shared, manifest, "jit_f-cache")
    nxt = run_ctx(tmp_path, "next")
    result, lines = stage(nxt)
    (warning,) = warnings_of(lines)
    assert result["refused"] == ["jit_f-cache"] and result["staged"] == 1
    assert f"compile cache {shared}: not used: 1 whose bytes or names do not match the manifest's (jit_f-cache)" in (
        warning
    )
    assert warning.endswith("compiled again") and str(manifest) in warning
    if how == "both":
        assert "1 the manifest does not list (manifest.json)" in warning
    assert not (job_dir(nxt) / "jit_f-cache").exists() and not (job_dir(nxt) / "manifest.json").exists()
    assert (job_dir(nxt) / "jit_g-cache").read_bytes() == b"program g"  # the intact entry still serves
    # A refused entry makes the stage run the compile job again: it compiles the program again, the record replaces
    # the planted one and stages it for this run's training job, and the next run stages it without a warning.
    assert compile_job(nxt, result, {"jit_f-cache": b"program f", "jit_g-cache": b"program g"})["recorded"] == 1
    assert (shared / "jit_f-cache").read_bytes() == b"program f"
    assert (job_dir(nxt) / "jit_f-cache").read_bytes() == b"program f"
    again, lines = stage(run_ctx(tmp_path, "again"))
    assert again["refused"] == [] and again["staged"] == 2
    # what the trusted side never wrote stays where it was planted, unlisted, and is said so at every stage-in
    assert [("does not list (manifest.json)" in w, "whose bytes" in w) for w in warnings_of(lines)] == (
        [(True, False)] if how == "both" else []
    )


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"{not json", "cannot be read"),
        (json.dumps({"entries": {"jit_f-cache": {"sha256": "x"}}}).encode(), "written before compile jobs"),
    ],
)
def test_an_unreadable_or_pre_compile_job_manifest_stages_nothing_with_one_warning(tmp_path, raw, why):
    shared, manifest = first_run(tmp_path, {"jit_f-cache": b"program f"})
    manifest.write_bytes(raw)
    result, lines = stage(run_ctx(tmp_path, "next"))
    (warning,) = warnings_of(lines)
    assert result["staged"] == 0 and why in warning and "1 the manifest does not list" in warning
    assert result["compiled"] == []  # so the stage runs a compile job, whose record starts a new manifest


def test_a_manifest_entry_whose_name_leads_out_of_the_key_is_refused_and_nothing_outside_is_read(tmp_path):
    shared, manifest = first_run(tmp_path, {"jit_f-cache": b"program f"})
    outside = shared.parent / "elsewhere"
    outside.write_bytes(b"program outside")
    doc = json.loads(manifest.read_text())
    for name in ("../elsewhere", "/etc/passwd", "a//b"):
        doc["entries"][name] = {"sha256": cache_trust.sha256(b"program outside")}
    manifest.write_text(json.dumps(doc))
    result, lines = stage(run_ctx(tmp_path, "next"))
    assert sorted(result["refused"]) == ["../elsewhere", "/etc/passwd", "a//b"] and result["staged"] == 1
    assert len(warnings_of(lines)) == 1
    assert [cache_trust.bad_name(n) != "" for n in ("a/b", "a/../b", "..", "/a", "a\\b", "")] == [False] + [True] * 5


def test_a_record_past_the_caps_keeps_what_fits_and_warns_never_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_trust, "MAX_ENTRIES", 2)
    ctx = run_ctx(tmp_path, "first")
    staged, _ = stage(ctx)
    lines: list[str] = []
    for i in range(4):
        (compile_dir(ctx) / f"jit_{i}-cache").parent.mkdir(parents=True, exist_ok=True)
        (compile_dir(ctx) / f"jit_{i}-cache").write_bytes(b"p" * 10)
    result = record(ctx, CONFIG, staged["names"], lines.append)
    assert result["recorded"] == 2 and result["over_cap"] == 2 and not result["compiled"]  # the next run retries
    warning, marked = warnings_of(lines)
    assert "not marked compiled" in marked
    assert "2 of the compile job's entries not recorded (jit_2-cache, jit_3-cache)" in warning
    assert "at most 2 entries" in warning
    monkeypatch.setattr(cache_trust, "MAX_ENTRIES", 100)
    monkeypatch.setattr(cache_trust, "MAX_BYTES", 25)  # 20 held: one more of 10 passes it
    nxt = run_ctx(tmp_path, "next")
    staged, _ = stage(nxt)
    assert compile_job(nxt, staged, {"jit_9-cache": b"q" * 10}, "sha256:b")["over_cap"] == 1


def test_only_what_the_compile_job_reported_with_the_bytes_it_reported_is_recorded(tmp_path):
    """The compile job's directory is writable by the run's pods for the whole run: an object planted there that the
    job did not report, and a reported entry whose bytes were swapped after the job hashed them, are ignored with a
    warning; the configuration is not marked compiled, so the next run's compile job tries again."""
    ctx = run_ctx(tmp_path, "first")
    staged, _ = stage(ctx)
    compile_dir(ctx).mkdir(parents=True)
    (compile_dir(ctx) / "jit_f-cache").write_bytes(b"program f")
    (compile_dir(ctx) / "jit_g-cache").write_bytes(b"program g")
    reported = protocol.job_entries(compile_dir(ctx))  # the job's own report, made when it finished
    (compile_dir(ctx) / "jit_g-cache").write_bytes(PLANTED)  # swapped after the job hashed it
    (compile_dir(ctx) / "jit_planted-cache").write_bytes(PLANTED)  # never reported
    lines: list[str] = []
    result = record(ctx, CONFIG, staged["names"], lines.append, reported)
    assert result["recorded"] == 1 and result["ignored"] == 2 and not result["compiled"]
    shared = tmp_path / cache.CACHE_PREFIX / key_of(ctx)
    assert sorted(p.name for p in shared.iterdir()) == ["jit_f-cache"]
    assert not (job_dir(ctx) / "jit_planted-cache").exists() and not (job_dir(ctx) / "jit_g-cache").exists()
    doc, _ = cache_trust.read_manifest(get_platform("local").cache_places(ctx).manifests, key_of(ctx))
    assert set(doc["entries"]) == {"jit_f-cache"} and doc["compiled"] == {}
    text = "\n".join(warnings_of(lines))
    assert "jit_planted-cache): the compile job did not report them" in text
    assert "jit_g-cache): their bytes are gone or do not hash to what the compile job reported" in text
    assert stage(run_ctx(tmp_path, "next"))[0]["compiled"] == []  # a new compile job for the next run


def test_a_compile_job_that_reported_nothing_marks_nothing_compiled(tmp_path):
    ctx = run_ctx(tmp_path, "first")
    staged, _ = stage(ctx)
    lines: list[str] = []
    assert record(ctx, CONFIG, staged["names"], lines.append, {}) == {
        "key": key_of(ctx),
        "recorded": 0,
        "bytes": 0,
        "over_cap": 0,
        "ignored": 0,
        "compiled": False,
    }
    assert not (tmp_path / cache_trust.MANIFESTS_PREFIX / f"{key_of(ctx)}.json").exists()
    assert any("not marked compiled" in w for w in warnings_of(lines))


def test_a_listed_entry_whose_bytes_are_gone_is_refused_so_a_compile_job_makes_it_again(tmp_path):
    shared, _ = first_run(tmp_path, {"jit_f-cache": b"program f", "jit_g-cache": b"program g"})
    (shared / "jit_g-cache").unlink()
    result, lines = stage(run_ctx(tmp_path, "next"))
    assert result["refused"] == ["jit_g-cache"] and result["staged"] == 1 and len(warnings_of(lines)) == 1


def test_runs_recording_at_once_on_this_machine_keep_every_entry(tmp_path):
    """Eight records of one key at once (the local platform's lock around the manifest's read and write)."""
    ctxs = [run_ctx(tmp_path, f"run-{i}") for i in range(8)]
    for i, ctx in enumerate(ctxs):
        (compile_dir(ctx)).mkdir(parents=True)
        (compile_dir(ctx) / f"jit_{i}-cache").write_bytes(b"program %d" % i)
    places = [get_platform("local").cache_places(ctx) for ctx in ctxs]
    threads = [threading.Thread(target=record, args=(c, f"c{i}", [], lambda m: None)) for i, c in enumerate(ctxs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    doc, why = cache_trust.read_manifest(places[0].manifests, key_of(ctxs[0]))
    assert not why and len(doc["entries"]) == 8 and len(doc["compiled"]) == 8


# ---------------------------------------------------------------- with JAX's own persistent compilation cache


@pytest.mark.trainer_env  # runs in the maxtext environment, which `make test` builds while the fast tiers run
@pytest.mark.parametrize("how", ["bytes", "manifest", "both"])
def test_jax_loads_only_verified_programs_and_a_planted_one_is_compiled_again(tmp_path, how):
    """Runs through the train stage's staging and recording, each a real JAX process for the compile job (pointed at
    its own directory) and one for the training job (pointed at the run's own, its ``jax_cache_dir``): the first
    run's compile job compiles and is recorded, and its training job already loads every program; the second run
    needs no compile job and loads every program; a program its training job planted in its own directory reaches
    no one; the programs planted in the cache after it are not staged, so the third run's compile job compiles them
    again, and its training job loads them, gets the same value and succeeds, after one warning line."""
    from components.platforms.local import envs
    from tests.helpers import REPO
    from tests.unit.test_compile_cache import COMPILE

    python = envs.ensure_env("maxtext").python

    def jax_process(where: Path) -> dict:
        proc = subprocess.run(
            [python, "-c", COMPILE, str(where)], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])

    def run(run_id: str) -> tuple[dict | None, dict, list[str]]:
        ctx = run_ctx(tmp_path, run_id)
        result, lines = stage(ctx)
        compiled = None
        if CONFIG not in result["compiled"] or result["refused"]:  # components.stages.compile_cache's rule
            compiled = jax_process(compile_dir(ctx))
            record(ctx, CONFIG, result["names"], lines.append)
        return compiled, jax_process(job_dir(ctx)), lines

    compiled, first, lines = run("first")
    assert compiled and compiled["compiles"] >= 1 and compiled["hits"] == 0 and not warnings_of(lines)
    assert first["hits"] == compiled["compiles"]  # recorded and staged before the training job
    compiled, second, lines = run("second")
    assert compiled is None and second["hits"] == first["hits"] and not warnings_of(lines)
    ctx = run_ctx(tmp_path, "second")
    for entry in (p for p in job_dir(ctx).iterdir() if p.is_file()):  # the training job plants over what it loaded
        entry.write_bytes(PLANTED)
    shared, manifest = tmp_path / cache.CACHE_PREFIX / key_of(ctx), tmp_path / cache_trust.MANIFESTS_PREFIX
    manifest = manifest / f"{key_of(ctx)}.json"
    programs = [n for n in json.loads(manifest.read_text())["entries"] if n.endswith("-cache")]
    assert programs and all((shared / n).read_bytes() != PLANTED for n in programs)
    for name in programs:
        plant(how, shared, manifest, name)
    compiled, third, lines = run("third")
    assert len(warnings_of(lines)) == 1 and "compiled again" in warnings_of(lines)[0]
    assert compiled and compiled["compiles"] == first["hits"]
    assert third["value"] == first["value"] and third["hits"] == first["hits"] and third["compiles"] == third["hits"]
    assert not any("Error reading persistent compilation cache entry" in w for w in third["warnings"])  # never seen


# ---------------------------------------------------------------- the train stage's choice: a compile job or none


def prepared(ctx: RunContext, monkeypatch) -> tuple[dict | None, list[str]]:
    from components.stages import compile_cache

    lines: list[str] = []
    monkeypatch.setattr(compile_cache, "log", lines.append)
    return compile_cache.prepare(ctx, IMAGE), lines


def test_a_recorded_configuration_needs_no_compile_job_and_the_training_job_is_marked_submitted(tmp_path, monkeypatch):
    from components.stages import compile_cache
    from components.workload import maxtext

    ctx = run_ctx(tmp_path, "first")
    staged, _ = stage(ctx)
    compile_job(
        ctx, staged, {"jit_f-cache": b"program f"}, maxtext.compile_config(ctx.spec, derive.compile_devices(ctx.spec))
    )
    second = run_ctx(tmp_path, "second")
    result, lines = prepared(second, monkeypatch)
    assert result is not None and result["compile_job"] is None and result["staged"]["staged"] == 1
    assert lines == ["compile cache: 1 verified entries staged; this configuration is compiled: no compile job"]
    assert (job_dir(second) / "jit_f-cache").read_bytes() == b"program f"
    assert second.store.read_text(compile_cache.SUBMITTED)  # no compile job for this run from now on


def test_no_compile_job_once_the_runs_training_job_was_submitted(tmp_path, monkeypatch):
    """A retried train stage: the first attempt's training job may have run hostile code on the cluster, so the
    run compiles what is missing in its training job and records nothing."""
    from components.stages import compile_cache

    ctx = run_ctx(tmp_path, "retried")
    write_json(ctx.store, compile_cache.SUBMITTED, {"key": key_of(ctx)})
    result, lines = prepared(ctx, monkeypatch)
    assert result is not None and result["compile_job"] is None and result["recorded"] is None
    assert "no compile job: this run's training job already ran on its cluster" in lines[-1]
    assert not (tmp_path / cache.CACHE_PREFIX).exists()


def test_a_cache_error_is_a_warning_and_the_training_job_runs_without_it(tmp_path, monkeypatch):
    """The training job's directory cannot be written (here: a file where the run's cache directory goes), so the
    stage-in fails: one warning, the training job marked submitted, no failed run."""
    from components.stages import compile_cache
    from components.workload import maxtext

    ctx = run_ctx(tmp_path, "first")
    staged, _ = stage(ctx)
    compile_job(
        ctx, staged, {"jit_f-cache": b"program f"}, maxtext.compile_config(ctx.spec, derive.compile_devices(ctx.spec))
    )
    second = run_ctx(tmp_path, "second")
    Path(get_platform("local").run_cache_root(second)).parent.mkdir(parents=True, exist_ok=True)
    Path(get_platform("local").run_cache_root(second)).write_text("not a directory")
    result, lines = prepared(second, monkeypatch)
    assert result is not None and "error" in result
    assert lines[-1].startswith("WARNING: compile cache: ") and "runs without the cache" in lines[-1]
    assert second.store.read_text(compile_cache.SUBMITTED)


def test_the_fsdp_trainer_keeps_its_cache_per_run(tmp_path, monkeypatch):
    ctx = RunContext(spec=resolve("local-fsdp", ""), run_id="f", store=LocalStore(tmp_path / "f"), platform="local")
    assert prepared(ctx, monkeypatch)[0] is None
