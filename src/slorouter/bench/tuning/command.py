"""``slorouter tune-worker``: the tuner's process, started by a router with ``tuning.enabled`` (not a command
to run by hand; its protocol is in ``slorouter.bench.tuning.worker``)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune-worker",
        help="the tuner's process, started by serve and epp when tuning.enabled (JSON lines on stdin/stdout)",
        description=__doc__,
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slorouter.bench.tuning.worker import main  # the simulator loads only in this process

    return main()
