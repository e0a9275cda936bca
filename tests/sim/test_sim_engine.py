from __future__ import annotations

from dataclasses import replace

import pytest

from slorouter.sim.engine import Engine, RequestRejected
from slorouter.sim.kv_cache import KVBlockManager, KVSequence
from slorouter.sim.profiles import INSTANT, LLAMA3_8B_H100
from slorouter.sim.text import output_text
from slorouter.tokenizer import chat_to_prompt, encode

H100 = LLAMA3_8B_H100
NO_API = replace(H100, api_pre_ms=0.0, api_post_ms=0.0, api_per_token_ms=0.0)


def quiet(profile=H100, **changes) -> Engine:
    """An engine without step jitter (reference figures are for the noise-free model)."""
    return Engine(replace(profile, **changes) if changes else profile, jitter_sigma=0.0)


def steady_decode_step(engine: Engine, prompt, batch: int, context: int):
    """Plan the first step in which ``batch`` requests of ``context``-token prompts are all decoding."""
    for i in range(batch):
        engine.add_request(i, prompt(i, context), 1000, 0.0)
    now = 0.0
    for _ in range(100):
        step = engine.plan_step(now)
        if step.num_prefill_tokens == 0 and step.num_decodes == batch:
            return step
        engine.commit_step(step)
        now = step.end
    raise AssertionError("the batch never reached a pure decode step")


# ------------------------------------------------------------------------------------------ reference


def test_8k_prefill_takes_about_230_ms(prompt, drive_engine):
    run = drive_engine(quiet(), [("a", prompt(1, 8192), 1, 0.0)])
    assert run.finished["a"].ttft == pytest.approx(0.230, rel=0.25)
    assert len(run.durations) == 1  # 8192 tokens fit one step's budget


@pytest.mark.parametrize(("batch", "expected_s"), [(1, 0.007), (64, 0.012), (128, 0.027)])
def test_decode_step_matches_reference(prompt, batch, expected_s):
    context = 2048 if batch == 128 else 1024
    step = steady_decode_step(quiet(NO_API), prompt, batch, context)
    assert step.duration == pytest.approx(expected_s, rel=0.25)


def test_mixed_step_shows_prefill_decode_interference(prompt):
    engine = quiet(NO_API)
    decode_only = steady_decode_step(engine, prompt, 64, 1000)
    engine.commit_step(decode_only)
    engine.add_request("long", prompt(999, 2048), 4, decode_only.end)
    mixed = engine.plan_step(decode_only.end)
    assert mixed.num_prefill_tokens == 2048 and mixed.num_decodes == 64
    assert mixed.duration == pytest.approx(0.055, rel=0.25)
    assert mixed.duration > 3 * decode_only.duration


# --------------------------------------------------------------------------------------------- physics


def test_longer_prompts_have_higher_ttft(prompt, drive_engine):
    ttfts = []
    for length in (128, 1024, 4096, 16384):
        run = drive_engine(quiet(), [("r", prompt(1, length), 1, 0.0)])
        ttfts.append(run.finished["r"].ttft)
    assert ttfts == sorted(ttfts) and len(set(ttfts)) == 4


def test_prefix_hit_lowers_ttft_and_reports_cached_tokens(drive_engine):
    shared = list(range(6000))
    engine = quiet()
    run = drive_engine(engine, [("cold", [*shared, 1, 2], 4, 0.0), ("warm", [*shared, 3, 4], 4, 1.0)])
    cold, warm = run.finished["cold"], run.finished["warm"]
    assert cold.cached_tokens == 0
    assert warm.cached_tokens == 6000 - 6000 % 16  # whole blocks only
    assert warm.ttft < cold.ttft / 3
    assert engine.prefix_cache_hits == warm.cached_tokens
    assert engine.prefix_cache_queries == 2 * 6002


def test_identical_prompt_recomputes_its_last_token(drive_engine):
    engine = quiet()
    ids = list(range(64))  # exactly 4 blocks
    run = drive_engine(engine, [("a", ids, 2, 0.0), ("b", ids, 2, 1.0)])
    assert run.finished["b"].cached_tokens == 48  # vLLM never serves the whole prompt from cache


