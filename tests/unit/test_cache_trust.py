"""The compile cache has one trusted writer (``components.workload.cache_trust``), on the local platform as on gke:
the train stage (the pipeline's side) stages into the run's own directory only the entries whose bytes hash to the
trusted manifest, and promotes what the run's job compiled after it succeeded. A planted entry (its bytes changed,
its manifest line changed, or its bytes changed with a forged manifest beside them in the cache) is not staged: the
stage says so in one warning line, and the next run compiles it again and succeeds; a pod that rewrites a staged entry
in its own directory changes nothing another run loads. With a real JAX compile in the maxtext environment: JAX reads
only the staged directory, so what it loads is what passed the check."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from components.platforms import RunContext, get_platform
from components.platforms.store import LocalStore, write_json
from components.stages import ray_stages
from components.workload import cache, cache_trust, resolve

IMAGE = f"local/maxtext@sha256:{'cd' * 32}"
PLANTED = b"\x7fELF a program nobody compiled for this run" * 4


def run_ctx(root: Path, run_id: str) -> RunContext:
    """A local run of the local-maxtext preset whose build recorded the pinned image: its compile cache is keyed."""
    spec, store = resolve("local-maxtext", ""), LocalStore(root / run_id)
    ctx = RunContext(spec=spec, run_id=run_id, store=store, platform="local")
    write_json(ctx.store, "stages/build_image.json", {"result": {"image": IMAGE}})
    return ctx


def job_dir(ctx: RunContext) -> Path:
    """The directory the train job is given (its ``jax_cache_dir``): the run's own copy."""
    path = cache.directory(get_platform("local").run_cache_root(ctx), ctx.spec, IMAGE)
    assert f"jax_cache_dir={path}" in ray_stages.entrypoint(ctx, "train")
    return Path(path)


def warnings_of(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("WARNING")]


def staged(ctx: RunContext, monkeypatch) -> tuple[dict, list[str]]:
    lines: list[str] = []
    monkeypatch.setattr(ray_stages, "log", lines.append)
    return ray_stages.stage_cache(ctx), lines


def promoted(ctx: RunContext, result: dict, monkeypatch) -> dict:
    monkeypatch.setattr(ray_stages, "log", lambda line: None)
    return ray_stages.promote_cache(ctx, result)


def first_run(root: Path, monkeypatch, entries: dict[str, bytes]) -> tuple[Path, Path]:
    """A run that compiled ``entries`` and had them promoted: (the shared entry directory, its manifest)."""
    ctx = run_ctx(root, "first")
    result, lines = staged(ctx, monkeypatch)
    assert result["staged"] == 0 and not warnings_of(lines)
    for name, data in entries.items():
        (job_dir(ctx) / name).parent.mkdir(parents=True, exist_ok=True)
        (job_dir(ctx) / name).write_bytes(data)
    assert promoted(ctx, result, monkeypatch)["promoted"] == len(entries)
    key = cache.key(ctx.spec, IMAGE)
    return root / cache.CACHE_PREFIX / key, root / cache_trust.MANIFESTS_PREFIX / f"{key}.json"


def plant(how: str, shared: Path, manifest: Path, name: str) -> None:
    """Change a promoted entry as an attacker outside the pipeline's identity would."""
    doc = json.loads(manifest.read_text())
    if how in ("bytes", "both"):
        (shared / name).write_bytes(PLANTED)
    if how == "manifest":
        doc["entries"][name]["sha256"] = cache_trust.sha256(PLANTED)
        manifest.write_text(json.dumps(doc))
    if how == "both":  # a manifest that vouches for the planted bytes, where the cache's writer keeps its files
        forged = {"entries": {name: {"sha256": cache_trust.sha256(PLANTED), "size": len(PLANTED)}}}
        (shared / "manifest.json").write_text(json.dumps(forged))


def test_the_promoted_entries_are_staged_for_the_next_run_and_nothing_runs_from_the_shared_cache(tmp_path, monkeypatch):
    shared, manifest = first_run(tmp_path, monkeypatch, {"jit_f-cache": b"program f", "tokenized/k.safetensors": b"t"})
    doc = json.loads(manifest.read_text())
    assert doc["entries"]["jit_f-cache"] == {"sha256": cache_trust.sha256(b"program f"), "size": 9, "run": "first"}
    assert (shared / "jit_f-cache").read_bytes() == b"program f"
    second = run_ctx(tmp_path, "second")
    result, lines = staged(second, monkeypatch)
    assert result["staged"] == 2 and result["refused"] == [] and not warnings_of(lines)
    assert (job_dir(second) / "jit_f-cache").read_bytes() == b"program f"
    assert (job_dir(second) / "tokenized" / "k.safetensors").read_bytes() == b"t"
    assert str(shared) not in ray_stages.entrypoint(second, "train")  # the job never reads the shared directory


