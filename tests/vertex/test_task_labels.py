"""The Vertex AI run's labels a task is given, as they go on what a gke run creates."""

from __future__ import annotations

import json

from components.platforms import VERTEX_TASK_ENV, vertex_run_labels
from components.platforms.gke.run.session import with_labels


def test_a_tasks_run_labels_go_on_every_resource_labels_and_the_runs_own_win():
    given = {"vertex-ai-pipelines-run-billing-id": "870", "team": "ml", "Bad Key": "x", "tpupipe-run": "other"}
    labels = vertex_run_labels({VERTEX_TASK_ENV: json.dumps(given)})
    assert labels == {"vertex-ai-pipelines-run-billing-id": "870", "team": "ml", "tpupipe-run": "other"}
    assert vertex_run_labels({}) == {} and vertex_run_labels({VERTEX_TASK_ENV: "not json"}) == {}
    body = {
        "name": "c",
        "resourceLabels": {"tpupipe-run": "r1"},
        "nodePools": [{"config": {"resourceLabels": {"tpupipe-run": "r1"}, "labels": {"k": "v"}}}],
    }
    labelled = with_labels(body, labels)
    expected = {"vertex-ai-pipelines-run-billing-id": "870", "team": "ml", "tpupipe-run": "r1"}
    assert labelled["resourceLabels"] == expected
    assert labelled["nodePools"][0]["config"]["resourceLabels"] == expected
    assert labelled["nodePools"][0]["config"]["labels"] == {"k": "v"}  # Kubernetes node labels: not billing's
    assert body["resourceLabels"] == {"tpupipe-run": "r1"}  # the plan's body is left as it was
