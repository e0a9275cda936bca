"""The load generator of the benchmarks that stream chat completions: one client for a streamed request, one
open-loop sender, the warm-up that waits for the gateway's predictor, and the CPU and prediction figures
taken around the measured phase.

A benchmark's load generator runs in its own process (its CPU is not counted against the processes
measured): the script starts itself as ``SCRIPT _loadgen SPEC OUT`` (``loadgen_argv``) and its ``main``
hands over to ``run_as_loadgen`` first.

TTFT is taken at the first SSE chunk that carries a token (a delta with content: the chat stream opens
with an empty role chunk), E2E once the stream has ended; both from ``sent``, the caller's start time
(``OpenLoop``'s: taken just before it starts the request's task). The token counts are the usage chunk's
(``stream_options.include_usage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from _harness import cpu_seconds, machine_busy_seconds

TOKEN_MARK = b'"delta":{"content":"'
EMPTY_TOKEN = b'"delta":{"content":""'
ERROR_EVENT = b'data: {"error"'
DONE = b"data: [DONE]"
LOADGEN = "_loadgen"  # the first argument of a script started as its own load generator


# --- one streamed request ---------------------------------------------------------------------------------


@dataclass
class StreamResult:
    """What one streamed request got: filled in as it goes, so that a request cut short keeps what it had.
    A benchmark records the fields it reports (``record_row``)."""

    status: int = 0
    ttft_ms: float = math.nan
    e2e_ms: float = math.nan
    completion_tokens: int = 0  # from the usage chunk
    prompt_tokens: int = 0
    cached_tokens: int = -1  # usage.prompt_tokens_details.cached_tokens
    timings: dict[str, float] = field(default_factory=dict)  # llama-server's cache_n and prompt_n
    route: str = ""  # x-slorouter-route
    endpoint: str = ""  # x-slorouter-endpoint: the pod that served it
    predicted_ttft_ms: float = math.nan  # the gateway's prediction for the chosen pod
    predicted_tpot_ms: float = math.nan
    queued_ms: float = math.nan  # time held by flow control (x-slorouter-queued-ms), when it is on
    dropped_reason: str = ""  # x-slorouter-dropped-reason of a refused request
    error: str = ""
    end: float = math.nan  # the clock's time when the exchange ended, whatever its outcome


def header_number(value: str | None) -> float:
    """A numeric response header; NaN when it is missing or not a number."""
    try:
        return float(value) if value is not None else math.nan
    except ValueError:
        return math.nan


def last_usage(tail: bytes) -> dict[str, Any]:
    """The stream's event that carries ``usage`` (the last one before ``[DONE]``)."""
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            with contextlib.suppress(ValueError):
                event: dict[str, Any] = json.loads(line[6:])
                return event
    return {}


async def stream_completion(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes | str,
    headers: Mapping[str, str],
    sent: float,
    result: StreamResult | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    tail_bytes: int = 4096,
    error_chars: int = 200,
    error_events: bool = False,
) -> StreamResult:
    """POST one streamed request and read its answer into ``result`` (a new one when None).

    ``sent`` is on ``clock``. The last ``tail_bytes`` of the stream are kept for its end (the usage chunk,
    ``[DONE]``); a refusal's body is kept to ``error_chars``. With ``error_events`` an SSE event
    ``{"error": ...}`` within the stream makes it an error.
    """
    result = StreamResult() if result is None else result
    try:
        async with session.post(url, data=body, headers=headers) as response:
            result.status = response.status
            result.route = response.headers.get("x-slorouter-route", "")
            result.endpoint = response.headers.get("x-slorouter-endpoint", "")
            result.predicted_ttft_ms = header_number(response.headers.get("x-slorouter-predicted-ttft-ms"))
            result.predicted_tpot_ms = header_number(response.headers.get("x-slorouter-predicted-tpot-ms"))
            result.queued_ms = header_number(response.headers.get("x-slorouter-queued-ms"))
            result.dropped_reason = response.headers.get("x-slorouter-dropped-reason", "")
            if response.status != 200:
                result.error = (await response.text())[:error_chars]
                return result
            tail = b""
            async for chunk in response.content.iter_any():
                if math.isnan(result.ttft_ms):
                    # A token chunk: the delta has content (the chat stream opens with an empty role chunk).
                    start = chunk.find(TOKEN_MARK)
                    if start >= 0 and chunk.find(EMPTY_TOKEN, start, start + len(EMPTY_TOKEN)) < 0:
                        result.ttft_ms = (clock() - sent) * 1e3
                if error_events and ERROR_EVENT in tail[-len(ERROR_EVENT) :] + chunk and not result.error:
                    seen = (tail[-len(ERROR_EVENT) :] + chunk).decode(errors="replace")
                    result.error = "error event: " + seen[seen.find('{"error"') :][:200]
                tail = (tail + chunk)[-tail_bytes:]
            result.e2e_ms = (clock() - sent) * 1e3
            event = last_usage(tail)
            usage = event.get("usage") or {}
            result.completion_tokens = int(usage.get("completion_tokens", 0))
            result.prompt_tokens = int(usage.get("prompt_tokens", 0))
            result.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", -1))
            timings = event.get("timings") or {}
            result.timings = {k: v for k, v in timings.items() if k in ("cache_n", "prompt_n")}
            if not result.error and not tail.rstrip().endswith(DONE):
                result.error = "stream ended without [DONE]"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.end = clock()
    return result


