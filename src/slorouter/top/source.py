"""What ``slorouter top`` reads from a running router: its status page (``GET /v1/router/status``) and the
counters of its ``/metrics`` (requests by status code, sheds), with one-line errors for a bad address, an
unreachable router or a page that is not a slorouter router's."""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from slorouter.serving.status import STATUS_PATH, NotAStatusPageError, RouterStatus, decode_status

TIMEOUT_S = 2.0
MAX_BODY_BYTES = 16 * 1024 * 1024


class BadUrlError(ValueError):
    """The address cannot be a router's: a retry would not help."""


class RouterUnavailableError(Exception):
    """No frame this time (unreachable, an error status, not a slorouter page); the message is one line."""


def router_url(text: str) -> str:
    """``http://host:port`` from ``host:port`` or a URL (any path is dropped: the pages are at fixed ones)."""
    raw = text.strip()
    if "://" not in raw:
        raw = f"http://{raw}"
    try:
        parts = urllib.parse.urlsplit(raw)
        parts.port  # noqa: B018 (raises for a port that is not a number in range)
    except ValueError as exc:
        raise BadUrlError(f"bad URL {text!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in parts.netloc:
        raise BadUrlError(
            f"bad URL {text!r}: expected http://HOST:PORT "
            "(the gateway's address, or the picker's metrics port)"
        )
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1].rstrip(':')}"


@dataclass(frozen=True)
class Counters:
    """The totals top reads from ``/metrics``."""

    requests_by_code: dict[str, float]  # slorouter_requests_total, summed over endpoints
    sheds: float  # slorouter_requests_shed_total, summed over models

    @property
    def requests(self) -> float:
        return sum(self.requests_by_code.values())

    def answered(self, first_digit: str) -> float:
        return sum(v for code, v in self.requests_by_code.items() if code.startswith(first_digit))


def parse_counters(text: str) -> Counters:
    by_code: dict[str, float] = {}
    sheds = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "slorouter_requests_total":
                code = sample.labels.get("code", "")
                by_code[code] = by_code.get(code, 0.0) + sample.value
            elif sample.name == "slorouter_requests_shed_total":
                sheds += sample.value
    return Counters(by_code, sheds)


@dataclass(frozen=True)
class Reading:
    """One read of the router: its status page, its counters, and when (monotonic seconds)."""

    url: str
    status: RouterStatus
    counters: Counters
    at: float


class RouterSource:
    """Reads one router; ``read`` raises ``RouterUnavailableError`` with a one-line reason."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.url = router_url(url)
        self.timeout_s = timeout_s
        # A router is reached directly: no proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def read(self) -> Reading:
        status_body = self._get(STATUS_PATH)
        try:
            status = decode_status(status_body)
        except NotAStatusPageError as exc:
            raise RouterUnavailableError(
                f"{self.url} is not a slorouter gateway or picker metrics port: {STATUS_PATH}: {exc}"
            ) from None
        metrics_body = self._get("/metrics")
        try:
            counters = parse_counters(metrics_body.decode("utf-8", "replace"))
        except ValueError as exc:
            raise RouterUnavailableError(f"{self.url}/metrics is not a Prometheus page: {exc}") from None
        return Reading(self.url, status, counters, time.monotonic())

    def _get(self, path: str) -> bytes:
        url = self.url + path
        try:
            with self._opener.open(url, timeout=self.timeout_s) as response:
                return bytes(response.read(MAX_BODY_BYTES))
        except urllib.error.HTTPError as exc:
            hint = ""
            if exc.code == 404:
                hint = " (not a slorouter gateway, or not the picker's metrics port)"
            raise RouterUnavailableError(f"GET {url}: HTTP {exc.code} {exc.reason}{hint}") from None
        except urllib.error.URLError as exc:
            raise RouterUnavailableError(f"cannot reach {self.url}: {_reason(exc.reason)}") from None
        except TimeoutError:
            raise RouterUnavailableError(
                f"cannot reach {self.url}: no answer within {self.timeout_s:g} s"
            ) from None
        except (http.client.HTTPException, OSError) as exc:
            raise RouterUnavailableError(
                f"GET {url}: {_reason(exc)} (not an HTTP server? the picker's pages are on its metrics port)"
            ) from None


def _reason(reason: object) -> str:
    if isinstance(reason, socket.gaierror):
        return f"unknown host ({reason.strerror})"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is it running? is this its port?)"
    if isinstance(reason, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    text = str(reason) or reason.__class__.__name__
    return " ".join(text.split())
