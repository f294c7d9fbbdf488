"""The compile cache kept across runs: one directory per trainer image, accelerator, topology and model, so no
program compiled for another is ever looked up (``components.workload.cache``); the train job's MaxText arguments
and the plan carry it; a damaged entry costs a compile and a warning, never the run (a real JAX compile in the
maxtext environment, ``trainers.jax_events`` counting what the cache served)."""

from __future__ import annotations

import json
import subprocess

import pytest

from components.spec import layered
from components.workload import cache
from components.workload.derive import job_command

DIGEST = "sha256:" + "ab" * 32


def _key(preset: str = "llama3-8b-v6e-16x2", image: str = f"r/maxtext@{DIGEST}", **overrides) -> str:
    spec = layered(preset, overrides) if overrides else layered(preset)
    return cache.key(spec, image)


def test_the_key_names_the_image_the_slice_and_the_model():
    assert _key() == f"compile/llama3-8b/v6e-4x4-2-slice/{'ab' * 32}"
    assert _key("local-maxtext", f"local/maxtext@{'cd' * 8}") == f"compile/tiny-llama/cpu-2hosts-1-slice/{'cd' * 8}"
    assert _key("gemma4-e2b-v6e-16", f"r/torch@{DIGEST}").startswith("compile/google-gemma-4-E2B-it/v6e-4x4-1-slice/")


@pytest.mark.parametrize(
    "change",
    [
        {"image": f"r/maxtext@sha256:{'ef' * 32}"},  # another image (jax, libtpu, MaxText, our trainer)
        {"overrides": {"cluster.topology": "2x4"}},
        {"overrides": {"cluster.num_slices": "1", "maxtext.dcn_fsdp_parallelism": "1"}},
        {"overrides": {"maxtext.model_name": "llama3.1-8b"}},
        {"overrides": {"cluster.accelerator": "v5p", "cluster.topology": "2x2x2"}},
    ],
)
def test_the_key_changes_with_each_part_so_no_stale_program_is_loaded(change):
    base = _key()
    changed = _key(image=change.get("image", f"r/maxtext@{DIGEST}"), **change.get("overrides", {}))
    assert changed != base


def test_the_train_job_carries_the_cache_as_maxtexts_jax_cache_dir():
    spec = layered("local-maxtext")
    where = cache.directory("/out/cache", spec, f"local/maxtext@{'cd' * 8}")
    words = job_command(spec, "train", "/out/r/train", "r", compile_cache=where).split()
    assert f"jax_cache_dir=/out/cache/compile/tiny-llama/cpu-2hosts-1-slice/{'cd' * 8}" in words
    assert not any(w.startswith("jax_cache_dir=") for w in job_command(spec, "train", "/o", "r").split())
    assert cache.directory("", spec, "x@y") == ""  # a platform that keeps nothing


def test_the_plan_shows_where_the_cache_is_and_the_checkpoints_retention_and_size():
    from components.platforms.gke.plan import document

    plan = document.build(layered("llama3-70b-v6e-16x2"), "r1")
    tr = plan["training"]
    key = "compile/llama3-70b/v6e-4x4-2-slice/IMAGE-DIGEST"
    job = tr["compile_cache"]["compile_job"]
    assert {k: v for k, v in tr["compile_cache"].items() if k != "compile_job"} == {
        "uri": f"gs://PROJECT_ID-tpupipe/cache/{key}",  # read-only to the pods: the train stage records into it
        "path": f"/data/runs/r1/cache/{key}",  # the training job's own copy: the verified entries, and what it compiles
        "manifest": f"gs://PROJECT_ID-tpupipe/state/_cache/{key}.json",  # the hashes, where no pod reaches
    }
    # the compile job that alone fills it: who runs it, where it writes, on what inputs, and why that is trusted
    assert job["path"] == f"/data/runs/r1/compiled/NONCE/{key}" and job["submission_id"].startswith("r1")
    words = job["entrypoint"].split()
    assert words[:4] == ["python", "-m", "trainers.maxtext_train", "compile"]
    assert "dataset_type=synthetic" in words and f"jax_cache_dir={job['path']}" in words
    assert not any(w.startswith(("hf_", "tokenizer_path=", "load_parameters_path=")) for w in words)
    assert "steps=1" in words and "learning_rate_schedule_steps=100" in job["entrypoint"].split(" -- ")[1].split()
    assert "service account tpupipe-r1" in job["identity"] and "before the run's training job" in job["trusted_because"]
    assert tr["checkpoints"]["kept"] == 2
    # Llama 3 70B: 70.55e9 parameters (MaxText's llama3-70b.yml dimensions), 12 bytes each in a checkpoint
    assert tr["checkpoints"]["parameters"] == 70_553_706_496
    assert tr["checkpoints"]["bytes_kept"] == 2 * 12 * 70_553_706_496
    text = document.render_text(plan)
    assert "kept        the newest 2 checkpoints: 1,693.3 GB (846.6 GB each" in text
    assert "compiled    gs://PROJECT_ID-tpupipe/cache/compile/llama3-70b/" in text
    assert "compile job r1" in text and "trusted because it runs only when" in text
    fsdp = document.build(layered("gemma4-e2b-v6e-16"), "r2")
    assert fsdp["training"]["compile_cache"] is None
    assert any("keeps no compiled programs across runs" in w for w in fsdp["warnings"])


