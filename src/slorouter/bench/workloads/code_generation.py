"""``code-generation``: prefill-bound coding assistants over shared repository contexts.

After inference-perf's workload catalog (code-generation: "3k shared + lognormal mean-160k context; 1500
input / 425 output per turn; many turns") and llm-d's token-aware routing blog, which uses it as its
prefill-bound workload. Every prompt opens with one shared 3,000-token prompt (tools, instructions), then
its repository's context, shared by that repository's few users, then the conversation. The catalog's
160k-token contexts do not fit the simulated profiles' 32k context, so contexts are lognormal around
``context_median_tokens`` (several thousand) and capped.

``repositories × users_per_repository`` users; each arrival is the next turn of one of them, picked
uniformly; a conversation lasts a geometric number of turns of mean ``turns_mean``, then that user starts
a new one over the same repository.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from slorouter.bench.workloads.arrivals import poisson
from slorouter.bench.workloads.conversations import Conversation
from slorouter.bench.workloads.draft import Draft, stream
from slorouter.bench.workloads.lengths import around, lognormal
from slorouter.bench.workloads.params import PositiveInt, RelStd, WorkloadParams
from slorouter.bench.workloads.text import piece, tag


class CodeGenerationParams(WorkloadParams):
    shared_prompt_tokens: PositiveInt = 3000  # common to every request
    repositories: PositiveInt = 8
    users_per_repository: PositiveInt = 4
    context_median_tokens: PositiveInt = 7000  # repository context (lognormal per repository)
    context_sigma: Annotated[float, Field(ge=0, le=3)] = 0.5
    context_max_tokens: PositiveInt = 20_000
    question_tokens: PositiveInt = 1500  # mean new input per turn
    output_tokens: PositiveInt = 425  # mean max_tokens per turn
    length_std: RelStd = 0.3  # relative std of question and output lengths
    turns_mean: Annotated[float, Field(ge=1)] = 4.0  # mean turns per conversation (geometric)


def build(params: CodeGenerationParams, qps: float, duration_s: float, seed: int) -> list[Draft]:
    arrivals = poisson(stream(seed, "arrivals"), qps, 0.0, duration_s).tolist()
    count = len(arrivals)
    lengths = stream(seed, "lengths")
    questions = around(lengths, params.question_tokens, params.length_std, count).tolist()
    outputs = around(lengths, params.output_tokens, params.length_std, count).tolist()

    structure = stream(seed, "users")
    shared = piece(tag("code-generation shared prompt"), params.shared_prompt_tokens)
    context_lengths = lognormal(
        structure,
        params.context_median_tokens,
        params.context_sigma,
        params.context_max_tokens,
        params.repositories,
    ).tolist()
    heads = [shared + piece(tag(f"repository {r}"), n) for r, n in enumerate(context_lengths)]
    users = params.repositories * params.users_per_repository
    picks = structure.integers(0, users, count).tolist()
    end_p = 1.0 / params.turns_mean

    conversations: list[Conversation | None] = [None] * users
    serials = [0] * users  # which conversation of its user, for distinct question tags
    started = 0
    drafts = []
    for i, (arrival, user) in enumerate(zip(arrivals, picks, strict=True)):
        conversation = conversations[user]
        if conversation is None or conversation.done:
            turns = int(structure.geometric(end_p))
            head = heads[user // params.users_per_repository]
            conversation = Conversation(started if turns > 1 else -1, head, turns)
            conversations[user] = conversation
            serials[user] = started
            started += 1
        label = tag(f"user {user} conversation {serials[user]} turn {conversation.turn}")
        drafts.append(conversation.ask(arrival, piece(label, questions[i]), outputs[i]))
    return drafts
