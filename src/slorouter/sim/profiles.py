"""Latency-model constants of simulated model-server classes (model × GPU × serving configuration).

Step time in ms (notation of docs/simulator.md and of the team's reference notes, section (c)):

    step_ms = max(W, c_lin·T) + c_attn·Σpairs + c_kv·K + c_req·B + c_step

T = tokens scheduled in the step, Σpairs = Σ over prefill chunks of n·(s + n/2) (s = context already
computed), K = context tokens read by decode requests, B = decode requests. Every value below says where it
comes from; treat them as ±25% engineering estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

# Datasheet figures used to derive the A100 profile from the H100 one (dense BF16 TFLOPS; HBM TB/s).
H100_SXM_TFLOPS, H100_SXM_TBPS = 989.5, 3.35
A100_SXM_TFLOPS, A100_SXM_TBPS = 312.0, 2.04
_COMPUTE_RATIO = H100_SXM_TFLOPS / A100_SXM_TFLOPS  # 3.17: c_lin and c_attn are compute-bound
_BANDWIDTH_RATIO = H100_SXM_TBPS / A100_SXM_TBPS  # 1.64: W and c_kv are HBM-bound


@dataclass(frozen=True, slots=True)
class Profile:
    """One simulated model-server class. Times are in milliseconds, sizes in tokens or blocks."""

    name: str
    model: str  # default served model name
    description: str
    w_ms: float  # weight read per step: the floor of the linear layers' time
    c_lin_ms: float  # linear layers per scheduled token once compute-bound
    c_attn_ms: float  # prefill attention per (query, key) token pair
    c_kv_ms: float  # decode attention per context token read
    c_req_ms: float  # per decode request in the batch
    c_step_ms: float  # per step (scheduling, kernel launches)
    num_gpu_blocks: int  # KV-cache capacity
    max_model_len: int  # longest prompt + completion accepted
    api_pre_ms: float  # HTTP parse, tokenisation and hand-off before the request reaches the engine queue
    api_post_ms: float  # final detokenisation and response after the last token
    api_per_token_ms: float  # per output token (detokenise, serialise), added to the request's end
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    jitter_sigma: float = 0.04  # sigma of the multiplicative lognormal noise on each step's time
    # Serving-configuration knobs that engine variants change (slorouter.sim.variants); the defaults are
    # vLLM V1's.
    scheduler: str = "vllm"  # batch policy, a name of slorouter.sim.scheduler.POLICIES
    long_prefill_token_threshold: int = 0  # most prompt tokens of one request per step; 0 = the budget
    metrics_delay_ms: float = 0.0  # /metrics shows the gauges as they were this long ago
    metrics_period_ms: float = 0.0  # the waiting/running/KV gauges change only this often; 0 = live
    kv_usage_step: float = 0.0  # the KV-usage gauge is rounded to a multiple of this; 0 = exact
    # The waiting queue's order, vLLM's --scheduling-policy: "fcfs", or "priority" (by the request's
    # priority, lower first, then arrival; preemption takes the largest (priority, arrival)).
    scheduling_policy: str = "fcfs"
    # Stalls: the engine pauses (no step runs) for a length drawn uniformly from stall_ms, at exponentially
    # distributed gaps of mean stall_every_s; 0 = never.
    stall_every_s: float = 0.0
    stall_ms: tuple[float, float] = (0.0, 0.0)
    # Slow periods: for slow_for_s seconds every step takes slow_factor times as long, at exponentially
    # distributed gaps of mean slow_every_s between periods; 0 = never.
    slow_factor: float = 1.0
    slow_for_s: float = 0.0
    slow_every_s: float = 0.0
    # Whether a llama.cpp metrics page (slorouter sim --engine llamacpp) exports the KV gauges
    # (llamacpp:kv_cache_usage_ratio, llamacpp:kv_cache_tokens): older llama-server releases did, current
    # ones do not, and a router then estimates KV use from its in-flight requests.
    llamacpp_kv_metrics: bool = True

    def step_ms(self, tokens: int, pairs: float, decode_context: int, decodes: int) -> float:
        """Noise-free duration of a step (see the module docstring for the terms)."""
        return (
            max(self.w_ms, self.c_lin_ms * tokens)
            + self.c_attn_ms * pairs
            + self.c_kv_ms * decode_context
            + self.c_req_ms * decodes
            + self.c_step_ms
        )


LLAMA3_8B_H100 = Profile(
    name="llama3-8b-h100",
    model="sim-llama3-8b",
    description="Llama-3.1-8B-Instruct, BF16, 1x H100-80GB SXM (TP=1), vLLM V1 defaults",
    # BLIS trained-physics: 4.17 ms raw x beta3 1.36 = 5.7 ms; Vidur H100 Llama-2-7B linear, 1 token: 5.6 ms.
    w_ms=6.0,
    # Vidur H100 7B linear 20.6 us/token compute-bound (x1.05 for 8B); BLIS blackbox 17.7-19.8 us/prefill tok.
    c_lin_ms=0.022,
    # Roofline 2*L*d FLOPs per pair at ~50% MFU (= 33 ms extra for a fresh 8k prompt); Dynamo mocker T^2 term.
    c_attn_ms=1.0e-6,
    # 128 KB of KV per token at ~1.7 TB/s effective; BLIS 0.039 us raw x beta2b 1.95.
    c_kv_ms=7.6e-5,
    c_req_ms=0.005,  # BLIS beta6 = 4.4 us per request
    c_step_ms=1.1,  # BLIS 32 layers x 32.1 us + 126 us = 1.15 ms
    # BLIS historical total_kv_blocks for 8B on H100 TP=1 at gpu_memory_utilization 0.9 (~467k tokens).
    num_gpu_blocks=29_205,
    max_model_len=32_768,  # a common deployment setting (Llama 3.1 supports 131,072)
    # BLIS alpha0 = 15.6 ms queueing/API is generous for a local client: 5-10 ms recommended, split pre/post.
    api_pre_ms=6.0,
    api_post_ms=1.0,  # BLIS alpha1 = 0.78 ms post-decode
    api_per_token_ms=0.05,  # BLIS alpha2 = 46 us per output token
)

QWEN3_32B_H100_TP2 = Profile(
    name="qwen3-32b-h100-tp2",
    model="sim-qwen3-32b",
    description="Qwen3-32B, BF16, 2x H100-80GB SXM (TP=2), the llm-d reference path",
    w_ms=13.5,  # 32.8 GB of weights per GPU / 3.35 TB/s x 1.36 (BLIS beta3)
    c_lin_ms=0.038,  # with c_attn: 8k prefill = 0.40 s, the llm-d single-request fit (20,480 tok/s)
    c_attn_ms=2.3e-6,  # 4*L*(H*hd)/TP FLOPs per pair at ~50% MFU
    c_kv_ms=7.6e-5,  # 131 KB per GPU per token
    c_req_ms=0.005,  # as for 8B: per-request scheduling cost does not depend on the model
    c_step_ms=2.2,  # 64 layers x 32 us + TP all-reduce
    num_gpu_blocks=17_187,  # ~275k tokens: llm-d blog "~200-300k tokens per endpoint"
    max_model_len=32_768,  # Qwen3 native context
    api_pre_ms=6.0,
    api_post_ms=1.0,
    api_per_token_ms=0.05,
)

# Same model and memory (A100-80GB), slower chip: compute-bound terms scale by the TFLOPS ratio (3.17x),
# HBM-bound terms by the bandwidth ratio (1.64x); host-side overheads stay. Cross-check with Vidur's A100
# Llama-3-8B linear profile: 9.8 ms at 1 token (here W = 9.85 ms) and 275 ms at 4096 tokens (here 286 ms).
LLAMA3_8B_A100 = Profile(
    name="llama3-8b-a100",
    model="sim-llama3-8b",
    description="Llama-3.1-8B-Instruct, BF16, 1x A100-80GB SXM (TP=1), derived from llama3-8b-h100",
    w_ms=round(LLAMA3_8B_H100.w_ms * _BANDWIDTH_RATIO, 3),
    c_lin_ms=round(LLAMA3_8B_H100.c_lin_ms * _COMPUTE_RATIO, 5),
    c_attn_ms=round(LLAMA3_8B_H100.c_attn_ms * _COMPUTE_RATIO, 9),
    c_kv_ms=round(LLAMA3_8B_H100.c_kv_ms * _BANDWIDTH_RATIO, 8),
    c_req_ms=LLAMA3_8B_H100.c_req_ms,
    c_step_ms=LLAMA3_8B_H100.c_step_ms,
    num_gpu_blocks=LLAMA3_8B_H100.num_gpu_blocks,  # same 80 GB, same weights
    max_model_len=LLAMA3_8B_H100.max_model_len,
    api_pre_ms=LLAMA3_8B_H100.api_pre_ms,
    api_post_ms=LLAMA3_8B_H100.api_post_ms,
    api_per_token_ms=LLAMA3_8B_H100.api_per_token_ms,
)

# llama.cpp's llama-server on one CPU thread of the development VM, serving Gemma 3 270M (Q4_K_M), as the
# real-engine suite builds it (docs/real-engine.md) and as benchmarks/bench_realengine.py runs it
# (--parallel 4 --ctx-size 4096 --threads 1). Every constant is the fit of benchmarks/fit_llamacpp_profile.py
# (its measurements and these values are benchmarks/llamacpp_fit.json; tests/sim/test_llamacpp_profile.py
# checks they agree), in simulator tokens: 4 bytes of text, where Gemma's tokenizer makes
# LLAMACPP_TOKENS_PER_SIM_TOKEN tokens of the benchmark's English. On one thread a decode token costs a
# prompt token's layers plus the output head over the 262k vocabulary, so decoding is compute-bound at
# every batch size: W is one token's c_lin and never binds, and c_req carries the output head.
LLAMACPP_TOKENS_PER_SIM_TOKEN = 0.9993
LLAMACPP_GEMMA3_270M_CPU = Profile(
    name="llamacpp-gemma3-270m-cpu",
    model="gemma3-270m",
    description="Gemma 3 270M Q4_K_M on llama.cpp's llama-server, 1 CPU thread, 4 slots of 1,024 tokens",
    w_ms=2.5284,  # one token's c_lin: decoding is compute-bound, the floor never binds
    c_lin_ms=2.5284,  # prompt processing: about 395 tokens/s
    c_attn_ms=0.00071174,  # with c_lin and c_step: 960-token prompt in 2.8 s (measured 2.77-2.85 s)
    c_kv_ms=0.000115,  # almost none (batch 1: 21.0 ms after a 32-token prompt, 22.4 after 800)
    c_req_ms=12.91,  # per decode token beyond c_lin: the output head over 262,144 tokens
    c_step_ms=6.502,
    # 2 x ctx-size: the slots' contents plus the prompts llama-server keeps in RAM (--cache-ram, limited to
    # ctx-size tokens) and loads into any slot that held a prompt before.
    num_gpu_blocks=512,
    max_model_len=1_024,  # a slot's context: ctx-size / parallel = 1,024 Gemma tokens
    max_num_batched_tokens=2_048,  # --batch-size: prompt tokens of every slot and the decodes, one batch
    max_num_seqs=4,  # --parallel
    api_pre_ms=1.28,  # a streamed reply's first token at the client after the server's prompt_ms
    api_post_ms=0.5,
    api_per_token_ms=0.0,
    jitter_sigma=0.1255,  # sigma of log(gap between a stream's tokens) at batch 1
    llamacpp_kv_metrics=False,
)

# No model cost at all: every step takes 0 s, so only the proxy in front of the pods costs time.
INSTANT = Profile(
    name="instant",
    model="sim-instant",
    description="zero-cost model server for measuring proxy overhead",
    w_ms=0.0,
    c_lin_ms=0.0,
    c_attn_ms=0.0,
    c_kv_ms=0.0,
    c_req_ms=0.0,
    c_step_ms=0.0,
    num_gpu_blocks=1_000_000,  # never the bottleneck (blocks are materialised lazily)
    max_model_len=131_072,
    api_pre_ms=0.0,
    api_post_ms=0.0,
    api_per_token_ms=0.0,
    jitter_sigma=0.0,
)

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (LLAMA3_8B_H100, QWEN3_32B_H100_TP2, LLAMA3_8B_A100, LLAMACPP_GEMMA3_270M_CPU, INSTANT)
}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``ValueError`` naming the valid ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        valid = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown simulator profile {name!r}; valid profiles: {valid}") from None
