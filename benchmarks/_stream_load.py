"""An open-loop load of streamed chat completions at a fixed rate, run as its own process so its CPU is not
counted against the process measured.

    python benchmarks/_stream_load.py SPEC.json OUT.json

or, from another benchmark, ``stream_load(url, rate=..., ...)``, which runs it so.

SPEC: {"url", "rate", "seconds", "prompt_tokens", "max_tokens", "model", "timeout_s"}. OUT: the number of
requests sent, answered 200 with a whole stream (``[DONE]`` seen), failed, and per-request client-side TTFT
(first token chunk), E2E and completion tokens (from ``usage``).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

TOKEN_MARK = b'"delta":{"content":"'
EMPTY_TOKEN = b'"delta":{"content":""'
COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
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
    ttft = None
    try:
        async with session.post(
            spec["url"], data=body, headers={"Content-Type": "application/json"}
        ) as response:
            if response.status != 200:
                out["failed"] += 1
                out["errors"].append(f"{response.status}: {(await response.text())[:120]}")
                return
            tail = b""
            async for chunk in response.content.iter_any():
                if ttft is None:
                    start = chunk.find(TOKEN_MARK)
                    if start >= 0 and chunk.find(EMPTY_TOKEN, start, start + len(EMPTY_TOKEN)) < 0:
                        ttft = time.perf_counter() - sent
                tail = (tail + chunk)[-4096:]
        if not tail.rstrip().endswith(b"data: [DONE]"):
            out["failed"] += 1
            out["errors"].append("stream ended without [DONE]")
            return
        match = COMPLETION_TOKENS.search(tail)
        out["ok"] += 1
        out["ttft_ms"].append((ttft or 0.0) * 1e3)
        out["e2e_ms"].append((time.perf_counter() - sent) * 1e3)
        out["tokens"].append(int(match.group(1)) if match else 0)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        out["failed"] += 1
        out["errors"].append(f"{type(exc).__name__}: {exc}"[:160])


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"sent": 0, "ok": 0, "failed": 0, "errors": [], "ttft_ms": [], "e2e_ms": [],
                           "tokens": []}  # fmt: skip
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=spec["timeout_s"])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        start = loop.time()
        count = int(spec["rate"] * spec["seconds"])
        for index in range(count):
            due = start + index / spec["rate"]
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(session, spec, index, out))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            out["sent"] += 1
        if tasks:
            await asyncio.wait(set(tasks), timeout=spec["timeout_s"] + 5)
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