def test_the_compile_job_runs_at_the_training_size_and_its_configuration_names_the_device_count():
    """An elastic run's training job may run with fewer workers, but the compile job runs with the range's maximum
    (Ray Train's ``num_workers`` a count, never a range), and the configuration it records names its device count,
    so a smaller group's programs are never taken for a full-size job's."""
    from components.workload import maxtext
    from components.workload.derive import compile_devices

    spec = layered("llama3-8b-v6e-elastic-spot")
    import shlex

    words = {mode: shlex.split(job_command(spec, mode, "/o", "r")) for mode in ("train", "compile")}
    scaling = {mode: json.loads(w[w.index("--scaling-config") + 1]) for mode, w in words.items()}
    assert scaling["train"]["num_workers"] == [spec.train.min_workers, spec.train.max_workers]
    assert scaling["compile"]["num_workers"] == spec.train.max_workers
    assert compile_devices(spec) == spec.train.max_workers * 4  # v6e: 4 chips per host
    smaller = layered("llama3-8b-v6e-elastic-spot", {"train.max_workers": str(spec.train.min_workers)})
    assert maxtext.compile_config(smaller, compile_devices(smaller)) != maxtext.compile_config(
        spec, compile_devices(spec)
    )


def test_the_compile_job_has_its_own_short_deadline_in_the_plan():
    from components.platforms.gke.plan import document
    from components.workload import cache_trust

    plan = document.build(layered("llama3-70b-v6e-16x2"), "r1")
    assert plan["training"]["compile_cache"]["compile_job"]["timeout_s"] == cache_trust.COMPILE_TIMEOUT_S == 1800
    assert plan["training"]["timeout_s"] > 1800
    assert cache_trust.compile_timeout_s(layered("llama3-70b-v6e-16x2", {"train.timeout_s": "600"})) == 600


def test_llama3_8b_has_its_published_size():
    from components.workload import maxtext

    assert maxtext.parameters(layered("llama3-8b-v6e-16x2")) == 8_030_261_248  # "8B" (8.03e9)


# A process of the maxtext environment: compile one program with the cache in argv[1], print what was counted.
COMPILE = r"""
import json, sys, warnings
import jax, jax.numpy as jnp
from jax.experimental.compilation_cache import compilation_cache
from trainers.jax_events import JaxEvents

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
compilation_cache.set_cache_dir(sys.argv[1])
events = []
counter = JaxEvents(lambda kind, payload: events.append(payload)).register()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    value = float(jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.arange(64.0).reshape(8, 8) / 64))
print("RESULT " + json.dumps({"value": value, **counter.summary(), "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.trainer_env  # runs in the maxtext environment, which `make test` builds while the fast tiers run
def test_a_damaged_cache_entry_is_compiled_again_with_a_warning(tmp_path):
    from components.platforms.local import envs
    from tests.helpers import REPO

    python = envs.ensure_env("maxtext").python

    def compile_once() -> dict:
        proc = subprocess.run(
            [python, "-c", COMPILE, str(tmp_path / "cache")], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])

    first = compile_once()
    assert first["compiles"] >= 1 and first["hits"] == 0
    assert compile_once()["hits"] == first["compiles"]  # the second process compiles nothing
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_file()]
    assert entries
    for entry in entries:  # every entry damaged: not an executable any more
        entry.write_bytes(b"\x00not a compiled program" * 8)
    damaged = compile_once()
    assert damaged["value"] == first["value"] and damaged["hits"] == 0
    assert any("Error reading persistent compilation cache entry" in w for w in damaged["warnings"]), damaged
    # JAX does not overwrite an entry it has (jax/_src/lru_cache.py, LRUCache.put: "If a cache item with the same
    # key already exists, no action will be taken"): the damaged entry stays a miss with a warning, run after run
    again = compile_once()
    assert again["value"] == first["value"] and again["hits"] == 0 and again["warnings"]


def test_jax_events_lists_long_compiles_and_counts_every_one_and_the_saves_blocking_time():
    from trainers import jax_events

    sent: list[dict] = []
    ev = jax_events.JaxEvents(lambda kind, payload: sent.append(payload))
    ev.on_span(jax_events.COMPILE_SPAN, 10.0, 12.5)  # a compile of 2.5 s
    ev.on_event(jax_events.CACHE_HIT)
    ev.on_span(jax_events.COMPILE_SPAN, 13.0, 13.01)  # a load from the cache, too short to list
    ev.on_duration("/jax/orbax/write/checkpoint_start_sync_duration_secs", 0.05)
    ev.on_duration("/jax/orbax/write/blocking_wait_prev_duration_secs", 0.1)
    ev.on_duration(jax_events.SAVE_BLOCKED[0], 0.3)
    ev.on_duration(jax_events.SAVE_TOTAL, 4.0)
    assert sent[0] == {"event": "compiled", "seconds": 2.5, "hit": False, "time": 12.5}
    assert sent[1]["event"] == "checkpoint_written" and sent[1]["seconds"] == 4.0
    assert ev.take_blocked() == {"seconds": 0.3, "start_sync_s": 0.05, "wait_previous_s": 0.1}
    assert ev.take_blocked() is None
    summary = ev.summary()
    assert (summary["compiles"], summary["hits"], summary["seconds"]) == (2, 1, 2.51)
