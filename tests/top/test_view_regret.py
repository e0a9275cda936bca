"""``slorouter top``'s regret line (audit.regret)."""

from __future__ import annotations

from slorouter.serving.regret import RegretStatus, RegretTotals
from slorouter.top.view import regret_summary


def test_the_regret_line_says_reuse_avoidable_prefill_ttft_regret_and_reasons():
    status = RegretStatus(
        picks=4,
        reuse_achieved=0.75,
        avoidable_prefill_tokens=1200,
        mean_ttft_regret_ms=12.5,
        by_reason={"affinity": RegretTotals(picks=3), "load-gate": RegretTotals(picks=1)},
    )
    assert regret_summary(status) == (
        "reuse achieved 75.0% · avoidable prefill 1,200 tokens · TTFT regret 12.5 ms · "
        "affinity 75.0%, load-gate 25.0%"
    )


def test_before_any_pick_or_any_prefix_it_says_so():
    none = RegretStatus(
        picks=0, reuse_achieved=None, avoidable_prefill_tokens=0, mean_ttft_regret_ms=None, by_reason={}
    )
    assert regret_summary(none) == "— (no pick yet)"
    cold = RegretStatus(
        picks=2,
        reuse_achieved=None,
        avoidable_prefill_tokens=0,
        mean_ttft_regret_ms=None,
        by_reason={"score": RegretTotals(picks=2)},
    )
    assert regret_summary(cold) == "reuse achieved — · avoidable prefill 0 tokens · score 100.0%"
