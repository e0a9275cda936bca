"""``new-user``: multi-turn chat under shared system prompts, streaming beside long single prompts.

The scenario the load-core pipeline was designed on: a fleet serving chat (users in groups that share a system
prompt, conversations whose history hits the prefix cache) while new users paste a 4k–16k-token document as
their first and only prompt. A long prompt is a prefill that delays every decode and every first token on its
pod; where it lands is what separates the routers. Each arrival is a long prompt with probability
``long_share``, otherwise the next turn of a chat user (users visited round-robin in a seeded order, as in the
shared-prefix family).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from slorouter.bench.workloads.arrivals import poisson
from slorouter.bench.workloads.conversations import Conversation
from slorouter.bench.workloads.draft import Draft, stream
from slorouter.bench.workloads.lengths import around
from slorouter.bench.workloads.params import PositiveInt, RelStd, Share, WorkloadParams
from slorouter.bench.workloads.text import piece, tag


class NewUserParams(WorkloadParams):
    groups: PositiveInt = 8  # distinct chat system prompts
    users_per_group: PositiveInt = 50
    system_prompt_tokens: PositiveInt = 1000
    question_tokens: PositiveInt = 100  # mean of a chat turn's new message
    output_tokens: PositiveInt = 200  # mean of every answer (max_tokens)
    length_std: RelStd = 0.3  # relative std of chat questions and of all outputs
    max_turns: Annotated[int, Field(ge=0)] = 5  # chat turns before a user starts over (0 = never): keeps
    # the prompt-length mix the same at every load and duration
    long_share: Share = 0.15  # share of arrivals that are a new user's long single prompt
    long_min_tokens: PositiveInt = 4000
    long_max_tokens: PositiveInt = 16000  # long prompts are uniform in [min, max]

    @model_validator(mode="after")
    def _long_range(self) -> NewUserParams:
        if self.long_min_tokens > self.long_max_tokens:
            raise ValueError(
                f"long_min_tokens ({self.long_min_tokens}) must not exceed long_max_tokens "
                f"({self.long_max_tokens})"
            )
        return self


def build(params: NewUserParams, qps: float, duration_s: float, seed: int) -> list[Draft]:
    arrivals = poisson(stream(seed, "arrivals"), qps, 0.0, duration_s).tolist()
    count = len(arrivals)
    lengths = stream(seed, "lengths")
    questions = around(lengths, params.question_tokens, params.length_std, count).tolist()
    outputs = around(lengths, params.output_tokens, params.length_std, count).tolist()
    kinds = stream(seed, "kinds")
    is_long = (kinds.random(count) < params.long_share).tolist()
    long_tokens = kinds.integers(params.long_min_tokens, params.long_max_tokens + 1, count).tolist()
    users = params.groups * params.users_per_group
    order = stream(seed, "users").permutation(users).tolist()
    systems = [
        piece(tag(f"group {g} system prompt"), params.system_prompt_tokens) for g in range(params.groups)
    ]
    conversations: list[Conversation | None] = [None] * users
    serials = [0] * users
    next_session = 0
    turns = 0  # chat arrivals so far
    drafts = []
    for i, arrival in enumerate(arrivals):
        if is_long[i]:
            prompt = piece(tag(f"new user {i} document"), long_tokens[i])
            drafts.append(Draft(arrival, prompt, 0, outputs[i]))
            continue
        user = order[turns % users]
        turns += 1
        conversation = conversations[user]
        if conversation is None or conversation.done:
            conversation = Conversation(
                next_session, systems[user // params.users_per_group], params.max_turns
            )
            next_session += 1
            conversations[user] = conversation
            serials[user] += 1
        question = piece(tag(f"user {user} c{serials[user]} t{conversation.turn}"), questions[i])
        drafts.append(conversation.ask(arrival, question, outputs[i]))
    return drafts


__all__ = ["NewUserParams", "build"]
