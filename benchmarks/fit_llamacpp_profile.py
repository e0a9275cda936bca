"""Fit a ``slorouter sim`` engine profile to the real llama-server on this machine.

Starts one fresh llama-server (``--parallel 4 --ctx-size 4096 --threads 1``, the benchmark's server; the
real-engine suite's binary and model) and measures, with the server's own ``timings``:

- **prefill**: one request at a time, prompts of 16 to 960 tokens (token ids, ``cache_prompt: false``),
  ``max_tokens`` 1: ``prompt_ms`` against the prompt's length;
- **decode**: B = 1..4 concurrent requests (the slots), 32-token prompts, 128 output tokens each
  (``ignore_eos``): ``predicted_per_token_ms`` is one decode step at batch B; and batch 1 after an
  800-token prompt, for the cost of the context read;
- **overhead**: a streamed request's time to first token at the client minus the server's ``prompt_ms``
  (HTTP, chat template, tokenisation);
- **jitter**: the spread of a stream's gaps between tokens at batch 1 (sigma of their logarithm);
- **prompt cache**: which later requests reuse a cached prompt (``cache_n``): the same slot, another slot
  whose previous prompt differs, another slot that was empty.

It fits the simulator's step-time law (docs/simulator.md; ``slorouter.sim.profiles``) by least squares:
prefill ``c_step + c_lin·n + c_attn·n²/2`` (the prompt's tokens are compute-bound from a few tokens on),
decode ``w + c_step + c_req·B + c_kv·K``; and writes the measurements and the constants as JSON
(``--out``, default benchmarks/llamacpp_fit.json), whose constants are what the profile
``llamacpp-gemma3-270m-cpu`` carries. Run it on an otherwise idle machine: about two minutes.

    .venv/bin/python benchmarks/fit_llamacpp_profile.py [--out FILE] [--reps 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import http.client
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from _harness import ROOT
from _llama import MODEL, ServerSpec, corpus, http_json, llama_server

SPEC = ServerSpec(parallel=4, ctx_size=4096, threads=1)
PREFILL_LENGTHS = (16, 64, 128, 256, 384, 512, 768, 960)
DECODE_TOKENS = 128


class Tokens:
    """Token ids of the corpus, sliced at moving offsets so that no two prompts share a prefix."""

    def __init__(self, url: str) -> None:
        text = " ".join(corpus())
        self.ids: list[int] = http_json("POST", f"{url}/tokenize", {"content": text})["tokens"]
        self.offset = 0
        # Gemma's tokens per simulator token (4 bytes of UTF-8) on this text.
        self.ratio = len(self.ids) / (len(text.encode()) / 4)

    def take(self, n: int) -> list[int]:
        if self.offset + n > len(self.ids):
            self.offset = (self.offset + 997) % 1000  # wrap to another start
        start = self.offset
        self.offset += n
        return self.ids[start : start + n]


def complete(url: str, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **extra}
    reply: dict[str, Any] = http_json("POST", f"{url}/v1/completions", body)
    return reply


def streamed_gaps(url: str, prompt: list[int], max_tokens: int) -> tuple[float, list[float], dict[str, Any]]:
    """(client TTFT ms, gaps between token events ms, the server's timings) of one streamed completion."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "cache_prompt": False}  # fmt: skip
    sent = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    times: list[float] = []
    timings: dict[str, Any] = {}
    while line := response.readline():
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        event = json.loads(line[6:])
        if event.get("choices") and event["choices"][0].get("text"):
            times.append(time.perf_counter())
        timings = event.get("timings", timings)
    conn.close()
    gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(times)]
    return (times[0] - sent) * 1e3, gaps, timings


