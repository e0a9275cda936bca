"""The KV-event trust series: a one-hot state gauge and the transitions by reason, per subscribed endpoint."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from slorouter.clock import ManualClock
from slorouter.metrics import KVEventsCollector
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_trust import TrustReason
from slorouter.pool.state import Endpoint, PoolState


def test_trust_is_one_hot_per_subscribed_endpoint_and_transitions_count_by_reason() -> None:
    pool = PoolState([Endpoint("a:1"), Endpoint("b:1"), Endpoint("c:1")])
    index = KVBlockIndex(clock=ManualClock(0.0))
    index.pod_trust("a:1")
    index.pod_trust("b:1").gap_opened(1.0)
    index.clear_pod("b:1", TrustReason.UNRECOVERED_GAP)
    registry = CollectorRegistry()
    registry.register(KVEventsCollector(index, pool))
    text = generate_latest(registry).decode()
    assert 'slorouter_kv_index_trust{endpoint="a:1",state="exact"} 1.0' in text
    assert 'slorouter_kv_index_trust{endpoint="a:1",state="degraded"} 0.0' in text
    assert 'slorouter_kv_index_trust{endpoint="b:1",state="rebuilding"} 1.0' in text
    assert 'slorouter_kv_index_trust{endpoint="c:1"' not in text  # not subscribed
    assert (
        'slorouter_kv_index_trust_transitions_total{endpoint="b:1",reason="gap",state="degraded"} 1.0' in text
    )
    rebuilding = 'endpoint="b:1",reason="unrecovered-gap",state="rebuilding"'
    assert f"slorouter_kv_index_trust_transitions_total{{{rebuilding}}} 1.0" in text
