"""Model-server faults against the real gateway and real simulated pods (separate processes on 127.0.0.1).

For each fault: what the client sees, what the router does next, and that nothing leaks (the router's
in-flight gauges back to exactly zero, its open file descriptors back to the baseline, the pods' engines
holding no sequence). The faults are the simulator's own (``POST /admin/faults``, docs/simulator.md) or the
real thing (a pod process killed). docs/reliability.md, "Model-server faults", is the table of these tests.
"""

from __future__ import annotations

import http.client as httpclient
import json
import socket
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import MODEL, GatewayProcess, SimProcess, http, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]


def stream(gateway: GatewayProcess, max_tokens: int = 8, timeout: float = 15.0, stop_after: int | None = None,
           on_event=None) -> tuple[int, list[bytes], dict[str, str]]:  # fmt: skip
    """A streamed completion through the gateway: status, the ``data:`` payloads as they came, headers.
    ``on_event(n)`` runs after the n-th event; ``stop_after`` closes the connection after that many."""
    conn = httpclient.HTTPConnection(gateway.address, timeout=timeout)
    body = {"model": MODEL, "prompt": "Hello, world", "max_tokens": max_tokens, "stream": True}
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        events: list[bytes] = []
        if response.status != 200 or "event-stream" not in headers.get("content-type", ""):
            return response.status, [response.read()], headers
        while True:
            line = response.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                if on_event is not None:
                    on_event(len(events))
                if stop_after is not None and len(events) >= stop_after:
                    break
        return response.status, events, headers
    finally:
        conn.close()


def openai_error(payload: bytes) -> dict:
    error = json.loads(payload)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def assert_error_then_done(events: list[bytes], code: int) -> dict:
    """A stream the router ended: ... an OpenAI-style error event, then ``[DONE]``."""
    assert events[-1] == b"[DONE]", events[-3:]
    error = openai_error(events[-2])
    assert error["code"] == code
    return error


def engines_idle(sims: list[SimProcess]) -> bool:
    return all(sim.engine_load() == 0 for sim in sims if sim.alive)


# --- killed mid-stream, refused connections ----------------------------------------------------------


