"""What a workload generator produces: timed requests, and the list that carries the clipping counts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a benchmark run."""

    arrival: float  # seconds from the start of the run, non-decreasing in the list
    prompt: str  # prompt text as sent to /v1/completions; the simulated tokenizer is 4 bytes = 1 token
    max_tokens: int  # output length (the simulator generates exactly this many tokens)
    session: int = -1  # conversation/session id, -1 for single-shot requests
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    priority: int = 0  # < 0 means sheddable
    tenant: str = (
        ""  # the fairness id flow control sees (x-llm-d-inference-fairness-id); "": the default flow
    )


def objective_of(priority: int) -> str:
    """The inference objective the benchmark gives a priority class: ``critical`` (> 0), ``standard`` (0)
    or ``sheddable`` (< 0); the policies' deadlines (``+slo``) are set per objective."""
    if priority > 0:
        return "critical"
    return "standard" if priority == 0 else "sheddable"


class WorkloadRequests(list[BenchRequest]):
    """A workload's requests in arrival order, plus what fitting them into ``max_model_len`` cost.

    ``clipped`` requests had the oldest part of their history cut out; ``dropped`` ones could not fit at all
    and are not in the list. Equal to a plain list with the same requests.
    """

    def __init__(self, name: str, requests: Iterable[BenchRequest] = (), clipped: int = 0, dropped: int = 0):
        super().__init__(requests)
        self.name = name
        self.clipped = clipped
        self.dropped = dropped
