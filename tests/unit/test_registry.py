"""The model registry: one suite over both backends, the local directory and Vertex AI Model Registry (the real
google-cloud-aiplatform client against the emulated ModelService of tests/emulators/models.py); then what only the
wire shows (a call answered UNAVAILABLE is retried, PERMISSION_DENIED is reported naming the permission, a
registration or an alias move that fails leaves ``champion`` where it was); then two writers of the local
registry; then ``tpupipe models`` through ``pipelines.cli.main.main``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from components.registry import HISTORY_DEPTH, open_registry
from components.spec import InfraError, SpecError
from pipelines.cli.main import main
from tests.helpers import REPO

PROJECT, REGION = "tpupipe-emulated", "us-east5"
PARENT = f"projects/{PROJECT}/locations/{REGION}"
MODEL = f"{PARENT}/models/gemma-ft"
FAST = (0.01, 0.01, 0.01)  # the retry delays of these tests: four attempts in all
SHA = "3f2a9c1e0b7d4a6f8e5c2b1a0f9e8d7c6b5a4f3e"
IMAGE = "us-east5-docker.pkg.dev/tpupipe-emulated/tpupipe/torch@sha256:" + "ab" * 32


def provenance(run: int = 1, **changes) -> dict:
    return {
        "preset": "gemma4-e2b-v6e-16",
        "spec_hash": "sha256:" + "5e" * 32,
        "base_model": "google/gemma-4-E2B-it",
        "data_snapshot": "sha256:" + "d4" * 32,
        "trainer_image": IMAGE,
        "git_sha": SHA,
        "accelerator": "v6e",
        "topology": "4x4",
        "slices": 1,
        "tokens_seen": 1_234_567,
        "restarts": 0,
        "preemptions": 1,
        "eval_loss_before": 4.6511,
        "eval_loss_after": 1.0031,
        "pipeline_job": f"tpupipe-run-{run}",
        "run_id": f"gemma-run-{run}",
        **changes,
    }


def artifact(run: int) -> str:
    return f"gs://{PROJECT}-tpupipe/runs/gemma-run-{run}/checkpoint"


@pytest.fixture(params=["local", "vertex"])
def backend(request, tmp_path) -> str:
    if request.param == "vertex":
        request.getfixturevalue("vertex")
    return request.param


def _open(backend: str, tmp_path):
    if backend == "vertex":
        return open_registry(project=PROJECT, region=REGION, retry_delays_s=FAST)
    return open_registry(tmp_path)


@pytest.fixture
def registry(backend, tmp_path):
    return _open(backend, tmp_path)


def _registered(registry, count: int) -> list:
    return [registry.register("gemma-ft", artifact(n), provenance(n), {"team": "ml"}) for n in range(1, count + 1)]


# ---------------------------------------------------------------- both backends


def test_register_numbers_the_versions_and_keeps_what_it_was_given(registry):
    first, second = _registered(registry, 2)
    assert (first.version, second.version) == ("1", "2")
    assert first.name == "gemma-ft" and first.ref == "gemma-ft@1" and first.artifact_uri == artifact(1)
    assert first.provenance == provenance(1) and second.provenance == provenance(2)
    # The caller's labels and the provenance fields whose values are label values as they are; digests, the base
    # model (uppercase, '/'), losses ('.') and the pipeline job are in the provenance alone.
    assert first.labels == {
        "team": "ml",
        "preset": "gemma4-e2b-v6e-16",
        "git_sha": SHA,
        "accelerator": "v6e",
        "topology": "4x4",
        "slices": "1",
        "tokens_seen": "1234567",
        "restarts": "0",
        "preemptions": "1",
        "pipeline_job": "tpupipe-run-1",
        "run_id": "gemma-run-1",
    }
    assert first.aliases == () and first.created.endswith("Z")
    assert registry.get("gemma-ft", "1") == first and registry.get("gemma-ft", "2") == second
    assert registry.versions("gemma-ft") == [first, second]
    assert registry.models() == ["gemma-ft"]
    assert registry.champion("gemma-ft") is None and registry.history("gemma-ft") == []


def test_promote_moves_the_champion_and_one_version_holds_it(registry):
    _registered(registry, 3)
    assert registry.promote("gemma-ft", "1").aliases == ("champion",)
    promoted = registry.promote("gemma-ft", "3")
    assert promoted.version == "3" and promoted.aliases == ("champion",)
    assert registry.get("gemma-ft", "champion") == promoted == registry.champion("gemma-ft")
    assert [v.aliases for v in registry.versions("gemma-ft")] == [(), (), ("champion",)]
    assert registry.history("gemma-ft") == ["1", "3"]
    registry.promote("gemma-ft", "3")  # already there: nothing changes
    assert registry.history("gemma-ft") == ["1", "3"]


def test_rollback_walks_back_through_the_champions(registry):
    _registered(registry, 3)
    for version in ("1", "2", "3"):
        registry.promote("gemma-ft", version)
    assert registry.rollback("gemma-ft").version == "2"
    assert registry.champion("gemma-ft").version == "2" and registry.history("gemma-ft") == ["1", "2"]
    registry.promote("gemma-ft", "3")
    assert registry.history("gemma-ft") == ["1", "2", "3"]
    assert [registry.rollback("gemma-ft").version for _ in range(2)] == ["2", "1"]
    with pytest.raises(SpecError, match="no earlier champion to roll back to .version 1 is the first") as info:
        registry.rollback("gemma-ft")
    assert info.value.field == "name"
    assert registry.champion("gemma-ft").version == "1"


def test_rollback_of_a_model_without_a_champion_says_so(registry):
    _registered(registry, 1)
    with pytest.raises(SpecError, match="no version is champion"):
        registry.rollback("gemma-ft")


def test_other_aliases_move_on_their_own(registry):
    _registered(registry, 2)
    registry.promote("gemma-ft", "1")
    assert registry.set_alias("gemma-ft", "2", "candidate").aliases == ("candidate",)
    assert registry.get("gemma-ft", "candidate").version == "2" and registry.champion("gemma-ft").version == "1"
    registry.set_alias("gemma-ft", "1", "candidate")
    assert registry.get("gemma-ft", "1").aliases == ("candidate", "champion")
    assert registry.rollback("gemma-ft", alias="candidate").version == "2"
    assert registry.champion("gemma-ft").version == "1"


def test_the_alias_history_is_bounded(registry):
    _registered(registry, 2)
    for i in range(HISTORY_DEPTH + 3):
        registry.promote("gemma-ft", str(1 + i % 2))
    history = registry.history("gemma-ft")
    assert len(history) == HISTORY_DEPTH and history[-1] == str(1 + (HISTORY_DEPTH + 2) % 2)
    assert registry.rollback("gemma-ft").version == history[-2]


@pytest.mark.parametrize(
    ("call", "field", "message", "valid"),
    [
        (lambda r: r.get("nope", "1"), "name", "no model 'nope' in ", "gemma-ft"),
        (lambda r: r.versions("nope"), "name", "no model 'nope' in ", "gemma-ft"),
        (lambda r: r.champion("nope"), "name", "no model 'nope' in ", "gemma-ft"),
        (lambda r: r.promote("nope", "1"), "name", "no model 'nope' in ", "gemma-ft"),
        (lambda r: r.rollback("nope"), "name", "no model 'nope' in ", "gemma-ft"),
        (lambda r: r.get("gemma-ft", "9"), "version", "model 'gemma-ft' has no version or alias '9'", "1, 2"),
        (lambda r: r.get("gemma-ft", "candidate"), "version", "has no version or alias 'candidate'", "1, 2"),
        (lambda r: r.get("gemma-ft", "Champion/x"), "version", "has no version or alias 'Champion/x'", "1, 2"),
        (lambda r: r.promote("gemma-ft", "9"), "version", "model 'gemma-ft' has no version '9'", "1, 2"),
        (lambda r: r.promote("gemma-ft", "champion"), "version", "has no version 'champion'", "1, 2"),
    ],
)
def test_unknown_names_and_versions_are_named(registry, call, field, message, valid):
    _registered(registry, 2)
    with pytest.raises(SpecError) as info:
        call(registry)
    assert info.value.field == field and message in str(info.value) and f"(valid: {valid}" in str(info.value)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda r: r.register("Gemma", artifact(1), provenance()), "name"),
        (lambda r: r.register("gemma-ft", "", provenance()), "artifact_uri"),
        (
            lambda r: r.register("gemma-ft", artifact(1), {k: v for k, v in provenance().items() if k != "git_sha"}),
            "provenance.git_sha",
        ),
        (
            lambda r: r.register("gemma-ft", artifact(1), provenance(trainer_image="tpupipe/torch:latest")),
            "provenance.trainer_image",
        ),
        (lambda r: r.register("gemma-ft", artifact(1), provenance(restarts=-1)), "provenance.restarts"),
        (lambda r: r.register("gemma-ft", artifact(1), provenance(tokens_seen=1.5)), "provenance.tokens_seen"),
        (lambda r: r.register("gemma-ft", artifact(1), provenance(), {"preset": "other"}), "labels"),
        (lambda r: r.register("gemma-ft", artifact(1), provenance(), {"Team": "ml"}), "labels"),
        (lambda r: r.register("gemma-ft", artifact(1), provenance(), {"team": "ML/x"}), "labels"),
        (lambda r: r.register("gemma-ft", artifact(1), provenance(), {"tpupipe-registration": "x"}), "labels"),
        (lambda r: r.set_alias("gemma-ft", "1", "default"), "alias"),
        (lambda r: r.set_alias("gemma-ft", "1", "champion-2"), "alias"),
        (lambda r: r.set_alias("gemma-ft", "1", "7"), "alias"),
    ],
)
def test_bad_input_is_refused_naming_the_field(registry, call, field):
    _registered(registry, 1)
    with pytest.raises(SpecError) as info:
        call(registry)
    assert info.value.field == field
    assert len(registry.versions("gemma-ft")) == 1 and registry.versions("gemma-ft")[0].aliases == ()


# ---------------------------------------------------------------- Vertex AI at the wire


@pytest.fixture
def vertex_registry(vertex):
    return open_registry(project=PROJECT, region=REGION, retry_delays_s=FAST)


def test_upload_answered_unavailable_is_retried(vertex, vertex_registry):
    vertex.fail("UploadModel", 503, times=2)
    version = vertex_registry.register("gemma-ft", artifact(1), provenance())
    assert version.version == "1" and vertex.calls.count("UploadModel") == 3
    assert [v.version for v in vertex_registry.versions("gemma-ft")] == ["1"]


def test_an_upload_whose_answer_was_lost_is_not_registered_twice(vertex, vertex_registry):
    _registered(vertex_registry, 1)
    vertex.fail("UploadModel", 503, lost=True)  # the version is created, the client sees UNAVAILABLE
    version = vertex_registry.register("gemma-ft", artifact(2), provenance(2))
    assert version.version == "2" and version.provenance == provenance(2)
    assert [v.version for v in vertex_registry.versions("gemma-ft")] == ["1", "2"]
    assert vertex.calls.count("UploadModel") == 2  # the first version's, and this one's once


def test_unavailable_every_time_is_reported_naming_the_call(vertex, vertex_registry):
    _registered(vertex_registry, 1)
    vertex_registry.promote("gemma-ft", "1")
    vertex.fail("UploadModel", 503, times=100)
    with pytest.raises(
        InfraError,
        match=r"registering a version of model 'gemma-ft' failed 4 times, the last with "
        r"UNAVAILABLE \(HTTP 503\): The service is currently unavailable",
    ):
        vertex_registry.register("gemma-ft", artifact(2), provenance(2))
    assert vertex.calls.count("UploadModel") == 1 + 4
    vertex.faults.clear()
    assert [v.version for v in vertex_registry.versions("gemma-ft")] == ["1"]
    assert vertex_registry.champion("gemma-ft").version == "1"


def test_permission_denied_is_reported_at_once_naming_the_permission_and_project(vertex, vertex_registry):
    _registered(vertex_registry, 1)
    vertex_registry.promote("gemma-ft", "1")
    vertex.fail("UploadModel", 403)
    with pytest.raises(InfraError) as info:
        vertex_registry.register("gemma-ft", artifact(2), provenance(2))
    text = str(info.value)
    assert "permission aiplatform.models.upload denied in project tpupipe-emulated" in text
    assert "roles/aiplatform.user" in text and "registering a version of model 'gemma-ft'" in text
    assert vertex.calls.count("UploadModel") == 2  # the first version's, and one refused: never retried
    assert [v.version for v in vertex_registry.versions("gemma-ft")] == ["1"]
    assert vertex_registry.champion("gemma-ft").version == "1"


def test_an_upload_whose_operation_fails_leaves_the_champion(vertex, vertex_registry):
    _registered(vertex_registry, 1)
    vertex_registry.promote("gemma-ft", "1")
    vertex.fail("UploadModel", None)  # accepted; the operation ends INTERNAL, nothing is created
    with pytest.raises(InfraError, match="INTERNAL"):
        vertex_registry.register("gemma-ft", artifact(2), provenance(2))
    assert [v.version for v in vertex_registry.versions("gemma-ft")] == ["1"]
    assert vertex_registry.champion("gemma-ft").version == "1"


def test_an_alias_move_denied_leaves_the_champion(vertex, vertex_registry):
    _registered(vertex_registry, 2)
    vertex_registry.promote("gemma-ft", "1")
    vertex.fail("MergeVersionAliases", 503)
    vertex.fail("MergeVersionAliases", 403)
    with pytest.raises(InfraError, match="permission aiplatform.models.update denied in project tpupipe-emulated"):
        vertex_registry.promote("gemma-ft", "2")
    assert vertex.calls.count("MergeVersionAliases") == 1 + 2  # the first promotion's; then 503, retried, 403
    assert vertex_registry.champion("gemma-ft").version == "1" and vertex_registry.history("gemma-ft") == ["1"]


def test_a_rollback_cut_short_is_finished_by_the_next(vertex, vertex_registry):
    _registered(vertex_registry, 2)
    vertex_registry.promote("gemma-ft", "1")
    vertex_registry.promote("gemma-ft", "2")
    # The rollback's second step (champion to version 1) is refused after its first (the history's end removed).
    vertex.fail("MergeVersionAliases", 403, when=lambda body: "champion" in body.get("versionAliases", []))
    with pytest.raises(InfraError, match="step 2 of 2"):
        vertex_registry.rollback("gemma-ft")
    assert vertex_registry.champion("gemma-ft").version == "2" and vertex_registry.history("gemma-ft") == ["1"]
    assert vertex_registry.rollback("gemma-ft").version == "1"
    assert vertex_registry.history("gemma-ft") == ["1"]
    with pytest.raises(SpecError, match="no earlier champion"):
        vertex_registry.rollback("gemma-ft")


def test_vertex_default_alias_follows_the_champion(vertex, vertex_registry):
    _registered(vertex_registry, 3)
    assert vertex.aliases(MODEL)["default"] == "1"  # Vertex's rule: the first version is the default
    vertex_registry.promote("gemma-ft", "3")
    assert vertex.aliases(MODEL)["default"] == "3"
    vertex_registry.promote("gemma-ft", "2")
    vertex_registry.rollback("gemma-ft")
    assert vertex.aliases(MODEL)["default"] == "3" == vertex_registry.champion("gemma-ft").version
    assert all("default" not in v.aliases for v in vertex_registry.versions("gemma-ft"))


def test_vertex_takes_a_cloud_storage_artifact_and_lists_only_its_models(vertex, vertex_registry, tmp_path):
    with pytest.raises(SpecError) as info:
        vertex_registry.register("gemma-ft", str(tmp_path / "checkpoint"), provenance())
    assert info.value.field == "artifact_uri" and vertex.calls.count("UploadModel") == 0
    _registered(vertex_registry, 1)
    vertex.upload(PARENT, {"modelId": "someone-else", "model": {"displayName": "someone-else"}})
    assert vertex_registry.models() == ["gemma-ft"]


def test_a_model_created_by_another_writer_meanwhile_gets_this_as_its_next_version(vertex, vertex_registry):
    def other_writer_first(request: dict) -> bool:  # between this registry's look-up and its upload
        if request.get("modelId") == "gemma-ft":
            vertex.upload(
                PARENT,
                {"modelId": "gemma-ft", "model": {"displayName": "gemma-ft", "labels": {"tpupipe-registry": "v1"}}},
            )
        return False  # no fault: the upload goes on, and finds the model there

    vertex.fail("UploadModel", 503, when=other_writer_first)
    version = vertex_registry.register("gemma-ft", artifact(1), provenance())
    assert version.version == "2" and version.provenance == provenance()
    assert [v.version for v in vertex_registry.versions("gemma-ft")] == ["1", "2"]


# ---------------------------------------------------------------- the local registry's files


WRITER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from components.registry import open_registry
registry = open_registry(sys.argv[2])
for uri, provenance in json.loads(sys.argv[3]):
    registry.register("gemma-ft", uri, provenance)
    registry.promote("gemma-ft", "1")
"""