def test_pod_killed_mid_stream_ends_the_stream_with_an_error_then_recovers(sims, gateway, clean):
    """SIGKILL of the pod serving a stream: the client's stream ends with an error event and [DONE] (no
    hang); the endpoint is marked unhealthy, the others go on serving, and it is healthy once restarted."""
    killed: list[SimProcess] = []
    served_by: dict[str, str] = {}

    def kill_the_server(n: int) -> None:
        if n == 3:
            victim = next(s for s in sims if s.address == served_by["endpoint"])
            victim.kill()
            killed.append(victim)

    # The endpoint is known from the response headers before the first event is read.
    conn = httpclient.HTTPConnection(gateway.address, timeout=15)
    body = {"model": MODEL, "prompt": "Hello, world", "max_tokens": 400, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    served_by["endpoint"] = response.getheader("x-slorouter-endpoint")
    events = []
    while line := response.readline():
        if line.startswith(b"data: "):
            events.append(line[6:].strip())
            kill_the_server(len(events))
    conn.close()
    assert killed, "the stream ended before the kill"
    error = assert_error_then_done(events, 502)
    assert error["type"] == "BadGatewayError" and "failed mid-stream" in error["message"]
    victim = killed[0]
    wait_until(lambda: not gateway.healthy(victim.address), 10, "the killed endpoint marked unhealthy")
    for _ in range(6):
        status, headers, _ = gateway.complete()
        assert status == 200 and headers["x-slorouter-endpoint"] != victim.address
    assert gateway.total("slorouter_upstream_failures_total", endpoint=victim.address, phase="stream") >= 1
    gateway.assert_no_leaks(clean)
    victim.start()
    wait_until(lambda: gateway.healthy(victim.address), 10, "the restarted endpoint healthy again")


def test_kill_mid_stream_fault_resets_after_the_tokens_sent(sims, gateway, clean):
    """The sim's kill-mid-stream fault (RST after 2 tokens) on every pod: the client gets the 2 tokens, an
    error event and [DONE], repeatedly, with nothing left in flight and no descriptor growth."""
    for sim in sims:
        sim.inject(fault="kill-mid-stream", after_tokens=2)
    for _ in range(10):
        status, events, _ = stream(gateway, max_tokens=8)
        assert status == 200
        assert len(events) == 4  # 2 tokens, the error, [DONE]
        assert_error_then_done(events, 502)
    gateway.assert_no_leaks(clean)
    wait_until(lambda: engines_idle(sims), 10, "the pods hold no sequence")


@pytest.fixture
def slow_scrape_gateway(sims, tmp_path: Path):
    """A gateway that scrapes rarely, so an endpoint that goes down stays a candidate: its requests meet
    the refused connection (or the hang) themselves."""
    process = GatewayProcess(tmp_path, [s.address for s in sims], pool={"scrape_interval_ms": 600_000})
    for sim in sims:
        if not sim.alive:
            sim.start()
        sim.clear()
    process.start()
    try:
        for _ in range(3):
            assert process.complete(max_tokens=2)[0] == 200
        yield process
    finally:
        process.stop()


def test_refused_connection_is_retried_once_on_another_endpoint(sims, slow_scrape_gateway):
    """A pod that refuses connections (its listener closed, its connections dropped) while still a
    candidate: every request is answered 200 by another endpoint, each at most once retried."""
    gateway = slow_scrape_gateway
    baseline = gateway.fds()
    down = sims[0]
    down.inject(fault="refuse", duration_s=600)
    retries_before = gateway.total("slorouter_upstream_retries_total")
    refused = 0
    for _ in range(12):
        started = time.monotonic()
        status, headers, _ = gateway.complete()
        assert status == 200
        assert headers["x-slorouter-endpoint"] != down.address
        assert time.monotonic() - started < 10  # a bound (connect timeout 1 s), not a speed claim
    refused = gateway.total("slorouter_upstream_failures_total", endpoint=down.address, phase="connect")
    assert refused >= 1, "no request was scheduled on the refusing endpoint"
    assert gateway.total("slorouter_upstream_retries_total") - retries_before == refused
    gateway.assert_no_leaks(baseline)
    down.kill()  # its listener stays closed for 600 s: start it afresh for the next tests


def test_refused_everywhere_gives_502_after_one_retry(sims, slow_scrape_gateway):
    gateway = slow_scrape_gateway
    baseline = gateway.fds()
    for sim in sims:
        sim.kill()
    retries_before = gateway.total("slorouter_upstream_retries_total")
    for _ in range(5):
        status, _, body = gateway.complete()
        assert status == 502
        assert openai_error(body)["type"] == "BadGatewayError"
    assert gateway.total("slorouter_upstream_retries_total") - retries_before == 5  # once per request
    gateway.assert_no_leaks(baseline)


def test_connect_timeout_is_retried_on_another_endpoint(sims, tmp_path):
    """An endpoint whose listen backlog is full never completes a handshake: after connect_timeout_s the
    request goes to another endpoint."""
    for sim in sims:
        if not sim.alive:
            sim.start()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    blackhole = f"127.0.0.1:{listener.getsockname()[1]}"
    fillers = []
    for _ in range(8):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", listener.getsockname()[1]))
        fillers.append(filler)
    gateway = GatewayProcess(
        tmp_path,
        [blackhole, sims[0].address],
        gateway={"connect_timeout_s": 0.3},
        pool={"scrape_interval_ms": 600_000, "scrape_timeout_ms": 200},
    )
    try:
        gateway.start()
        baseline = gateway.fds()
        for _ in range(8):
            status, headers, _ = gateway.complete()
            assert status == 200 and headers["x-slorouter-endpoint"] == sims[0].address
        assert gateway.total("slorouter_upstream_failures_total", endpoint=blackhole, phase="connect") >= 1
        gateway.assert_no_leaks(baseline)
    finally:
        gateway.stop()
        for filler in fillers:
            filler.close()
        listener.close()


# --- accept then hang: first-byte and idle timeouts --------------------------------------------------


def test_hang_before_the_first_byte_gets_504_without_retry(sims, gateway, clean):
    for sim in sims:
        sim.inject(fault="hang")
    retries_before = gateway.total("slorouter_upstream_retries_total")
    for streamed in (False, True, False):
        status, _, body = gateway.complete(stream=streamed)
        assert status == 504
        error = openai_error(body)
        assert error["type"] == "GatewayTimeoutError" and "no response byte within 2 s" in error["message"]
    assert gateway.total("slorouter_upstream_retries_total") == retries_before  # a timeout is not retried
    assert gateway.total("slorouter_upstream_failures_total", phase="timeout") >= 3
    gateway.assert_no_leaks(clean)
    assert sum(sim.hits("hang") for sim in sims) == 3


def test_stream_that_stalls_gets_an_error_event_after_the_idle_timeout(sims, gateway, clean):
    for sim in sims:
        sim.inject(fault="hang", after_tokens=2)
    for _ in range(3):
        status, events, _ = stream(gateway, max_tokens=50)
        assert status == 200 and len(events) == 4
        error = assert_error_then_done(events, 504)
        assert "stalled" in error["message"] and error["type"] == "GatewayTimeoutError"
    gateway.assert_no_leaks(clean)
    wait_until(lambda: engines_idle(sims), 10, "the pods let the abandoned sequences go")


# --- bad answers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 503])
def test_5xx_is_passed_through_and_the_endpoint_stays_healthy(sims, gateway, clean, status):
    for sim in sims:
        sim.inject(fault="status", status=status)
    for streamed in (False, True):
        got, _, body = gateway.complete(stream=streamed)
        assert got == status
        assert openai_error(body)["message"] == f"injected fault: status {status}"
    assert all(gateway.healthy(sim.address) for sim in sims)
    gateway.assert_no_leaks(clean)


@pytest.mark.parametrize(
    ("fault", "streamed"),
    [
        ("non-json", False),
        ("non-json", True),
        ("truncated-json", False),
        ("truncated-json", True),
        ("invalid-sse", True),
    ],
)
def test_bad_answer_on_one_pod_is_retried_elsewhere(sims, gateway, clean, fault, streamed):
    bad = sims[1]
    bad.inject(fault=fault)
    for _ in range(30):
        if streamed:
            status, events, headers = stream(gateway)
            assert events[-1] == b"[DONE]" and not any(b'"error"' in e for e in events)
        else:
            status, headers, body = gateway.complete()
            assert json.loads(body)["object"] == "text_completion"
        assert status == 200 and headers["x-slorouter-endpoint"] != bad.address
        if bad.hits(fault) >= 2:
            break
    assert bad.hits(fault) >= 2, "the bad pod was never picked"
    gateway.assert_no_leaks(clean)


@pytest.mark.parametrize(
    ("fault", "streamed", "needle"),
    [
        ("non-json", False, "not a JSON object"),
        ("non-json", True, "not a JSON object"),
        ("truncated-json", False, "closed before the response was complete"),
        ("truncated-json", True, "closed before the response was complete"),
        ("invalid-sse", True, "not SSE"),
        ("large-body", False, "larger than 1048576 bytes"),
    ],
)
def test_bad_answer_everywhere_gets_502(sims, gateway, clean, fault, streamed, needle):
    for sim in sims:
        sim.inject(fault=fault, **({"bytes": 2 << 20} if fault == "large-body" else {}))
    for _ in range(3):
        status, _, body = gateway.complete(stream=streamed)
        assert status == 502
        error = openai_error(body)
        assert error["type"] == "BadGatewayError" and needle in error["message"], error
    gateway.assert_no_leaks(clean)


def test_large_stream_event_is_relayed_without_holding_it(sims, gateway, clean):
    """A stream is not bounded in total (a long generation is legitimate); a 2 MiB event passes through."""
    for sim in sims:
        sim.inject(fault="large-body", bytes=2 << 20)
    status, events, _ = stream(gateway)
    assert status == 200 and events[-1] == b"[DONE]" and len(events[0]) > (2 << 20) - 1024
    gateway.assert_no_leaks(clean)


# --- /metrics faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["metrics-hang", "metrics-garbage"])
def test_bad_metrics_mark_the_endpoint_unhealthy_without_blocking_scheduling(sims, gateway, clean, fault):
    sick = sims[2]
    sick.inject(fault=fault)
    answered = 0
    deadline = time.monotonic() + 15
    while gateway.healthy(sick.address):  # meanwhile every request is answered
        assert time.monotonic() < deadline, "the endpoint was never marked unhealthy"
        status, _, _ = gateway.complete(max_tokens=2, timeout=5)
        assert status == 200
        answered += 1
    for _ in range(6):
        status, headers, _ = gateway.complete(max_tokens=2, timeout=5)
        assert status == 200 and headers["x-slorouter-endpoint"] != sick.address
    sick.clear()
    wait_until(lambda: gateway.healthy(sick.address), 10, "healthy again once /metrics recovers")
    gateway.assert_no_leaks(clean)


def test_flapping_metrics_take_the_endpoint_out_and_back(sims, gateway, clean):
    flapper = sims[0]
    flapper.inject(fault="metrics-flap", period_s=0.5)
    seen = set()
    deadline = time.monotonic() + 20
    while seen != {True, False} or not gateway.healthy(flapper.address):
        assert time.monotonic() < deadline, f"health seen: {seen}"
        seen.add(gateway.healthy(flapper.address))
        assert gateway.complete(max_tokens=2, timeout=5)[0] == 200
    flapper.clear()
    wait_until(lambda: gateway.healthy(flapper.address), 10, "healthy once the flapping stops")
    gateway.assert_no_leaks(clean)


# --- every endpoint down ------------------------------------------------------------------------------


def test_all_endpoints_down_gives_503_with_retry_after_then_recovers(sims, gateway, clean):
    for sim in sims:
        sim.kill()
    wait_until(lambda: not any(gateway.healthy(s.address) for s in sims), 10, "every endpoint unhealthy")
    for streamed in (False, True):
        status, headers, body = gateway.complete(stream=streamed)
        assert status == 503 and headers["retry-after"] == "1"
        assert openai_error(body)["type"] == "ServiceUnavailableError"
    status, headers, _ = http("GET", f"{gateway.url}/ready")
    assert status == 503 and headers["retry-after"] == "1"
    assert http("GET", f"{gateway.url}/health")[0] == 200  # the router itself is alive
    sims[1].start()
    wait_until(lambda: gateway.complete(max_tokens=2)[0] == 200, 10, "serving again once one pod is back")
    status, headers, _ = gateway.complete()
    assert status == 200 and headers["x-slorouter-endpoint"] == sims[1].address
    gateway.assert_no_leaks(clean)


# --- the client going away ----------------------------------------------------------------------------


def test_client_gone_before_the_upstream_request(sims, gateway, clean):
    """A client that sends half a request and leaves, or a whole one and leaves at once: nothing stays."""
    port = int(gateway.address.rsplit(":", 1)[1])
    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2000}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for whole in (False, True) * 5:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + (body if whole else body[:10]))
    gateway.assert_no_leaks(clean)
    wait_until(lambda: engines_idle(sims), 10, "no sequence left in the pods")


