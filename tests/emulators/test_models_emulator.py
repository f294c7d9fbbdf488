"""The emulated Vertex AI Model Registry (tests/emulators/models.py) answers as Vertex AI does: the real
google-cloud-aiplatform ModelServiceClient against it, over REST; its models registered through tpupipe's registry."""

from __future__ import annotations

import pytest

from components.cloud.credentials import credentials
from components.registry import open_registry
from tests.unit.test_registry import MODEL, PARENT, PROJECT, REGION, _registered


def _upload(**request):
    return lambda client: client.upload_model(request=request)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (
            _upload(parent=PARENT, model_id="gemma-ft", model={"display_name": "gemma-ft"}),
            "409 .*Model projects/tpupipe-emulated/locations/us-east5/models/gemma-ft already exists",
        ),
        (
            _upload(parent=f"projects/{PROJECT}/locations/us_east5", model_id="x", model={"display_name": "x"}),
            "400 .*Invalid parent",
        ),
        (_upload(parent=PARENT, model_id="9lives", model={"display_name": "x"}), "400 .*Invalid model_id"),
        (
            _upload(parent=PARENT, parent_model=f"{PARENT}/models/nope", model={"display_name": "x"}),
            "404 .*parent model .*nope does not exist",
        ),
        (
            _upload(parent=PARENT, model_id="x", model={"display_name": "x", "artifact_uri": "gs://b/m"}),
            "400 .*container_spec.image_uri is required",
        ),
        (
            _upload(parent=PARENT, model_id="x", model={"display_name": "x", "labels": {"A": "b"}}),
            "400 .*Invalid label",
        ),
        (_upload(parent=PARENT, model_id="x", model={}), "400 .*display_name is required"),
        (lambda c: c.get_model(name=f"{MODEL}@7"), "404 .*no version 7"),
        (lambda c: c.get_model(name=f"{MODEL}@golden"), "404 .*no version has the alias 'golden'"),
        (lambda c: c.get_model(name=f"{PARENT}/models/nope"), "404 .*nope does not exist"),
        (
            lambda c: c.merge_version_aliases(name=f"{MODEL}@1", version_aliases=["-default"]),
            "400 .*default alias cannot be removed",
        ),
        (lambda c: c.merge_version_aliases(name=f"{MODEL}@1", version_aliases=["42"]), "400 .*Invalid version alias"),
        (
            lambda c: c.merge_version_aliases(name=f"{MODEL}@1", version_aliases=["Golden"]),
            "400 .*Invalid version alias",
        ),
    ],
)
def test_the_emulator_answers_as_vertex_does(vertex, call, error):
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    _registered(open_registry(project=PROJECT, region=REGION), 1)
    client = aiplatform_v1.ModelServiceClient(
        credentials=credentials(), transport="rest", client_options={"api_endpoint": vertex.endpoint}
    )
    with pytest.raises(exceptions.GoogleAPICallError, match=error):
        call(client)


def test_the_emulator_moves_an_alias_and_default_stays_on_one_version(vertex):
    from google.cloud import aiplatform_v1

    _registered(open_registry(project=PROJECT, region=REGION), 2)
    client = aiplatform_v1.ModelServiceClient(
        credentials=credentials(), transport="rest", client_options={"api_endpoint": vertex.endpoint}
    )
    client.merge_version_aliases(name=f"{MODEL}@1", version_aliases=["golden"])
    moved = client.merge_version_aliases(name=f"{MODEL}@2", version_aliases=["golden", "default"])
    assert sorted(moved.version_aliases) == ["default", "golden"]
    assert vertex.aliases(MODEL) == {"default": "2", "golden": "2"}
    assert client.get_model(name=f"{MODEL}@golden").version_id == "2" == client.get_model(name=MODEL).version_id
    assert [m.version_id for m in client.list_models(parent=PARENT)] == ["2"]  # each model once, as its default
