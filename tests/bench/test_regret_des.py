"""Routing regret in the discrete-event benchmark: the engines' cached prefix of a prompt, the run summary's
regret figures, and both views on runs whose answer is known (two identical requests in turn)."""

from __future__ import annotations

import numpy as np
import pytest

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import BUILTIN_POLICIES
from slorouter.bench.pool import parse_pool
from slorouter.bench.pool_regret import cached_prompt_tokens
from slorouter.bench.results import regret_summary
from slorouter.bench.workloads import BenchRequest
from slorouter.sim.engine import Engine
from slorouter.sim.profiles import get_profile
from slorouter.tokenizer import encode_bytes
from tests.sim.conftest import drive

PROMPT = "The shared context of every turn. " * 120  # ~1,000 tokens


def test_cached_prompt_tokens_reads_each_engines_prefix_cache():
    profile = get_profile("llama3-8b-h100")
    warm, cold = Engine(profile, jitter_sigma=0.0), Engine(profile, jitter_sigma=0.0)
    prompt = encode_bytes(PROMPT)
    drive(warm, [(0, prompt, 2, 0.0)])
    held = cached_prompt_tokens([warm, cold], prompt)
    tokens = len(prompt) // 4
    block = warm.kv_blocks.block_size
    assert held[1] == 0 and tokens - block <= held[0] <= tokens and held[0] % block == 0


def _records(n: int):
    class Rec:
        achieved_prefix_tokens = np.array([100, 0, -1, 50][:n])
        reachable_prefix_tokens = np.array([100, 100, -1, 100][:n])
        true_achieved_prefix_tokens = np.array([90, 0, 0, 40][:n])
        true_reachable_prefix_tokens = np.array([90, 80, 0, 90][:n])
        ttft_regret_ms = np.array([0.0, 30.0, np.nan, 12.0][:n])
        pick_reason = np.array([0, 0, -1, 1][:n])  # score, score, no record, affinity

    return Rec()


def test_regret_summary_formulas():
    picked = np.array([True, True, True, False])
    summary = regret_summary(_records(4), picked, window=10.0)  # type: ignore[arg-type]
    assert summary == {
        "reuse_achieved": 0.5,  # 100 of 200 (the request without a record is left out)
        "avoidable_prefill_tok_s": 10.0,
        "pool_reuse_achieved": round(90 / 170, 4),
        "pool_avoidable_prefill_tok_s": 8.0,
        "ttft_regret_ms_mean": 15.0,
        "regret_by_reason": {
            "score": {"picks": 2, "avoidable_prefill_tok_s": 10.0, "ttft_regret_ms_mean": 15.0}
        },
    }


@pytest.mark.parametrize(("policy", "router_view"), [("round-robin", False), ("heuristic", True)])
def test_two_identical_requests_in_turn(policy: str, router_view: bool):
    requests = [BenchRequest(arrival=t, prompt=PROMPT, max_tokens=2) for t in (0.0, 5.0)]
    settings = ClusterSettings(jitter_sigma=0.0)
    with ClusterSimulator(
        parse_pool("2"), BUILTIN_POLICIES[policy], use_predictor=False, settings=settings
    ) as sim:
        rec = sim.run(requests)
    # The first finds every cache cold; the second finds the first one's pod warm.
    assert rec.true_reachable_prefix_tokens[0] == 0 and rec.true_reachable_prefix_tokens[1] > 0
    if policy == "round-robin":  # the other pod, in turn: all of it avoidable; no prefix index
        assert rec.pod.tolist() == [0, 1] and rec.true_achieved_prefix_tokens[1] == 0
        assert rec.reachable_prefix_tokens.tolist() == [0, 0]
    else:  # back to the warm pod: nothing avoidable, in both views
        assert rec.pod[0] == rec.pod[1]
        assert rec.true_achieved_prefix_tokens[1] == rec.true_reachable_prefix_tokens[1]
        assert rec.achieved_prefix_tokens[1] == rec.reachable_prefix_tokens[1] > 0
    assert (rec.reachable_prefix_tokens[1] > 0) == router_view
