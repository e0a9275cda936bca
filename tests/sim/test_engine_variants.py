"""The engine under its variants: scheduler policies, chunk sizes, budgets, KV capacity, step-time scales."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from slorouter.sim.engine import Engine, Finished
from slorouter.sim.profiles import LLAMA3_8B_H100
from slorouter.sim.variants import parse_variant
from tests.sim.conftest import distinct_prompt

# A small server whose KV cache runs out within a few steps: 40 blocks of 16 tokens, 64-token chunks.
TIGHT = replace(
    LLAMA3_8B_H100,
    api_pre_ms=0.0,
    api_post_ms=0.0,
    api_per_token_ms=0.0,
    num_gpu_blocks=40,
    max_model_len=640,
    max_num_batched_tokens=256,
    max_num_seqs=16,
    long_prefill_token_threshold=64,
)


@dataclass
class Trace:
    """Per request, the indices of the steps that gave it a token; per step, its decodes and prefill."""

    token_steps: dict[object, list[int]] = field(default_factory=dict)
    steps: list[tuple[int, int]] = field(default_factory=list)  # (num_decodes, num_prefill_tokens)
    finished: dict[object, Finished] = field(default_factory=dict)
    first_token_step: dict[object, int] = field(default_factory=dict)


def trace(engine: Engine, arrivals: list[tuple[object, list[int], int, float]]) -> Trace:
    out = Trace()
    pending = sorted(arrivals, key=lambda a: a[3])
    now, i = 0.0, 0
    for index in range(100_000):
        while i < len(pending) and pending[i][3] <= now:
            engine.add_request(*pending[i])
            i += 1
        if i == len(pending) and not engine.has_work():
            return out
        step = engine.plan_step(now)
        if step is None:
            now = min(t for t in (engine.next_ready_time(), pending[i][3] if i < len(pending) else None) if t)
            continue
        result = engine.commit_step(step)
        out.steps.append((step.num_decodes, step.num_prefill_tokens))
        for request_id in result.tokens:
            out.token_steps.setdefault(request_id, []).append(index)
        for first in result.first_tokens:
            out.first_token_step[first.request_id] = index
        for done in result.finished:
            out.finished[done.request_id] = done
        now = step.end
    raise AssertionError("the engine did not go idle")


def quiet(profile=TIGHT, **changes) -> Engine:
    return Engine(replace(profile, **changes), jitter_sigma=0.0)


def long_prefill_and_two_decodes() -> list[tuple[object, list[int], int, float]]:
    """A 600-token prompt admitted first (64 tokens a step), then two short requests that decode for long
    beside it: the prefill's later chunks find the cache full while the newest running request decodes."""
    return [
        ("long", distinct_prompt(1, 600), 2, 0.0),
        ("b", distinct_prompt(2, 20), 100, 0.0),
        ("c", distinct_prompt(3, 20), 100, 0.0),
    ]


def consecutive(steps: list[int]) -> bool:
    return steps == list(range(steps[0], steps[0] + len(steps)))


def test_vllm_preempts_a_running_decode_for_a_prefill_chunk():
    run = trace(quiet(), long_prefill_and_two_decodes())
    assert set(run.finished) == {"long", "b", "c"}
    assert run.finished["c"].num_preemptions >= 1  # the newest running request, decoding
    assert not consecutive(run.token_steps["c"])


def test_decode_priority_never_delays_a_running_decode_for_a_prefill():
    run = trace(quiet(scheduler="decode-priority"), long_prefill_and_two_decodes())
    assert set(run.finished) == {"long", "b", "c"}
    for name in ("b", "c"):
        assert run.finished[name].num_preemptions == 0
        assert consecutive(run.token_steps[name])  # a token in every step from the first to the last
        assert run.finished[name].output_tokens == 100
    # The prefill waited (or was preempted) instead, and finished after the decodes freed their blocks.
    assert run.finished["long"].first_token_time > run.finished["b"].finish_time


@pytest.mark.parametrize("scheduler", ["vllm", "decode-priority", "prefill-priority"])
def test_every_policy_completes_exactly_max_tokens_under_kv_pressure(scheduler):
    arrivals = [(i, distinct_prompt(i, 40 + 37 * i), 30 + 11 * i, 0.002 * i) for i in range(12)]
    run = trace(quiet(scheduler=scheduler), arrivals)
    assert {i: f.output_tokens for i, f in run.finished.items()} == {i: 30 + 11 * i for i in range(12)}
    for i, steps in run.token_steps.items():
        assert len(steps) == 30 + 11 * i
    engine_free = quiet(scheduler=scheduler)
    trace(engine_free, arrivals)
    assert engine_free.num_free_blocks == engine_free.num_gpu_blocks  # every block came back