def test_bigger_batches_have_higher_tpot(prompt, drive_engine):
    tpots = []
    for batch in (1, 16, 64, 192):
        run = drive_engine(quiet(), [(i, prompt(i, 512), 64, 0.0) for i in range(batch)])
        times = run.token_times[0]
        tpots.append((times[-1] - times[10]) / (len(times) - 11))
    assert tpots == sorted(tpots) and tpots[-1] > 2 * tpots[0]


def test_long_prompt_is_chunked_without_starving_decodes(prompt):
    engine = quiet(NO_API)
    decoding = steady_decode_step(engine, prompt, 8, 256)
    engine.commit_step(decoding)
    now = decoding.end
    engine.add_request("long", prompt(99, 20_000), 1, now)
    chunks = []
    for _ in range(3):
        step = engine.plan_step(now)
        assert step.num_decodes == 8
        chunks.append(step.num_prefill_tokens)
        output = engine.commit_step(step)
        now = step.end
    assert chunks == [8192 - 8, 8192 - 8, 20_000 - 2 * (8192 - 8)]
    assert output.finished[0].request_id == "long"


def test_kv_exhaustion_queues_then_preempts_and_still_completes(prompt, drive_engine):
    engine = quiet(num_gpu_blocks=400)  # 6,400 tokens of KV
    arrivals = [(i, prompt(i, 600), 500, 0.0) for i in range(12)]
    run = drive_engine(engine, arrivals)
    assert run.max_waiting > 0 and run.max_running < 12  # KV, not max_num_seqs, held requests back
    assert engine.num_preemptions_total > 0
    assert sum(f.num_preemptions for f in run.finished.values()) == engine.num_preemptions_total
    assert all(f.output_tokens == 500 for f in run.finished.values())
    assert engine.num_running == engine.num_waiting == 0 and engine.kv_usage == 0.0


def test_kv_usage_tracks_allocated_blocks(prompt):
    engine = quiet(NO_API, num_gpu_blocks=1000)
    engine.add_request("a", prompt(1, 160), 100, 0.0)  # 10 blocks
    step = engine.plan_step(0.0)
    assert engine.kv_usage == pytest.approx(10 / 1000)
    engine.commit_step(step)
    step = engine.plan_step(step.end)  # the first decode token opens an 11th block
    assert engine.kv_usage == pytest.approx(11 / 1000)


def test_max_num_seqs_caps_the_running_batch(prompt, drive_engine):
    engine = quiet(max_num_seqs=32, max_num_batched_tokens=8192)
    run = drive_engine(engine, [(i, prompt(i, 32), 8, 0.0) for i in range(100)])
    assert run.max_running == 32 and run.max_waiting > 0 and len(run.finished) == 100


def test_waiting_queue_is_fcfs(prompt, drive_engine):
    engine = quiet(max_num_seqs=1)
    run = drive_engine(engine, [(i, prompt(i, 64), 4, i * 1e-6) for i in range(5)])
    order = sorted(run.finished, key=lambda rid: run.finished[rid].first_token_time)
    assert order == [0, 1, 2, 3, 4]


def test_least_recently_freed_cached_blocks_are_evicted_first(prompt, drive_engine):
    engine = quiet(num_gpu_blocks=64)
    a, b = prompt(1, 400), prompt(2, 400)  # 25 full blocks each
    drive_engine(engine, [("a1", a, 1, 0.0), ("b1", b, 1, 1.0), ("c", prompt(3, 600), 1, 2.0)])
    # Free queue after a1 and b1: a's blocks tail first, then b's. c (38 blocks) took the 14 never-used
    # blocks, then evicted a's 24 least recently freed ones: only a's first block is still cached.
    run = drive_engine(engine, [("b2", b, 1, 3.0)])
    assert run.finished["b2"].cached_tokens == 384  # 24 blocks: the last token is always recomputed
    # b2's one new block evicted a's first block.
    run = drive_engine(engine, [("a2", a, 1, 4.0)])
    assert run.finished["a2"].cached_tokens == 0


