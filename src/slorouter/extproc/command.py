"""``slorouter epp``: the endpoint picker as an Envoy ext_proc server, optionally with its own Envoy."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import tempfile
from pathlib import Path
from typing import Any

import uvloop

from slorouter.config import Config, ConfigError, load_config
from slorouter.extproc.envoy import (
    NO_ENVOY,
    EnvoyProcess,
    EnvoySetup,
    ListenAddressTaken,
    bootstrap,
    envoy_binary,
)
from slorouter.extproc.runtime import EndpointPicker, PickerPorts, PortUnavailable
from slorouter.extproc.workers import READY_LINE, WorkerPool
from slorouter.extras import MissingExtraError
from slorouter.http.running import address_in_use, wait_for_signal
from slorouter.pool.inflight_sharing import InFlightSharing, ReplicaPeers, parse_peers
from slorouter.serving.command_line import (
    LOG_LEVELS,
    add_record_arguments,
    add_state_dir_argument,
    port,
    record_settings,
    run_command,
    with_state_dir,
)

log = logging.getLogger("slorouter")
MAX_WORKERS = 64
PORT_FLAGS = {
    "grpc_port": "--grpc-port",
    "health_port": "--grpc-health-port",
    "metrics_port": "--metrics-port",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "epp",
        help="run the endpoint picker for Envoy (ext_proc)",
        description="Run the endpoint picker as an Envoy external processor (ext_proc, the Gateway API "
        "Inference Extension's Endpoint Picker Protocol), over the same router as `slorouter serve`.",
    )
    parser.add_argument("--config", metavar="FILE", required=True, help="the YAML file of `slorouter serve`")
    parser.add_argument("--host", default="127.0.0.1", help="listen address of all three ports")
    parser.add_argument("--grpc-port", type=port, default=9002, help="ext_proc gRPC port (default 9002)")
    parser.add_argument("--grpc-health-port", type=port, default=9003, help="gRPC health port (default 9003)")
    parser.add_argument(
        "--metrics-port", type=port, default=9090, help="HTTP /metrics, /health, /ready (default 9090)"
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long open streams may take to finish (default 30)",
    )
    parser.add_argument(
        "--envoy",
        action="store_true",
        help="also run Envoy on the gateway's address (gateway.host/port), routing through this picker",
    )
    parser.add_argument(
        "--envoy-body-mode",
        choices=["full-duplex", "buffered"],
        default="full-duplex",
        help="with --envoy: the ext_proc request body mode (default full-duplex)",
    )
    parser.add_argument(
        "--envoy-cluster",
        choices=["override_host", "original_dst"],
        default="override_host",
        help="with --envoy: the upstream cluster (override_host retries the picker's fallbacks; "
        "original_dst retries on the same endpoint, so no request is hedged)",
    )
    parser.add_argument(
        "--envoy-response-path",
        choices=["observed", "in-band"],
        default=None,
        help="with --envoy: observed (a second ext_proc filter in observability mode streams the response "
        "to the picker, nothing on the response's path waits for it; the default with one worker) or "
        "in-band (the picking filter sends the response and waits for each answer; the default with "
        "--workers, whose processes would not see each other's requests)",
    )
    parser.add_argument(
        "--envoy-fail-open",
        action="store_true",
        help="with --envoy: failure_mode_allow (requests go round robin when the picker is unreachable); "
        "needs --envoy-body-mode buffered",
    )
    parser.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N",
        help="picker processes sharing the ext_proc and health ports (SO_REUSEPORT), one core each; the "
        "command supervises them and serves their merged /metrics (default 1: one process)",
    )
    parser.add_argument(
        "--replica-peers",
        metavar="HOST[:PORT],...",
        default=None,
        help="picker replicas to share in-flight counts with over UDP: IP addresses or DNS names (a headless "
        "Service of the picker pods; resolved again every 5 s), each with its base port (default "
        "--replica-port); this picker's own address may be listed",
    )
    parser.add_argument(
        "--replica-port",
        type=port,
        default=9004,
        help="with --replica-peers: the UDP base port; worker i listens on it + i (default 9004)",
    )
    add_state_dir_argument(parser, "epp")
    add_record_arguments(parser)
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--share-inflight", metavar="DIR", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS)
    parser.set_defaults(func=run)


def _workers(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes an integer, got {value!r}") from None
    if not 1 <= count <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"--workers must be between 1 and {MAX_WORKERS}, got {count}")
    return count


def run(args: argparse.Namespace) -> int:
    return run_command(args.log_level, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if config.pool is None:
        raise ConfigError(f"{args.config}: 'pool' is required (pool.endpoints or pool.kubernetes)")
    # Workers keep their own embedded predictor state: one directory each, under --state-dir.
    worker = args.worker_index
    state_dir = (
        args.state_dir if worker is None or args.state_dir is None else f"{args.state_dir}/worker-{worker}"
    )
    config = with_state_dir(config, state_dir)
    if args.envoy_fail_open and args.envoy_body_mode != "buffered":
        raise ConfigError(
            "--envoy-fail-open needs --envoy-body-mode buffered (Envoy cannot fail open in full duplex)"
        )
    if args.envoy_response_path is None:
        args.envoy_response_path = "observed" if args.workers == 1 else "in-band"
    elif args.envoy_response_path == "observed" and args.workers > 1:
        raise ConfigError(
            "--envoy-response-path observed needs one worker: a request's picking and observing streams can "
            "reach different workers, and a worker cannot observe another's request"
        )
    if args.replica_peers is not None:
        try:
            parse_peers(args.replica_peers, args.replica_port)
        except ValueError as exc:
            raise ConfigError(f"--replica-peers: {exc}") from None
    if args.record is not None and args.workers > 1:
        raise ConfigError("--record needs one worker (--workers 1): the workers would write one file at once")
    supervising = args.workers > 1 and args.worker_index is None
    if supervising and (args.grpc_port == 0 or args.grpc_health_port == 0):
        raise ConfigError("--workers needs fixed --grpc-port and --grpc-health-port (the workers share them)")
    worker = args.worker_index is not None
    ports = PickerPorts(
        args.host,
        args.grpc_port,
        args.grpc_health_port,
        0 if worker else args.metrics_port,
        shared=worker,
        metrics_host="127.0.0.1" if worker else None,
    )
    if args.envoy and not worker:
        try:
            bootstrap(_envoy_setup(config, ports.host, ports.grpc_port, args))
        except ValueError as exc:
            raise ConfigError(f"--envoy: {exc}") from None
        if envoy_binary() is None:  # before the picker starts and scrapes its pool
            raise MissingExtraError(NO_ENVOY)
    try:
        if supervising:
            return uvloop.run(_supervise(config, ports, args))
        return uvloop.run(_serve(config, ports, args))
    except PortUnavailable as exc:
        remedy = "stop what listens there or set" if exc.in_use else "set"
        raise OSError(f"{exc}; {remedy} {PORT_FLAGS[exc.port_name]}") from None
    except ListenAddressTaken as exc:
        raise OSError(f"{exc}; stop what listens there or set gateway.port in {args.config}") from None


async def _supervise(config: Config, ports: PickerPorts, args: argparse.Namespace) -> int:
    _refuse_taken_ports(ports)
    argv = ["epp", "--config", args.config, "--host", args.host, "--grpc-port", str(args.grpc_port),
            "--grpc-health-port", str(args.grpc_health_port), "--drain-timeout", str(args.drain_timeout),
            "--workers", str(args.workers), "--log-level", args.log_level]  # fmt: skip
    if args.replica_peers is not None:
        argv += ["--replica-peers", args.replica_peers, "--replica-port", str(args.replica_port)]
    if args.envoy:  # the workers arm hedges only for a cluster that retries elsewhere
        argv += ["--envoy-cluster", args.envoy_cluster]
    if args.state_dir is not None:
        argv += ["--state-dir", args.state_dir]
    # The workers' shared in-flight view: a Unix socket each, in a directory of the supervisor's.
    sharing = tempfile.TemporaryDirectory(prefix="slorouter-epp-")
    argv += ["--share-inflight", sharing.name]
    pool = WorkerPool(argv, args.workers, args.drain_timeout)
    envoy = None
    routing = None
    signalled = await _handle_signals()
    try:
        metrics_port = await pool.start(ports.host, ports.metrics_port)
        print(
            f"slorouter epp: {args.workers} workers on grpc://{ports.host}:{ports.grpc_port} (gRPC health on "
            f"port {ports.health_port}, merged metrics on http://{ports.host}:{metrics_port}/metrics)",
            flush=True,
        )
        if args.envoy:
            envoy = EnvoyProcess(_envoy_setup(config, ports.host, ports.grpc_port, args))
            await envoy.start()
            routing = f"envoy routing on http://{config.gateway.host}:{envoy.listen_port}"
        await _until_stopped(signalled, envoy, routing)
    finally:
        signalled.cancel()
        await pool.stop()
        if envoy is not None:
            await envoy.stop()
        sharing.cleanup()
    return 0


async def _serve(config: Config, ports: PickerPorts, args: argparse.Namespace) -> int:
    worker = args.worker_index
    # Workers keep their own embedded predictor state: one directory each.
    picker = EndpointPicker.build(
        config,
        ports,
        state_name="epp" if worker is None else f"epp-worker-{worker}",
        config_path=args.config,
        record=record_settings(args),
        data_plane_hedges=_hedges_reach_another_endpoint(config, args),
    )
    replicas = None
    if args.replica_peers is not None:
        hosts = parse_peers(args.replica_peers, args.replica_port)
        replicas = ReplicaPeers(args.host, args.replica_port, hosts, args.workers)
    workers_directory = Path(args.share_inflight) if worker is not None and args.share_inflight else None
    if workers_directory is not None or replicas is not None:
        core = picker.core
        picker.sharing = InFlightSharing(
            core.director.tracker,
            core.director.clock,
            workers_directory,
            worker or 0,
            args.workers,
            replicas=replicas,
        )
        if core.tuning is not None:  # the pickers sharing in-flight load agree on one candidate
            core.tuning.agree(picker.sharing)
    envoy = None
    signalled = await _handle_signals()
    try:
        await picker.start()
        assert picker.bound is not None
        bound = picker.bound
        if worker is not None:
            print(f"{READY_LINE}{bound.metrics_port}", flush=True)
        else:
            print(
                f"slorouter epp listening on grpc://{ports.host}:{bound.grpc_port} (gRPC health on port "
                f"{bound.health_port}, metrics on http://{ports.host}:{bound.metrics_port}/metrics)",
                flush=True,
            )
        routing = None
        if args.envoy and worker is None:
            envoy = EnvoyProcess(_envoy_setup(config, ports.host, picker.bound.grpc_port, args))
            await envoy.start()
            routing = f"envoy routing on http://{config.gateway.host}:{envoy.listen_port} through the picker"
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        await _until_stopped(signalled, envoy, routing)
    finally:
        signalled.cancel()  # its handlers go: a second Ctrl-C while draining stops at once
        # The picker drains first: the streams still open through Envoy finish, then Envoy goes.
        await picker.stop(args.drain_timeout)
        if envoy is not None:
            await envoy.stop()
    return 0


def _hedges_reach_another_endpoint(config: Config, args: argparse.Namespace) -> bool:
    """Whether the data plane's retries go to the pick's fallbacks, so that a hedge can be armed: not with
    the original_dst cluster, which retries on the same endpoint (said once at start when it matters)."""
    if args.envoy_cluster != "original_dst":
        return True
    hedging = sorted(name for name, o in config.objectives.items() if o.deadline.action == "hedge")
    if hedging and args.worker_index in (None, 0):
        log.warning(
            "objectives %s hedge, but the original_dst cluster retries on the same endpoint: no request is "
            "hedged (use --envoy-cluster override_host)",
            ", ".join(hedging),
        )
    return False


def _refuse_taken_ports(ports: PickerPorts) -> None:
    """Before any worker starts: the workers bind the ext_proc and health ports with SO_REUSEPORT, so they
    would join another process that listens there the same way (another picker's workers) and get some of
    its connections; the supervisor's metrics port is bound only once they all listen."""
    for name in PORT_FLAGS:
        port = getattr(ports, name)
        if address_in_use(ports.host, port):
            raise PortUnavailable.of(name, ports.host, port, "address already in use", in_use=True)


async def _handle_signals() -> asyncio.Future[None]:
    """SIGINT and SIGTERM handled from now on (before anything says the command is up, so that a signal
    sent on that word stops it cleanly): the future is done once either arrived."""
    signalled = asyncio.ensure_future(wait_for_signal())
    await asyncio.sleep(0)  # wait_for_signal installs its handlers when it first runs
    return signalled


async def _until_stopped(
    signalled: asyncio.Future[None], envoy: EnvoyProcess | None, announcement: str | None
) -> None:
    """Print ``announcement``, then return on SIGINT or SIGTERM (``signalled``). If Envoy exits first, the
    command stops with the error that says how (it is not restarted)."""
    if announcement is not None:
        print(announcement, flush=True)
    if envoy is None:
        await signalled
        return
    exited = asyncio.ensure_future(envoy.exited())
    watches: list[asyncio.Future[Any]] = [signalled, exited]
    try:
        done, _ = await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
    finally:
        exited.cancel()
        await asyncio.gather(exited, return_exceptions=True)
    if signalled not in done:
        raise exited.result()


def _envoy_setup(config: Config, picker_host: str, picker_port: int, args: argparse.Namespace) -> EnvoySetup:
    gateway = config.gateway
    assert config.pool is not None
    return EnvoySetup(
        listen_host=gateway.host,
        listen_port=gateway.port,
        picker_host=picker_host,
        picker_port=picker_port,
        endpoints=tuple(endpoint.address for endpoint in config.pool.endpoints),
        request_body_mode=args.envoy_body_mode,
        cluster=args.envoy_cluster,
        failure_mode_allow=args.envoy_fail_open,
        response_path=args.envoy_response_path,
        max_body_bytes=gateway.max_body_bytes,
        upstream_timeout_s=gateway.upstream_timeout_s,
        connect_timeout_s=gateway.connect_timeout_s,
        message_timeout_s=message_timeout_s(config),
        hedges=any(o.deadline.action == "hedge" for o in config.objectives.values()),
        cancels=any(o.deadline.action == "cancel" for o in config.objectives.values()),
    )


def message_timeout_s(config: Config) -> float:
    """How long Envoy waits for each picker answer. With flow control on, a queued request's answer comes
    when it leaves the queue: in BUFFERED mode Envoy answers 504 past this timeout (measured with Envoy
    1.40; a FULL_DUPLEX_STREAMED filter applies none while the request body is held), so it covers the
    queue's TTL, or the upstream timeout when queued requests never expire."""
    scheduling = EnvoySetup.message_timeout_s
    if not config.flow_control_enabled:
        return scheduling
    ttl = config.flow_control.default_request_ttl_s
    if ttl is None:
        return max(scheduling, config.gateway.upstream_timeout_s)
    return scheduling + ttl
