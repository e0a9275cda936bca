"""From a generator's drafts to the final requests: random streams, context clipping, SLOs, priorities."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from slorouter.bench.workloads.clip import clip
from slorouter.bench.workloads.params import WorkloadParams
from slorouter.bench.workloads.request import BenchRequest, WorkloadRequests

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Draft:
    """A request before clipping: ``head_chars`` leading characters are kept when it must be clipped."""

    arrival: float
    prompt: str
    head_chars: int
    max_tokens: int
    session: int = -1
    # The request's own SLOs where a workload's classes differ; None: the workload's slo_ttft_ms, slo_tpot_ms
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None


def stream(seed: int, purpose: str) -> np.random.Generator:
    """An independent random stream per purpose, so that e.g. changing the sheddable share or the lengths
    leaves the arrival times as they were (the same arrivals for every policy and parameter)."""
    return np.random.default_rng([seed, zlib.crc32(purpose.encode())])


def assemble(
    name: str, drafts: Iterable[Draft], params: WorkloadParams, seed: int, max_model_len: int | None
) -> WorkloadRequests:
    """Clip every draft to ``max_model_len`` and attach SLOs and priorities."""
    kept: list[Draft] = []
    prompts: list[str] = []
    clipped = dropped = 0
    for draft in drafts:
        prompt = clip(draft.prompt, draft.head_chars, draft.max_tokens, max_model_len)
        if prompt is None:
            dropped += 1
            continue
        clipped += prompt is not draft.prompt
        kept.append(draft)
        prompts.append(prompt)
    sheddable = stream(seed, "priority").random(len(kept)) < params.sheddable_share
    requests = WorkloadRequests(
        name,
        (
            BenchRequest(
                arrival=draft.arrival,
                prompt=prompt,
                max_tokens=draft.max_tokens,
                session=draft.session,
                slo_ttft_ms=params.slo_ttft_ms if draft.slo_ttft_ms is None else draft.slo_ttft_ms,
                slo_tpot_ms=params.slo_tpot_ms if draft.slo_tpot_ms is None else draft.slo_tpot_ms,
                priority=-1 if shed else 0,
            )
            for draft, prompt, shed in zip(kept, prompts, sheddable.tolist(), strict=True)
        ),
        clipped=clipped,
        dropped=dropped,
    )
    if clipped or dropped:
        log.info(
            "workload %s: %d request(s) clipped and %d dropped to fit max_model_len=%s",
            name,
            clipped,
            dropped,
            max_model_len,
        )
    return requests
