"""The gateway's HTTP front against hostile header values, over raw sockets to a real gateway and simulated
pods on 127.0.0.1: CR, LF and NUL never get past the parser, and bytes outside ASCII are reflected nowhere
unescaped (error bodies are ASCII JSON, response heads carry none of the client's bytes)."""

from __future__ import annotations

import asyncio
import json

import pytest

from slorouter.gateway.runtime import Router

WAIT = 10.0  # a bound on every read, never a speed expectation

BODY = b'{"model": "sim-llama3-8b", "prompt": "hi", "max_tokens": 2}'


async def _exchange(router: Router, data: bytes) -> bytes:
    """Send ``data`` and read until the gateway closes the connection."""
    host, port = router.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), WAIT)
    finally:
        writer.close()


def _completion(*headers: bytes) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + b"".join(h + b"\r\n" for h in headers)
        + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    )


def _ascii_only(text: bytes) -> None:
    assert all(byte < 0x80 for byte in text), text


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(b"X-Request-Id: a\rX-Injected: 1", id="bare-cr"),
        pytest.param(b"X-Request-Id: a\nX-Injected: 1", id="bare-lf"),
        pytest.param(b"X-Request-Id: a\r\n X-Injected: 1", id="folded"),
        pytest.param(b"X-Request-Id: a\x00X-Injected: 1", id="nul"),
        pytest.param(b"x-slo-ttft-ms: 5\x7f00", id="del"),
    ],
)
async def test_control_characters_in_header_values_get_400_and_are_not_reflected(router, header):
    text = await _exchange(router, _completion(header))
    head, _, body = text.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"Connection: close" in head
    assert b"X-Injected" not in text and b"x-slorouter-endpoint" not in head.lower()
    _ascii_only(text)
    assert json.loads(body)["error"]["type"] == "BadRequestError"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("<script>é</script>".encode(), id="utf-8"),
        pytest.param(b"\xe9\xff\x80", id="latin-1"),
        pytest.param("\u202eevil".encode(), id="bidi-override"),
    ],
)
async def test_non_ascii_bytes_in_a_bad_routing_header_come_back_escaped(router, value):
    text = await _exchange(router, _completion(b"x-slo-ttft-ms: " + value))
    head, _, body = text.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"Content-Type: application/json" in head
    _ascii_only(text)  # JSON escapes them (\u00e9 ...); nothing of the value is in the head
    error = json.loads(body)["error"]
    assert error["param"] == "x-slo-ttft-ms" and repr(value.decode("latin-1")) in error["message"]


async def test_non_ascii_bytes_in_forwarded_headers_are_not_reflected_to_the_client(router):
    text = await _exchange(router, _completion(b"X-Request-Id: r\xe9\xff", b"X-Custom: \xc3\xa9"))
    head, _, _ = text.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"x-slorouter-endpoint" in head.lower()
    _ascii_only(head)


async def test_a_path_with_encoded_crlf_is_not_decoded_into_the_answer(router):
    text = await _exchange(
        router, b"GET /v1/nothing%0d%0aX-Injected:%201 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    head, _, body = text.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404") and b"X-Injected" not in head
    assert "%0d%0a" in json.loads(body)["error"]["message"]
