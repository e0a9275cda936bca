"""The profile fitted to llama.cpp's llama-server (``llamacpp-gemma3-270m-cpu``): its constants are the ones
benchmarks/fit_llamacpp_profile.py recorded in benchmarks/llamacpp_fit.json, a short run of it completes in
virtual time and through a simulated pod, and its llama.cpp metrics page has no KV gauges, as the real
server's has none."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import aiohttp
import pytest

from slorouter.sim.engine import Engine
from slorouter.sim.profiles import LLAMACPP_GEMMA3_270M_CPU, LLAMACPP_TOKENS_PER_SIM_TOKEN, get_profile
from slorouter.sim.server import start_pods
from slorouter.sim.variants import apply_variant
from slorouter.tokenizer import encode
from tests.sim.conftest import drive

FIT = Path(__file__).resolve().parents[2] / "benchmarks" / "llamacpp_fit.json"
NAME = "llamacpp-gemma3-270m-cpu"


def test_the_profile_carries_the_fits_constants() -> None:
    fit = json.loads(FIT.read_text())
    profile = get_profile(NAME)
    assert profile is LLAMACPP_GEMMA3_270M_CPU
    constants = fit["constants"]
    assert {key: getattr(profile, key) for key in constants} == constants
    assert fit["measurements"]["engine_tokens_per_sim_token"] == LLAMACPP_TOKENS_PER_SIM_TOKEN
    # The server the fit measured: 4 slots sharing a 4,096-token context, on one thread.
    assert fit["server"] == "--parallel 4 --ctx-size 4096 --threads 1"
    assert profile.max_num_seqs == 4
    assert profile.llamacpp_kv_metrics is False


def test_a_short_run_completes_and_one_slot_queues() -> None:
    """Eight requests at once: four run at a time on the 4-slot profile; on its one-slot variant (the
    benchmark's mixed pool) one after another, each starting when the one before has finished."""
    prompts = [encode("a few words of text " * 40 + f"Request {i}.") for i in range(8)]
    arrivals = [(i, prompt, 20, 0.0) for i, prompt in enumerate(prompts)]
    four = drive(Engine(LLAMACPP_GEMMA3_270M_CPU, seed=0), arrivals)
    one_slot = apply_variant(LLAMACPP_GEMMA3_270M_CPU, "max-seqs=1")
    one = drive(Engine(one_slot, seed=0), arrivals)
    assert len(four.finished) == len(one.finished) == 8
    assert four.max_running == 4 and one.max_running == 1
    served = sorted(one.finished.values(), key=lambda f: f.first_token_time)
    assert all(b.scheduled_time >= a.finish_time for a, b in itertools.pairwise(served))
    # The shared text is cached after the first request (block-granular prefix caching).
    assert any(f.cached_tokens > 0 for f in four.finished.values())


@pytest.mark.timeout(60)
async def test_a_pod_of_the_profile_serves_llamacpps_page_without_kv_gauges() -> None:
    cluster = await start_pods(1, 0, LLAMACPP_GEMMA3_270M_CPU, engines=["llamacpp"])
    try:
        pod = cluster.pods[0]
        body = {
            "model": pod.model,
            "messages": [{"role": "user", "content": "Hello there, how are you?"}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://{pod.address}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                text = await response.text()
            async with session.get(f"http://{pod.address}/metrics") as response:
                page = await response.text()
        assert pod.model == "gemma3-270m"
        assert '"completion_tokens":3' in text and text.rstrip().endswith("data: [DONE]")
        assert "llamacpp:requests_processing" in page and "llamacpp:tokens_predicted_total 3.0" in page
        assert "kv_cache" not in page
    finally:
        await cluster.close()
