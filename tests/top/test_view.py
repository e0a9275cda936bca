"""``slorouter top`` without a router: addresses, the counters read from /metrics, one-line errors from
servers that are not routers, and the frame drawn from a sample reading."""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest
from rich.console import Console, RenderableType

from slorouter.pool.kv_trust import TrustReason, TrustState
from slorouter.serving.status import (
    STATUS_SCHEMA,
    AccuracyStatus,
    EndpointStatus,
    KVIndexStatus,
    LedgerStatus,
    PredictorStatus,
    RouterStatus,
    SloStatus,
)
from slorouter.top.source import (
    BadUrlError,
    Counters,
    Reading,
    RouterSource,
    RouterUnavailableError,
    parse_counters,
    router_url,
)
from slorouter.top.view import render, render_error


def text_of(renderable: RenderableType, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(renderable)
    output = console.file.getvalue()
    assert isinstance(output, str)
    return output


def _endpoint(address: str, **fields: object) -> EndpointStatus:
    values: dict[str, object] = {
        "address": address,
        "healthy": True,
        "inflight_requests": 0,
        "waiting": 0,
        "running": 0,
        "kv_usage": 0.0,
        "metrics_age_s": 0.1,
        "picks": 0,
        "predicted_ttft_ms": None,
        "observed_ttft_ms": None,
        **fields,
    }
    return EndpointStatus(**values)  # type: ignore[arg-type]


SAMPLE = RouterStatus(
    schema=STATUS_SCHEMA,
    front_end="gateway",
    uptime_s=3725,
    window=64,
    requests=400,
    routes={"predicted": 300, "heuristic": 60, "explore": 20, "fallback": 20},
    slo=SloStatus(requests=200, met=190),
    predictor=PredictorStatus(mode="embedded", ready=True, versions={"ttft": "v7", "tpot": None}),
    queued=None,
    endpoints=[
        _endpoint(
            "10.0.0.1:8000",
            inflight_requests=7,
            waiting=3,
            running=12,
            kv_usage=0.625,
            picks=300,
            predicted_ttft_ms=210.4,
            observed_ttft_ms=198.6,
        ),
        _endpoint("10.0.0.2:8000", inflight_requests=1, running=2, kv_usage=0.1, picks=100),
        _endpoint("10.0.0.3:8000", healthy=False, metrics_age_s=None),
    ],
)


def _reading(status: RouterStatus = SAMPLE, at: float = 100.0, requests: float = 400.0) -> Reading:
    counters = Counters({"200": requests - 12, "429": 2, "503": 10}, sheds=2)
    return Reading("http://127.0.0.1:8080", status, counters, at)


def test_the_frame_shows_the_router_and_every_endpoint():
    text = text_of(render(_reading()))
    lines = text.splitlines()
    assert lines[0].startswith("slorouter top · gateway http://127.0.0.1:8080 · up 1h02m · ")
    assert lines[1] == "requests 400 · 5xx 10 · 4xx 2 · sheds 2 · queued off"
    assert lines[2] == "SLO attainment 95.0% (190 of 200 met)"
    assert lines[3] == "routes predicted 75.0% · explore 5.0% · heuristic 15.0% · fallback 5.0%"
    assert lines[4] == "predictor embedded, ready · models ttft v7"
    header = next(line for line in lines if "endpoint" in line)
    for column in ("up", "in-flight", "queue", "running", "KV", "TTFT pred", "TTFT obs", "TTFT cov", "picks"):
        assert column in header
    row = next(line for line in lines if "10.0.0.1:8000" in line).split("│")
    cells = [cell.strip() for cell in row[1:-1]]
    assert cells == ["10.0.0.1:8000", "●", "7", "3", "12", "62%", "210 ms", "199 ms", "—", "75.0%"]
    row = next(line for line in lines if "10.0.0.3:8000" in line).split("│")
    assert [cell.strip() for cell in row[1:-1]] == [
        "10.0.0.3:8000",
        "✕",
        "0",
        "0",
        "0",
        "0%",
        "—",
        "—",
        "—",
        "0.0%",
    ]
    assert "mean over each endpoint's last 64 requests" in text


def test_the_ledgers_coverage_per_endpoint_and_its_drifts():
    accuracy = AccuracyStatus(outcomes=80, coverage=0.412, mape=0.5, bias=-0.3)
    ledger = LedgerStatus(
        window_s=60,
        quantile=0.9,
        endpoints={"10.0.0.1:8000": {"ttft": accuracy}},
        objectives={},
        drifting={"10.0.0.1:8000": ["ttft"]},
        drifts=1,
    )
    text = text_of(render(_reading(msgspec.structs.replace(SAMPLE, ledger=ledger))))
    assert text.splitlines()[4] == "predictor embedded, ready · models ttft v7 · drifting on 1 endpoint"
    row = next(line for line in text.splitlines() if "10.0.0.1:8000" in line).split("│")
    assert [cell.strip() for cell in row[1:-1]][8] == "41%"


def test_the_prefix_index_column_shows_each_subscribed_endpoints_trust_and_only_then():
    exact = KVIndexStatus(state=TrustState.EXACT, reason=TrustReason.NONE, for_s=600)
    degraded = KVIndexStatus(state=TrustState.DEGRADED, reason=TrustReason.LAG, for_s=75)
    endpoints = [
        _endpoint("10.0.0.1:8000", kv_index=exact),
        _endpoint("10.0.0.2:8000", kv_index=degraded),
        _endpoint("10.0.0.3:8000"),
    ]
    text = text_of(render(_reading(msgspec.structs.replace(SAMPLE, endpoints=endpoints))), width=160)
    assert "prefix index" in next(line for line in text.splitlines() if "endpoint" in line)
    cells = {
        line.split("│")[1].strip(): line.split("│")[-2].strip()
        for line in text.splitlines()
        if "10.0.0." in line
    }
    assert cells == {"10.0.0.1:8000": "exact", "10.0.0.2:8000": "degraded lag 1m15s", "10.0.0.3:8000": "—"}
    assert "not exact: routed on the approximate estimate" in text
    assert "prefix index" not in text_of(render(_reading()))


def test_rates_come_from_the_reading_before():
    before = _reading(at=100.0, requests=380.0)
    text = text_of(render(_reading(at=102.0, requests=400.0), before))
    assert text.splitlines()[1].startswith("requests 400 (10.0/s) · 5xx 10 (0.0/s) · 4xx 2 (0.0/s)")


def test_a_router_without_predictor_requests_or_slo():
    empty = RouterStatus(
        schema=STATUS_SCHEMA,
        front_end="picker",
        uptime_s=5,
        window=64,
        requests=0,
        routes={},
        slo=SloStatus(requests=0, met=0),
        predictor=PredictorStatus(mode="off", ready=False, versions={}),
        queued=3,
        endpoints=[],
    )
    lines = text_of(render(_reading(empty))).splitlines()
    assert lines[0].startswith("slorouter top · picker http://127.0.0.1:8080 · up 5s")
    assert lines[1].endswith("queued 3")
    assert lines[2] == "SLO attainment — (no request with an SLO)"
    assert lines[3] == "routes — (none yet)"
    assert lines[4] == "predictor off (heuristic routing)"


def test_the_error_frame_is_the_reason_and_the_retry():
    lines = text_of(
        render_error("http://h:1", "cannot reach http://h:1: connection refused", 1.0)
    ).splitlines()
    assert lines[1:] == ["cannot reach http://h:1: connection refused", "retrying every 1 s · Ctrl-C to quit"]


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://gw.example:80/metrics", "http://gw.example:80"),
        ("https://gw.example/", "https://gw.example"),
        ("[::1]:9090", "http://[::1]:9090"),
        ("localhost", "http://localhost"),
    ],
)
def test_router_addresses(given: str, url: str):
    assert router_url(given) == url