def measure(url: str, reps: int) -> dict[str, Any]:
    tokens = Tokens(url)
    complete(url, tokens.take(64), 8, cache_prompt=False)  # first-request warm-up, not recorded
    prefill = []
    for _ in range(reps):
        for n in PREFILL_LENGTHS:
            t = complete(url, tokens.take(n), 1, cache_prompt=False)["timings"]
            prefill.append([t["prompt_n"], round(t["prompt_ms"], 3)])
    decode = []
    for _ in range(reps):
        for batch in (1, 2, 3, 4):
            prompts = [tokens.take(32) for _ in range(batch)]
            with concurrent.futures.ThreadPoolExecutor(batch) as pool:
                replies = list(
                    pool.map(lambda p: complete(url, p, DECODE_TOKENS, cache_prompt=False), prompts)
                )
            per_token = statistics.median(r["timings"]["predicted_per_token_ms"] for r in replies)
            context = batch * (32 + DECODE_TOKENS // 2)  # mean context read per step
            decode.append([batch, context, round(per_token, 3)])
        t = complete(url, tokens.take(800), DECODE_TOKENS, cache_prompt=False)["timings"]
        decode.append([1, 800 + DECODE_TOKENS // 2, round(t["predicted_per_token_ms"], 3)])
    overhead, gaps_all = [], []
    for _ in range(max(reps, 3)):
        ttft, gaps, timings = streamed_gaps(url, tokens.take(32), 64)
        overhead.append(round(ttft - timings["prompt_ms"], 3))
        gaps_all += gaps
    return {"prefill": prefill, "decode": decode, "api_overhead_ms": overhead,
            "decode_gap_log_sigma": round(float(np.std(np.log(gaps_all))), 4),
            "engine_tokens_per_sim_token": round(tokens.ratio, 4)}  # fmt: skip


def probe_cache(url: str) -> dict[str, int]:
    """Which requests reuse a cached prompt: ``cache_n`` of chat requests sharing a ~760-token system prompt,
    pinned to slots (``id_slot``). The server is fresh: its slots start empty."""
    system = (
        "The committee reviewed every report on the expedition, its maps and its accounts of the weather. "
        * 40
    )

    def ask(question: str, slot: int) -> int:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        body = {"model": MODEL, "max_tokens": 2, "id_slot": slot, "ignore_eos": True, "messages": messages}
        return int(http_json("POST", f"{url}/v1/chat/completions", body)["timings"]["cache_n"])

    ask("Something else entirely, to give slot 2 a prompt of its own?", 2)
    return {
        "first, slot 0": ask("Question one?", 0),
        "same prefix, slot 0 again": ask("Question two?", 0),
        "same prefix, slot 1 (empty)": ask("Question three?", 1),
        "same prefix, slot 2 (held another prompt)": ask("Question four?", 2),
        "same prefix, slot 3 (empty)": ask("Question five?", 3),
    }


def fit(data: dict[str, Any]) -> dict[str, float]:
    """The step-time law in the engine's tokens, by non-negative least squares on relative errors (ms).

    Prefill of n tokens (one request, first token included): ``c_step + c_lin·n + c_attn·n²/2``; a decode
    step of B requests reading K context tokens: ``c_step + (c_lin + c_req)·B + c_kv·K``. On one CPU thread
    a decode token costs a prompt token's layers plus the output head, so decoding is compute-bound at every
    batch size and the weight-read floor ``w`` is one token's ``c_lin`` (it never binds).
    """
    from scipy.optimize import nnls

    rows, targets = [], []
    for n, ms in data["prefill"]:
        if n >= 64:  # the shortest prompts are below the law's compute-bound range
            rows.append([n, n * n / 2, 1.0, 0.0, 0.0])
            targets.append(ms)
    for batch, context, ms in data["decode"]:
        rows.append([batch, 0.0, 1.0, batch, context])
        targets.append(ms)
    a, y = np.array(rows, dtype=float), np.array(targets, dtype=float)
    c_lin, c_attn, c_step, c_req, c_kv = nnls(a / y[:, None], np.ones(len(y)))[0]
    return {
        "c_lin_ms": round(float(c_lin), 4),
        "c_attn_ms": round(float(c_attn), 8),
        "c_kv_ms": round(float(c_kv), 6),
        "c_req_ms": round(float(c_req), 3),
        "c_step_ms": round(float(c_step), 3),
        "api_pre_ms": round(statistics.median(data["api_overhead_ms"]), 2),
        "jitter_sigma": data["decode_gap_log_sigma"],
    }


def in_sim_tokens(engine: dict[str, float], ratio: float) -> dict[str, float]:
    """The law per simulator token (4 bytes of text, slorouter.tokenizer) instead of Gemma's: ``ratio`` is
    Gemma's tokens per simulator token on the benchmark's English, so a prompt of p simulator tokens is
    p·ratio engine tokens. Prompt-side terms scale (c_lin by ratio, c_attn by ratio², c_kv by ratio);
    output tokens are one token in both counts, so c_req takes back what c_lin lost on a decode token."""
    c_lin = engine["c_lin_ms"] * ratio
    return {
        "w_ms": round(c_lin, 4),  # the floor: one token's work (never binding, see fit)
        "c_lin_ms": round(c_lin, 4),
        "c_attn_ms": round(engine["c_attn_ms"] * ratio * ratio, 8),
        "c_kv_ms": round(engine["c_kv_ms"] * ratio, 6),
        "c_req_ms": round(engine["c_req_ms"] + engine["c_lin_ms"] - c_lin, 3),
        "c_step_ms": engine["c_step_ms"],
        "api_pre_ms": engine["api_pre_ms"],
        "jitter_sigma": engine["jitter_sigma"],
    }


def residuals(data: dict[str, Any], c: dict[str, float]) -> dict[str, float]:
    """Largest relative error of the fitted law (engine tokens) on the measured points."""
    prefill = [abs(c["c_step_ms"] + c["c_lin_ms"] * k + c["c_attn_ms"] * k * k / 2 - ms) / ms
               for k, ms in data["prefill"] if k >= 64]  # fmt: skip
    decode = [abs(c["c_step_ms"] + (c["c_lin_ms"] + c["c_req_ms"]) * b + c["c_kv_ms"] * k - ms) / ms
              for b, k, ms in data["decode"]]  # fmt: skip
    return {"prefill_max": round(max(prefill), 3), "decode_max": round(max(decode), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "llamacpp_fit.json")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with llama_server(SPEC, Path(tmp) / "fit.log") as (_, url):
            data = measure(url, args.reps)
        with llama_server(SPEC, Path(tmp) / "cache.log") as (_, url):
            data["cache_probe"] = probe_cache(url)
    engine = fit(data)
    ratio = data["engine_tokens_per_sim_token"]
    constants = in_sim_tokens(engine, ratio)
    # The slots' context and the prompt cache, in simulator tokens: a slot holds ctx_size / parallel engine
    # tokens; the server keeps its slots' contents and, in RAM, prompts of up to ctx_size tokens more
    # (--cache-ram's token limit), which any slot loads: modelled as a prefix cache of 2·ctx_size.
    constants["max_model_len"] = int(SPEC.ctx_per_slot / ratio)
    constants["num_gpu_blocks"] = int(2 * SPEC.ctx_size / ratio / 16)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result = {
        "measured_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit.stdout.strip(),
        "server": SPEC.describe(),
        "constants": constants,
        "engine_token_law": engine,
        "fit_error": residuals(data, engine),
        "measurements": data,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "measurements"}, indent=1))
    print("cache probe:", json.dumps(data["cache_probe"]))
    print(f"written to {args.out}; command: .venv/bin/python {' '.join(sys.argv)}")
    if not all(math.isfinite(v) for v in constants.values()):
        raise SystemExit("the fit produced a non-finite constant")


if __name__ == "__main__":
    main()
