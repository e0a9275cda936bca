"""An open-loop load of streamed chat completions at a fixed rate, run as its own process so its CPU is not
counted against the process measured.

    python benchmarks/_stream_load.py SPEC.json OUT.json

or, from another benchmark, ``stream_load(url, rate=..., ...)``, which runs it so.

SPEC: {"url", "rate", "seconds", "prompt_tokens", "max_tokens", "model", "timeout_s"}. OUT: the number of
requests sent, answered 200 with a whole stream (``[DONE]`` seen), failed, and per-request client-side TTFT
(first token chunk), E2E and completion tokens (from ``usage``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Coroutine
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from _loadgen import OpenLoop, stream_completion

JSON_HEADERS = {"Content-Type": "application/json"}
WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards",
    "quietly", "judge", "boxing", "matches",
]  # fmt: skip


def prompt(tokens: int, index: int) -> str:
    """About ``tokens`` tokens (4 bytes each for the simulator), different for every request."""
    text = f"request {index}: " + " ".join(WORDS[(index + i) % len(WORDS)] for i in range(tokens))
    return text[: tokens * 4]


async def one(session: aiohttp.ClientSession, spec: dict[str, Any], index: int, out: dict[str, Any]) -> None:
    body = json.dumps(
        {
            "model": spec["model"],
            "messages": [{"role": "user", "content": prompt(spec["prompt_tokens"], index)}],
            "max_tokens": spec["max_tokens"],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    sent = time.perf_counter()
    result = await stream_completion(session, spec["url"], body, JSON_HEADERS, sent)
    if result.error:
        out["failed"] += 1
        refused = result.status not in (0, 200)
        out["errors"].append(f"{result.status}: {result.error[:120]}" if refused else result.error[:160])
        return
    out["ok"] += 1
    out["ttft_ms"].append(0.0 if math.isnan(result.ttft_ms) else result.ttft_ms)
    out["e2e_ms"].append((time.perf_counter() - sent) * 1e3)  # once the response is released
    out["tokens"].append(result.completion_tokens)


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"sent": 0, "ok": 0, "failed": 0, "errors": [], "ttft_ms": [], "e2e_ms": [],
                           "tokens": []}  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=spec["timeout_s"])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:

        def begin(index: int, _sent: float, _lag_ms: float) -> Coroutine[Any, Any, None]:
            return one(session, spec, index, out)  # one() reads its start time once its body is built

        sender = OpenLoop()
        start = sender.loop.time()
        for index in range(int(spec["rate"] * spec["seconds"])):
            await sender.send(start + index / spec["rate"], partial(begin, index))
            out["sent"] += 1
        await sender.drain(spec["timeout_s"] + 5)
    out["errors"] = out["errors"][:10]
    return out


def stream_load(
    url: str,
    *,
    rate: float,
    seconds: float,
    prompt_tokens: int,
    max_tokens: int,
    directory: Path,
    model: str = "sim-llama3-8b",
) -> dict[str, Any]:
    """Run this load against ``url``'s chat completions in its own process (SPEC and OUT in ``directory``)."""
    spec = {"url": f"{url}/v1/chat/completions", "rate": rate, "seconds": seconds, "model": model,
            "prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "timeout_s": 120}  # fmt: skip
    spec_path, out_path = directory / "load-spec.json", directory / "load-out.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run([sys.executable, __file__, str(spec_path), str(out_path)], check=True)
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(uvloop.run(run(spec))))


if __name__ == "__main__":
    main()
