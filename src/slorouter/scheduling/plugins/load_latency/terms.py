"""The load-latency fit's regressors (one row per candidate) and how its expectation splits into the parts a
pod's two speeds scale."""

from __future__ import annotations

import numpy as np

# Feature scales: they keep the normal equations well conditioned (w in thousands of tokens, d in 100k).
WORK_SCALE = 1e-3
DECODE_SCALE = 1e-5
SLOT_WAIT_SCALE = 1e-3  # s in seconds
N_TERMS = 8  # 1, q, o, d, (q + o)·d, o², r, s


def load_terms(
    queue_tokens: np.ndarray,
    own_tokens: np.ndarray,
    decode_tokens: np.ndarray,
    waiting_requests: np.ndarray | None = None,
    slot_wait_ms: np.ndarray | None = None,
) -> np.ndarray:
    """The fit's regressors, one row per candidate: 1, q, o, d, (q + o)·d, o², r, s (scaled); q: uncached
    prefill tokens in flight ahead of the request, o: its own uncached prompt, d: the decode context running
    there, r: requests in flight there that have not had their first token, s: the expected wait for a batch
    slot (``BatchSlotQueue``). o² is the attention of a long prompt over itself; r is the queueing that is
    not prefill work (KV-cache admission): cached prompts wait there too, at almost no uncached tokens."""
    q = np.asarray(queue_tokens, dtype=np.float64) * WORK_SCALE
    o = np.asarray(own_tokens, dtype=np.float64) * WORK_SCALE
    d = np.asarray(decode_tokens, dtype=np.float64) * DECODE_SCALE
    zeros = np.zeros(len(q))
    r = zeros if waiting_requests is None else np.asarray(waiting_requests, dtype=np.float64)
    s = zeros if slot_wait_ms is None else np.asarray(slot_wait_ms, dtype=np.float64) * SLOT_WAIT_SCALE
    return np.column_stack((np.ones(len(q)), q, o, d, (q + o) * d, o * o, r, s))


# Which of the regressors are the pod's fixed costs (the step's floor, the decode context read in every
# step, the requests queued for admission) and which are prompt work (prefill compute): a pod of another GPU
# class differs in the two by other factors (an A100 runs the weight reads 1.6× slower than an H100 and the
# prefill compute 3.2×), so each pod gets two speeds. The slot wait is already the pod's own.
FIXED_TERMS = np.array([0, 3, 6])
WORK_TERMS = np.array([1, 2, 4, 5])
SLOT_TERM = 7
WAITING_TERM = 6


def split_expectation(theta: np.ndarray, terms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pooled expectation θ·x of one row of terms (or of each row) in its three parts: fixed costs,
    prompt work, and the slot wait (the parts the pod's two speeds scale, and the part they do not)."""
    fixed = terms[..., FIXED_TERMS] @ theta[FIXED_TERMS]
    work = terms[..., WORK_TERMS] @ theta[WORK_TERMS]
    return fixed, work, theta[SLOT_TERM] * terms[..., SLOT_TERM]