def record_row(record: Any, answer_fields: Sequence[str]) -> dict[str, Any]:
    """A benchmark's record (a dataclass with a ``StreamResult`` field ``answer``) as a JSON row: its own
    fields in order, the answer's ``answer_fields`` in the answer's place."""
    row: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, StreamResult):
            row.update((name, getattr(value, name)) for name in answer_fields)
        else:
            row[f.name] = value
    return row


# --- summaries of the JSON rows ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values``; NaN for none."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def row_tpot_ms(row: Mapping[str, Any]) -> float:
    """(E2E − TTFT) / (completion tokens − 1) of an answered row with more than one token."""
    return float((row["e2e_ms"] - row["ttft_ms"]) / (row["completion_tokens"] - 1))


def measured_rows(output: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The measured phase's rows, and those answered whole (200, no error, more than one token)."""
    rows = [r for r in output["results"] if r["phase"] == "measured"]
    ok = [r for r in rows if r["status"] == 200 and not r["error"] and r["completion_tokens"] > 1]
    return rows, ok


def latency_figures(rows: Sequence[Mapping[str, Any]], ok: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Requests, errors, and TTFT, TPOT and E2E percentiles (ms) of the answered ones."""
    ttft = [r["ttft_ms"] for r in ok]
    tpot = [row_tpot_ms(r) for r in ok]
    return {
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p90": percentile(tpot, 90),
        "e2e_p50": percentile([r["e2e_ms"] for r in ok], 50),
    }


def count_by(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, int]:
    """How many rows have each value of ``key`` ("-" for an empty one), in first-seen order."""
    counts: dict[str, int] = {}
    for r in rows:
        value = r[key] or "-"
        counts[value] = counts.get(value, 0) + 1
    return counts


# --- sending ----------------------------------------------------------------------------------------------


def poisson_offsets(rng: np.random.Generator, rate: float, duration_s: float) -> Iterator[float]:
    """Poisson arrivals at ``rate`` in [0, ``duration_s``): seconds after the start, drawn from ``rng`` one
    at a time (a caller may draw a request's other values between two arrivals)."""
    offset = 0.0
    while True:
        offset += float(rng.exponential(1.0 / rate))
        if offset >= duration_s:
            return
        yield offset


class OpenLoop:
    """Starts each request at its due time on the event loop's clock, whatever the earlier ones are doing,
    and waits for them all at the end."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.loop = asyncio.get_running_loop()
        self.clock = clock
        self.tasks: set[asyncio.Task[Any]] = set()

    async def send(self, due: float, start: Callable[[float, float], Coroutine[Any, Any, Any]]) -> None:
        """Waits until ``due``, then runs ``start(sent, lag_ms)`` as its own task: ``sent`` the clock's time,
        ``lag_ms`` how late it left against ``due``."""
        now = self.loop.time()
        if due > now:
            await asyncio.sleep(due - now)
        sent = self.clock()
        task = asyncio.create_task(start(sent, (self.loop.time() - due) * 1e3))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self, timeout: float) -> None:
        """Waits up to ``timeout`` seconds for the requests still open."""
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout)


async def warm_up(
    requests: Sequence[Any],
    send: Callable[[int, Any, float], Awaitable[None]],
    start: float,
    warmup_s: float,
    max_extra_s: float,
    ready: Callable[[], Awaitable[bool]] | None,
) -> float:
    """Sends ``requests`` (each with its ``offset_s`` after ``start``, on the loop's clock) due in the first
    ``warmup_s`` seconds, then, while ``ready`` (None: no wait) says no, one more second of them at a time
    for at most ``max_extra_s`` seconds; ``send(index, request, due)``. Returns the warm-up's end."""
    warm_end = start + warmup_s
    for index, request in enumerate(requests):
        due = start + request.offset_s
        if due >= warm_end:
            if ready is None or await ready():
                break
            if due >= start + warmup_s + max_extra_s:
                break
            warm_end = min(warm_end + 1.0, start + warmup_s + max_extra_s)
        await send(index, request, due)
    return warm_end


# --- the gateway's predictor ------------------------------------------------------------------------------


RATIO_METRIC = "slorouter_prediction_actual_over_predicted"


async def predictor_ready(session: aiohttp.ClientSession, base: str) -> bool:
    """Both models (TTFT and TPOT) are served by the gateway's embedded predictor."""
    try:
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
    except Exception:
        return False
    return all(f'slorouter_predictor_model_info{{model="{kind}"' in text for kind in ("ttft", "tpot"))


async def prediction_ratio_counts(
    session: aiohttp.ClientSession, base: str
) -> dict[str, tuple[float, float]]:
    """Per model: (observations at or below 1, all observations) of the gateway's actual/predicted
    histogram, i.e. its own clock from dispatch to the first token (or between tokens)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
    except Exception:
        return {}
    counts: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != RATIO_METRIC:
            continue
        for sample in family.samples:
            pair = counts.setdefault(sample.labels.get("model", ""), [0.0, 0.0])
            if sample.name.endswith("_bucket") and float(sample.labels["le"]) == 1.0:
                pair[0] = sample.value
            elif sample.name.endswith("_count"):
                pair[1] = sample.value
    return {model: (covered, total) for model, (covered, total) in counts.items()}


async def tuning_counters(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The gateway's tuning series (``slorouter_tuning_*``), summed over their labels but the round outcome
    and the switch's maker: {"cpu_seconds": ..., "rounds/OUTCOME": ..., "switches/BY": ...}."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
    except Exception:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "slorouter_tuning_cpu_seconds_total":
                out["cpu_seconds"] = sample.value
            elif sample.name == "slorouter_tuning_rounds_total":
                out[f"rounds/{sample.labels['outcome']}"] = sample.value
            elif sample.name == "slorouter_tuning_switches_total":
                key = f"switches/{sample.labels['by']}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


async def slo_action_counters(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The gateway's deadline and hedge series, summed over objectives: {"hedges/OUTCOME": ...,
    "skipped/REASON": ..., "cancelled/SLO": ..., "loser_prefill_tokens": ...}; empty without them."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
    except Exception:
        return {}
    keys = {
        "slorouter_hedges_total": "hedges/{outcome}",
        "slorouter_hedges_skipped_total": "skipped/{reason}",
        "slorouter_deadline_cancellations_total": "cancelled/{slo}",
        "slorouter_hedge_loser_prefill_tokens_total": "loser_prefill_tokens",
    }
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = keys.get(sample.name)
            if key is not None:
                name = key.format(**sample.labels)
                out[name] = out.get(name, 0.0) + sample.value
    return out


def router_coverage(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, float]:
    """Per model, the share of the observations between two ``prediction_ratio_counts`` at or below 1."""
    return {
        model: (covered - before.get(model, (0.0, 0.0))[0])
        / max(total - before.get(model, (0.0, 0.0))[1], 1.0)
        for model, (covered, total) in after.items()
    }


# --- CPU --------------------------------------------------------------------------------------------------


class CpuMeter:
    """CPU time from now on: of the processes in ``pids``, of this process (``loadgen``) and of the whole
    machine (every process, ours included: ``machine``, and its cores: ``machine_cores``)."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.own = time.process_time()
        self.machine = machine_busy_seconds()

    def cores(self, wall: float) -> dict[str, float]:
        """Each one's CPU since the start, in cores over ``wall`` seconds."""
        cpu = {name: (cpu_seconds(pid) - self.before[name]) / wall for name, pid in self.pids.items()}
        cpu["loadgen"] = (time.process_time() - self.own) / wall
        busy, total = machine_busy_seconds()
        cpu["machine"] = (busy - self.machine[0]) / wall
        cpu["machine_cores"] = (total - self.machine[1]) / wall
        return cpu


# --- its own process --------------------------------------------------------------------------------------


def loadgen_argv(script: str, spec_path: Path, out_path: Path) -> list[str]:
    """The command that runs ``script`` as its own load generator on the spec in ``spec_path``."""
    return [sys.executable, script, LOADGEN, str(spec_path), str(out_path)]


def run_as_loadgen(run_load: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> bool:
    """When this process was started by ``loadgen_argv``: runs ``run_load`` on the spec (uvloop) and writes
    its output; True then, False (nothing done) otherwise."""
    if len(sys.argv) != 4 or sys.argv[1] != LOADGEN:
        return False
    import uvloop

    spec = json.loads(Path(sys.argv[2]).read_text())
    output = uvloop.run(run_load(spec))
    Path(sys.argv[3]).write_text(json.dumps(output))
    return True
