"""``slorouter serve``: run the gateway for a configured pool, or the embedded default.

The embedded default's pods are simulated; the gateway does not import the simulator (a higher layer), so
the CLI, which may, hands ``register`` the function that starts them."""

from __future__ import annotations

import argparse
import asyncio
import errno
import functools
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol

import uvloop

from slorouter.config import Config, ConfigError, PredictorConfig, load_config
from slorouter.gateway.runtime import Router
from slorouter.pool.config import PoolConfig
from slorouter.serving.assembly import predictor_state_dir
from slorouter.serving.command_line import (
    LOG_LEVELS,
    add_record_arguments,
    add_state_dir_argument,
    check_port_free,
    check_state_dir_free,
    port,
    port_taken,
    record_settings,
    run_command,
    with_state_dir,
)
from slorouter.serving.recording import RecordSettings

log = logging.getLogger("slorouter")

PORT_CHANGE = "give this one another port with --port N (gateway.port in the config)"
EMBEDDED_PODS = 4
EMBEDDED_PROFILE = "llama3-8b-h100"


class EmbeddedPool(Protocol):
    """The embedded default's pods, started in-process."""

    @property
    def addresses(self) -> list[str]: ...

    @property
    def model(self) -> str: ...

    async def close(self) -> None: ...


StartPods = Callable[[int, str], Awaitable[EmbeddedPool]]  # (count, profile name) -> pods on free ports


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], *, start_pods: StartPods
) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the gateway",
        description="Run the OpenAI-compatible gateway. Without --config it runs the embedded default: "
        f"{EMBEDDED_PODS} simulated {EMBEDDED_PROFILE} pods in-process and the gateway on 127.0.0.1:8080.",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="YAML configuration file (see docs/configuration.md)"
    )
    parser.add_argument("--host", help="listen address (overrides gateway.host)")
    parser.add_argument("--port", type=port, help="listen port (overrides gateway.port)")
    add_state_dir_argument(parser, "serve")
    add_record_arguments(parser)
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS)
    parser.set_defaults(func=functools.partial(run, start_pods=start_pods))


def run(args: argparse.Namespace, *, start_pods: StartPods) -> int:
    return run_command(args.log_level, lambda: _run(args, start_pods))


def _run(args: argparse.Namespace, start_pods: StartPods) -> int:
    config = load_config(args.config) if args.config else Config()
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = config.model_copy(update={"gateway": config.gateway.model_copy(update=overrides)})
    if args.config and config.pool is None:
        raise ConfigError(f"{args.config}: 'pool' is required (pool.endpoints or pool.kubernetes)")
    if args.config is None and config.predictor is None:
        # The embedded default routes by predicted latency (heuristics until the first model is trained).
        config = config.model_copy(
            update={"predictor": PredictorConfig(mode="embedded", prediction_by_default=True)}
        )
    config = with_state_dir(config, args.state_dir)
    return uvloop.run(_serve(config, args.config, start_pods, record_settings(args)))


async def _serve(
    config: Config, config_path: str | None, start_pods: StartPods, record: RecordSettings | None = None
) -> int:
    """``config_path`` None: the embedded default."""
    # What another router on this machine may hold, checked before the pods start and the pool is scraped.
    check_port_free(config.gateway.host, config.gateway.port, PORT_CHANGE)
    check_state_dir_free(predictor_state_dir(config, "serve", config_path))
    embedded = config_path is None
    cluster = None
    if embedded:
        cluster = await start_pods(EMBEDDED_PODS, EMBEDDED_PROFILE)
        config = config.model_copy(update={"pool": PoolConfig(endpoints=list(cluster.addresses))})
        log.info(
            "embedded pool: %d simulated %s pods at %s", EMBEDDED_PODS, EMBEDDED_PROFILE, cluster.addresses
        )
    router = Router.build(config, config_path=config_path, record=record)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await router.start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise port_taken(config.gateway.host, config.gateway.port, PORT_CHANGE) from None
        # Everything built so far lives as long as the process: keep the cyclic GC from rescanning it, and
        # let it run less often (the proxy path allocates many short-lived, acyclic objects).
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        if embedded:
            _print_try_it(router.address, cluster.model if cluster else "MODEL")
        await stop.wait()
        log.info("stopping: draining the requests in progress")
        await router.drain(config.gateway.shutdown_drain_timeout_s)
    finally:
        await router.stop()
        if cluster is not None:
            await cluster.close()
    return 0


def _print_try_it(address: str, model: str) -> None:
    print(
        f"\nslorouter is routing on http://{address} across {EMBEDDED_PODS} simulated pods, by predicted\n"
        "latency once its models have trained on the first few hundred requests (heuristics until then).\n"
        "Try:\n\n"
        f"  curl -s http://{address}/v1/completions -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"model": "{model}", "prompt": "Hello, world", "max_tokens": 16}}\'\n\n'
        f"  curl -sN http://{address}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hi"}}], '
        f'"max_tokens": 16, "stream": true}}\'\n\n'
        "Add -H 'x-slo-ttft-ms: 500' for a TTFT target; -i shows x-slorouter-route and the predictions.\n"
        "Press Ctrl-C to stop.\n",
        flush=True,
    )
