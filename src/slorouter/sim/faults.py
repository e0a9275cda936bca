"""The faults a simulated pod can inject, so tests, benchmarks and users can play the same failures: the
catalogue ``FAULTS`` of ``slorouter.faults`` kinds, played by ``sim/server.py``.

A fault is the JSON object of ``slorouter.faults.kinds`` (the body of ``POST /admin/faults``, or
``slorouter sim --fault``), e.g. ``{"fault": "hang", "probability": 0.5, "count": 3, "after_tokens": 2}``.
"""

from __future__ import annotations

from slorouter.faults.kinds import FaultKind, FaultParam

# Where a fault strikes: the generation endpoints, the /metrics page, the pod's listening socket, or each
# batch of its KV events (with --kv-events-port).
INFERENCE, METRICS, LISTENER, KV_EVENTS = "inference", "metrics", "listener", "kv-events"


_AFTER_TOKENS = FaultParam(int, 0, 0, 1_000_000, "stream this many tokens first (streams only)")
_MAX_BYTES = 1 << 30
_REPLAYABLE = FaultParam(int, 1, 0, 1, "1: the replay socket has the batch; 0: lost for good")

FAULTS: dict[str, FaultKind] = {
    "kill-mid-stream": FaultKind(
        INFERENCE,
        "abort the TCP connection (RST) after after_tokens streamed tokens; a JSON request instead of its "
        "answer",
        {"after_tokens": FaultParam(int, 1, 0, 1_000_000, "tokens streamed before the abort")},
    ),
    "refuse": FaultKind(
        LISTENER,
        "stop listening and drop every connection for duration_s seconds (connections are refused), "
        "then listen again on the same port",
        {"duration_s": FaultParam(float, None, 0.001, 3600, "how long the pod refuses connections")},
        once=True,
    ),
    "hang": FaultKind(
        INFERENCE,
        "accept the request, then send nothing more until the client goes away: before the response head, "
        "or (streams) after after_tokens tokens when after_tokens > 0",
        {"after_tokens": _AFTER_TOKENS},
    ),
    "status": FaultKind(
        INFERENCE,
        "answer with HTTP status (default 500) and an OpenAI-style JSON error body",
        {"status": FaultParam(int, 500, 400, 599, "the HTTP status")},
    ),
    "non-json": FaultKind(INFERENCE, "answer 200 with a complete body that is not JSON (an HTML page)"),
    "truncated-json": FaultKind(
        INFERENCE,
        "announce the whole JSON answer's Content-Length, send half of it, close the connection "
        "(a stream: cut inside an event, then closed)",
    ),
    "invalid-sse": FaultKind(
        INFERENCE, "answer a stream with 200 text/event-stream whose body is not SSE, then end it"
    ),
    "large-body": FaultKind(
        INFERENCE,
        "answer 200 application/json with a valid JSON body of about bytes bytes (a stream: one event "
        "that large)",
        {"bytes": FaultParam(int, 64 << 20, 1, _MAX_BYTES, "size of the body")},
    ),
    "metrics-hang": FaultKind(METRICS, "GET /metrics never answers (until the client goes away)"),
    "metrics-garbage": FaultKind(METRICS, "GET /metrics answers 200 with a page that is not Prometheus text"),
    "kv-events-drop": FaultKind(
        KV_EVENTS,
        "leave a step's KV-event batch off the PUB socket (its number is used: the subscriber sees a gap); "
        "the replay socket still has it unless replayable=0",
        {"replayable": _REPLAYABLE},
    ),
    "kv-events-delay": FaultKind(
        KV_EVENTS,
        "send a step's KV-event batch delay_s seconds late, stamped with its step's time (batches not "
        "delayed overtake it)",
        {"delay_s": FaultParam(float, None, 0.001, 3600, "how late the batch is sent")},
    ),
    "kv-events-reorder": FaultKind(
        KV_EVENTS, "hold a step's KV-event batch back and send it right after the next one"
    ),
    "metrics-flap": FaultKind(
        METRICS,
        "GET /metrics answers 500 for period_s seconds, then normally for period_s seconds, and so on",
        {"period_s": FaultParam(float, 1.0, 0.001, 3600, "length of each failing and each working phase")},
    ),
}
