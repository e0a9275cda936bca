"""Shared-prefix workloads: groups of users under one system prompt per group.

``shared-prefix-a`` … ``-d`` are the four scenarios of llm-d's predicted-latency benchmark (llm-d blog
2026-03-13; peers-and-anchors.md §8): every user is a multi-turn conversation under its group's system
prompt, with 30% variance on question and output lengths. ``b2b-saas`` is llm-d's "KV-cache wins" workload
(2025-09-24; §1.3): 150 customers' 6,000-token system prompts × 5 users, single 1,200-token queries,
1,000-token answers. ``high-churn`` is that shape under KV pressure (for precise prefix routing): 160
documents of 20,000 tokens × 5 users, 300-token questions, 200-token answers; the documents (3.2M tokens) are
more than the pods' KV holds (8 × qwen3-32b-h100-tp2: 2.2M), so the pods keep evicting them.

Users are visited round-robin in a seeded shuffled order, as inference-perf's shared_prefix generator
with ``enable_multi_turn_chat`` does: arrival ``i`` is user ``i mod users``'s next turn, so a user's turns
are ``users / qps`` seconds apart on average.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any

from pydantic import Field, create_model

from slorouter.bench.workloads.arrivals import poisson
from slorouter.bench.workloads.conversations import Conversation
from slorouter.bench.workloads.draft import Draft, stream
from slorouter.bench.workloads.lengths import around
from slorouter.bench.workloads.params import PositiveInt, RelStd, WorkloadParams
from slorouter.bench.workloads.text import piece, tag


class SharedPrefixParams(WorkloadParams):
    groups: PositiveInt = 150  # distinct system prompts
    users_per_group: PositiveInt = 5  # conversations under each system prompt
    system_prompt_tokens: PositiveInt = 6000
    question_tokens: PositiveInt = 1200  # mean of each turn's new question
    output_tokens: PositiveInt = 1000  # mean of each turn's answer (max_tokens)
    length_std: RelStd = 0.3  # relative std of question and output lengths (normal, cut at ±2σ)
    max_turns: Annotated[int, Field(ge=0)] = 0  # turns before a user starts a new conversation; 0 = never


def scenario(model_name: str, **defaults: int | float) -> type[SharedPrefixParams]:
    """``SharedPrefixParams`` with other defaults (and the same constraints)."""
    fields: dict[str, Any] = {}
    for key, value in defaults.items():
        info = copy.copy(SharedPrefixParams.model_fields[key])
        info.default = value
        fields[key] = (info.annotation, info)
    return create_model(model_name, __base__=SharedPrefixParams, **fields)


SCENARIOS: dict[str, type[SharedPrefixParams]] = {
    "shared-prefix-a": scenario(
        "ScenarioA", groups=6, users_per_group=1000, system_prompt_tokens=1000, question_tokens=30
    ),
    "shared-prefix-b": scenario(
        "ScenarioB", groups=6, users_per_group=1000, system_prompt_tokens=1000, question_tokens=3000
    ),
    "shared-prefix-c": scenario("ScenarioC"),  # the base defaults are scenario C
    "shared-prefix-d": scenario("ScenarioD", system_prompt_tokens=1000, question_tokens=6200),
    "b2b-saas": scenario("B2BSaaS", length_std=0.0, max_turns=1),
    "high-churn": scenario(
        "HighChurn",
        groups=160,
        system_prompt_tokens=20000,
        question_tokens=300,
        output_tokens=200,
        max_turns=1,
    ),
}


def build(params: SharedPrefixParams, qps: float, duration_s: float, seed: int) -> list[Draft]:
    arrivals = poisson(stream(seed, "arrivals"), qps, 0.0, duration_s).tolist()
    count = len(arrivals)
    lengths = stream(seed, "lengths")
    questions = around(lengths, params.question_tokens, params.length_std, count).tolist()
    outputs = around(lengths, params.output_tokens, params.length_std, count).tolist()
    users = params.groups * params.users_per_group
    order = stream(seed, "users").permutation(users).tolist()

    systems = [
        piece(tag(f"group {g} system prompt"), params.system_prompt_tokens) for g in range(params.groups)
    ]
    conversations: list[Conversation | None] = [None] * users
    serials = [0] * users  # which conversation of its user, for distinct question tags
    next_session = 0
    drafts = []
    for i, arrival in enumerate(arrivals):
        user = order[i % users]
        conversation = conversations[user]
        if conversation is None or conversation.done:
            session = -1 if params.max_turns == 1 else next_session
            next_session += 1
            conversation = Conversation(session, systems[user // params.users_per_group], params.max_turns)
            conversations[user] = conversation
            serials[user] += 1
        question = piece(tag(f"user {user} c{serials[user]} t{conversation.turn}"), questions[i])
        drafts.append(conversation.ask(arrival, question, outputs[i]))
    return drafts


__all__ = ["SCENARIOS", "SharedPrefixParams", "build"]
