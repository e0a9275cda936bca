"""HTTP transports of ``PredictionClient``: the gateway's lean HTTP/1.1 client, or aiohttp."""

from __future__ import annotations

import asyncio
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from slorouter.http.upstream import UpstreamClient, UpstreamError, UpstreamTimeoutError
from slorouter.predictor.wire import JSON_TYPE

_JSON_HEADERS = {"Content-Type": JSON_TYPE}


class TransportError(Exception):
    """The request could not be made or its response not read (connection refused, reset, closed)."""


class Transport(Protocol):
    async def request(
        self, method: str, url: str, body: bytes, timeout_s: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """Status and body; ``TransportError`` or ``TimeoutError`` otherwise."""
        ...

    async def close(self) -> None: ...


class LeanTransport:
    """The gateway's lean HTTP/1.1 client (keep-alive pools, httptools): a fraction of aiohttp's CPU and
    latency per request, which matters on the router's event loop."""

    def __init__(self) -> None:
        self._client = UpstreamClient(connect_timeout=1.0, total_timeout=60.0)
        self._raw_headers: dict[tuple[tuple[str, str], ...], bytes] = {}

    def _raw(self, headers: dict[str, str] | None) -> bytes:
        key = tuple((headers or _JSON_HEADERS).items())
        raw = self._raw_headers.get(key)
        if raw is None:
            raw = self._raw_headers[key] = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in key)
        return raw

    async def request(
        self, method: str, url: str, body: bytes, timeout_s: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        parts = urlsplit(url)
        path = parts.path or "/"
        raw_headers = self._raw(headers)
        response = None
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._client.request(parts.netloc, method, path, raw_headers, body)
                payload = await response.read()
        except UpstreamTimeoutError:
            raise TimeoutError from None
        except UpstreamError as exc:
            raise TransportError(str(exc)) from None
        finally:
            if response is not None:
                response.release()  # closes the connection unless the response was complete
        return response.status, payload

    async def close(self) -> None:
        await self._client.close()


class AiohttpTransport:
    """aiohttp, for https URLs or a caller's own session."""

    def __init__(self, session: aiohttp.ClientSession | None) -> None:
        self._session = session or aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self._own = session is None

    async def request(
        self, method: str, url: str, body: bytes, timeout_s: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        try:
            async with self._session.request(
                method,
                url,
                data=body if method == "POST" else None,
                headers=headers or (_JSON_HEADERS if method == "POST" else None),
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                return response.status, await response.read()
        except TimeoutError:
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        if self._own:
            await self._session.close()
