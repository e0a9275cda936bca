"""Multi-turn conversations whose history hits the prefix cache like a real model's would.

Turn k+1's prompt is turn k's prompt, then the simulated model's reply to turn k (exactly the
``output_text(0, n)`` the simulator generates for ``max_tokens = n``), then the new question. The
benchmark is open-loop: a conversation's next turn is simply the next arrival assigned to it, whether or
not the reply to its previous turn has finished by then in the simulated run; its prompt carries the
full reply regardless (the simulated reply is fixed by its length, so it is known in advance).
"""

from __future__ import annotations

from slorouter.bench.workloads.draft import Draft
from slorouter.bench.workloads.text import reply


class Conversation:
    """One conversation: a fixed head (tag, system prompt) and the text of every turn so far."""

    __slots__ = ("_text", "head_chars", "session", "turn", "turns")

    def __init__(self, session: int, head: str, turns: int = 0) -> None:
        self.session = session  # -1 when the conversation has a single turn
        self.head_chars = len(head)
        self.turns = turns  # planned turns, 0 for unlimited
        self.turn = 0  # turns asked so far
        self._text = head

    @property
    def done(self) -> bool:
        return 0 < self.turns <= self.turn

    def ask(self, arrival: float, question: str, output_tokens: int) -> Draft:
        """The next turn's request; the reply of ``output_tokens`` tokens joins the history."""
        prompt = self._text + question
        self.turn += 1
        # The last turn's reply is never sent again: skip building it.
        self._text = "" if self.done else prompt + reply(output_tokens)
        return Draft(arrival, prompt, self.head_chars, output_tokens, self.session)
