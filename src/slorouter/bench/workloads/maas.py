"""``maas-mix``: a production-like Model-as-a-Service mix, after llm-d's headline predicted-latency benchmark.

The original (llm-d blog 2026-03-13; peers-and-anchors.md §1.1) replayed a production-derived profile:
input length mean 729 tokens (σ 13,550, max 131,072), output mean 300 (σ 2,213), about 94% prefix-cache hit
rate, Poisson arrivals alternating between 1 and 5 RPS. The trace itself is not public, so this is a
synthetic model with those marginals:

- **Sessions.** ``turn_gap_s × qps`` sessions are open at any time; each arrival is the next turn of one of
  them, picked uniformly (so a session's turns are ``turn_gap_s`` apart on average). A session lasts a
  geometric number of turns of mean ``turns_mean`` and is then replaced by a new one. Most of each prompt
  is the session's history, which is where the prefix reuse comes from.
- **System prompts.** Each session opens with one of ``system_prompts`` shared system prompts (tenants,
  applications), lognormal lengths.
- **Heavy-tailed inputs.** A turn's new user message is lognormal (a few dozen tokens typically); a share
  ``document_share`` of them are pasted documents, log-uniform between ``document_min_tokens`` and
  ``document_max_tokens`` (the original's 131,072 maximum). Long sessions and documents make the tail.
- **Heavy-tailed outputs.** Lognormal with a large ``output_sigma`` (the original's σ/mean ≈ 7), capped.
- **Arrivals.** Poisson, alternating every ``phase_s`` seconds between a low and a ``rate_ratio`` times
  higher rate (the original: 1 and 5 RPS), with time-average ``qps``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from slorouter.bench.workloads.arrivals import alternating_poisson
from slorouter.bench.workloads.conversations import Conversation
from slorouter.bench.workloads.draft import Draft, stream
from slorouter.bench.workloads.lengths import log_uniform, lognormal
from slorouter.bench.workloads.params import Positive, PositiveInt, Share, WorkloadParams
from slorouter.bench.workloads.text import piece, tag

Ratio = Annotated[float, Field(ge=1)]
Sigma = Annotated[float, Field(ge=0, le=4)]


class MaasParams(WorkloadParams):
    rate_ratio: Ratio = 5.0  # high rate / low rate (the original: 5 RPS / 1 RPS)
    phase_s: Positive = 30.0  # seconds of each low or high phase
    turn_gap_s: Positive = 20.0  # mean seconds between turns of a session (open sessions = qps × this)
    turns_mean: Annotated[float, Field(ge=1)] = 2.5  # mean turns per session (geometric)
    system_prompts: PositiveInt = 32  # distinct shared system prompts
    system_prompt_median: PositiveInt = 120
    system_prompt_sigma: Sigma = 0.7
    question_median: PositiveInt = 14  # tokens of a turn's new user message (lognormal)
    question_sigma: Sigma = 1.2
    document_share: Share = 0.0005  # share of user messages that are pasted documents
    document_min_tokens: PositiveInt = 4096
    document_max_tokens: PositiveInt = 131_072
    output_median: PositiveInt = 45  # max_tokens (lognormal)
    output_sigma: Sigma = 2.0
    output_max: PositiveInt = 16_384

    @model_validator(mode="after")
    def _document_range(self) -> MaasParams:
        if self.document_min_tokens > self.document_max_tokens:
            raise ValueError("document_min_tokens must not exceed document_max_tokens")
        return self


def build(params: MaasParams, qps: float, duration_s: float, seed: int) -> list[Draft]:
    arrivals = alternating_poisson(
        stream(seed, "arrivals"), qps, duration_s, params.rate_ratio, params.phase_s
    ).tolist()
    count = len(arrivals)
    lengths = stream(seed, "lengths")
    questions = lognormal(lengths, params.question_median, params.question_sigma, 131_072, count)
    documents = lengths.random(count) < params.document_share
    questions[documents] = log_uniform(
        lengths, params.document_min_tokens, params.document_max_tokens, int(documents.sum())
    )
    outputs = lognormal(lengths, params.output_median, params.output_sigma, params.output_max, count).tolist()

    structure = stream(seed, "sessions")
    system_lengths = lognormal(
        structure, params.system_prompt_median, params.system_prompt_sigma, 131_072, params.system_prompts
    ).tolist()
    systems = [piece(tag(f"system prompt {k}"), n) for k, n in enumerate(system_lengths)]
    slots = max(1, round(qps * params.turn_gap_s))
    picks = structure.integers(0, slots, count).tolist()
    end_p = 1.0 / params.turns_mean

    sessions: list[Conversation | None] = [None] * slots
    next_session = 0
    drafts = []
    for arrival, slot, question_tokens, output_tokens in zip(
        arrivals, picks, questions.tolist(), outputs, strict=True
    ):
        session = sessions[slot]
        if session is None or session.done:
            turns = int(structure.geometric(end_p))
            system = systems[int(structure.integers(0, params.system_prompts))]
            session = Conversation(next_session if turns > 1 else -1, system, turns)
            session_tag = next_session
            next_session += 1
            sessions[slot] = session
        else:
            session_tag = session.session
        # The tag sets sessions apart right after their (possibly common) system prompt.
        question = piece(tag(f"session {session_tag} turn {session.turn}"), question_tokens)
        drafts.append(session.ask(arrival, question, output_tokens))
    return drafts