@pytest.mark.parametrize("streamed", [True, False])
def test_client_gone_during_the_upstream_request_aborts_it(sims, gateway, clean, streamed):
    """The client leaves while a long generation runs (mid-stream, or waiting for the JSON answer): the
    router aborts the upstream request, the pod frees the sequence long before it would have finished,
    and the in-flight load is released exactly once (back to 0, never below)."""
    successes = sum(sim.successes() for sim in sims)
    disconnects = gateway.total("slorouter_client_disconnects_total")
    port = int(gateway.address.rsplit(":", 1)[1])
    for _ in range(3):
        if streamed:
            status, events, _ = stream(gateway, max_tokens=4000, stop_after=3)
            assert status == 200 and len(events) == 3
        else:
            body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 4000}).encode()
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                wait_until(lambda: not engines_idle(sims), 10, "the pod generating")
    # 4000 tokens take the pod about 30 s: idle well before means the requests were aborted.
    wait_until(lambda: engines_idle(sims), 10, "the pods freed the sequences")
    assert sum(sim.successes() for sim in sims) == successes
    wait_until(
        lambda: gateway.total("slorouter_client_disconnects_total") - disconnects == 3, 10, "disconnects"
    )
    gateway.assert_no_leaks(clean)


def test_client_gone_after_the_response(sims, gateway, clean):
    for _ in range(10):
        assert stream(gateway, max_tokens=4)[1][-1] == b"[DONE]"
        assert gateway.complete(max_tokens=4)[0] == 200
    gateway.assert_no_leaks(clean)
    assert engines_idle(sims)
