"""``slorouter top URL``: a live terminal view of a running gateway (its address) or picker (its metrics
port), redrawn every second from its status page and ``/metrics``; ``--once`` prints one frame and exits."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from rich.console import Console
from rich.live import Live

from slorouter.top.source import BadUrlError, Reading, RouterSource, RouterUnavailableError
from slorouter.top.view import render, render_error


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live view of a running gateway or picker",
        description="A live terminal view of a running router: per endpoint its in-flight requests, queue, "
        "KV-cache use, predicted against observed TTFT, share of the picks and (with KV events) its prefix "
        "index's trust; the request rate, errors, "
        "sheds, SLO attainment, routes and the predictor's state. Reads GET /v1/router/status and /metrics.",
    )
    parser.add_argument(
        "url",
        metavar="URL",
        help="the gateway's address (http://HOST:PORT of slorouter serve), or the picker's metrics port "
        "(slorouter epp --metrics-port)",
    )
    parser.add_argument(
        "--interval", type=_interval, default=1.0, metavar="SECONDS", help="time between frames (default 1)"
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit (1 if unreadable)")
    parser.set_defaults(func=run)


def _interval(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, got {value!r}") from None
    if not 0.1 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"between 0.1 and 3600 seconds, got {seconds:g}")
    return seconds


def run(args: argparse.Namespace) -> int:
    try:
        source = RouterSource(args.url)
    except BadUrlError as exc:
        print(f"slorouter top: {exc}", file=sys.stderr)
        return 2
    if args.once:
        return _once(source)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: leave the view
        _live(source, args.interval)
    return 0


def _once(source: RouterSource) -> int:
    try:
        reading = source.read()
    except RouterUnavailableError as exc:
        print(f"slorouter top: {exc}", file=sys.stderr)
        return 1
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 120))  # a script's capture: lines as a wide terminal's
    console.print(render(reading))
    return 0


def _live(source: RouterSource, interval_s: float) -> None:
    previous: Reading | None = None
    with Live(auto_refresh=False, screen=True, redirect_stdout=False, redirect_stderr=False) as live:
        while True:
            started = time.monotonic()
            try:
                reading = source.read()
            except RouterUnavailableError as exc:
                live.update(render_error(source.url, str(exc), interval_s), refresh=True)
                previous = None
            else:
                live.update(render(reading, previous), refresh=True)
                previous = reading
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
