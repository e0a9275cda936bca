"""Workload generators of `slorouter bench`: determinism, rates, lengths, shared history, clipping, params."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from slorouter.bench.workloads import (
    BenchRequest,
    generate,
    prefix_reuse,
    summarize,
    workload_defaults,
    workload_names,
)
from slorouter.bench.workloads.arrivals import alternating_poisson, poisson
from slorouter.bench.workloads.clip import clip
from slorouter.bench.workloads.sharegpt_data import load_conversations
from slorouter.sim.text import output_text
from slorouter.tokenizer import count_tokens

ALL = [
    "sharegpt",
    "shared-prefix-a",
    "shared-prefix-b",
    "shared-prefix-c",
    "shared-prefix-d",
    "b2b-saas",
    "high-churn",
    "maas-mix",
    "code-generation",
    "reasoning",
    "new-user",
    "realtime-mix",
]
OVERLOAD = ["sharegpt-burst", "maas-burst", "two-tenants", "mixed-priority"]  # carry SLOs and classes
# Small lengths so that multi-turn tests build short prompts quickly.
SMALL_GROUPS = {
    "groups": 10,
    "users_per_group": 3,
    "system_prompt_tokens": 100,
    "question_tokens": 20,
    "output_tokens": 30,
}


def test_names_and_defaults() -> None:
    assert workload_names() == ALL + OVERLOAD
    for name in ALL:
        defaults = workload_defaults(name)
        assert {"slo_ttft_ms": None, "slo_tpot_ms": None, "sheddable_share": 0.0}.items() <= defaults.items()
    assert workload_defaults("b2b-saas")["system_prompt_tokens"] == 6000
    assert workload_defaults("shared-prefix-a")["users_per_group"] == 1000


@pytest.mark.parametrize("name", ALL)
def test_deterministic_and_ordered(name: str) -> None:
    first = generate(name, qps=2, duration_s=40, seed=7)
    assert first == generate(name, qps=2, duration_s=40, seed=7)
    assert first != generate(name, qps=2, duration_s=40, seed=8)
    arrivals = [r.arrival for r in first]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0 and arrivals[-1] < 40
    for request in first:
        assert isinstance(request, BenchRequest) and request.max_tokens >= 1
        assert request.prompt.isascii() and len(request.prompt) % 4 == 0  # whole tokens
        assert request.priority == 0
        assert request.slo_ttft_ms is None or name == "realtime-mix"  # the one with SLOs by default


def test_poisson_rate_and_gaps() -> None:
    rng = np.random.default_rng(3)
    times = poisson(rng, 20.0, 0.0, 5000.0)
    expected = 20.0 * 5000.0
    assert abs(len(times) - expected) < 4 * expected**0.5
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.02)  # exponential gaps


def test_generated_rate_close_to_qps() -> None:
    requests = generate("reasoning", qps=5, duration_s=2000, seed=11)
    assert abs(len(requests) - 10_000) < 4 * 10_000**0.5


def test_maas_mix_alternates_around_qps() -> None:
    times = alternating_poisson(np.random.default_rng(5), qps=6.0, duration=6000.0, ratio=5.0, phase_s=30.0)
    assert len(times) == pytest.approx(6.0 * 6000.0, rel=0.02)
    phase = (times // 30.0).astype(int)
    low = np.count_nonzero(phase % 2 == 0) / 3000.0  # 100 low phases of 30 s
    high = np.count_nonzero(phase % 2 == 1) / 3000.0
    assert low == pytest.approx(2.0, rel=0.05) and high == pytest.approx(10.0, rel=0.05)

    requests = generate("maas-mix", qps=3, duration_s=600, seed=1, params={"phase_s": "60", "rate_ratio": 4})
    arrivals = np.array([r.arrival for r in requests])
    per_phase = np.bincount((arrivals // 60).astype(int), minlength=10)
    assert per_phase[1::2].sum() > 3 * per_phase[0::2].sum()
    assert len(requests) == pytest.approx(1800, rel=0.1)


def test_maas_mix_lengths_and_reuse() -> None:
    requests = generate("maas-mix", qps=10, duration_s=1800, seed=1)
    summary = summarize(requests)
    assert summary.prompt_tokens_mean == pytest.approx(730, rel=0.2)
    assert summary.prompt_tokens_p50 < 0.6 * summary.prompt_tokens_mean  # heavy tail
    assert summary.prompt_tokens_max > 30_000
    assert summary.output_tokens_mean == pytest.approx(300, rel=0.15)
    assert summary.output_tokens_p50 < 0.3 * summary.output_tokens_mean
    assert summary.prefix_reuse > 0.88
    assert summary.multi_turn_share > 0.7


@pytest.mark.parametrize("name", ["shared-prefix-a", "shared-prefix-b", "shared-prefix-c", "shared-prefix-d"])
def test_shared_prefix_lengths(name: str) -> None:
    defaults = workload_defaults(name)
    requests = generate(name, qps=10, duration_s=200, seed=2)
    outputs = np.array([r.max_tokens for r in requests])
    assert outputs.mean() == pytest.approx(defaults["output_tokens"], rel=0.03)
    assert outputs.std() / outputs.mean() == pytest.approx(0.3 * 0.88, rel=0.1)  # 30%, cut at ±2σ
    first_turns = {r.session: r for r in reversed(requests)}.values()
    questions = np.array([count_tokens(r.prompt) - defaults["system_prompt_tokens"] for r in first_turns])
    assert np.median(questions) == pytest.approx(defaults["question_tokens"], rel=0.05)


def test_b2b_saas_shape() -> None:
    requests = generate("b2b-saas", qps=10, duration_s=60, seed=3)
    assert {count_tokens(r.prompt) for r in requests} == {7200}
    assert {r.max_tokens for r in requests} == {1000}
    assert {r.session for r in requests} == {-1}  # single queries
    assert len({r.prompt[:24000] for r in requests}) <= 150


def test_code_generation_and_reasoning_lengths() -> None:
    code = generate("code-generation", qps=5, duration_s=300, seed=4)
    assert np.mean([r.max_tokens for r in code]) == pytest.approx(425, rel=0.05)
    assert min(count_tokens(r.prompt) for r in code) > 3000 + 1000
    shared = code[0].prompt[: 4 * 3000]
    assert all(r.prompt.startswith(shared) for r in code)
    reasoning = generate("reasoning", qps=10, duration_s=300, seed=4)
    outputs = np.array([r.max_tokens for r in reasoning])
    assert outputs.mean() == pytest.approx(8000, rel=0.05) and outputs.max() <= 32_000
    assert np.mean([count_tokens(r.prompt) for r in reasoning]) == pytest.approx(1250, rel=0.03)


def test_new_user_mixes_shared_prefix_chat_with_long_single_prompts() -> None:
    requests = generate("new-user", qps=10, duration_s=300, seed=3)
    long = [r for r in requests if r.session == -1]
    chat = [r for r in requests if r.session >= 0]
    assert len(long) / len(requests) == pytest.approx(0.15, abs=0.03)
    assert all(4000 <= count_tokens(r.prompt) <= 16000 for r in long)
    assert len({r.prompt[:400] for r in long}) == len(long)  # nothing shared between new users
    assert len({r.prompt[: 4 * 1000] for r in chat}) == 8  # the groups' system prompts
    turns: dict[int, list[str]] = {}
    for r in chat:
        turns.setdefault(r.session, []).append(r.prompt)
    assert any(len(p) > 1 for p in turns.values())
    assert all(b.startswith(a) for p in turns.values() for a, b in itertools.pairwise(p))
    with pytest.raises(ValueError, match="long_min_tokens"):
        generate(
            "new-user",
            qps=1,
            duration_s=10,
            seed=0,
            params={"long_min_tokens": 9000, "long_max_tokens": 5000},
        )


def test_realtime_mix_classes_prefixes_and_slos() -> None:
    requests = generate("realtime-mix", qps=20, duration_s=100, seed=2)
    long = [r for r in requests if count_tokens(r.prompt) >= 3000]
    chat = [r for r in requests if count_tokens(r.prompt) <= 300]
    assert len(long) + len(chat) == len(requests)
    assert len(long) / len(requests) == pytest.approx(0.5, abs=0.05)
    assert all(32 <= r.max_tokens <= 256 for r in requests)
    # Each class carries its own SLOs; every prompt starts with one of the shared heads.
    assert {(r.slo_ttft_ms, r.slo_tpot_ms) for r in chat} == {(200.0, 25.0)}
    assert {(r.slo_ttft_ms, r.slo_tpot_ms) for r in long} == {(600.0, 35.0)}
    assert len({r.prompt[: 4 * 64] for r in chat}) == 4
    assert len({r.prompt[: 4 * 500] for r in long}) == 8
    assert len({r.prompt for r in requests}) == len(requests)
    # The workload-wide SLOs replace both classes'.
    same = generate("realtime-mix", qps=20, duration_s=20, seed=2, params={"slo_ttft_ms": 900})
    assert {r.slo_ttft_ms for r in same} == {900.0}
    assert {r.slo_tpot_ms for r in same} == {25.0, 35.0}
    with pytest.raises(ValueError, match=r"realtime-mix.*chat_min_tokens"):
        generate("realtime-mix", qps=1, duration_s=10, seed=0, params={"chat_min_tokens": 400})


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("shared-prefix-c", SMALL_GROUPS),
        ("shared-prefix-a", {**SMALL_GROUPS, "max_turns": 3}),
        ("maas-mix", {}),
        ("code-generation", {"shared_prompt_tokens": 50, "context_median_tokens": 100}),
        ("sharegpt", {"turn_gap_s": 5}),
    ],
)
def test_turns_extend_the_previous_prompt_and_reply(name: str, params: dict[str, int]) -> None:
    requests = generate(name, qps=5, duration_s=120, seed=5, params=params)
    by_session: dict[int, list[BenchRequest]] = defaultdict(list)
    for request in requests:
        if request.session >= 0:
            by_session[request.session].append(request)
    followups = 0
    for turns in by_session.values():
        for previous, current in itertools.pairwise(turns):
            history = previous.prompt + output_text(0, previous.max_tokens)
            assert current.prompt.startswith(history)
            assert len(current.prompt) > len(history)
            followups += 1
    assert followups >= 20
    if "max_turns" in params:
        assert max(len(turns) for turns in by_session.values()) <= params["max_turns"]


def test_distinct_groups_share_no_first_block() -> None:
    requests = generate("shared-prefix-c", qps=10, duration_s=60, seed=6, params=SMALL_GROUPS)
    system_chars = 4 * SMALL_GROUPS["system_prompt_tokens"]
    by_block: dict[str, set[str]] = defaultdict(set)
    for request in requests:
        by_block[request.prompt[:64]].add(request.prompt[:system_chars])
    assert len(by_block) == SMALL_GROUPS["groups"]  # every group seen, each its own first block
    assert all(len(systems) == 1 for systems in by_block.values())
    # Different users of one group part right after the system prompt.
    first_of_session: dict[int, str] = {}
    for request in requests:
        first_of_session.setdefault(request.session, request.prompt)
    same_group = [p for p in first_of_session.values() if p[:64] == requests[0].prompt[:64]]
    assert len(same_group) >= 2
    a, b = same_group[:2]
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert system_chars <= common < system_chars + 16


def test_max_model_len_clipping_is_counted() -> None:
    params = {"context_max_tokens": 8000}
    full = generate("code-generation", qps=2, duration_s=300, seed=9, params=params)
    clipped = generate("code-generation", qps=2, duration_s=300, seed=9, params=params, max_model_len=16_000)
    assert full.clipped == full.dropped == 0
    assert clipped.clipped > 0 and clipped.dropped == 0 and len(clipped) == len(full)
    head = full[0].prompt[: 4 * 3000]
    changed = 0
    for before, after in zip(full, clipped, strict=True):
        assert count_tokens(after.prompt) + after.max_tokens <= 16_000
        assert after.max_tokens == before.max_tokens and after.prompt.startswith(head)
        if after.prompt != before.prompt:
            changed += 1
            assert before.prompt.endswith(after.prompt[-4000:])  # the newest text is kept
    assert changed == clipped.clipped

    reasoning = generate("reasoning", qps=5, duration_s=100, seed=9)
    fitted = generate("reasoning", qps=5, duration_s=100, seed=9, max_model_len=8000)
    assert fitted.dropped > 0 and len(fitted) + fitted.dropped == len(reasoning)
    assert summarize(fitted).dropped == fitted.dropped


def test_clip_keeps_head_and_newest_tokens() -> None:
    prompt = "HEAD" + "aaaa" * 5 + "NEWS"
    assert clip(prompt, 4, 10, None) is prompt
    assert clip(prompt, 4, 3, 10) is prompt
    assert clip(prompt, 4, 5, 8) == "HEAD" + "aaaa" + "NEWS"
    assert clip(prompt, 4, 7, 8) is None  # head + output leave no room


def test_slos_and_sheddable_share() -> None:
    plain = generate("maas-mix", qps=10, duration_s=200, seed=12)
    marked = generate(
        "maas-mix",
        qps=10,
        duration_s=200,
        seed=12,
        params={"slo_ttft_ms": "500", "slo_tpot_ms": 50, "sheddable_share": "0.25"},
    )
    assert [(r.arrival, r.prompt, r.max_tokens) for r in plain] == [
        (r.arrival, r.prompt, r.max_tokens) for r in marked
    ]
    assert {(r.slo_ttft_ms, r.slo_tpot_ms) for r in marked} == {(500.0, 50.0)}
    assert np.mean([r.priority < 0 for r in marked]) == pytest.approx(0.25, abs=0.03)
    assert (
        generate("reasoning", qps=1, duration_s=20, seed=1, params={"slo_ttft_ms": "none"})[0].slo_ttft_ms
        is None
    )


@pytest.mark.parametrize(
    ("name", "params", "words"),
    [
        ("maas-mix", {"turn_gapp_s": 3}, ["maas-mix", "turn_gapp_s"]),
        ("shared-prefix-a", {"groups": "many"}, ["shared-prefix-a", "groups"]),
        ("shared-prefix-b", {"groups": 0}, ["shared-prefix-b", "groups"]),
        ("reasoning", {"sheddable_share": 1.5}, ["reasoning", "sheddable_share"]),
        ("code-generation", {"turns_mean": "0.5"}, ["code-generation", "turns_mean"]),
        ("sharegpt", {"slo_ttft_ms": -1}, ["sharegpt", "slo_ttft_ms"]),
        (
            "maas-mix",
            {"document_min_tokens": 9, "document_max_tokens": 8},
            ["maas-mix", "document_min_tokens"],
        ),
        ("b2b-saas", {"users_per_group": 2.5}, ["b2b-saas", "users_per_group"]),
    ],
)
def test_bad_parameters_name_workload_and_parameter(name: str, params: dict, words: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        generate(name, qps=1, duration_s=10, seed=0, params=params)
    assert all(word in str(error.value) for word in words), str(error.value)


def test_bad_generate_arguments() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        generate("nope", qps=1, duration_s=1, seed=0)
    with pytest.raises(ValueError, match="qps"):
        generate("reasoning", qps=0, duration_s=1, seed=0)
    with pytest.raises(ValueError, match="duration_s"):
        generate("reasoning", qps=1, duration_s=float("nan"), seed=0)
    with pytest.raises(ValueError, match="unknown workload"):
        workload_defaults("nope")


def test_prefix_reuse_counts_whole_blocks_of_earlier_prompts_and_replies() -> None:
    prompt = "abcd" * 64  # 64 tokens = 4 blocks
    first = BenchRequest(0.0, prompt, 16)
    # The same prompt again: 3 blocks (the engine never serves the whole prompt from cache).
    assert prefix_reuse([first, BenchRequest(1.0, prompt, 1)]) == pytest.approx(48 / 128)
    # The next turn: prompt + reply + question reuses the 5 whole blocks of prompt + reply.
    turn = BenchRequest(1.0, prompt + output_text(0, 16) + "q" * 40, 1)
    assert prefix_reuse([first, turn]) == pytest.approx(80 / (64 + 90))
    assert prefix_reuse([first, BenchRequest(1.0, "x" + prompt[1:], 1)]) == 0.0
    assert summarize([]).requests == 0


def _write_truncated(path: Path) -> None:
    conversations = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "x" * 40}, {"from": "gpt", "value": "y" * 401}],
        },
        {
            "id": "b",
            "conversations": [
                {"from": "gpt", "value": "leading answer"},
                {"from": "human", "value": "é" * 10},  # 20 UTF-8 bytes = 5 tokens
                {"from": "gpt", "value": "z" * 8},
                {"from": "human", "value": "w"},
                {"from": "gpt", "value": ""},
                {"from": "human", "value": "unanswered"},
            ],
        },
        {"id": "c", "conversations": [{"from": "gpt", "value": "no human"}]},
        {"id": "d", "conversations": [{"from": "human", "value": "q"}, {"from": "human", "value": "q"}]},
        {"id": "e", "conversations": [{"from": "human", "value": "kept"}, {"from": "gpt", "value": "ok"}]},
    ]
    text = "[\n" + ",\n".join(json.dumps(c, indent=2) for c in conversations)
    text += ',\n  {"id": "f", "conversations": [{"from": "human", "value": "cut he'  # truncated
    path.write_text(text, encoding="utf-8")


def test_sharegpt_tolerant_reader(tmp_path: Path) -> None:
    path = tmp_path / "truncated.json"
    _write_truncated(path)
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    assert load_conversations(str(path)) == (((10, 101),), ((5, 2), (1, 1)), ((1, 1),))


def test_sharegpt_real_dataset() -> None:
    conversations = load_conversations()
    assert 17_000 < len(conversations) < 17_671
    assert sum(len(c) > 1 for c in conversations) > 12_000
    requests = generate("sharegpt", qps=5, duration_s=200, seed=1, params={"multi_turn_share": 0})
    assert all(r.session == -1 for r in requests)
    dataset_first = {c[0] for c in conversations}
    for request in requests[:50]:
        tag_tokens = count_tokens(request.prompt[: request.prompt.index("]") + 1])  # "[conversation N]"
        assert (count_tokens(request.prompt) - tag_tokens, request.max_tokens) in dataset_first
