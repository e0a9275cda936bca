"""``sharegpt``: real single- and multi-turn conversation lengths from ShareGPT V3.

``turn_gap_s × qps`` conversations are open at any time; each arrival is the next turn of one of them,
picked uniformly, and a conversation that has played all its turns is replaced by the next one of the
dataset in a seeded shuffled order (cycling). A conversation is played with all its turns with
probability ``multi_turn_share``, otherwise only its first turn is sent. The text is synthetic (a
conversation tag, then filler of the human message's length): the simulator only reads lengths and bytes,
and token-aligned ASCII keeps the history's reuse exact.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from slorouter.bench.workloads.arrivals import poisson
from slorouter.bench.workloads.conversations import Conversation
from slorouter.bench.workloads.draft import Draft, stream
from slorouter.bench.workloads.params import Share, WorkloadParams
from slorouter.bench.workloads.sharegpt_data import load_conversations
from slorouter.bench.workloads.text import piece, tag


class ShareGPTParams(WorkloadParams):
    multi_turn_share: Share = 1.0  # share of conversations played with all their turns (else the first)
    turn_gap_s: Annotated[float, Field(gt=0)] = 30.0  # mean seconds between turns of a conversation


def build(params: ShareGPTParams, qps: float, duration_s: float, seed: int) -> list[Draft]:
    arrivals = poisson(stream(seed, "arrivals"), qps, 0.0, duration_s).tolist()
    dataset = load_conversations()
    structure = stream(seed, "conversations")
    order = structure.permutation(len(dataset)).tolist()
    slots = max(1, round(qps * params.turn_gap_s))
    picks = structure.integers(0, slots, len(arrivals)).tolist()
    full = (structure.random(len(arrivals)) < params.multi_turn_share).tolist()

    open_conversations: list[tuple[Conversation, tuple[tuple[int, int], ...]] | None] = [None] * slots
    started = 0
    drafts = []
    for i, (arrival, slot) in enumerate(zip(arrivals, picks, strict=True)):
        entry = open_conversations[slot]
        if entry is None or entry[0].done:
            turns = dataset[order[started % len(dataset)]]
            if not full[i]:
                turns = turns[:1]
            conversation = Conversation(
                started if len(turns) > 1 else -1, tag(f"conversation {started}"), len(turns)
            )
            started += 1
            entry = (conversation, turns)
            open_conversations[slot] = entry
        conversation, turns = entry
        question_tokens, answer_tokens = turns[conversation.turn]
        drafts.append(conversation.ask(arrival, piece("", question_tokens), answer_tokens))
    return drafts