def test_generated_tokens_are_cached_for_the_next_chat_turn(drive_engine):
    engine = quiet()
    turn1 = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me a story. " * 20},
    ]
    first = encode(chat_to_prompt(turn1))
    drive_engine(engine, [("t1", first, 200, 0.0)])
    turn2 = [
        *turn1,
        {"role": "assistant", "content": output_text(0, 200)},
        {"role": "user", "content": "More."},
    ]
    second = encode(chat_to_prompt(turn2))
    assert second[: len(first) + 200] == first + encode(output_text(0, 200))
    run = drive_engine(engine, [("t2", second, 10, 1.0)])
    # Everything the first turn computed (all but its last sampled token), in whole blocks.
    assert run.finished["t2"].cached_tokens == (len(first) + 199) // 16 * 16


# --------------------------------------------------------------------------------------------- timing


def test_api_overheads_delay_queueing_and_the_response(prompt, drive_engine):
    engine = quiet()
    engine.add_request("r", prompt(1, 32), 10, 0.0)
    assert engine.plan_step(0.0) is None  # still in its API overhead
    assert engine.next_ready_time() == pytest.approx(H100.api_pre_ms / 1000)
    run = drive_engine(engine, [])
    done = run.finished["r"]
    assert done.queued_time == pytest.approx(0.006) and done.scheduled_time == done.queued_time
    assert done.done_time - done.finish_time == pytest.approx((1.0 + 10 * 0.05) / 1000)
    assert done.queue_time == 0.0


def test_instant_profile_costs_nothing(prompt, drive_engine):
    engine = Engine(INSTANT)
    run = drive_engine(engine, [(i, prompt(i, 1000), 50, 0.0) for i in range(20)])
    assert set(run.durations) == {0.0}
    assert all(f.e2e == 0.0 and f.output_tokens == 50 for f in run.finished.values())


def test_jitter_is_seeded(prompt, drive_engine):
    def durations(seed: int) -> list[float]:
        arrivals = [(i, prompt(i, 300), 40, i * 0.01) for i in range(20)]
        return drive_engine(Engine(H100, seed=seed), arrivals).durations

    assert durations(7) == durations(7)
    assert durations(7) != durations(8)
    noisy, clean = durations(7), drive_engine(quiet(), [(0, prompt(0, 300), 40, 0.0)]).durations
    assert noisy != clean


def test_same_seed_same_run(prompt, drive_engine):
    def finish_times(seed: int) -> dict:
        arrivals = [(i, prompt(i % 7, 200 + 37 * i), 30 + i, i * 0.003) for i in range(60)]
        run = drive_engine(Engine(replace(H100, num_gpu_blocks=300), seed=seed), arrivals)
        return {
            rid: (f.first_token_time, f.finish_time, f.num_preemptions) for rid, f in run.finished.items()
        }

    assert finish_times(3) == finish_times(3)


def test_without_token_reports_the_run_is_the_same(prompt, drive_engine):
    arrivals = [(i, prompt(i % 5, 150 + 41 * i), 20 + i, i * 0.004) for i in range(50)]
    profile = replace(H100, num_gpu_blocks=250)  # preemptions too
    full = drive_engine(Engine(profile, seed=4), arrivals)
    lean = drive_engine(Engine(profile, seed=4, report_tokens=False), arrivals)
    assert lean.token_times == {} and full.token_times
    assert lean.finished == full.finished and lean.first == full.first
    assert lean.durations == full.durations
    assert any(f.num_preemptions for f in full.finished.values())


# ----------------------------------------------------------------------------------------------- abort


def test_abort_frees_blocks_and_running_slot(prompt):
    engine = quiet(NO_API)
    engine.add_request("a", prompt(1, 1000), 500, 0.0)
    engine.add_request("b", prompt(2, 1000), 500, 0.0)
    now = 0.0
    for _ in range(5):
        step = engine.plan_step(now)
        engine.commit_step(step)
        now = step.end
    used = engine.kv_usage
    assert engine.abort("a") is True
    assert engine.num_running == 1 and engine.kv_usage < used
    assert engine.abort("a") is False
    assert engine.abort("b") is True
    assert engine.kv_usage == 0.0 and not engine.has_work()


