"""The chart's optional Grafana dashboard ConfigMap: off by default; on, it holds
deploy/grafana/slorouter.json as it is, labelled for Grafana's dashboard sidecar."""

from __future__ import annotations

import json

import pytest

from tests.helpers.chart import CHART, NAMESPACE, ROOT, Render, one, validate

pytestmark = pytest.mark.processes

DASHBOARD = ROOT / "deploy" / "grafana" / "slorouter.json"


def test_dashboard_configmap_is_off_by_default(render: Render) -> None:
    assert not [
        m for m in render() if m["kind"] == "ConfigMap" and "grafana_dashboard" in m["metadata"]["labels"]
    ]


def test_dashboard_configmap_holds_the_dashboard_file(render: Render) -> None:
    # The chart packages its own copy (helm reads files inside the chart only): it must be the same file.
    assert (CHART / "dashboards" / "slorouter.json").read_bytes() == DASHBOARD.read_bytes()
    manifests = render(
        {
            "inferenceExtension.monitoring.grafanaDashboard.enabled": "true",
            "inferenceExtension.monitoring.grafanaDashboard.extraLabels.team": "inference",
            "inferenceExtension.monitoring.grafanaDashboard.annotations.grafana_folder": "slorouter",
        }
    )
    dashboards = [
        m for m in manifests if m["kind"] == "ConfigMap" and "grafana_dashboard" in m["metadata"]["labels"]
    ]
    configmap = one(dashboards, "ConfigMap")
    validate(configmap)
    metadata = configmap["metadata"]
    assert metadata["namespace"] == NAMESPACE
    assert metadata["labels"]["grafana_dashboard"] == "1" and metadata["labels"]["team"] == "inference"
    assert metadata["annotations"] == {"grafana_folder": "slorouter"}
    assert list(configmap["data"]) == ["slorouter.json"]
    assert json.loads(configmap["data"]["slorouter.json"]) == json.loads(DASHBOARD.read_text())
    assert configmap["data"]["slorouter.json"] + "\n" == DASHBOARD.read_text()