def test_prefill_priority_pauses_decodes_while_prefills_run():
    profile = replace(TIGHT, num_gpu_blocks=400, max_model_len=6400)
    arrivals = [("b", distinct_prompt(2, 20), 60, 0.0), ("long", distinct_prompt(1, 600), 2, 0.05)]
    run = trace(quiet(profile, scheduler="prefill-priority"), arrivals)
    assert all(decodes == 0 or prefill == 0 for decodes, prefill in run.steps)  # never mixed
    # "long" needs 10 chunks of 64: 10 prefill-only steps in a row, b gets no token meanwhile.
    first = run.first_token_step["long"]
    b_steps = set(run.token_steps["b"])
    assert not b_steps & set(range(first - 9, first + 1))
    assert run.finished["b"].output_tokens == 60
    # Under vllm the same chunks share their steps with b's decodes.
    mixed = trace(quiet(profile), arrivals)
    assert any(decodes and prefill for decodes, prefill in mixed.steps)


def test_prefill_priority_finishes_waiting_prefills_first():
    profile = replace(TIGHT, num_gpu_blocks=400, max_model_len=6400, long_prefill_token_threshold=0)
    arrivals = [("d", distinct_prompt(9, 20), 80, 0.0)]
    arrivals += [(f"w{i}", distinct_prompt(10 + i, 200), 5, 0.1) for i in range(4)]  # 800 tokens
    run = trace(quiet(profile, scheduler="prefill-priority"), arrivals)
    start = next(i for i, (_, prefill) in enumerate(run.steps) if i > 0 and prefill)
    end = max(run.first_token_step[f"w{i}"] for i in range(4))
    assert end - start == 3  # 256 + 256 + 256 + 32 tokens, back to back
    assert all(run.steps[i][0] == 0 for i in range(start, end + 1))
    assert not set(run.token_steps["d"]) & set(range(start, end + 1))
    assert run.finished["d"].output_tokens == 80


def test_chunk_size_caps_each_requests_prefill_per_step():
    profile = replace(TIGHT, num_gpu_blocks=400, max_model_len=6400, long_prefill_token_threshold=100)
    run = trace(quiet(profile), [("a", distinct_prompt(1, 950), 1, 0.0)])
    assert [prefill for _, prefill in run.steps] == [100] * 9 + [50]


def test_small_token_budget_spreads_a_prompt_over_more_steps():
    profile = replace(
        TIGHT,
        num_gpu_blocks=400,
        max_model_len=6400,
        long_prefill_token_threshold=0,
        max_num_batched_tokens=8192,
    )
    big = trace(quiet(profile), [("a", distinct_prompt(1, 1000), 1, 0.0)])
    small = trace(quiet(profile, max_num_batched_tokens=256), [("a", distinct_prompt(1, 1000), 1, 0.0)])
    assert len(big.steps) == 1 and [p for _, p in small.steps] == [256, 256, 256, 232]


def test_small_kv_variant_forces_preemption_the_default_does_not():
    arrivals = [(i, distinct_prompt(i, 4000), 500, 0.01 * i) for i in range(24)]
    default = Engine(LLAMA3_8B_H100, jitter_sigma=0.0)
    trace(default, arrivals)
    small = Engine(parse_variant("kv-blocks=2048").apply(LLAMA3_8B_H100), jitter_sigma=0.0)
    run = trace(small, arrivals)
    assert default.num_preemptions_total == 0
    assert small.num_preemptions_total > 0 and len(run.finished) == 24


def test_step_time_multipliers_scale_their_terms():
    base = LLAMA3_8B_H100
    args = (3000, 4.5e6, 50_000, 40)  # tokens, pairs, decode context, decodes
    assert parse_variant("time=2").apply(base).step_ms(*args) == pytest.approx(2 * base.step_ms(*args))
    attn = parse_variant("attn=0.5").apply(base)
    assert attn.step_ms(*args) == pytest.approx(base.step_ms(*args) - 0.5 * base.c_attn_ms * 4.5e6)
    slow = parse_variant("slow-gpu").apply(base)
    assert slow.c_lin_ms == pytest.approx(2.2 * base.c_lin_ms)
    assert slow.num_gpu_blocks == round(base.num_gpu_blocks / 2)
    assert slow.name == "llama3-8b-h100@slow-gpu"


def test_the_default_variant_is_the_profile_itself():
    assert parse_variant("").apply(LLAMA3_8B_H100) is LLAMA3_8B_H100
    assert parse_variant("vllm").apply(LLAMA3_8B_H100) == replace(LLAMA3_8B_H100, name="llama3-8b-h100@vllm")
