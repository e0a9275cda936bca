"""``realtime-mix``: the workload of ``benchmarks/bench_quality_realtime.py``, in virtual time.

Short chat requests under one of a few short shared system prompts, beside long-context requests that ask
about one of a few shared documents. The same shape (not the same bytes) as the real-time benchmark's
workload, so that a routing result can be compared between virtual and real time on one workload: a win that
exists in one and not the other points at what the discrete-event model leaves out. Each class carries its
own SLOs (the real-time benchmark's defaults); the shared ``slo_ttft_ms``/``slo_tpot_ms``, when set, replace
both.
"""

from __future__ import annotations

from slorouter.bench.workloads.arrivals import poisson
from slorouter.bench.workloads.draft import Draft, stream
from slorouter.bench.workloads.params import OptionalPositive, PositiveInt, Share, WorkloadParams
from slorouter.bench.workloads.text import piece, tag


class RealtimeMixParams(WorkloadParams):
    long_share: Share = 0.5
    chat_min_tokens: PositiveInt = 100  # whole prompt, system prompt included (uniform)
    chat_max_tokens: PositiveInt = 300
    long_min_tokens: PositiveInt = 3000
    long_max_tokens: PositiveInt = 8000
    output_min_tokens: PositiveInt = 32  # max_tokens (uniform)
    output_max_tokens: PositiveInt = 256
    system_prompts: PositiveInt = 4
    system_prompt_tokens: PositiveInt = 64
    documents: PositiveInt = 8
    document_min_tokens: PositiveInt = 500
    document_max_tokens: PositiveInt = 1500
    chat_slo_ttft_ms: OptionalPositive = 200.0
    chat_slo_tpot_ms: OptionalPositive = 25.0
    long_slo_ttft_ms: OptionalPositive = 600.0
    long_slo_tpot_ms: OptionalPositive = 35.0


def build(params: RealtimeMixParams, qps: float, duration_s: float, seed: int) -> list[Draft]:
    for low, high in (
        ("chat_min_tokens", "chat_max_tokens"),
        ("long_min_tokens", "long_max_tokens"),
        ("output_min_tokens", "output_max_tokens"),
        ("document_min_tokens", "document_max_tokens"),
    ):
        if getattr(params, low) > getattr(params, high):
            raise ValueError(f"workload 'realtime-mix': {low} is above {high}")
    shared = stream(seed, "shared")
    systems = [
        piece(tag(f"system prompt {i}"), params.system_prompt_tokens) for i in range(params.system_prompts)
    ]
    documents = [
        piece(
            tag(f"document {i}"),
            int(shared.integers(params.document_min_tokens, params.document_max_tokens + 1)),
        )
        for i in range(params.documents)
    ]
    arrivals = poisson(stream(seed, "arrivals"), qps, 0.0, duration_s).tolist()
    rng = stream(seed, "requests")
    chat_slo = (params.slo_ttft_ms or params.chat_slo_ttft_ms, params.slo_tpot_ms or params.chat_slo_tpot_ms)
    long_slo = (params.slo_ttft_ms or params.long_slo_ttft_ms, params.slo_tpot_ms or params.long_slo_tpot_ms)
    drafts: list[Draft] = []
    for i, arrival in enumerate(arrivals):
        output = int(rng.integers(params.output_min_tokens, params.output_max_tokens + 1))
        if rng.random() < params.long_share:
            head = documents[int(rng.integers(len(documents)))]
            total = int(rng.integers(params.long_min_tokens, params.long_max_tokens + 1))
            question = max(total - len(head) // 4, 200)
            slo = long_slo
        else:
            head = systems[int(rng.integers(len(systems)))]
            total = int(rng.integers(params.chat_min_tokens, params.chat_max_tokens + 1))
            question = max(total - len(head) // 4, 16)
            slo = chat_slo
        prompt = head + piece(tag(f"question {i}"), question)
        drafts.append(Draft(arrival, prompt, len(head), output, slo_ttft_ms=slo[0], slo_tpot_ms=slo[1]))
    return drafts
