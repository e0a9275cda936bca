"""``reasoning``: decode-bound single requests with long outputs.

After inference-perf's workload catalog (reasoning: "250-token shared prompt; 1000 input; 8000 mean
output (max 32k)") and llm-d's token-aware routing blog, which uses it as its decode-bound workload.
Every request is the shared prompt, then its own question; outputs are lognormal, capped at
``output_max``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from slorouter.bench.workloads.arrivals import poisson
from slorouter.bench.workloads.draft import Draft, stream
from slorouter.bench.workloads.lengths import around, lognormal
from slorouter.bench.workloads.params import PositiveInt, RelStd, WorkloadParams
from slorouter.bench.workloads.text import piece, tag


class ReasoningParams(WorkloadParams):
    shared_prompt_tokens: PositiveInt = 250
    question_tokens: PositiveInt = 1000  # mean (normal, length_std)
    length_std: RelStd = 0.3
    output_median: PositiveInt = 6700  # max_tokens (lognormal)
    output_sigma: Annotated[float, Field(ge=0, le=3)] = 0.6
    output_max: PositiveInt = 32_000


def build(params: ReasoningParams, qps: float, duration_s: float, seed: int) -> list[Draft]:
    arrivals = poisson(stream(seed, "arrivals"), qps, 0.0, duration_s).tolist()
    count = len(arrivals)
    lengths = stream(seed, "lengths")
    questions = around(lengths, params.question_tokens, params.length_std, count).tolist()
    outputs = lognormal(lengths, params.output_median, params.output_sigma, params.output_max, count).tolist()
    shared = piece(tag("reasoning shared prompt"), params.shared_prompt_tokens)
    return [
        Draft(arrival, shared + piece(tag(f"request {i}"), questions[i]), len(shared), outputs[i])
        for i, arrival in enumerate(arrivals)
    ]
