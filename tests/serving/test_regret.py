"""Routing regret read on runs whose answer is known: exploration at 0 % and 100 % around a warm pod, a pool
with one cold pod, the load gate; its series on /metrics and its totals on the status page."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slorouter.config import AuditConfig, ConfigError, parse_config
from slorouter.director import Director
from slorouter.metrics import RegretMetrics
from slorouter.pool.state import PoolState
from slorouter.scheduling.plugins.prefix.approx import ApproxPrefixCacheProducer
from slorouter.scheduling.types import PickReason
from slorouter.serving.audit import PickAudit
from slorouter.serving.regret import RegretLedger
from slorouter.serving.status import RouterStats, decode_status, encode_status
from tests.helpers.scheduling import make_director, make_pool, make_request, result_for, serve
from tests.scheduling import fake_plugins  # noqa: F401 (registers the test plugins)

PROMPT_TOKENS = 160  # 640 characters: ten 16-token blocks


def _prompt(i: int) -> str:
    return f"{i:08d}" * 80


def _config(plugins: list[dict[str, Any]], profile: list[str]) -> dict[str, Any]:
    return {
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": p} for p in profile]}],
    }


def _affinity(exploration: float, **params: Any) -> dict[str, Any]:
    return _config(
        [
            {"type": "approx-prefix-cache-producer", "parameters": {"indexResponses": False}},
            {
                "type": "prefix-cache-affinity-filter",
                "parameters": {"explorationProbability": exploration, "maxTTFTPenaltyMs": 0, **params},
            },
            # Pod 0 scores best: only the affinity filter keeps a request off it.
            {"type": "test-fixed-scorer", "parameters": {"values": [1.0, 0.0, 0.0]}},
            {"type": "max-score-picker"},
        ],
        ["prefix-cache-affinity-filter", "test-fixed-scorer", "max-score-picker"],
    )


def _director(pool: PoolState, config: dict[str, Any]) -> Director:
    director = make_director(pool, config)
    director.record_picks = True
    return director


def _warm(director: Director, i: int, *positions: int) -> None:
    """Request ``i``'s prompt is in the prefix caches of the pods at ``positions``."""
    (producer,) = [p for p in director.setup.data_producers if isinstance(p, ApproxPrefixCacheProducer)]
    for position in positions:
        producer.pre_request(make_request(_prompt(i)), result_for(director.pool.endpoints[position]))


def _run(director: Director, ledger: RegretLedger, n: int, warm: tuple[int, ...]) -> list[str]:
    """``n`` requests, each with a prompt of its own held by the pods ``warm``; the addresses picked."""
    picked = []
    for i in range(n):
        _warm(director, i, *warm)
        result = serve(director, make_request(_prompt(i), request_id=str(i)))
        assert result.record is not None and result.record.prompt_tokens == PROMPT_TOKENS
        ledger.observe(result.record)
        picked.append(result.target.address)
    return picked


def test_without_exploration_every_pick_reuses_all_that_was_reachable():
    director = _director(make_pool(3), _affinity(0.0))
    ledger = RegretLedger()
    assert set(_run(director, ledger, 20, warm=(1,))) == {"10.0.0.2:8000"}
    status = ledger.status()
    assert (status.picks, status.reuse_achieved, status.avoidable_prefill_tokens) == (20, 1.0, 0)
    assert list(status.by_reason) == [PickReason.AFFINITY.value]


def test_with_exploration_every_time_every_pick_leaves_the_warm_pod():
    director = _director(make_pool(3), _affinity(1.0))
    ledger = RegretLedger()
    assert set(_run(director, ledger, 20, warm=(1,))) == {"10.0.0.1:8000"}
    status = ledger.status()
    assert (status.picks, status.reuse_achieved) == (20, 0.0)
    assert status.avoidable_prefill_tokens == 20 * PROMPT_TOKENS
    assert list(status.by_reason) == [PickReason.EXPLORATION.value]


def test_a_pool_with_one_cold_pod_under_round_robin_reuses_two_thirds():
    config = _config(
        [
            {"type": "approx-prefix-cache-producer", "parameters": {"indexResponses": False}},
            {"type": "prefix-cache-scorer"},
            {"type": "round-robin-picker"},
        ],
        ["prefix-cache-scorer", "round-robin-picker"],
    )
    director = _director(make_pool(3), config)
    ledger = RegretLedger()
    _run(director, ledger, 30, warm=(0, 1))  # pod 2 is cold for every prompt
    status = ledger.status()
    assert status.reuse_achieved == pytest.approx(2 / 3)
    assert status.avoidable_prefill_tokens == 10 * PROMPT_TOKENS
    # The warm picks took the top score; the cold ones are the picker's turn.
    assert status.by_reason["picker"].picks == 10 and status.by_reason["picker"].achieved_prefix_tokens == 0
    assert status.by_reason["score"].picks == 20


def test_the_load_gate_opening_is_its_own_reason():
    config = _affinity(0.0, maxTTFTPenaltyMs=1, ttftSource="prefillThroughput", peakPrefillThroughput=1000)
    director = _director(make_pool(3), config)
    director.pool.add_inflight("10.0.0.2:8000", 1, 100_000, 0)  # the warm pod has 100 s of prefill ahead
    ledger = RegretLedger()
    _warm(director, 0, 1)
    result = director.schedule(make_request(_prompt(0)))
    assert result.record is not None and result.record.reason is PickReason.LOAD_GATE
    assert result.target.address == "10.0.0.1:8000"
    assert ledger.observe(result.record).avoidable_prefill_tokens == PROMPT_TOKENS


def test_a_director_without_records_builds_none():
    director = make_director(make_pool(2), _affinity(0.0))
    assert director.schedule(make_request(_prompt(0))).record is None


def test_series_by_profile_and_reason_and_the_status_section():
    registry = CollectorRegistry()
    ledger = RegretLedger(RegretMetrics(registry))
    director = _director(make_pool(3), _affinity(1.0))
    _run(director, ledger, 4, warm=(1,))
    text = generate_latest(registry).decode()
    labels = '{profile="default",reason="exploration"}'
    assert f"slorouter_routing_prefix_tokens_reachable_total{labels} {4.0 * PROMPT_TOKENS}" in text
    assert f"slorouter_routing_prefix_tokens_achieved_total{labels} 0.0" in text
    assert f"slorouter_routing_avoidable_prefill_tokens_count{labels} 4.0" in text
    assert f"slorouter_routing_avoidable_prefill_tokens_sum{labels} {4.0 * PROMPT_TOKENS}" in text
    assert "slorouter_routing_ttft_regret_seconds_count" not in text  # no TTFT estimates in this pipeline
    page = RouterStats(director.clock).status(
        "gateway", director.pool, predictor_mode="off", predictor=None, queued=None, regret=ledger.status()
    )
    decoded = decode_status(encode_status(page))
    assert decoded.regret is not None and decoded.regret.avoidable_prefill_tokens == 4 * PROMPT_TOKENS
    assert decoded.regret.by_reason["exploration"].picks == 4


def test_the_audit_section_is_off_by_default_and_checked():
    assert PickAudit.from_config(AuditConfig(), None) is None
    audit = PickAudit.from_config(AuditConfig(scores_header=True), None)
    assert audit is not None and audit.regret is None and audit.scores_max_candidates == 8
    for bad, problem in (
        ({"scores_max_candidates": 1}, "scores_max_candidates"),
        ({"regret": "sometimes"}, "audit.regret"),
        ({"score_header": True}, "score_header"),
    ):
        with pytest.raises(ConfigError, match=problem):
            parse_config({"audit": bad})