def test_two_writers_never_share_a_version_id_nor_leave_half_a_file(tmp_path):
    work = json.dumps([(artifact(n), provenance(n)) for n in range(8)])
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(REPO), str(tmp_path), work]) for _ in range(2)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    registry = open_registry(tmp_path)
    versions = registry.versions("gemma-ft")
    assert [v.version for v in versions] == [str(n) for n in range(1, 17)]
    assert sorted(v.provenance["run_id"] for v in versions) == sorted(f"gemma-run-{n}" for n in range(8) for _ in "ab")
    model = tmp_path / "registry" / "gemma-ft"
    assert json.loads((model / "aliases.json").read_text()) == {"champion": "1", "champion-1": "1"}
    assert sorted(p.name for p in model.rglob("*") if p.is_file() and p.name != ".lock") == sorted(
        ["aliases.json", *(f"{n}.json" for n in range(1, 17))]
    )  # no temporary file left behind


# ---------------------------------------------------------------- tpupipe models


def _place(backend: str, tmp_path) -> list[str]:
    return ["--project", PROJECT, "--region", REGION] if backend == "vertex" else ["--output-root", str(tmp_path)]


def test_models_commands_list_show_promote_and_rollback(backend, tmp_path, capsys):
    registry = _open(backend, tmp_path)
    _registered(registry, 2)
    place = _place(backend, tmp_path)
    assert main(["models", "list", *place]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["MODEL", "VERSIONS", "CHAMPION", "LATEST"]
    assert lines[1].split() == ["gemma-ft", "2", "-", "2"]

    assert main(["models", "show", "gemma-ft@1", *place]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gemma-ft@1\n") and f"artifact          {artifact(1)}" in out
    for key, value in provenance(1).items():
        assert f"    {key:<18} {value}\n" in out, key

    assert main(["models", "show", "gemma-ft", *place]) == 0
    assert capsys.readouterr().out.startswith("gemma-ft@2  (no champion yet: the newest version)")

    assert main(["models", "promote", "gemma-ft", "1", *place]) == 0
    assert capsys.readouterr().out == "gemma-ft: champion is now version 1 (was none)\n"
    assert main(["models", "promote", "gemma-ft", "2", *place]) == 0
    assert capsys.readouterr().out == "gemma-ft: champion is now version 2 (was 1)\n"
    assert main(["models", "show", "gemma-ft@champion", *place]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gemma-ft@2\n") and "  aliases           champion\n" in out
    assert "  champion history  1 -> 2\n" in out

    assert main(["models", "list", "gemma-ft", *place]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1], r[3], r[4], r[5]) for r in rows] == [
        ("1", "-", "1.0031", "gemma-run-1", artifact(1)),
        ("2", "champion", "1.0031", "gemma-run-2", artifact(2)),
    ]

    assert main(["models", "rollback", "gemma-ft", *place]) == 0
    assert capsys.readouterr().out == "gemma-ft: champion moved back to version 1 (from 2)\n"
    assert registry.champion("gemma-ft").version == "1"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["models", "show", "nope@1"], "tpupipe: error: name: no model 'nope' in "),
        (["models", "list", "nope"], "tpupipe: error: name: no model 'nope' in "),
        (
            ["models", "show", "gemma-ft@7"],
            "tpupipe: error: version: model 'gemma-ft' has no version or alias '7' (valid: 1)",
        ),
        (
            ["models", "promote", "gemma-ft", "7"],
            "tpupipe: error: version: model 'gemma-ft' has no version '7' (valid: 1)",
        ),
        (["models", "rollback", "gemma-ft"], "tpupipe: error: name: 'gemma-ft': no earlier champion to roll back to"),
        (["models", "rollback", "nope"], "tpupipe: error: name: no model 'nope' in "),
    ],
)
def test_models_commands_exit_2_naming_the_unknown_field(backend, tmp_path, capsys, argv, error):
    _registered(_open(backend, tmp_path), 1)
    assert main([*argv, *_place(backend, tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(error) and captured.out == ""


def test_models_commands_on_an_empty_registry_and_with_two_places(tmp_path, capsys):
    assert main(["models", "list", "--output-root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no models in {tmp_path / 'registry'}\n"
    assert main(["models", "list", "--output-root", str(tmp_path), "--project", PROJECT]) == 2
    assert capsys.readouterr().err.startswith("tpupipe: error: --output-root: ")


def test_models_command_denied_exits_1_naming_the_permission(vertex, capsys):
    vertex.fail("ListModels", 403)
    assert main(["models", "list", "--project", PROJECT, "--region", REGION]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "tpupipe: error: Vertex AI Model Registry (projects/tpupipe-emulated/locations/us-east5): "
        "listing the models: permission aiplatform.models.list denied in project tpupipe-emulated"
    )
    assert vertex.calls == ["ListModels"]
