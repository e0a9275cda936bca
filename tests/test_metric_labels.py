"""The client's model name labels series; their number is bounded (docs/reliability.md, "Metric label
cardinality")."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from slorouter.config import GatewayConfig
from slorouter.metrics import OVERFLOW_MODEL_LABEL, GatewayMetrics, LatencyMetrics, ModelLabelSets


def test_pairs_beyond_the_bound_are_recorded_as_other_and_counted():
    labels = ModelLabelSets(CollectorRegistry(), limit=2)
    assert labels("a", "a") == ("a", "a")
    assert labels("b", "x") == ("b", "x")
    assert labels("c", "c") == (OVERFLOW_MODEL_LABEL, OVERFLOW_MODEL_LABEL)
    assert labels("a", "a") == ("a", "a")  # a known pair stays itself
    assert labels("d", "d") == (OVERFLOW_MODEL_LABEL, OVERFLOW_MODEL_LABEL)
    assert labels.overflows._value.get() == 2


def test_the_gateway_and_pipeline_series_share_one_bound_and_render_it():
    metrics = GatewayMetrics(max_model_label_sets=3)
    latency = LatencyMetrics(metrics.registry, metrics.model_labels)
    for i in range(50):
        ttft, _ = metrics.latency_children(f"model-{i}", f"model-{i}")
        ttft.observe(0.1)
        latency.shed.labels(*latency.model_labels(f"model-{i}", f"model-{i}")).inc()
    page = metrics.render().decode()
    series = {line.split("{")[1].split("}")[0] for line in page.splitlines()
              if line.startswith("inference_objective_request_ttft_seconds_count{")}  # fmt: skip
    assert len(series) == 4  # three models and __other__
    assert f'model_name="{OVERFLOW_MODEL_LABEL}"' in page
    assert "slorouter_model_label_overflow_total 94.0" in page  # 47 TTFT + 47 shed lookups beyond the bound


def test_the_bound_is_in_the_gateway_config():
    assert GatewayConfig().max_model_label_sets == 256