@pytest.mark.parametrize("how", ["bytes", "manifest", "both"])
def test_a_planted_entry_is_not_staged_the_stage_says_so_in_one_line_and_the_run_repairs_it(tmp_path, monkeypatch, how):
    shared, manifest = first_run(tmp_path, monkeypatch, {"jit_f-cache": b"program f", "jit_g-cache": b"program g"})
    plant(how, shared, manifest, "jit_f-cache")
    nxt = run_ctx(tmp_path, "next")
    result, lines = staged(nxt, monkeypatch)
    (warning,) = warnings_of(lines)
    assert result["refused"] == ["jit_f-cache"] and result["staged"] == 1
    assert f"compile cache {shared}: not used: 1 whose bytes do not hash to the manifest's (jit_f-cache)" in warning
    assert warning.endswith("compiled again") and str(manifest) in warning
    if how == "both":
        assert "1 the manifest does not list (manifest.json)" in warning
    assert not (job_dir(nxt) / "jit_f-cache").exists() and not (job_dir(nxt) / "manifest.json").exists()
    assert (job_dir(nxt) / "jit_g-cache").read_bytes() == b"program g"  # the intact entry still serves
    # The job compiles the refused program again; the stage promotes it over the planted one, and the next run
    # stages it without a warning.
    (job_dir(nxt) / "jit_f-cache").write_bytes(b"program f")
    assert promoted(nxt, result, monkeypatch)["promoted"] == 1
    assert (shared / "jit_f-cache").read_bytes() == b"program f"
    again, lines = staged(run_ctx(tmp_path, "again"), monkeypatch)
    assert again["refused"] == [] and again["staged"] == 2
    # what the trusted side never wrote stays where it was planted, unlisted, and is said so at every stage-in
    assert [("does not list (manifest.json)" in w, "whose bytes" in w) for w in warnings_of(lines)] == (
        [(True, False)] if how == "both" else []
    )


def test_a_pod_that_rewrites_a_staged_entry_in_its_own_directory_changes_nothing_another_run_loads(
    tmp_path, monkeypatch
):
    shared, manifest = first_run(tmp_path, monkeypatch, {"jit_f-cache": b"program f"})
    before = manifest.read_bytes()
    ctx = run_ctx(tmp_path, "hostile")
    result, _ = staged(ctx, monkeypatch)
    (job_dir(ctx) / "jit_f-cache").write_bytes(PLANTED)  # its own copy: its pods may write there
    (job_dir(ctx) / ".jit_h-cache.tmp").write_bytes(b"a writer's temporary file")  # hidden: never an entry
    assert promoted(ctx, result, monkeypatch)["promoted"] == 0
    assert (shared / "jit_f-cache").read_bytes() == b"program f" and manifest.read_bytes() == before


def test_an_unreadable_manifest_stages_nothing_with_one_warning(tmp_path, monkeypatch):
    shared, manifest = first_run(tmp_path, monkeypatch, {"jit_f-cache": b"program f"})
    manifest.write_text("{not json")
    result, lines = staged(run_ctx(tmp_path, "next"), monkeypatch)
    (warning,) = warnings_of(lines)
    assert result["staged"] == 0 and "cannot be read" in warning and "1 the manifest does not list" in warning


# ---------------------------------------------------------------- with JAX's own persistent compilation cache


@pytest.mark.e2e  # runs in the maxtext environment, which `make test` builds while the fast tiers run
@pytest.mark.parametrize("how", ["bytes", "manifest", "both"])
def test_jax_loads_only_verified_programs_and_a_planted_one_is_compiled_again(tmp_path, monkeypatch, how):
    """Three runs through the train stage's staging and promotion, each a real JAX process pointed at the run's own
    directory (the job's ``jax_cache_dir``): the first compiles and is promoted; the second loads every program
    from the cache; the programs planted after it are not staged, so the third compiles them again, gets the same
    value and succeeds, after one warning line."""
    from components.platforms.local import envs
    from tests.helpers import REPO
    from tests.unit.test_compile_cache import COMPILE

    python = envs.ensure_env("maxtext").python

    def run(run_id: str) -> tuple[dict, list[str]]:
        ctx = run_ctx(tmp_path, run_id)
        result, lines = staged(ctx, monkeypatch)
        proc = subprocess.run(
            [python, "-c", COMPILE, str(job_dir(ctx))], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        promoted(ctx, result, monkeypatch)
        return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:]), lines

    first, lines = run("first")
    assert first["compiles"] >= 1 and first["hits"] == 0 and not warnings_of(lines)
    second, lines = run("second")
    assert second["hits"] == first["compiles"] and not warnings_of(lines)  # promoted, staged, loaded
    key = cache.key(resolve("local-maxtext", ""), IMAGE)
    shared, manifest = tmp_path / cache.CACHE_PREFIX / key, tmp_path / cache_trust.MANIFESTS_PREFIX / f"{key}.json"
    programs = [n for n in json.loads(manifest.read_text())["entries"] if n.endswith("-cache")]
    assert programs
    for name in programs:
        plant(how, shared, manifest, name)
    third, lines = run("third")
    assert len(warnings_of(lines)) == 1 and "compiled again" in warnings_of(lines)[0]
    assert third["value"] == first["value"] and third["hits"] == 0 and third["compiles"] == first["compiles"]
    assert not any("Error reading persistent compilation cache entry" in w for w in third["warnings"])  # never seen