def test_abort_during_a_step_drops_its_tokens(prompt):
    engine = quiet(NO_API)
    engine.add_request("a", prompt(1, 100), 50, 0.0)
    engine.add_request("b", prompt(2, 100), 50, 0.0)
    step = engine.plan_step(0.0)
    engine.commit_step(step)
    step = engine.plan_step(step.end)
    engine.abort("a")
    output = engine.commit_step(step)
    assert output.tokens == ["b"]
    assert engine.num_running == 1


def test_abort_of_waiting_and_pending_requests(prompt):
    engine = quiet(max_num_seqs=1)
    engine.add_request("pending", prompt(1, 50), 5, 0.0)
    assert engine.abort("pending") and not engine.has_work()
    engine.add_request("a", prompt(2, 50), 5, 0.0)
    engine.add_request("b", prompt(3, 50), 5, 0.0)
    engine.plan_step(1.0)
    assert engine.num_waiting == 1
    assert engine.abort("b") and engine.num_waiting == 0


# ------------------------------------------------------------------------------------------ rejection


@pytest.mark.parametrize(
    ("prompt_len", "max_tokens"),
    [(0, 10), (100, 0), (32_000, 1000), (32_768, 1)],
)
def test_impossible_requests_are_rejected(prompt, prompt_len, max_tokens):
    with pytest.raises(RequestRejected):
        quiet().add_request("r", prompt(1, prompt_len), max_tokens, 0.0)


def test_request_larger_than_the_kv_cache_is_rejected(prompt):
    with pytest.raises(RequestRejected, match="KV"):
        quiet(num_gpu_blocks=10).add_request("r", prompt(1, 150), 20, 0.0)


def test_bad_token_ids_and_duplicate_ids_are_rejected():
    engine = quiet()
    with pytest.raises(RequestRejected):
        engine.add_request("r", [-1, 5], 1, 0.0)
    with pytest.raises(RequestRejected):
        engine.add_request("r", [2**32], 1, 0.0)
    with pytest.raises(RequestRejected):
        engine.add_request("r", b"12345", 1, 0.0)
    engine.add_request("r", [1, 2], 1, 0.0)
    with pytest.raises(ValueError, match="already"):
        engine.add_request("r", [1, 2], 1, 0.0)


def test_commit_needs_the_planned_step(prompt):
    engine = quiet(NO_API)
    engine.add_request("r", prompt(1, 10), 3, 0.0)
    step = engine.plan_step(0.0)
    with pytest.raises(RuntimeError):
        engine.plan_step(0.0)
    engine.commit_step(step)
    with pytest.raises(RuntimeError):
        engine.commit_step(step)


def test_remembered_prefix_lookups_change_nothing_under_kv_pressure(drive_engine, monkeypatch):
    # Shared system prompts and chat turns on a small KV cache: requests wait for space at the head of the
    # queue (their lookup resumed step after step) while blocks are evicted and preemptions happen.
    import random

    rng = random.Random(3)
    systems = [[s * 7_000_001 + i for i in range(rng.randrange(200, 900))] for s in range(4)]
    arrivals = []
    for i in range(120):
        system = systems[rng.randrange(len(systems))]
        question = [i * 1_000_003 + k for k in range(rng.randrange(16, 400))]
        arrivals.append((i, system + question, rng.randrange(1, 300), i * 0.01))
    profile = replace(H100, num_gpu_blocks=360)
    remembered = drive_engine(Engine(profile, seed=5), arrivals)
    lookup_prefix = KVBlockManager.lookup_prefix

    def uncached_lookup(self: KVBlockManager, seq: KVSequence, num_tokens: int) -> list[int]:
        seq.hit_blocks = None  # every lookup starts from the first block
        return lookup_prefix(self, seq, num_tokens)

    monkeypatch.setattr(KVBlockManager, "lookup_prefix", uncached_lookup)
    runs = [remembered, drive_engine(Engine(profile, seed=5), arrivals)]
    assert runs[0].max_waiting > 0
    assert runs[0].durations == runs[1].durations
    assert runs[0].finished == runs[1].finished
    assert any(f.num_preemptions for f in runs[0].finished.values())
    assert any(f.cached_tokens for f in runs[0].finished.values())