@pytest.mark.parametrize("given", ["ftp://h:1", "http://", "h:99999", "h:port", "http://a b:1", ""])
def test_bad_addresses_are_refused(given: str):
    with pytest.raises(BadUrlError, match="bad URL"):
        router_url(given)


def test_the_counters_are_summed_over_endpoints_and_models():
    page = (
        "# TYPE slorouter_requests counter\n"
        'slorouter_requests_total{code="200",endpoint="a"} 5.0\n'
        'slorouter_requests_total{code="200",endpoint="b"} 3.0\n'
        'slorouter_requests_total{code="503",endpoint="none"} 1.0\n'
        "# TYPE slorouter_requests_shed counter\n"
        'slorouter_requests_shed_total{model_name="m",target_model_name="m"} 2.0\n'
        'slorouter_requests_shed_total{model_name="n",target_model_name="n"} 1.0\n'
    )
    counters = parse_counters(page)
    assert counters.requests_by_code == {"200": 8.0, "503": 1.0}
    assert (counters.requests, counters.answered("5"), counters.sheds) == (9.0, 1.0, 3.0)


class _Page(BaseHTTPRequestHandler):
    status = 200
    body = b"<html>not a router</html>"

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def html_server() -> Iterator[str]:
    yield from _serve(_Page)


@pytest.fixture
def missing_server() -> Iterator[str]:
    yield from _serve(type("Missing", (_Page,), {"status": 404, "body": b"no"}))


def _one_line_error(address: str) -> str:
    with pytest.raises(RouterUnavailableError) as caught:
        RouterSource(address, timeout_s=2).read()
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_pages_that_are_not_a_routers_say_so_in_one_line(html_server: str, missing_server: str):
    assert _one_line_error(html_server).startswith(
        f"http://{html_server} is not a slorouter gateway or picker metrics port: /v1/router/status: "
        "not a slorouter status page"
    )
    assert _one_line_error(missing_server) == (
        f"GET http://{missing_server}/v1/router/status: HTTP 404 Not Found "
        "(not a slorouter gateway, or not the picker's metrics port)"
    )


def test_an_unreachable_router_says_so_in_one_line():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, not listening: refused
        assert _one_line_error(closed) == (
            f"cannot reach http://{closed}: connection refused (is it running? is this its port?)"
        )
    assert _one_line_error("no-such-host.invalid:80").startswith(
        "cannot reach http://no-such-host.invalid:80: unknown host"
    )
