"""Kubernetes quantities as the gke platform reads them off Kueue's objects and pod requests
(https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/)."""

from __future__ import annotations

import pytest

from components.platforms.gke.cloud.kueue import quantity


def test_a_quantity_in_each_form():
    assert quantity(4) == 4.0
    assert quantity("500m") == 0.5
    assert quantity("16Gi") == 16 * 2**30
    assert quantity("2k") == 2000.0


def test_text_that_is_no_quantity_is_named():
    with pytest.raises(ValueError, match="not a Kubernetes quantity: 'lots'"):
        quantity("lots")
