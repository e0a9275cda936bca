"""The gateway's loop-local counters and histograms expose what prometheus_client's would."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram

from slorouter.metrics import SCHEDULER_BUCKETS, LoopCounter, LoopHistogram


def test_loop_histogram_matches_prometheus_client_on_random_and_boundary_values():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("h_seconds", "doc", ("a",), buckets=SCHEDULER_BUCKETS, registry=ours)
    reference = Histogram("h_seconds", "doc", ("a",), buckets=SCHEDULER_BUCKETS, registry=theirs)
    rng = np.random.default_rng(0)
    values = [*SCHEDULER_BUCKETS, 0.0, 1e9, *rng.exponential(0.001, 500).tolist()]  # bounds are inclusive
    for i, value in enumerate(values):
        label = "x" if i % 3 else "y"
        loop.labels(label).observe(value)
        reference.labels(label).observe(value)
    for label in ("x", "y"):
        for le in [*(str(b) for b in SCHEDULER_BUCKETS), "+Inf"]:
            labels = {"a": label, "le": le}
            expected = theirs.get_sample_value("h_seconds_bucket", labels)
            assert ours.get_sample_value("h_seconds_bucket", labels) == expected
        for suffix in ("_count", "_sum"):
            expected = theirs.get_sample_value(f"h_seconds{suffix}", {"a": label})
            assert ours.get_sample_value(f"h_seconds{suffix}", {"a": label}) == expected


def test_loop_counter_matches_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopCounter("c", "doc", ("endpoint", "code"), registry=ours)
    reference = Counter("c", "doc", ("endpoint", "code"), registry=theirs)
    for i in range(50):
        labels = (f"e{i % 3}", str(200 + i % 2))
        loop.labels(*labels).inc()
        reference.labels(*labels).inc()
    for endpoint in ("e0", "e1", "e2"):
        for code in ("200", "201"):
            labels = {"endpoint": endpoint, "code": code}
            assert ours.get_sample_value("c_total", labels) == theirs.get_sample_value("c_total", labels)
    unlabelled = LoopCounter("u", "doc", registry=ours)
    unlabelled.inc(2)
    assert ours.get_sample_value("u_total") == 2
