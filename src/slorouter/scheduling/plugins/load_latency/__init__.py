"""Expected TTFT from the router's own load counters, learned online from the pool's first tokens.

``load-latency-producer`` turns llm-d's token-aware load core into milliseconds. For each candidate it takes
the uncached prefill tokens in flight ahead of the request there (``q``), the request's own uncached prompt
there (``o``; both are what ``token-load-scorer`` adds up) and the decode context running there (``d``, the
context tokens of the requests past their first token), and estimates

    TTFT ≈ a[pod]·(θ₀ + θ₃·d + θ₆·r) + b[pod]·(θ₁·q + θ₂·o + θ₄·(q + o)·d + θ₅·o²) + θ₇·s

- θ is one fit for the whole pool (``LoadLatencyFit``): relative-error least squares over the recent first
  tokens, constrained to θ ≥ 0. Why this shape: a vLLM-like engine drains prefill work at a rate set by its
  step time; the running decodes ride in every step and slow it; a long prompt's attention over itself
  grows with its square; requests waiting for their first token (``r``) also queue for batch slots and
  KV-cache admission, which costs time even when their prompts are cached. The queue and the own prompt
  have separate rates because the router counts a
  queued prompt in full until its first token, when part of it is usually done. ``s`` is the wait for a
  batch slot (``BatchSlotQueue``): a pod at its cap of running requests (``max_num_seqs``, or what its KV
  cache admits) starts a new one only when one finishes, so a request ``k`` places beyond the cap waits about
  ``k`` × service time / cap (Little's law); no token count sees that, and a per-request slope fitted over
  the many short waits of a pod below its cap puts about a millisecond on it. A linear form keeps the
  ranking monotone in the work (the token-aware core is never overridden by noise) and extrapolates to
  loads the fit has not seen, which a tree ensemble does not.
- ``a[pod]``, ``b[pod]`` are what counting tokens cannot see: how much slower or faster this pod runs its
  fixed costs and its prompt work than the pool's typical pod, from its own recent first tokens
  (``PodSpeeds``). A pod 2.2× slower than the rest learns it within tens of requests; on a homogeneous pool
  every speed stays near 1. Everything it reads is router-local (in-flight counters, prefix match) but for
  the batch-slot cap, which only the pod's scraped queue tells; late or coarse engine metrics delay that,
  nothing else.

The producer also attaches what the request's own prompt adds there (the terms in ``o``): the time the
decode streams running on that pod would stall behind its prefill, which ``expected-latency-scorer``
charges for (``interferenceWeight``); and each pod's recent decode pace (``DecodePace``: milliseconds per
output token of its recent streams), which the scorer charges for the request's own tokens
(``decodeWeight``): the first token is not the whole wait of a request that streams a long reply.

Until the fit has ``minSamples`` first tokens (or while it has no cost per own-prompt token)
it attaches nothing, and the scorer counts tokens as ``token-load-scorer`` does.
"""

from slorouter.scheduling.plugins.load_latency.fit import LoadLatencyFit
from slorouter.scheduling.plugins.load_latency.pace import DecodePace
from slorouter.scheduling.plugins.load_latency.producer import LoadLatencyParams, LoadLatencyProducer
from slorouter.scheduling.plugins.load_latency.scorer import (
    ExpectedLatencyScorer,
    ExpectedLatencyScorerParams,
)
from slorouter.scheduling.plugins.load_latency.slots import BatchSlotQueue
from slorouter.scheduling.plugins.load_latency.speeds import PodSpeeds
from slorouter.scheduling.plugins.load_latency.terms import load_terms

__all__ = [
    "BatchSlotQueue",
    "DecodePace",
    "ExpectedLatencyScorer",
    "ExpectedLatencyScorerParams",
    "LoadLatencyFit",
    "LoadLatencyParams",
    "LoadLatencyProducer",
    "PodSpeeds",
    "load_terms",
]
